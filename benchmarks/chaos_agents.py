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

The idempotent tools' effect is a ticket in the soak's deduplicating HTTP
service (`$CHAOS_DEDUP_URL`), keyed by operation_id. Tools take 0.2-1.5 s
(durably heartbeats in the background), so kills land mid-call; the tools'
heartbeat timeout is short so interrupted calls are noticed within seconds.

Each agent follows a fixed script of tool-call turns (call ids `t{turn}-{n}`;
`m{k}t{turn}-{n}` in a session's k-th submission, k > 1, so no two calls of
a conversation share an id) and then answers with the JSON of every tool
result its run saw, keyed by checkpoint key, which the soak checks against
the journal, of what was wrong with the transcript it was sent (a call
without its result, a result twice or out of the model's call order) and of
the earlier submissions it read (in a session: every earlier user message,
in order, and each earlier run's answer).

The agent kinds (`KINDS`, the soak's rotation):

- `lookup-ticket`, `transfer`, `refund`, `mixed`: single runs mixing safe,
  idempotent and manual tools and a manual tool that needs approval.
- `parallel` answers several calls at once in each turn (two or three manual
  calls beside an idempotent and a safe one, then two calls that need
  approval beside a manual one), which durably runs concurrently (at most
  `PARALLEL_TOOLS` at a time): a kill then interrupts several manual calls
  of one run, which the operator resolves one at a time.
- `delegate` owns a subagent, `payout` (never started by the soak itself:
  only as a `delegate` run's child). In its first answer `delegate` calls
  `payout` (the run's input as the task) beside a manual transfer of its
  own, then opens a ticket and answers; its output holds the child's final
  output as that call's result. `payout` checks the payee (`verify_payee`,
  safe) beside a ticket, then makes a manual transfer beside a refund that
  needs approval. When its task holds `FLAKY_PAYEE` (the soak gives it every
  other `delegate` run), the payee register is down until the operator fixes
  it: `verify_payee` fails for good, so the child fails and parks its parent
  (`subagent_failed`), until the operator fixes the register and retries the
  child.
- `session`: a conversation with `concierge` (`SESSION_SUBMISSIONS`
  submissions, each a run of a lookup beside a manual transfer, then a
  ticket); each run must have read every earlier message of the session.
- `metered`: runs registered with `limits=UsageLimits(tool_calls=1)`: each
  parks `budget_exceeded` before its second and third tool call, until the
  operator raises the limit (`raise_limits`).
- `settle_invoice`: a custom task (`TaskRegistration`) started on its own
  (`client.start_task`): manual, and it needs approval.
- `clerk` owns the task `issue_credit` (idempotent: a ticket) as a child run,
  called beside a manual transfer of its own.
- `archivist` calls an MCP server's tools (an `MCPToolset` over streamable
  HTTP: `tests/mcp_test_server.py`, which the soak starts; `mcp_record`,
  idempotent and applied once per operation id, then `mcp_lookup`,
  read-only) beside a lookup of its own. The server's log is that tool's
  journal. The toolset exists only where the soak says where the server and
  its lock are (`$CHAOS_MCP_URL`, `$CHAOS_MCP_LOCK`), so `registrations` is a
  function, called by each worker (and by `durably mcp lock`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import os
import random
import time
import urllib.request
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from durably import (
    Agent,
    AgentRegistration,
    FunctionModel,
    ModelRequest,
    ModelRetry,
    Subagent,
    TaskRegistration,
    ToolContext,
    ToolRetry,
    UsageLimits,
    task,
    tool,
)
from durably.messages import (
    AssistantMessage,
    Message,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)

if TYPE_CHECKING:
    from durably.mcp import MCPToolset

# How long durably waits for a heartbeat before it takes the worker for dead: the tools'
# (so an interrupted call is noticed within seconds) and the model requests' (the
# registration's, which MCP tools and a task's bookkeeping requests get too). A worker
# that just started, taking over a killed one's runs (each a full replay, its first
# workflow task loading the sandbox), can send no heartbeat for seconds on a loaded
# machine: beside a CPU hog (`soak_repeat.py`), model requests timed out on live workers
# at 3 s and still at 10 s (one attempt on a worker started 10 s before sent none in
# 10 s), three attempts in a row (durably's default without `model_retry`), failing
# their run. A tool timed out on a live worker costs nothing but time (a manual call
# parks, the operator resolves it from the journal; the others retry), a model request
# a run: so the tools keep a short timeout, the model requests a long one.
TOOL_HEARTBEAT = timedelta(seconds=5)
HEARTBEAT = timedelta(seconds=30)
# Model requests retry through kills. `chaos.py --no-model-retry` registers none, as
# durably's default: then a crashed model request runs at most 3 times.
MODEL_RETRY = ModelRetry(max_attempts=10, initial_delay_ms=200, max_delay_ms=2000)
# Safe and idempotent calls ride through kills (a killed attempt is one of them).
TOOL_RETRY = ToolRetry(max_attempts=10, initial_delay_ms=200, max_delay_ms=2000)
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


class Invoice(BaseModel):
    invoice: str
    amount_cents: int


class Settlement(BaseModel):
    settlement_id: str


class Credit(BaseModel):
    customer: str
    amount_cents: int


@tool(heartbeat_timeout=TOOL_HEARTBEAT)
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


async def _ticket(ctx: ToolContext, tool_name: str, title: str) -> TicketId:
    """Open a ticket keyed by the call's operation_id: the service opens it once."""
    journal("start", ctx, tool_name)
    await busy(ctx, 0.1, 0.7)
    check_abort(ctx, tool_name)
    ticket_id = await asyncio.to_thread(_post_ticket, ctx.operation_id, f"{ctx.run_id}/{title}")
    journal("effect", ctx, tool_name, result={"ticket_id": ticket_id})
    await busy(ctx, 0.1, 0.7)
    journal("done", ctx, tool_name)
    return TicketId(ticket_id=ticket_id)


# What a payee check fails with while the register is down.
PAYEE_DOWN = "the payee register is down"


@tool(heartbeat_timeout=TOOL_HEARTBEAT)
async def create_ticket(args: Ticket, ctx: ToolContext) -> TicketId:
    """Open a ticket in a service that deduplicates by operation_id (idempotent)."""
    return await _ticket(ctx, "create_ticket", args.title)


@tool(heartbeat_timeout=TOOL_HEARTBEAT)
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


@tool(heartbeat_timeout=TOOL_HEARTBEAT)
async def transfer_funds(args: Transfer, ctx: ToolContext) -> TransferReceipt:
    """Move money (manual: never repeated without an operator)."""
    receipt = TransferReceipt(transfer_id=ref("X", ctx.operation_id))
    await _manual(ctx, "transfer_funds", receipt)
    return receipt


@tool(requires_approval=True, heartbeat_timeout=TOOL_HEARTBEAT)
async def refund_payment(args: Refund, ctx: ToolContext) -> RefundReceipt:
    """Refund an order (needs a person's approval; manual)."""
    receipt = RefundReceipt(refund_id=ref("R", ctx.operation_id))
    await _manual(ctx, "refund_payment", receipt)
    return receipt


# Custom tasks carry their heartbeat timeout like the tools (a task registration has
# none of its own; its bookkeeping model requests get the registration's).
@task(requires_approval=True, heartbeat_timeout=TOOL_HEARTBEAT)
async def settle_invoice(args: Invoice, ctx: ToolContext) -> Settlement:
    """Settle an invoice (a task run of its own: manual, and a person approves it first)."""
    receipt = Settlement(settlement_id=ref("S", ctx.operation_id))
    await _manual(ctx, "settle_invoice", receipt)
    return receipt


@task(heartbeat_timeout=TOOL_HEARTBEAT)
async def issue_credit(args: Credit, ctx: ToolContext) -> TicketId:
    """Issue a credit note, as a ticket keyed by operation_id (idempotent; run as `clerk`'s
    child)."""
    return await _ticket(ctx, "issue_credit", f"credit {args.customer}")


TOOLS = (lookup_account, verify_payee, create_ticket, transfer_funds, refund_payment)
RECOVERY: dict[str, Any] = {
    "lookup_account": "safe",
    "verify_payee": "safe",
    "create_ticket": "idempotent",
    "transfer_funds": "manual",
    "refund_payment": "manual",
}
# The custom tasks and their recovery policies (each is also an agent id: its runs').
TASKS = {"settle_invoice": settle_invoice, "issue_credit": issue_credit}
TASK_RECOVERY: dict[str, Any] = {"settle_invoice": "manual", "issue_credit": "idempotent"}
MANUAL_TOOLS = frozenset(n for n, p in {**RECOVERY, **TASK_RECOVERY}.items() if p == "manual")
SAFE_TOOLS = frozenset(n for n, p in RECOVERY.items() if p == "safe")
# The tools whose effect is a ticket in the soak's service.
TICKET_TOOLS = frozenset({"create_ticket", "issue_credit"})
# The checkpoint key of a task run's one call (`durably.tasks.TASK_CALL_ID`).
TASK_KEY = "tool:1:task"

# The MCP server's tools, as the `archivist` agent sees them (the toolset's prefix).
MCP_PREFIX = "mcp_"
MCP_RECORD = f"{MCP_PREFIX}record"
MCP_LOOKUP = f"{MCP_PREFIX}lookup"
MCP_TOOLS = frozenset({MCP_RECORD, MCP_LOOKUP})


def records_toolset(url: str, lock: str | Path) -> MCPToolset:
    """`tests/mcp_test_server.py` over streamable HTTP, as the soak starts it: `record`
    (idempotent, applied once per operation id) and `lookup` (read-only), trusted for
    their annotations."""
    from durably.mcp import HTTPServer, MCPToolset

    return MCPToolset(
        "records",
        HTTPServer(url),
        lock=lock,
        trust_annotations=True,
        prefix=MCP_PREFIX,
        include=["record", "lookup"],
    )


# -- agents ----------------------------------------------------------------------------

# A call's arguments, or how the model makes them from the run's input (its task).
Arguments = dict[str, Any] | Callable[[str], dict[str, Any]]
Turn = list[tuple[str, Arguments]]

# In a `payout` task: the payee register is down until the operator fixes it.
FLAKY_PAYEE = "[payee register down]"


def run_key(task_text: str) -> str:
    """What an `archivist` run records under: the last word of its input (its run id)."""
    return task_text.split()[-1] if task_text.split() else "?"


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
    # Every submission of a session: a lookup beside a manual transfer, then a ticket.
    "concierge": [
        [
            ("lookup_account", {"account": "acct-61"}),
            ("transfer_funds", {"account": "acct-61", "amount_cents": 150}),
        ],
        [("create_ticket", {"title": "session follow-up"})],
    ],
    # Registered with one tool call allowed: parks before each later call.
    "metered": [
        [("lookup_account", {"account": "acct-71"})],
        [("transfer_funds", {"account": "acct-71", "amount_cents": 450})],
        [("create_ticket", {"title": "metered follow-up"})],
    ],
    # Owns the task `issue_credit` (a child run) beside a manual call of its own.
    "clerk": [
        [
            ("issue_credit", lambda task: {"customer": run_key(task), "amount_cents": 250}),
            ("transfer_funds", {"account": "acct-81", "amount_cents": 350}),
        ],
        [("lookup_account", {"account": "acct-81"})],
    ],
    # The MCP server's idempotent write beside a lookup of ours, then its read-back.
    "archivist": [
        [
            (MCP_RECORD, lambda task: {"key": run_key(task), "value": f"v-{run_key(task)}"}),
            ("lookup_account", {"account": "acct-91"}),
        ],
        [(MCP_LOOKUP, lambda task: {"key": run_key(task)})],
    ],
}
# Each agent's children (agent ids, each also the name of its tool): subagents and tasks.
SUBAGENTS: dict[str, tuple[str, ...]] = {"delegate": ("payout",)}
OWNED_TASKS: dict[str, tuple[str, ...]] = {"clerk": ("issue_credit",)}
CHILDREN: dict[str, tuple[str, ...]] = {**SUBAGENTS, **OWNED_TASKS}
CHILD_AGENTS = frozenset(a for children in CHILDREN.values() for a in children)
# The agent a session talks to, how many submissions each session makes, and the limit
# `metered` runs are registered with (raised by the operator, up to its cap).
SESSION_AGENT = "concierge"
SESSION_SUBMISSIONS = 3
METERED = "metered"
METERED_LIMITS = UsageLimits(tool_calls=1)
METERED_CAP = UsageLimits(tool_calls=20)
# The kinds of work the soak starts, in rotation: an agent's single run, a session (of
# `SESSION_SUBMISSIONS` runs), or a task run started with `start_task`. Sessions come
# first in each round: they take longest (their runs go one after another).
KINDS = (
    "session",
    "lookup-ticket",
    "transfer",
    "refund",
    "mixed",
    "parallel",
    "delegate",
    METERED,
    "settle_invoice",
    "clerk",
    "archivist",
)
# The agents a single run of a kind is started for (sessions: `SESSION_AGENT`).
AGENT_IDS = tuple(k for k in KINDS if k in SCRIPTS or k in TASKS)
# How many calls of one model answer run at once (fewer than the `parallel` agent's
# first turn holds, so a call also waits for a slot); None elsewhere: all of them.
PARALLEL_TOOLS = 3


def call_id(submission: int, turn: int, n: int) -> str:
    """The id of the n-th call of a turn, unique in a session's conversation."""
    return f"t{turn}-{n}" if submission <= 1 else f"m{submission}t{turn}-{n}"


def final_answer(request: ModelRequest) -> dict[str, Any]:
    """Every tool result of this run, keyed by checkpoint key (`tool:{turn}:{call_id}`),
    what is wrong with the whole transcript (`problems`), and what the run read of the
    session's earlier submissions (`earlier`: their user messages, in order;
    `earlier_answers`: how many final answers they left)."""
    last_user = max(
        (n for n, m in enumerate(request.messages) if isinstance(m, UserMessage)), default=-1
    )
    before, own = request.messages[: max(last_user, 0)], request.messages[last_user + 1 :]
    turn_of: dict[str, int] = {}
    turn = 0
    results: dict[str, dict[str, Any]] = {}
    for message in own:
        if isinstance(message, AssistantMessage):
            turn += 1
            for call in message.tool_calls:
                turn_of[call.call_id] = turn
        elif isinstance(message, ToolResultMessage):
            key = f"tool:{turn_of.get(message.call_id, 0)}:{message.call_id}"
            results[key] = {"content": message.content, "error": message.is_error}
    return {
        "results": results,
        "problems": transcript_problems(request.messages),
        "earlier": [str(m.content) for m in before if isinstance(m, UserMessage)],
        "earlier_answers": sum(
            1 for m in before if isinstance(m, AssistantMessage) and not m.tool_calls
        ),
    }


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
    """The agent's script, played from the request alone: the turn is the number of
    answers since the run's own user message (the last one; a session's earlier
    submissions come before it), the task is that message."""
    script = SCRIPTS[agent_id]

    async def model(request: ModelRequest) -> AssistantMessage:
        await asyncio.sleep(random.uniform(0.02, 0.2))
        users = [m for m in request.messages if isinstance(m, UserMessage)]
        last_user = max(
            (n for n, m in enumerate(request.messages) if isinstance(m, UserMessage)), default=-1
        )
        own = request.messages[last_user + 1 :]
        turn = 1 + sum(isinstance(m, AssistantMessage) for m in own)
        task_text = str(users[-1].content) if users else ""
        if turn <= len(script):
            calls = tuple(
                ToolCall(
                    id=call_id(len(users), turn, n),
                    name=name,
                    arguments=arguments(task_text) if callable(arguments) else arguments,
                )
                for n, (name, arguments) in enumerate(script[turn - 1], start=1)
            )
            return AssistantMessage(tool_calls=calls)
        return AssistantMessage(content=json.dumps(final_answer(request), sort_keys=True))

    return FunctionModel(model, name=f"chaos.{agent_id}")


def _registration(agent_id: str, mcp_tools: Sequence[Any] = ()) -> AgentRegistration:
    used = {name for turn in SCRIPTS[agent_id] for name, _ in turn}
    agent = Agent(
        id=agent_id,
        model=scripted(agent_id),
        instructions="Chaos soak agent: follow the script.",
        tools=[
            *(t for t in TOOLS if t.name in used),
            *(t for t in mcp_tools if t.name in used),
        ],
        subagents=[
            Subagent(child, description=f"Hand a task to the {child} agent.")
            for child in SUBAGENTS.get(agent_id, ())
        ],
        tasks=[TASKS[name] for name in OWNED_TASKS.get(agent_id, ())],
        max_turns=len(SCRIPTS[agent_id]) + 1,
        max_parallel_tools=PARALLEL_TOOLS if agent_id == "parallel" else None,
    )
    # A payee check that fails for good (`FLAKY_PAYEE`) runs out of attempts in about
    # 3 s; ten attempts still ride through kills (a killed attempt is one of them).
    short = agent_id in CHILD_AGENTS
    metered = agent_id == METERED
    return AgentRegistration(
        agent,
        version=VERSION,
        tool_recovery={name: RECOVERY[name] for name in used if name in RECOVERY},
        model_retry=None if os.environ.get("CHAOS_NO_MODEL_RETRY") else MODEL_RETRY,
        tool_retry=ToolRetry(max_attempts=10, initial_delay_ms=100, max_delay_ms=400)
        if short
        else TOOL_RETRY,
        heartbeat_timeout=HEARTBEAT,
        limits=METERED_LIMITS if metered else None,
        limit_cap=METERED_CAP if metered else None,
    )


def _task_registration(name: str) -> AgentRegistration:
    """A task's registration, with the soak's heartbeat timeout (for its bookkeeping model
    requests; the task's call has its own) and model retries."""
    registration = TaskRegistration(
        TASKS[name], version=VERSION, recovery=TASK_RECOVERY[name], retry=TOOL_RETRY
    )
    return dataclasses.replace(
        registration,
        heartbeat_timeout=HEARTBEAT,
        model_retry=None if os.environ.get("CHAOS_NO_MODEL_RETRY") else MODEL_RETRY,
    )


def registrations() -> list[AgentRegistration]:
    """Every agent and task the soak's workers host (`--agents chaos_agents:registrations`).

    The MCP toolset is built here, not at import: its server and lock file exist only
    while a soak runs (`$CHAOS_MCP_URL`, `$CHAOS_MCP_LOCK`). Without them the
    `archivist` agent is left out (the soak always sets them)."""
    url, lock = os.environ.get("CHAOS_MCP_URL"), os.environ.get("CHAOS_MCP_LOCK")
    mcp_tools = records_toolset(url, lock).tools if url and lock else ()
    agents = [a for a in SCRIPTS if a != "archivist" or (url and lock)]
    return [
        *(_registration(agent_id, mcp_tools) for agent_id in agents),
        *(_task_registration(name) for name in TASKS),
    ]
