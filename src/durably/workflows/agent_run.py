"""`AgentRunWorkflow`: one durable agent run, model -> tools -> model.

Handlers:
    query ``snapshot`` -> RunSnapshot: the run as an operator sees it.
    update ``respond(RespondRequest)`` -> RespondAccepted: approve/deny a tool call
        or answer a question; the same response again returns the same acceptance.
    signal ``respond_signal(RespondRequest)``: the same, for callers that can only
        signal; a rejected response becomes a ``response_rejected`` event.
    query ``transcript(offset)`` -> TranscriptPage: for workers whose cache missed.
    update ``resolve_tool(ResolveToolRequest)`` -> ResolveToolAccepted: supply the
        real outcome of an interrupted manual tool call (json / error / rerun).
    update ``retry(RetryRequest)`` -> RetryAccepted: run the failed operation again.

Validators only raise, and reject before anything reaches history; an
accepted update is applied in the same workflow task as the continuation.

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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey, SearchAttributeUpdate
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
    from durably._digests import EMPTY_DIGEST, args_digest, encoded_size, extend_digest
    from durably._transcript_pages import transcript_page
    from durably.contract import (
        ACTIVITY_MODEL,
        ACTIVITY_PIN,
        ACTIVITY_RESTORE,
        ACTIVITY_TOOL,
        SA_AGENT,
        SA_AGENT_VERSION,
        SA_STATUS,
        SEARCH_ATTRIBUTES,
        WORKFLOW_TYPE,
        AgentPin,
        Attention,
        ErrorResolution,
        Interaction,
        JsonResolution,
        MessageRef,
        ModelCallInput,
        ModelCallResult,
        PinRequest,
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
    )
    from durably.messages import Message, ToolCall, ToolResultMessage, UserMessage
    from durably.tools import render_result
    from durably.workflows._validation import (
        check_resolution,
        check_response,
        check_retry,
        find_call,
        parse_request,
    )

__all__ = ["PATCHES", "AgentRunWorkflow"]

# Every patch since 0.1.0, oldest first (see the module docstring).
PATCHES: tuple[str, ...] = ()

T = TypeVar("T")
_EVENTS_KEPT = 50
_DETAIL_KEPT = 1_000
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
# Crashed model requests (worker died, timed out) run again even without
# model_retry: a model request has no side effect.
_MODEL_CRASH_ATTEMPTS = 3


@workflow.defn(name=WORKFLOW_TYPE, sandboxed=False)
class AgentRunWorkflow:
    """One durable agent run (see the module docstring for handlers)."""

    @workflow.init
    def __init__(self, input: RunInput) -> None:
        self._s: RunState = input.carried or RunState(
            agent_id=input.agent_id,
            input=input.input,
            requested_version=input.version,
            digest=EMPTY_DIGEST,
        )
        if not self._s.input:  # carried without it: see _archived()
            self._s.input = input.input
        self._run_id = workflow.info().workflow_id
        # What an operator decided for the parked operation: a resolution, or
        # "retry" (None while nothing was decided).
        self._decision: JsonResolution | ErrorResolution | RerunResolution | str | None = None
        self._published: dict[str, str | None] = {
            SA_STATUS.name: _start_value(SA_STATUS),
            SA_AGENT.name: _start_value(SA_AGENT),
            SA_AGENT_VERSION.name: _start_value(SA_AGENT_VERSION),
        }
        # History this run spent copying its predecessor's transcript in: not
        # counted toward continuing as new again.
        self._base_events = 0
        self._base_bytes = 0
        # The time events get until the pin's workflow task ends: a local
        # activity's completion moves `workflow.now()` differently on replay.
        self._pin_clock: datetime | None = None

    @workflow.run
    async def run(self, input: RunInput) -> RunResult:
        s = self._s
        workflow.set_current_details(f"Starting a run of agent `{s.agent_id}`")
        self._publish()
        try:
            if s.archive is not None:
                await self._restore(s.archive)
            if s.pin is None:
                s.pin = await self._operation("pin", self._pin)
                self._event("agent_pinned", detail=f"{s.pin.agent_id}@{s.pin.version}")
                self._pin_clock = None
                self._publish()  # DurablyAgentVersion, from the start of the run
                self._append(UserMessage(content=s.input))
            pin = s.pin
            while True:
                if self._history_nearly_full(pin):
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
                self._append(answer.message, ref=f"model:{turn}")
                self._event(
                    "model_completed",
                    f"model:{turn}",
                    f"{len(calls)} tool call(s)" if calls else "final answer",
                )
                if not calls:
                    return self._complete(answer.message.content)
                for call in calls:
                    key = f"tool:{turn}:{call.id}"
                    rejected = answer.call_errors.get(call.id)
                    if rejected is not None:
                        self._append(_error_result(call, rejected))
                        self._event("tool_rejected", key, rejected)
                        continue
                    policy = pin.tools[call.name]
                    if policy.requires_approval or policy.question:
                        answered = await self._interact(turn, key, call, policy)
                        if answered is not None:  # denied, answered, or timed out
                            self._append(answered)
                            continue
                    outcome = await self._operation(
                        key, partial(self._tool, key, call), resolve=partial(_resolved, call)
                    )
                    result = outcome.message
                    self._append(result, ref=key if outcome.from_activity else None)
                    self._event(
                        outcome.event,
                        key,
                        result.content[:200] if result.is_error else call.name,
                    )
        except asyncio.CancelledError:
            s.status = RunStatus.CANCELLED
            self._event("run_cancelled")
            workflow.set_current_details("Cancelled")
            self._publish()
            raise

    def _history_nearly_full(self, pin: AgentPin) -> bool:
        """Time to continue as new: the history is approaching Temporal's limits.

        Not at the server's suggestion (from 4,000 events by default), which
        copies the transcript into a new run far earlier than needed. What a
        run spent restoring its predecessor's transcript does not count:
        otherwise, once the transcript neared the threshold, every run would
        continue as new again at once.
        """
        info = workflow.info()
        return (
            info.get_current_history_length() - self._base_events >= pin.continue_as_new_events
            or info.get_current_history_size() - self._base_bytes >= pin.continue_as_new_bytes
        )

    async def _continue_as_new(self) -> None:
        """Continue as new (this never returns), unless the transcript is too large to carry."""
        s = self._s
        await workflow.wait_condition(workflow.all_handlers_finished)
        size = sum(encoded_size(m) for m in s.transcript)
        if size > _MAX_CARRIED_TRANSCRIPT:
            await self._park(RunStatus.FAILED, error=_transcript_too_large(size), retryable=False)
            return
        workflow.continue_as_new(
            RunInput(agent_id=s.agent_id, input=s.input, carried=self._archived())
        )

    def _archived(self) -> RunState:
        """The state to continue as new with, of a bounded size however long the run.

        The transcript stays in this run's history; the run's input travels
        once, as `RunInput.input`; only the latest answers are carried.
        """
        s = self._s
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
                "answered": _latest_answers(s.answered),
            }
        )

    async def _restore(self, archive: TranscriptArchive) -> None:
        """Copy the transcript the previous run kept into this run's history, page by page."""
        s = self._s
        workflow.set_current_details(
            f"Restoring the transcript ({archive.length} messages) from the previous run "
            f"`{archive.run_id}`"
        )
        while len(s.transcript) < archive.length:
            offset = len(s.transcript)
            page = await self._operation(
                f"restore:{offset}", partial(self._restore_page, archive, offset)
            )
            s.transcript.extend(page.messages[: archive.length - offset])
        s.archive = None
        self._event("transcript_restored", detail=f"{archive.length} messages")
        info = workflow.info()
        self._base_events = info.get_current_history_length()
        self._base_bytes = info.get_current_history_size()

    # -- queries ----------------------------------------------------------------

    @workflow.query
    def snapshot(self) -> RunSnapshot:
        s = self._s
        return RunSnapshot(
            run_id=self._run_id,
            agent_id=s.agent_id,
            agent_version=s.pin.version if s.pin else None,
            status=s.status,
            outcome=s.outcome,
            blocked_operation=s.blocked_operation,
            attention=s.attention,
            turns=s.turns,
            usage=s.usage,
            events=list(s.events),
            error=s.error,
            current=workflow.get_current_details() or None,
        )

    @workflow.query
    def transcript(self, offset: int) -> TranscriptPage:
        return transcript_page(self._s.transcript, offset)

    @workflow.update(name="respond")
    def respond(self, *payload: Any) -> RespondAccepted:
        request = parse_request(RespondRequest, payload, "respond")
        accepted, new = check_response(self._run_id, self._s, request)
        if new:
            self._accept_response(accepted)
        return accepted

    @respond.validator
    def _validate_respond(self, *payload: Any) -> None:
        request = parse_request(RespondRequest, payload, "respond")
        check_response(self._run_id, self._s, request)

    @workflow.signal(name="respond_signal")
    def respond_signal(self, *payload: Any) -> None:
        """The `respond` rules for callers that can only signal (Temporal CLI, Web UI).

        A signal cannot be refused, so a rejected response is recorded as a
        run event saying why, instead of raising.
        """
        try:
            request = parse_request(RespondRequest, payload, "respond_signal")
            accepted, new = check_response(self._run_id, self._s, request)
        except ApplicationError as err:
            self._event("response_rejected", detail=f"{err.type}: {err.message}")
            return
        if new:
            self._accept_response(accepted)

    @workflow.update(name="resolve_tool")
    def resolve_tool(self, *payload: Any) -> ResolveToolAccepted:
        request = parse_request(ResolveToolRequest, payload, "resolve_tool")
        resolution = check_resolution(self._run_id, self._s, request)
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
        resolution = check_resolution(self._run_id, self._s, request)
        if self._decision is not None:
            decided = self._decision if isinstance(self._decision, str) else self._decision.type
            raise ApplicationError(
                f"run {self._run_id!r} already accepted a {decided} decision for "
                f"{request.operation!r}; it is being applied",
                type="DurableConflictError",
                non_retryable=True,
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

    def _accept_response(self, accepted: RespondAccepted) -> None:
        self._s.answered[accepted.interaction_id] = accepted
        who = f" by {accepted.responder}" if accepted.responder else ""
        if accepted.type == "question":
            self._event("answered", accepted.interaction_id, f"answered{who}")
        else:
            verdict = "approved" if accepted.approved else "denied"
            reason = f": {accepted.reason}" if accepted.reason else ""
            self._event(verdict, accepted.interaction_id, f"{verdict}{who}{reason}")

    # -- operations ---------------------------------------------------------------

    async def _interact(
        self, turn: int, key: str, call: ToolCall, policy: ToolPolicy
    ) -> ToolResultMessage | None:
        """Wait for a person; None means approved (the call runs), else the call's result."""
        s = self._s
        kind = "question" if policy.question else "tool-approval"
        interaction = Interaction(
            id=f"{'question' if policy.question else 'approval'}:{turn}:{call.id}",
            type=kind,
            operation=key,
            tool=call.name,
            args=call.arguments,
            args_digest=args_digest(call.arguments),
            question=str(call.arguments.get("question", "")) if policy.question else None,
        )
        s.status = RunStatus.WAITING
        s.interaction = interaction
        s.outcome = {"type": "interaction", "interaction": interaction.model_dump(mode="json")}
        self._event("waiting", key, f"{kind} {interaction.id}")
        workflow.set_current_details(_waiting_details(interaction))
        self._publish()
        timeout = policy.approval_timeout_s
        try:
            await workflow.wait_condition(
                lambda: interaction.id in s.answered,
                timeout=timedelta(seconds=timeout) if timeout else None,
                timeout_summary=f"{kind} timeout {interaction.id}",
            )
        except TimeoutError:
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
        s.status = RunStatus.RUNNING
        s.interaction = None
        s.outcome = None
        self._publish()
        if accepted.type == "question" and accepted.answer is not None:
            return ToolResultMessage(call_id=call.id, tool=call.name, content=accepted.answer)
        if accepted.approved:
            return None
        return _error_result(call, f"denied: {accepted.reason or 'no reason given'}")

    async def _pin(self) -> AgentPin:
        s = self._s
        workflow.set_current_details(f"Resolving the registration of agent `{s.agent_id}`")
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
            fingerprint=pin.fingerprint,
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
            retry_policy=RetryPolicy(maximum_attempts=10),
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
        pin = _require(self._s.pin)
        policy = pin.tools[call.name]
        workflow.set_current_details(
            f"Running tool `{call.name}` ({key}, recovery: {policy.recovery})"
        )
        result: ToolResultMessage = await workflow.execute_activity(
            ACTIVITY_TOOL,
            ToolCallInput(
                agent_id=pin.agent_id,
                version=pin.version,
                fingerprint=pin.fingerprint,
                key=key,
                call=call,
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
        (so the same operation_id); a json/error resolution is its result.
        """
        while True:
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
                if isinstance(decision, JsonResolution | ErrorResolution) and resolve:
                    return resolve(decision)
                continue
            # An operation that completes while the run is being cancelled hands back its
            # result and erases the cancellation (WAIT_CANCELLATION_COMPLETED).
            cancelled = workflow.cancellation_reason() is not None
            if cancelled:
                raise asyncio.CancelledError()
            return result

    def _classify(self, key: str, err: FailureError) -> tuple[RunStatus, Attention | None]:
        """Which status a failed operation leaves the run in."""
        cause = _cause(err)
        if isinstance(cause, ApplicationError) and cause.details:
            detail = cause.details[0]
            if isinstance(detail, dict) and detail.get("reason") in (
                "version_missing",
                "version_incompatible",
            ):
                return RunStatus.NEEDS_ATTENTION, Attention(reason=detail["reason"], detail=detail)
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
        s.status = status
        s.error = error if status == RunStatus.FAILED else None
        s.failed_operation = key if status == RunStatus.FAILED else None
        s.blocked_operation = key if status == RunStatus.NEEDS_ATTENTION else None
        s.attention = attention
        s.retryable = retryable
        if status == RunStatus.NEEDS_ATTENTION:
            self._event("needs_attention", key, attention.reason if attention else error)
            workflow.set_current_details(_attention_details(key, attention, error))
        else:
            self._event("run_failed", key, error)
            workflow.set_current_details(
                f"**Failed**: {error}\n\nFix the cause, then retry the run."
            )
        self._publish()
        self._decision = None
        await workflow.wait_condition(lambda: self._decision is not None)
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
        s.event_seq += 1
        if detail is not None and len(detail) > _DETAIL_KEPT:
            detail = f"{detail[:_DETAIL_KEPT]}... ({len(detail)} characters)"
        s.events.append(
            RunEvent(
                seq=s.event_seq,
                at=self._pin_clock or workflow.now(),
                type=type,
                operation=operation,
                detail=detail,
            )
        )
        del s.events[:-_EVENTS_KEPT]

    def _publish(self) -> None:
        """Upsert the search attributes that changed (each upsert is a history event)."""
        s = self._s
        wanted = {
            SA_STATUS.name: s.status.value,
            SA_AGENT.name: s.agent_id,
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


def _resolved(call: ToolCall, resolution: JsonResolution | ErrorResolution) -> _ToolOutcome:
    """The result an operator supplied for an interrupted call."""
    if isinstance(resolution, JsonResolution):
        message = ToolResultMessage(
            call_id=call.id, tool=call.name, content=render_result(resolution.value)
        )
        return _ToolOutcome(message, "tool_resolved", from_activity=False)
    return _ToolOutcome(_error_result(call, resolution.message), "tool_resolved", False)


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
    cause = _cause(err)
    if isinstance(cause, ActivityTimeoutError):
        return f"activity timed out ({cause.type.name if cause.type else 'unknown'})"
    if cause is not None:
        return str(cause.message if hasattr(cause, "message") else cause)
    return str(err)


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


def _waiting_details(interaction: Interaction) -> str:
    args = render_result(interaction.args)
    if len(args) > 1_000:
        args = f"{args[:1_000]}... ({len(args)} characters; the snapshot has them all)"
    if interaction.type == "question":
        return (
            f"**Waiting for an answer** ({interaction.id}): {interaction.question}\n\n"
            f"Answer with `durably answer RUN TEXT --as NAME`."
        )
    return (
        f"**Waiting for approval** ({interaction.id}) of tool `{interaction.tool}` with "
        f"`{args}`\n\nApprove with `durably approve RUN --as NAME`, or deny with "
        "`durably deny RUN --reason ... --as NAME`."
    )


def _attention_details(key: str | None, attention: Attention | None, error: str) -> str:
    if attention is not None and attention.reason == "tool_interrupted":
        tool = attention.detail.get("tool")
        return (
            f"**Needs attention**: tool `{tool}` ({key}) was interrupted and its outcome is "
            f"unknown ({error}). Check in the external system whether it took effect, then "
            f"resolve the operation with its real result (`durably resolve RUN {key} ...`)."
        )
    reason = attention.reason if attention else "unknown"
    return f"**Needs attention** ({reason}): {error}"


def _error_result(call: ToolCall, message: str) -> ToolResultMessage:
    return ToolResultMessage(call_id=call.id, tool=call.name, content=message, is_error=True)
