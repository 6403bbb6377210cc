"""Custom tasks (SPEC section 16): plain durable code with a run's guarantees."""

from __future__ import annotations

import asyncio
import json
import sys

from pydantic import BaseModel

from durably import (
    BudgetExceeded,
    DurableClient,
    RunStatus,
    TaskRegistration,
    ToolContext,
    task,
)

from .conftest import Runtimes, cli, operation_id, wait_for_status


class Refund(BaseModel):
    order: str
    cents: int


class Receipt(BaseModel):
    refund_id: str
    operation_id: str


class Ledger:
    def __init__(self) -> None:
        self.refunds: list[tuple[str, str]] = []

    def registrations(self) -> list:  # type: ignore[type-arg]
        ledger = self

        @task
        async def refund_order(args: Refund, ctx: ToolContext) -> Receipt:
            """Refund an order (an effect: idempotent by the operation id)."""
            ledger.refunds.append((args.order, ctx.operation_id))
            return Receipt(refund_id=f"R-{args.order}", operation_id=ctx.operation_id)

        @task(requires_approval=True)
        async def wipe_account(args: Refund, ctx: ToolContext) -> str:
            """Close an account (a person approves first)."""
            ledger.refunds.append((f"wipe {args.order}", ctx.operation_id))
            return "wiped"

        return [
            TaskRegistration(refund_order, version="1", recovery="idempotent"),
            TaskRegistration(wipe_account, version="1"),
        ]


async def test_a_task_runs_as_a_run_of_its_own(client: DurableClient, runtimes: Runtimes) -> None:
    ledger = Ledger()
    await runtimes.start(ledger.registrations())
    run = await client.start_task("refund_order", Refund(order="A", cents=500))

    result = await asyncio.wait_for(run.result(), 30)

    op = await operation_id(client, run, "tool:1:task")
    assert json.loads(result.output or "") == {"refund_id": "R-A", "operation_id": op}
    assert ledger.refunds == [("A", op)]
    assert result.usage.requests == 0  # no model was asked
    kinds = [e.type for e in (await run.snapshot()).events]
    assert kinds.count("tool_completed") == 1


async def test_a_task_started_with_limits_parks_on_them_until_raised(
    client: DurableClient, runtimes: Runtimes
) -> None:
    ledger = Ledger()
    await runtimes.start(ledger.registrations())
    run = await client.start_task(
        "refund_order", Refund(order="B", cents=1), limits={"tool_calls": 0}
    )
    parked = await wait_for_status(run, RunStatus.NEEDS_ATTENTION)
    assert isinstance(parked.attention, BudgetExceeded) and ledger.refunds == []
    await run.raise_limits({"tool_calls": 1})
    await asyncio.wait_for(run.result(), 30)
    assert [order for order, _ in ledger.refunds] == ["B"]


async def test_an_approval_gated_task_waits_and_runs_once_approved(
    client: DurableClient, runtimes: Runtimes
) -> None:
    ledger = Ledger()
    await runtimes.start(ledger.registrations())
    target = client.temporal.service_client.config.target_host
    started = await cli(
        sys.executable, "-m", "durably", "start", "wipe_account", '{"order": "B", "cents": 1}',
        "--task", "--target", target, "--task-queue", client.task_queue,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.split("Started run ", 1)[1].split()[0]
    run = await client.get_run(run_id)
    snap = await wait_for_status(run, RunStatus.WAITING)
    assert snap.interaction is not None and snap.interaction.args == {"order": "B", "cents": 1}
    assert ledger.refunds == []

    await run.approve(snap.interaction, responder="alice")
    result = await asyncio.wait_for(run.result(), 30)
    assert result.output == "wiped"
    assert [r for r, _ in ledger.refunds] == ["wipe B"]


async def test_a_task_input_that_does_not_fit_is_said_to_the_run(
    client: DurableClient, runtimes: Runtimes
) -> None:
    ledger = Ledger()
    await runtimes.start(ledger.registrations())
    run = await client.start_task("refund_order", {"order": "A"})  # no cents

    result = await asyncio.wait_for(run.result(), 30)
    assert (result.output or "").startswith("error: invalid arguments for 'refund_order'")
    assert ledger.refunds == []


async def test_an_agent_owns_a_task_as_a_child_run_with_its_typed_argument(
    client: DurableClient, runtimes: Runtimes
) -> None:
    from durably import Agent, AgentRegistration, FunctionModel, ModelRequest
    from durably.messages import AssistantMessage, ToolCall
    from durably.models import last_tool_results

    ledger = Ledger()
    registrations = ledger.registrations()
    refund_task = registrations[0].agent.tools[0]

    def clerk(request: ModelRequest) -> AssistantMessage:
        results = last_tool_results(request)
        if results:
            return AssistantMessage(content=f"refund made: {results[0].content}")
        call = ToolCall(id="t", name="refund_order", arguments={"order": "C", "cents": 9})
        return AssistantMessage(tool_calls=(call,))

    owner = Agent(
        id="clerk", model=FunctionModel(clerk, name="tasks.clerk"), instructions="",
        tasks=[refund_task],
    )  # fmt: skip
    await runtimes.start([*registrations, AgentRegistration(owner, version="1")])
    parent = await client.start_run("clerk", "refund order C")

    result = await asyncio.wait_for(parent.result(), 30)
    [(order, op)] = ledger.refunds
    assert order == "C" and op.startswith(f"{parent.run_id}/")  # the child run, named by the call
    assert result.output is not None and '"refund_id":"R-C"' in result.output
