"""Several tool calls in one model answer (SPEC section 14): they run at once, their
results reach the model in call order, and their approvals are pending together."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import pytest
from pydantic import BaseModel

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    FunctionModel,
    InteractionConflictError,
    InvalidResponseError,
    ModelRequest,
    RunSnapshot,
    RunStatus,
    ToolContext,
    ToolRetry,
    tool,
)
from durably.contract import Handler
from durably.messages import AssistantMessage, ToolCall, ToolResultMessage
from durably.models import last_tool_results

from .conftest import (
    Runtimes,
    binary,
    chain_histories,
    cli,
    echo,
    eventually,
    failed_tasks,
    history_length,
    record_history,
    wait_for_status,
)


class Order(BaseModel):
    order: str


def calls(name: str, *orders: str) -> AssistantMessage:
    """One model answer calling `name` once per order (call ids c1, c2, ...)."""
    return AssistantMessage(
        tool_calls=tuple(
            ToolCall(id=f"c{n}", name=name, arguments={"order": o})
            for n, o in enumerate(orders, start=1)
        )
    )


class Lookups:
    """Three reads; with `reverse`, lookup N finishes only after lookup N+1 has: the
    calls finish in reverse order, and only if they run at once."""

    def __init__(self, *, reverse: bool) -> None:
        self.reverse = reverse
        self.done = {n: asyncio.Event() for n in (1, 2, 3)}
        self.finished: list[int] = []
        self.running = 0
        self.peak = 0
        self.seen: list[list[ToolResultMessage]] = []

    def registration(self, max_parallel_tools: int | None = None) -> AgentRegistration:
        lookups = self

        @tool
        async def lookup(args: Order, ctx: ToolContext) -> str:
            """Look an order up."""
            n = int(args.order)
            lookups.running += 1
            lookups.peak = max(lookups.peak, lookups.running)
            try:
                if lookups.reverse and n < 3:
                    await lookups.done[n + 1].wait()
                else:
                    await asyncio.sleep(0)
            finally:
                lookups.running -= 1
            lookups.finished.append(n)
            lookups.done[n].set()
            return f"order {n} ships"

        def model(request: ModelRequest) -> AssistantMessage:
            if not last_tool_results(request):
                return calls("lookup", "1", "2", "3")
            lookups.seen.append(last_tool_results(request))
            return AssistantMessage(content="done")

        agent = Agent(
            id="looker",
            model=FunctionModel(model, name="parallel-tests.looker"),
            instructions="",
            tools=[lookup],
            max_parallel_tools=max_parallel_tools,
        )
        return AgentRegistration(agent, version="1", tool_recovery={"lookup": "safe"})


class TestConcurrentCalls:
    async def test_calls_run_at_once_and_reach_the_model_in_call_order(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """Each lookup waits for the next one to finish: they finish 3, 2, 1 (run one
        after another they would never finish), and the model reads them 1, 2, 3."""
        lookups = Lookups(reverse=True)
        await runtimes.start([lookups.registration()])
        run = await client.start_run("looker", "where are my orders")

        result = await asyncio.wait_for(run.result(), 30)

        assert result.output == "done"
        assert lookups.finished == [3, 2, 1]
        assert lookups.peak == 3
        [seen] = lookups.seen
        assert [(r.call_id, r.content) for r in seen] == [
            ("c1", "order 1 ships"),
            ("c2", "order 2 ships"),
            ("c3", "order 3 ships"),
        ]
        await record_history(client, run.run_id, "three_calls_finish_in_reverse")

    async def test_max_parallel_tools_runs_that_many_at_a_time(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        lookups = Lookups(reverse=False)
        await runtimes.start([lookups.registration(max_parallel_tools=1)])
        run = await client.start_run("looker", "where are my orders")

        assert (await asyncio.wait_for(run.result(), 30)).output == "done"
        assert lookups.peak == 1
        assert lookups.finished == [1, 2, 3]


class Refunds:
    """Refunds that need approval; `ship` needs approval with no timeout, `refund` may
    have one. Each effect is recorded once it happens."""

    def __init__(self) -> None:
        self.made: list[str] = []
        self.release = asyncio.Event()  # cleared: approved refunds stay in flight
        self.release.set()

    def registration(
        self, answer: AssistantMessage, *, refund_timeout: timedelta | None = None
    ) -> AgentRegistration:
        refunds = self

        @tool(requires_approval=True, approval_timeout=refund_timeout)
        async def refund(args: Order, ctx: ToolContext) -> str:
            """Refund an order."""
            await refunds.release.wait()
            refunds.made.append(args.order)
            return f"refunded {args.order}"

        @tool(requires_approval=True)
        async def ship(args: Order, ctx: ToolContext) -> str:
            """Ship an order again."""
            refunds.made.append(f"ship {args.order}")
            return f"shipped {args.order}"

        def model(request: ModelRequest) -> AssistantMessage:
            return echo(request) if last_tool_results(request) else answer

        agent = Agent(
            id="refunder",
            model=FunctionModel(model, name="parallel-tests.refunder"),
            instructions="",
            tools=[refund, ship],
        )
        return AgentRegistration(
            agent, version="1", tool_recovery={"refund": "idempotent", "ship": "idempotent"}
        )


async def pending_ids(run_snapshot: RunSnapshot) -> list[str]:
    return [i.id for i in run_snapshot.interactions]


async def waiting_on(run: object, count: int) -> RunSnapshot:
    from durably import RunHandle

    assert isinstance(run, RunHandle)
    snap: RunSnapshot | None = None

    async def all_pending() -> bool:
        nonlocal snap
        snap = await run.snapshot()
        return len(snap.interactions) == count

    await eventually(all_pending)
    assert snap is not None
    return snap


APPROVE = {"type": "tool-approval", "approved": True}


class TestApprovingTogether:
    async def test_respond_many_is_one_acceptance_repeats_harmlessly_and_conflicts_whole(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        refunds = Refunds()
        refunds.release.clear()  # the run stays open while the batch is repeated
        await runtimes.start([refunds.registration(calls("refund", "A", "B", "C"))])
        run = await client.start_run("refunder", "refund three orders")
        snap = await waiting_on(run, 3)
        assert snap.status == RunStatus.WAITING
        assert await pending_ids(snap) == ["approval:1:c1", "approval:1:c2", "approval:1:c3"]
        assert snap.interaction is not None and snap.interaction.id == "approval:1:c1"
        current = snap.current or ""  # the Web UI's current details: every pending call
        assert all(f"(`approval:1:c{n}`)" in current for n in (1, 2, 3)), current
        assert "durably approve` `refunder" in current and "--all --as" in current
        a, b, c = snap.interactions
        before = await history_length(client, run)

        # One bad entry (arguments the person did not see) refuses the batch whole.
        with pytest.raises(InvalidResponseError, match=r"response 3 of 3: .*args_digest"):
            await run.respond_many(
                {
                    a.id: {**APPROVE, "args_digest": a.args_digest},
                    b.id: {**APPROVE, "args_digest": b.args_digest},
                    c.id: {**APPROVE, "args_digest": a.args_digest},
                },
                responder="alice",
            )
        assert await history_length(client, run) == before
        assert len((await run.snapshot()).interactions) == 3

        batch = {
            a.id: {**APPROVE, "args_digest": a.args_digest},
            b.id: {**APPROVE, "args_digest": b.args_digest},
            c.id: {"type": "tool-approval", "approved": False, "reason": "too much"},
        }
        accepted = await run.respond_many(batch, responder="alice")
        assert [(x.interaction_id, x.approved) for x in accepted] == [
            (a.id, True),
            (b.id, True),
            (c.id, False),
        ]
        after = await history_length(client, run)
        assert await run.respond_many(batch, responder="alice") == accepted  # harmless
        with pytest.raises(InteractionConflictError, match="already answered"):
            await run.respond_many({a.id: {"type": "tool-approval", "approved": False}})
        assert await history_length(client, run) == after
        refunds.release.set()
        result = await asyncio.wait_for(run.result(), 30)

        assert sorted(refunds.made) == ["A", "B"]
        assert json.loads(result.output or "") == [
            {"error": False, "content": "refunded A"},
            {"error": False, "content": "refunded B"},
            {"error": True, "content": "denied: too much"},
        ]
        history = await client.temporal.get_workflow_handle(run.run_id).fetch_history()
        updates = [
            e
            for e in history.events
            if e.HasField("workflow_execution_update_accepted_event_attributes")
        ]
        assert len(updates) == 1  # the batch, once
        await record_history(client, run.run_id, "respond_many_two_approved_one_denied")

    async def test_one_by_temporal_signal_the_rest_by_update_a_bad_list_one_rejection(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        refunds = Refunds()
        await runtimes.start([refunds.registration(calls("refund", "A", "B", "C"))])
        run = await client.start_run("refunder", "refund three orders")
        a, b, c = (await waiting_on(run, 3)).interactions
        target = client.temporal.service_client.config.target_host

        # A list with one unknown interaction: nothing of it is accepted, one event says why.
        bad = [
            {"interaction_id": a.id, "response": APPROVE, "responder": "eve"},
            {"interaction_id": "approval:9:zz", "response": APPROVE, "responder": "eve"},
        ]
        await client.temporal.get_workflow_handle(run.run_id).signal(Handler.RESPOND_SIGNAL, bad)

        async def rejected() -> bool:
            events = (await run.snapshot()).events
            return any(e.type == "response_rejected" for e in events)

        await eventually(rejected)
        snap = await run.snapshot()
        [rejection] = [e for e in snap.events if e.type == "response_rejected"]
        assert "response 2 of 2" in (rejection.detail or "")
        assert "approval:9:zz" in (rejection.detail or "")
        assert len(snap.interactions) == 3 and refunds.made == []

        signal = {
            "interaction_id": a.id,
            "response": {**APPROVE, "args_digest": a.args_digest},
            "responder": "alice",
        }
        sent = await cli(
            binary("temporal"), "workflow", "signal", "--address", target,
            "--workflow-id", run.run_id, "--name", Handler.RESPOND_SIGNAL.value,
            "--input", json.dumps(signal),
        )  # fmt: skip
        assert sent.returncode == 0, sent.stderr
        await run.approve_all([b, c], responder="bob")
        result = await asyncio.wait_for(run.result(), 30)

        assert sorted(refunds.made) == ["A", "B", "C"]
        assert [r["error"] for r in json.loads(result.output or "")] == [False, False, False]
        decided = [
            (e.type, e.operation) for e in (await run.snapshot()).events if e.type == "approved"
        ]
        assert decided == [("approved", a.id), ("approved", b.id), ("approved", c.id)]

    async def test_an_approval_times_out_while_another_of_its_turn_still_waits(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        refunds = Refunds()
        answer = AssistantMessage(
            tool_calls=(
                ToolCall(id="r", name="refund", arguments={"order": "A"}),
                ToolCall(id="s", name="ship", arguments={"order": "B"}),
            )
        )
        registration = refunds.registration(answer, refund_timeout=timedelta(seconds=1))
        await runtimes.start([registration])
        run = await client.start_run("refunder", "refund A and ship B")
        await waiting_on(run, 2)

        async def refund_timed_out() -> bool:
            snap = await run.snapshot()
            return [i.id for i in snap.interactions] == ["approval:1:s"]

        await eventually(refund_timed_out)
        snap = await run.snapshot()
        assert snap.status == RunStatus.WAITING
        assert [e.operation for e in snap.events if e.type == "timed_out"] == ["approval:1:r"]
        await run.approve(snap.interactions[0], responder="alice")
        result = await asyncio.wait_for(run.result(), 30)

        assert refunds.made == ["ship B"]
        assert json.loads(result.output or "") == [
            {"error": True, "content": "denied: approval timed out"},
            {"error": False, "content": "shipped B"},
        ]
        await record_history(client, run.run_id, "approval_timeout_beside_a_pending_approval")


class TestMixedOutcomes:
    async def test_status_follows_needs_attention_then_failed_then_waiting(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """One turn: a manual call that is interrupted, a safe call that fails for good,
        and a call waiting for approval. The run shows each, by precedence."""
        flaky = {"broken": True}

        @tool
        async def charge(args: Order, ctx: ToolContext) -> str:
            """Charge a card (manual: never repeated)."""
            raise RuntimeError("card network timed out")

        @tool
        async def read(args: Order, ctx: ToolContext) -> str:
            """Read an order (safe)."""
            if flaky["broken"]:
                raise RuntimeError("database down")
            return f"order {args.order}"

        @tool(requires_approval=True)
        async def notify(args: Order, ctx: ToolContext) -> str:
            """Tell the customer."""
            return "sent"

        answer = AssistantMessage(
            tool_calls=(
                ToolCall(id="n", name="notify", arguments={"order": "A"}),
                ToolCall(id="r", name="read", arguments={"order": "A"}),
                ToolCall(id="c", name="charge", arguments={"order": "A"}),
            )
        )
        agent = Agent(
            id="mixed",
            model=FunctionModel(
                lambda r: echo(r) if last_tool_results(r) else answer, name="parallel-tests.mixed"
            ),
            instructions="",
            tools=[charge, read, notify],
        )
        registration = AgentRegistration(
            agent,
            version="1",
            tool_recovery={"charge": "manual", "read": "safe", "notify": "idempotent"},
            tool_retry=ToolRetry(max_attempts=2, initial_delay_ms=10, max_delay_ms=10),
        )
        await runtimes.start([registration])
        run = await client.start_run("mixed", "charge and tell")

        async def all_parked() -> bool:
            snap = await run.snapshot()
            return bool(snap.blocked_operations and snap.failed_operations)

        await eventually(all_parked)
        snap = await run.snapshot()
        assert snap.status == RunStatus.NEEDS_ATTENTION
        assert snap.blocked_operations == ["tool:1:c"] == [snap.blocked_operation]
        assert snap.failed_operations == ["tool:1:r"]
        assert "database down" in (snap.error or "")
        assert [i.id for i in snap.interactions] == ["approval:1:n"]
        current = snap.current or ""
        for shown in ("durably resolve", "durably retry", "Waiting for approval"):
            assert shown in current

        await run.resolve_tool("tool:1:c", {"type": "error", "message": "not charged"})
        snap = await wait_for_status(run, RunStatus.FAILED)
        assert snap.blocked_operations == [] and snap.failed_operations == ["tool:1:r"]

        flaky["broken"] = False
        retried = await run.retry()
        assert retried.operation == "tool:1:r"
        snap = await wait_for_status(run, RunStatus.WAITING)
        assert snap.failed_operations == [] and len(snap.interactions) == 1

        await run.approve(snap.interactions[0], responder="alice")
        result = await asyncio.wait_for(run.result(), 30)
        assert json.loads(result.output or "") == [
            {"error": False, "content": "sent"},
            {"error": False, "content": "order A"},
            {"error": True, "content": "not charged"},
        ]
        await record_history(client, run.run_id, "mixed_outcomes_by_precedence")


class TestContinuingAsNewMidTurn:
    async def test_a_turn_waiting_on_two_approvals_with_a_result_held_continues_as_new(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """Junk signals fill the history while two approvals wait and a later call's result
        waits for them: the next run of the chain waits on the same two, keeps the held
        result, runs nothing twice, and the model reads the three in call order."""
        ran: list[str] = []

        @tool(requires_approval=True)
        async def refund(args: Order, ctx: ToolContext) -> str:
            """Refund an order."""
            ran.append(ctx.operation_id)
            return f"refunded {args.order}"

        @tool
        async def lookup(args: Order, ctx: ToolContext) -> str:
            """Look an order up."""
            ran.append(ctx.operation_id)
            return f"order {args.order} ships"

        answer = AssistantMessage(
            tool_calls=(
                ToolCall(id="a", name="refund", arguments={"order": "A"}),
                ToolCall(id="b", name="refund", arguments={"order": "B"}),
                ToolCall(id="c", name="lookup", arguments={"order": "C"}),
            )
        )
        agent = Agent(
            id="midturn",
            model=FunctionModel(
                lambda r: echo(r) if last_tool_results(r) else answer,
                name="parallel-tests.midturn",
            ),
            instructions="",
            tools=[refund, lookup],
        )
        registration = AgentRegistration(
            agent,
            version="1",
            tool_recovery={"refund": "idempotent", "lookup": "safe"},
            continue_as_new_events=60,
        )
        await runtimes.start([registration])
        run = await client.start_run("midturn", "refund two, look one up")
        before = await waiting_on(run, 2)

        async def lookup_done() -> bool:
            events = (await run.snapshot()).events
            return any(e.type == "tool_completed" for e in events)

        await eventually(lookup_done)
        handle = client.temporal.get_workflow_handle(run.run_id)
        for i in range(70):  # each different, so none coalesces
            await handle.signal(Handler.RESPOND_SIGNAL, {"interaction_id": f"junk-{i}"})

        async def continued() -> bool:
            return len(await chain_histories(client, run.run_id)) >= 2

        await eventually(continued)
        after = await waiting_on(run, 2)
        assert [i.id for i in after.interactions] == [i.id for i in before.interactions]
        assert [i.args for i in after.interactions] == [{"order": "A"}, {"order": "B"}]
        await run.approve_all(after.interactions, responder="alice")
        result = await asyncio.wait_for(run.result(), 30)

        assert json.loads(result.output or "") == [
            {"error": False, "content": "refunded A"},
            {"error": False, "content": "refunded B"},
            {"error": False, "content": "order C ships"},
        ]
        assert len(ran) == 3 and len(set(ran)) == 3  # each call ran once
        histories = await chain_histories(client, run.run_id)
        assert failed_tasks(histories) == []
        await record_history(client, run.run_id, "continued_as_new_mid_turn", histories[0].run_id)
        await record_history(client, run.run_id, "completed_after_continuing_mid_turn")
