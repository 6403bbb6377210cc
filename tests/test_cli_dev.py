"""`durably dev` as a user runs it: a real server, the example worker, the demo, Ctrl-C.

Each test starts `durably dev` in its own session (so the test can signal and
inspect its process group) on free ports and a database under `tmp_path`,
away from the session dev server in conftest.py. Output is read line by line
against a deadline; nothing sleeps for a fixed time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import structlog
from temporalio.client import Client, WorkflowExecutionStatus

from durably import DurableClient, RunStatus, ToolContext
from durably.dev import DevServer
from durably.examples.files_clerk import NOTE
from durably.examples.support_desk import AGENT_ID, TicketArgs, create_ticket

from .conftest import binary, cli, eventually, free_ports
from .mcp_servers import FILESYSTEM_SERVER, NEEDS_REFERENCE_SERVERS

STARTUP = 120.0
SHUTDOWN = 30.0


def clean_env() -> dict[str, str]:
    """This environment without TEMPORAL_* settings, unbuffered."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that contain `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{entry.name}: {cmdline}")
    return found


class DurablyDev:
    """A `durably dev` process whose output is collected line by line."""

    def __init__(self, proc: asyncio.subprocess.Process, db: Path) -> None:
        self.proc = proc
        self.db = db
        self.lines: list[str] = []
        self._new_line = asyncio.Event()
        self._pump = asyncio.create_task(self._read())

    @classmethod
    async def start(
        cls, db: Path, port: int, ui_port: int, *args: str, env: dict[str, str] | None = None
    ) -> DurablyDev:
        proc = await asyncio.create_subprocess_exec(
            binary("durably"), "dev", "--port", str(port), "--ui-port", str(ui_port),
            "--db", str(db), *args,
            cwd=db.parent,
            env={**clean_env(), **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        return cls(proc, db)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            self.lines.append(line.decode(errors="replace").rstrip("\n"))
            self._new_line.set()
        self._new_line.set()

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def line_with(self, text: str) -> str:
        """The first output line already printed that contains `text`."""
        found = next((line for line in self.lines if text in line), None)
        assert found is not None, f"no line with {text!r}; output:\n{self.output}"
        return found

    async def line_starting(self, prefix: str, *, within: float = STARTUP) -> str:
        """The first output line starting with `prefix`, waiting up to `within` seconds."""
        deadline = asyncio.get_running_loop().time() + within
        while True:
            for line in self.lines:
                if line.startswith(prefix):
                    return line
            remaining = deadline - asyncio.get_running_loop().time()
            if self._pump.done() or remaining <= 0:
                raise AssertionError(f"no line starting with {prefix!r}; output:\n{self.output}")
            self._new_line.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new_line.wait(), remaining)

    async def ctrl_c(self) -> int:
        """Send SIGINT to the process group, as a terminal's Ctrl-C does; the exit code."""
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            code = await asyncio.wait_for(self.proc.wait(), SHUTDOWN)
        except TimeoutError:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise AssertionError(
                f"durably dev did not exit within {SHUTDOWN} s of SIGINT; output:\n{self.output}"
            ) from None
        await self._pump
        return code

    def assert_nothing_left(self) -> None:
        """No process of its group, and no Temporal server on its database, remains."""
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            pass
        else:
            raise AssertionError(f"processes of group {self.proc.pid} survived durably dev")
        assert processes_mentioning(str(self.db)) == []

    async def kill(self) -> None:
        if self.proc.returncode is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            await self.proc.wait()


async def durably_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return await cli(binary("durably"), *args, env=clean_env())


async def connect(port: int) -> DurableClient:
    return DurableClient(await Client.connect(f"127.0.0.1:{port}"))


def http_status(url: str) -> int:
    with urllib.request.urlopen(url, timeout=10) as response:
        status: int = response.status
        return status


async def demo_runs(dev: DurablyDev) -> tuple[str, str]:
    """The demo's two run ids, once it has printed them all: (completed, waiting)."""
    await dev.line_starting("Serving.")
    runs = [line.removeprefix("Demo run: ") for line in dev.lines if line.startswith("Demo run: ")]
    assert len(runs) == 2, dev.output
    return runs[0], runs[1]


def demo_session(dev: DurablyDev) -> tuple[str, list[str]]:
    """The demo session's id and its runs, one per message, as printed."""
    session = dev.line_with("Demo session: ").removeprefix("Demo session: ")
    prefix = "  Session run: "
    return session, [line.removeprefix(prefix) for line in dev.lines if line.startswith(prefix)]


async def test_dev_demo_completes_one_run_leaves_one_waiting_and_ctrl_c_leaves_no_process(
    tmp_path: Path,
) -> None:
    """`durably dev --demo` finishes one run, prints three ways to answer the waiting one
    (the printed signal answers it), and stops cleanly on SIGINT."""
    port, ui_port = free_ports(2)
    dev = await DurablyDev.start(tmp_path / "t.db", port, ui_port, "--demo")
    try:
        done_id, waiting_id = await demo_runs(dev)
        output = dev.line_with("Demo output: ")
        assert "Jobs stuck in the print queue (KB-210)" in output
        for run_id in (done_id, waiting_id):
            link = f"http://localhost:{ui_port}/namespaces/default/workflows/{run_id}"
            assert f"  Web UI: {link}" in dev.lines, dev.output

        client = await connect(port)
        done = await (await client.get_run(done_id)).snapshot()
        assert done.status == RunStatus.COMPLETED
        assert done.agent_id == AGENT_ID
        assert done.output is not None and done.output in output
        waiting_run = await client.get_run(waiting_id)
        waiting = await waiting_run.snapshot()
        assert waiting.status == RunStatus.WAITING
        assert waiting.interaction is not None and waiting.interaction.tool == "create_ticket"
        assert f"Demo run {waiting_id} is waiting for approval of create_ticket" in dev.output

        # 1. durably's CLI, against this server.
        target = f"--target 127.0.0.1:{port}"
        assert dev.line_with(f" approve {waiting_id} ").endswith(
            f" approve {waiting_id} --as NAME {target}"
        )
        assert dev.line_with(f" deny {waiting_id} ").endswith(
            f" deny {waiting_id} --reason WHY --as NAME {target}"
        )
        # 3. The Web UI's list, filtered to the runs waiting for a person.
        link = dev.line_with("/workflows?query=").strip()
        assert link.startswith(f"http://localhost:{ui_port}/namespaces/default/workflows?")
        [query] = urllib.parse.parse_qs(urllib.parse.urlsplit(link).query)["query"]
        assert query == 'DurablyStatus="waiting"'

        async def only_the_waiting_run_listed() -> bool:  # visibility trails the last upsert
            listed = [w.id async for w in client.temporal.list_workflows(query)]
            return listed == [waiting_id]

        await eventually(only_the_waiting_run_listed)
        # 2. Temporal's CLI: the printed command, with the input the Web UI shows.
        argv = shlex.split(dev.line_with(" workflow signal "))
        assert Path(argv[0]).name == "temporal"
        assert argv[1:7] == ["workflow", "signal", "--workflow-id", waiting_id,
                             "--name", "respond_signal"]  # fmt: skip
        assert waiting.current is not None and argv[-1] in waiting.current
        signalled = await cli(binary("temporal"), *argv[1:], env=clean_env())
        assert signalled.returncode == 0, signalled.stderr
        result = await asyncio.wait_for(waiting_run.result(), 60)
        assert result.output is not None and "I opened ticket T-1001" in result.output
        assert await asyncio.to_thread(http_status, f"http://127.0.0.1:{ui_port}/") == 200

        # The two-message session: the second answer recalls what the first suggested.
        session_id, session_runs = demo_session(dev)
        assert len(session_runs) == 2, dev.output
        assert "KB-210" in dev.line_with("  Answer 1: ")
        second = dev.line_with("  Answer 2: ")
        assert "KB-031" in second and "Earlier I suggested KB-210" in second
        session = await client.get_session(session_id)
        assert [r.run_id for r in await session.runs()] == session_runs
        send = shlex.split(dev.line_with(f" send {session_id} "))
        sent = await durably_cli(*send[1:])
        assert sent.returncode == 0, sent.stderr
        assert "Earlier I suggested KB-031" in sent.stdout, sent.stdout

        missing = await durably_cli("runs", "show", "no-such-run", "--target", f"127.0.0.1:{port}")
        assert missing.returncode == 1
        assert "no run 'no-such-run'" in missing.stderr
        assert "Traceback" not in missing.stderr + missing.stdout

        assert await dev.ctrl_c() == 0, dev.output
        assert "Stopped." in dev.lines
        dev.assert_nothing_left()
    finally:
        await dev.kill()


@NEEDS_REFERENCE_SERVERS
async def test_dev_mcp_example_writes_its_note_through_the_mcp_server_once_approved(
    tmp_path: Path,
) -> None:
    """`durably dev --demo --mcp-example` hosts the files-clerk example, whose tools are the
    MCP filesystem server's: its run waits for approval of `write_file`, then writes the
    note and reads it back."""
    port, ui_port = free_ports(2)
    env = {"DURABLY_MCP_FILESYSTEM": str(FILESYSTEM_SERVER)}
    dev = await DurablyDev.start(
        tmp_path / "t.db", port, ui_port, "--demo", "--mcp-example", env=env
    )
    try:
        await dev.line_starting("Serving.")
        run_id = dev.line_with("MCP demo run: ").removeprefix("MCP demo run: ")
        assert f"Demo run {run_id} is waiting for approval of write_file" in dev.output
        approve = shlex.split(dev.line_with(f" approve {run_id} "))
        assert approve[1:3] == ["approve", run_id] and approve[-2] == "--target", approve
        approved = await durably_cli(*approve[1:3], "--as", "test", *approve[-2:])
        assert approved.returncode == 0, approved.stderr
        client = await connect(port)
        result = await asyncio.wait_for((await client.get_run(run_id)).result(), 60)
        note = tmp_path / ".durably" / "files" / "notes.txt"
        assert note.read_text() == NOTE
        assert result.output == f'notes.txt now reads: {{"content":"{NOTE}"}}'
        assert await dev.ctrl_c() == 0, dev.output
        dev.assert_nothing_left()
    finally:
        await dev.kill()


async def test_dev_rerun_reuses_the_database_and_finishes_unfinished_runs(
    tmp_path: Path,
) -> None:
    """A rerun on the same database keeps the earlier runs, finishes a pending one, and
    the demo's printed `durably approve` answers the run it left waiting."""
    db = tmp_path / "t.db"
    port, ui_port = free_ports(2)
    first = await DurablyDev.start(db, port, ui_port, "--demo")
    try:
        demo_run, waiting_run = await demo_runs(first)
        _, session_runs = demo_session(first)
        approve = shlex.split(first.line_with(f" approve {waiting_run} "))
        first_target = f"127.0.0.1:{port}"
        assert await first.ctrl_c() == 0, first.output
    finally:
        await first.kill()

    # A run started while no worker is up stays unfinished in the database.
    port, ui_port = free_ports(2)
    async with DevServer(db=db, port=port, ui_port=ui_port) as server:
        pending = await DurableClient(server.client).start_run(AGENT_ID, "The printer is stuck")
        desc = await server.client.get_workflow_handle(pending.run_id).describe()
        assert desc.status == WorkflowExecutionStatus.RUNNING

    port, ui_port = free_ports(2)
    second = await DurablyDev.start(db, port, ui_port)
    try:
        await second.line_starting("Serving.")
        client = await connect(port)
        result = await asyncio.wait_for((await client.get_run(pending.run_id)).result(), 60)
        assert result.output is not None and "KB-210" in result.output

        # The command the first session printed, pointed at this session's server.
        assert approve[-2:] == ["--target", first_target]
        approved = await durably_cli(*approve[1:-1], f"127.0.0.1:{port}")
        assert approved.returncode == 0, approved.stderr
        result = await asyncio.wait_for((await client.get_run(waiting_run)).result(), 60)
        assert result.output is not None and "I opened ticket T-1001" in result.output

        expected = {demo_run: "completed", waiting_run: "completed", pending.run_id: "completed"}
        expected |= dict.fromkeys(session_runs, "completed")
        statuses: dict[str, str] = {}

        async def listed_as_expected() -> bool:  # visibility trails the last upsert
            nonlocal statuses
            listed = await durably_cli("runs", "list", "--json", "--target", f"127.0.0.1:{port}")
            assert listed.returncode == 0, listed.stderr
            statuses = {r["run_id"]: r["status"] for r in json.loads(listed.stdout)}
            return statuses == expected

        with contextlib.suppress(TimeoutError):
            await eventually(listed_as_expected)
        assert statuses == expected

        assert await second.ctrl_c() == 0, second.output
        second.assert_nothing_left()
    finally:
        await second.kill()


async def test_create_ticket_returns_the_same_ticket_when_an_operation_repeats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example's idempotent tool keys tickets by operation id: a retry opens no second one."""
    monkeypatch.setenv("DURABLY_TICKETS_DIR", str(tmp_path / "tickets"))

    def context(operation_id: str, attempt: int) -> ToolContext:
        return ToolContext(
            operation_id=operation_id,
            run_id=operation_id.split("/")[0],
            agent_id=AGENT_ID,
            agent_version="1",
            attempt=attempt,
            abort_signal=asyncio.Event(),
            logger=structlog.get_logger(),
            _heartbeat=lambda *details: None,
        )

    args = TicketArgs(subject="VPN drops", description="since the update")
    first = await create_ticket.execute(args, context("run-a/tool:2:c1", 1))
    retried = await create_ticket.execute(args, context("run-a/tool:2:c1", 2))
    other = await create_ticket.execute(args, context("run-b/tool:2:c1", 1))

    assert retried == first
    assert other.ticket_id != first.ticket_id


async def test_python_m_durably_runs_the_cli() -> None:
    """`python -m durably` is the `durably` command."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "durably", "--help",
        env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    for command in ("dev", "worker", "start", "runs", "cancel"):
        assert command in out.decode()


async def test_a_dev_server_that_lost_a_port_race_is_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server picks some of its ports itself, and another process can take one
    before it binds it (seen when a soak and a test session started servers at
    once): that start fails with "address already in use", and the next one, on
    new ports, serves."""
    import durably.dev

    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken_port = squatter.getsockname()[1]
    picks: list[int] = []
    real = durably.dev._free_port

    def first_pick_taken(host: str, taken: set[int]) -> int:
        port = taken_port if not picks else real(host, taken)
        picks.append(port)
        return port

    monkeypatch.setattr(durably.dev, "_free_port", first_pick_taken)
    port, ui_port = free_ports(2)
    server = DevServer(db=tmp_path / "t.db", port=port, ui_port=ui_port)
    try:
        async with server:
            assert await server.client.count_workflows() is not None
        log = server.log_path.read_text()
        assert f"{taken_port}: bind: address already in use" in log, log
        assert len(picks) >= 4  # two ports per start, and it started twice
    finally:
        squatter.close()
