"""`RunHandle.result()`: what it waits through, what ends it, and how it follows a run.

`result()` waits on history long polls (Temporal's own for the close event, and
a second one, read at a slowing pace, for the `failed` status a parked run
publishes); it never describes the run over and over.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Literal

import pytest
from pydantic import BaseModel

import durably.client._handle as handle_module
from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    DurableRuntime,
    FunctionModel,
    RunCancelledError,
    RunClosedError,
    RunFailedError,
    RunStatus,
    ScriptedModel,
    ToolContext,
    ToolRetry,
    tool,
)
from durably.messages import AssistantMessage, ModelRequest, ToolCall
from durably.models import tool_call
from durably.tools import question_tool

from .conftest import Runtimes, echo, wait_for_status


class Order(BaseModel):
    order: str


class Receipt(BaseModel):
    refund_id: str


@pytest.fixture
def eager_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The failure watch reads the history every 20 ms, so it sees every status published."""
    monkeypatch.setattr(handle_module, "_FIRST_READ", 0.02)
    monkeypatch.setattr(handle_module, "_SLOWEST_READ", 0.02)


def asking_agent() -> AgentRegistration:
    agent = Agent(
        id="asker",
        model=ScriptedModel([tool_call("ask", question="Which order?"), echo]),
        instructions="",
        tools=[question_tool(name="ask", description="Ask the customer.")],
    )
    return AgentRegistration(agent, version="1")


def ticket_desk(failing: list[bool]) -> AgentRegistration:
    """Agent `desk`, whose `create_ticket` tool fails (twice, then the run) while `failing[0]`."""

    @tool
    async def create_ticket(args: Order, ctx: ToolContext) -> Receipt:
        """Create a ticket."""
        if failing[0]:
            raise ConnectionResetError("ticket service hung up")
        return Receipt(refund_id="T-1")

    agent = Agent(
        id="desk",
        model=ScriptedModel([tool_call("create_ticket", call_id="c1", order="A1"), echo]),
        instructions="",
        tools=[create_ticket],
    )
    fast = ToolRetry(max_attempts=2, initial_delay_ms=10, max_delay_ms=10)
    return AgentRegistration(
        agent, version="1", tool_recovery={"create_ticket": "idempotent"}, tool_retry=fast
    )


def looping_agent(*, max_turns: int, continue_as_new_events: int) -> AgentRegistration:
    """An agent that calls its `note` tool every turn and never answers: it runs out of turns."""

    @tool
    async def note(args: Order, ctx: ToolContext) -> str:
        """Write a note."""
        return "noted " + "z" * 200

    def loop_forever(request: ModelRequest) -> AssistantMessage:
        turn = sum(isinstance(m, AssistantMessage) for m in request.messages)
        call = ToolCall(id=f"c{turn}", name="note", arguments={"order": str(turn)})
        return AssistantMessage(tool_calls=(call,))

    agent = Agent(
        id="looper",
        model=FunctionModel(loop_forever),
        instructions="",
        tools=[note],
        max_turns=max_turns,
    )
    return AgentRegistration(
        agent,
        version="1",
        tool_recovery={"note": "safe"},
        continue_as_new_events=continue_as_new_events,
    )


class TestWaitsThrough:
    @pytest.mark.usefixtures("eager_reads")
    async def test_keeps_waiting_through_an_approval_and_needs_attention(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """Neither a pending approval nor an interrupted manual call ends the wait."""
        calls: list[str] = []

        @tool(requires_approval=True)
        async def refund(args: Order, ctx: ToolContext) -> Receipt:
            """Refund an order."""
            calls.append(ctx.operation_id)
            raise ConnectionResetError("payments hung up mid-request")

        agent = Agent(
            id="refunder",
            model=ScriptedModel([tool_call("refund", call_id="c1", order="A1"), echo]),
            instructions="",
            tools=[refund],
        )
        await runtimes.start([AgentRegistration(agent, version="1")])
        run = await client.start_run("refunder", "refund A1")
        waiting = asyncio.create_task(run.result())

        snap = await wait_for_status(run, RunStatus.WAITING)
        assert not waiting.done()
        assert snap.interaction is not None
        await run.approve(snap.interaction, responder="ops")
        await wait_for_status(run, RunStatus.NEEDS_ATTENTION)
        assert not waiting.done()
        await run.resolve_tool("tool:1:c1", {"type": "json", "value": {"refund_id": "R-1"}})

        result = await waiting
        assert result.output == '[{"error": false, "content": "{\\"refund_id\\":\\"R-1\\"}"}]'
        assert len(calls) == 1

    async def test_returns_as_soon_as_temporal_reports_the_run_completed(
        self, client: DurableClient, runtimes: Runtimes, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The end comes from Temporal's own long poll for the close event, not a later read."""
        # The failure watch first reads the history a minute in: only the close
        # long poll can end this wait within the test.
        monkeypatch.setattr(handle_module, "_FIRST_READ", 60.0)
        await runtimes.start([asking_agent()])
        run = await client.start_run("asker", "go")
        ours = asyncio.create_task(run.result())
        theirs = asyncio.create_task(client.temporal.get_workflow_handle(run.run_id).result())
        snap = await wait_for_status(run, RunStatus.WAITING)
        assert snap.interaction is not None

        await run.answer(snap.interaction, "A1")
        await theirs
        result = await asyncio.wait_for(ours, 10)  # generous for a loaded machine

        assert result.output == '[{"error": false, "content": "A1"}]'


class TestEnds:
    @pytest.mark.parametrize("how", ["cancel", "terminate"])
    async def test_a_waiting_run_closed_by_an_operator_ends_the_wait_with_the_same_error(
        self, client: DurableClient, runtimes: Runtimes, how: Literal["cancel", "terminate"]
    ) -> None:
        await runtimes.start([asking_agent()])
        run = await client.start_run("asker", "go")
        waiting = asyncio.create_task(run.result())
        await wait_for_status(run, RunStatus.WAITING)

        if how == "cancel":
            await run.cancel()
            with pytest.raises(RunCancelledError):
                await waiting
        else:
            await client.temporal.get_workflow_handle(run.run_id).terminate(reason="cleanup")
            with pytest.raises(RunClosedError, match="was terminated in Temporal"):
                await waiting

    async def test_a_failed_run_raises_on_every_wait_until_retried_then_returns(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """The failure is read from history wherever a wait starts; after retry() it is history."""
        failing = [True]
        await runtimes.start([ticket_desk(failing)])
        run = await client.start_run("desk", "file it")

        with pytest.raises(RunFailedError, match="ConnectionResetError: ticket service hung up"):
            await run.result()
        with pytest.raises(RunFailedError, match="ConnectionResetError: ticket service hung up"):
            await run.result()  # a wait that starts later reads the same failure
        failing[0] = False
        await run.retry()
        result = await run.result()  # the earlier `failed` in history no longer counts

        assert result.output == '[{"error": false, "content": "{\\"refund_id\\":\\"T-1\\"}"}]'

    @pytest.mark.usefixtures("eager_reads")
    async def test_a_failure_no_worker_confirms_is_asked_about_again_not_raised_early(
        self, client: DurableClient, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """While workers are redeployed the confirming query goes unanswered: the wait
        goes on, and raises once a worker answers that the run is still failed."""
        monkeypatch.setattr(handle_module, "_QUERY_TIMEOUT", timedelta(seconds=0.5))
        registration = ticket_desk([True])
        async with await DurableRuntime.open(client=client, agents=[registration]) as rt:
            await rt.resume()
            run = await client.start_run("desk", "file it")
            await wait_for_status(run, RunStatus.FAILED)

        waiting = asyncio.create_task(run.result())
        await asyncio.sleep(2)  # several unanswered queries
        assert not waiting.done()

        async with await DurableRuntime.open(client=client, agents=[registration]) as rt:
            await rt.resume()
            with pytest.raises(RunFailedError, match="ticket service hung up"):
                await asyncio.wait_for(waiting, 60)
        await run.cancel()

    async def test_finds_a_failure_behind_several_pages_of_history(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """A wait that starts once a long run has failed reads its history page after page."""
        await runtimes.start([looping_agent(max_turns=60, continue_as_new_events=10_000)])
        run = await client.start_run("looper", "go")
        await wait_for_status(run, RunStatus.FAILED, within=60)
        history = await client.temporal.get_workflow_handle(run.run_id).fetch_history()
        assert len(history.events) > 600  # more than one page (512 events on the dev server)

        with pytest.raises(RunFailedError, match=r"used all 60 turns \(max_turns\)"):
            await run.result()
        await run.cancel()

    async def test_follows_continue_as_new_to_a_failure_in_a_later_run(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """A wait begun in the first Temporal run raises at a failure in a later one."""
        await runtimes.start([looping_agent(max_turns=8, continue_as_new_events=40)])
        run = await client.start_run("looper", "go")

        with pytest.raises(RunFailedError, match=r"used all 8 turns \(max_turns\)"):
            await run.result()

        described = await client.temporal.get_workflow_handle(run.run_id).describe()
        assert described.run_id != described.raw_description.workflow_execution_info.first_run_id
        await run.cancel()
