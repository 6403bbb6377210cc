"""Sessions (SPEC section 13): a conversation of submissions, each a run that reads
every earlier message, held once by the session and never copied into each run."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import ResetStickyTaskQueueRequest
from temporalio.client import WorkflowFailureError
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    DurableConflictError,
    FunctionModel,
    LiveItem,
    ModelRequest,
    RunFailedError,
    RunStatus,
    SessionHandle,
    SessionLiveEvent,
    ToolContext,
    ToolRetry,
    tool,
)
from durably.contract import (
    SA_SESSION,
    SESSION_WORKFLOW_TYPE,
    WORKFLOW_TYPE,
    SessionInput,
    SubmitRequest,
)
from durably.messages import (
    AssistantMessage,
    Message,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from durably.tools import question_tool
from durably.workflows._session_machine import SessionMachine

from .conftest import (
    Runtimes,
    chain_histories,
    confirmed_status,
    eventually,
    failed_tasks,
    record_history,
    wait_for_status,
)


class Order(BaseModel):
    order: str


def said(request: ModelRequest) -> list[str]:
    """The request's messages as `role: text`, in order (a tool call as `call NAME`)."""
    shown = []
    for m in request.messages:
        if isinstance(m, AssistantMessage) and m.tool_calls:
            shown.append(f"assistant: call {m.tool_calls[0].name}")
        elif isinstance(m, ToolResultMessage):
            shown.append(f"tool: {m.content}")
        else:
            shown.append(f"{m.role}: {m.content}")
    return shown


def holds(session: SessionHandle, messages: int) -> Callable[[], Awaitable[bool]]:
    """Whether the session has taken its closed runs' messages, `messages` in all (a
    run's result reaches its caller a moment before its session has its messages)."""

    async def check() -> bool:
        return (await session.snapshot()).messages == messages

    return check


def clerk(seen: list[list[str]]) -> AgentRegistration:
    """Answers each message; looks an order up when asked to. Records what it was sent."""

    @tool
    async def lookup(args: Order, ctx: ToolContext) -> str:
        """Look an order up."""
        return f"{args.order} ships tomorrow"

    def answer(request: ModelRequest) -> AssistantMessage:
        seen.append(said(request))
        last = request.messages[-1]
        if isinstance(last, UserMessage) and last.content.startswith("where is "):
            order = last.content.removeprefix("where is ")
            return AssistantMessage(
                tool_calls=(ToolCall(call_id="c1", name="lookup", arguments={"order": order}),)
            )
        if isinstance(last, ToolResultMessage):
            return AssistantMessage(content=f"It {last.content.split(' ', 1)[1]}.")
        return AssistantMessage(content=f"noted: {last.content}")

    agent = Agent(id="clerk", model=FunctionModel(answer), instructions="", tools=[lookup])
    return AgentRegistration(agent, version="1", tool_recovery={"lookup": "safe"})


def asker() -> AgentRegistration:
    """Asks the customer a question about each message, then says what they answered."""

    def answer(request: ModelRequest) -> AssistantMessage:
        last = request.messages[-1]
        if isinstance(last, ToolResultMessage):
            return AssistantMessage(content=f"you said {last.content}")
        return AssistantMessage(
            tool_calls=(ToolCall(call_id="q", name="ask_user", arguments={"question": "Which?"}),)
        )

    agent = Agent(
        id="asker",
        model=FunctionModel(answer),
        instructions="",
        tools=[question_tool(name="ask_user", description="Ask the customer.")],
    )
    return AgentRegistration(agent, version="1")


class TestConversation:
    async def test_each_run_reads_every_earlier_message_in_order(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        seen: list[list[str]] = []
        await runtimes.start([clerk(seen)])
        session = await client.start_session("clerk")

        outputs = []
        for text in ("hello, I am Ada", "where is A-7", "thanks"):
            run = await session.submit(text)
            outputs.append((await run.result()).output)

        assert outputs == ["noted: hello, I am Ada", "It ships tomorrow.", "noted: thanks"]
        assert seen[-1] == [
            "user: hello, I am Ada",
            "assistant: noted: hello, I am Ada",
            "user: where is A-7",
            "assistant: call lookup",
            "tool: A-7 ships tomorrow",
            "assistant: It ships tomorrow.",
            "user: thanks",
        ]
        await eventually(holds(session, 8))
        snapshot = await session.snapshot()
        await record_history(client, session.session_id, "session_three_submissions")
        await record_history(
            client, snapshot.runs[2].run_id, "session_run_reading_the_conversation"
        )
        assert [r.status for r in snapshot.runs] == ["completed"] * 3
        assert snapshot.messages == 8
        assert [r.offset for r in snapshot.runs] == [0, 2, 6]
        assert snapshot.version == "1"

    async def test_a_fresh_worker_reads_the_conversation_from_the_session(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """No cache holds it (another worker ran the earlier runs): the session serves it."""
        seen: list[list[str]] = []
        first = await runtimes.start([clerk(seen)])
        session = await client.start_session("clerk")
        await (await session.submit("hello")).result()
        await eventually(holds(session, 2))
        await first.close()
        await client.temporal.workflow_service.reset_sticky_task_queue(
            ResetStickyTaskQueueRequest(
                namespace=client.temporal.namespace,
                execution=WorkflowExecution(workflow_id=session.session_id),
            )
        )  # the stopped worker no longer holds the session: the next one takes it now

        await runtimes.start([clerk(seen)])
        await (await session.submit("again")).result()

        assert seen[-1] == ["user: hello", "assistant: noted: hello", "user: again"]


class TestBusy:
    async def test_reject_names_the_open_run_and_enqueue_runs_after_it(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        await runtimes.start([asker()])
        session = await client.start_session("asker")
        first = await session.submit("where is my order?")
        waiting = await wait_for_status(first, RunStatus.WAITING)

        with pytest.raises(DurableConflictError, match=f"run {first.run_id!r} is still open"):
            await session.submit("hello?")
        second = await session.submit("and my refund?", if_busy="enqueue")
        assert [r.status for r in (await session.snapshot()).runs] == ["open", "queued"]

        assert waiting.interaction is not None
        await first.answer(waiting.interaction.id, "order 7")
        await first.result()

        async def started() -> bool:
            return (await session.snapshot()).runs[1].status == "open"

        await eventually(started)
        asked = await wait_for_status(second, RunStatus.WAITING)
        assert asked.interaction is not None
        await second.answer(asked.interaction.id, "refund 9")
        result = await second.result()
        assert "refund 9" in (result.output or "")
        await record_history(client, session.session_id, "session_enqueued_behind_a_waiting_run")

    async def test_a_forged_failure_note_does_not_open_a_busy_session(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """A run's status note is a signal anyone may send: a forged "failed" made
        `submit(if_busy="reject")` queue behind a healthy, waiting run."""
        await runtimes.start([asker()])
        session = await client.start_session("asker")
        first = await session.submit("where is my order?")
        waiting = await wait_for_status(first, RunStatus.WAITING)
        handle = client.temporal.get_workflow_handle(session.session_id)

        await handle.signal("run_status", {"run_id": first.run_id, "status": "failed"})

        async def read_the_runs_status() -> bool:  # a local activity's marker, after it
            events = (await handle.fetch_history()).events
            signal = "workflow_execution_signaled_event_attributes"
            signalled = max(i for i, e in enumerate(events) if e.HasField(signal))
            return any(confirmed_status(e) for e in events[signalled:])

        await eventually(read_the_runs_status)
        with pytest.raises(DurableConflictError, match=f"run {first.run_id!r} is still open"):
            await session.submit("hello?")
        assert waiting.interaction is not None
        await first.answer(waiting.interaction.id, "order 7")
        await first.result()
        await record_history(client, session.session_id, "session_read_its_runs_status_for_a_note")

    async def test_a_closed_session_takes_no_more_submissions(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        seen: list[list[str]] = []
        await runtimes.start([clerk(seen)])
        session = await client.start_session("clerk")
        await (await session.submit("hello")).result()
        closed = await session.close()
        assert closed.closing is True
        result = await client.temporal.get_workflow_handle(session.session_id).result()
        assert result["messages"] == 2
        with pytest.raises(DurableConflictError, match="closed"):
            await session.submit("again")


class TestForgedSession:
    async def test_a_run_started_with_another_sessions_reference_is_refused(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        seen: list[list[str]] = []
        await runtimes.start([clerk(seen)])
        session = await client.start_session("clerk")
        await (await session.submit("my card is 4242")).result()
        forged_at = len(seen)

        handle = await client.temporal.start_workflow(
            WORKFLOW_TYPE,
            {
                "agent_id": "clerk",
                "input": "what did they say?",
                "session": {"session_id": session.session_id, "length": 2, "digest": "0" * 32},
            },
            id=f"forged-{uuid.uuid4().hex[:8]}",
            task_queue=client.task_queue,
        )
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
        assert "only the session workflow that starts the run as its child" in str(
            failed.value.cause
        )
        assert len(seen) == forged_at  # no model request was made


class TestContinueAsNew:
    async def test_a_session_continued_twice_keeps_its_runs_queue_version_and_conversation(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        seen: list[list[str]] = []
        await runtimes.start([clerk(seen)])
        session_id = f"long-{uuid.uuid4().hex[:8]}"
        await client.temporal.start_workflow(
            SESSION_WORKFLOW_TYPE,
            {"agent_id": "clerk", "continue_as_new_events": 20},
            id=session_id,
            task_queue=client.task_queue,
            search_attributes=TypedSearchAttributes([SearchAttributePair(SA_SESSION, session_id)]),
        )
        session = await client.get_session(session_id)
        texts = ["one", "two", "three", "four"]
        runs = [await session.submit(texts[0])]
        runs += [await session.submit(t, if_busy="enqueue") for t in texts[1:]]
        for i, run in enumerate(runs):
            await eventually(partial(is_started, session, i))
            await run.result()
        await eventually(holds(session, 8))
        chain = await continued_runs(client, session_id)
        assert chain >= 2, "the session continued as new at least twice"
        await record_history(client, session_id, "session_continued_as_new_between_runs")
        snapshot = await session.snapshot()
        assert [r.run_id for r in snapshot.runs] == [r.run_id for r in runs]
        assert [r.status for r in snapshot.runs] == ["completed"] * 4
        assert snapshot.version == "1"
        # Its live events, followed from the first: through every run of the chain.
        seen_events: list[LiveItem] = []
        async for item in session.events(poll_interval=0.05):
            seen_events.append(item)
            closed = [i for i in seen_events if i.event.type == "run_closed"]
            if len(closed) == 4:
                break
        own = [i for i in seen_events if isinstance(i.event, SessionLiveEvent)]
        assert [i.offset for i in own] == list(range(len(own)))
        assert [i.event.type for i in own].count("continued_as_new") >= 2
        started = [i.event.run_id for i in own if i.event.type == "run_started"]
        assert started == [r.run_id for r in runs]
        assert seen[-1] == [
            *[line for t in texts[:3] for line in (f"user: {t}", f"assistant: noted: {t}")],
            "user: four",
        ]


def reader() -> AgentRegistration:
    """Says how much it was sent, never repeating it (a large answer would double it)."""

    def answer(request: ModelRequest) -> AssistantMessage:
        sizes = [len(m.content) for m in request.messages if isinstance(m, UserMessage)]
        return AssistantMessage(content=f"read {sizes}")

    agent = Agent(id="reader", model=FunctionModel(answer, name="reader"), instructions="")
    return AgentRegistration(agent, version="1")


class TestLargeSubmissions:
    """Temporal terminates a workflow whose history reaches 50 MB, and a session that is
    terminated cancels its open run (its parent-close policy)."""

    async def test_a_session_of_large_submissions_continues_as_new_on_its_size(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """Each 1 MB submission adds about 3 MB to the session's history (the update, the
        run's start, its transcript); a session that counted only events never continued
        as new, and nineteen of them ended it."""
        await runtimes.start([reader()])
        session = await client.start_session("reader")
        for i in range(5):  # one after the other: the last run may still be closing
            run = await session.submit(f"{i}" + "x" * 1_000_000, if_busy="enqueue")
            await eventually(partial(is_started, session, i))
            result = await run.result()
            assert result.output == f"read {[1_000_001] * (i + 1)}"
        await eventually(holds(session, 10))

        snapshot = await session.snapshot()
        assert [r.status for r in snapshot.runs] == ["completed"] * 5
        # Cut to their start, with their size (runs carried past a continue-as-new keep
        # no input at all).
        assert all(len(r.input) <= 1_000 for r in snapshot.runs)
        assert snapshot.runs[-1].input_bytes == 1_000_001
        histories = await chain_histories(client, session.session_id)
        assert len(histories) >= 2 and failed_tasks(histories) == []
        assert max(sum(e.ByteSize() for e in h.events) for h in histories) < 16 * 2**20

    async def test_a_session_continues_as_new_at_the_size_it_was_started_with(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        await runtimes.start([reader()])
        session_id = f"sized-{uuid.uuid4().hex[:8]}"
        await client.temporal.start_workflow(
            SESSION_WORKFLOW_TYPE,
            {"agent_id": "reader", "continue_as_new_bytes": 2**16},
            id=session_id,
            task_queue=client.task_queue,
            search_attributes=TypedSearchAttributes([SearchAttributePair(SA_SESSION, session_id)]),
        )
        session = await client.get_session(session_id)
        for i in range(3):
            run = await session.submit(f"{i}" + "y" * 30_000, if_busy="enqueue")
            await eventually(partial(is_started, session, i))
            assert (await run.result()).output == f"read {[30_001] * (i + 1)}"

        histories = await chain_histories(client, session_id)
        assert len(histories) >= 2 and failed_tasks(histories) == []
        described = await client.temporal.get_workflow_handle(session_id).describe()
        first = described.raw_description.workflow_execution_info.first_run_id
        await record_history(client, session_id, "session_continuing_on_its_size", first)
        await record_history(client, session_id, "session_continued_on_its_size")

    async def test_queued_submissions_past_what_a_session_carries_are_refused_before_history(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """Queued submissions travel in the session's continue-as-new input, one payload:
        three of 900 kB made it 2.7 MB, every workflow task failed, and none ran."""
        await runtimes.start([asker()])
        session = await client.start_session("asker")
        first = await session.submit("where is my order?")
        waiting = await wait_for_status(first, RunStatus.WAITING)
        queued = await session.submit("a" * 900_000, if_busy="enqueue")
        handle = client.temporal.get_workflow_handle(session.session_id)
        before = len((await handle.fetch_history()).events)

        with pytest.raises(DurableConflictError, match="bytes of queued submissions"):
            await session.submit("b" * 900_000, if_busy="enqueue")

        assert len((await handle.fetch_history()).events) == before
        assert [r.status for r in (await session.snapshot()).runs] == ["open", "queued"]
        assert waiting.interaction is not None
        await first.answer(waiting.interaction.id, "order 7")
        await eventually(partial(is_started, session, 1))
        asked = await wait_for_status(queued, RunStatus.WAITING)
        assert asked.interaction is not None
        await queued.answer(asked.interaction.id, "nothing more")
        assert "nothing more" in ((await queued.result()).output or "")


async def continued_runs(client: DurableClient, workflow_id: str) -> int:
    """How many times the workflow continued as new so far."""
    handle = client.temporal.get_workflow_handle(workflow_id)
    described = await handle.describe()
    first = described.raw_description.workflow_execution_info.first_run_id
    count, temporal_run_id = 0, first
    while temporal_run_id != described.run_id:
        history = await client.temporal.get_workflow_handle(
            workflow_id, run_id=temporal_run_id
        ).fetch_history()
        last = history.events[-1]
        temporal_run_id = (
            last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
        )
        count += 1
    return count


async def is_started(session: SessionHandle, index: int) -> bool:
    """Whether the session has started its `index`th run (a queued one exists only then)."""
    return (await session.snapshot()).runs[index].status != "queued"


def breaker(
    failing: dict[str, bool], charge: Any = None, agent_id: str = "breaker"
) -> AgentRegistration:
    """Charges a card with a `safe` tool that fails while `failing["now"]` (or `charge`)."""

    @tool(name="charge")
    async def default_charge(args: Order, ctx: ToolContext) -> str:
        """Charge the order."""
        if failing["now"]:
            raise RuntimeError("the card network is down")
        return f"charged {args.order}"

    charge = charge or default_charge

    def answer(request: ModelRequest) -> AssistantMessage:
        last = request.messages[-1]
        if isinstance(last, ToolResultMessage):
            return AssistantMessage(content=f"done: {last.content}")
        if isinstance(last, UserMessage) and last.content.startswith("charge "):
            order = last.content.removeprefix("charge ")
            return AssistantMessage(
                tool_calls=(ToolCall(call_id="c1", name="charge", arguments={"order": order}),)
            )
        return AssistantMessage(content=f"{len(request.messages)} messages so far")

    agent = Agent(id=agent_id, model=FunctionModel(answer), instructions="", tools=[charge])
    return AgentRegistration(
        agent,
        version="1",
        tool_recovery={"charge": "safe"},
        tool_retry=ToolRetry(max_attempts=2, initial_delay_ms=1, max_delay_ms=1),
    )


class TestFailedAndInterrupted:
    async def test_a_failed_run_does_not_block_and_is_not_retried_once_the_session_moves_on(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        failing = {"now": True}
        await runtimes.start([breaker(failing)])
        twin = await client.start_session("breaker")
        session = await client.start_session("breaker")
        early = await twin.submit("charge A-1")
        failed = await session.submit("charge A-2")
        for run in (early, failed):
            await wait_for_status(run, RunStatus.FAILED)

        async def reported() -> bool:
            return (await session.snapshot()).runs[0].reported == RunStatus.FAILED

        await eventually(reported)
        after = await session.submit("hello")  # the failed run does not make it busy
        assert (await after.result()).output == "4 messages so far"
        with pytest.raises(DurableConflictError, match="a later submission has advanced session"):
            await failed.retry()
        await record_history(client, session.session_id, "session_advanced_past_a_failed_run")
        await record_history(client, failed.run_id, "session_run_ended_by_a_later_submission")

        failing["now"] = False  # the twin session did not move on: its run is retried
        await early.retry()
        assert (await early.result()).output == "done: charged A-1"

    async def test_a_retry_that_raced_a_later_submission_is_the_last_one(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """A failed run's `retry()` accepted just before the session took a later
        submission: the session's `session_advanced` then reached a running run, which
        ignored it, so the run could be retried again after failing again (SPEC section
        13 says no). The run now asks its session, and remembers."""
        failing = {"now": True}
        gate = asyncio.Event()

        @tool
        async def charge(args: Order, ctx: ToolContext) -> str:
            """Charge the order (after the gate opens, once it has failed)."""
            if failing["now"]:
                raise RuntimeError("the card network is down")
            await gate.wait()
            if failing.get("again"):
                raise RuntimeError("the card network is down again")
            return f"charged {args.order}"

        await runtimes.start([breaker(failing, charge, agent_id="racer")])
        session = await client.start_session("racer")
        first = await session.submit("charge A")
        await wait_for_status(first, RunStatus.FAILED)
        failing["now"] = False
        await first.retry()  # runs again, held at the gate

        async def runs_again() -> bool:
            return (await session.snapshot()).runs[0].reported == RunStatus.RUNNING

        await eventually(runs_again)
        later = await session.submit("hello", if_busy="enqueue")
        # The session's `session_advanced`, as it arrives when the retry raced the submission.
        await client.temporal.get_workflow_handle(first.run_id).signal("session_advanced")

        async def told() -> bool:
            return any(e.type == "session_went_ahead" for e in (await first.snapshot()).events)

        await eventually(told)
        with pytest.raises(DurableConflictError, match="took a later submission"):
            await first.retry()
        failing["again"] = True
        gate.set()
        with pytest.raises(RunFailedError):  # it failed again, and ended: no more retries
            await first.result()
        await eventually(partial(is_started, session, 1))
        assert (await later.result()).output == "4 messages so far"
        await record_history(client, first.run_id, "session_run_raced_a_later_submission")

    async def test_interrupt_cancels_the_open_run_and_its_call_gets_a_result(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        await runtimes.start([asker()])
        session = await client.start_session("asker")
        first = await session.submit("where is my order?")
        await wait_for_status(first, RunStatus.WAITING)

        second = await session.submit("never mind", if_busy="interrupt")
        assert (await first.snapshot()).status == RunStatus.CANCELLED
        asked = await wait_for_status(second, RunStatus.WAITING)
        assert asked.interaction is not None

        snapshot = await session.snapshot()
        assert [r.status for r in snapshot.runs] == ["cancelled", "open"]
        assert snapshot.messages == 3  # the question, its call, and the call's result
        await record_history(client, first.run_id, "session_run_interrupted")


class TestVersions:
    async def test_a_session_keeps_its_version_until_a_submission_upgrades_it(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        seen: list[list[str]] = []
        old, new = clerk(seen), clerk(seen)
        new = AgentRegistration(new.agent, version="2", tool_recovery={"lookup": "safe"})
        await runtimes.start([old, new])
        session = await client.start_session("clerk", version="1")
        await (await session.submit("hello")).result()
        runs = []
        for text, upgrade in (("again", False), ("upgrade me", True), ("and now?", False)):
            run = await session.submit(text, upgrade=upgrade)
            await run.result()
            runs.append((await run.snapshot()).agent_version)
        assert runs == ["1", "2", "2"]

        async def kept() -> bool:
            return (await session.snapshot()).version == "2"

        await eventually(kept)
        assert seen[-1][:2] == ["user: hello", "assistant: noted: hello"]


def last_three(messages: Sequence[Message]) -> Sequence[Message]:
    """A context window: the last three messages (whole turns in this test's script)."""
    return messages[-3:]


class TestContextWindow:
    async def test_the_model_reads_its_window_and_the_session_keeps_everything(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        seen: list[list[str]] = []
        plain = clerk(seen)
        windowed = AgentRegistration(
            Agent(
                id="clerk",
                model=plain.agent.model,
                instructions="",
                tools=plain.agent.tools,
                context_window=last_three,
            ),
            version="1",
            tool_recovery={"lookup": "safe"},
        )
        assert windowed.fingerprint != plain.fingerprint
        assert "context_window" in windowed.fingerprint_parts

        await runtimes.start([windowed])
        session = await client.start_session("clerk")
        for text in ("one", "two", "three"):
            await (await session.submit(text)).result()

        assert seen[-1] == ["user: two", "assistant: noted: two", "user: three"]
        await eventually(holds(session, 6))

    async def test_a_window_that_raises_fails_the_request_saying_so(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        def broken(messages: Sequence[Message]) -> Sequence[Message]:
            raise ValueError("no window today")

        seen: list[list[str]] = []
        plain = clerk(seen)
        agent = Agent(
            id="windowless", model=plain.agent.model, instructions="", context_window=broken
        )
        await runtimes.start([AgentRegistration(agent, version="1")])
        run = await client.start_run("windowless", "hello")
        failed = await wait_for_status(run, RunStatus.FAILED)
        assert "context_window failed: ValueError: no window today" in (failed.error or "")
        assert seen == []  # the model was never asked


class TestWaitsBehind:
    """The session's decision behind a submit's `queued` answer, without Temporal."""

    def machine(self) -> tuple[SessionMachine, str, str]:
        ids = iter(["a", "b", "c"])
        m = SessionMachine("s", SessionInput(agent_id="x"), None, new_id=lambda: next(ids))
        first = m.submit(SubmitRequest(input="one")).run_id
        m.started(m.runs[0])
        m.reported(first, RunStatus.FAILED)
        later = m.submit(SubmitRequest(input="two")).run_id  # past the failed run
        return m, first, later

    def test_a_submission_past_a_failed_run_waits_behind_it_once_it_runs_again(self) -> None:
        m, first, later = self.machine()
        assert not m.waits_behind(later)
        m.reported(first, RunStatus.RUNNING)  # its retry raced the submission
        assert m.waits_behind(later)

    def test_a_failed_run_that_ends_is_not_waited_behind(self) -> None:
        m, first, later = self.machine()
        m.reported(first, RunStatus.CANCELLED)  # cancelled from outside: it is ending
        assert not m.waits_behind(later)
        m.ending(m.runs[0])
        assert not m.waits_behind(later)
