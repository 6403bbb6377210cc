"""Every error the client raises is a `DurablyError` that says what was wrong and what to do.

Never the SDK's raw `RPCError` or pydantic's `ValidationError`; closed runs
say how they closed; nothing is started or cancelled by a refused request.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Awaitable
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.client import Client, WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RetryConfig
from temporalio.testing import WorkflowEnvironment

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    DurableConflictError,
    InvalidResponseError,
    RunCancelledError,
    RunHandle,
    RunNotFoundError,
    RunStatus,
    ScriptedModel,
    ToolContext,
    tool,
)
from durably.contract import WORKFLOW_TYPE, RunInput
from durably.dev import DevServer
from durably.errors import InvalidRunInputError, TemporalUnavailableError
from durably.models import tool_call
from durably.tools import question_tool

from .conftest import Runtimes, cli, eventually, wait_for_status

APPROVE = {"type": "tool-approval", "approved": True}


def asker() -> AgentRegistration:
    agent = Agent(
        id="asker",
        model=ScriptedModel([tool_call("ask", question="which?"), "done"]),
        instructions="",
        tools=[question_tool(name="ask", description="Ask.")],
    )
    return AgentRegistration(agent, version="1")


def parked(client: DurableClient) -> DurableClient:
    """The same server, on a task queue no worker polls: runs stay open and untouched."""
    return DurableClient(client.temporal, task_queue=f"nobody-{uuid.uuid4().hex[:8]}")


async def terminate(client: DurableClient, run: RunHandle) -> None:
    await client.temporal.get_workflow_handle(run.run_id).terminate("test cleanup")


async def test_respond_names_the_field_whose_type_is_wrong(client: DurableClient) -> None:
    run = RunHandle(client.temporal, "any-run")

    with pytest.raises(InvalidResponseError, match=r"responder must be a str .*; got int"):
        await run.respond("approval:1:c1", APPROVE, responder=42)  # type: ignore[arg-type]
    with pytest.raises(InvalidResponseError, match=r"response must be a dict .*; got list"):
        await run.respond("approval:1:c1", ["approve"])  # type: ignore[arg-type]
    with pytest.raises(InvalidResponseError, match="response must hold only JSON data"):
        await run.respond("approval:1:c1", {**APPROVE, "at": object()})


async def test_a_server_that_does_not_answer_is_temporal_unavailable_naming_the_address(
    dev_server: DevServer,
) -> None:
    await dev_server.start()
    try:
        temporal = await Client.connect(
            dev_server.address,
            data_converter=pydantic_data_converter,
            retry_config=RetryConfig(max_retries=1, max_elapsed_time_millis=1_000),
        )
        client = DurableClient(temporal, task_queue="nobody")
        run = await client.start_run("asker", "go")
    finally:
        await dev_server.stop()

    calls: dict[str, Awaitable[Any]] = {
        "start_run": client.start_run("asker", "again"),
        "get_run": client.get_run(run.run_id),
        "list_runs": client.list_runs(),
        "snapshot": run.snapshot(),
        "respond": run.respond("question:1:call_ask", {"type": "question", "answer": "x"}),
        "retry": run.retry(),
        "cancel": run.cancel(),
        "result": run.result(),
    }
    outcomes = await asyncio.wait_for(asyncio.gather(*calls.values(), return_exceptions=True), 60)

    for name, outcome in zip(calls, outcomes, strict=True):
        assert isinstance(outcome, TemporalUnavailableError), (name, outcome)
        assert f"Temporal at {dev_server.address} did not answer" in str(outcome), name
        assert "Check that the server is running and reachable" in str(outcome), name


# Arguments of `start_run` that cannot start a run, and what the error says.
REFUSED_STARTS: list[tuple[dict[str, Any], str]] = [
    ({"agent_id": ""}, "agent_id is empty"),
    ({"agent_id": "a" * 201}, "agent_id is 201 characters long, more than 200"),
    ({"agent_id": "desk\n"}, r"agent_id holds control characters \(desk\\n\)"),
    ({"run_id": ""}, "run_id is empty"),
    ({"run_id": " \t"}, "run_id is only whitespace"),
    ({"run_id": "r" * 1_001}, "run_id is 1,001 characters long, more than 1,000"),
    ({"run_id": "run\x1b[2J"}, "run_id holds control characters"),
    ({"input": None}, "input must be a str"),
    ({"input": "a" * (2**20 + 1)}, "input is 1,048,577 bytes .UTF-8.; a run's input holds"),
    ({"input": "é" * (2**19 + 1)}, "input is 1,048,578 bytes"),
    # Within 1 MiB, but JSON writes each control as \u0001: the server refuses it.
    ({"input": "\x01" * 2**20}, "its input is too large once encoded"),
]


async def test_start_run_refuses_bad_ids_and_inputs_and_starts_nothing(
    client: DurableClient,
) -> None:
    for change, message in REFUSED_STARTS:
        args: dict[str, Any] = {"agent_id": "desk", "input": "hi", **change}
        with pytest.raises(InvalidRunInputError, match=message) as refused:
            await client.start_run(args.pop("agent_id"), args.pop("input"), **args)
        assert "Nothing was started" in str(refused.value)

    # Visibility lists runs in the order they started: once a run started after
    # every refusal is listed, a run that a refusal let start would be listed too.
    sentinel = await client.start_run("desk", "hi")
    try:
        listed: list[str] = []

        async def sentinel_listed() -> bool:
            listed[:] = [r.run_id for r in await client.list_runs(task_queue=client.task_queue)]
            return sentinel.run_id in listed

        await eventually(sentinel_listed)
        assert listed == [sentinel.run_id]
    finally:
        await terminate(client, sentinel)


async def test_an_update_on_a_closed_run_says_how_it_closed(client: DurableClient) -> None:
    idle = parked(client)
    terminated = await idle.start_run("asker", "go")
    await terminate(idle, terminated)
    timed_out = await idle.temporal.start_workflow(
        WORKFLOW_TYPE,
        RunInput(agent_id="asker", input="go"),
        id=f"timeout-{uuid.uuid4().hex[:8]}",
        task_queue=idle.task_queue,
        execution_timeout=timedelta(milliseconds=500),
    )
    with pytest.raises(WorkflowFailureError):
        await timed_out.result()

    with pytest.raises(DurableConflictError, match=r"is terminated; retry needs an open run"):
        await terminated.retry()
    with pytest.raises(DurableConflictError, match=r"is terminated; respond needs an open run"):
        await terminated.respond("question:1:call_ask", {"type": "question", "answer": "x"})
    with pytest.raises(DurableConflictError, match=r"is timed out; resolve_tool needs an open"):
        await RunHandle(idle.temporal, timed_out.id).resolve_tool("tool:1:x", {"type": "rerun"})
    with pytest.raises(RunNotFoundError, match="no run 'no-such-run' in namespace"):
        await RunHandle(idle.temporal, "no-such-run").retry()


async def test_cancel_refuses_a_closed_run_and_repeats_harmlessly_on_an_open_one(
    client: DurableClient, runtimes: Runtimes
) -> None:
    greeter = Agent(id="greeter", model=ScriptedModel(["hello"]), instructions="")
    await runtimes.start([AgentRegistration(greeter, version="1")])
    completed = await client.start_run("greeter", "hi")
    await completed.result()
    pending = await parked(client).start_run("asker", "go")

    await pending.cancel()
    await pending.cancel()  # its worker has not picked the first request up yet
    await terminate(client, pending)

    with pytest.raises(DurableConflictError, match="is already completed; nothing was cancelled"):
        await completed.cancel()
    with pytest.raises(
        DurableConflictError, match=r"is already terminated; nothing was cancelled\. Start a new"
    ):
        await pending.cancel()
    with pytest.raises(RunNotFoundError, match="no run 'no-such-run'"):
        await RunHandle(client.temporal, "no-such-run").cancel()


class Hold(BaseModel):
    what: str


class Held(BaseModel):
    done: bool


async def test_durably_cancel_waits_for_the_run_to_close_or_says_what_it_is_doing(
    env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes
) -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    @tool
    async def hold(args: Hold, ctx: ToolContext) -> Held:
        """Holds until released, whatever the abort signal says."""
        entered.set()
        await release.wait()
        return Held(done=True)

    holder = Agent(
        id="holder",
        model=ScriptedModel([tool_call("hold", what="x"), "done"]),
        instructions="",
        tools=[hold],
    )
    await runtimes.start([asker(), AgentRegistration(holder, version="1")])
    waiting = await client.start_run("asker", "go")
    holding = await client.start_run("holder", "go")
    await wait_for_status(waiting, RunStatus.WAITING)
    await asyncio.wait_for(entered.wait(), 30)
    target = env.client.service_client.config.target_host

    async def durably_cancel(*args: str) -> Any:
        return await cli(sys.executable, "-m", "durably", "cancel", *args, "--target", target)

    cancelled, stuck = await asyncio.gather(
        durably_cancel(waiting.run_id), durably_cancel(holding.run_id, "--timeout", "1")
    )
    release.set()

    assert cancelled.returncode == 0, cancelled.stderr
    assert f"Run {waiting.run_id} was cancelled." in cancelled.stdout
    assert stuck.returncode == 1
    assert f"Run {holding.run_id} has not closed 1 s after its cancellation" in stuck.stderr
    assert "it is running: " in stuck.stderr and "hold" in stuck.stderr
    assert f"temporal workflow terminate --workflow-id {holding.run_id}" in stuck.stderr
    assert "skips the run's cleanup" in stuck.stderr
    with pytest.raises(RunCancelledError):
        await holding.result()


async def test_inbox_leaves_out_a_run_terminated_while_waiting(
    client: DurableClient, runtimes: Runtimes
) -> None:
    await runtimes.start([asker()])
    run = await client.start_run("asker", "go")
    await wait_for_status(run, RunStatus.WAITING)

    async def listed() -> bool:
        inbox = await client.inbox(task_queue=client.task_queue)
        return run.run_id in {i.run_id for i in inbox}

    await eventually(listed)
    await terminate(client, run)

    async def gone() -> bool:
        return not await listed()

    await eventually(gone, within=10)
