"""Long runs continue-as-new with no visible change to operators."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    FunctionModel,
    ModelRequest,
    RunStatus,
    ScriptedModel,
    ToolContext,
    tool,
)
from durably.activities import TranscriptCache
from durably.contract import RespondAccepted
from durably.messages import AssistantMessage, ToolCall, ToolResultMessage
from durably.tools import question_tool

from .conftest import Runtimes, eventually, record_history, wait_for_interaction

TURNS = 12


class Note(BaseModel):
    n: int


async def test_a_long_run_continues_as_new_and_keeps_its_id_transcript_and_events(
    env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes
) -> None:
    """With a low threshold (40 events) a 12-turn run continues as new several times."""
    seen_lengths: list[int] = []

    def model(request: ModelRequest) -> AssistantMessage:
        seen_lengths.append(len(request.messages))
        turn = sum(isinstance(m, AssistantMessage) for m in request.messages)
        if turn < TURNS:
            return AssistantMessage(
                tool_calls=(ToolCall(id=f"c{turn}", name="note", arguments={"n": turn}),)
            )
        return AssistantMessage(content=f"wrote {turn} notes")

    @tool
    async def note(args: Note, ctx: ToolContext) -> str:
        """Write a note."""
        return f"note {args.n}: " + "z" * 500

    agent = Agent(id="writer", model=FunctionModel(model), instructions="", tools=[note])
    registration = AgentRegistration(
        agent, version="1", tool_recovery={"note": "safe"}, continue_as_new_events=40
    )
    await runtimes.start([registration])
    run = await client.start_run("writer", "write notes")
    result = await run.result()

    assert result.output == f"wrote {TURNS} notes"
    # Every request saw the whole transcript: input + 2 messages per earlier turn.
    assert seen_lengths == [1 + 2 * t for t in range(TURNS + 1)]
    snap = await run.snapshot()
    assert (snap.status, snap.turns, snap.run_id) == (
        RunStatus.COMPLETED,
        TURNS + 1,
        run.run_id,
    )
    seqs = [e.seq for e in snap.events]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    query = f"WorkflowId = '{run.run_id}'"
    runs = [w async for w in env.client.list_workflows(query)]
    statuses = sorted(w.status.name for w in runs if w.status is not None)
    assert WorkflowExecutionStatus.CONTINUED_AS_NEW.name in statuses
    assert statuses.count(WorkflowExecutionStatus.COMPLETED.name) == 1
    first_run = (await _chain(env, run.run_id))[0][0]
    await record_history(client, run.run_id, "continued_as_new_archiving_transcript", first_run)
    await record_history(client, run.run_id, "completed_after_restoring_transcript")


BIG_TURNS = 10
BIG_RESULT = 300_000  # 10 of these are 3 MB: past the 2 MB continue-as-new payload limit


def _big_agent(seen: list[list[str]]) -> AgentRegistration:
    """An agent whose tool results add up to a transcript no payload can carry."""

    def model(request: ModelRequest) -> AssistantMessage:
        seen.append([m.content[:10] for m in request.messages if isinstance(m, ToolResultMessage)])
        assert all(
            len(m.content) == BIG_RESULT
            for m in request.messages
            if isinstance(m, ToolResultMessage)
        )
        turn = sum(isinstance(m, AssistantMessage) for m in request.messages)
        if turn < BIG_TURNS:
            return AssistantMessage(
                tool_calls=(ToolCall(id=f"c{turn}", name="fetch", arguments={"n": turn}),)
            )
        return AssistantMessage(content=f"read {turn} pages")

    @tool
    async def fetch(args: Note, ctx: ToolContext) -> str:
        """Fetch a large page."""
        return f"page {args.n:04d} ".ljust(BIG_RESULT, "x")

    agent = Agent(id="reader", model=FunctionModel(model), instructions="", tools=[fetch])
    return AgentRegistration(
        agent, version="1", tool_recovery={"fetch": "safe"}, continue_as_new_events=40
    )


async def _chain(env: WorkflowEnvironment, run_id: str) -> list[tuple[str, int]]:
    """Each run of the chain, oldest first: its Temporal run id and its input's size."""
    runs = sorted(
        [w async for w in env.client.list_workflows(f"WorkflowId = '{run_id}'")],
        key=lambda w: w.start_time,
    )
    chain = []
    for w in runs:
        history = await env.client.get_workflow_handle(run_id, run_id=w.run_id).fetch_history()
        started = history.events[0].workflow_execution_started_event_attributes
        chain.append((w.run_id, started.input.ByteSize()))
    return chain


@pytest.mark.parametrize("cached", [True, False], ids=["cache-hit", "no-cache"])
async def test_a_transcript_larger_than_a_payload_survives_continue_as_new(
    env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes, cached: bool
) -> None:
    """A 3 MB transcript continues as new several times and the model still sees all of it.

    Carried in the continue-as-new input it would exceed Temporal's 2 MB
    payload limit and fail every workflow task; it stays in the previous
    run and is restored from the worker's cache or, without one, by
    querying the closed previous run.
    """
    seen: list[list[str]] = []
    await runtimes.start([_big_agent(seen)], cache=None if cached else TranscriptCache(max_runs=0))
    run = await client.start_run("reader", "read everything")
    async with asyncio.timeout(120):
        result = await run.result()

    assert result.output == f"read {BIG_TURNS} pages"
    # Every request saw every earlier page, in order, whole.
    assert seen == [[f"page {n:04d} " for n in range(t)] for t in range(BIG_TURNS + 1)]
    snap = await run.snapshot()
    assert (snap.status, snap.turns) == (RunStatus.COMPLETED, BIG_TURNS + 1)
    assert any(e.type == "transcript_restored" for e in snap.events)
    chain = await _chain(env, run.run_id)
    assert len(chain) >= 3, chain
    # What continue-as-new carries stays small however long the transcript gets.
    assert all(size < 100_000 for _, size in chain), chain


QUESTIONS = 10
LONG_ANSWER = 400_000  # ten of these are 4 MB of answers: past the payload limit


async def test_long_answers_to_many_questions_survive_continue_as_new(
    env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes
) -> None:
    """Accepted answers are kept for repeated responses, but not all carried across runs.

    Carried whole, 4 MB of answers would exceed the 2 MB continue-as-new
    payload limit and fail every workflow task; a repeat of the latest
    answer is still recognised after continuing as new.
    """
    heard: list[int] = []

    def model(request: ModelRequest) -> AssistantMessage:
        answers = [m for m in request.messages if isinstance(m, ToolResultMessage)]
        heard.append(len(answers))
        assert all(len(a.content) == LONG_ANSWER for a in answers)
        if len(answers) < QUESTIONS:
            n = len(answers)
            return AssistantMessage(
                tool_calls=(ToolCall(id=f"q{n}", name="ask", arguments={"question": f"{n}?"}),)
            )
        return AssistantMessage(content=f"heard {len(answers)} answers")

    ask = question_tool(name="ask", description="Ask the operator.")
    agent = Agent(id="asker", model=FunctionModel(model), instructions="", tools=[ask])
    registration = AgentRegistration(agent, version="1", continue_as_new_events=40)
    await runtimes.start([registration])
    run = await client.start_run("asker", "ask away")
    responses: dict[str, dict[str, str]] = {}
    for n in range(QUESTIONS):
        interaction = f"question:{n + 1}:q{n}"
        await wait_for_interaction(run, interaction)
        responses[interaction] = {"type": "question", "answer": f"{n}".ljust(LONG_ANSWER)}
        await run.respond(interaction, responses[interaction], responder="op")
    async with asyncio.timeout(60):
        result = await run.result()

    assert result.output == f"heard {QUESTIONS} answers"
    assert heard == list(range(QUESTIONS + 1))
    chain = await _chain(env, run.run_id)
    assert len(chain) >= 3, chain
    assert all(size < 1_000_000 for _, size in chain), chain


APPROVALS = 8


async def test_a_repeated_approval_after_continue_as_new_returns_the_original_acceptance(
    env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes
) -> None:
    """The newest answers cross continue-as-new, so a client's retry is still harmless."""
    done: list[int] = []

    @tool(requires_approval=True)
    async def step(args: Note, ctx: ToolContext) -> str:
        """Take a step that needs approval."""
        done.append(args.n)
        return f"step {args.n}"

    def model(request: ModelRequest) -> AssistantMessage:
        n = sum(isinstance(m, ToolResultMessage) for m in request.messages)
        if n < APPROVALS:
            return AssistantMessage(
                tool_calls=(ToolCall(id=f"s{n}", name="step", arguments={"n": n}),)
            )
        return AssistantMessage(content=f"took {n} steps")

    agent = Agent(id="stepper", model=FunctionModel(model), instructions="", tools=[step])
    registration = AgentRegistration(
        agent, version="1", tool_recovery={"step": "safe"}, continue_as_new_events=40
    )
    approve = {"type": "tool-approval", "approved": True}
    repeated = 0
    await runtimes.start([registration])
    run = await client.start_run("stepper", "step through")
    handle = env.client.get_workflow_handle(run.run_id)
    previous: tuple[str, str, RespondAccepted] | None = None  # interaction, run, acceptance
    for n in range(APPROVALS):
        interaction = f"approval:{n + 1}:s{n}"
        await wait_for_interaction(run, interaction)
        temporal_run = (await handle.describe()).run_id
        if previous is not None and previous[1] != temporal_run:
            # The run continued as new since `previous` was accepted: repeat it.
            assert await run.respond(previous[0], approve, responder="op") == previous[2]
            repeated += 1
            # The run that continued as new keeps `running` as its last status, but it is
            # over: the chain is one unfinished run (what the startup recipe registers for).

            async def listed_once() -> bool:
                listed = await client.list_runs(unfinished=True, agent_id="stepper")
                statuses = await client.list_runs(status=RunStatus.RUNNING, agent_id="stepper")
                return [r.run_id for r in listed] == [run.run_id] and statuses == []

            await eventually(listed_once)
        accepted = await run.respond(interaction, approve, responder="op")
        previous = (interaction, temporal_run, accepted)
    result = await run.result()

    assert result.output == f"took {APPROVALS} steps"
    assert done == list(range(APPROVALS))  # each step ran once
    assert repeated >= 1


async def test_restoring_from_a_previous_run_that_is_gone_fails_with_what_to_do(
    env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes
) -> None:
    """A previous run past the namespace's retention cannot be restored: say so, never retry."""
    import dataclasses
    import uuid

    from temporalio.exceptions import ApplicationError
    from temporalio.testing import ActivityEnvironment

    from durably.activities import AgentActivities, ErrorType
    from durably.contract import TranscriptArchive, TranscriptRestoreRequest
    from durably.registry import AgentRegistry

    quick = Agent(id="quick", model=ScriptedModel(["done"]), instructions="", tools=[])
    registration = AgentRegistration(quick, version="1")
    await runtimes.start([registration])
    run = await client.start_run("quick", "go")  # a workflow whose other run is gone
    await run.result()

    activities = AgentActivities(AgentRegistry(), cache=TranscriptCache(max_runs=0))
    activity_env = ActivityEnvironment(client=env.client)
    described = await client.temporal.get_workflow_handle(run.run_id).describe()
    activity_env.info = dataclasses.replace(
        activity_env.info,
        workflow_id=run.run_id,
        workflow_run_id=described.run_id,
        workflow_type="AgentRunWorkflow",
        task_queue=client.task_queue,
    )
    gone = TranscriptArchive(
        run_id=str(uuid.uuid4()), length=3, digest="0" * 64, base_length=3, new=[]
    )
    with pytest.raises(ApplicationError) as raised:
        await activity_env.run(
            activities.restore_transcript, TranscriptRestoreRequest(archive=gone, offset=0)
        )
    assert raised.value.type == ErrorType.TRANSCRIPT_LOST
    assert raised.value.non_retryable
    assert "outlived the namespace's retention" in raised.value.message
    assert "Cancel this run and start a new one" in raised.value.message
