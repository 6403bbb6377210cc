"""`AgentRunWorkflow`: one durable agent run, model -> tools -> model.

Handlers:
    query ``snapshot`` -> RunSnapshot: the run as an operator sees it.
    update ``respond(RespondRequest)`` -> RespondAccepted: approve/deny a tool call
        or answer a question; the same response again returns the same acceptance.
    signal ``respond_signal(RespondRequest)``: the same, for callers that can only
        signal; a rejected response becomes a ``response_rejected`` event. Served by
        the dynamic signal handler, which sees raw payloads (and other names, which
        become ``signal_rejected`` events).
    query ``transcript(offset, limit=None)`` -> TranscriptPage: for workers whose
        cache missed.
    update ``resolve_tool(ResolveToolRequest)`` -> ResolveToolAccepted: supply the
        real outcome of an interrupted manual tool call (json / error / rerun).
    update ``retry(RetryRequest)`` -> RetryAccepted: run the failed operation again.

Validators only raise, and reject before anything reaches history; an
accepted update is applied in the same workflow task as the continuation
(a signed approval first waits for the worker's check, a local activity).
Every input is an outside caller's (SPEC section 20): the start input is read
by `_run_input`, responses are bounded by `_validation`, and nothing a caller
sends is stored a second time.

Deterministic orchestration only: every model request and tool call is an
activity (`durably.model_request`, `durably.tool_call`) keyed by a
checkpoint key (`model:{turn}`, `tool:{turn}:{call_id}`), so nothing that
committed ever runs again on replay.

The failure this module is built around: an agent loop that sends its
whole transcript to the model activity on every turn stores the transcript
again in history each turn, so history grows with the square of the run's
length and long runs die at Temporal's history limit. Here a model request
carries only the messages added since the previous one, results produced by
activities travel as references (`MessageRef`), and the model activity
rebuilds the transcript from its worker's cache or this workflow's
`transcript` query. History grows by each turn's own data, once.

Versioning discipline: 0.1.0 is the baseline (no patch in its code). Any
change to the commands this workflow issues, or their order, goes behind a
patch id listed in `PATCHES` and checked with ``self._patched(...)``; when
no run started before the change can still be open, switch to
``workflow.deprecate_patch(...)`` and drop the old branch; one release
later, drop the call. Each patch gets recorded histories in
``tests/histories/<patch id>/`` that CI replays, beside those of 0.1.0.

The workflow runs outside Temporal's sandbox (`sandboxed=False`): the
sandbox re-imports this module for every run and runs every activation
through `exec`, which cost a quarter of each workflow task and held
throughput at 0.73-0.85x a plain workflow's. No user code runs here, only
this module, and CI replays every recorded history inside the sandbox too,
which still catches a clock, randomness or I/O reached for here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any, NoReturn, TypeVar

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy, SearchAttributeKey, SearchAttributeUpdate
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    FailureError,
    is_cancelled_exception,
)
from temporalio.exceptions import CancelledError as TemporalCancelledError
from temporalio.exceptions import TimeoutError as ActivityTimeoutError
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from durably._digests import (
        EMPTY_DIGEST,
        args_digest,
        encoded_size,
        extend_digest,
        policy_digest,
    )
    from durably._text import md_code, md_text
    from durably._transcript_pages import transcript_page
    from durably.contract import (
        ACTIVITY_MODEL,
        ACTIVITY_PIN,
        ACTIVITY_RESTORE,
        ACTIVITY_TOOL,
        ACTIVITY_VERIFY_APPROVAL,
        CONTROL_CHARACTERS,
        INVALID_RUN_INPUT,
        MAX_NAME_CHARS,
        PIN_DIGEST_PREFIX,
        RESPOND_SIGNAL,
        SA_AGENT,
        SA_AGENT_VERSION,
        SA_STATUS,
        SEARCH_ATTRIBUTES,
        WORKFLOW_TYPE,
        AgentPin,
        ApprovalResponse,
        Attention,
        ErrorResolution,
        Interaction,
        JsonResolution,
        MessageRef,
        ModelCallInput,
        ModelCallResult,
        PinRequest,
        QuestionResponse,
        RerunResolution,
        ResolveToolAccepted,
        ResolveToolRequest,
        RespondAccepted,
        RespondRequest,
        RetryAccepted,
        RetryRequest,
        RetrySpec,
        RunEvent,
        RunInput,
        RunResult,
        RunSnapshot,
        RunState,
        RunStatus,
        ToolCallInput,
        ToolPolicy,
        TranscriptArchive,
        TranscriptPage,
        TranscriptRestoreRequest,
        VerifyApprovalRequest,
        operation_id,
    )
    from durably.messages import (
        AssistantMessage,
        Message,
        ToolCall,
        ToolResultMessage,
        UserMessage,
    )
    from durably.tools import render_result
    from durably.workflows._operator_text import (
        attention_details,
        failed_details,
        waiting_details,
    )
    from durably.workflows._run_input import (
        decode_arguments,
        one_raw_argument,
        read_run_input,
    )
    from durably.workflows._snapshot import build_snapshot
    from durably.workflows._validation import (
        check_resolution,
        check_response,
        check_retry,
        find_call,
        parse_request,
        rejection,
        short,
    )

__all__ = ["PATCHES", "PATCH_HARDENED", "AgentRunWorkflow"]


# What changed since 0.1.0 (see the module docstring): outside input is
# bounded and checked (start input, carried state, responses, signals);
# answers and large inputs reach the model by reference; operation ids
# include the chain's first run id; a parked or waiting run continues as new
# when its history nears the limit; signed approvals are verified.
PATCH_HARDENED = "durably-harden-outside-input"
# Every patch since 0.1.0, oldest first (see the module docstring).
PATCHES: tuple[str, ...] = (PATCH_HARDENED,)

T = TypeVar("T")
_EVENTS_KEPT = 50
_DETAIL_KEPT = 1_000
# The latest events of each of these kinds stay in the snapshot whatever
# else happens (a flood of rejected signals must not hide who approved what).
_AUDIT_KINDS = {
    "approved": "decision",
    "denied": "decision",
    "answered": "decision",
    "timed_out": "decision",
    "resolved_json": "resolution",
    "resolved_error": "resolution",
    "resolved_rerun": "resolution",
    "retried": "retry",
    "run_cancelled": "cancel",
}
# A run copies its predecessor's transcript into its own history; past this
# size, that copy plus a run's own growth would near Temporal's 50 MB
# history limit (and no model reads that much at once).
_MAX_CARRIED_TRANSCRIPT = 32 * 2**20
# What else continue-as-new carries, bounded: the answers a repeated response
# can still match (older repeats are rejected as unknown; the answers
# themselves stay in the transcript), and inline messages of the last turn.
_ANSWERS_CARRIED = 100
_ANSWERS_CARRIED_BYTES = 256 * 2**10
_DELTA_CARRIED = 64 * 2**10
# What continue-as-new may carry in all (one payload; Temporal refuses 2 MiB),
# and how long an operation's error message stays in state.
_MAX_CARRIED_STATE = 1536 * 2**10
_ERROR_KEPT = 2_000
# Text from outside (the run's input, an answer) larger than this reaches the
# model activity by reference, not as a second copy in its input.
_INLINE_LIMIT = 8 * 2**10
# Crashed model requests (worker died, timed out) run again even without
# model_retry: a model request has no side effect.
_MODEL_CRASH_ATTEMPTS = 3
_PARKED = (RunStatus.FAILED, RunStatus.NEEDS_ATTENTION)


@workflow.defn(name=WORKFLOW_TYPE, sandboxed=False)
class AgentRunWorkflow:
    """One durable agent run (see the module docstring for handlers)."""

    @workflow.init
    @one_raw_argument
    def __init__(self, *payload: Any) -> None:
        info = workflow.info()
        # First, before any command: every later decision depends on it.
        self._hardened = workflow.patched(PATCH_HARDENED)
        values, self._input_problem = decode_arguments(payload)
        input: RunInput | None = None
        if self._hardened:
            if self._input_problem is None:
                input, self._input_problem = read_run_input(values, info)
        elif self._input_problem is not None:  # 0.1.0 failed the task on it
            raise RuntimeError(self._input_problem)
        else:  # 0.1.0 trusted its input; its histories replay as they ran
            input = RunInput.model_validate(values[0])
        if input is None or self._input_problem is not None:
            self._s = RunState(
                agent_id=_agent_id_of(values),
                input="",
                digest=EMPTY_DIGEST,
                status=RunStatus.FAILED,
                error=self._input_problem,
                retryable=False,
            )
        else:
            self._s = input.carried or RunState(
                agent_id=input.agent_id,
                input=input.input,
                requested_version=input.version,
                digest=EMPTY_DIGEST,
                chain=info.first_execution_run_id if self._hardened else None,
            )
            if not self._s.input:  # carried without it: see _archived()
                self._s.input = input.input
        self._run_id = info.workflow_id
        # What an operator decided for the parked operation: a resolution, or
        # "retry" (None while nothing was decided).
        self._decision: JsonResolution | ErrorResolution | RerunResolution | str | None = None
        # A response's answer and reason, by interaction, until the run
        # consumes it (the acceptance keeps only a digest of them).
        self._texts: dict[str, tuple[str | None, str | None]] = {}
        self._published: dict[str, str | None] = {
            SA_STATUS.name: _start_value(SA_STATUS),
            SA_AGENT.name: _start_value(SA_AGENT),
            SA_AGENT_VERSION.name: _start_value(SA_AGENT_VERSION),
        }
        # History this run spent copying its predecessor's transcript in: not
        # counted toward continuing as new again.
        self._base_events = 0
        self._base_bytes = 0
        # The transcript is too large to carry: waits stop trying.
        self._cannot_continue = False
        # The time events get until the pin's workflow task ends: a local
        # activity's completion moves `workflow.now()` differently on replay.
        self._pin_clock: datetime | None = None
        self._pin_digest: str | None = None

    @workflow.run
    @one_raw_argument
    async def run(self, *payload: Any) -> RunResult:
        s = self._s
        if self._input_problem is not None:
            self._refuse_input(self._input_problem)
        workflow.set_current_details(f"Starting a run of agent {md_code(s.agent_id)}")
        self._show_what_it_waits_for()  # a run that continued as new while parked or waiting
        self._publish()
        try:
            if s.archive is not None:
                await self._restore(s.archive)
            if s.pin is None:
                s.pin = await self._operation("pin", self._pin)
                self._event("agent_pinned", detail=f"{s.pin.agent_id}@{s.pin.version}")
                self._pin_clock = None
                self._publish()  # DurablyAgentVersion, from the start of the run
                self._append(UserMessage(content=s.input), ref=self._outside_ref("input", s.input))
            pin = s.pin
            while True:
                # Calls of the last answer still without a result: a turn in progress
                # (also after continuing as new in the middle of one).
                for call in self._unfinished_calls():
                    await self._call(s.turns, call)
                if self._history_nearly_full():
                    await self._continue_as_new()
                    continue  # it could not: the run was parked, then decided on
                turn = s.turns + 1
                if turn > pin.max_turns:
                    await self._park(
                        RunStatus.FAILED,
                        error=(
                            f"the agent used all {pin.max_turns} turns (max_turns) without a "
                            "final answer; raise Agent.max_turns in a new version, or change the "
                            "instructions so the model finishes sooner"
                        ),
                        retryable=False,
                    )
                    continue
                answer = await self._operation(f"model:{turn}", partial(self._model, turn))
                s.turns = turn
                s.usage = s.usage + answer.usage
                calls = answer.message.tool_calls
                s.call_errors = dict(answer.call_errors)
                self._append(answer.message, ref=f"model:{turn}")
                self._event(
                    "model_completed",
                    f"model:{turn}",
                    f"{len(calls)} tool call(s)" if calls else "final answer",
                )
                if not calls:
                    if self._hardened:  # a response still being checked gets its answer
                        await workflow.wait_condition(workflow.all_handlers_finished)
                    return self._complete(answer.message.content)
        except asyncio.CancelledError:
            s.status = RunStatus.CANCELLED
            self._event("run_cancelled")
            workflow.set_current_details("Cancelled")
            self._publish()
            raise

    def _refuse_input(self, problem: str) -> NoReturn:
        """End a run whose start input durably cannot accept: failed, and visible as such."""
        self._event("run_failed", detail=problem)
        workflow.set_current_details(
            f"**Failed**: the run's input was refused: {md_text(problem)}\n\n"
            "Start a new run with a valid input."
        )
        self._publish()
        raise ApplicationError(
            f"durably refused this run's input: {problem}",
            type=INVALID_RUN_INPUT,
            non_retryable=True,
        )

    # -- a turn's tool calls ---------------------------------------------------------

    def _unfinished_calls(self) -> list[ToolCall]:
        """The calls of the latest model answer that have no result yet, in call order."""
        for results, message in enumerate(reversed(self._s.transcript)):
            if isinstance(message, AssistantMessage):
                return list(message.tool_calls[results:])
            if not isinstance(message, ToolResultMessage):
                return []
        return []

    async def _call(self, turn: int, call: ToolCall) -> None:
        """One call of the turn, to its committed result (in the transcript)."""
        s = self._s
        pin = _require(s.pin)
        key = f"tool:{turn}:{call.id}"
        rejected = s.call_errors.get(call.id)
        if rejected is not None:
            self._append(_error_result(call, rejected))
            self._event("tool_rejected", key, rejected)
            return
        policy = pin.tools[call.name]
        # Parked on this call (continued as new while blocked): it was approved already.
        if (policy.requires_approval or policy.question) and not self._parked_on(key):
            answered = await self._interact(turn, key, call, policy)
            if answered is not None:  # denied, answered, or timed out
                iid = _interaction_id(turn, call, policy)
                self._append(answered, ref=self._outside_ref(f"answer:{iid}", answered.content))
                return
        outcome = await self._operation(
            key, partial(self._tool, key, call), resolve=partial(_resolved, call)
        )
        result = outcome.message
        ref = (
            key if outcome.from_activity else self._outside_ref(f"resolution:{key}", result.content)
        )
        self._append(result, ref=ref)
        self._event(outcome.event, key, result.content[:200] if result.is_error else call.name)

    def _outside_ref(self, ref: str, text: str) -> str | None:
        """Send `text` to the model activity by reference when it is large (hardened runs):
        it is in history once already, as the run's input or a person's response."""
        if self._hardened and len(text.encode("utf-8", "surrogatepass")) > _INLINE_LIMIT:
            return ref
        return None

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
        pin = self._s.pin
        events = pin.continue_as_new_events if pin else _DEFAULT_CAN_EVENTS
        size = pin.continue_as_new_bytes if pin else _DEFAULT_CAN_BYTES
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
            and self._s.archive is None
            and self._history_nearly_full()
        )

    async def _continue_as_new(self) -> None:
        """Continue as new (this never returns), unless what it carries is too large."""
        await workflow.wait_condition(workflow.all_handlers_finished)
        carried, problem = self._carried()
        if carried is None:
            self._cannot_continue = True
            await self._park(RunStatus.FAILED, error=problem or "", retryable=False)
            return
        workflow.continue_as_new(carried)

    def _carried(self) -> tuple[RunInput | None, str | None]:
        """What continuing as new carries, or None and why it cannot."""
        s = self._s
        size = sum(encoded_size(m) for m in s.transcript)
        if size > _MAX_CARRIED_TRANSCRIPT:
            return None, _transcript_too_large(size)
        # The input travels once: in the transcript once the run has pinned.
        text = s.input if not self._hardened or s.pin is None else ""
        carried = RunInput(agent_id=s.agent_id, input=text, carried=self._archived())
        if self._hardened:
            size = len(carried.model_dump_json())  # once per continue-as-new
            if size > _MAX_CARRIED_STATE:
                return None, (
                    f"the state this run would carry past continue-as-new is {size:,} bytes, "
                    f"more than one payload may hold ({_MAX_CARRIED_STATE:,}); this is a bug "
                    "in durably, please report it, and cancel the run"
                )
        return carried, None

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
            carried, problem = self._carried()
            if carried is None:  # keep waiting here, saying why
                self._cannot_continue = True
                self._event("continue_as_new_refused", detail=problem)
                continue
            workflow.continue_as_new(carried)

    def _archived(self) -> RunState:
        """The state to continue as new with, of a bounded size however long the run.

        The transcript stays in this run's history; the run's input travels
        once; only the latest answers are carried.
        """
        s = self._s
        # Nothing large carried twice: a waiting or blocked call's large arguments are
        # taken from the transcript again after the restore (the snapshot shows them
        # empty until then).
        lean: dict[str, Any] = {
            "answered": _latest_answers(s.answered),
            "outcome": None,
            "call_errors": {
                c.id: s.call_errors[c.id] for c in self._unfinished_calls() if c.id in s.call_errors
            },
        }
        if s.interaction is not None and _large(s.interaction.args):
            lean["interaction"] = s.interaction.model_copy(update={"args": {}, "question": None})
        if s.attention is not None and _large(s.attention.detail.get("args")):
            detail = {k: v for k, v in s.attention.detail.items() if k != "args"}
            lean["attention"] = s.attention.model_copy(update={"detail": detail})
        if not s.transcript:  # nothing to restore (parked before the pin)
            return s.model_copy(update={**lean, "input": ""})
        base_length, new = s.sent_length, self._unsent()
        if sum(encoded_size(m) for m in new if not isinstance(m, MessageRef)) > _DELTA_CARRIED:
            # Long answers since the last request: restore by query, not from a cache.
            base_length, new = len(s.transcript), []
        archive = TranscriptArchive(
            run_id=workflow.info().run_id,
            length=len(s.transcript),
            digest=s.digest,
            base_length=base_length,
            new=new,
        )
        # The restored transcript is whole: the next request sends only what follows it.
        return s.model_copy(
            update={
                "input": "",
                "transcript": [],
                "archive": archive,
                "sent_length": len(s.transcript),
                "refs": {},
                **lean,
            }
        )

    async def _restore(self, archive: TranscriptArchive) -> None:
        """Copy the transcript the previous run kept into this run's history, page by page."""
        s = self._s
        if s.status == RunStatus.RUNNING:  # else the details keep saying what it waits for
            workflow.set_current_details(
                f"Restoring the transcript ({archive.length} messages) from the previous run "
                f"{md_code(archive.run_id)}"
            )
        while len(s.transcript) < archive.length:
            offset = len(s.transcript)
            restore = partial(self._restore_page, archive, offset)
            if self._hardened:
                page = await self._restore_or_end(f"restore:{offset}", restore)
            else:
                page = await self._operation(f"restore:{offset}", restore)
            s.transcript.extend(page.messages[: archive.length - offset])
        s.archive = None
        self._event("transcript_restored", detail=f"{archive.length} messages")
        info = workflow.info()
        self._base_events = info.get_current_history_length()
        self._base_bytes = info.get_current_history_size()

    async def _restore_or_end(
        self, key: str, restore: Callable[[], Awaitable[TranscriptPage]]
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
            s = self._s
            s.interaction = None
            s.outcome = None
            s.blocked_operation = None
            s.attention = None
            error = f"the transcript could not be restored: {_describe(err)}"
            await self._park(RunStatus.FAILED, error=error, key=key, retryable=False)
            raise AssertionError(
                "a run that cannot restore its transcript is never retried"
            ) from err

    # -- queries ----------------------------------------------------------------

    @workflow.query
    def snapshot(self) -> RunSnapshot:
        return build_snapshot(self._run_id, self._s, workflow.get_current_details() or None)

    @workflow.query
    def transcript(self, offset: int, limit: int | None = None) -> TranscriptPage:
        return transcript_page(self._s.transcript, offset, limit)

    # -- responses ----------------------------------------------------------------

    @workflow.update(name="respond")
    async def respond(self, *payload: Any) -> RespondAccepted:
        return await self._take(parse_request(RespondRequest, payload, "respond"))

    @respond.validator
    def _validate_respond(self, *payload: Any) -> None:
        request = parse_request(RespondRequest, payload, "respond")
        check_response(self._run_id, self._s, request, strict=self._hardened)

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
        if name != RESPOND_SIGNAL:
            self._event(
                "signal_rejected",
                detail=f"unknown signal {short(name, 100)}; durably takes {RESPOND_SIGNAL!r} "
                "(or the 'respond' update)",
            )
            return
        try:
            args = tuple(_decode(raw) for raw in payload)
            await self._take(parse_request(RespondRequest, args, RESPOND_SIGNAL))
        except ApplicationError as err:
            self._event("response_rejected", detail=f"{err.type}: {err.message}")

    async def _take(self, request: RespondRequest) -> RespondAccepted:
        """Accept a response (once; a repeat returns the first acceptance), or raise why not."""
        accepted, new, response = check_response(
            self._run_id, self._s, request, strict=self._hardened
        )
        if new and self._needs_signature(accepted):
            await self._verify_signature(request, response)
            # Other responses may have been decided meanwhile: check again.
            accepted, new, response = check_response(
                self._run_id, self._s, request, strict=self._hardened
            )
        if new:
            self._accept_response(accepted, response)
        return accepted

    def _needs_signature(self, accepted: RespondAccepted) -> bool:
        pending = self._s.interaction
        return (
            self._hardened
            and accepted.type == "tool-approval"
            and pending is not None
            and pending.id == accepted.interaction_id
            and pending.signed
        )

    async def _verify_signature(
        self, request: RespondRequest, response: ApprovalResponse | QuestionResponse
    ) -> None:
        """Check a signed decision worker-side, with keys history never sees; raise if not."""
        interaction = self._s.interaction
        assert interaction is not None and isinstance(response, ApprovalResponse)
        try:
            problem = await self._verify(request, response, interaction)
        except ActivityError as err:  # raised from a signal handler, it would fail the run
            problem = f"the worker could not check it ({_describe(err)})"
        if problem:
            raise rejection(
                "InvalidResponseError",
                f"the decision on {interaction.id!r} was not accepted: {problem}",
            )

    async def _verify(
        self,
        request: RespondRequest,
        response: ApprovalResponse,
        interaction: Interaction,
    ) -> str:
        pin = _require(self._s.pin)
        problem: str = await workflow.execute_local_activity(
            ACTIVITY_VERIFY_APPROVAL,
            VerifyApprovalRequest(
                agent_id=pin.agent_id,
                version=pin.version,
                fingerprint=self._pin_check(),
                tool=interaction.tool,
                operation_id=interaction.operation_id or "",
                interaction_id=interaction.id,
                args_digest=interaction.args_digest,
                approved=response.approved,
                approver=request.responder,
                token=response.token,
                reason=response.reason,
            ),
            result_type=str,
            start_to_close_timeout=timedelta(seconds=10),
            retry_policy=RetryPolicy(maximum_attempts=3),
            summary=f"verify approval {interaction.id}",
        )
        return problem

    def _accept_response(
        self, accepted: RespondAccepted, response: ApprovalResponse | QuestionResponse
    ) -> None:
        self._s.answered[accepted.interaction_id] = accepted
        reason = response.reason if isinstance(response, ApprovalResponse) else None
        answer = response.answer if isinstance(response, QuestionResponse) else None
        self._texts[accepted.interaction_id] = (reason, answer)
        who = f" by {accepted.responder}" if accepted.responder else ""
        if accepted.identity:
            who += f" (client {accepted.identity}; both self-declared)"
        if accepted.type == "question":
            self._event("answered", accepted.interaction_id, f"answered{who}")
        else:
            verdict = "approved" if accepted.approved else "denied"
            because = f": {reason}" if reason else ""
            self._event(verdict, accepted.interaction_id, f"{verdict}{who}{because}")

    # -- operator decisions ----------------------------------------------------------

    @workflow.update(name="resolve_tool")
    def resolve_tool(self, *payload: Any) -> ResolveToolAccepted:
        request = parse_request(ResolveToolRequest, payload, "resolve_tool")
        resolution = check_resolution(self._run_id, self._s, request, strict=self._hardened)
        self._decision = resolution
        return ResolveToolAccepted(operation=request.operation, type=resolution.type)

    @resolve_tool.validator
    def _validate_resolve_tool(self, *payload: Any) -> None:
        self._check_resolution(parse_request(ResolveToolRequest, payload, "resolve_tool"))

    def _check_resolution(
        self, request: ResolveToolRequest
    ) -> JsonResolution | ErrorResolution | RerunResolution:
        """The validator's check, plus: no decision is already on its way (updates that
        arrive in one workflow task are validated before the run leaves needs_attention).
        Only the validator checks this, so replaying older histories is unaffected."""
        resolution = check_resolution(self._run_id, self._s, request, strict=self._hardened)
        if self._decision is not None:
            decided = self._decision if isinstance(self._decision, str) else self._decision.type
            raise rejection(
                "DurableConflictError",
                f"run {self._run_id!r} already accepted a {decided} decision for "
                f"{short(request.operation)}; it is being applied",
            )
        return resolution

    @workflow.update(name="retry")
    def retry(self, *payload: Any) -> RetryAccepted:
        check_retry(self._run_id, self._s)
        parse_request(RetryRequest, payload, "retry")
        s = self._s
        accepted = RetryAccepted(
            operation=s.blocked_operation or s.failed_operation, previous_status=s.status
        )
        self._decision = "retry"
        return accepted

    @retry.validator
    def _validate_retry(self, *payload: Any) -> None:
        check_retry(self._run_id, self._s)
        parse_request(RetryRequest, payload, "retry")

    # -- operations ---------------------------------------------------------------

    async def _interact(
        self, turn: int, key: str, call: ToolCall, policy: ToolPolicy
    ) -> ToolResultMessage | None:
        """Wait for a person; None means approved (the call runs), else the call's result."""
        s = self._s
        kind = "question" if policy.question else "tool-approval"
        iid = _interaction_id(turn, call, policy)
        timeout = policy.approval_timeout_s
        if s.interaction is not None and s.interaction.id == iid:
            # Resumed after continuing as new while waiting; the arguments were left
            # in the transcript, not carried.
            interaction = s.interaction.model_copy(
                update={"args": call.arguments, "question": _question(call, policy)}
            )
            s.interaction = interaction
        else:
            interaction = Interaction(
                id=iid,
                type=kind,
                operation=key,
                tool=call.name,
                args=call.arguments,
                args_digest=args_digest(call.arguments),
                question=_question(call, policy),
            )
            if self._hardened:
                interaction.operation_id = operation_id(self._run_id, s.chain, key)
                interaction.signed = policy.signed_approval and not policy.question
                if timeout:
                    interaction.expires_at = workflow.now() + timedelta(seconds=timeout)
            s.status = RunStatus.WAITING
            s.interaction = interaction
            if not self._hardened:  # later runs derive it in the snapshot: one copy of the args
                s.outcome = {
                    "type": "interaction",
                    "interaction": interaction.model_dump(mode="json"),
                }
            self._event("waiting", key, f"{kind} {interaction.id}")
            self._publish()
        workflow.set_current_details(waiting_details(self._run_id, interaction))
        until = interaction.expires_at
        if until is None and timeout:  # 0.1.0 kept no deadline
            until = workflow.now() + timedelta(seconds=timeout)
        answered = await self._wait(
            lambda: interaction.id in s.answered, until=until, summary=f"{kind} timeout {iid}"
        )
        if not answered:
            what = "question" if policy.question else "approval"
            s.answered[interaction.id] = RespondAccepted(
                interaction_id=interaction.id,
                type=kind,
                approved=False,
                reason=f"{what} timed out",
                args_digest=interaction.args_digest,
            )
            self._event("timed_out", interaction.id, f"no response within {timeout:g} s")
        accepted = s.answered[interaction.id]
        reason, answer = self._texts.pop(interaction.id, (accepted.reason, accepted.answer))
        s.status = RunStatus.RUNNING
        s.interaction = None
        s.outcome = None
        self._publish()
        if accepted.type == "question" and answer is not None:
            return ToolResultMessage(call_id=call.id, tool=call.name, content=answer)
        if accepted.approved:
            return None
        return _error_result(call, f"denied: {reason or 'no reason given'}")

    def _pin_check(self) -> str:
        """What activities compare with their registration: the fingerprint (0.1.0), or
        a digest of the policies the run applies (not just a copyable name)."""
        pin = _require(self._s.pin)
        if not self._hardened:
            return pin.fingerprint
        if self._pin_digest is None:
            self._pin_digest = PIN_DIGEST_PREFIX + policy_digest(pin)
        return self._pin_digest

    async def _pin(self) -> AgentPin:
        s = self._s
        workflow.set_current_details(f"Resolving the registration of agent {md_code(s.agent_id)}")
        request = PinRequest(agent_id=s.agent_id, version=s.requested_version)
        # In the run's first workflow task, as a local activity: a round trip
        # and an activity fewer per run.
        self._pin_clock = workflow.now()
        pin: AgentPin = await workflow.execute_local_activity(
            ACTIVITY_PIN,
            request,
            result_type=AgentPin,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=3),
            activity_id="pin",
            summary=f"pin agent {s.agent_id}",
        )
        return pin

    async def _model(self, turn: int) -> ModelCallResult:
        s = self._s
        pin = _require(s.pin)
        key = f"model:{turn}"
        new = self._unsent()
        call = ModelCallInput(
            agent_id=pin.agent_id,
            version=pin.version,
            fingerprint=self._pin_check(),
            key=key,
            base_length=s.sent_length,
            new=new,
            digest=s.digest,
        )
        workflow.set_current_details(f"Waiting for the model (turn {turn} of {pin.max_turns})")
        retry = pin.model_retry or RetrySpec(max_attempts=_MODEL_CRASH_ATTEMPTS)
        result: ModelCallResult = await workflow.execute_activity(
            ACTIVITY_MODEL,
            call,
            result_type=ModelCallResult,
            start_to_close_timeout=timedelta(seconds=pin.model_start_to_close_s),
            heartbeat_timeout=timedelta(seconds=pin.model_heartbeat_timeout_s),
            retry_policy=_retry_policy(retry),
            cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            activity_id=key,
            summary=f"model turn {turn}",
        )
        s.sent_length = len(s.transcript)
        s.refs.clear()
        return result

    def _unsent(self) -> list[Message | MessageRef]:
        """What the model has not seen yet: activity results by reference, the rest inline."""
        s = self._s
        return [
            MessageRef(ref=s.refs[i]) if i in s.refs else m
            for i, m in enumerate(s.transcript[s.sent_length :], start=s.sent_length)
        ]

    async def _restore_page(self, archive: TranscriptArchive, offset: int) -> TranscriptPage:
        page: TranscriptPage = await workflow.execute_activity(
            ACTIVITY_RESTORE,
            TranscriptRestoreRequest(archive=archive, offset=offset),
            result_type=TranscriptPage,
            start_to_close_timeout=timedelta(minutes=10),
            heartbeat_timeout=timedelta(seconds=30),
            retry_policy=(
                RetryPolicy(maximum_attempts=0, maximum_interval=timedelta(minutes=1))
                if self._hardened
                else RetryPolicy(maximum_attempts=10)
            ),
            activity_id=f"restore:{offset}",
            summary=f"restore transcript from message {offset}",
        )
        if not page.messages:  # fail the task (it retries), never the run
            raise RuntimeError(
                f"restoring the transcript returned no messages at {offset} of {archive.length}; "
                "this is a bug in durably, please report it"
            )
        return page

    async def _tool(self, key: str, call: ToolCall) -> _ToolOutcome:
        s = self._s
        pin = _require(s.pin)
        policy = pin.tools[call.name]
        workflow.set_current_details(
            f"Running tool {md_code(call.name)} ({md_code(key)}, recovery: {policy.recovery})"
        )
        result: ToolResultMessage = await workflow.execute_activity(
            ACTIVITY_TOOL,
            ToolCallInput(
                agent_id=pin.agent_id,
                version=pin.version,
                fingerprint=self._pin_check(),
                key=key,
                call=call,
                chain=s.chain,
            ),
            result_type=ToolResultMessage,
            start_to_close_timeout=timedelta(seconds=policy.start_to_close_s),
            heartbeat_timeout=timedelta(seconds=policy.heartbeat_timeout_s),
            retry_policy=_retry_policy(policy.retry),
            cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            activity_id=key,
            summary=f"tool {call.name}",
        )
        return _ToolOutcome(result, "tool_error" if result.is_error else "tool_completed")

    async def _operation(
        self,
        key: str,
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
        while True:
            if self._parked_on(key):
                decision = await self._park_until_decided(key)
            else:
                try:
                    result = await op()
                # A local activity (the pin) fails with its own error, not an ActivityError.
                except (
                    ActivityError,
                    ApplicationError,
                    ActivityTimeoutError,
                    TemporalCancelledError,
                ) as err:
                    if is_cancelled_exception(err):
                        # The run was cancelled while this activity ran; it has stopped.
                        raise asyncio.CancelledError() from err
                    status, attention = self._classify(key, err)
                    decision = await self._park(
                        status, error=_describe(err), key=key, attention=attention
                    )
                else:
                    # An operation that completes while the run is being cancelled hands
                    # back its result and erases the cancellation (WAIT_CANCELLATION_COMPLETED).
                    if workflow.cancellation_reason() is not None:
                        raise asyncio.CancelledError()
                    return result
            if isinstance(decision, JsonResolution | ErrorResolution) and resolve:
                return resolve(decision)

    def _parked_on(self, key: str | None) -> bool:
        s = self._s
        return s.status in _PARKED and key == (s.blocked_operation or s.failed_operation)

    def _classify(self, key: str, err: FailureError) -> tuple[RunStatus, Attention | None]:
        """Which status a failed operation leaves the run in."""
        cause = _cause(err)
        if isinstance(cause, ApplicationError) and cause.details:
            detail = cause.details[0]
            if isinstance(detail, dict) and detail.get("reason") in (
                "version_missing",
                "version_incompatible",
            ):
                return RunStatus.NEEDS_ATTENTION, Attention(
                    reason=detail["reason"], detail={**detail, "last_error": _describe(err)}
                )
        if key.startswith("tool:"):
            pin = _require(self._s.pin)
            call = find_call(self._s, key)
            policy = pin.tools[call.name]
            if policy.recovery == "manual":
                return RunStatus.NEEDS_ATTENTION, Attention(
                    reason="tool_interrupted",
                    detail={
                        "tool": call.name,
                        "args": call.arguments,
                        "attempts": policy.retry.max_attempts,
                        "last_error": _describe(err),
                    },
                )
        return RunStatus.FAILED, None

    async def _park(
        self,
        status: RunStatus,
        *,
        error: str,
        key: str | None = None,
        attention: Attention | None = None,
        retryable: bool = True,
    ) -> JsonResolution | ErrorResolution | RerunResolution | str:
        """Hold the run open in `failed`/`needs_attention` until an operator decides."""
        s = self._s
        if not (self._parked_on(key) and s.status == status and s.error in (None, error)):
            self._decision = None
            s.status = status
            s.error = error if status == RunStatus.FAILED else None
            s.failed_operation = key if status == RunStatus.FAILED else None
            s.blocked_operation = key if status == RunStatus.NEEDS_ATTENTION else None
            s.attention = attention
            s.retryable = retryable
            if status == RunStatus.NEEDS_ATTENTION:
                self._event("needs_attention", key, attention.reason if attention else error)
            else:
                self._event("run_failed", key, error)
            self._publish()
        return await self._park_until_decided(key)

    async def _park_until_decided(
        self, key: str | None
    ) -> JsonResolution | ErrorResolution | RerunResolution | str:
        s = self._s
        attention = s.attention
        # A blocked call's arguments are not carried past continue-as-new.
        interrupted = attention is not None and attention.reason == "tool_interrupted"
        if attention and interrupted and key and "args" not in attention.detail:
            args = find_call(s, key).arguments
            s.attention = attention.model_copy(
                update={"detail": {**attention.detail, "args": args}}
            )
        self._show_what_it_waits_for()
        await self._wait(lambda: self._decision is not None)
        self._pin_clock = None
        decision = self._decision
        assert decision is not None
        self._decision = None
        kind = decision if isinstance(decision, str) else decision.type
        self._event("retried" if kind == "retry" else f"resolved_{kind}", key)
        s.status = RunStatus.RUNNING
        s.error = None
        s.failed_operation = None
        s.blocked_operation = None
        s.attention = None
        s.retryable = True
        self._publish()
        return decision

    # -- state --------------------------------------------------------------------

    def _show_what_it_waits_for(self) -> None:
        """Current details of a parked or waiting run (nothing for a running one)."""
        s = self._s
        if s.status == RunStatus.NEEDS_ATTENTION:
            key = s.blocked_operation
            error = _attention_error(s)
            workflow.set_current_details(attention_details(self._run_id, key, s.attention, error))
        elif s.status == RunStatus.FAILED:
            workflow.set_current_details(failed_details(self._run_id, s.error or "", s.retryable))
        elif s.status == RunStatus.WAITING and s.interaction is not None:
            workflow.set_current_details(waiting_details(self._run_id, s.interaction))

    def _append(self, message: Message, *, ref: str | None = None) -> None:
        s = self._s
        if ref is not None:
            s.refs[len(s.transcript)] = ref
        s.transcript.append(message)
        s.digest = extend_digest(s.digest, message)

    def _complete(self, output: str | None) -> RunResult:
        s = self._s
        s.status = RunStatus.COMPLETED
        s.outcome = {"type": "completed", "output": output}
        self._event("run_completed", detail=(output or "")[:200])
        workflow.set_current_details(f"Completed after {s.turns} turn(s)")
        self._publish()
        return RunResult(run_id=self._run_id, output=output, turns=s.turns, usage=s.usage)

    def _event(self, type: str, operation: str | None = None, detail: str | None = None) -> None:
        s = self._s
        if detail is not None and len(detail) > _DETAIL_KEPT:
            detail = f"{detail[:_DETAIL_KEPT]}... ({len(detail)} characters)"
        last = s.events[-1] if s.events else None
        if (
            last is not None
            and type in _COALESCED
            and (last.type, last.operation, last.detail) == (type, operation, detail)
        ):
            last.count += 1  # the same rejection again: a counter, not another entry
            return
        s.event_seq += 1
        event = RunEvent(
            seq=s.event_seq,
            at=self._pin_clock or workflow.now(),
            type=type,
            operation=operation,
            detail=detail,
        )
        s.events.append(event)
        del s.events[:-_EVENTS_KEPT]
        kind = _AUDIT_KINDS.get(type)
        if kind is not None:
            s.audit.append(event)
            same = [e for e in s.audit if _AUDIT_KINDS[e.type] == kind]
            if len(same) > _EVENTS_KEPT:
                s.audit.remove(same[0])

    def _publish(self) -> None:
        """Upsert the search attributes that changed (each upsert is a history event)."""
        s = self._s
        wanted = {
            SA_STATUS.name: s.status.value,
            SA_AGENT.name: s.agent_id or None,
            SA_AGENT_VERSION.name: s.pin.version if s.pin else None,
        }
        updates: list[SearchAttributeUpdate[str]] = []
        for sa in SEARCH_ATTRIBUTES:
            value = wanted[sa.name]
            if value is not None and value != self._published[sa.name]:
                updates.append(sa.value_set(value))
                self._published[sa.name] = value
        if updates:
            workflow.upsert_search_attributes(updates)


@dataclass(frozen=True)
class _ToolOutcome:
    """A tool call's committed result and how it came to be."""

    message: ToolResultMessage
    event: str
    from_activity: bool = True


# Thresholds before the pin names the registration's (AgentRegistration defaults).
_DEFAULT_CAN_EVENTS = AgentPin.model_fields["continue_as_new_events"].default
_DEFAULT_CAN_BYTES = AgentPin.model_fields["continue_as_new_bytes"].default
# Events that repeat in a row become one entry with a count.
_COALESCED = {"response_rejected", "signal_rejected"}


def _resolved(call: ToolCall, resolution: JsonResolution | ErrorResolution) -> _ToolOutcome:
    """The result an operator supplied for an interrupted call."""
    if isinstance(resolution, JsonResolution):
        message = ToolResultMessage(
            call_id=call.id, tool=call.name, content=render_result(resolution.value)
        )
        return _ToolOutcome(message, "tool_resolved", from_activity=False)
    return _ToolOutcome(_error_result(call, resolution.message), "tool_resolved", False)


def _interaction_id(turn: int, call: ToolCall, policy: ToolPolicy) -> str:
    return f"{'question' if policy.question else 'approval'}:{turn}:{call.id}"


def _agent_id_of(payload: tuple[Any, ...]) -> str:
    """The agent a refused input names, if it names one plainly (for the run's listing)."""
    raw = payload[0] if len(payload) == 1 and isinstance(payload[0], dict) else {}
    agent_id = raw.get("agent_id")
    if (
        isinstance(agent_id, str)
        and 0 < len(agent_id) <= MAX_NAME_CHARS
        and not CONTROL_CHARACTERS.search(agent_id)
    ):
        return agent_id
    return ""


def _decode(raw: RawValue) -> Any:
    """A signal's payload, or a rejection saying why it could not be read."""
    try:
        return workflow.payload_converter().from_payload(raw.payload)
    except Exception as err:
        encoding = raw.payload.metadata.get("encoding", b"").decode(errors="replace")
        raise rejection(
            "InvalidResponseError",
            f"{RESPOND_SIGNAL} takes a JSON RespondRequest object; its payload could not be "
            f"decoded (encoding {short(encoding, 60)}: {short(str(err), 200)})",
        ) from None


def _attention_error(s: RunState) -> str:
    detail = s.attention.detail if s.attention else {}
    return str(detail.get("last_error") or (s.attention.reason if s.attention else "unknown"))


def _start_value(key: SearchAttributeKey[str]) -> str | None:
    return workflow.info().typed_search_attributes.get(key)


def _require(pin: AgentPin | None) -> AgentPin:
    if pin is None:
        raise ApplicationError("internal: the run has no pinned agent", non_retryable=True)
    return pin


def _retry_policy(spec: RetrySpec) -> RetryPolicy:
    return RetryPolicy(
        maximum_attempts=spec.max_attempts,
        initial_interval=timedelta(milliseconds=spec.initial_delay_ms),
        maximum_interval=timedelta(milliseconds=spec.max_delay_ms),
        backoff_coefficient=2.0,
    )


def _cause(err: FailureError) -> BaseException | None:
    """What made an operation fail: an activity's cause, or a local activity's own error."""
    return err.cause if isinstance(err, ActivityError) else err


def _describe(err: FailureError) -> str:
    """An operation's failure in words, bounded: it is kept in state and carried."""
    cause = _cause(err)
    if isinstance(cause, ActivityTimeoutError):
        return f"activity timed out ({cause.type.name if cause.type else 'unknown'})"
    text = str(cause.message if hasattr(cause, "message") else cause) if cause else str(err)
    if len(text) > _ERROR_KEPT:
        text = f"{text[:_ERROR_KEPT]}... ({len(text)} characters)"
    return text


def _large(value: Any) -> bool:
    """Too large to carry past continue-as-new beside the transcript that holds it too."""
    return value is not None and len(render_result(value)) > _INLINE_LIMIT


def _question(call: ToolCall, policy: ToolPolicy) -> str | None:
    return str(call.arguments.get("question", "")) if policy.question else None


def _latest_answers(answered: dict[str, RespondAccepted]) -> dict[str, RespondAccepted]:
    """The newest accepted responses that fit what continue-as-new carries."""
    kept: list[tuple[str, RespondAccepted]] = []
    size = 0
    for iid, accepted in reversed(answered.items()):
        size += len(accepted.model_dump_json())
        if len(kept) == _ANSWERS_CARRIED or size > _ANSWERS_CARRIED_BYTES:
            break
        kept.append((iid, accepted))
    return dict(reversed(kept))


def _transcript_too_large(size: int) -> str:
    return (
        f"the transcript has grown to {size / 2**20:.1f} MiB, more than a run can carry past "
        f"continue-as-new ({_MAX_CARRIED_TRANSCRIPT // 2**20} MiB) within Temporal's history "
        "limit, and more than a model reads at once; cancel this run and start a new one "
        "from a summary of it, or have the agent's tools return less"
    )


def _error_result(call: ToolCall, message: str) -> ToolResultMessage:
    return ToolResultMessage(call_id=call.id, tool=call.name, content=message, is_error=True)
