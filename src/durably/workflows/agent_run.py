"""`AgentRunWorkflow`: one durable agent run, model -> tools -> model.

Handlers:
    query ``snapshot`` -> RunSnapshot: the run as an operator sees it.
    update ``respond(RespondRequest)`` -> RespondAccepted: approve/deny a tool call
        or answer a question; the same response again returns the same acceptance.
    update ``respond_many(RespondManyRequest)`` -> RespondManyAccepted: several
        responses, accepted all or none.
    signal ``respond_signal(RespondRequest | list[RespondRequest])``: the same, for
        callers that can only signal (a list is taken all or none); a rejected
        response becomes one ``response_rejected`` event. Served by
        the dynamic signal handler, which sees raw payloads (and other names, which
        become ``signal_rejected`` events).
    query ``transcript(offset, limit=None)`` -> TranscriptPage: for workers whose
        cache missed.
    update ``resolve_tool(ResolveToolRequest)`` -> ResolveToolAccepted: supply the
        real outcome of an interrupted manual tool call (json / error / rerun).
    update ``retry(RetryRequest)`` -> RetryAccepted: run the failed operation again.

Temporal glue only: what the run decides is `RunMachine`'s (`_machine`, no
Temporal there), the activities it runs are `_activities`, what it carries
past continue-as-new is `_continuation`, what it reads from outside is
`_run_input` and `_handler_input`, and what it shows operators is
`_snapshot` and `_operator_text`. `README.md` in this package holds the
rules that keep it replayable (determinism, patches, what may be imported).

Validators only raise, and reject before anything reaches history; an
accepted update is applied in the same workflow task as the continuation
(a signed approval first waits for the worker's check, a local activity).

Linear history is this package's edge: a model request carries only the
messages added since the previous one (see `durably._transcript`), so
history grows by each turn's own data, once, however long the run.
The workflow runs outside Temporal's sandbox (`sandboxed=False`), which
cost a quarter of each workflow task; CI replays every recorded history
inside the sandbox too, which still catches a clock, randomness or I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import Any, NoReturn, TypeVar

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import (
    RawValue,
    SearchAttributeKey,
    SearchAttributePair,
    SearchAttributeUpdate,
    TypedSearchAttributes,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    ChildWorkflowError,
    WorkflowAlreadyStartedError,
    is_cancelled_exception,
)
from temporalio.exceptions import CancelledError as TemporalCancelledError
from temporalio.exceptions import TimeoutError as ActivityTimeoutError

with workflow.unsafe.imports_passed_through():
    from durably._text import md_code
    from durably._transcript import transcript_page
    from durably.contract import (
        SA_AGENT,
        SA_AGENT_VERSION,
        SA_FINGERPRINT,
        SA_SESSION,
        SA_STATUS,
        SEARCH_ATTRIBUTES,
        WORKFLOW_TYPE,
        AgentPin,
        Answer,
        ApprovalResponse,
        Attention,
        ChildStatusNote,
        ErrorResolution,
        ErrorType,
        EventType,
        Handler,
        JsonResolution,
        LiveEvent,
        ModelCallResult,
        OperationKey,
        ParentCall,
        PinRequest,
        RaiseLimitsAccepted,
        RaiseLimitsRequest,
        RepairCheck,
        RepairPlan,
        RepairRequest,
        ResolveToolAccepted,
        ResolveToolRequest,
        RespondAccepted,
        RespondManyAccepted,
        RespondManyRequest,
        RespondRequest,
        RetryAccepted,
        RetryRequest,
        RunEvent,
        RunInput,
        RunResult,
        RunSnapshot,
        RunState,
        RunStatus,
        RunStatusNote,
        SessionHandler,
        SubagentTarget,
        ToolPolicy,
        TranscriptArchive,
        TranscriptPage,
        operation_id,
    )
    from durably.messages import AssistantMessage, ToolCall, ToolResultMessage, Usage
    from durably.tools import render_result
    from durably.workflows._activities import (
        confirm_advanced,
        confirm_status,
        describe,
        failed_attempt_usage,
        failure_details,
        model_request,
        next_attempt_in,
        pin_agent,
        restore_page,
        tool_call,
        verify_approval,
        verify_origin,
        verify_repair,
    )
    from durably.workflows._continuation import carried
    from durably.workflows._handler_input import decode_signal, refusals
    from durably.workflows._live import LiveEvents, clipped
    from durably.workflows._machine import (
        PIN,
        CallTools,
        ContinueAsNew,
        Decision,
        OutOfTurns,
        RequestModel,
        RunMachine,
        error_result,
    )
    from durably.workflows._metrics import run_trace_id, status_published
    from durably.workflows._operator_text import refused_details, status_details
    from durably.workflows._run_input import (
        initial_state,
        missing_key,
        one_raw_argument,
        origin_check,
        refused_state,
        sender_check,
        waits_for_key,
    )
    from durably.workflows._snapshot import build_snapshot
    from durably.workflows._validation import (
        Rejected,
        admit_request,
        parse_request,
        pending_interactions,
        rejection,
        short,
    )

__all__ = [
    "PATCHES",
    "PATCH_ADVANCE_KEPT",
    "PATCH_HARDENED",
    "PATCH_LIMITS",
    "PATCH_NOTES_CONFIRMED",
    "PATCH_ORIGIN",
    "PATCH_PARALLEL_TOOLS",
    "PATCH_REPAIR",
    "PATCH_SEED_FIDELITY",
    "PATCH_SIGNALS_COMMUTE",
    "PATCH_SUBAGENTS",
    "AgentRunWorkflow",
]


# What changed since 0.1.0: outside input is bounded and checked (start input,
# carried state, responses, signals); answers and large inputs reach the model
# by reference; operation ids include the chain's first run id; a parked or
# waiting run continues as new when its history nears the limit; signed
# approvals are verified.
PATCH_HARDENED = "durably-harden-outside-input"
# What changed next: under `model_retry` the run waits out a model request's
# backoff in a durable timer, as `retry_wait` in `DurablyStatus`, and schedules each
# attempt itself; the pinned fingerprint is published (`DurablyFingerprint`); model
# requests carry no summary and a shorter transcript digest.
PATCH_SEED_FIDELITY = "durably-seed-fidelity"
# What changed next (SPEC section 14): the calls of one model answer run at once
# (bounded by `max_parallel_tools`), every approval of the turn is pending at once,
# several calls may be parked, and results enter the transcript in call order.
PATCH_PARALLEL_TOOLS = "durably-parallel-tools"
# What changed next (SPEC section 16): a call of a subagent tool starts the subagent's
# run as a child and waits for it; a subagent's run tells its parent its status. Checked
# where those happen, so runs without subagents record no marker for it.
PATCH_SUBAGENTS = "durably-subagents"
# What changed next (SPEC section 17): a run parks in needs_attention (`budget_exceeded`)
# on reaching a usage limit, and applies its starter's own limits and turn budget. Checked
# only where a limit would change what the run does (`RunMachine`'s `limits_apply`), so
# runs that never reach one record no marker for it.
PATCH_LIMITS = "durably-limits"
# What changed next (SPEC section 22): a response that comes while the model request is out
# (or a subagent's note while its child is being started) waits for that answer (or start)
# instead of being refused. On replay a workflow task's signals come first; live, a worker
# that answered a query first may have applied the task's other events early, and the
# signal then comes alone: for these, both orders now give the same commands
# (`docs/design.md`, "The query race", says which splits still differ).
# Checked when a run handles its first signal, so runs that take none record no marker.
PATCH_SIGNALS_COMMUTE = "durably-signals-commute"
# What changed next (SPEC section 22): a run reset by `durably repair` reads what the reset
# discarded before it schedules anything, and acts on each operation's fate. Checked when a
# `repair` signal arrives, so runs never repaired record no marker; a worker of an older
# release cannot go past it (its replay fails on the marker), so it never runs a discarded
# manual call again.
PATCH_REPAIR = "durably-repair"
# What changed next: a run that continues another, or that a session or a parent run
# started, has its worker confirm with the server that the workflow it came from is
# durably's own on the run's task queue before it honours anything that workflow passed
# (carried approvals and pin, a conversation, a parent); otherwise it fails at once.
# Checked only in such runs, so runs a client started record no marker for it.
PATCH_ORIGIN = "durably-origin-confirmed"
# What changed next: a subagent's status note is a prompt to read the child's status from
# the server (`confirm_status`, a local activity), not a claim the parent applies: a note
# is a signal anyone may send. Checked when a note about a child of the run arrives.
PATCH_NOTES_CONFIRMED = "durably-notes-confirmed"
# What changed next: a `session_advanced` signal reaching a session's run that runs again
# (its retry raced the submission that went ahead) is confirmed with the session; then the
# run is not retried again and ends when it next fails. Checked when such a signal comes.
PATCH_ADVANCE_KEPT = "durably-session-advance-kept"
# Every patch since 0.1.0, oldest first.
PATCHES: tuple[str, ...] = (
    PATCH_HARDENED,
    PATCH_SEED_FIDELITY,
    PATCH_PARALLEL_TOOLS,
    PATCH_SUBAGENTS,
    PATCH_LIMITS,
    PATCH_SIGNALS_COMMUTE,
    PATCH_REPAIR,
    PATCH_ORIGIN,
    PATCH_NOTES_CONFIRMED,
    PATCH_ADVANCE_KEPT,
)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
# How much of a committed answer a live `model_completed` event carries.
_LIVE_TEXT_KEPT = 64 * 2**10
# What a failed operation may raise: an activity's error, or a local activity's own.
_OPERATION_ERRORS = (ActivityError, ApplicationError, ActivityTimeoutError, TemporalCancelledError)


@workflow.defn(name=WORKFLOW_TYPE, sandboxed=False)
class AgentRunWorkflow:
    """One durable agent run (see the module docstring for handlers)."""

    @workflow.init
    @one_raw_argument
    def __init__(self, *payload: Any) -> None:
        info = workflow.info()
        # First, before any command: every later decision depends on it.
        self._hardened = workflow.patched(PATCH_HARDENED)
        self._seed_fidelity = workflow.patched(PATCH_SEED_FIDELITY)
        self._parallel = workflow.patched(PATCH_PARALLEL_TOOLS)
        self._commute: bool | None = None  # see `_signals_commute`
        self._limits_on: bool | None = None  # see `_limits_apply`
        state, self._input_problem = initial_state(
            payload, info, hardened=self._hardened, limits_apply=self._limits_apply
        )
        # An input that needs a key this worker lacks: the run waits for it, or refuses it.
        sealed = missing_key(payload) if self._hardened else None
        self._missing_key = sealed if sealed is not None and waits_for_key(info) else None
        self._run_id = info.workflow_id
        # Followers read these by query; nothing here is recorded (see `_live`).
        self._live = LiveEvents(state.stream_offset)
        self._m = RunMachine(
            state,
            run_id=self._run_id,
            hardened=self._hardened,
            lean=self._seed_fidelity,
            parallel=self._parallel,
            clock=self._clock,
            on_event=self._live_event,
            limits_apply=self._limits_apply,
        )
        # A parent's subagent runs, by the key of the call that started each (in memory:
        # replay starts them again, with the same commands); what this run last told its
        # parent (a subagent's run).
        self._children: dict[str, workflow.ChildWorkflowHandle[Any, Any]] = {}
        self._told_parent: tuple[str, str | None] | None = None
        # Subagent calls whose child start is in flight, and the child's run id.
        self._starting: dict[str, str] = {}
        # The tool activities of the turn now running (parallel patch), by key: the run
        # never continues as new over one (its result would be lost, a manual call
        # run twice), and its current details name them.
        self._running: dict[str, str] = {}
        self._published = {sa.name: _start_value(sa) for sa in SEARCH_ATTRIBUTES}
        # History this run spent copying its predecessor's transcript in: not
        # counted toward continuing as new again.
        self._base_events = 0
        self._base_bytes = 0
        # The transcript is too large to carry: waits stop trying.
        self._cannot_continue = False
        # The time events get until the pin's workflow task ends: a local
        # activity's completion moves `workflow.now()` differently on replay.
        self._pin_clock: datetime | None = None
        # A session's run: whether it told its session it failed; the notes in flight;
        # whether the session went ahead of it (it then ends, never to be retried).
        self._reported_failed = False
        self._notes: list[asyncio.Task[None]] = []
        self._advanced = False
        # `repair` signals whose worker check is out: no operation starts meanwhile.
        self._repairing = 0
        # A `session_advanced` being confirmed with the session (`_session_went_ahead`).
        self._asking_session = False
        # Children whose status the worker is reading (`_confirm_note`): whether another
        # note came meanwhile; and the latest note of each.
        self._confirming: dict[str, bool] = {}
        self._noted: dict[str, ChildStatusNote] = {}

    @workflow.run
    @one_raw_argument
    async def run(self, *payload: Any) -> RunResult:
        m = self._m
        if self._input_problem is not None:
            await self._wait_for_key()
            self._refuse_input(self._input_problem)
        await self._confirm_origin()
        workflow.set_current_details(f"Starting a run of agent {md_code(m.s.agent_id)}")
        self._publish()  # a run that continued as new while parked or waiting shows it
        try:
            if m.s.archive is not None:
                await self._restore(m.s.archive)
            if m.s.pin is None:
                await self._pin_run()
            while True:
                step = m.next_step(self._history_nearly_full)
                if isinstance(step, CallTools):
                    await self._call_turn(step)
                elif isinstance(step, ContinueAsNew):
                    await self._continue_as_new()  # returns if it could not: parked, decided
                elif isinstance(step, OutOfTurns):
                    await self._park(RunStatus.FAILED, error=step.error, retryable=False)
                else:
                    answer = await self._operation(step.key, partial(self._model, step))
                    if m.model_answered(step, answer):
                        if self._hardened:  # a response still being checked gets its answer
                            await workflow.wait_condition(workflow.all_handlers_finished)
                        result = m.complete(answer.message.content)
                        self._publish()
                        self._live.detach()
                        return result
        except asyncio.CancelledError:
            m.flush_held()  # committed results stay in the transcript (and a session's)
            m.cancel()
            self._publish()
            self._live.detach()
            raise

    async def _confirm_origin(self) -> None:
        """Fail the run, holding nothing it was passed, unless the workflow that continued
        into it or started it is durably's own (`durably.activities._origin`)."""
        check = origin_check(self._m.s, workflow.info()) if self._hardened else None
        if check is None or not workflow.patched(PATCH_ORIGIN):
            return
        self._decide_limits()
        # A query answered meanwhile shows the run as it continues (a parked run, parked).
        self._show_details()
        problem = await verify_origin(check)
        if problem:
            self._m.s = refused_state(self._m.s.agent_id, problem)
            self._refuse_input(problem)

    async def _wait_for_key(self) -> None:
        """Fail this workflow task, and so every one until a worker holds the key, if the
        state the run carried is durably's own but encrypted with a key this worker lacks
        (SPEC section 18: a missing key is an operator's error, and the run waits for it).
        A forged one, from a workflow not durably's, is refused like any forged input."""
        if self._missing_key is None:
            return
        check = sender_check(workflow.info())
        if workflow.unsafe.is_replaying() or check is None or not workflow.patched(PATCH_ORIGIN):
            raise self._missing_key
        problem = await verify_origin(check)
        if problem:
            self._input_problem = problem
            return
        raise self._missing_key

    def _decide_limits(self) -> None:
        """Decide whether limits apply before the first local activity: a patch marker after
        a local activity's, in the same workflow task, does not replay."""
        if self._m.s.limits is not None or self._m.s.max_turns is not None:
            self._limits_apply()

    async def _pin_run(self) -> None:
        """Pin the registration, and the limits the run applies under it."""
        m = self._m
        self._decide_limits()
        m.pinned(await self._operation(PIN, self._pin))
        self._pin_clock = None
        problem = m.start_limits() if self._parallel else None
        if problem is not None:
            self._refuse_input(problem)
        self._publish()  # DurablyAgentVersion, from the start of the run

    def _refuse_input(self, problem: str) -> NoReturn:
        """End a run whose start input durably cannot accept: failed, and visible as such."""
        self._m.refuse_input(problem)
        self._publish()
        workflow.set_current_details(refused_details(problem))
        raise ApplicationError(
            f"durably refused this run's input: {problem}",
            type=ErrorType.INVALID_RUN_INPUT.value,
            non_retryable=True,
        )

    # -- a turn's tool calls ---------------------------------------------------------

    async def _call_turn(self, step: CallTools) -> None:
        """Every call of the turn at once, each to its committed result (parallel patch;
        before it, one after another).

        Calls start in the model's order; at most `max_parallel_tools` tool
        activities run at a time (a call waiting for a person holds no
        slot); the model's next request waits for every call.
        """
        m = self._m
        if not self._parallel:  # one call after another, as 0.1.0 ran them
            for call in step.calls:
                await self._call(OperationKey.tool(step.turn, call.call_id), call)
            return
        limit = m.pin.max_parallel_tools
        gate = asyncio.Semaphore(limit) if limit else None
        calls = [
            asyncio.create_task(self._call(OperationKey.tool(step.turn, c.call_id), c, gate))
            for c in step.calls
            if not m.is_held(c)
        ]
        # A call that ends the run (continued as new, ended by its session) ends the others
        # with it; a cancelled run cancels each.
        await asyncio.gather(*calls)

    async def _call(
        self, key: OperationKey, call: ToolCall, gate: asyncio.Semaphore | None = None
    ) -> None:
        """One call of the turn, to its committed result (in the transcript)."""
        m = self._m
        if m.reject_call(key, call):
            return
        policy = m.needs_person(key, call)
        if policy is not None and await self._interact(key, call, policy) is not None:
            return  # denied, answered, or timed out: that is its result
        target = m.pin.tools[call.name].subagent
        op = partial(self._delegate, key, call) if target else partial(self._tool, key, call, gate)
        result, resolved = await self._operation(
            key, op, resolve=lambda decision: (m.resolved_result(call, decision), True)
        )
        if resolved and target is not None:
            self._let_go(key)
        m.tool_done(key, call, result, resolved=resolved)
        if self._parallel:
            self._publish()  # what the other calls of the turn do now

    async def _interact(
        self, key: OperationKey, call: ToolCall, policy: ToolPolicy
    ) -> ToolResultMessage | None:
        """Wait for a person; None means approved (the call runs), else the call's result."""
        m = self._m
        interaction = m.ask(key, call, policy, now=workflow.now())
        self._publish()
        answered = await self._wait(
            lambda: m.answered(interaction),
            until=m.deadline(interaction, policy, workflow.now()),
            summary=f"{interaction.type} timeout {interaction.id}",
        )
        if not answered:
            m.time_out(interaction, policy)
        result = m.take_answer(interaction, call)
        self._publish()
        return result

    # -- subagents (SPEC section 16) ------------------------------------------------

    async def _delegate(self, key: OperationKey, call: ToolCall) -> tuple[ToolResultMessage, bool]:
        """A subagent call: its run, a child of this one, to its final output.

        The child's id is the call's operation id (chain-unique: a reused run
        id never meets an earlier child). A failed child stays open for
        `retry()`, so its failure comes as its status note, not its result:
        this call then parks (`subagent_failed`) until the child runs again or
        the call is resolved. Attaching again (after the child is retried)
        waits on the same child; nothing starts a second one.
        """
        m = self._m
        workflow.patched(PATCH_SUBAGENTS)
        target = m.pin.tools[call.name].subagent
        assert target is not None
        handle = self._children.get(str(key))
        if handle is None:
            child_id = operation_id(self._run_id, m.s.chain, str(key))
            workflow.set_current_details(
                f"Starting subagent {md_code(target.agent_id)} for {md_code(str(key))}"
            )
            m.used(Usage(tool_calls=1))
            self._starting[str(key)] = child_id  # no continue-as-new until its start is known
            try:
                handle = await self._start_child(key, call, target, child_id)
            finally:
                self._starting.pop(str(key), None)
            self._children[str(key)] = handle
            if str(key) not in m.s.children:  # a run continued as new has it already
                m.child_started(key, child_id)
            self._publish()
        await workflow.wait_condition(lambda: handle.done() or m.child_failed(key) is not None)
        failed = m.child_failed(key)
        if failed is not None and not handle.done():
            raise ApplicationError(
                f"subagent run {failed.run_id!r} failed: {failed.detail or 'see that run'}",
                {"reason": "subagent_failed", "child_run_id": failed.run_id, "tool": call.name},
                type=ErrorType.SUBAGENT_FAILED.value,
                non_retryable=True,
            )
        try:
            raw = await handle
        except ChildWorkflowError as err:
            if is_cancelled_exception(err):
                self._children.pop(str(key), None)
                m.s.children.pop(str(key), None)
                return error_result(call, "the subagent's run was cancelled"), False
            raise ApplicationError(
                f"subagent run {handle.id!r} ended without an answer: {describe(err)}",
                {"reason": "subagent_failed", "child_run_id": handle.id, "tool": call.name},
                type=ErrorType.SUBAGENT_FAILED.value,
                non_retryable=True,
            ) from None
        result = RunResult.model_validate(raw)
        m.child_done(key, result)
        self._children.pop(str(key), None)
        return ToolResultMessage(
            call_id=call.call_id, tool=call.name, content=result.output or ""
        ), False

    async def _start_child(
        self, key: OperationKey, call: ToolCall, target: SubagentTarget, child_id: str
    ) -> workflow.ChildWorkflowHandle[Any, Any]:
        """Start the call's child run. An id already taken (a reset, or someone who started
        a workflow under it) parks the call: the run never waits on what it did not start."""
        try:
            return await workflow.start_child_workflow(
                WORKFLOW_TYPE,
                RunInput(
                    agent_id=target.agent_id,
                    input=(
                        render_result(call.arguments)
                        if target.typed
                        else str(call.arguments.get("task", ""))
                    ),
                    version=target.version,
                    parent=ParentCall(run_id=self._run_id, operation=str(key)),
                ).model_dump(mode="json", exclude_none=True),
                id=child_id,
                task_queue=workflow.info().task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                parent_close_policy=workflow.ParentClosePolicy.REQUEST_CANCEL,
                search_attributes=TypedSearchAttributes(
                    [
                        SearchAttributePair(SA_STATUS, RunStatus.RUNNING.value),
                        SearchAttributePair(SA_AGENT, target.agent_id),
                    ]
                ),
                static_summary=f"subagent of {self._run_id}: {call.name}",
            )
        except WorkflowAlreadyStartedError:
            raise ApplicationError(
                f"the subagent run id {child_id!r} of {key} is taken by a workflow this run "
                "did not start; resolve this call (json or error)",
                {"reason": "subagent_failed", "child_run_id": child_id, "tool": call.name},
                type=ErrorType.SUBAGENT_FAILED.value,
                non_retryable=True,
            ) from None

    def _let_go(self, key: OperationKey) -> None:
        """An operator resolved a call whose child is still open: the child is cancelled
        (its result would no longer be read)."""
        child = self._m.s.children.pop(str(key), None)
        self._children.pop(str(key), None)
        if child is not None:
            handle = workflow.get_external_workflow_handle(child.run_id)
            self._notes.append(asyncio.create_task(self._cancel_child(handle)))

    @staticmethod
    async def _cancel_child(handle: workflow.ExternalWorkflowHandle[Any]) -> None:
        try:
            await handle.cancel()
        except Exception:  # it ended meanwhile
            workflow.logger.info("the subagent's run had ended already")

    async def _child_status(self, payload: Sequence[RawValue]) -> None:
        """A child run said its status changed (`child_status` signal). A note that came
        with its child's start waits for that start to be known (signals-commute patch):
        on replay the note is applied first."""
        note = self._read_signal(ChildStatusNote, payload, Handler.CHILD_STATUS)
        if note is None:
            return
        # Decided before any wait: a patch marker after a local activity's, in the same
        # workflow task, does not replay.
        children = {c.run_id for c in self._m.s.children.values()} | set(self._starting.values())
        confirmed = note.run_id in children and workflow.patched(PATCH_NOTES_CONFIRMED)
        if self._commute and note.run_id in self._starting.values():
            await workflow.wait_condition(lambda: note.run_id not in self._starting.values())
        if not any(c.run_id == note.run_id for c in self._m.s.children.values()):
            self._m.event(
                EventType.SIGNAL_REJECTED,
                detail=f"{Handler.CHILD_STATUS.value} from {short(note.run_id, 100)}, which is "
                "not a subagent run of this run",
            )
            return
        if confirmed:
            await self._confirm_note(note)
        else:
            self._m.child_noted(note)
        self._publish()
        self._child_seen(note.run_id)

    def _child_seen(self, run_id: str) -> None:
        """Tell followers a child's status (live only: AG-UI ends its run with the child's
        interrupts when the child waits for a person)."""
        for operation, child in self._m.s.children.items():
            if child.run_id == run_id:
                self._live.publish(
                    LiveEvent(
                        run_id=self._run_id,
                        at=workflow.now(),
                        type=EventType.SUBAGENT_STATUS,
                        operation=operation,
                        detail=f"{child.status} {run_id}",  # the child's status, its id
                        status=self._m.s.status,
                    )
                )

    async def _confirm_note(self, note: ChildStatusNote) -> None:
        """Apply the status the child publishes, read from the server, not the one `note`
        claims: a note is a signal, which anyone may send (one saying `seq = 10**18` made
        the parent ignore every real note after it). Notes that come while one is being
        confirmed are folded into one more read."""
        run_id = note.run_id
        self._noted[run_id] = note
        if run_id in self._confirming:
            self._confirming[run_id] = True  # read again once the read in flight is back
            return
        self._confirming[run_id] = False
        self._limits_apply()  # decided before the local activity (see `_decide_limits`)
        try:
            while True:
                status = await confirm_status(run_id)
                self._m.child_confirmed(self._noted[run_id], status)
                if not self._confirming[run_id]:
                    return
                self._confirming[run_id] = False
        finally:
            del self._confirming[run_id]

    def _report_to_parent(self) -> None:
        """A subagent's run tells its parent each status change (not completion: the
        parent reads that from the result)."""
        s = self._m.s
        parent = workflow.info().parent
        if s.parent is None or parent is None or s.status == RunStatus.COMPLETED:
            return
        detail = _status_detail(s)
        detail = detail[:1000] if detail else None  # what the parent takes
        told = (s.status.value, detail)
        if told == self._told_parent:
            return
        self._told_parent = told
        workflow.patched(PATCH_SUBAGENTS)
        note = ChildStatusNote(run_id=self._run_id, status=s.status, detail=detail, seq=s.event_seq)
        handle = workflow.get_external_workflow_handle(parent.workflow_id)
        self._notes.append(asyncio.create_task(self._send_note(handle, note, Handler.CHILD_STATUS)))

    # -- operations ---------------------------------------------------------------

    async def _pin(self) -> AgentPin:
        s = self._m.s
        workflow.set_current_details(f"Resolving the registration of agent {md_code(s.agent_id)}")
        self._pin_clock = workflow.now()
        return await pin_agent(PinRequest(agent_id=s.agent_id, version=s.requested_version))

    async def _model(self, step: RequestModel) -> ModelCallResult:
        """The turn's model request. Under `model_retry` (and the seed-fidelity patch)
        the run schedules each attempt itself and waits out the backoff visibly."""
        m = self._m
        request = m.model_input(step)
        fate = m.take_fate(step.key)
        if fate is not None and fate.outcome == "completed" and fate.result is not None:
            m.sent()  # it answered before `durably repair` reset the run: keep the answer
            return ModelCallResult.model_validate(fate.result)
        retry = m.pin.model_retry if self._seed_fidelity else None
        if m.s.status == RunStatus.RETRY_WAIT:  # continued as new while waiting to retry
            request = request.model_copy(update={"attempt": m.s.attempt})
            await self._until_next_attempt(step.key)
        while True:
            workflow.set_current_details(
                f"Waiting for the model (turn {step.turn} of {m.turn_budget()})"
            )
            self._live_only(EventType.MODEL_STARTED, step.key, f"attempt {request.attempt or 1}")
            m.requesting = step.turn  # responses for its answer's calls may come first
            try:
                result = await model_request(
                    m.pin,
                    request,
                    step.turn,
                    one_attempt=retry is not None,
                    summary=not self._seed_fidelity,
                )
            except ActivityError as err:
                attempt = request.attempt or 1
                if is_cancelled_exception(err):
                    raise
                m.used(failed_attempt_usage(err))
                if retry is None:
                    raise
                delay = next_attempt_in(err, retry, attempt)
                if delay is None:
                    raise
                request = request.model_copy(update={"attempt": attempt + 1})
                m.requesting = None
                await self._retry_wait(step.key, describe(err), attempt + 1, delay)
            else:
                m.sent()
                return result
            finally:
                m.requesting = None

    async def _retry_wait(
        self, key: OperationKey, error: str, attempt: int, delay: timedelta
    ) -> None:
        """Wait out a model request's backoff in a durable timer, `retry_wait` meanwhile:
        the Web UI's `DurablyStatus` filter and the inbox find it, and a server restart
        keeps both the timer and the status."""
        self._m.wait_to_retry(key, error, attempt, workflow.now() + delay)
        self._publish()
        await self._until_next_attempt(key)

    async def _until_next_attempt(self, key: OperationKey) -> None:
        """Sleep until the model request's next attempt, then check it against the run's
        limits (raising `_OverBudget`: the run parks instead). Each failed attempt adds a
        dozen events, and `max_attempts` has no bound: when the history nears its limit
        the run continues as new first, and the new run resumes this wait from its state."""
        m = self._m
        if self._may_continue_from_wait():
            await workflow.wait_condition(workflow.all_handlers_finished)
            next_input, problem = carried(m, workflow.info().run_id)
            if next_input is not None:
                self._continue(next_input)
            self._cannot_continue = True  # wait here then, saying why
            m.event(EventType.CONTINUE_AS_NEW_REFUSED, detail=problem)
        at = m.s.next_attempt_at
        if at is not None and at > workflow.now():
            await workflow.sleep(
                at - workflow.now(), summary=f"model retry backoff (attempt {m.s.attempt})"
            )
        m.retry_due()
        self._publish()
        if (over := self._over_budget(key)) is not None:
            raise _OverBudget(over)

    async def _tool(
        self, key: OperationKey, call: ToolCall, gate: asyncio.Semaphore | None = None
    ) -> tuple[ToolResultMessage, bool]:
        m = self._m
        fate = m.take_fate(key)
        if fate is not None and fate.outcome == "completed" and fate.result is not None:
            m.used(Usage(tool_calls=1))
            return ToolResultMessage.model_validate(fate.result), False  # it ran: keep it
        manual = m.pin.tools[call.name].recovery == "manual"
        if fate is not None and fate.outcome == "uncertain" and manual:  # as after a crash
            raise ApplicationError(
                f"{key} ran before `durably repair` reset this run, and {fate.detail}: "
                "its outcome is unknown. Check the external system, then resolve it",
                type=ErrorType.TOOL_CRASHED.value,
                non_retryable=True,
            )
        m.used(Usage(tool_calls=1))
        if not self._parallel:
            workflow.set_current_details(
                f"Running tool {md_code(call.name)} ({md_code(str(key))}, "
                f"recovery: {m.pin.tools[call.name].recovery})"
            )
            self._live_only(EventType.TOOL_STARTED, key, call.name)
            return await tool_call(m.pin, m.tool_input(key, call)), False
        if gate is not None:
            await gate.acquire()
        self._running[str(key)] = call.name
        self._publish()
        self._live_only(EventType.TOOL_STARTED, key, call.name)
        try:
            return await tool_call(m.pin, m.tool_input(key, call)), False
        finally:
            del self._running[str(key)]
            if gate is not None:
                gate.release()

    async def _operation(
        self,
        key: OperationKey,
        op: Callable[[], Awaitable[T]],
        *,
        resolve: Callable[[JsonResolution | ErrorResolution], T] | None = None,
    ) -> T:
        """Run an operation; on a final failure park the run until an operator decides.

        `retry()` and a `rerun` resolution run it again under the same key
        (so the same operation_id); a json/error resolution is its result. A
        run that continued as new while parked on `key` waits for that
        decision again rather than running the operation.
        """
        m = self._m
        while True:
            if self._repairing:  # a repaired run first learns what its reset discarded
                await workflow.wait_condition(lambda: not self._repairing)
            if m.parked_on(key):
                decision = await self._until_decided(key)
            elif (over := self._over_budget(key)) is not None:
                decision = await self._park(
                    RunStatus.NEEDS_ATTENTION, error="", key=key, attention=over
                )
            else:
                try:
                    result = await op()
                except _OverBudget as over_budget:  # before a model request's next attempt
                    decision = await self._park(
                        RunStatus.NEEDS_ATTENTION, error="", key=key, attention=over_budget.why
                    )
                except _OPERATION_ERRORS as err:
                    if is_cancelled_exception(err):
                        # The run was cancelled while this activity ran; it has stopped.
                        raise asyncio.CancelledError() from err
                    error = describe(err)
                    status, attention = m.classify(key, error, failure_details(err))
                    decision = await self._park(status, error=error, key=key, attention=attention)
                else:
                    # An operation that completes while the run is being cancelled hands
                    # back its result and erases the cancellation (WAIT_CANCELLATION_COMPLETED).
                    if workflow.cancellation_reason() is not None:
                        raise asyncio.CancelledError()
                    return result
            if isinstance(decision, JsonResolution | ErrorResolution) and resolve:
                return resolve(decision)

    async def _park(
        self,
        status: RunStatus,
        *,
        error: str,
        key: OperationKey | None = None,
        attention: Attention | None = None,
        retryable: bool = True,
    ) -> Decision:
        """Hold the run open in `failed`/`needs_attention` until an operator decides."""
        self._m.park(status, error=error, key=key, attention=attention, retryable=retryable)
        self._publish()
        return await self._until_decided(key)

    async def _until_decided(self, key: OperationKey | None) -> Decision:
        m = self._m
        m.show_blocked_args(key)
        self._publish()
        where = str(key) if key else None

        def decided() -> bool:
            return (where in m.decisions) if self._parallel else m.decision is not None

        child = self._children.get(where or "")

        def child_ended() -> bool:  # a parked subagent call whose child closed meanwhile
            return child is not None and child.done()

        await self._wait(lambda: decided() or self._ends_advanced() or child_ended())
        if self._ends_advanced() and not decided():
            self._end_advanced()
        if not decided() and key is not None and child_ended():
            m.child_ended(key)
        self._pin_clock = None
        decision = m.decided(key)
        self._publish()
        return decision

    def _end_advanced(self) -> NoReturn:
        """A later submission went ahead of this failed run of a session: it ends, its
        committed messages already in the conversation, never to be retried."""
        session = self._m.s.session
        assert session is not None
        self._m.event(EventType.RUN_FAILED, detail="a later submission advanced the session")
        raise ApplicationError(
            f"run {self._run_id!r} failed and a later submission has advanced session "
            f"{session.session_id!r}, so it can no longer be retried; its committed messages "
            "stay in the session's conversation",
            type=ErrorType.DURABLE_CONFLICT.value,
            non_retryable=True,
        )

    # -- usage limits (SPEC section 17) --------------------------------------------

    def _limits_apply(self) -> bool:
        """Whether this run applies usage limits: asked only where one would change what
        it does, so a history from before the limits patch replays as it ran."""
        if self._limits_on is None:
            self._limits_on = self._parallel and workflow.patched(PATCH_LIMITS)
        return self._limits_on

    def _over_budget(self, key: OperationKey) -> Attention | None:
        """The limit the run reached before `key`, if any (a model request waiting out its
        backoff is checked once the wait is over, by `_model`)."""
        if self._m.s.status == RunStatus.RETRY_WAIT:
            return None
        return self._m.over_budget(key, workflow.now())

    @workflow.update(name=Handler.RAISE_LIMITS)
    def raise_limits(self, *payload: Any) -> RaiseLimitsAccepted:
        with refusals():
            request = parse_request(RaiseLimitsRequest, payload, Handler.RAISE_LIMITS)
            accepted = self._m.raise_limits(request, workflow.now())
        self._publish()
        return accepted

    @raise_limits.validator
    def _validate_raise_limits(self, *payload: Any) -> None:
        with refusals():
            request = admit_request(RaiseLimitsRequest, payload, Handler.RAISE_LIMITS, strict=True)
            self._m.check_raise(request, workflow.now())

    # -- continuing as new -------------------------------------------------------------

    def _history_nearly_full(self) -> bool:
        """Time to continue as new: the history is approaching Temporal's limits.

        Not at the server's suggestion (from 4,000 events by default), which
        copies the transcript into a new run far earlier than needed. What a
        run spent restoring its predecessor's transcript does not count:
        otherwise, once the transcript neared the threshold, every run would
        continue as new again at once.
        """
        info = workflow.info()
        events, size = self._m.continue_as_new_at()
        return (
            info.get_current_history_length() - self._base_events >= events
            or info.get_current_history_size() - self._base_bytes >= size
        )

    def _may_continue_from_wait(self) -> bool:
        """A waiting or parked run continues as new too when its history nears the limit
        (a flood of signals must not end it at Temporal's limit)."""
        return (
            self._hardened
            and not self._cannot_continue
            and not self._running
            and not self._m.s.children
            and not self._starting
            and not self._repairing
            and self._m.s.archive is None
            and self._history_nearly_full()
        )

    async def _continue_as_new(self) -> None:
        """Continue as new (this never returns), unless what it carries is too large."""
        await workflow.wait_condition(workflow.all_handlers_finished)
        next_input, problem = carried(self._m, workflow.info().run_id)
        if next_input is None:
            self._cannot_continue = True
            await self._park(RunStatus.FAILED, error=problem or "", retryable=False)
            return
        self._continue(next_input)

    async def _wait(
        self, done: Callable[[], bool], *, until: datetime | None = None, summary: str | None = None
    ) -> bool:
        """Wait until `done()` (True) or `until` passes (False).

        Meanwhile the run continues as new if its history nears the limit;
        the new run resumes this same wait from the state it carries.
        """
        while True:
            if done():
                return True
            timeout = None
            if until is not None:
                timeout = until - workflow.now()
                if timeout <= timedelta(0):
                    return False
            try:
                await workflow.wait_condition(
                    lambda: done() or self._may_continue_from_wait(),
                    timeout=timeout,
                    timeout_summary=summary,
                )
            except TimeoutError:
                return done()
            if done():
                return True
            # Handlers still running may yet decide; then nothing is left behind.
            await workflow.wait_condition(workflow.all_handlers_finished)
            if done():
                return True
            if self._running or self._m.s.children or self._starting:  # a call is out
                continue
            next_input, problem = carried(self._m, workflow.info().run_id)
            if next_input is None:  # keep waiting here, saying why
                self._cannot_continue = True
                self._m.event(EventType.CONTINUE_AS_NEW_REFUSED, detail=problem)
                continue
            self._continue(next_input)

    def _continue(self, next_input: RunInput) -> NoReturn:
        """Continue as new; the live stream goes on in the next run from here."""
        self._live_only(EventType.CONTINUED_AS_NEW, None, None)
        if next_input.carried is not None:
            next_input.carried.stream_offset = self._live.next_offset
        self._live.detach()
        workflow.continue_as_new(next_input)

    async def _restore(self, archive: TranscriptArchive) -> None:
        """Copy the transcript the previous run kept into this run's history, page by page."""
        s = self._m.s
        if s.status == RunStatus.RUNNING:  # else the details keep saying what it waits for
            workflow.set_current_details(
                f"Restoring the transcript ({archive.length} messages) from the previous run "
                f"{md_code(archive.run_id)}"
            )
        while (key := self._m.next_page(archive)) is not None:
            restore = partial(restore_page, archive, key.offset, hardened=self._hardened)
            if self._hardened:
                page = await self._restore_or_end(key, restore)
            else:
                page = await self._operation(key, restore)
            self._m.restored_page(archive, page)
        self._m.restored(archive)
        info = workflow.info()
        self._base_events = info.get_current_history_length()
        self._base_bytes = info.get_current_history_size()

    async def _restore_or_end(
        self, key: OperationKey, restore: Callable[[], Awaitable[TranscriptPage]]
    ) -> TranscriptPage:
        """A page of the transcript, retried until it comes (it has no side effect).

        It never parks the run the usual way: the state a run carries may
        itself be parked or waiting, and a restore parked over it would lose
        what it waits for (and `retry()` would then run a blocked manual call
        again). Only a page that can never come (the previous run is gone)
        ends the run's useful life: it fails, not retryable, until cancelled.
        """
        try:
            return await restore()
        except ActivityError as err:
            if is_cancelled_exception(err):
                raise asyncio.CancelledError() from err
            self._m.lose_transcript(f"the transcript could not be restored: {describe(err)}", key)
            self._publish()
            await self._until_decided(key)
            raise AssertionError(
                "a run that cannot restore its transcript is never retried"
            ) from err

    # -- queries ----------------------------------------------------------------

    @workflow.query(name=Handler.SNAPSHOT)
    def snapshot(self) -> RunSnapshot:
        snap = build_snapshot(self._run_id, self._m.s, workflow.get_current_details() or None)
        snap.trace_id = run_trace_id()
        return snap

    @workflow.query(name=Handler.TRANSCRIPT)
    def transcript(self, offset: int, limit: int | None = None) -> TranscriptPage:
        return transcript_page(self._m.s.transcript, offset, limit)

    # -- responses ----------------------------------------------------------------

    @workflow.update(name=Handler.RESPOND)
    async def respond(self, *payload: Any) -> RespondAccepted:
        with refusals():
            return await self._take(parse_request(RespondRequest, payload, Handler.RESPOND))

    @respond.validator
    def _validate_respond(self, *payload: Any) -> None:
        with refusals():
            self._m.check_response(admit_request(RespondRequest, payload, Handler.RESPOND))

    @workflow.update(name=Handler.RESPOND_MANY)
    async def respond_many(self, *payload: Any) -> RespondManyAccepted:
        with refusals():
            request = parse_request(RespondManyRequest, payload, Handler.RESPOND_MANY)
            return RespondManyAccepted(accepted=await self._take_many(request.responses))

    @respond_many.validator
    def _validate_respond_many(self, *payload: Any) -> None:
        with refusals():
            request = admit_request(RespondManyRequest, payload, Handler.RESPOND_MANY)
            self._m.check_many(request.responses)

    @workflow.signal(dynamic=True)
    async def _signal(self, name: str, payload: Sequence[RawValue]) -> None:
        """Every signal; only `respond_signal` is durably's (the `respond` rules for callers
        that can only signal: the Temporal CLI, the Web UI).

        A signal cannot be refused, so a rejected one is recorded as a run
        event saying why instead of raising. Handled as a dynamic signal so
        that the payload is decoded here: the SDK drops a signal whose
        payload it cannot decode with only a worker log line, and buffers
        one with an unknown name forever, both invisible to the operator
        who sent it.
        """
        if name == Handler.REPAIR:  # before any other job of its task: see `_repair`
            await self._repair(payload)
            return
        if self._signals_commute():
            # One condition pass first. temporalio 1.35 runs an activation's signals, and
            # the waits they free, before it applies the activation's other jobs, so today
            # this changes no order; with the SDK's single-batch flag (off by default, not
            # set by durably) it puts the signal after the other jobs' continuations. What
            # makes a split commute today are the waits below (`PATCH_SIGNALS_COMMUTE`).
            await workflow.wait_condition(lambda: True)
        if name == Handler.SESSION_ADVANCED and self._in_failed_session_run():
            self._advanced = True
            return
        if (
            name == Handler.SESSION_ADVANCED
            and self._m.s.session is not None
            and workflow.patched(PATCH_ADVANCE_KEPT)
        ):
            await self._session_went_ahead()
            return
        if name == Handler.CHILD_STATUS and (
            self._m.s.children or (self._commute and self._starting)
        ):
            await self._child_status(payload)
            return
        if name != Handler.RESPOND_SIGNAL:
            self._m.event(
                EventType.SIGNAL_REJECTED,
                detail=f"unknown signal {short(name, 100)}; durably takes "
                f"{Handler.RESPOND_SIGNAL.value!r} (or the 'respond' update)",
            )
            return
        try:
            args = tuple(decode_signal(raw) for raw in payload)
            if len(args) == 1 and isinstance(args[0], list):  # several, all or none
                batch = parse_request(
                    RespondManyRequest, ({"responses": args[0]},), Handler.RESPOND_SIGNAL
                )
                await self._until_answered()
                await self._take_many(batch.responses)
            else:
                request = parse_request(RespondRequest, args, Handler.RESPOND_SIGNAL)
                await self._until_answered()
                await self._take(request)
        except Rejected as err:
            self._m.event(EventType.RESPONSE_REJECTED, detail=f"{err.kind}: {err.message}")

    def _read_signal(self, model: type[M], payload: Sequence[RawValue], handler: str) -> M | None:
        """A signal's payload as `model`, or None once a `signal_rejected` event says why
        not (a signal cannot be refused)."""
        try:
            args = tuple(decode_signal(raw) for raw in payload)
            parsed: M = parse_request(model, args, handler)
        except Rejected as err:
            self._m.event(EventType.SIGNAL_REJECTED, detail=f"{err.kind}: {err.message}")
            return None
        return parsed

    def _signals_commute(self) -> bool:
        """Whether signals are handled as `PATCH_SIGNALS_COMMUTE` says: asked when the run
        handles its first signal (the first thing that signal's activation does, live and
        on replay), so runs that never take one record no marker for it."""
        if self._commute is None:
            self._commute = workflow.patched(PATCH_SIGNALS_COMMUTE)
        return self._commute

    async def _repair(self, payload: Sequence[RawValue]) -> None:
        """`durably repair` reset this run: learn each discarded operation's fate from the
        worker (which reads it from the server, not from this signal) before any
        operation starts. The signal was sent before the reset, so it is in the new run's
        first task, and signals run first there."""
        workflow.patched(PATCH_REPAIR)
        request = self._read_signal(RepairRequest, payload, Handler.REPAIR)
        if request is None:
            return
        self._repairing += 1
        try:
            info = workflow.info()
            check = RepairCheck(workflow_id=info.workflow_id, run_id=info.run_id)
            plan = await verify_repair(check)
        except ActivityError as err:  # raised from a signal handler, it would fail the run
            plan = RepairPlan(refused=f"the worker could not read the reset ({describe(err)})")
        finally:
            self._repairing -= 1
        self._m.repaired(plan, request)
        self._publish()

    async def _until_answered(self) -> None:
        """A response that came while the model request is out waits for its answer, which
        may ask for it (see `RunMachine.answer_pending`; runs before the signals-commute
        patch refused it)."""
        m = self._m
        if self._commute and m.answer_pending():
            await workflow.wait_condition(lambda: not m.answer_pending())

    async def _take(self, request: RespondRequest) -> RespondAccepted:
        """Accept a response (once; a repeat returns the first acceptance), or raise why not."""
        m = self._m
        accepted, new, response = m.check_response(request)
        if new and m.needs_signature(accepted):
            await self._verify_signature(request, response)
            # Other responses may have been decided meanwhile: check again.
            accepted, new, response = m.check_response(request)
        if new:
            m.accept_response(accepted, response)
        return accepted

    async def _take_many(self, requests: list[RespondRequest]) -> list[RespondAccepted]:
        """Accept every response of a batch, or none (raise why not)."""
        m = self._m
        checked = m.check_many(requests)
        signed = [
            (request, response)
            for request, (accepted, new, response) in zip(requests, checked, strict=True)
            if new and m.needs_signature(accepted)
        ]
        if signed:
            for request, response in signed:
                await self._verify_signature(request, response)
            checked = m.check_many(requests)  # others may have been decided meanwhile
        for accepted, new, response in checked:
            if new:
                m.accept_response(accepted, response)
        return [accepted for accepted, _, _ in checked]

    async def _verify_signature(
        self, request: RespondRequest, response: ApprovalResponse | Answer
    ) -> None:
        """Check a signed decision worker-side, with keys history never sees; raise if not."""
        m = self._m
        interaction = m.pending(request.interaction_id)
        assert interaction is not None and isinstance(response, ApprovalResponse)
        try:
            problem = await verify_approval(m.verification(request, response, interaction))
        except ActivityError as err:  # raised from a signal handler, it would fail the run
            problem = f"the worker could not check it ({describe(err)})"
        if problem:
            raise rejection(
                ErrorType.INVALID_RESPONSE,
                f"the decision on {interaction.id!r} was not accepted: {problem}",
            )

    # -- operator decisions ----------------------------------------------------------

    @workflow.update(name=Handler.RESOLVE_TOOL)
    def resolve_tool(self, *payload: Any) -> ResolveToolAccepted:
        with refusals():
            request = parse_request(ResolveToolRequest, payload, Handler.RESOLVE_TOOL)
            resolution = self._m.resolve(request)
        return ResolveToolAccepted(operation=request.operation, type=resolution.type)

    @resolve_tool.validator
    def _validate_resolve_tool(self, *payload: Any) -> None:
        with refusals():
            request = admit_request(ResolveToolRequest, payload, Handler.RESOLVE_TOOL)
            self._m.check_resolution(request)

    @workflow.update(name=Handler.RETRY)
    def retry(self, *payload: Any) -> RetryAccepted:
        with refusals():
            self._m.check_retry()
            parse_request(RetryRequest, payload, Handler.RETRY)
            previous = self._m.s.status
            return RetryAccepted(operation=self._m.retry(), previous_status=previous)

    @retry.validator
    def _validate_retry(self, *payload: Any) -> None:
        with refusals():
            if self._advanced or self._m.s.session_went_ahead:
                session = self._m.s.session
                raise rejection(
                    ErrorType.DURABLE_CONFLICT,
                    f"run {self._run_id!r}'s session {session.session_id if session else ''!r} "
                    "took a later submission: this run can no longer be retried (SPEC "
                    "section 13); submit again instead",
                )
            self._m.check_retry()
            admit_request(RetryRequest, payload, Handler.RETRY)

    # -- live events ----------------------------------------------------------------

    def _live_event(self, event: RunEvent) -> None:
        """A run event, as its followers read it live (`RunHandle.events`)."""
        s = self._m.s
        interaction = None
        if event.type == EventType.WAITING:
            pending = (i for i in pending_interactions(s) if i.operation == event.operation)
            interaction = next(pending, None)
            if interaction is not None and clipped(interaction.args) is None:
                interaction = interaction.model_copy(update={"args": {}})
        self._live.publish(
            LiveEvent(
                run_id=self._run_id,
                seq=event.seq,
                at=event.at,
                type=event.type,
                operation=event.operation,
                detail=event.detail,
                status=s.status,
                interaction=interaction,
                next_attempt_at=s.next_attempt_at if event.type == EventType.RETRY_WAIT else None,
                output=self._output() if event.type == EventType.RUN_COMPLETED else None,
                text=self._answer_text() if event.type == EventType.MODEL_COMPLETED else None,
                tool_calls=self._answer_calls() if event.type == EventType.MODEL_COMPLETED else [],
            )
        )

    def _answer_calls(self) -> list[ToolCall]:
        """The calls of the model's answer just committed, large arguments left out."""
        transcript = self._m.s.transcript
        last = transcript[-1] if transcript else None
        if not isinstance(last, AssistantMessage):
            return []
        return [
            c if clipped(c.arguments) is not None else c.model_copy(update={"arguments": {}})
            for c in last.tool_calls
        ]

    def _answer_text(self) -> str | None:
        """The model's answer just committed (what a follower's preview ends with)."""
        transcript = self._m.s.transcript
        last = transcript[-1] if transcript else None
        content = last.content if isinstance(last, AssistantMessage) else None
        return content[:_LIVE_TEXT_KEPT] if content else None

    def _output(self) -> str | None:
        outcome = self._m.s.outcome or {}
        output = outcome.get("output")
        return output if isinstance(output, str) else None

    def _live_only(self, type: EventType, key: OperationKey | None, detail: str | None) -> None:
        """An event followers see that the snapshot does not keep (an operation began)."""
        self._live.publish(
            LiveEvent(
                run_id=self._run_id,
                at=workflow.now(),
                type=type,
                operation=str(key) if key is not None else None,
                detail=detail,
                status=self._m.s.status,
            )
        )

    # -- state --------------------------------------------------------------------

    def _clock(self) -> datetime:
        return self._pin_clock or workflow.now()

    def _publish(self) -> None:
        """The one place a status shows outside the run: the search attributes that
        changed (each upsert is a history event) and, unless the run is running (then
        what it runs says it), its current details."""
        s = self._m.s
        wanted = {
            SA_STATUS.name: s.status.value,
            SA_AGENT.name: s.agent_id or None,
            SA_AGENT_VERSION.name: s.pin.version if s.pin else None,
            # What every operation of the run checks (`RunMachine.pin_check`).
            SA_FINGERPRINT.name: self._m.pin_check() if s.pin and self._seed_fidelity else None,
            # Set at the start by the run's session (`AgentSessionWorkflow`), if any.
            SA_SESSION.name: s.session.session_id if s.session else None,
        }
        updates: list[SearchAttributeUpdate[str]] = []
        for sa in SEARCH_ATTRIBUTES:
            value = wanted[sa.name]
            if value is not None and value != self._published[sa.name]:
                updates.append(sa.value_set(value))
                self._published[sa.name] = value
        if updates:
            workflow.upsert_search_attributes(updates)
            status_published(updates, s.agent_id)  # a metric: records no command
        self._show_details()
        self._report_to_session()
        self._report_to_parent()

    def _show_details(self) -> None:
        """The run's current details, unless it is running (then what it runs says it):
        what the Web UI and the snapshot show, never a command."""
        details = status_details(self._run_id, self._m.s, running=self._running)
        if details is not None:
            workflow.set_current_details(details)

    def _ends_advanced(self) -> bool:
        """A run of a session that went ahead of it ends, never to be retried: told while
        it was failed (`_advanced`, at its next park, as it always did), or confirmed while
        it ran again (at its next failure)."""
        went_ahead = self._m.s.session_went_ahead and self._in_failed_session_run()
        return self._advanced or went_ahead

    async def _session_went_ahead(self) -> None:
        """`session_advanced` reached this run while it runs again (its `retry()` raced
        the submission that went ahead of it): if its session confirms it took a later
        submission, the run is no longer retried, and ends when it next fails (SPEC
        section 13). Anyone may send the signal, so only the session's word counts."""
        session = self._m.s.session
        assert session is not None
        if self._advanced or self._m.s.session_went_ahead or self._asking_session:
            return  # known already, or being asked: one question at a time
        self._limits_apply()  # decided before the local activity (see `_decide_limits`)
        self._asking_session = True
        try:
            advanced = await confirm_advanced(session.session_id, self._run_id)
        finally:
            self._asking_session = False
        if advanced is None:
            self._m.event(
                EventType.SIGNAL_REJECTED,
                detail=f"{Handler.SESSION_ADVANCED.value}: session {session.session_id} did "
                "not answer whether it took a later submission; this run is retried as usual",
            )
        elif advanced:
            self._m.s.session_went_ahead = True
            self._m.event(
                EventType.SESSION_WENT_AHEAD,
                detail=f"session {session.session_id} took a later submission: this run is not "
                "retried again, and ends if it fails",
            )
        else:
            self._m.event(
                EventType.SIGNAL_REJECTED,
                detail=f"{Handler.SESSION_ADVANCED.value}: session {session.session_id} took no "
                "submission after this run",
            )

    def _in_failed_session_run(self) -> bool:
        return self._m.s.session is not None and self._m.s.status == RunStatus.FAILED

    def _report_to_session(self) -> None:
        """Tell the run's session when it fails (or runs again): a failed run does not
        keep the session's next submission waiting. Runs outside a session send nothing."""
        s = self._m.s
        parent = workflow.info().parent
        failed = s.status == RunStatus.FAILED
        if s.session is None or parent is None or failed == self._reported_failed:
            return
        self._reported_failed = failed
        note = RunStatusNote(run_id=self._run_id, status=s.status)
        session = workflow.get_external_workflow_handle(parent.workflow_id)
        self._notes.append(
            asyncio.create_task(self._send_note(session, note, SessionHandler.RUN_STATUS))
        )

    @staticmethod
    async def _send_note(
        to: workflow.ExternalWorkflowHandle[Any], note: BaseModel, name: str
    ) -> None:
        try:
            await to.signal(name, note)
        except Exception:  # it has closed: nobody waits on this run any more
            workflow.logger.info("a status note found its session or parent closed")


class _OverBudget(Exception):
    """A model request's next attempt would start over a usage limit: the run parks."""

    def __init__(self, why: Attention) -> None:
        super().__init__(why.reason)
        self.why = why


def _start_value(key: SearchAttributeKey[str]) -> str | None:
    return workflow.info().typed_search_attributes.get(key)


def _status_detail(s: RunState) -> str | None:
    """What a run waits for, in a few words, for its parent to show."""
    if s.status == RunStatus.WAITING:
        return "waiting for " + ", ".join(i.id for i in pending_interactions(s)[:5])
    if s.status == RunStatus.NEEDS_ATTENTION:
        reason = s.attention.reason if s.attention else "unknown"
        return f"needs attention ({reason}) on {s.blocked_operation}"
    if s.status == RunStatus.FAILED:
        return (s.error or "failed")[:500]
    if s.status == RunStatus.RETRY_WAIT:
        return f"model retry at {s.next_attempt_at:%H:%M:%S} UTC" if s.next_attempt_at else None
    return None
