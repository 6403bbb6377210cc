"""MCP tool servers as durable tools (SPEC section 21), against the official reference
servers from npm and a Python server on the `mcp` SDK, on the real dev server.

The crash tests run `durably worker` processes hosting `tests.mcp_agents` and
SIGKILL them while a call is in flight: the slow relay (`tests/mcp_slow_proxy.py`)
holds a reference server's result back, and the test server's `record` sleeps
after applying its write.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from durably import (
    DurableClient,
    DurableRuntime,
    RunStatus,
    ToolInterrupted,
    ToolRetry,
    VersionDriftError,
    VersionIncompatible,
)
from durably.mcp import HTTPServer, MCPToolset, StdioServer
from durably.mcp._locking import lock_toolsets
from durably.mcp._servers import POOL, refused

from .conftest import Runtimes, cli, eventually, free_ports, wait_for_status
from .mcp_agents import files_toolset, records_toolset, registration, stdio, steps
from .mcp_servers import (
    NEEDS_REFERENCE_SERVERS,
    memory_server,
    python_server,
    read_lines,
    read_state,
)
from .test_crash_recovery import ROOT, WorkerProcess

pytestmark = NEEDS_REFERENCE_SERVERS

# What the table of SPEC section 21 gives each reference tool, from its real annotations.
FILESYSTEM_POLICIES = {
    "create_directory": ("idempotent", False),
    "edit_file": ("manual", True),
    "move_file": ("manual", True),
    "write_file": ("idempotent", True),
    **{
        name: ("safe", False)
        for name in (
            "directory_tree",
            "get_file_info",
            "list_allowed_directories",
            "list_directory",
            "list_directory_with_sizes",
            "read_file",
            "read_media_file",
            "read_multiple_files",
            "read_text_file",
            "search_files",
        )
    },
}
MEMORY_POLICIES = {
    **dict.fromkeys(("add_observations", "create_entities", "create_relations"), ("manual", False)),
    **dict.fromkeys(
        ("delete_entities", "delete_observations", "delete_relations"), ("idempotent", True)
    ),
    **dict.fromkeys(("open_nodes", "read_graph", "search_nodes"), ("safe", False)),
}
RECORDS_POLICIES = {
    "record": ("idempotent", False),
    "lookup": ("safe", False),
    "erase": ("manual", True),  # no annotations: MCP's defaults (destructive)
    "ask_person": ("manual", True),
    "crash": ("manual", True),
}


@pytest.fixture
async def root(tmp_path: Path) -> AsyncIterator[Path]:
    """A test's directory: the servers' data, logs and lock files (see `mcp_agents`)."""
    (tmp_path / "data").mkdir()
    yield tmp_path
    await POOL.close()


def policies(toolset: MCPToolset) -> dict[str, tuple[str, bool]]:
    """Each tool's recovery policy and approval, as a run of it pins them."""
    pin = registration("x", toolset).pin()
    return {name: (p.recovery, p.requires_approval) for name, p in pin.tools.items()}


class TestPolicies:
    async def test_trusted_annotations_decide_policies_and_untrusted_servers_are_manual(
        self, root: Path
    ) -> None:
        memory = memory_server(root / "memory.jsonl")
        trusted = [
            files_toolset(root),
            MCPToolset(
                "memory", stdio(memory), lock=root / "memory.lock.json", trust_annotations=True
            ),
            records_toolset(root),
        ]
        await lock_toolsets(trusted)

        files, memories, records = (policies(t) for t in trusted)
        # The crash tests' toolset takes edit_file and write_file out of approval.
        assert files == {
            **FILESYSTEM_POLICIES,
            "edit_file": ("manual", False),
            "write_file": ("idempotent", False),
        }
        assert memories == MEMORY_POLICIES
        assert records == RECORDS_POLICIES
        untrusted = MCPToolset("memory", stdio(memory), lock=root / "memory.lock.json")
        assert set(policies(untrusted).values()) == {("manual", False)}

    async def test_a_server_of_another_version_than_the_locks_is_named(self, root: Path) -> None:
        await lock_toolsets([records_toolset(root)])
        assert await records_toolset(root).check() == ([], None)
        lock = json.loads((root / "records.lock.json").read_text())
        lock["server"]["version"] = "0.9.0"
        (root / "records.lock.json").write_text(json.dumps(lock))
        _, changed = await records_toolset(root).check()
        assert changed == "durably-test-server 1.0.0, locked at 0.9.0"

    async def test_durably_tools_lists_what_each_registered_tool_will_do(self, root: Path) -> None:
        await lock_toolsets([files_toolset(root), records_toolset(root)])
        env = {**os.environ, "MCP_TEST_DIR": str(root), "PYTHONPATH": str(ROOT)}
        done = await cli(
            sys.executable, "-m", "durably", "tools", "tests.mcp_agents:registrations", "--json",
            env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        rows = {(r["agent_id"], r["tool"]): r for r in json.loads(done.stdout)}
        assert rows["files", "read_text_file"]["recovery"] == "safe"
        assert rows["files", "move_file"]["requires_approval"] is True
        assert rows["records", "record"]["recovery"] == "idempotent"
        assert rows["records", "erase"]["source"] == "mcp:records"

    async def test_the_lock_command_writes_a_lock_the_fingerprint_comes_from(
        self, root: Path
    ) -> None:
        env = {**os.environ, "MCP_TEST_DIR": str(root), "PYTHONPATH": str(ROOT)}
        done = await cli(
            sys.executable, "-m", "durably", "mcp", "lock", "tests.mcp_agents", env=env
        )
        assert done.returncode == 0, done.stderr
        assert "14 tool(s) of 'files'" in done.stdout and "records.lock.json" in done.stdout
        lock = json.loads((root / "records.lock.json").read_text())
        names = [t["name"] for t in lock["tools"]]
        assert names == ["ask_person", "crash", "erase", "lookup", "record"]
        before = registration("r", records_toolset(root)).fingerprint
        lock["tools"][3]["description"] = "Read a value (edited)."
        (root / "records.lock.json").write_text(json.dumps(lock))
        assert registration("r", records_toolset(root)).fingerprint != before

        # Locking again leaves a lock the server no longer matches alone, unless told.
        again = await cli(
            sys.executable, "-m", "durably", "mcp", "lock", "tests.mcp_agents", env=env
        )
        assert again.returncode == 1 and "lookup: description changed" in again.stderr
        assert json.loads((root / "records.lock.json").read_text()) == lock
        done = await cli(
            sys.executable, "-m", "durably", "mcp", "lock", "tests.mcp_agents", "--update",
            env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert registration("r", records_toolset(root)).fingerprint == before


class TestOutcomes:
    @pytest.mark.parametrize(
        ("code", "message", "definite"),
        [
            (-32602, "Input validation error", True),  # the server refused the arguments
            (-32601, "Method not found", True),
            (-32600, "Elicitation not supported", True),
            (-32600, "Unexpected content type: text/html", False),  # made up by the client
            (-32603, "Server returned an error response", False),  # an HTTP 502, say
            (-32603, "Internal server error", False),  # the server's handler crashed
            (0, "boom", False),
            (-32700, "Parse error", False),  # a response nobody could read
            (-32000, "Connection closed", False),
            (-32001, "Request timed out", False),
        ],
    )
    def test_only_a_refusal_before_running_is_a_definite_outcome(
        self, code: int, message: str, definite: bool
    ) -> None:
        assert refused(code, message) is definite


class TestRuns:
    async def test_a_run_writes_and_reads_files_and_reads_a_servers_error(
        self, client: DurableClient, runtimes: Runtimes, root: Path
    ) -> None:
        files = files_toolset(root)
        await lock_toolsets([files])
        await runtimes.start([registration("files", files)])
        note = str(root / "data" / "note.txt")
        run = await client.start_run(
            "files",
            steps(
                [("write_file", {"path": note, "content": "hello"})],
                [("read_text_file", {"path": note})],
                [("read_text_file", {"path": str(root / "data" / "missing.txt")})],
            ),
        )
        answer = json.loads((await run.result()).output or "")
        assert (root / "data" / "note.txt").read_text() == "hello"
        assert answer[1] == [False, '{"content":"hello"}']
        assert answer[2][0] is True and "ENOENT" in answer[2][1]

    async def test_each_call_carries_its_operation_id_and_elicitation_is_refused_saying_why(
        self, client: DurableClient, runtimes: Runtimes, root: Path
    ) -> None:
        records = records_toolset(root)
        await lock_toolsets([records])
        await runtimes.start(
            [registration("records", records, tool_recovery={"ask_person": "safe"})]
        )
        run = await client.start_run(
            "records",
            steps([("record", {"key": "a", "value": "1"})], [("ask_person", {"question": "ok?"})]),
        )
        waiting = await wait_for_status(run, RunStatus.WAITING)  # ask_person is destructive
        await run.approve_all(waiting.interactions, responder="test")
        answer = json.loads((await run.result()).output or "")
        (call,) = [line for line in read_lines(root / "server.jsonl") if line["tool"] == "record"]
        assert call["operation_id"].startswith(f"{run.run_id}/") and call["applied"]
        assert call["operation_id"].endswith("/tool:1:s0c1")
        # The client declares no elicitation support: the server is told so, and fails.
        assert answer[1][0] is True and "Elicitation not supported" in answer[1][1]

    async def test_a_server_that_died_is_started_again_for_the_next_call(
        self, client: DurableClient, runtimes: Runtimes, root: Path
    ) -> None:
        records = records_toolset(root, approval={"crash": False})
        await lock_toolsets([records])
        await runtimes.start([registration("records", records)])
        run = await client.start_run("records", steps([("crash", {})]))
        parked = await wait_for_status(run, RunStatus.NEEDS_ATTENTION)  # manual: unknown outcome
        assert isinstance(parked.attention, ToolInterrupted)
        assert "Connection closed" in (parked.attention.last_error or "")
        await run.resolve_tool(parked.blocked_operations[0], {"type": "error", "message": "gone"})
        await run.result()

        run = await client.start_run("records", steps([("record", {"key": "k", "value": "v"})]))
        assert json.loads((await run.result()).output or "") == [[False, '{"result":"recorded k"}']]
        assert [c["tool"] for c in read_lines(root / "server.jsonl")] == ["record"]

    async def test_a_streamable_http_server_gets_its_headers_and_each_calls_operation_id(
        self, client: DurableClient, runtimes: Runtimes, root: Path
    ) -> None:
        (port,) = free_ports(1)
        command = python_server(log=root / "server.jsonl", state=root / "state.json")

        async def start() -> asyncio.subprocess.Process:
            return await asyncio.create_subprocess_exec(
                command.command,
                *command.args,
                env={**os.environ, **command.env, "MCP_TEST_HTTP_PORT": str(port)},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

        process = await start()
        try:
            url = f"http://127.0.0.1:{port}/mcp"
            records = MCPToolset(
                "records",
                HTTPServer(url, {"X-Tenant": "acme"}),
                lock=root / "records.lock.json",
                trust_annotations=True,
            )

            async def listening() -> bool:
                with contextlib.suppress(OSError):
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.close()
                    return True
                return False

            await eventually(listening)
            await lock_toolsets([records])
            await runtimes.start([registration("records", records)])
            run = await client.start_run("records", steps([("record", {"key": "k", "value": "v"})]))
            assert json.loads((await run.result()).output or "") == [
                [False, '{"result":"recorded k"}']
            ]
            (call,) = read_lines(root / "server.jsonl")
            assert call["operation_id"].startswith(f"{run.run_id}/")
            assert call["operation_id"].endswith("/tool:1:s0c1@acme")

            # The server restarts: it no longer knows the worker's session, which is
            # opened again, and the call it refused unrun is sent once more.
            process.terminate()
            await asyncio.wait_for(process.wait(), 10)
            process = await start()
            await eventually(listening)
            run = await client.start_run("records", steps([("lookup", {"key": "k"})]))
            assert json.loads((await run.result()).output or "") == [[False, '{"result":"v"}']]
        finally:
            await POOL.close()
            process.terminate()
            await asyncio.wait_for(process.wait(), 10)

    async def test_a_changed_server_is_reported_at_start_and_parks_calls_of_changed_tools(
        self, client: DurableClient, runtimes: Runtimes, root: Path
    ) -> None:
        await lock_toolsets([records_toolset(root)])
        changed = registration("records", records_toolset(root, variant="changed"))
        elsewhere = DurableClient(client.temporal, task_queue=f"{client.task_queue}-strict")
        strict = await DurableRuntime.open(client=elsewhere, agents=[changed], strict_versions=True)
        with pytest.raises(VersionDriftError, match="lookup: description, input_schema changed"):
            await strict.resume()

        await runtimes.start([changed])
        run = await client.start_run("records", steps([("lookup", {"key": "a"})]))
        parked = await wait_for_status(run, RunStatus.NEEDS_ATTENTION)
        assert isinstance(parked.attention, VersionIncompatible)
        assert "changed since it was locked" in (parked.attention.last_error or "")
        assert not [line for line in read_lines(root / "server.jsonl") if line["tool"] == "lookup"]

    async def test_a_server_that_cannot_start_fails_the_call_naming_its_command(
        self, client: DurableClient, runtimes: Runtimes, root: Path
    ) -> None:
        await lock_toolsets([records_toolset(root)])
        broken = MCPToolset(
            "records",
            StdioServer(str(root / "no-such-server")),
            lock=root / "records.lock.json",
            trust_annotations=True,
        )
        fast = ToolRetry(max_attempts=2, initial_delay_ms=100, max_delay_ms=100)
        await runtimes.start([registration("records", broken, tool_retry=fast)])
        run = await client.start_run("records", steps([("lookup", {"key": "a"})]))
        failed = await wait_for_status(run, RunStatus.FAILED)
        assert "no-such-server" in (failed.error or "") and "could not be started" in (
            failed.error or ""
        )


class McpWorkers:
    """`durably worker` processes hosting `tests.mcp_agents`, to be SIGKILLed."""

    def __init__(self, env: WorkflowEnvironment, client: DurableClient, root: Path) -> None:
        self.target = env.client.service_client.config.target_host
        self.client = client
        self.root = root
        self.workers: list[WorkerProcess] = []

    def start(self, **env: str) -> WorkerProcess:
        w = WorkerProcess(
            self.target,
            self.client.task_queue,
            {**os.environ, "PYTHONPATH": str(ROOT), "MCP_TEST_DIR": str(self.root), **env},
            agents="tests.mcp_agents:registrations",
        )
        self.workers.append(w)
        return w

    def close(self) -> None:
        for w in self.workers:
            w.stop()


@pytest.fixture
async def workers(
    env: WorkflowEnvironment, client: DurableClient, root: Path
) -> AsyncIterator[McpWorkers]:
    await lock_toolsets([files_toolset(root), records_toolset(root)])
    w = McpWorkers(env, client, root)
    yield w
    w.close()


def lines(path: Path, **match: Any) -> list[dict[str, Any]]:
    return [e for e in read_lines(path) if all(e.get(k) == v for k, v in match.items())]


class TestCrashes:
    async def test_a_destructive_call_interrupted_parks_and_resolving_it_never_writes_again(
        self, client: DurableClient, workers: McpWorkers, root: Path
    ) -> None:
        doc = root / "data" / "doc.txt"
        doc.write_text("one two")
        first = workers.start(MCP_PROXY_SLOW="edit_file")
        edit = {"path": str(doc), "edits": [{"oldText": "one", "newText": "one one"}]}
        run = await client.start_run("files", steps([("edit_file", edit)]))

        async def written() -> bool:
            return doc.read_text() == "one one two"

        await eventually(written)  # on disk; its result held back by the relay
        first.kill()
        workers.start(MCP_PROXY_SLOW="edit_file", MCP_PROXY_DELAY_S="0")  # logs any resend
        parked = await wait_for_status(run, RunStatus.NEEDS_ATTENTION, within=60)
        assert isinstance(parked.attention, ToolInterrupted)
        assert parked.attention.tool == "edit_file"

        await run.resolve_tool(
            parked.blocked_operations[0], {"type": "json", "value": {"content": "edited"}}
        )
        answer = json.loads((await run.result()).output or "")
        assert answer == [[False, '{"content":"edited"}']]
        assert doc.read_text() == "one one two"  # edited once
        assert len(lines(root / "proxy.jsonl", name="edit_file")) == 1

    async def test_a_read_only_call_interrupted_runs_again(
        self, client: DurableClient, workers: McpWorkers, root: Path
    ) -> None:
        (root / "data" / "a.txt").write_text("alpha")
        first = workers.start(MCP_PROXY_SLOW="read_text_file")
        run = await client.start_run(
            "files", steps([("read_text_file", {"path": str(root / "data" / "a.txt")})])
        )

        async def read_once() -> bool:
            return len(lines(root / "proxy.jsonl")) == 1

        await eventually(read_once)
        first.kill()
        workers.start(MCP_PROXY_SLOW="read_text_file", MCP_PROXY_DELAY_S="0")
        answer = json.loads((await run.result()).output or "")
        assert answer == [[False, '{"content":"alpha"}']]
        calls = lines(root / "proxy.jsonl", name="read_text_file")
        assert len(calls) == 2 and calls[0]["operation_id"] == calls[1]["operation_id"]

    async def test_an_idempotent_call_retried_carries_the_same_operation_id_and_applies_once(
        self, client: DurableClient, workers: McpWorkers, root: Path
    ) -> None:
        first = workers.start(MCP_TEST_SLOW_SECONDS="60")
        run = await client.start_run("records", steps([("record", {"key": "k", "value": "v"})]))

        async def applied() -> bool:
            return len(lines(root / "server.jsonl", tool="record")) == 1

        await eventually(applied)  # applied; the server sleeps before answering
        first.kill()
        workers.start()
        answer = json.loads((await run.result()).output or "")
        assert answer == [[False, '{"result":"recorded k"}']]
        calls = lines(root / "server.jsonl", tool="record")
        assert [c["applied"] for c in calls] == [True, False]
        assert calls[0]["operation_id"] == calls[1]["operation_id"]
        assert read_state(root / "state.json")["values"] == {"k": "v"}
