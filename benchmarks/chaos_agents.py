"""Agents for the chaos soak (`benchmarks/chaos.py`), hosted by `durably worker` processes.

Every tool journals what it does to `$CHAOS_JOURNAL_DIR/<pid>.jsonl` (one
file per worker process; each line is written with one `write` and fsynced
before the tool goes on), so the soak can tell, across SIGKILLs, what ran,
how often and under which operation_id:

- `start`: the tool began (operation_id, attempt, pid);
- `effect`: the single point where the effect takes place. For the manual
  tools the journal *is* the external system: the `effect` line is the
  effect, written atomically with its result. So "a `start`, no `effect`,
  and the process that started is dead (or wrote `aborted`)" proves the
  effect did not happen, and the operator may answer `{"type": "rerun"}`;
- `aborted`: the tool saw `abort_signal` before its effect and gave up;
- `down`: a payee check found the payee register down, and fails;
- `done`: the tool returns its result.

The idempotent tool's effect is a ticket in the soak's deduplicating HTTP
service (`$CHAOS_DEDUP_URL`), keyed by operation_id. Tools take 0.2-1.5 s
(durably heartbeats in the background), so kills land mid-call; the heartbeat
timeout is short so interrupted calls are noticed within seconds.

Each agent follows a fixed script of tool-call turns (call ids `t{turn}-{n}`)
and then answers with the JSON of every tool result it saw, keyed by
checkpoint key, which the soak checks against the journal, and of what was
wrong with the transcript it was sent (a call without its result, a result
twice or out of the model's call order).

The `parallel` agent answers several calls at once in each turn (two or three
manual calls beside an idempotent and a safe one, then two calls that need
approval beside a manual one), which durably runs concurrently (at most
`PARALLEL_TOOLS` at a time): a kill then interrupts several manual calls of
one run, which the operator resolves one at a time.

The `delegate` agent owns a subagent, `payout` (never started by the soak
itself: only as a `delegate` run's child). In its first answer `delegate`
calls `payout` (the run's input as the task) beside a manual transfer of its
own, then opens a ticket and answers; its output holds the child's final
output as that call's result. `payout` checks the payee (`verify_payee`,
safe) beside a ticket, then makes a manual transfer beside a refund that
needs approval. When its task holds `FLAKY_PAYEE` (the soak gives it every
other `delegate` run), the payee register is down until the operator fixes
it: `verify_payee` fails for good, so the child fails and parks its parent
(`subagent_failed`), until the operator fixes the register and retries the
child.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import random
import time
import urllib.request
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from durably import (
    Agent,
    AgentRegistration,
    FunctionModel,
    ModelRequest,
    ModelRetry,
    Subagent,
    ToolContext,
    ToolRetry,
    tool,
)
from durably.messages import (
    AssistantMessage,
    Message,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)

HEARTBEAT = timedelta(seconds=3)
# Model requests retry through kills. `chaos.py --no-model-retry` registers none, as
# durably's default: then a crashed model request runs at most 3 times.
MODEL_RETRY = ModelRetry(max_attempts=10, initial_delay_ms=200, max_delay_ms=2000)
VERSION = "1"


def journal(event: str, ctx: ToolContext, tool_name: str, **extra: Any) -> None:
    """Append one line to this process's journal and make it durable first."""
    entry = {
        "ev": event,
        "op": ctx.operation_id,
        "run": ctx.run_id,
        "tool": tool_name,
        "attempt": ctx.attempt,
        "pid": os.getpid(),
        "t": time.time(),
        **extra,
    }
    path = os.path.join(os.environ["CHAOS_JOURNAL_DIR"], f"{os.getpid()}.jsonl")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(entry) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


async def busy(ctx: ToolContext, low: float, high: float) -> None:
    """Work for a while (durably heartbeats meanwhile); returns early on abort."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(ctx.abort_signal.wait(), random.uniform(low, high))


def check_abort(ctx: ToolContext, tool_name: str) -> None:
    """Give up before the effect if durably told the call to stop."""
    if ctx.abort_signal.is_set():
        journal("aborted", ctx, tool_name)
        raise RuntimeError("aborted before the effect")


def ref(prefix: str, operation_id: str) -> str:
    return f"{prefix}-{hashlib.sha256(operation_id.encode()).hexdigest()[:10]}"


# -- tools ---------------------------------------------------------------------------


class Account(BaseModel):
    account: str


class Balance(BaseModel):
    account: str
    balance_cents: int


class Ticket(BaseModel):
    title: str


class TicketId(BaseModel):
    ticket_id: str


class Transfer(BaseModel):
    account: str
    amount_cents: int


class TransferReceipt(BaseModel):
    transfer_id: str


class Refund(BaseModel):
    order: str
    amount_cents: int


class RefundReceipt(BaseModel):
    refund_id: str


class Payee(BaseModel):
    payee: str
    flaky: bool = False


class PayeeStatus(BaseModel):
    payee: str
    verified: bool


@tool
async def lookup_account(args: Account, ctx: ToolContext) -> Balance:
    """Read an account's balance (safe: reading again is harmless)."""
    journal("start", ctx, "lookup_account")
    await busy(ctx, 0.2, 1.5)
    check_abort(ctx, "lookup_account")
    balance = int(hashlib.sha256(args.account.encode()).hexdigest()[:6], 16) % 100_000
    journal("done", ctx, "lookup_account")
    return Balance(account=args.account, balance_cents=balance)


def _post(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST to the soak's service (`$CHAOS_DEDUP_URL`)."""
    request = urllib.request.Request(
        os.environ["CHAOS_DEDUP_URL"] + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


def _post_ticket(operation_id: str, natural_key: str) -> str:
    return str(_post("/tickets", {"key": operation_id, "natural": natural_key})["ticket_id"])


# What a payee check fails with while the register is down.
PAYEE_DOWN = "the payee register is down"


@tool
async def create_ticket(args: Ticket, ctx: ToolContext) -> TicketId:
    """Open a ticket in a service that deduplicates by operation_id (idempotent)."""
    journal("start", ctx, "create_ticket")
    await busy(ctx, 0.1, 0.7)
    check_abort(ctx, "create_ticket")
    ticket_id = await asyncio.to_thread(
        _post_ticket, ctx.operation_id, f"{ctx.run_id}/{args.title}"
    )
    journal("effect", ctx, "create_ticket", result={"ticket_id": ticket_id})
    await busy(ctx, 0.1, 0.7)
    journal("done", ctx, "create_ticket")
    return TicketId(ticket_id=ticket_id)


@tool
async def verify_payee(args: Payee, ctx: ToolContext) -> PayeeStatus:
    """Check a payee in the payee register (safe). A `flaky` check fails, every attempt,
    until the operator marks the run's register fixed in the soak's service."""
    journal("start", ctx, "verify_payee")
    await busy(ctx, 0.1, 0.5)
    check_abort(ctx, "verify_payee")
    if args.flaky:
        answer = await asyncio.to_thread(_post, "/payees", {"run": ctx.run_id})
        if not answer["fixed"]:
            journal("down", ctx, "verify_payee")
            raise RuntimeError(f"{PAYEE_DOWN} (chaos: fix it, then retry the run)")
    journal("done", ctx, "verify_payee")
    return PayeeStatus(payee=args.payee, verified=True)


async def _manual(ctx: ToolContext, tool_name: str, result: BaseModel) -> None:
    """A call that must not repeat: its effect is the journal's `effect` line."""
    journal("start", ctx, tool_name)
    await busy(ctx, 0.15, 1.0)
    check_abort(ctx, tool_name)
    journal("effect", ctx, tool_name, result=result.model_dump(mode="json"))
    # The window where the effect happened but its result has not committed yet.
    await asyncio.sleep(random.uniform(0.05, 0.5))
    journal("done", ctx, tool_name)


@tool
async def transfer_funds(args: Transfer, ctx: ToolContext) -> TransferReceipt:
    """Move money (manual: never repeated without an operator)."""
    receipt = TransferReceipt(transfer_id=ref("X", ctx.operation_id))
    await _manual(ctx, "transfer_funds", receipt)
    return receipt


@tool(requires_approval=True)
async def refund_payment(args: Refund, ctx: ToolContext) -> RefundReceipt:
    """Refund an order (needs a person's approval; manual)."""
    receipt = RefundReceipt(refund_id=ref("R", ctx.operation_id))
    await _manual(ctx, "refund_payment", receipt)
    return receipt


TOOLS = (lookup_account, verify_payee, create_ticket, transfer_funds, refund_payment)
RECOVERY: dict[str, Any] = {
    "lookup_account": "safe",
    "verify_payee": "safe",
    "create_ticket": "idempotent",
    "transfer_funds": "manual",
    "refund_payment": "manual",
}
MANUAL_TOOLS = frozenset(n for n, p in RECOVERY.items() if p == "manual")
SAFE_TOOLS = frozenset(n for n, p in RECOVERY.items() if p == "safe")

# -- agents ----------------------------------------------------------------------------

# A call's arguments, or how the model makes them from the run's input (its task).
Arguments = dict[str, Any] | Callable[[str], dict[str, Any]]
Turn = list[tuple[str, Arguments]]

# In a `payout` task: the payee register is down until the operator fixes it.
FLAKY_PAYEE = "[payee register down]"

SCRIPTS: dict[str, list[Turn]] = {
    "lookup-ticket": [
        [("lookup_account", {"account": "acct-7"})],
        [("create_ticket", {"title": "balance question"})],
    ],
    "transfer": [
        [("lookup_account", {"account": "acct-3"})],
        [("transfer_funds", {"account": "acct-3", "amount_cents": 1200})],
    ],
    "refund": [
        [("refund_payment", {"order": "A-1001", "amount_cents": 1500})],
        [("create_ticket", {"title": "refund follow-up"})],
    ],
    "mixed": [
        [
            ("lookup_account", {"account": "acct-9"}),
            ("create_ticket", {"title": "mixed request"}),
        ],
        [("transfer_funds", {"account": "acct-9", "amount_cents": 300})],
        [("refund_payment", {"order": "B-2002", "amount_cents": 700})],
    ],
    # Several calls per model answer, run at once (the parallel-tools patch).
    "parallel": [
        [
            ("transfer_funds", {"account": "acct-21", "amount_cents": 500}),
            ("create_ticket", {"title": "parallel batch"}),
            ("transfer_funds", {"account": "acct-22", "amount_cents": 800}),
            ("lookup_account", {"account": "acct-23"}),
        ],
        [
            ("refund_payment", {"order": "C-3003", "amount_cents": 900}),
            ("transfer_funds", {"account": "acct-21", "amount_cents": 250}),
            ("refund_payment", {"order": "C-3004", "amount_cents": 400}),
        ],
    ],
    # Delegates to its subagent (a child run) beside a manual call of its own.
    "delegate": [
        [
            ("payout", lambda task: {"task": f"pay acct-42 out; {task}"}),
            ("transfer_funds", {"account": "acct-41", "amount_cents": 600}),
        ],
        [("create_ticket", {"title": "delegation follow-up"})],
    ],
    # `delegate`'s subagent: runs only as a child.
    "payout": [
        [
            ("verify_payee", lambda task: {"payee": "acct-42", "flaky": FLAKY_PAYEE in task}),
            ("create_ticket", {"title": "payout"}),
        ],
        [
            ("transfer_funds", {"account": "acct-42", "amount_cents": 1100}),
            ("refund_payment", {"order": "D-4004", "amount_cents": 300}),
        ],
    ],
}
# Each agent's subagents (agent ids, each also the name of its tool).
SUBAGENTS: dict[str, tuple[str, ...]] = {"delegate": ("payout",)}
CHILD_AGENTS = frozenset(a for children in SUBAGENTS.values() for a in children)
# The agents the soak starts runs of, in rotation.
AGENT_IDS = tuple(a for a in SCRIPTS if a not in CHILD_AGENTS)
# How many calls of one model answer run at once (fewer than the `parallel` agent's
# first turn holds, so a call also waits for a slot); None elsewhere: all of them.
PARALLEL_TOOLS = 3


def final_answer(request: ModelRequest) -> dict[str, Any]:
    """Every tool result of the run, keyed by checkpoint key (`tool:{turn}:{call_id}`),
    and what is wrong with the transcript (`transcript_problems`)."""
    turn_of: dict[str, int] = {}
    turn = 0
    results: dict[str, dict[str, Any]] = {}
    for message in request.messages:
        if isinstance(message, AssistantMessage):
            turn += 1
            for call in message.tool_calls:
                turn_of[call.call_id] = turn
        elif isinstance(message, ToolResultMessage):
            key = f"tool:{turn_of.get(message.call_id, 0)}:{message.call_id}"
            results[key] = {"content": message.content, "error": message.is_error}
    return {"results": results, "problems": transcript_problems(request.messages)}


def transcript_problems(messages: Sequence[Message]) -> list[str]:
    """Each model answer's calls must be followed by exactly their results, one each, in
    the model's call order (durably holds a call's result until the earlier ones have
    theirs), before anything else."""
    problems: list[str] = []
    due: list[str] = []  # the calls of the latest answer still without a result
    for n, message in enumerate(messages):
        if isinstance(message, ToolResultMessage):
            if not due:
                problems.append(f"message {n}: result of {message.call_id}, no call was due")
            elif message.call_id != due[0]:
                problems.append(f"message {n}: result of {message.call_id}, {due[0]} was due")
                if message.call_id in due:
                    due.remove(message.call_id)
            else:
                due.pop(0)
            continue
        if due:
            problems.append(f"message {n}: calls {due} have no result")
        due = (
            [c.call_id for c in message.tool_calls] if isinstance(message, AssistantMessage) else []
        )
    if due:
        problems.append(f"the end: calls {due} have no result")
    return problems


def scripted(agent_id: str) -> FunctionModel:
    script = SCRIPTS[agent_id]

    async def model(request: ModelRequest) -> AssistantMessage:
        await asyncio.sleep(random.uniform(0.02, 0.2))
        turn = 1 + sum(isinstance(m, AssistantMessage) for m in request.messages)
        task = next((m.content for m in request.messages if isinstance(m, UserMessage)), "")
        if turn <= len(script):
            calls = tuple(
                ToolCall(
                    id=f"t{turn}-{n}",
                    name=name,
                    arguments=arguments(task) if callable(arguments) else arguments,
                )
                for n, (name, arguments) in enumerate(script[turn - 1], start=1)
            )
            return AssistantMessage(tool_calls=calls)
        return AssistantMessage(content=json.dumps(final_answer(request), sort_keys=True))

    return FunctionModel(model, name=f"chaos.{agent_id}")


def _registration(agent_id: str) -> AgentRegistration:
    used = {name for turn in SCRIPTS[agent_id] for name, _ in turn} & set(RECOVERY)
    agent = Agent(
        id=agent_id,
        model=scripted(agent_id),
        instructions="Chaos soak agent: follow the script.",
        tools=[t for t in TOOLS if t.name in used],
        subagents=[
            Subagent(child, description=f"Hand a task to the {child} agent.")
            for child in SUBAGENTS.get(agent_id, ())
        ],
        max_turns=len(SCRIPTS[agent_id]) + 1,
        max_parallel_tools=PARALLEL_TOOLS if agent_id == "parallel" else None,
    )
    # A payee check that fails for good (`FLAKY_PAYEE`) runs out of attempts in about
    # 3 s; ten attempts still ride through kills (a killed attempt is one of them).
    short = agent_id in CHILD_AGENTS
    return AgentRegistration(
        agent,
        version=VERSION,
        tool_recovery={name: RECOVERY[name] for name in used},
        model_retry=None if os.environ.get("CHAOS_NO_MODEL_RETRY") else MODEL_RETRY,
        tool_retry=ToolRetry(
            max_attempts=10,
            initial_delay_ms=100 if short else 200,
            max_delay_ms=400 if short else 2000,
        ),
        heartbeat_timeout=HEARTBEAT,
    )


registrations = [_registration(agent_id) for agent_id in SCRIPTS]
