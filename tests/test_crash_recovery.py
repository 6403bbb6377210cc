"""Crashes with real processes: a worker SIGKILLed mid-operation, then a fresh one.

The worker is `durably worker` in a subprocess hosting `tests.crash_agents`;
what ran is read from the tools' own journal on disk and, for the idempotent
tool, from a deduplicating HTTP service the test runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    LiveItem,
    RunStatus,
    ScriptedModel,
    ToolContext,
    ToolInterrupted,
    tool,
)
from durably.contract import SA_STATUS
from durably.dev import DevServer
from durably.models import tool_call

from .conftest import eventually, operation_id, search_attribute, serving, wait_for_status
from .crash_agents import HEARTBEAT, Ticket, TicketId

ROOT = Path(__file__).resolve().parent.parent


class DedupService:
    """A ticket service that creates at most one ticket per idempotency key."""

    def __init__(self) -> None:
        self.effects: dict[str, str] = {}
        self.requests = 0
        self.first_effect = threading.Event()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    service.requests += 1
                    ticket = service.effects.setdefault(
                        body["key"], f"T-{len(service.effects) + 1}"
                    )
                service.first_effect.set()
                payload = json.dumps({"ticket_id": ticket}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class WorkerProcess:
    """`durably worker` in its own process group, to be SIGKILLed."""

    def __init__(
        self,
        target: str,
        task_queue: str,
        env: dict[str, str],
        agents: str = "tests.crash_agents:registrations",
        options: tuple[str, ...] = (),
    ) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "durably",
                "worker",
                "--agents",
                agents,
                "--target",
                target,
                "--task-queue",
                task_queue,
                *options,
            ],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


class Crashes:
    def __init__(self, env: WorkflowEnvironment, client: DurableClient, tmp: Path) -> None:
        self.target = env.client.service_client.config.target_host
        self.client = client
        self.journal_path = tmp / "journal.jsonl"
        self.journal_path.touch()
        self.dedup = DedupService()
        self.env = {
            **os.environ,
            "DURABLY_TEST_JOURNAL": str(self.journal_path),
            "DURABLY_TEST_DEDUP_URL": self.dedup.url,
            "PYTHONPATH": str(ROOT),
        }
        self.workers: list[WorkerProcess] = []

    def worker(self) -> WorkerProcess:
        w = WorkerProcess(self.target, self.client.task_queue, self.env)
        self.workers.append(w)
        return w

    def journal(self, **match: Any) -> list[dict[str, Any]]:
        lines = self.journal_path.read_text().splitlines()
        entries = [json.loads(line) for line in lines]
        return [e for e in entries if all(e.get(k) == v for k, v in match.items())]

    async def until_journal(self, within: float = 30, **match: Any) -> dict[str, Any]:
        """The latest journal entry matching `match`, once another process wrote it."""
        async with asyncio.timeout(within):
            while True:
                found = self.journal(**match)
                if found:
                    return found[-1]
                await asyncio.sleep(0.05)

    def close(self) -> None:
        for w in self.workers:
            w.stop()
        self.dedup.close()


@pytest.fixture
async def crashes(
    env: WorkflowEnvironment, client: DurableClient, tmp_path: Path
) -> AsyncIterator[Crashes]:
    c = Crashes(env, client, tmp_path)
    yield c
    c.close()


class TestManualToolCrash:
    async def test_the_run_needs_attention_within_the_heartbeat_timeout_and_resolves(
        self, crashes: Crashes, client: DurableClient
    ) -> None:
        first = crashes.worker()
        run = await client.start_run("manual", "my vpn is down")
        await crashes.until_journal(kind="tool", tool="manual_hang")

        first.kill()
        killed_at = time.monotonic()
        crashes.worker()
        snap = await wait_for_status(run, RunStatus.NEEDS_ATTENTION, within=60)
        detected_after = time.monotonic() - killed_at

        assert detected_after <= HEARTBEAT.total_seconds() + 5, detected_after
        assert snap.blocked_operation == "tool:1:c1"
        assert isinstance(snap.attention, ToolInterrupted)
        assert snap.attention.reason == "tool_interrupted"
        assert snap.attention.args == {"title": "vpn down"}
        assert "timed out" in (snap.attention.last_error or "")
        assert (
            await search_attribute(client, run, SA_STATUS, "needs_attention") == "needs_attention"
        )

        await run.resolve_tool("tool:1:c1", {"type": "json", "value": {"ticket_id": "T-42"}})
        result = await run.result()

        assert result.output == '{"ticket_id":"T-42"}'
        assert [e["op"] for e in crashes.journal(kind="tool")] == [
            await operation_id(client, run, "tool:1:c1")
        ]


class TestSafeAndIdempotentCrash:
    async def test_a_safe_call_runs_again_after_the_worker_dies(
        self, crashes: Crashes, client: DurableClient
    ) -> None:
        first = crashes.worker()
        run = await client.start_run("safe", "look it up")
        await crashes.until_journal(kind="tool", tool="safe_hang_once")

        first.kill()
        crashes.worker()
        result = await asyncio.wait_for(run.result(), 60)

        assert result.output == '{"ticket_id":"read-2"}'
        assert [e["attempt"] for e in crashes.journal(kind="tool")] == [1, 2]

    async def test_an_idempotent_call_reruns_with_the_same_operation_id_and_one_effect(
        self, crashes: Crashes, client: DurableClient
    ) -> None:
        first = crashes.worker()
        run = await client.start_run("idempotent", "file a ticket")
        await crashes.until_journal(kind="tool", tool="idempotent_effect")
        assert await asyncio.to_thread(crashes.dedup.first_effect.wait, 30)

        first.kill()
        crashes.worker()
        result = await asyncio.wait_for(run.result(), 60)

        op = await operation_id(client, run, "tool:1:c1")
        calls = crashes.journal(kind="tool")
        assert [(e["op"], e["attempt"]) for e in calls] == [(op, 1), (op, 2)]
        assert crashes.dedup.requests == 2
        assert crashes.dedup.effects == {op: "T-1"}
        assert result.output == '{"ticket_id":"T-1"}'


class TestParallelCallsCrash:
    async def test_two_manual_calls_block_and_the_idempotent_one_reruns_once(
        self, crashes: Crashes, client: DurableClient
    ) -> None:
        """SIGKILL while three calls of one answer run: each manual call is blocked on its
        own (nothing runs twice), the idempotent one reruns under its operation id with
        one effect, and resolving both manual calls finishes the run."""
        first = crashes.worker()
        run = await client.start_run("fan-out", "refund both and file a ticket")

        async def all_three_started() -> bool:
            return len(crashes.journal(kind="tool")) == 3

        await eventually(all_three_started)
        assert await asyncio.to_thread(crashes.dedup.first_effect.wait, 30)
        first.kill()
        crashes.worker()

        async def both_blocked() -> bool:
            snap = await run.snapshot()
            return sorted(snap.blocked_operations) == ["tool:1:m1", "tool:1:m2"]

        await eventually(both_blocked, within=60)
        snap = await run.snapshot()
        assert snap.status == RunStatus.NEEDS_ATTENTION
        assert snap.blocked_operation == snap.blocked_operations[0]
        op_i1 = await operation_id(client, run, "tool:1:i1")

        async def idempotent_done() -> bool:
            return len(crashes.journal(kind="tool", tool="idempotent_effect")) == 2

        await eventually(idempotent_done, within=60)
        await run.resolve_tool("tool:1:m1", {"type": "json", "value": {"ticket_id": "R-A"}})
        assert (await run.snapshot()).blocked_operations == ["tool:1:m2"]
        await run.resolve_tool("tool:1:m2", {"type": "error", "message": "refund B bounced"})
        result = await asyncio.wait_for(run.result(), 60)

        assert result.output == '{"ticket_id":"R-A"} | refund B bounced | {"ticket_id":"T-1"}'
        manual = [e["op"] for e in crashes.journal(kind="tool", tool="manual_hang")]
        assert sorted(manual) == sorted(
            [
                await operation_id(client, run, "tool:1:m1"),
                await operation_id(client, run, "tool:1:m2"),
            ]
        )  # one execution each, never repeated
        idempotent = crashes.journal(kind="tool", tool="idempotent_effect")
        assert [(e["op"], e["attempt"]) for e in idempotent] == [(op_i1, 1), (op_i1, 2)]
        assert crashes.dedup.effects == {op_i1: "T-1"}


class TestSubagentCrash:
    async def test_a_childs_manual_tool_interrupted_parks_the_child_and_shows_in_the_parent(
        self, crashes: Crashes, client: DurableClient
    ) -> None:
        first = crashes.worker()
        parent = await client.start_run("delegator", "file it through the manual agent")
        await crashes.until_journal(kind="tool", tool="manual_hang")
        first.kill()
        crashes.worker()

        async def child_parked() -> bool:
            with contextlib.suppress(RPCError):
                children = (await parent.snapshot()).children
                return any(c.status == "needs_attention" for c in children)
            return False

        await eventually(child_parked, within=60)
        [child_view] = (await parent.snapshot()).children
        child = await client.get_run(child_view.run_id)
        assert (await child.snapshot()).blocked_operation == "tool:1:c1"
        await child.resolve_tool("tool:1:c1", {"type": "json", "value": {"ticket_id": "T-7"}})
        result = await asyncio.wait_for(parent.result(), 60)

        assert result.output == 'the manual agent said: {"ticket_id":"T-7"}'
        assert len(crashes.journal(kind="tool", tool="manual_hang")) == 1  # never run twice


class TestChildStartCrash:
    async def test_a_worker_killed_around_a_childs_start_leaves_exactly_one_child(
        self, crashes: Crashes, client: DurableClient
    ) -> None:
        """SIGKILL as the parent's model answered with the subagent call: the child's
        start command is sent, or not yet, when the worker dies; either way another
        worker finishes the parent with exactly one child."""
        first = crashes.worker()
        parent = await client.start_run("hand-off", "greet through echoer")
        await crashes.until_journal(kind="model", agent="hand-off", turn=1)
        first.kill()
        crashes.worker()

        result = await asyncio.wait_for(parent.result(), 60)
        assert result.output == "echoer said: hi"
        child_id = await operation_id(client, parent, "tool:1:e")
        executions = [
            w.run_id async for w in client.temporal.list_workflows(f'WorkflowId = "{child_id}"')
        ]
        assert len(executions) == 1


class TestTaskCrash:
    async def test_a_manual_task_interrupted_parks_and_resolves_like_a_tool(
        self, crashes: Crashes, client: DurableClient
    ) -> None:
        first = crashes.worker()
        run = await client.start_task("manual_hang", Ticket(title="printer"))
        await crashes.until_journal(kind="tool", tool="manual_hang")
        first.kill()
        crashes.worker()

        snap = await wait_for_status(run, RunStatus.NEEDS_ATTENTION, within=60)
        assert snap.blocked_operation == "tool:1:task"
        await run.resolve_tool("tool:1:task", {"type": "json", "value": {"ticket_id": "T-9"}})
        result = await asyncio.wait_for(run.result(), 60)

        assert result.output == '{"ticket_id":"T-9"}'
        assert len(crashes.journal(kind="tool", tool="manual_hang")) == 1


class TestFollowingThroughACrash:
    async def test_a_follower_sees_every_event_once_across_a_worker_sigkill(
        self, crashes: Crashes, client: DurableClient
    ) -> None:
        """A follower reading live while the worker dies mid-tool: the queries fail until
        another worker takes over, then it goes on from its offset, missing nothing."""
        first = crashes.worker()
        run = await client.start_run("idempotent", "file a ticket")
        items: list[LiveItem] = []

        async def follow() -> None:
            async for item in run.events(poll_interval=0.05):
                items.append(item)

        follower = asyncio.create_task(follow())
        await crashes.until_journal(kind="tool", tool="idempotent_effect")
        first.kill()
        crashes.worker()
        await asyncio.wait_for(follower, 60)

        committed = [i for i in items if i.event.type != "text_delta"]
        assert [i.offset for i in committed] == list(range(len(committed)))
        kinds = [i.event.type for i in committed]
        assert kinds[0] == "agent_pinned" and kinds[-1] == "run_completed"
        assert kinds.count("tool_started") == 1  # a retry is the same operation, not an event
        assert kinds.count("tool_completed") == 1
        assert (await run.result()).output == '{"ticket_id":"T-1"}'


class TestCommittedResults:
    async def test_a_crash_after_a_tool_committed_never_reruns_it_or_the_model_request(
        self, crashes: Crashes, client: DurableClient
    ) -> None:
        first = crashes.worker()
        run = await client.start_run("commit-window", "go")
        # The tool committed and the next model request is in flight (and hangs).
        await crashes.until_journal(kind="model", turn=2, attempt=1)

        first.kill()
        crashes.worker()
        result = await asyncio.wait_for(run.result(), 60)

        assert result.output == '{"ticket_id":"quick-1"}'
        assert len(crashes.journal(kind="tool")) == 1
        models = [(e["turn"], e["attempt"]) for e in crashes.journal(kind="model")]
        assert models == [(1, 1), (2, 1), (2, 2)]


class TestServerRestart:
    async def test_a_needs_attention_run_survives_a_dev_server_restart(
        self, dev_server: DevServer
    ) -> None:
        ran: list[str] = []

        @tool
        async def create_ticket(args: Ticket, ctx: ToolContext) -> TicketId:
            """Create a ticket (and crash)."""
            ran.append(ctx.operation_id)
            raise TimeoutError("ticket service did not answer")

        agent = Agent(
            id="desk",
            model=ScriptedModel([tool_call("create_ticket", call_id="c1", title="x"), "filed"]),
            instructions="",
            tools=[create_ticket],
        )
        agents = [AgentRegistration(agent, version="1")]

        async with serving(dev_server, agents, "restart") as client:
            run = await client.start_run("desk", "file it")
            before = await wait_for_status(run, RunStatus.NEEDS_ATTENTION)
        async with serving(dev_server, agents, "restart") as client:
            run = await client.get_run(run.run_id)
            after = await run.snapshot()
            assert after == before
            await run.resolve_tool("tool:1:c1", {"type": "error", "message": "not created"})
            result = await run.result()
            op = await operation_id(client, run, "tool:1:c1")

        assert result.output == "filed"
        assert ran == [op]
