"""Long runs continue-as-new with no visible change to operators."""

from __future__ import annotations

from pydantic import BaseModel
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    DurableRuntime,
    FunctionModel,
    ModelRequest,
    RunStatus,
    ToolContext,
    tool,
)
from durably.messages import AssistantMessage, ToolCall

from .conftest import record_history

TURNS = 12


class Note(BaseModel):
    n: int


async def test_a_long_run_continues_as_new_and_keeps_its_id_transcript_and_events(
    env: WorkflowEnvironment, task_queue: str
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
    client = DurableClient(env.client, task_queue=task_queue)
    registration = AgentRegistration(
        agent, version="1", tool_recovery={"note": "safe"}, continue_as_new_events=40
    )
    async with await DurableRuntime.open(client=client, agents=[registration]) as runtime:
        await runtime.resume()
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
        await record_history(client, run.run_id, "completed_after_continue_as_new")
