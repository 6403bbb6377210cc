"""Agents hosted by the worker processes that the crash tests SIGKILL.

Every tool and model request writes to a journal on disk (the test's
`DURABLY_TEST_JOURNAL`) before doing anything else, so the test can see what
ran, how often, and under which operation_id, across process deaths. The
idempotent tool records its effect in a real deduplicating HTTP service
(`DURABLY_TEST_DEDUP_URL`) keyed by operation_id. `session-clerk` is an agent
for sessions: its model journals every message each request held; `fan-out`
makes three calls in one answer (two manual, one idempotent).
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
from datetime import timedelta

from pydantic import BaseModel
from temporalio import activity

from durably import (
    Agent,
    AgentRegistration,
    FunctionModel,
    ModelRequest,
    TaskRegistration,
    ToolContext,
    ToolRetry,
    tool,
)
from durably.messages import AssistantMessage, ToolCall, ToolResultMessage, UserMessage
from durably.models import last_tool_results

HEARTBEAT = timedelta(seconds=3)
SLOW_HEARTBEAT = timedelta(seconds=14)


class Ticket(BaseModel):
    title: str


class TicketId(BaseModel):
    ticket_id: str


def journal(**entry: object) -> None:
    """Append one line and make it durable before the caller goes on."""
    with open(os.environ["DURABLY_TEST_JOURNAL"], "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")
        f.flush()
        os.fsync(f.fileno())


async def hang_until_killed() -> None:
    """Stand in for a tool whose process dies mid-call: never return."""
    await asyncio.Event().wait()


@tool
async def manual_hang(args: Ticket, ctx: ToolContext) -> TicketId:
    """Start an external action that never reports back."""
    journal(kind="tool", tool="manual_hang", op=ctx.operation_id, attempt=ctx.attempt)
    await hang_until_killed()
    raise AssertionError("unreachable")


@tool
async def safe_hang_once(args: Ticket, ctx: ToolContext) -> TicketId:
    """A read that hangs on its first attempt."""
    journal(kind="tool", tool="safe_hang_once", op=ctx.operation_id, attempt=ctx.attempt)
    if ctx.attempt == 1:
        await hang_until_killed()
    return TicketId(ticket_id=f"read-{ctx.attempt}")


def _record_effect(key: str) -> str:
    request = urllib.request.Request(
        os.environ["DURABLY_TEST_DEDUP_URL"] + "/effects",
        data=json.dumps({"key": key}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(json.loads(response.read())["ticket_id"])


@tool
async def idempotent_effect(args: Ticket, ctx: ToolContext) -> TicketId:
    """Create a ticket in a service that deduplicates by operation_id."""
    journal(kind="tool", tool="idempotent_effect", op=ctx.operation_id, attempt=ctx.attempt)
    ticket_id = await asyncio.to_thread(_record_effect, ctx.operation_id)
    if ctx.attempt == 1:
        await hang_until_killed()  # the effect happened; its result never commits
    return TicketId(ticket_id=ticket_id)


@tool
async def quick(args: Ticket, ctx: ToolContext) -> TicketId:
    """A tool that returns at once."""
    journal(kind="tool", tool="quick", op=ctx.operation_id, attempt=ctx.attempt)
    return TicketId(ticket_id="quick-1")


def _journaled(**match: object) -> int:
    """How many journal entries match (across processes)."""
    with open(os.environ["DURABLY_TEST_JOURNAL"], encoding="utf-8") as f:
        entries = [json.loads(line) for line in f]
    return sum(all(e.get(k) == v for k, v in match.items()) for e in entries)


def scripted(
    agent_id: str, tool_name: str, *, hang_final_once: bool = False, hang_first_final: bool = False
) -> FunctionModel:
    """Call `tool_name` once, then answer with the tool's result (`hang_final_once`: the
    answer's first attempt hangs; `hang_first_final`: the first answer ever journaled
    hangs, whichever activity asks for it)."""

    def model(request: ModelRequest) -> AssistantMessage:
        turn = 1 + sum(isinstance(m, AssistantMessage) for m in request.messages)
        attempt = activity.info().attempt
        journal(kind="model", agent=agent_id, turn=turn, attempt=attempt)
        if turn == 1:
            call = ToolCall(id="c1", name=tool_name, arguments={"title": "vpn down"})
            return AssistantMessage(tool_calls=(call,))
        return AssistantMessage(content=last_tool_results(request)[0].content)

    async def hanging(request: ModelRequest) -> AssistantMessage:
        answer = model(request)
        if hang_final_once and answer.content is not None and activity.info().attempt == 1:
            await hang_until_killed()
        first = _journaled(kind="model", agent=agent_id, turn=2) == 1
        if hang_first_final and answer.content is not None and first:
            await hang_until_killed()
        return answer

    return FunctionModel(hanging, name=f"crash-tests.{agent_id}")


def _agent(
    agent_id: str,
    tool_name: str,
    recovery: str,
    heartbeat_timeout: timedelta = HEARTBEAT,
    **kw: bool,
) -> AgentRegistration:
    tools = {t.name: t for t in (manual_hang, safe_hang_once, idempotent_effect, quick)}
    agent = Agent(
        id=agent_id,
        model=scripted(agent_id, tool_name, **kw),
        instructions="",
        tools=[tools[tool_name]],
    )
    return AgentRegistration(
        agent,
        version="1",
        tool_recovery={tool_name: recovery},  # type: ignore[dict-item]
        tool_retry=ToolRetry(max_attempts=5, initial_delay_ms=100, max_delay_ms=500),
        heartbeat_timeout=heartbeat_timeout,
    )


@tool
async def lookup(args: Ticket, ctx: ToolContext) -> str:
    """Look an order up (order B-8 hangs on its first attempt); journals each effect."""
    journal(kind="tool", tool="lookup", op=ctx.operation_id, attempt=ctx.attempt, order=args.title)
    if args.title == "B-8" and ctx.attempt == 1:
        await hang_until_killed()
    journal(kind="effect", op=ctx.operation_id)
    return f"{args.title} ships tomorrow"


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


def clerk(request: ModelRequest) -> AssistantMessage:
    """A session's agent: looks up "where is ORDER", notes anything else; journals
    what each request held."""
    info = activity.info()
    journal(kind="model", run=info.workflow_id, attempt=info.attempt, said=said(request))
    last = request.messages[-1]
    if isinstance(last, UserMessage) and last.content.startswith("where is "):
        order = last.content.removeprefix("where is ")
        call = ToolCall(id="c1", name="lookup", arguments={"title": order})
        return AssistantMessage(tool_calls=(call,))
    if isinstance(last, ToolResultMessage):
        return AssistantMessage(content=f"It {last.content.split(' ', 1)[1]}.")
    return AssistantMessage(content=f"noted: {last.content}")


def _clerk() -> AgentRegistration:
    agent = Agent(
        id="session-clerk",
        model=FunctionModel(clerk, name="crash-tests.session-clerk"),
        instructions="",
        tools=[lookup],
    )
    return AgentRegistration(
        agent,
        version="1",
        tool_recovery={"lookup": "safe"},
        tool_retry=ToolRetry(max_attempts=5, initial_delay_ms=100, max_delay_ms=500),
        heartbeat_timeout=HEARTBEAT,
    )


def fan_out(request: ModelRequest) -> AssistantMessage:
    """Two manual calls and an idempotent one in one answer, then the results joined."""
    turn = 1 + sum(isinstance(m, AssistantMessage) for m in request.messages)
    journal(kind="model", agent="fan-out", turn=turn, attempt=activity.info().attempt)
    if turn == 1:
        return AssistantMessage(
            tool_calls=(
                ToolCall(id="m1", name="manual_hang", arguments={"title": "refund A"}),
                ToolCall(id="m2", name="manual_hang", arguments={"title": "refund B"}),
                ToolCall(id="i1", name="idempotent_effect", arguments={"title": "ticket"}),
            )
        )
    return AssistantMessage(content=" | ".join(r.content for r in last_tool_results(request)))


def _fan_out() -> AgentRegistration:
    agent = Agent(
        id="fan-out",
        model=FunctionModel(fan_out, name="crash-tests.fan-out"),
        instructions="",
        tools=[manual_hang, idempotent_effect],
    )
    return AgentRegistration(
        agent,
        version="1",
        tool_recovery={"manual_hang": "manual", "idempotent_effect": "idempotent"},
        tool_retry=ToolRetry(max_attempts=5, initial_delay_ms=100, max_delay_ms=500),
        heartbeat_timeout=HEARTBEAT,
    )


def delegate(request: ModelRequest) -> AssistantMessage:
    """Hands the work to the `manual` agent, then answers with what it said."""
    results = last_tool_results(request)
    if results:
        return AssistantMessage(content=f"the manual agent said: {results[0].content}")
    call = ToolCall(id="d", name="manual", arguments={"task": "file it"})
    return AssistantMessage(tool_calls=(call,))


def hand_off(request: ModelRequest) -> AssistantMessage:
    """Journals each request, hands the work to `echoer`, then repeats what it said."""
    results = last_tool_results(request)
    journal(kind="model", agent="hand-off", turn=2 if results else 1)
    if results:
        return AssistantMessage(content=f"echoer said: {results[0].content}")
    return AssistantMessage(
        tool_calls=(ToolCall(id="e", name="echoer", arguments={"task": "say hi"}),)
    )


def _hand_off() -> list[AgentRegistration]:
    echoer = Agent(
        id="echoer",
        model=FunctionModel(lambda r: AssistantMessage(content="hi"), name="crash.echoer"),
        instructions="",
    )
    parent = Agent(
        id="hand-off",
        model=FunctionModel(hand_off, name="crash-tests.hand-off"),
        instructions="",
        subagents=["echoer"],
    )
    return [AgentRegistration(echoer, version="1"), AgentRegistration(parent, version="1")]


def _delegator() -> AgentRegistration:
    agent = Agent(
        id="delegator",
        model=FunctionModel(delegate, name="crash-tests.delegator"),
        instructions="",
        subagents=["manual"],
    )
    return AgentRegistration(agent, version="1", heartbeat_timeout=HEARTBEAT)


registrations = [
    *_hand_off(),
    TaskRegistration(manual_hang, version="1"),  # the task run `manual_hang`
    _delegator(),
    _fan_out(),
    _agent("manual", "manual_hang", "manual"),
    # Its final answer hangs on the first attempt: the run stays open until a worker dies.
    _agent("manual-slow-answer", "manual_hang", "manual", hang_first_final=True),
    # Its call's heartbeat times out after the server stops counting on the dead worker's
    # sticky queue, so the next workflow task goes to the shared queue at once.
    _agent("manual-slow-heartbeat", "manual_hang", "manual", heartbeat_timeout=SLOW_HEARTBEAT),
    _agent("safe", "safe_hang_once", "safe"),
    _agent("idempotent", "idempotent_effect", "idempotent"),
    _agent("commit-window", "quick", "manual", hang_final_once=True),
    _clerk(),
]
