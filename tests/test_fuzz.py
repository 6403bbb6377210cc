"""Fuzzing what people and models send a run, with hypothesis, on the real dev server.

Each property parks one run (waiting on an approval, blocked on a manual
tool, ...) and throws generated input at it: an invalid input must be refused
with an error that says what was wrong, leave the run's history and state as
they were, and never fail a workflow task. Malformed model outputs get a short
run each. After every property the parked runs must still finish, so no input
left a run stuck. The tests at the end pin, one by one, the failures the
fuzzing found.

Hypothesis runs in a worker thread while the test's event loop keeps serving
the Temporal worker; each example is a coroutine submitted to that loop (see
`check`). Parked runs are shared by all the examples of a property, so a
property whose failure can damage its run does not shrink (a shrunk replay
would run against the damaged run).

Inputs stay under 1 MB of JSON: Temporal echoes a rejected update's request in
the rejection, so rejecting a request of nearly 2 MB (the payload limit) fails
the workflow task whatever the handler does; that limit is Temporal's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy
from pydantic import BaseModel, Field, TypeAdapter, ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus, WorkflowUpdateFailedError
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    DurableConflictError,
    FunctionModel,
    Interaction,
    InteractionConflictError,
    InvalidResponseError,
    ModelRequest,
    RunHandle,
    RunSnapshot,
    RunStatus,
    ScriptedModel,
    ToolContext,
    ToolRetry,
    question_tool,
    tool,
)
from durably.contract import (
    MAX_ANSWER_BYTES,
    MAX_NAME_CHARS,
    MAX_REASON_CHARS,
    MAX_TOKEN_CHARS,
    ApprovalResponse,
    ErrorResolution,
    JsonResolution,
    Resolution,
    ResolveToolRequest,
    RespondRequest,
    Response,
    RunEvent,
)
from durably.messages import AssistantMessage, ToolCall, UserMessage
from durably.models import last_tool_results, tool_call

from .conftest import (
    Runtimes,
    chain_histories,
    eventually,
    failed_tasks,
    record_history,
    wait_for_interaction,
    wait_for_status,
)

# A rejection message is read by a person and travels in update outcomes and
# run events: it says what was wrong without echoing a huge input back.
MAX_MESSAGE = 4_000
DURABLY_REJECTIONS = ("InvalidResponseError", "InteractionConflictError", "DurableConflictError")
EXAMPLE_TIMEOUT = 60.0


# -- agents -----------------------------------------------------------------------


class Refund(BaseModel):
    order: str
    amount: int


class Receipt(BaseModel):
    refund_id: str


class TicketRequest(BaseModel):
    title: str


class Filed(BaseModel):
    ticket_id: str
    priority: int = Field(ge=1, le=5)
    tags: list[str] = Field(default_factory=list)


class Lookup(BaseModel):
    order: str = Field(min_length=1)
    qty: int = Field(ge=1, le=100)


class Tag(BaseModel):
    labels: list[str]


class Found(BaseModel):
    order_length: int
    qty: int


# What the fuzzed tools really did, by run id: the external system's record.
EXECUTED: dict[str, list[tuple[str, Any]]] = {}


@tool(requires_approval=True)
async def refund(args: Refund, ctx: ToolContext) -> Receipt:
    """Refund an order."""
    EXECUTED.setdefault(ctx.run_id, []).append(("refund", args.order))
    return Receipt(refund_id=f"R-{args.order}")


@tool
async def file_ticket(args: TicketRequest, ctx: ToolContext) -> Filed:
    """File a ticket; the ticket service always hangs up mid-request."""
    EXECUTED.setdefault(ctx.run_id, []).append(("file_ticket", args.title))
    raise ConnectionResetError("ticket service hung up mid-request")


@tool
async def hold(args: TicketRequest, ctx: ToolContext) -> Receipt:
    """Keep running until the run is cancelled."""
    EXECUTED.setdefault(ctx.run_id, []).append(("hold", args.title))
    await ctx.abort_signal.wait()
    return Receipt(refund_id="never")


@tool
async def lookup(args: Lookup, ctx: ToolContext) -> Found:
    """Look an order up."""
    EXECUTED.setdefault(ctx.run_id, []).append(("lookup", args.model_dump()))
    return Found(order_length=len(args.order), qty=args.qty)


@tool
async def tag(args: Tag, ctx: ToolContext) -> dict[str, int]:
    """Tag the conversation."""
    EXECUTED.setdefault(ctx.run_id, []).append(("tag", args.model_dump()))
    return {"tagged": len(args.labels)}


ask = question_tool(name="ask_user", description="Ask the customer.")


def echo(request: ModelRequest) -> AssistantMessage:
    """Final answer: the tool results the model saw, as JSON (long contents cut short)."""
    return AssistantMessage(
        content=json.dumps(
            [
                {"call_id": r.call_id[:100], "error": r.is_error, "content": _cut(r.content)}
                for r in last_tool_results(request)
            ]
        )
    )


def _compact(value: Any) -> str:
    """A JSON tool result as the model reads it."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _cut(content: str) -> str:
    return content if len(content) <= 1_000 else f"{content[:300]}... ({len(content)} chars)"


# The first answer of a `planned` run, by the run's input text.
PLANS: dict[str, tuple[ToolCall, ...]] = {}


def planned(request: ModelRequest) -> AssistantMessage:
    """Turn 1: the calls hypothesis drew for this run's input; turn 2: what came back."""
    if any(isinstance(m, AssistantMessage) for m in request.messages):
        return echo(request)
    first = request.messages[0]
    assert isinstance(first, UserMessage)
    return AssistantMessage(content="calling tools", tool_calls=PLANS[first.content])


# Model requests that wait for the test: (entered, gate) by the run's input text.
GATES: dict[str, tuple[asyncio.Event, asyncio.Event]] = {}


async def gated(request: ModelRequest) -> AssistantMessage:
    """Turn 1 waits until the test opens the gate, then calls `hold`."""
    if any(isinstance(m, AssistantMessage) for m in request.messages):
        return AssistantMessage(content="done")
    first = request.messages[0]
    assert isinstance(first, UserMessage)
    entered, gate = GATES[first.content]
    entered.set()
    await gate.wait()
    return AssistantMessage(tool_calls=(ToolCall(id="h", name="hold", arguments={"title": "x"}),))


def _agent(agent_id: str, model: Any, tools: list[Any], heartbeat: float = 10) -> AgentRegistration:
    return AgentRegistration(
        Agent(id=agent_id, model=model, instructions="", tools=tools),
        version="1",
        tool_retry=ToolRetry(max_attempts=1, initial_delay_ms=10, max_delay_ms=10),
        heartbeat_timeout=timedelta(seconds=heartbeat),
    )


TWO_REFUNDS = AssistantMessage(
    tool_calls=(
        ToolCall(id="a", name="refund", arguments={"order": "A1", "amount": 30}),
        ToolCall(id="b", name="refund", arguments={"order": "B2", "amount": 900}),
    )
)
REGISTRATIONS = [
    _agent("approver", ScriptedModel([TWO_REFUNDS, echo]), [refund]),
    _agent("asker", ScriptedModel([tool_call("ask_user", question="Which order?"), echo]), [ask]),
    _agent(
        "blocked",
        ScriptedModel([tool_call("file_ticket", call_id="c1", title="vpn"), echo]),
        [file_ticket],
    ),
    _agent("holder", ScriptedModel([tool_call("hold", title="x"), "done"]), [hold]),
    _agent("finisher", ScriptedModel(["all done"]), []),
    _agent("planned", FunctionModel(planned, name="fuzz-planned"), [lookup, tag]),
    # A long heartbeat timeout spaces heartbeats out (the SDK throttles them to 80% of
    # it), so the gated model answers before a heartbeat could report a cancellation.
    _agent("gated", FunctionModel(gated, name="fuzz-gated"), [hold], heartbeat=60),
    _agent("planned_approval", FunctionModel(planned, name="fuzz-planned"), [refund]),
    # Continues as new after 4 MiB of history, so payloads near Temporal's limits
    # make it continue as new while it waits.
    AgentRegistration(
        Agent(
            id="flooded", model=ScriptedModel([TWO_REFUNDS, echo]), instructions="", tools=[refund]
        ),
        version="1",
        continue_as_new_bytes=4 * 2**20,
    ),
]

APPROVE = {"type": "tool-approval", "approved": True}
BLOCKED_OP = "tool:1:c1"
FILED_SCHEMA = Filed.model_json_schema()


# -- strategies -------------------------------------------------------------------

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
JSON: SearchStrategy[Any] = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
JSON_OBJECT = st.dictionaries(st.text(max_size=10), JSON, max_size=5)


class Huge(str):
    """A long string that hypothesis and pytest show in a few characters."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Huge({self[:3]!r} * {len(self) // max(len(self[:3]), 1)})"


def huge(unit: str, size: int = 100_000) -> Huge:
    return Huge(unit * (size // len(unit)))


# ~100 KB of one character: plain, accented, astral, invisible, control.
HUGE = st.sampled_from(["x", "é", "🦆", "\u200b", "\x00", "a\nb"]).map(huge)
TEXT = st.text(max_size=30) | HUGE
HUGE_X = huge("x")


def interaction_ids(known: Sequence[str]) -> SearchStrategy[str]:
    near = [
        mutation
        for k in known
        for mutation in (k.upper(), f" {k}", f"{k} ", k[:-1], k + "x", k.replace(":", "/"))
    ]
    return st.sampled_from(list(known)) | st.sampled_from(near) | TEXT


def response_like() -> SearchStrategy[dict[str, Any]]:
    """Mostly near misses of a response: right keys, wrong values; plus random objects."""
    near = st.fixed_dictionaries(
        {},
        optional={
            "type": st.sampled_from(["tool-approval", "question", "approval", "Question", ""])
            | TEXT,
            "approved": JSON | st.sampled_from([True, False, "maybe", "on", "1", 1, 0, "true"]),
            "reason": JSON | TEXT,
            "answer": JSON | TEXT,
            "args_digest": st.none() | TEXT | st.just("0" * 32),
        },
    )
    return near | JSON_OBJECT


def resolution_like() -> SearchStrategy[dict[str, Any]]:
    filed_like = st.fixed_dictionaries(
        {},
        optional={"ticket_id": JSON | TEXT, "priority": JSON, "tags": JSON},
    )
    near = st.fixed_dictionaries(
        {},
        optional={
            "type": st.sampled_from(["json", "error", "rerun", "JSON", "value", ""]) | TEXT,
            "value": JSON | filed_like | TEXT,
            "message": JSON | TEXT | st.just(""),
        },
    )
    return near | JSON_OBJECT


def payload_args(request_like: SearchStrategy[Any]) -> SearchStrategy[tuple[Any, ...]]:
    """Arguments of a raw signal/update: one payload of any shape, none, two, or bytes."""
    return st.one_of(
        st.tuples(request_like),
        st.tuples(JSON),
        st.just(()),
        st.tuples(request_like, JSON),
        st.tuples(st.binary(max_size=16)),
    )


def respond_request_like(ids: Sequence[str]) -> SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {},
        optional={
            "interaction_id": interaction_ids(ids) | JSON,
            "response": response_like() | JSON,
            "responder": st.none() | TEXT | JSON,
        },
    )


def resolve_request_like() -> SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {},
        optional={
            "operation": st.sampled_from([BLOCKED_OP, "tool:1:c2", "model:1"]) | TEXT | JSON,
            "resolution": resolution_like() | JSON,
        },
    )


def too_big(*values: Any) -> bool:
    """Whether the values come near Temporal's 2 MB payload limit (as JSON).

    A rejected update echoes its request back to the server: a request of nearly 2 MB
    fails the workflow task whatever durably does (see the module docstring), so the
    properties stay below 1 MB and leave that to Temporal.
    """
    return len(json.dumps(values, default=repr)) > 1_000_000


# -- oracles: what the run may accept ------------------------------------------------

_RESPONSE: TypeAdapter[Any] = TypeAdapter(Response)
_RESOLUTION: TypeAdapter[Any] = TypeAdapter(Resolution)


class Pending(BaseModel):
    """What a parked run waits for, and what it already accepted."""

    kinds: dict[str, str]  # interaction id -> tool-approval | question
    digests: dict[str, str]
    answered: dict[str, tuple[Any, ...]] = {}  # id -> (approved, reason, answer)


def accepts_response(p: Pending, iid: str, response: Any, responder: Any = None) -> bool:
    """Whether durably's rules accept `response` for `iid` (a repeat counts as accepted):
    the right shape with strict types, and bounded text (SPEC section 20)."""
    if iid not in p.kinds or not plain_name(responder):
        return False
    try:
        r = _RESPONSE.validate_python(response, strict=True)
    except ValidationError:
        return False
    if r.type != p.kinds[iid]:
        return False
    if isinstance(r, ApprovalResponse):
        if r.args_digest not in (None, p.digests[iid]):
            return False
        if r.reason is not None and len(r.reason) > MAX_REASON_CHARS:
            return False
        if r.token is not None and len(r.token) > MAX_TOKEN_CHARS:
            return False
        decision: tuple[Any, ...] = (r.approved, r.reason, None)
    else:
        if len(r.answer.encode("utf-8", "surrogatepass")) > MAX_ANSWER_BYTES:
            return False
        decision = (None, None, r.answer)
    return iid not in p.answered or p.answered[iid] == decision


def plain_name(value: Any) -> bool:
    """A responder or identity durably records: absent, or a short name without controls."""
    if value is None:
        return True
    return (
        isinstance(value, str)
        and len(value) <= MAX_NAME_CHARS
        and not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in value)
    )


def accepts_resolution(operation: Any, resolution: Any) -> bool:
    if operation != BLOCKED_OP:
        return False
    try:
        r = _RESOLUTION.validate_python(resolution)
    except ValidationError:
        return False
    if isinstance(r, ErrorResolution):
        return len(r.message) <= MAX_REASON_CHARS
    if isinstance(r, JsonResolution):
        size = len(json.dumps(r.value, ensure_ascii=False).encode("utf-8", "surrogatepass"))
        return size <= MAX_ANSWER_BYTES and jsonschema.Draft202012Validator(FILED_SCHEMA).is_valid(
            r.value
        )
    return True


def accepts_raw(update: str, p: Pending, args: tuple[Any, ...]) -> bool:
    if len(args) != 1 or not isinstance(args[0], dict):
        return False
    try:
        if update == "respond":
            req = RespondRequest.model_validate(args[0])
            return plain_name(req.identity) and accepts_response(
                p, req.interaction_id, req.response, req.responder
            )
        res = ResolveToolRequest.model_validate(args[0])
    except ValidationError:
        return False
    return accepts_resolution(res.operation, res.resolution)


# -- harness --------------------------------------------------------------------------


async def check(
    prop: Callable[..., Awaitable[None]],
    *strategies: SearchStrategy[Any],
    max_examples: int,
    shrink: bool = True,
    examples: Sequence[tuple[Any, ...]] = (),
) -> None:
    """Check the async property `prop` over hypothesis examples, on this event loop."""
    loop = asyncio.get_running_loop()

    def body(args: tuple[Any, ...]) -> None:
        future = asyncio.run_coroutine_threadsafe(prop(*args), loop)
        try:
            future.result(EXAMPLE_TIMEOUT)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise AssertionError(f"the example did not finish within {EXAMPLE_TIMEOUT} s") from None

    test: Any = given(st.tuples(*strategies))(body)
    for ex in examples:
        test = example(ex)(test)
    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if shrink else [])
    test = settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        phases=phases,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.filter_too_much,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
    )(test)
    await asyncio.to_thread(test)


class Bench:
    """Starts the fuzzed runs, inspects their history, and ends whatever is left open."""

    def __init__(self, client: DurableClient) -> None:
        self.client = client
        self.started: list[RunHandle] = []

    async def start(self, agent_id: str, text: str = "go") -> RunHandle:
        run = await self.client.start_run(agent_id, text)
        self.started.append(run)
        return run

    def raw(self, run: RunHandle) -> Any:
        return self.client.temporal.get_workflow_handle(run.run_id)

    async def failed_tasks(self, run: RunHandle) -> list[str]:
        """Why each failed workflow task of the run failed (none, for a healthy run)."""
        history = await self.raw(run).fetch_history()
        return [
            e.workflow_task_failed_event_attributes.failure.message
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
        ]

    async def assert_no_failed_task(self, run: RunHandle) -> None:
        failed = await self.failed_tasks(run)
        assert not failed, f"run {run.run_id} failed a workflow task: {failed[0][:500]}"

    async def waiting_on(self, run: RunHandle, interaction_id: str) -> RunSnapshot:
        return await wait_for_interaction(run, interaction_id)

    async def running_tool(self, run: RunHandle, name: str) -> None:
        async with asyncio.timeout(30):
            while True:
                if f"Running tool `{name}`" in ((await run.snapshot()).current or ""):
                    return
                await asyncio.sleep(0.05)

    async def length(self, run: RunHandle) -> int:
        """Every event in the run's history so far, bookkeeping included."""
        return len((await self.raw(run).fetch_history()).events)

    async def recorded_since(self, run: RunHandle, length: int) -> list[str]:
        """What the run recorded after its first `length` history events.

        Workflow-task bookkeeping is left out: now and then the server keeps the
        speculative workflow task of a rejected update as three task events (no
        command, no update event), which is the server's doing, not the run's.
        """
        history = await self.raw(run).fetch_history()
        return [
            EventType.Name(e.event_type)
            for e in history.events[length:]
            if e.event_type not in _TASK_BOOKKEEPING
        ]

    async def event(self, run: RunHandle, event_type: EventType.ValueType) -> None:
        """Wait until the run's history holds an event of `event_type`."""
        async with asyncio.timeout(30):
            while True:
                history = await self.raw(run).fetch_history()
                if any(e.event_type == event_type for e in history.events):
                    return
                await asyncio.sleep(0.02)

    async def settled(self, run: RunHandle, within: float = 10) -> None:
        """Wait until the run has no workflow task in flight; fail if one failed."""
        async with asyncio.timeout(within):
            while True:
                history = await self.raw(run).fetch_history()
                failed = [
                    e.workflow_task_failed_event_attributes.failure.message
                    for e in history.events
                    if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
                ]
                assert not failed, f"run {run.run_id} failed a workflow task: {failed[0][:500]}"
                tasks = [e.event_type for e in history.events if e.event_type in _TASK_EVENTS]
                # A run just continued as new may not have its first task recorded yet.
                if tasks and tasks[-1] in _SETTLED:
                    return
                await asyncio.sleep(0.02)

    async def completed(self, run: RunHandle, within: float = 30) -> None:
        """Wait for the run to complete, failing at once if a workflow task fails."""
        async with asyncio.timeout(within):
            while True:
                await self.assert_no_failed_task(run)
                if (await self.raw(run).describe()).status == WorkflowExecutionStatus.COMPLETED:
                    return
                await asyncio.sleep(0.1)

    async def close(self) -> None:
        for run in self.started:
            with contextlib.suppress(Exception):
                await self.raw(run).terminate(reason="fuzz test cleanup")


@pytest.fixture
async def bench(client: DurableClient, runtimes: Runtimes) -> AsyncIterator[Bench]:
    await runtimes.start(REGISTRATIONS)
    b = Bench(client)
    yield b
    await b.close()


_TASK_BOOKKEEPING = {
    EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
    EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
    EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
}
_TASK_EVENTS = {
    *_TASK_BOOKKEEPING,
    EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED,
    EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
}
# The last of those in a run that has no workflow task in flight.
_SETTLED = {
    EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
}


def _last_seq(snap: RunSnapshot) -> int:
    return snap.events[-1].seq if snap.events else 0


def _recorded(before: RunSnapshot, after: RunSnapshot) -> list[RunEvent]:
    """The events recorded between two snapshots; a rejection that repeats the last one
    exactly is counted on it (`count`) instead of recorded again."""
    new = [e for e in after.events if e.seq > _last_seq(before)]
    if not new and before.events and after.events[-1].seq == before.events[-1].seq:
        again = after.events[-1].count - before.events[-1].count
        return [after.events[-1]] * again
    return new


def _interaction(snap: RunSnapshot) -> Interaction:
    assert snap.interaction is not None, snap
    return snap.interaction


def _failure_text(err: BaseException) -> str:
    parts = []
    cause: BaseException | None = err
    while cause is not None:
        parts.append(str(cause))
        cause = cause.__cause__
    return " <- ".join(parts)


async def parked_approval(bench: Bench) -> tuple[RunHandle, Pending]:
    """A run waiting on approval:1:b, whose approval:1:a was already approved."""
    run = await bench.start("approver")
    first = _interaction(await bench.waiting_on(run, "approval:1:a"))
    await run.respond("approval:1:a", APPROVE, responder="fixture")
    second = _interaction(await bench.waiting_on(run, "approval:1:b"))

    # The approved call runs meanwhile: wait for its result, after which the run changes
    # nothing by itself while it waits.
    async def approved_call_done() -> bool:
        return any(e.type == "tool_completed" for e in (await run.snapshot()).events)

    await eventually(approved_call_done)
    return run, Pending(
        kinds={"approval:1:a": "tool-approval", "approval:1:b": "tool-approval"},
        digests={"approval:1:a": first.args_digest, "approval:1:b": second.args_digest},
        answered={"approval:1:a": (True, None, None)},
    )


async def parked_question(bench: Bench) -> tuple[RunHandle, Pending]:
    run = await bench.start("asker")
    snap = await bench.waiting_on(run, "question:1:call_ask_user")
    iid = _interaction(snap).id
    return run, Pending(kinds={iid: "question"}, digests={iid: _interaction(snap).args_digest})


async def parked_blocked(bench: Bench) -> RunHandle:
    run = await bench.start("blocked")
    snap = await wait_for_status(run, RunStatus.NEEDS_ATTENTION)
    assert snap.blocked_operation == BLOCKED_OP
    return run


async def finish_approval_run(bench: Bench, run: RunHandle) -> None:
    """The parked approval run still answers and completes: nothing left it stuck."""
    await run.respond("approval:1:b", {"type": "tool-approval", "approved": False}, responder="t")
    result = await asyncio.wait_for(run.result(), 30)
    seen = json.loads(result.output or "")
    assert [r["error"] for r in seen] == [False, True]
    assert EXECUTED[run.run_id] == [("refund", "A1")]
    await bench.assert_no_failed_task(run)


# -- 1. respond ---------------------------------------------------------------------


async def test_respond_rejects_every_invalid_response_and_changes_nothing(bench: Bench) -> None:
    """Any response that is not valid for the interaction raises a durably error saying
    what was wrong (the interaction id, or what to respond with), history stays as it was
    and the run keeps waiting on the same interaction."""
    approval, approval_pending = await parked_approval(bench)
    question, question_pending = await parked_question(bench)
    parked = {"approval": (approval, approval_pending), "question": (question, question_pending)}
    ids = [*approval_pending.kinds, *question_pending.kinds]

    async def prop(target: str, iid: str, response: dict[str, Any], responder: str | None) -> None:
        run, pending = parked[target]
        if accepts_response(pending, iid, response, responder) or too_big(iid, response, responder):
            return  # valid (accepting it is right, and would move the parked run on)
        before_len = await bench.length(run)
        before = await run.snapshot()
        with pytest.raises((InvalidResponseError, InteractionConflictError)) as caught:
            await asyncio.wait_for(run.respond(iid, response, responder=responder), 10)
        message = str(caught.value)
        assert message and len(message) <= MAX_MESSAGE, f"{len(message)} chars: {message[:300]}"
        assert any(
            phrase in message
            for phrase in (
                "has no interaction",
                "respond with",
                "does not match the call awaiting approval",
                "already answered",
                "may be at most",  # an answer, reason or token over its bound
                "must be at most",  # a responder or identity that is not a short name
            )
        ), message
        assert await bench.recorded_since(run, before_len) == []
        assert await run.snapshot() == before

    await check(
        prop,
        st.sampled_from(list(parked)),
        interaction_ids(ids),
        response_like(),
        st.none() | TEXT,
        max_examples=60,
        examples=[
            ("approval", "approval:1:b", {"type": "tool-approval"}, None),
            ("approval", "approval:1:a", {"type": "tool-approval", "approved": False}, "x"),
            ("approval", "approval:1:b", {**APPROVE, "args_digest": "0" * 32}, None),
            ("question", "question:1:call_ask_user", {"type": "question", "answer": 7}, None),
            ("approval", "approval:1:b", {"type": "tool-approval", "approved": HUGE_X}, None),
            # Consent is a JSON boolean: "on", "1" or 1 are not an approval.
            ("approval", "approval:1:b", {"type": "tool-approval", "approved": "on"}, None),
            ("approval", "approval:1:b", {"type": "tool-approval", "approved": 1}, None),
        ],
    )
    await bench.assert_no_failed_task(approval)
    await bench.assert_no_failed_task(question)
    await finish_approval_run(bench, approval)
    await question.respond("question:1:call_ask_user", {"type": "question", "answer": "A1"})
    await asyncio.wait_for(question.result(), 30)


async def test_raw_updates_reject_every_malformed_payload_with_a_durably_error(
    bench: Bench,
) -> None:
    """`respond` and `resolve_tool` sent with any payload from any Temporal client (no
    durably client model in between): an invalid one is rejected as a durably error that
    says what was wrong, never accepted, and leaves history and state as they were."""
    approval, pending = await parked_approval(bench)
    blocked = await parked_blocked(bench)
    targets = {"respond": approval, "resolve_tool": blocked}
    ids = list(pending.kinds)

    async def prop(pair: tuple[str, tuple[Any, ...]]) -> None:
        update, args = pair
        if accepts_raw(update, pending, args) or too_big(args):
            return
        run = targets[update]
        before_len = await bench.length(run)
        before = await run.snapshot()
        with pytest.raises(WorkflowUpdateFailedError) as caught:
            await asyncio.wait_for(bench.raw(run).execute_update(update, args=list(args)), 10)
        cause = caught.value.cause
        text = _failure_text(caught.value)
        assert isinstance(cause, ApplicationError), text
        assert cause.type in DURABLY_REJECTIONS, (
            f"{update}{args!r:.200} was rejected as {cause.type}, not as a durably error: "
            f"{text[:500]}"
        )
        assert cause.message and len(cause.message) <= MAX_MESSAGE, cause.message[:300]
        assert await bench.recorded_since(run, before_len) == []
        assert await run.snapshot() == before

    update_args = st.one_of(
        st.tuples(st.just("respond"), payload_args(respond_request_like(ids))),
        st.tuples(st.just("resolve_tool"), payload_args(resolve_request_like())),
    )
    await check(
        prop,
        update_args,
        max_examples=50,
        examples=[
            (("respond", ({"interaction_id": "approval:1:b", "response": {"type": "x"}},)),),
            (("resolve_tool", ({"operation": BLOCKED_OP, "resolution": {"type": "json"}},)),),
            (("respond", ({"interaction_id": 5, "response": APPROVE},)),),
            (("respond", (None,)),),
            (("respond", ()),),
            (("resolve_tool", ("hello",)),),
            (("resolve_tool", (b"\x00",)),),
        ],
    )
    await bench.assert_no_failed_task(approval)
    await bench.assert_no_failed_task(blocked)
    await finish_approval_run(bench, approval)
    await blocked.resolve_tool(BLOCKED_OP, {"type": "error", "message": "not filed"})
    await asyncio.wait_for(blocked.result(), 30)


# -- 2. respond_signal ----------------------------------------------------------------


async def test_respond_signal_never_fails_a_task_and_records_every_rejection(
    bench: Bench,
) -> None:
    """Any signal payload: no workflow task fails, the pending interaction stays as it
    was, and an invalid payload shows as a `response_rejected` event saying why."""
    run, pending = await parked_approval(bench)
    ids = list(pending.kinds)

    async def prop(args: tuple[Any, ...]) -> None:
        if accepts_raw("respond", pending, args) or too_big(args):
            return
        await bench.settled(run)  # a run that failed a task would hang the query
        before = await run.snapshot()
        await bench.raw(run).signal("respond_signal", args=list(args))
        await bench.settled(run)
        after = await run.snapshot()
        assert after.status == RunStatus.WAITING
        assert _interaction(after) == _interaction(before)
        new = _recorded(before, after)
        assert [e.type for e in new] == ["response_rejected"], (
            f"signal {args!r:.300} left events {[(e.type, e.detail) for e in new]} "
            "(expected exactly one response_rejected)"
        )
        detail = new[0].detail or ""
        assert detail.startswith(("InvalidResponseError", "InteractionConflictError")), detail
        assert len(detail) <= MAX_MESSAGE, f"{len(detail)} chars: {detail[:300]}"

    # A bad payload can damage the shared run, so a shrunk replay would mislead: no shrink.
    await check(
        prop,
        payload_args(respond_request_like(ids)),
        max_examples=40,
        shrink=False,
        examples=[
            (({"interaction_id": "approval:1:b", "response": {"type": "question"}},),),
            (({"interaction_id": "approval:1:a", "response": {**APPROVE, "approved": False}},),),
            (({"interaction_id": "nope", "response": APPROVE, "responder": HUGE_X},),),
        ],
    )
    await bench.assert_no_failed_task(run)
    await finish_approval_run(bench, run)


async def test_respond_many_refuses_a_batch_with_a_bad_entry_whole_and_never_fails_a_task(
    bench: Bench,
) -> None:
    """Any batch holding one response the run cannot accept, as the `respond_many` update
    or a `respond_signal` list, up to 100 entries and near the size limits: the update is
    rejected as a durably error naming the entry and nothing is recorded; the signal is
    one `response_rejected` event; the pending interaction stays as it was."""
    run, pending = await parked_approval(bench)
    ids = list(pending.kinds)
    unknown = {"interaction_id": "approval:9:zz", "response": APPROVE}

    async def prop(path: str, entries: list[Any], at: int) -> None:
        batch = [*entries[:at], unknown, *entries[at:]]
        if too_big(batch):
            return
        await bench.settled(run)
        before_len = await bench.length(run)
        before = await run.snapshot()
        if path == "update":
            with pytest.raises(WorkflowUpdateFailedError) as caught:
                await asyncio.wait_for(
                    bench.raw(run).execute_update("respond_many", {"responses": batch}), 20
                )
            cause = caught.value.cause
            assert isinstance(cause, ApplicationError), _failure_text(caught.value)
            assert cause.type in DURABLY_REJECTIONS, _failure_text(caught.value)[:500]
            assert len(cause.message) <= MAX_MESSAGE, cause.message[:300]
            assert await bench.recorded_since(run, before_len) == []
            assert await run.snapshot() == before
        else:
            await bench.raw(run).signal("respond_signal", batch)
            await bench.settled(run)
            after = await run.snapshot()
            assert [e.type for e in _recorded(before, after)] == ["response_rejected"]
            assert _interaction(after) == _interaction(before)

    batches = st.lists(respond_request_like(ids) | JSON, max_size=99)
    big = {"interaction_id": "approval:1:b", "response": {**APPROVE, "reason": "x" * 9_000}}
    await check(
        prop,
        st.sampled_from(["update", "signal"]),
        batches,
        st.integers(0, 99),
        max_examples=30,
        shrink=False,
        examples=[
            ("update", [], 0),
            ("update", [{"interaction_id": "approval:1:b", "response": APPROVE}], 1),
            ("signal", [{"interaction_id": "approval:1:b", "response": APPROVE}], 0),
            ("update", [big] * 99, 50),  # ~0.9 MB, every entry over the reason bound
            ("signal", [big] * 99, 99),
            ("update", [{"interaction_id": "approval:1:b", "response": APPROVE}] * 2, 2),
        ],
    )
    await bench.assert_no_failed_task(run)
    await finish_approval_run(bench, run)


# -- 3. resolve_tool ------------------------------------------------------------------


async def test_resolve_tool_rejects_every_invalid_resolution_and_changes_nothing(
    bench: Bench,
) -> None:
    """Any operation/resolution that does not resolve the blocked call is rejected with
    DurableConflictError or InvalidResponseError saying why; the run stays blocked."""
    run = await parked_blocked(bench)

    async def prop(operation: str, resolution: dict[str, Any]) -> None:
        if accepts_resolution(operation, resolution) or too_big(operation, resolution):
            return
        before_len = await bench.length(run)
        before = await run.snapshot()
        with pytest.raises((DurableConflictError, InvalidResponseError)) as caught:
            await asyncio.wait_for(run.resolve_tool(operation, resolution), 10)
        message = str(caught.value)
        assert message and len(message) <= MAX_MESSAGE, f"{len(message)} chars: {message[:300]}"
        assert any(
            phrase in message
            for phrase in (
                "is blocked on",
                "a resolution is",
                "does not fit the output schema",
                "may be at most",
            )
        ), message
        assert await bench.recorded_since(run, before_len) == []
        assert await run.snapshot() == before

    await check(
        prop,
        st.sampled_from([BLOCKED_OP]) | st.sampled_from(["tool:1:c2", "model:1", ""]) | TEXT,
        resolution_like(),
        max_examples=60,
        examples=[
            (BLOCKED_OP, {"type": "json", "value": {"ticket_id": "T", "priority": 9}}),
            (BLOCKED_OP, {"type": "json", "value": {"ticket_id": 7, "priority": 1}}),
            (BLOCKED_OP, {"type": "json"}),
            (BLOCKED_OP, {"type": "error", "message": ""}),
            (BLOCKED_OP, {"type": "error", "message": 5}),
            (BLOCKED_OP, {"type": "maybe", "value": HUGE_X}),
            ("tool:1:c2", {"type": "rerun"}),
        ],
    )
    snap = await run.snapshot()
    assert (snap.status, snap.blocked_operation) == (RunStatus.NEEDS_ATTENTION, BLOCKED_OP)
    await bench.assert_no_failed_task(run)
    await run.resolve_tool(BLOCKED_OP, {"type": "json", "value": {"ticket_id": "T", "priority": 1}})
    await asyncio.wait_for(run.result(), 30)
    assert EXECUTED[run.run_id] == [("file_ticket", "vpn")]


FILED_VALUES = st.fixed_dictionaries(
    {"ticket_id": TEXT, "priority": st.integers(1, 5)},
    optional={"tags": st.lists(st.text(max_size=10), max_size=3), "note": JSON},
)


async def test_resolve_tool_commits_any_value_that_fits_the_output_schema(bench: Bench) -> None:
    """A resolution that fits is accepted and is exactly what the model reads next."""

    async def prop(resolution: dict[str, Any]) -> None:
        run = await parked_blocked(bench)
        accepted = await run.resolve_tool(BLOCKED_OP, resolution)
        result = await asyncio.wait_for(run.result(), 30)
        [seen] = json.loads(result.output or "")
        assert accepted.type == resolution["type"]
        if resolution["type"] == "json":
            assert (seen["error"], seen["content"]) == (False, _cut(_compact(resolution["value"])))
        else:
            assert (seen["error"], seen["content"]) == (True, _cut(resolution["message"]))
        assert EXECUTED[run.run_id] == [("file_ticket", "vpn")]
        await bench.assert_no_failed_task(run)

    await check(
        prop,
        st.builds(lambda v: {"type": "json", "value": v}, FILED_VALUES).filter(
            lambda r: accepts_resolution(BLOCKED_OP, r)  # within the bound, as JSON
        )
        | st.builds(
            lambda m: {"type": "error", "message": m},
            st.text(min_size=1) | HUGE.map(lambda h: Huge(h[:MAX_REASON_CHARS])),  # the bound
        ),
        max_examples=3,
        shrink=False,
    )


async def test_only_one_of_several_concurrent_resolutions_is_accepted(bench: Bench) -> None:
    """Several operators resolving the same blocked call at once: exactly one resolution is
    accepted, the others are conflicts, and the accepted one is what the model reads.

    Updates that reach the worker in one workflow task are validated one after the other
    before the run leaves needs_attention, so unless a validator sees the decision the
    previous handler made, every one is accepted and the last silently wins. Two signals
    sent first keep a workflow task busy, so the resolutions arrive together.
    """
    busy = {"interaction_id": "none", "response": {}}
    for _ in range(2):
        run = await parked_blocked(bench)
        outcomes = await asyncio.gather(
            *[bench.raw(run).signal("respond_signal", busy) for _ in range(2)],
            *[
                run.resolve_tool(
                    BLOCKED_OP, {"type": "json", "value": {"ticket_id": f"T-{i}", "priority": 1}}
                )
                for i in range(5)
            ],
            return_exceptions=True,
        )
        outcomes = outcomes[2:]
        accepted = [i for i, o in enumerate(outcomes) if not isinstance(o, BaseException)]
        refused = [o for o in outcomes if isinstance(o, BaseException)]
        result = await asyncio.wait_for(run.result(), 30)
        [seen] = json.loads(result.output or "")
        committed = json.loads(seen["content"])["ticket_id"]
        assert len(accepted) == 1, (
            f"{len(accepted)} concurrent resolutions were accepted ({accepted}); "
            f"the run committed {committed!r}"
        )
        assert committed == f"T-{accepted[0]}"
        assert all(isinstance(o, DurableConflictError) for o in refused), refused


# -- 4. retry -------------------------------------------------------------------------

STATUS_WORDS = {
    RunStatus.RUNNING: ("is running",),
    RunStatus.WAITING: ("is waiting",),
    RunStatus.NEEDS_ATTENTION: ("needs_attention", "blocked on the interrupted manual tool call"),
    RunStatus.COMPLETED: ("completed",),
    RunStatus.CANCELLED: ("cancelled",),
}


async def test_retry_is_a_conflict_naming_the_status_on_every_run_it_does_not_apply_to(
    bench: Bench,
) -> None:
    """`retry` (client, or raw with junk fields) on a running, waiting, blocked-manual,
    completed or cancelled run: DurableConflictError naming the status, history unchanged."""
    running = await bench.start("holder")
    await bench.running_tool(running, "hold")
    waiting, _ = await parked_approval(bench)
    blocked = await parked_blocked(bench)
    completed = await bench.start("finisher")
    await asyncio.wait_for(completed.result(), 30)
    cancelled = await bench.start("holder")
    await bench.running_tool(cancelled, "hold")
    await cancelled.cancel()
    await wait_for_status(cancelled, RunStatus.CANCELLED)
    runs = {
        RunStatus.RUNNING: running,
        RunStatus.WAITING: waiting,
        RunStatus.NEEDS_ATTENTION: blocked,
        RunStatus.COMPLETED: completed,
        RunStatus.CANCELLED: cancelled,
    }

    async def prop(attempts: list[tuple[RunStatus, dict[str, Any] | None]]) -> None:
        for status, junk in attempts:
            run = runs[status]
            before_len = await bench.length(run)
            message: str | None
            if junk is None:
                with pytest.raises(DurableConflictError) as caught:
                    await asyncio.wait_for(run.retry(), 10)
                message = str(caught.value)
            elif status.unfinished:
                with pytest.raises(WorkflowUpdateFailedError) as raw_caught:
                    await asyncio.wait_for(bench.raw(run).execute_update("retry", junk), 10)
                cause = raw_caught.value.cause
                assert isinstance(cause, ApplicationError)
                assert cause.type == "DurableConflictError", _failure_text(raw_caught.value)
                message = cause.message
            else:  # a closed workflow: the server refuses before durably sees it
                with pytest.raises(RPCError) as rpc_caught:
                    await asyncio.wait_for(bench.raw(run).execute_update("retry", junk), 10)
                assert rpc_caught.value.status == RPCStatusCode.NOT_FOUND
                message = None
            if message is not None:  # durably's own rejection says the status
                assert any(word in message for word in STATUS_WORDS[status]), (status, message)
            assert await bench.recorded_since(run, before_len) == []
            assert (await run.snapshot()).status == status

    await check(
        prop,
        st.lists(
            st.tuples(st.sampled_from(list(runs)), st.none() | JSON_OBJECT), min_size=1, max_size=3
        ),
        max_examples=20,
        examples=[([(s, None) for s in runs],), ([(s, {"force": True}) for s in runs],)],
    )
    for run in runs.values():
        await bench.assert_no_failed_task(run)
    await running.cancel()
    await wait_for_status(running, RunStatus.CANCELLED)
    await finish_approval_run(bench, waiting)
    await blocked.resolve_tool(BLOCKED_OP, {"type": "rerun"})
    await wait_for_status(blocked, RunStatus.NEEDS_ATTENTION)
    assert len(EXECUTED[blocked.run_id]) == 2  # the rerun ran it once more, and it hung up again


# -- 5. malformed model output --------------------------------------------------------

TOOL_NAMES = ["lookup", "tag"]
CALL_IDS = st.sampled_from(
    ["a", "a", "b", "", " ", "call_1", "call_2", "tool:1:a", "a:b:c"]
) | st.text(max_size=40)
ARGUMENTS = st.one_of(
    st.fixed_dictionaries({"order": st.text(min_size=1, max_size=20), "qty": st.integers(1, 100)}),
    st.fixed_dictionaries({"labels": st.lists(st.text(max_size=10), max_size=3)}),
    st.fixed_dictionaries(
        {}, optional={"order": JSON, "qty": JSON | st.floats(), "labels": JSON, "extra": JSON}
    ),
    JSON_OBJECT,
)
RAW_ARGUMENTS = st.sampled_from(['{"order": ', "[1, 2]", "null", "", "{'a': 1}"]) | st.text()
CALLS = st.builds(
    lambda call_id, name, arguments, raw: ToolCall(
        id=call_id, name=name, arguments=arguments, raw_arguments=raw
    ),
    CALL_IDS,
    st.sampled_from(TOOL_NAMES) | st.sampled_from(["Lookup", "lookup ", "", "refund"]) | st.text(),
    ARGUMENTS,
    st.none() | st.none() | RAW_ARGUMENTS,
)
# At most one huge value per model answer: the answer is one activity result, under
# Temporal's 2 MB payload limit, and several would measure that limit, not durably.
HUGE_CALL = st.builds(
    lambda big, which: [
        ToolCall(id="big", name="lookup", arguments={"order": big, "qty": 1}),
        ToolCall(id="big", name="lookup", arguments={"order": 1, "qty": big}),
        ToolCall(id="big", name=big, arguments={}),
        ToolCall(id="big", name="tag", arguments={}, raw_arguments=big),
    ][which],
    st.sampled_from(["x", "é", "🦆"]).map(lambda unit: huge(unit, 200_000)),
    st.integers(0, 3),
)


def call_problem(call: ToolCall) -> str | None:
    """What durably must tell the model about this call, or None if it must run."""
    models = {"lookup": Lookup, "tag": Tag}
    if call.name not in models:
        return "unknown tool"
    if call.raw_arguments is not None:
        return "not a JSON object"
    try:
        models[call.name].model_validate(call.arguments)
    except ValidationError:
        return "invalid arguments"
    return None


async def test_malformed_model_output_is_answered_with_errors_and_the_run_completes(
    bench: Bench,
) -> None:
    """Unknown tools, wrong/missing/huge arguments, broken JSON, duplicate or empty call
    ids, many calls in one turn: each invalid call gets an error result saying why and
    never runs, each valid call runs once, and the run completes without a failed task."""

    async def prop(calls: list[ToolCall], big: ToolCall | None, at: int) -> None:
        if big is not None:
            calls = [*calls[:at], big, *calls[at:]]
        key = f"plan-{uuid.uuid4().hex}"
        PLANS[key] = tuple(calls)
        run = await bench.start("planned", key)
        result = await asyncio.wait_for(run.result(), 30)
        await bench.assert_no_failed_task(run)
        seen = json.loads(result.output or "")
        assert len(seen) == len(calls)
        assert len({r["call_id"] for r in seen}) == len(calls), "call ids must be unique"
        ran = []
        for call, got in zip(calls, seen, strict=True):
            problem = call_problem(call)
            if problem is None:
                assert not got["error"], (call.name, got["content"][:300])
                ran.append(call.name)
            else:
                assert got["error"], (call.name, problem)
                assert problem in got["content"], (problem, got["content"][:300])
        assert [name for name, _ in EXECUTED.get(run.run_id, [])] == ran
        del PLANS[key]

    many = [ToolCall(id="dup", name=TOOL_NAMES[i % 2], arguments={}) for i in range(40)]
    await check(
        prop,
        st.lists(CALLS, min_size=1, max_size=8),
        st.none() | HUGE_CALL,
        st.integers(0, 8),
        max_examples=12,
        shrink=False,
        examples=[
            (many, None, 0),
            (
                [
                    ToolCall(id="", name="nope", arguments={}),
                    ToolCall(id="", name="lookup", arguments={"order": "A", "qty": 2}),
                    ToolCall(id="x", name="lookup", arguments={"order": "A", "qty": "two"}),
                    ToolCall(id="x", name="lookup", arguments={"order": "A"}),
                    ToolCall(id="y", name="tag", arguments={}, raw_arguments='{"labels": ['),
                    ToolCall(id="z", name="tag", arguments={"labels": ["vip"]}),
                ],
                ToolCall(
                    id="big", name="lookup", arguments={"order": huge("x", 200_000), "qty": 1}
                ),
                3,
            ),
        ],
    )


# -- 6. payloads near Temporal's limits ------------------------------------------------

# Temporal refuses a payload over 2 MB before any workflow code runs; just under it,
# the workflow must refuse or record the input without copying it again. Updates stay
# under 1 MB: a rejected update's request travels back in the rejection (see the module
# docstring). pydantic's JSON stops at 200 levels of nesting; deeper payloads cannot
# even be decoded and must be refused as such.
SIGNAL_BYTES = st.integers(1_000_000, 1_900_000)
UPDATE_BYTES = st.integers(200_000, 950_000)
DEPTHS = st.sampled_from([50, 150, 199, 201, 260, 1_000, 5_000])


def nested(depth: int) -> str:
    """JSON text of lists and objects nested `depth` levels deep (past what Python's own
    encoder and pydantic's decoder accept, so it is written out by hand)."""
    opening = "".join('{"k":' if level % 2 else "[" for level in range(depth))
    closing = "".join("}" if level % 2 else "]" for level in reversed(range(depth)))
    return f'{opening}"x"{closing}'


_PLACEHOLDER = "\u0000placeholder\u0000"


def at_the_limit(sizes: SearchStrategy[int]) -> SearchStrategy[RawValue]:
    """A respond request (as a raw JSON payload) with one huge or deeply nested field,
    for an interaction the run does not have."""
    big = st.builds(
        lambda n, unit: json.dumps(unit * (n // len(unit.encode())), ensure_ascii=False),
        sizes,
        st.sampled_from(["x", "é", "🦆"]),
    )
    field = st.sampled_from(
        ["interaction_id", "responder", "identity", "answer", "reason", "junk", "args_digest"]
    )
    return st.builds(limit_request, field, big | DEPTHS.map(nested))


def limit_request(field: str, value_json: str) -> RawValue:
    # An interaction the run never asked about: whatever the field, the run refuses it.
    response: dict[str, Any] = {"type": "tool-approval", "approved": True}
    request: dict[str, Any] = {"interaction_id": "approval:9:zz", "response": response}
    if field in ("interaction_id", "responder", "identity"):
        request[field] = _PLACEHOLDER
    elif field == "answer":
        request["response"] = {"type": "question", "answer": _PLACEHOLDER}
    else:
        response[field] = _PLACEHOLDER
    text = json.dumps(request).replace(json.dumps(_PLACEHOLDER), value_json)
    return RawValue(Payload(metadata={"encoding": b"json/plain"}, data=text.encode()))


_THREE = ("junk", "reason", "responder")


async def test_payloads_near_temporals_limits_never_fail_a_task_or_end_the_run(
    bench: Bench,
) -> None:
    """Huge (up to 1.9 MB) and deeply nested (up to 5,000 levels) payloads, through
    `respond` and `respond_signal`: each is refused or recorded as rejected, the run
    keeps waiting on the same interaction (continuing as new as its history fills),
    no workflow task fails, the run is never terminated, and what the workflow itself
    adds to history per input is bounded (never a copy of the input)."""
    run = await bench.start("flooded")
    await bench.waiting_on(run, "approval:1:a")
    await run.respond("approval:1:a", APPROVE, responder="fixture")
    waiting = _interaction(await bench.waiting_on(run, "approval:1:b"))
    handle = bench.raw(run)

    async def prop(path: str, request: RawValue) -> None:
        runs_before = len(await chain_histories(bench.client, run.run_id))
        before_len = await bench.length(run)
        if path == "update":
            with pytest.raises(WorkflowUpdateFailedError):
                await asyncio.wait_for(handle.execute_update("respond", request), 20)
        else:
            await asyncio.wait_for(handle.signal("respond_signal", request), 20)
        await bench.settled(run, within=20)
        histories = await chain_histories(bench.client, run.run_id)
        assert failed_tasks(histories) == [], failed_tasks(histories)[:1]
        described = await handle.describe()
        assert described.status == WorkflowExecutionStatus.RUNNING
        assert _interaction(await run.snapshot()) == waiting
        if len(histories) == runs_before:  # no continue-as-new in between
            added = [
                e
                for e in histories[-1].events[before_len:]
                if e.event_type not in _TASK_BOOKKEEPING
                and e.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
            ]
            assert sum(e.ByteSize() for e in added) <= 8_192, [
                EventType.Name(e.event_type) for e in added
            ]
        else:  # what continuing as new carried: bounded, never the inputs
            continued = (
                histories[-2].events[-1].workflow_execution_continued_as_new_event_attributes
            )
            assert continued.input.ByteSize() <= 300_000

    # Three explicit signals of 1.9 MB fill the run's 4 MiB whatever the drawn ones are
    # (half of those are small nested ones), so it continues as new in every draw.
    huge = [("signal", limit_request(field, json.dumps("x" * 1_900_000))) for field in _THREE]
    await check(
        prop,
        st.just("signal"),
        at_the_limit(SIGNAL_BYTES),
        max_examples=8,
        shrink=False,
        examples=[("signal", limit_request("junk", nested(5_000))), *huge],
    )
    await check(
        prop,
        st.just("update"),
        at_the_limit(UPDATE_BYTES),
        max_examples=10,
        shrink=False,
        examples=[("update", limit_request("reason", nested(201)))],
    )
    assert len(await chain_histories(bench.client, run.run_id)) >= 2  # it did continue as new
    await finish_approval_run(bench, run)


# -- what the fuzzing found, pinned one by one -------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        pytest.param((None,), id="null"),
        pytest.param((b"\x00bytes",), id="binary"),
        pytest.param((), id="no-argument"),
        pytest.param(({"interaction_id": "approval:1:b", "response": APPROVE}, 1), id="two"),
        pytest.param(("approve it",), id="text"),
        pytest.param(({"interaction_id": 5, "response": APPROVE},), id="id-not-a-string"),
        pytest.param(({"interaction_id": "approval:1:b", "response": None},), id="no-response"),
    ],
)
async def test_a_signal_that_is_not_a_respond_request_is_recorded_as_rejected(
    bench: Bench, args: tuple[Any, ...]
) -> None:
    """What the Temporal CLI, the Web UI or another SDK can send as `respond_signal` when
    it is not a `RespondRequest`: the run records a `response_rejected` event saying so
    and keeps waiting. (The SDK decodes the payload before durably's handler runs: a
    null/binary payload reaches the handler as None/bytes, a wrong argument count calls it
    with the wrong arity, and an undecodable object is dropped with only a worker log
    line.)"""
    run, _ = await parked_approval(bench)
    before = await run.snapshot()

    await bench.raw(run).signal("respond_signal", args=list(args))
    await bench.settled(run)
    after = await run.snapshot()

    assert after.status == RunStatus.WAITING
    assert [e.type for e in after.events if e.seq > _last_seq(before)] == ["response_rejected"]
    await finish_approval_run(bench, run)


async def test_a_huge_invalid_response_is_rejected_without_failing_the_workflow_task(
    bench: Bench,
) -> None:
    """A 1.1 MB response (under Temporal's 2 MB payload limit) that is not a valid response
    must be rejected like any other. The rejection message must not echo the whole payload:
    the update rejection carries the request back, and both together exceed the limit."""
    run, _ = await parked_approval(bench)

    with pytest.raises(InvalidResponseError):
        await asyncio.wait_for(run.respond("approval:1:b", {"junk": "x" * 1_100_000}), 5)

    await bench.assert_no_failed_task(run)
    await finish_approval_run(bench, run)


async def test_rejected_signals_with_huge_payloads_keep_the_snapshot_readable(
    bench: Bench,
) -> None:
    """Thirty rejected 150 KB signals: each `response_rejected` event stays short, so the
    snapshot query (bounded by gRPC's 4 MB message limit) and `result()` keep working."""
    run, _ = await parked_approval(bench)
    junk = {"interaction_id": "approval:1:b", "response": {"junk": "x" * 150_000}}
    for _ in range(30):
        await bench.raw(run).signal("respond_signal", junk)

    snap = await asyncio.wait_for(run.snapshot(), 15)

    # The same rejection thirty times is one event counted thirty times.
    [rejected] = [e for e in snap.events if e.type == "response_rejected"]
    assert rejected.count == 30
    assert len(rejected.detail or "") <= MAX_MESSAGE
    await finish_approval_run(bench, run)


async def test_a_forged_repair_signal_changes_nothing_and_never_fails_a_task(
    bench: Bench,
) -> None:
    """`repair` signals to a run that was never reset (from anyone who may signal it):
    malformed, near 1.9 MB, or well formed with a made-up story. None changes what the
    run waits for or fails a task: the worker reads what a reset discarded from the
    server, never from the signal, and finds no reset here."""
    run, _ = await parked_approval(bench)
    before = await run.snapshot()
    forged = [
        {"responder": "mallory", "reason": "the call already paid bob"},
        {"responder": "x" * 10_000},
        {"reason": "y" * 1_900_000},
        ["not", "an", "object"],
        None,
    ]
    for payload in forged:
        await bench.raw(run).signal("repair", payload)
    await bench.settled(run)
    after = await run.snapshot()

    assert after.status == RunStatus.WAITING
    assert _interaction(after) == _interaction(before)
    kinds = {e.type for e in after.events if e.seq > _last_seq(before)}
    assert kinds == {"signal_rejected"}, [(e.type, e.detail) for e in after.events]
    assert any("was not reset" in (e.detail or "") for e in after.events)
    assert all(len(e.detail or "") <= MAX_MESSAGE for e in after.events)
    await bench.assert_no_failed_task(run)
    await finish_approval_run(bench, run)


async def test_an_interaction_id_longer_than_temporals_id_limit_is_an_invalid_response(
    bench: Bench,
) -> None:
    """`respond` builds its update id from the interaction id; an id past the server's
    1,000-character limit must still end as InvalidResponseError, not a raw RPCError."""
    run, _ = await parked_approval(bench)

    with pytest.raises(InvalidResponseError, match="has no interaction"):
        await asyncio.wait_for(run.respond("x" * 2_000, APPROVE), 10)

    await finish_approval_run(bench, run)


async def test_a_model_call_id_longer_than_temporals_id_limit_does_not_fail_the_task(
    bench: Bench,
) -> None:
    """The call id is part of the tool activity's id (`tool:{turn}:{call_id}`); a model
    that returns a 1,500-character id must not make the server reject the schedule command
    (BadScheduleActivityAttributes) and fail every workflow task of the run."""
    key = f"plan-{uuid.uuid4().hex}"
    PLANS[key] = (ToolCall(id="c" * 1_500, name="lookup", arguments={"order": "A", "qty": 1}),)
    run = await bench.start("planned", key)

    await bench.completed(run)

    [seen] = json.loads((await run.result()).output or "")
    assert not seen["error"]
    assert EXECUTED[run.run_id] == [("lookup", {"order": "A", "qty": 1})]


async def test_a_cancel_that_a_finishing_model_request_outruns_still_cancels_the_run(
    bench: Bench,
) -> None:
    """Found while building the fuzz runs: `cancel()` during a model request that then
    completes (before its next heartbeat could report the cancellation) must still end
    the run cancelled, and no tool may start after it.

    With `WAIT_CANCELLATION_COMPLETED`, the SDK hands the workflow the activity's result
    and erases the task's cancellation; unless the workflow checks
    `workflow.cancellation_reason()` after an operation, the run goes on (here into a tool
    that waits for an abort that never comes), and a second cancel request is a no-op.
    """
    key = f"gate-{uuid.uuid4().hex}"
    entered, gate = GATES[key] = (asyncio.Event(), asyncio.Event())
    run = await bench.start("gated", key)
    await asyncio.wait_for(entered.wait(), 30)

    await run.cancel()
    await bench.event(run, EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED)
    gate.set()  # the model answers before its heartbeat learns of the cancellation

    async with asyncio.timeout(10):
        while True:
            status = (await bench.raw(run).describe()).status
            if status == WorkflowExecutionStatus.CANCELED or EXECUTED.get(run.run_id):
                break
            await asyncio.sleep(0.05)
    assert EXECUTED.get(run.run_id, []) == [], "a tool started after the run was cancelled"
    assert status == WorkflowExecutionStatus.CANCELED
    await record_history(bench.client, run.run_id, "cancelled_after_model_completed")


async def test_a_call_awaiting_approval_with_huge_arguments_keeps_the_snapshot_readable(
    bench: Bench,
) -> None:
    """A model may pass a large document (here 1.2 MB) to a tool that needs approval. The
    arguments are in the snapshot's interaction; rendering them a second time into the
    current details doubles the query result past Temporal's 2 MB blob limit, and then
    `snapshot()`, `result()` and the inbox all fail for as long as the run waits."""
    key = f"plan-{uuid.uuid4().hex}"
    big = {"order": huge("x", 1_200_000), "amount": 1}
    PLANS[key] = (ToolCall(id="a", name="refund", arguments=big),)
    run = await bench.start("planned_approval", key)

    snap = await bench.waiting_on(run, "approval:1:a")

    assert _interaction(snap).args == big
    await run.respond("approval:1:a", APPROVE)
    await asyncio.wait_for(run.result(), 30)
    assert EXECUTED[run.run_id] == [("refund", big["order"])]
