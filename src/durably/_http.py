"""What durably's HTTP services share: serving an ASGI app in this event loop, and who
may call it (`codec_server`, `web`).

Both hold power over runs (the codec server decodes every payload; the live
server shows runs and answers approvals), so off loopback each needs a bearer
token, and without one a request is served only when it is addressed to this
machine by name (a page whose own name was made to resolve to 127.0.0.1, DNS
rebinding, must not reach it).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import urllib.parse
from collections.abc import Iterator
from types import TracebackType
from typing import Self

import uvicorn
from starlette.requests import Request
from starlette.types import ASGIApp

from durably.errors import DurablyError

__all__ = [
    "AsgiServer",
    "BodyTooLarge",
    "from_loopback",
    "is_loopback",
    "names_loopback",
    "read_body",
    "tokenless",
]


def is_loopback(host: str) -> bool:
    """Whether listening on `host` reaches this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: whatever it resolves to, it may be reachable


def names_loopback(host_header: str) -> bool:
    """Whether a request's `Host` names this machine (see the module docstring)."""
    host = urllib.parse.urlsplit(f"//{host_header}").hostname or ""
    return is_loopback(host)


def from_loopback(request: Request) -> bool:
    """Whether a request came from this machine and names it: its peer is a loopback
    address and its `Host` a loopback name. The `Host` alone is the caller's to choose
    (a request from the LAN with `Host: localhost` was served as local); the peer alone
    is every client's behind a proxy on this machine, which is why a tokenless app is
    never to be put behind one."""
    peer = request.client.host if request.client is not None else ""
    return is_loopback(peer) and names_loopback(request.headers.get("host", ""))


class BodyTooLarge(Exception):
    """A request body past its limit (read no further than the limit)."""


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, read as it streams in and never past `limit` bytes: reading
    it whole first let a 300 MiB POST take a server from 85 MB to 691 MB before its
    size was checked. Raises `BodyTooLarge`, or starlette's `ClientDisconnect`."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def tokenless(what: str, loopback_only: bool) -> None:
    """Refuse to build a tokenless app unless its maker said it serves loopback only."""
    if not loopback_only:
        raise DurablyError(
            f"{what} without a token serves whoever reaches it: pass a token, or "
            "loopback_only=True when it listens on 127.0.0.1 and no proxy on this machine "
            "forwards to it (behind a proxy every request comes from loopback)"
        )


class AsgiServer:
    """`app` served by uvicorn in this event loop, as an async context manager.

    Entering binds the port (a `DurablyError` naming `what` if it is taken)
    and starts serving; leaving stops. Signals are left to the caller:
    uvicorn's own Ctrl-C handling would stop this server alone, while the
    caller's worker and dev server go on.
    """

    def __init__(self, app: ASGIApp, *, host: str, port: int, what: str) -> None:
        if not 0 <= port < 65536:
            raise DurablyError(f"port must be between 0 and 65535, got {port}")
        self.app = app
        self.host = host
        self.port = port
        self._what = what
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        """The server's base URL as a browser on this machine reaches it."""
        here = ("127.0.0.1", "::1", "localhost", "0.0.0.0", "::", "[::]", "")
        host = "localhost" if self.host in here else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    async def __aenter__(self) -> Self:
        if self._server is not None:
            raise DurablyError(f"{self._what} is already started")
        sock = self._bind()
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            lifespan="off",
            log_config=None,
            log_level="warning",
            access_log=False,
            server_header=False,
            proxy_headers=False,
            timeout_graceful_shutdown=5,
        )
        server = self._server = _QuietServer(config)
        self._task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if self._task.done():
                self._server = None
                await self._task  # raises what stopped it
                raise DurablyError(f"{self._what} stopped while starting")
            await asyncio.sleep(0.01)  # uvicorn announces startup with this flag only
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        server, task, self._server, self._task = self._server, self._task, None, None
        if server is None or task is None:
            return
        server.should_exit = True
        await task

    def _bind(self) -> socket.socket:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host.strip("[]"), self.port))
            sock.listen(128)
        except OSError as err:
            sock.close()
            raise DurablyError(
                f"{self._what} cannot listen on {self.host}:{self.port} ({err.strerror}); "
                "stop what uses that port or choose another one"
            ) from None
        sock.setblocking(False)
        return sock


class _QuietServer(uvicorn.Server):
    """A uvicorn server that leaves SIGINT/SIGTERM to the process that runs it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
