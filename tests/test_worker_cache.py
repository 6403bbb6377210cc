"""Workers without a workflow cache (`max_cached_workflows=0`) run every kind of run.

Such a worker replays a run's whole history for every workflow task, so no
task's events are ever applied out of turn (the query race: see
`durably._query_guard`). Temporal's worker then holds one run at a time, so
durably has it take one workflow task at a time: tasks taken beyond that would
wait in the worker until the server times them out. Allowed more, it lets go
of a run mid-task when another run's task arrives, and a local activity in
flight there is cancelled and runs again when that task replays. durably's
local activities (the run's pin, a signed approval's check) only read, so a
second execution changes nothing a person sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType, TaskQueueKind
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from durably import (
    Agent,
    AgentRegistration,
    Approval,
    DurableClient,
    DurableRuntime,
    InvalidResponseError,
    RunHandle,
    RunStatus,
    ScriptedModel,
    ToolContext,
    tool,
)
from durably.activities._agent_activities import AgentActivities
from durably.contract import ACTIVITY_PIN, SA_FINGERPRINT, AgentPin, PinRequest
from durably.examples import support_desk
from durably.models import tool_call

from .conftest import (
    Runtimes,
    cli,
    echo,
    eventually,
    failed_tasks,
    search_attribute,
    wait_for_interaction,
)
from .test_signed_approvals import KEYS, OTHER_KEYS, Bank

NO_CACHE = {"max_cached_workflows": 0}


@tool
async def lookup(ctx: ToolContext, topic: str) -> str:
    """Find the knowledge base's article on a topic."""
    return f"article about {topic}"


def two_tool_turns() -> AgentRegistration:
    """An agent that looks up twice, one turn each, then echoes the last result."""
    model = ScriptedModel(
        [
            tool_call("lookup", call_id="c1", topic="vpn"),
            tool_call("lookup", call_id="c2", topic="wifi"),
            echo,
        ]
    )
    agent = Agent(id="librarian", model=model, instructions="", tools=[lookup])
    return AgentRegistration(agent, version="1", tool_recovery={"lookup": "safe"})


def refunder(refunded: list[str]) -> AgentRegistration:
    """An agent whose one refund waits for a person's approval."""

    @tool(requires_approval=True)
    async def refund(ctx: ToolContext, order_id: str) -> str:
        """Refund an order."""
        refunded.append(order_id)
        return f"refunded {order_id}"

    model = ScriptedModel([tool_call("refund", call_id="c1", order_id="A-1"), echo])
    agent = Agent(id="refunds", model=model, instructions="", tools=[refund])
    return AgentRegistration(agent, version="1")


async def history(client: DurableClient, run: RunHandle) -> WorkflowHistory:
    return await client.temporal.get_workflow_handle(run.run_id).fetch_history()


def tasks_all_replayed(events: WorkflowHistory) -> bool:
    """Whether every workflow task went to the task queue itself, none to a worker's
    sticky queue: a worker with no cache asks for none, so each task replays history."""
    queues = [
        e.workflow_task_scheduled_event_attributes.task_queue.kind
        for e in events.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED
    ]
    return len(queues) > 1 and all(q == TaskQueueKind.TASK_QUEUE_KIND_NORMAL for q in queues)


def pin_markers(events: WorkflowHistory, agent_id: str) -> int:
    """How many pins the history records (a local activity's marker, by its summary)."""
    return sum(
        1
        for e in events.events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        and e.user_metadata.summary.data == json.dumps(f"pin agent {agent_id}").encode()
    )


class TestRunsWithoutACache:
    async def test_a_run_with_two_tool_turns_completes(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """Each task rebuilds the run from history; the output and the turns are the same."""
        runtime = await runtimes.start([two_tool_turns()], **NO_CACHE)
        assert runtime.worker.config()["max_cached_workflows"] == 0
        run = await client.start_run("librarian", "vpn and wifi are down")

        result = await asyncio.wait_for(run.result(), 60)

        assert json.loads(result.output or "") == [
            {"error": False, "content": "article about wifi"}
        ]
        assert result.turns == 3
        snap = await run.snapshot()  # a query of a closed run replays it too
        assert (snap.status, snap.usage.tool_calls) == (RunStatus.COMPLETED, 2)
        events = await history(client, run)
        assert tasks_all_replayed(events) and failed_tasks([events]) == []

    async def test_a_run_waiting_for_approval_takes_the_response_and_completes(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        refunded: list[str] = []
        await runtimes.start([refunder(refunded)], **NO_CACHE)
        run = await client.start_run("refunds", "refund A-1")
        await wait_for_interaction(run, "approval:1:c1")

        accepted = await run.respond("approval:1:c1", Approval(), responder="alice")

        assert accepted.approved is True
        result = await asyncio.wait_for(run.result(), 60)
        assert json.loads(result.output or "") == [{"error": False, "content": "refunded A-1"}]
        assert refunded == ["A-1"]
        events = await history(client, run)
        assert tasks_all_replayed(events) and failed_tasks([events]) == []

    async def test_concurrent_runs_never_wait_out_a_workflow_task_timeout(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """The worker takes one task at a time, leaving the others on the server till then."""
        runtime = await runtimes.start([two_tool_turns()], **NO_CACHE)
        assert runtime.worker.config()["max_concurrent_workflow_tasks"] == 1
        runs = [await client.start_run("librarian", "vpn and wifi") for _ in range(8)]

        async with asyncio.timeout(60):
            results = await asyncio.gather(*(run.result() for run in runs))

        assert {r.turns for r in results} == {3}
        for run in runs:
            events = (await history(client, run)).events
            timed_out = EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT
            assert [e.event_id for e in events if e.event_type == timed_out] == []

    async def test_a_signed_approval_is_verified_and_a_forged_one_refused(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """The check is a local activity in the update's handler; it still runs, and decides."""
        bank = Bank()
        await runtimes.start([bank.registration()], approval_keys=KEYS, **NO_CACHE)
        run = await client.start_run("treasury", "pay bob")
        snap = await wait_for_interaction(run, "approval:1:c1")
        assert snap.interaction is not None and snap.interaction.signed

        forged = OTHER_KEYS.response(snap.interaction, approved=True, approver="alice")
        with pytest.raises(InvalidResponseError, match="does not match this decision"):
            await run.respond("approval:1:c1", forged, responder="alice")
        assert bank.paid == []
        signed = KEYS.response(snap.interaction, approved=True, approver="alice")
        accepted = await run.respond("approval:1:c1", signed, responder="alice")

        assert accepted.approved is True
        result = await asyncio.wait_for(run.result(), 60)
        assert json.loads(result.output or "") == [[False, "paid bob"]]
        assert bank.paid == ["bob"]


def greeter() -> AgentRegistration:
    """An agent that answers at once: its run is little more than its pin."""
    return AgentRegistration(
        Agent(id="greeter", model=ScriptedModel(["hello"]), instructions=""), version="1"
    )


async def greeter_run_pinned_once(
    client: DurableClient, run: RunHandle, registration: AgentRegistration
) -> None:
    """The run completed, pinned to `registration` once, as its snapshot and history show."""
    result = await asyncio.wait_for(run.result(), 60)
    assert result.output == "hello"
    snap = await run.snapshot()
    assert snap.agent_version == "1"
    assert [e.type for e in snap.events].count("agent_pinned") == 1
    assert await search_attribute(client, run, SA_FINGERPRINT, registration.pin_check) == (
        registration.pin_check
    )
    events = await history(client, run)
    assert pin_markers(events, "greeter") == 1
    assert failed_tasks([events]) == []


class HeldPin:
    """The pin activity, wrapped: holds its first execution until `release`, and notes
    whether its worker cancelled it meanwhile.

    Installed on `AgentActivities` before a runtime opens: a worker takes its
    activities when it is built.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.executions = 0
        self.holding = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = False
        original = AgentActivities.pin_agent
        held = self

        # `self` unannotated: Temporal reads the other hints to decode the request.
        @activity.defn(name=ACTIVITY_PIN)
        async def pin_agent(self, request: PinRequest) -> AgentPin:  # type: ignore[no-untyped-def]
            held.executions += 1
            if held.executions == 1:
                held.holding.set()
                try:
                    await held.release.wait()
                except asyncio.CancelledError:
                    held.cancelled = True
                    raise
            return await original(self, request)

        monkeypatch.setattr(AgentActivities, "pin_agent", pin_agent)


class TestThePin:
    async def test_a_pin_outliving_its_workflow_task_pins_the_run_once(
        self, client: DurableClient, runtimes: Runtimes, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The worker completes the task to keep it alive while the pin runs; the run goes on."""
        pin = HeldPin(monkeypatch)
        registration = greeter()
        await runtimes.start([registration], **NO_CACHE)
        run = await client.start_run("greeter", "hi")
        await pin.holding.wait()

        async def task_heartbeat() -> bool:  # after 80% of the task's 10 s timeout
            return any(
                e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
                for e in (await history(client, run)).events
            )

        await eventually(task_heartbeat, within=30)
        pin.release.set()

        await greeter_run_pinned_once(client, run, registration)

    async def test_a_pin_evicted_by_another_runs_task_runs_again_and_pins_the_run_once(
        self, client: DurableClient, runtimes: Runtimes, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Allowed several tasks, the worker lets go of a run mid-pin for another's task."""
        pin = HeldPin(monkeypatch)
        registration = greeter()
        await runtimes.start([registration], max_concurrent_workflow_tasks=4, **NO_CACHE)
        first = await client.start_run("greeter", "hi")
        await pin.holding.wait()

        second = await client.start_run("greeter", "hi")

        async with asyncio.timeout(20):  # not waiting for the held pin's 30 s timeout
            await greeter_run_pinned_once(client, second, registration)
            await greeter_run_pinned_once(client, first, registration)
        assert pin.cancelled and not pin.release.is_set()  # the pin in flight ran again


class TestTheOption:
    @pytest.mark.parametrize("bound", [-1, 1.5, True, "0"])
    async def test_open_refuses_a_bound_that_is_not_a_count_before_connecting(
        self, bound: Any
    ) -> None:
        """Nothing listens at the target: the bound is checked first."""
        with pytest.raises(ValueError, match=r"max_cached_workflows=.*: pass a whole number"):
            await DurableRuntime.open("127.0.0.1:1", max_cached_workflows=bound)

    async def test_the_worker_command_refuses_a_negative_bound(self) -> None:
        done = await durably_worker("--max-cached-workflows", "-1")
        assert done.returncode == 2
        assert (
            "error: --max-cached-workflows=-1: pass a whole number of runs, 0 or more"
            in done.stderr
        )
        assert "Traceback" not in done.stderr

    async def test_the_worker_command_serves_without_a_cache(
        self, env: WorkflowEnvironment, client: DurableClient
    ) -> None:
        """`durably worker --max-cached-workflows 0` hands the bound to Temporal's worker."""
        target = env.client.service_client.config.target_host
        async with worker_process(
            "--max-cached-workflows", "0", "--task-queue", client.task_queue, "--target", target
        ) as output:
            run = await client.start_run(
                support_desk.AGENT_ID, support_desk.demo_input_unattended()
            )
            assert (await asyncio.wait_for(run.result(), 60)).output
            assert tasks_all_replayed(await history(client, run))
        assert b"worker started" in output[0] and b"max_cached_workflows=0" in output[0]


AGENTS = "durably.examples.support_desk:registrations"


async def durably_worker(*args: str) -> subprocess.CompletedProcess[str]:
    """`durably worker` run to its end, for the refusals that happen before it connects."""
    return await cli(sys.executable, "-m", "durably", "worker", "--agents", AGENTS, *args)


@contextlib.asynccontextmanager
async def worker_process(*args: str) -> AsyncIterator[list[bytes]]:
    """`durably worker` serving; stopped with SIGTERM on leaving, when it must exit 0.

    Yields a list that then holds the process's output.
    """
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "durably", "worker", "--agents", AGENTS, *args,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    output: list[bytes] = []
    try:
        yield output
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
        output.append(out)
        assert proc.returncode == 0, out.decode(errors="replace")
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
