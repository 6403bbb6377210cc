"""Recovery policies, needs_attention, resolve_tool and retry, on a real server."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import BaseModel

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    DurableConflictError,
    InvalidResponseError,
    RunCancelledError,
    RunFailedError,
    RunHandle,
    RunStatus,
    ScriptedModel,
    ToolContext,
    ToolInterrupted,
    ToolRetry,
    tool,
)
from durably.contract import SA_STATUS
from durably.models import tool_call

from .conftest import (
    Runtimes,
    echo,
    history_length,
    operation_id,
    record_history,
    search_attribute,
    wait_for_status,
)

FAST = ToolRetry(max_attempts=3, initial_delay_ms=10, max_delay_ms=10)


class Ticket(BaseModel):
    title: str


class TicketId(BaseModel):
    ticket_id: str


class Journal:
    """What a tool did, as the external system would record it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.fail_until = 0


def ticket_agent(journal: Journal, *, recovery: str = "manual") -> AgentRegistration:
    @tool
    async def create_ticket(args: Ticket, ctx: ToolContext) -> TicketId:
        """Create a ticket."""
        journal.calls.append((ctx.operation_id, ctx.attempt))
        if len(journal.calls) <= journal.fail_until:
            raise ConnectionResetError("ticket service hung up mid-request")
        return TicketId(ticket_id=f"T-{len(journal.calls)}")

    agent = Agent(
        id="desk",
        model=ScriptedModel([tool_call("create_ticket", call_id="c1", title="vpn"), echo]),
        instructions="File tickets.",
        tools=[create_ticket],
    )
    return AgentRegistration(
        agent,
        version="1",
        tool_recovery={"create_ticket": recovery},  # type: ignore[dict-item]
        tool_retry=FAST,
    )


async def blocked_run(client: DurableClient, runtimes: Runtimes) -> tuple[RunHandle, Journal]:
    """A run whose manual `create_ticket` call failed once: needs_attention on tool:1:c1."""
    journal = Journal()
    journal.fail_until = 1
    await runtimes.start([ticket_agent(journal)])
    run = await client.start_run("desk", "file it")
    await wait_for_status(run, RunStatus.NEEDS_ATTENTION)
    return run, journal


class TestManualTool:
    async def test_an_unexpected_exception_parks_the_run_until_resolved(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        journal = Journal()
        journal.fail_until = 1
        await runtimes.start([ticket_agent(journal)])
        run = await client.start_run("desk", "file it")

        snap = await wait_for_status(run, RunStatus.NEEDS_ATTENTION)

        assert snap.blocked_operation == "tool:1:c1"
        assert isinstance(snap.attention, ToolInterrupted)
        assert snap.attention.reason == "tool_interrupted"
        assert snap.attention.tool == "create_ticket"
        assert snap.attention.args == {"title": "vpn"}
        assert snap.attention.attempts == 1
        assert "ConnectionResetError: ticket service hung up" in (snap.attention.last_error or "")
        assert "Check in the external system" in (snap.current or "")
        assert (
            await search_attribute(client, run, SA_STATUS, "needs_attention") == "needs_attention"
        )

        accepted = await run.resolve_tool(
            "tool:1:c1", {"type": "json", "value": {"ticket_id": "T-verified"}}
        )
        result = await run.result()

        assert accepted.type == "json"
        assert json.loads(result.output or "") == [
            {"error": False, "content": '{"ticket_id":"T-verified"}'}
        ]
        assert journal.calls == [(await operation_id(client, run, "tool:1:c1"), 1)]
        assert "resolved_json" in [e.type for e in (await run.snapshot()).events]
        await record_history(client, run.run_id, "needs_attention_resolved_json")

    async def test_error_resolution_reaches_the_model_as_the_tools_error(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        run, journal = await blocked_run(client, runtimes)

        await run.resolve_tool("tool:1:c1", {"type": "error", "message": "no ticket was created"})

        seen = json.loads((await run.result()).output or "")
        assert seen == [{"error": True, "content": "no ticket was created"}]
        assert len(journal.calls) == 1

    async def test_rerun_executes_the_call_exactly_once_more_with_the_same_operation_id(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        run, journal = await blocked_run(client, runtimes)

        await run.resolve_tool("tool:1:c1", {"type": "rerun"})
        result = await run.result()

        op = await operation_id(client, run, "tool:1:c1")
        assert journal.calls == [(op, 1), (op, 1)]
        assert json.loads(result.output or "") == [
            {"error": False, "content": '{"ticket_id":"T-2"}'}
        ]
        await record_history(client, run.run_id, "needs_attention_rerun")

    async def test_retry_leaves_an_interrupted_manual_call_blocked(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        run, journal = await blocked_run(client, runtimes)
        before = await history_length(client, run)

        with pytest.raises(DurableConflictError, match="retry\\(\\) never repeats a manual call"):
            await run.retry()

        snap = await run.snapshot()
        assert (snap.status, snap.blocked_operation) == (RunStatus.NEEDS_ATTENTION, "tool:1:c1")
        assert await history_length(client, run) == before
        assert len(journal.calls) == 1
        await run.cancel()


class TestRejectedResolutions:
    async def test_every_rejected_resolution_names_its_error_and_leaves_history_unchanged(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        run, _ = await blocked_run(client, runtimes)
        before = await history_length(client, run)

        with pytest.raises(
            DurableConflictError, match="is blocked on 'tool:1:c1', not 'tool:1:c2'"
        ):
            await run.resolve_tool("tool:1:c2", {"type": "json", "value": {"ticket_id": "x"}})
        with pytest.raises(
            InvalidResponseError,
            match=r"does not fit the output schema of tool 'create_ticket': .*'ticket_id' is a",
        ):
            await run.resolve_tool("tool:1:c1", {"type": "json", "value": {"id": 7}})
        with pytest.raises(InvalidResponseError, match="a resolution is"):
            await run.resolve_tool("tool:1:c1", {"type": "maybe"})
        with pytest.raises(InvalidResponseError, match="message"):
            await run.resolve_tool("tool:1:c1", {"type": "error", "message": ""})

        assert await history_length(client, run) == before
        assert (await run.snapshot()).status == RunStatus.NEEDS_ATTENTION

        await run.resolve_tool("tool:1:c1", {"type": "json", "value": {"ticket_id": "T-1"}})
        await run.result()
        with pytest.raises(DurableConflictError, match="is completed; resolve_tool needs an open"):
            await run.resolve_tool("tool:1:c1", {"type": "json", "value": {"ticket_id": "T-1"}})

    async def test_resolve_on_a_running_run_is_a_conflict(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        started = asyncio.Event()
        release = asyncio.Event()

        @tool
        async def wait_here(args: Ticket, ctx: ToolContext) -> TicketId:
            """Block until the test is done (a cancelled run's call hears of it only at
            its next heartbeat, or when the worker shuts down)."""
            started.set()
            await release.wait()
            return TicketId(ticket_id="x")

        agent = Agent(
            id="waiter",
            model=ScriptedModel([tool_call("wait_here", title="x"), "done"]),
            instructions="",
            tools=[wait_here],
        )
        await runtimes.start([AgentRegistration(agent, version="1")])
        run = await client.start_run("waiter", "go")
        await asyncio.wait_for(started.wait(), 30)
        before = await history_length(client, run)

        with pytest.raises(DurableConflictError, match="is running, not needs_attention"):
            await run.resolve_tool("tool:1:call_wait_here", {"type": "rerun"})
        with pytest.raises(DurableConflictError, match="is running; retry\\(\\) applies only"):
            await run.retry()

        assert await history_length(client, run) == before
        await run.cancel()
        release.set()


class TestSafeAndIdempotentTools:
    async def test_an_unexpected_exception_in_a_safe_tool_is_retried(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        journal = Journal()
        journal.fail_until = 2
        await runtimes.start([ticket_agent(journal, recovery="safe")])
        run = await client.start_run("desk", "file it")

        result = await run.result()

        op = await operation_id(client, run, "tool:1:c1")
        assert journal.calls == [(op, 1), (op, 2), (op, 3)]
        assert json.loads(result.output or "") == [
            {"error": False, "content": '{"ticket_id":"T-3"}'}
        ]

    async def test_out_of_attempts_fails_with_the_last_error_and_retry_runs_it_again(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        journal = Journal()
        journal.fail_until = 3
        await runtimes.start([ticket_agent(journal, recovery="idempotent")])
        run = await client.start_run("desk", "file it")

        with pytest.raises(RunFailedError, match="ConnectionResetError: ticket service hung up"):
            await run.result()
        snap = await run.snapshot()
        assert snap.status == RunStatus.FAILED
        assert "ConnectionResetError" in (snap.error or "")

        accepted = await run.retry()
        result = await run.result()

        op = await operation_id(client, run, "tool:1:c1")
        assert accepted.operation == "tool:1:c1"
        assert accepted.previous_status == RunStatus.FAILED
        # Fresh attempts, same operation_id; the failed tries did not count against it.
        assert journal.calls == [(op, 1), (op, 2), (op, 3), (op, 1)]
        assert json.loads(result.output or "") == [
            {"error": False, "content": '{"ticket_id":"T-4"}'}
        ]
        await record_history(client, run.run_id, "failed_then_retried")

    async def test_retry_is_rejected_on_completed_runs(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        await runtimes.start([ticket_agent(Journal(), recovery="safe")])
        done = await client.start_run("desk", "file it")
        await done.result()
        with pytest.raises(DurableConflictError, match="is completed; retry needs an open run"):
            await done.retry()

    async def test_retry_is_rejected_on_cancelled_runs(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        run, journal = await blocked_run(client, runtimes)
        await run.cancel()
        with pytest.raises(RunCancelledError):
            await run.result()
        with pytest.raises(DurableConflictError, match="is cancelled; retry needs an open run"):
            await run.retry()
        assert len(journal.calls) == 1
