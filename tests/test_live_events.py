"""Live events (SPEC section 15): every committed event of a run, in order, resumable,
through continue-as-new, and never a line in the run's history."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowUpdateFailedError

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    FunctionModel,
    LiveEvent,
    LiveItem,
    ModelRequest,
    RunHandle,
    RunStatus,
    ToolContext,
    tool,
)
from durably.messages import AssistantMessage, ToolCall
from durably.models import last_tool_results

from .conftest import Runtimes, eventually, wait_for_status


class Order(BaseModel):
    order: str


@tool
async def lookup(args: Order, ctx: ToolContext) -> str:
    """Look an order up."""
    return f"order {args.order} ships"


def looker(turns: int = 1, **options: int) -> AgentRegistration:
    """An agent that looks an order up `turns` times, one call per turn, then answers."""

    def model(request: ModelRequest) -> AssistantMessage:
        done = sum(isinstance(m, AssistantMessage) for m in request.messages)
        if done < turns:
            call = ToolCall(id=f"c{done}", name="lookup", arguments={"order": str(done)})
            return AssistantMessage(tool_calls=(call,))
        return AssistantMessage(content=f"done: {last_tool_results(request)[0].content}")

    agent = Agent(
        id="looker",
        model=FunctionModel(model, name="live-tests.looker"),
        instructions="",
        tools=[lookup],
    )
    return AgentRegistration(agent, version="1", tool_recovery={"lookup": "safe"}, **options)


@tool(requires_approval=True)
async def refund(args: Order, ctx: ToolContext) -> str:
    """Refund an order."""
    return "refunded"


def refunder() -> AgentRegistration:
    """An agent whose one call waits for approval."""

    def model(request: ModelRequest) -> AssistantMessage:
        if last_tool_results(request):
            return AssistantMessage(content="ok")
        call = ToolCall(id="r", name="refund", arguments={"order": "A"})
        return AssistantMessage(tool_calls=(call,))

    agent = Agent(
        id="refunder",
        model=FunctionModel(model, name="live-tests.refunder"),
        instructions="",
        tools=[refund],
    )
    return AgentRegistration(agent, version="1")


async def collect(events: AsyncIterator[LiveItem], limit: int | None = None) -> list[LiveItem]:
    items: list[LiveItem] = []
    async for item in events:
        items.append(item)
        if limit is not None and len(items) == limit:
            break
    return items


def kinds(items: list[LiveItem]) -> list[str]:
    """The committed events' types (text previews left out)."""
    return [i.event.type for i in items if i.event.type != "text_delta"]


def committed(items: list[LiveItem]) -> list[LiveItem]:
    return [i for i in items if i.event.type != "text_delta"]


async def recorded_followers(client: DurableClient, run: RunHandle) -> list[str]:
    """History events a follower could have caused: updates, signals, queries recorded."""
    history = await client.temporal.get_workflow_handle(run.run_id).fetch_history()
    suspect = {
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
    }
    return [EventType.Name(e.event_type) for e in history.events if e.event_type in suspect]


class TestFollowingARun:
    async def test_every_committed_event_in_order_from_the_first_offset(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        await runtimes.start([looker()])
        run = await client.start_run("looker", "where is order 0")

        items = await asyncio.wait_for(collect(run.events()), 30)

        assert kinds(items) == [
            "agent_pinned",
            "model_started",
            "model_completed",
            "tool_started",
            "tool_completed",
            "model_started",
            "model_completed",
            "run_completed",
        ]
        assert [i.offset for i in committed(items)] == list(range(len(committed(items))))
        done = items[-1].event
        assert done.output == "done: order 0 ships" and done.status == "completed"
        snapshot_seqs = [e.seq for e in (await run.snapshot()).events]
        seqs = [i.event.seq for i in committed(items) if isinstance(i.event, LiveEvent)]
        assert [q for q in seqs if q] == snapshot_seqs  # the same events

    async def test_a_follower_that_resumes_from_its_last_offset_misses_and_repeats_nothing(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        await runtimes.start([looker(turns=3)])
        run = await client.start_run("looker", "three lookups")
        first = await asyncio.wait_for(collect(run.events(), limit=4), 30)  # then it drops

        rest = await asyncio.wait_for(collect(run.events(after=first[-1].offset)), 30)
        whole = await asyncio.wait_for(collect(run.events()), 30)

        assert [i.offset for i in committed(first + rest)] == [i.offset for i in committed(whole)]
        assert kinds(first + rest) == kinds(whole)
        assert kinds(whole)[-1] == "run_completed"

    async def test_ten_followers_record_nothing_in_the_runs_history(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        await runtimes.start([looker(turns=2)])
        run = await client.start_run("looker", "two lookups")

        seen = await asyncio.wait_for(
            asyncio.gather(*(collect(run.events()) for _ in range(10))), 30
        )

        assert all(kinds(s) == kinds(seen[0]) for s in seen)
        assert await recorded_followers(client, run) == []

    async def test_a_follower_goes_on_through_continue_as_new(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        await runtimes.start([looker(turns=6, continue_as_new_events=40)])
        run = await client.start_run("looker", "six lookups")

        items = await asyncio.wait_for(collect(run.events()), 60)

        assert "continued_as_new" in kinds(items)
        assert [i.offset for i in committed(items)] == list(range(len(committed(items))))
        assert kinds(items).count("tool_completed") == 6
        assert kinds(items)[-1] == "run_completed"

    async def test_a_waiting_event_names_its_interaction(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        await runtimes.start([refunder()])
        run = await client.start_run("refunder", "refund A")
        await wait_for_status(run, RunStatus.WAITING)

        async def until_waiting() -> LiveItem:
            async for item in run.events():
                if item.event.type == "waiting":
                    return item
            raise AssertionError("the run ended without waiting")

        waiting = await asyncio.wait_for(until_waiting(), 30)
        interaction = waiting.event.interaction
        assert interaction is not None and interaction.args == {"order": "A"}
        assert waiting.event.status == "waiting"
        await run.approve(interaction, responder="alice")
        rest = await asyncio.wait_for(collect(run.events(after=waiting.offset)), 30)
        assert kinds(rest)[:2] == ["approved", "tool_started"]
        assert kinds(rest)[-1] == "run_completed"


class TestNoWayIn:
    async def test_a_forged_publish_is_rejected_and_the_poll_update_is_refused(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """The stream's publish signal would let anyone put words in a run's mouth, and its
        poll update records its items per follower: both are closed on an open run."""
        await runtimes.start([refunder()])
        run = await client.start_run("refunder", "refund A")
        await wait_for_status(run, RunStatus.WAITING)
        handle = client.temporal.get_workflow_handle(run.run_id)
        forged = {"items": [{"topic": "durably.events", "data": "e30="}], "publisher_id": "x"}

        await handle.signal("__temporal_workflow_stream_publish", forged)

        async def rejected() -> bool:
            events = (await run.snapshot()).events
            return any(e.type == "signal_rejected" for e in events)

        await eventually(rejected)
        before = len((await handle.fetch_history()).events)
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update(
                "__temporal_workflow_stream_poll", {"topics": [], "from_offset": 0}
            )
        assert len((await handle.fetch_history()).events) == before
        items = await asyncio.wait_for(collect(run.events(), limit=5), 30)
        assert kinds(items) == [
            "agent_pinned",
            "model_started",
            "model_completed",
            "waiting",
            "signal_rejected",
        ]
        await run.cancel()


class TestTextAsItIsWritten:
    async def test_the_answer_streams_to_a_follower_before_the_request_completes(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """The model writes "Hel", then waits until a follower has shown it: the piece
        reached the follower live (heartbeat details, no history), and the pieces end as
        the committed answer reads, before `model_completed`."""
        shown = asyncio.Event()

        async def model(request: ModelRequest) -> AsyncIterator[str]:
            yield "Hel"
            await asyncio.wait_for(shown.wait(), 20)
            yield "lo, "
            yield "world"

        agent = Agent(
            id="writer",
            model=FunctionModel(model, name="live-tests.writer"),
            instructions="",
        )
        await runtimes.start([AgentRegistration(agent, version="1")])
        run = await client.start_run("writer", "say hello")
        items: list[LiveItem] = []
        async for item in run.events(poll_interval=0.05):
            items.append(item)
            if item.event.type == "text_delta":
                shown.set()

        texts = [i for i in items if i.event.type == "text_delta"]
        assert texts[0].event.text == "Hel"  # type: ignore[union-attr]
        assert "".join(t.event.text for t in texts) == "Hello, world"  # type: ignore[union-attr]
        completed = kinds(items).index("model_completed")
        assert items.index(texts[-1]) < [i.event.type for i in items].index("model_completed")
        assert completed >= 0
        assert (await run.result()).output == "Hello, world"
        assert await recorded_followers(client, run) == []
