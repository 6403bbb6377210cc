"""Signals of a workflow task commute with its other events (SPEC section 22).

Within one workflow task, Temporal applies signals before the task's other
events (an activity's result, a child's start), live and on replay. A worker
that applied those events early (a query it answered first; see
`test_query_race.py`) handled them in the other order. Under the
`durably-signals-commute` patch, a response that names an interaction of the
turn whose model answer is still on its way waits for that answer, so both
orders give the same commands.

These tests put a signal in the same task as the event it is about on a real
server: a workflow-only worker takes the run's tasks, an activity-only worker
its activities, and the workflow worker is down while the activity completes
and the signal arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.worker import Worker

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    DurablyPlugin,
    FunctionModel,
    ModelRequest,
    ToolContext,
    tool,
)
from durably.contract import EventType as RunEventType
from durably.contract import RespondRequest
from durably.messages import AssistantMessage, ToolCall
from durably.models import last_tool_results

from .conftest import eventually, record_history


class Split:
    """A run's workflow tasks and activities on separate workers, so a test can stop
    the workflow side alone."""

    def __init__(self, client: DurableClient, registration: AgentRegistration) -> None:
        self.client = client
        self.plugin = DurablyPlugin([registration])
        self._workflows: Worker | None = None
        self._serving: list[asyncio.Task[None]] = []
        self._activities = self._worker(workflows=False)

    def _worker(self, *, workflows: bool) -> Worker:
        if workflows:  # durably's worker, running the run's local activities (its pin) only
            worker = Worker(
                self.client.temporal,
                task_queue=self.client.task_queue,
                plugins=[self.plugin],
                no_remote_activities=True,
            )
        else:
            worker = Worker(
                self.client.temporal,
                task_queue=self.client.task_queue,
                activities=self.plugin.agent_activities.methods(),
            )
        self._serving.append(asyncio.create_task(worker.run()))
        return worker

    def start_workflows(self) -> None:
        self._workflows = self._worker(workflows=True)

    async def stop_workflows(self) -> None:
        assert self._workflows is not None
        await self._workflows.shutdown()
        self._workflows = None

    async def close(self) -> None:
        for worker in (self._workflows, self._activities):
            if worker is not None:
                await worker.shutdown()
        for task in self._serving:
            with contextlib.suppress(Exception):
                await task


class Refunds:
    """A model whose first answer waits until the test lets it go, asking to refund."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()  # the model request is out
        self.answer = asyncio.Event()
        self.made: list[str] = []

    def registration(self) -> AgentRegistration:
        refunds = self

        @tool(requires_approval=True)
        async def refund(order: str, ctx: ToolContext) -> str:
            """Refund an order."""
            refunds.made.append(ctx.operation_id)
            return f"refunded {order}"

        async def model(request: ModelRequest) -> AssistantMessage:
            results = last_tool_results(request)
            if results:
                return AssistantMessage(content=results[0].content)
            refunds.asked.set()
            await refunds.answer.wait()
            call = ToolCall(id="c1", name="refund", arguments={"order": "A-1"})
            return AssistantMessage(tool_calls=(call,))

        agent = Agent(
            id="refunder",
            model=FunctionModel(model, name="tests.refunder"),
            instructions="",
            tools=[refund],
        )
        return AgentRegistration(agent, version="1")


@pytest.fixture
async def refunds(client: DurableClient) -> AsyncIterator[tuple[Refunds, Split]]:
    r = Refunds()
    split = Split(client, r.registration())
    yield r, split
    r.answer.set()
    await split.close()


async def _until_in_history(
    client: DurableClient, run_id: str, event_type: EventType.ValueType
) -> None:
    handle = client.temporal.get_workflow_handle(run_id)

    async def written() -> bool:
        return any(e.event_type == event_type for e in (await handle.fetch_history()).events)

    await eventually(written, within=60)


class TestResponsesWithTheirAnswer:
    async def test_an_approval_that_comes_with_the_answer_asking_for_it_is_taken(
        self, client: DurableClient, refunds: tuple[Refunds, Split]
    ) -> None:
        """The approval signal and the model answer asking for it reach the run in one
        workflow task; the signal, applied first, waits for the answer and approves the
        call it asks for (before the patch it was refused, and the run waited)."""
        r, split = refunds
        split.start_workflows()
        run = await client.start_run("refunder", "refund A-1")

        await asyncio.wait_for(r.asked.wait(), 60)
        await split.stop_workflows()
        r.answer.set()
        await _until_in_history(client, run.run_id, EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED)
        handle = client.temporal.get_workflow_handle(run.run_id)
        request = RespondRequest(
            interaction_id="approval:1:c1",
            response={"type": "tool-approval", "approved": True},
            responder="alice",
        )
        await handle.signal("respond_signal", request)
        split.start_workflows()

        result = await asyncio.wait_for(run.result(), 60)

        assert result.output == "refunded A-1"
        assert len(r.made) == 1
        history = await handle.fetch_history()
        kinds = [e.event_type for e in history.events]
        signalled = kinds.index(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED)
        answered = kinds.index(EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED)
        assert EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED not in kinds[answered:signalled]
        snap = await run.snapshot()
        assert [e.type for e in snap.events if e.type == RunEventType.APPROVED] == [
            RunEventType.APPROVED
        ]
        assert not [e for e in snap.events if e.type == RunEventType.RESPONSE_REJECTED]
        await record_history(client, run.run_id, "approval_in_the_task_of_its_answer")
