"""What a user sees of one run: keys, rejected calls, turn budget, cancel, CLI start."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from pydantic import BaseModel, Field
from temporalio.testing import WorkflowEnvironment

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    FunctionModel,
    ModelRequest,
    RunCancelledError,
    RunClosedError,
    RunFailedError,
    RunStatus,
    ScriptedModel,
    ToolContext,
    tool,
)
from durably.activities import TranscriptCache
from durably.contract import SA_AGENT_VERSION
from durably.messages import AssistantMessage, ToolCall
from durably.models import last_tool_results, tool_call
from durably.tools import question_tool

from .conftest import (
    Runtimes,
    binary,
    cli,
    eventually,
    operation_id,
    record_history,
    search_attribute,
    wait_for_status,
)


class Ticket(BaseModel):
    title: str = Field(min_length=1)


class TicketId(BaseModel):
    ticket_id: str


def echo_results(request: ModelRequest) -> AssistantMessage:
    """Final answer listing what each tool result said, so tests see what the model saw."""
    return AssistantMessage(
        content=json.dumps(
            [
                {"tool": r.tool, "error": r.is_error, "content": r.content}
                for r in last_tool_results(request)
            ]
        )
    )


class TestOperationId:
    async def test_operation_id_is_run_and_checkpoint_key_and_survives_a_retry(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """A safe tool that crashes once is retried with the very same operation_id."""
        seen: list[tuple[str, int]] = []

        @tool
        async def create_ticket(args: Ticket, ctx: ToolContext) -> TicketId:
            """Create a ticket."""
            seen.append((ctx.operation_id, ctx.attempt))
            if ctx.attempt == 1:
                raise ConnectionError("ticket service reset the connection")
            return TicketId(ticket_id=f"T-{len(seen)}")

        agent = Agent(
            id="desk",
            model=ScriptedModel(
                [tool_call("create_ticket", call_id="c7", title="vpn"), echo_results]
            ),
            instructions="File tickets.",
            tools=[create_ticket],
        )
        from durably import ToolRetry

        await runtimes.start(
            [
                AgentRegistration(
                    agent,
                    version="1",
                    tool_recovery={"create_ticket": "idempotent"},
                    tool_retry=ToolRetry(max_attempts=3, initial_delay_ms=10, max_delay_ms=10),
                )
            ]
        )
        run = await client.start_run("desk", "file a ticket")
        result = await run.result()

        expected = await operation_id(client, run, "tool:1:c7")
        assert seen == [(expected, 1), (expected, 2)]
        assert json.loads(result.output or "") == [
            {"tool": "create_ticket", "error": False, "content": '{"ticket_id":"T-2"}'}
        ]
        await record_history(client, run.run_id, "completed_after_tool_retry")


class TestRejectedCalls:
    async def test_invalid_arguments_and_unknown_tools_reach_the_model_as_errors(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """Nothing runs for a call that names no tool or whose arguments fail the input model."""
        ran: list[str] = []

        @tool
        async def create_ticket(args: Ticket, ctx: ToolContext) -> TicketId:
            """Create a ticket."""
            ran.append(args.title)
            return TicketId(ticket_id="T-1")

        bad_calls = AssistantMessage(
            tool_calls=(
                ToolCall(id="a", name="create_ticket", arguments={"title": ""}),
                ToolCall(id="b", name="delete_everything", arguments={}),
                ToolCall(id="c", name="create_ticket", raw_arguments='{"title": "vpn'),
            )
        )
        agent = Agent(
            id="desk",
            model=ScriptedModel([bad_calls, echo_results]),
            instructions="File tickets.",
            tools=[create_ticket],
        )
        await runtimes.start([AgentRegistration(agent, version="1")])
        run = await client.start_run("desk", "file a ticket")
        seen = json.loads((await run.result()).output or "")

        assert ran == []
        assert [s["error"] for s in seen] == [True, True, True]
        assert (
            "invalid arguments for 'create_ticket': title: String should have at least 1 character"
            in seen[0]["content"]
        )
        assert (
            "unknown tool 'delete_everything'; available tools: create_ticket" in seen[1]["content"]
        )
        assert "not a JSON object" in seen[2]["content"]
        snap = await run.snapshot()
        assert [e.type for e in snap.events if e.type.startswith("tool")] == ["tool_rejected"] * 3
        await record_history(client, run.run_id, "completed_with_rejected_calls")


class TestTurnBudget:
    async def test_max_turns_exceeded_fails_the_run_with_a_clear_error(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        @tool
        async def ping(args: Ticket, ctx: ToolContext) -> TicketId:
            """Ping."""
            return TicketId(ticket_id="p")

        loop_forever = FunctionModel(
            lambda req: AssistantMessage(
                tool_calls=(ToolCall(id="p", name="ping", arguments={"title": "x"}),)
            )
        )
        agent = Agent(id="looper", model=loop_forever, instructions="", tools=[ping], max_turns=2)
        await runtimes.start(
            [AgentRegistration(agent, version="1", tool_recovery={"ping": "safe"})]
        )
        run = await client.start_run("looper", "go")

        with pytest.raises(
            RunFailedError, match=r"used all 2 turns \(max_turns\) without a final answer"
        ):
            await run.result()
        snap = await run.snapshot()
        assert snap.status == RunStatus.FAILED
        assert snap.turns == 2
        assert "raise Agent.max_turns" in (snap.error or "")

        async def listed_as_failed() -> bool:
            return run.run_id in [r.run_id for r in await client.list_runs(status="failed")]

        await eventually(listed_as_failed)  # visibility trails the run by a moment
        await record_history(client, run.run_id, "failed_max_turns")
        await run.cancel()


class TestCancel:
    async def test_cancel_sets_the_tools_abort_signal_and_ends_cancelled(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        started = asyncio.Event()
        aborted: list[bool] = []

        @tool
        async def long_job(args: Ticket, ctx: ToolContext) -> TicketId:
            """A long job that stops when told to."""
            started.set()
            await ctx.abort_signal.wait()
            aborted.append(True)
            return TicketId(ticket_id="never")

        agent = Agent(
            id="slow",
            model=ScriptedModel([tool_call("long_job", title="x"), "done"]),
            instructions="",
            tools=[long_job],
        )
        await runtimes.start([AgentRegistration(agent, version="1")])
        run = await client.start_run("slow", "go")
        await asyncio.wait_for(started.wait(), 30)
        running = await run.snapshot()
        assert running.status == RunStatus.RUNNING
        assert running.current is not None
        assert "Running tool `long_job` (`tool:1:call_long_job`" in running.current
        assert await search_attribute(client, run, SA_AGENT_VERSION, "1") == "1"

        await run.cancel()

        with pytest.raises(RunCancelledError):
            await run.result()
        assert aborted == [True]
        snap = await run.snapshot()
        assert snap.status == RunStatus.CANCELLED
        assert snap.events[-1].type == "run_cancelled"
        await record_history(client, run.run_id, "cancelled_mid_tool")

    async def test_a_run_terminated_in_temporal_reports_it_is_closed_for_good(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """Terminated from the Web UI or the Temporal CLI: not a failure that retry() fixes."""
        agent = Agent(
            id="asker",
            model=ScriptedModel([tool_call("ask", question="which?"), "done"]),
            instructions="",
            tools=[question_tool(name="ask", description="Ask.")],
        )
        await runtimes.start([AgentRegistration(agent, version="1")])
        run = await client.start_run("asker", "go")
        await wait_for_status(run, RunStatus.WAITING)

        await client.temporal.get_workflow_handle(run.run_id).terminate(reason="ops cleanup")

        with pytest.raises(RunClosedError) as closed:
            await run.result()
        assert "was terminated in Temporal before it finished" in str(closed.value)
        assert "start a new run" in str(closed.value)


class TestTemporalCli:
    async def test_a_run_started_with_temporal_workflow_start_completes(
        self, env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes
    ) -> None:
        agent = Agent(id="greeter", model=ScriptedModel(["hello from durably"]), instructions="")
        await runtimes.start([AgentRegistration(agent, version="1")])
        run_id = f"cli-{uuid.uuid4().hex[:8]}"
        target = env.client.service_client.config.target_host
        proc = await cli(
            binary("temporal"), "workflow", "start", "--address", target,
            "--type", "AgentRunWorkflow", "--task-queue", client.task_queue,
            "--workflow-id", run_id,
            "--input", '{"agent_id": "greeter", "input": "hi", "version": null}',
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr

        run = await client.get_run(run_id)
        result = await run.result()

        assert result.output == "hello from durably"
        snap = await run.snapshot()
        assert (snap.status, snap.agent_id, snap.agent_version) == (
            RunStatus.COMPLETED,
            "greeter",
            "1",
        )


class TestLinearHistory:
    async def test_model_sees_the_whole_transcript_when_the_worker_cache_misses(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """With no cache the model activity rebuilds the transcript from the workflow."""
        transcripts: list[list[str]] = []

        def model(request: ModelRequest) -> AssistantMessage:
            transcripts.append([type(m).__name__ for m in request.messages])
            turn = sum(isinstance(m, AssistantMessage) for m in request.messages)
            if turn < 2:
                return AssistantMessage(
                    tool_calls=(ToolCall(id=f"c{turn}", name="note", arguments={"title": "t"}),)
                )
            return AssistantMessage(content="done")

        @tool
        async def note(args: Ticket, ctx: ToolContext) -> str:
            """Take a note."""
            return "x" * 3000

        agent = Agent(id="noter", model=FunctionModel(model), instructions="", tools=[note])
        await runtimes.start(
            [AgentRegistration(agent, version="1")], cache=TranscriptCache(max_runs=0)
        )
        run = await client.start_run("noter", "take notes")
        await run.result()

        assert transcripts == [
            ["UserMessage"],
            ["UserMessage", "AssistantMessage", "ToolResultMessage"],
            [
                "UserMessage",
                "AssistantMessage",
                "ToolResultMessage",
                "AssistantMessage",
                "ToolResultMessage",
            ],
        ]

    async def test_model_inputs_stay_small_as_the_transcript_grows(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """Tool results are stored once in history, not again in every model request."""

        def model(request: ModelRequest) -> AssistantMessage:
            turn = sum(isinstance(m, AssistantMessage) for m in request.messages)
            if turn < 6:
                return AssistantMessage(
                    tool_calls=(ToolCall(id="c", name="note", arguments={"title": "t"}),)
                )
            return AssistantMessage(content="done")

        @tool
        async def note(args: Ticket, ctx: ToolContext) -> str:
            """Take a note."""
            return "y" * 5000

        agent = Agent(id="noter", model=FunctionModel(model), instructions="", tools=[note])
        await runtimes.start(
            [AgentRegistration(agent, version="1", tool_recovery={"note": "safe"})]
        )
        run = await client.start_run("noter", "take notes")
        await run.result()

        history = await client.temporal.get_workflow_handle(run.run_id).fetch_history()
        model_inputs = [
            e.activity_task_scheduled_event_attributes.input.payloads[0].ByteSize()
            for e in history.events
            if e.HasField("activity_task_scheduled_event_attributes")
            and e.activity_task_scheduled_event_attributes.activity_type.name
            == "durably.model_request"
        ]
        assert len(model_inputs) == 7
        assert max(model_inputs) < 1000, model_inputs
