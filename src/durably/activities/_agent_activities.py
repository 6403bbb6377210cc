"""The activities every run uses, dispatching through the live registry.

Their names are fixed (`durably.pin_agent`, `durably.model_request`,
`durably.tool_call`, `durably.restore_transcript` after a continue-as-new,
`durably.verify_origin` for a run a workflow started or continued into, and
`durably.verify_approval` for signed approvals), so histories never
depend on a user's function names and agents can be registered while the
worker runs. User code (models and tools) runs only here. The transcript a
model request or a restore needs is rebuilt by `durably._transcript`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import structlog
from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from durably._query_guard import ask
from durably._repair import fates_after, reset_of
from durably._transcript import (
    EMPTY_DIGEST,
    TranscriptCache,
    conversation,
    extend_digest,
    model_transcript,
    restored_transcript,
    transcript_page,
)
from durably.activities._heartbeat import TextPreviews, heartbeating
from durably.activities._origin import Callers, advanced_past, described_status, origin_problem
from durably.agents import AgentRegistration
from durably.approvals import ApprovalKeys
from durably.contract import (
    ACTIVITY_CONFIRM_ADVANCED,
    ACTIVITY_CONFIRM_STATUS,
    ACTIVITY_MODEL,
    ACTIVITY_PIN,
    ACTIVITY_RESTORE,
    ACTIVITY_RUN_TRANSCRIPT,
    ACTIVITY_TOOL,
    ACTIVITY_VERIFY_APPROVAL,
    ACTIVITY_VERIFY_ORIGIN,
    ACTIVITY_VERIFY_REPAIR,
    PIN_DIGEST_PREFIX,
    SESSION_WORKFLOW_TYPE,
    WORKFLOW_TYPE,
    AdvanceCheck,
    AgentPin,
    ErrorType,
    Handler,
    LeanToolResult,
    ModelCallInput,
    ModelCallResult,
    OriginCheck,
    PinRequest,
    RepairCheck,
    RepairPlan,
    RunTranscriptRequest,
    StatusCheck,
    ToolCallInput,
    TranscriptPage,
    TranscriptRestoreRequest,
    VerifyApprovalRequest,
    operation_id,
)
from durably.messages import (
    AssistantMessage,
    Message,
    ModelRequest,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from durably.models import classify_model_error
from durably.models._live_text import text_sink
from durably.pricing import cost_usd, price_for
from durably.registry import AgentRegistry
from durably.telemetry import instrumented
from durably.tools import ToolContext, ToolDrift, ToolError, render_result

__all__ = ["AgentActivities", "ErrorType"]

_log = structlog.get_logger("durably")
# Failures durably has logged already, as one line (`_log_failure`, `_log_refusal`):
# the SDK logs a benign failure at debug level, not as a warning with a traceback
# per attempt.
_LOGGED = ApplicationErrorCategory.BENIGN
_tracebacks = logging.getLogger("durably.activities")

# How long a cancelled tool may take to notice `abort_signal` and return.
_ABORT_GRACE = 5.0
# Call ids become part of activity ids, which the server limits to 1,000 characters.
_MAX_CALL_ID = 200
# Call ids become part of `{run_id}/{chain}/tool:{turn}:{call_id}`: escaping "/" (and
# "%", and controls) keeps that key injective, and terminals safe.
_UNSAFE_IN_CALL_ID = re.compile(r"[%/\x00-\x1f\x7f-\x9f]")
# An activity result is one payload; Temporal refuses one over 2 MiB (its blob
# limit) with an error naming neither the cause nor the remedy.
_MAX_RESULT_BYTES = 2 * 2**20 - 64 * 2**10
# What the model reads about a call it may not make: enough to correct it.
_MAX_CALL_ERROR = 2_000


_MESSAGE_TYPES = (UserMessage, AssistantMessage, ToolResultMessage)


def _in_window(
    window: Callable[[Sequence[Message]], Sequence[Message]] | None,
    messages: tuple[Message, ...],
    key: str,
) -> tuple[Message, ...]:
    """What the model reads of `messages`: the agent's `context_window` of them, if any.
    A window that raises or returns something else fails the request, not retried (it
    would do the same again): fix it in a new version, then `retry()` the run."""
    if window is None:
        return messages
    try:
        chosen = tuple(window(messages))
        if not all(
            isinstance(m, (UserMessage, AssistantMessage, ToolResultMessage)) for m in chosen
        ):
            raise TypeError("it must return messages (durably.messages)")
    except Exception as exc:
        _log_failure("the agent's context_window failed", key, exc)
        raise ApplicationError(
            f"the agent's context_window failed: {type(exc).__name__}: {exc}",
            type=ErrorType.POST_PROCESSING,
            category=_LOGGED,
            non_retryable=True,
        ) from None
    return chosen


def _heartbeat_interval(timeout: timedelta | None) -> float:
    seconds = timeout.total_seconds() if timeout else 10.0
    return max(0.2, min(seconds / 4, 2.0))


class AgentActivities:
    """Activity implementations bound to one worker's registry and cache."""

    def __init__(
        self,
        registry: AgentRegistry,
        *,
        cache: TranscriptCache | None = None,
        approval_keys: ApprovalKeys | None = None,
    ) -> None:
        self.registry = registry
        self.cache = cache if cache is not None else TranscriptCache()
        self.approval_keys = approval_keys
        self.callers = Callers()

    def methods(self) -> list[Any]:
        return [
            self.pin_agent,
            self.model_request,
            self.tool_call,
            self.restore_transcript,
            self.run_transcript,
            self.verify_approval,
            self.verify_repair,
            self.verify_origin,
            self.confirm_status,
            self.confirm_advanced,
        ]

    # -- registration -------------------------------------------------------

    @activity.defn(name=ACTIVITY_PIN)
    async def pin_agent(self, request: PinRequest) -> AgentPin:
        """Resolve the registration a new run will use, and pin it."""
        registration = self.registry.get(request.agent_id, request.version)
        if registration is None:
            wanted = f"agent {request.agent_id!r}" + (
                f" version {request.version!r}" if request.version else ""
            )
            # The seed's `version_missing`: the run waits in needs_attention, having
            # called nothing, until the agent is registered and the run retried.
            _log_refusal("version_missing", request.agent_id, request.version)
            raise ApplicationError(
                f"{wanted} is not registered on this worker (it hosts: "
                f"{self.registry.describe()}). Register it with DurableRuntime.register_agents "
                "or `durably worker --agents module:attr`, then retry the run.",
                {
                    "reason": "version_missing",
                    "agent_id": request.agent_id,
                    "version": request.version,
                },
                type=ErrorType.VERSION_MISSING,
                category=_LOGGED,
                non_retryable=True,
            )
        return registration.pin()

    def _registration(self, agent_id: str, version: str, fingerprint: str) -> AgentRegistration:
        """The exact registration a run pinned, or a non-retryable error saying why not.

        `fingerprint` is a digest of the whole pin the run applies
        (`PIN_DIGEST_PREFIX`), or for runs started by 0.1.0 the fingerprint.
        """
        registration = self.registry.get(agent_id, version)
        if registration is None:
            _log_refusal("version_missing", agent_id, version)
            raise ApplicationError(
                f"agent {agent_id!r} version {version!r} is not registered on this worker "
                f"(it hosts: {self.registry.describe()}). Register that version again, then "
                "retry the run.",
                {"reason": "version_missing", "agent_id": agent_id, "version": version},
                type=ErrorType.VERSION_MISSING,
                category=_LOGGED,
                non_retryable=True,
            )
        expected = (
            registration.pin_check
            if fingerprint.startswith(PIN_DIGEST_PREFIX)
            else registration.fingerprint
        )
        if fingerprint != expected:
            _log_refusal("version_incompatible", agent_id, version)
            raise ApplicationError(
                f"agent {agent_id!r} version {version!r} on this worker differs from the one "
                "the run started with (model, instructions, tools or policies changed). Register "
                "the original definition under this version and a new definition under a new "
                "version, then retry the run. (A run whose pinned settings were altered, not "
                "by this worker, fails this check too: it cannot apply other policies.)",
                {"reason": "version_incompatible", "agent_id": agent_id, "version": version},
                type=ErrorType.VERSION_INCOMPATIBLE,
                category=_LOGGED,
                non_retryable=True,
            )
        return registration

    # -- model --------------------------------------------------------------

    @activity.defn(name=ACTIVITY_MODEL)
    @instrumented("model")  # a `chat` span (with tracing on) and counters, per attempt
    async def model_request(self, call: ModelCallInput) -> ModelCallResult:
        """One model request; invalid tool calls in the answer are marked, never run."""
        await self.callers.confirm()
        registration = self._registration(call.agent_id, call.version, call.fingerprint)
        agent = registration.agent
        run_id = _run_id()
        previews = TextPreviews(call.key, call.attempt or activity.info().attempt)
        # Heartbeat from the start: rebuilding the transcript may query the
        # workflow, which waits out a dead worker's sticky queue first.
        interval = _heartbeat_interval(activity.info().heartbeat_timeout)
        async with heartbeating(interval, previews.details):
            messages = await model_transcript(self.cache, run_id, call)
            before: tuple[list[Message], str] = ([], EMPTY_DIGEST)
            if call.prefix is not None:  # a session's run reads the conversation first
                before = await conversation(self.cache, call.prefix)
            # Every message was validated when it was made: skip doing it again
            # for the whole transcript on every turn.
            request = ModelRequest.model_construct(
                instructions=agent.instructions,
                messages=_in_window(agent.context_window, (*before[0], *messages), call.key),
                tools=agent.tool_specs,
            )
            try:
                with text_sink(previews.add):
                    response = await agent.model.request(request)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Without model_retry a failed request is final; a crash (timeout) still retries.
                verdict = classify_model_error(agent.model, exc)
                _log_failure("model request failed", call.key, exc, attempt=call.attempt)
                raise ApplicationError(
                    f"model request failed: {type(exc).__name__}: {exc}",
                    # This attempt and Temporal's earlier ones (workers that died) count.
                    {"usage": {"requests": activity.info().attempt}},
                    type=ErrorType.MODEL_ERROR,
                    category=_LOGGED,
                    non_retryable=registration.model_retry is None or not verdict.retryable,
                    next_retry_delay=verdict.retry_after,
                ) from None  # the traceback stays in the worker's log, not in history
        usage = _priced(registration, response.usage, activity.info().attempt)
        try:
            message = _normalise_calls(response.message)
            result = ModelCallResult(
                message=message,
                usage=usage,
                call_errors=_call_errors(registration, message.tool_calls),
            )
        except Exception as exc:
            # Post-processing is deterministic: retrying it would fail the same way.
            _log_failure("the model's answer could not be processed", call.key, exc)
            raise ApplicationError(
                f"the model's answer could not be processed: {type(exc).__name__}: {exc}",
                # The request was answered (and billed): the run counts what it used.
                {"usage": usage.model_dump()},
                type=ErrorType.POST_PROCESSING,
                category=_LOGGED,
                non_retryable=True,
            ) from None
        _check_result_size(
            result,
            "the model's answer",
            "have the model answer in less",
            {"usage": usage.model_dump()},  # the request was answered (and billed)
        )
        if message.tool_calls:
            self.cache.put_output(run_id, call.key, message)
        else:  # a final answer: the run completes and needs its transcript no more
            self.cache.forget(run_id)
            if call.prefix is not None:
                # What the session's next run reads: this run's transcript after the
                # conversation, which the session appends once this run has closed.
                conversation_now = [*before[0], *messages, message]
                digest = before[1]
                for m in (*messages, message):
                    digest = extend_digest(digest, m)
                self.cache.store(call.prefix.session_id, conversation_now, digest)
        return result

    # -- continue-as-new ----------------------------------------------------

    @activity.defn(name=ACTIVITY_RESTORE)
    async def restore_transcript(self, request: TranscriptRestoreRequest) -> TranscriptPage:
        """A page of the transcript a continued-as-new run left in its predecessor.

        The worker that ran the last turn has it cached; any other worker
        reads it once from the previous run (a query, which replays that
        run's history) and serves the remaining pages from its cache.
        """
        await self.callers.confirm((WORKFLOW_TYPE, SESSION_WORKFLOW_TYPE))
        run_id = _run_id()
        async with heartbeating(_heartbeat_interval(activity.info().heartbeat_timeout)):
            messages = await restored_transcript(self.cache, run_id, request)
        return transcript_page(messages, request.offset)

    @activity.defn(name=ACTIVITY_RUN_TRANSCRIPT)
    async def run_transcript(self, request: RunTranscriptRequest) -> TranscriptPage:
        """A page of a closed run's own transcript, for the session that ran it: the
        session keeps each run's messages once, whatever later happens to the run's
        history (namespace retention deletes it)."""
        await self.callers.confirm((SESSION_WORKFLOW_TYPE,))
        handle = activity.client().get_workflow_handle(request.run_id)
        async with heartbeating(_heartbeat_interval(activity.info().heartbeat_timeout)):
            page = await ask(
                handle, Handler.TRANSCRIPT, request.offset, result_type=TranscriptPage, patient=True
            )
        return page

    # -- tools --------------------------------------------------------------

    @activity.defn(name=ACTIVITY_TOOL)
    @instrumented("tool")  # an `execute_tool` span (with tracing on) and counters
    async def tool_call(self, call: ToolCallInput) -> ToolResultMessage:
        """Run one tool call; `ToolError` is a result, anything else is uncertain."""
        await self.callers.confirm()
        registration = self._registration(call.agent_id, call.version, call.fingerprint)
        tool = registration.agent.tool(call.call.name)
        info = activity.info()
        run_id = _run_id()
        op_id = operation_id(run_id, call.chain, call.key)
        if tool is None:  # the model activity rejects these; kept for direct callers
            return _error_result(call.call, f"unknown tool {call.call.name!r}")
        try:
            args = tool.input_model.model_validate(call.call.arguments)
        except ValidationError as exc:
            return _error_result(call.call, _validation_message(exc))
        abort = asyncio.Event()
        ctx = ToolContext(
            operation_id=op_id,
            run_id=run_id,
            agent_id=call.agent_id,
            agent_version=call.version,
            attempt=info.attempt,
            abort_signal=abort,
            logger=_log.bind(run_id=run_id, operation_id=op_id, tool=tool.name),
            _heartbeat=activity.heartbeat,
        )
        task = asyncio.create_task(tool.execute(args, ctx), name=f"durably-tool-{tool.name}")
        try:
            async with heartbeating(_heartbeat_interval(info.heartbeat_timeout)):
                value = await asyncio.shield(task)
        except asyncio.CancelledError:
            abort.set()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, _ABORT_GRACE)
            raise
        except ToolError as exc:
            result = _error_result(call.call, str(exc) or type(exc).__name__)
        except ToolDrift as exc:  # nothing was called: the run parks until definitions agree
            _log_refusal("version_incompatible", call.agent_id, call.version)
            raise ApplicationError(
                f"tool {tool.name!r} of agent {call.agent_id!r} version {call.version!r} was "
                f"not called: {exc}",
                {
                    "reason": "version_incompatible",
                    "agent_id": call.agent_id,
                    "version": call.version,
                    "tool": tool.name,
                },
                type=ErrorType.VERSION_INCOMPATIBLE,
                category=_LOGGED,
                non_retryable=True,
            ) from None
        except Exception as exc:
            _log_failure("tool raised", call.key, exc)
            raise ApplicationError(
                f"tool {tool.name!r} raised {type(exc).__name__}: {exc}",
                type=ErrorType.TOOL_CRASHED,
                category=_LOGGED,
            ) from None  # the traceback (paths, source lines) stays in the worker's log
        else:
            try:
                output = tool.validate_output(value)
            except ValidationError as exc:
                raise ApplicationError(
                    f"tool {tool.name!r} returned a value that does not fit its output model: "
                    f"{_validation_message(exc)}",
                    type=ErrorType.TOOL_CRASHED,
                ) from None
            result = ToolResultMessage(
                call_id=call.call.call_id, tool=tool.name, content=render_result(output)
            )
        _check_result_size(
            result,
            f"tool {tool.name!r}'s result",
            "make the tool return less (store a large result elsewhere and return where it "
            "is); its effect may have happened, so check before you resolve or rerun the call",
        )
        self.cache.put_output(run_id, call.key, result)
        return LeanToolResult.of(result)

    # -- repair ---------------------------------------------------------------

    @activity.defn(name=ACTIVITY_VERIFY_REPAIR)
    async def verify_repair(self, check: RepairCheck) -> RepairPlan:
        """What the reset that made this run discarded, read from the server, never from
        whoever signalled: a `repair` signal to a run that was not reset changes nothing.

        A local activity of the repaired run's first task, so the run learns every
        operation's fate before it schedules anything.
        """
        client = activity.client()
        own = client.get_workflow_handle(check.workflow_id, run_id=check.run_id)
        reset = reset_of((await own.fetch_history()).events, check.run_id)
        if reset is None:
            return RepairPlan(
                refused="this run was not reset (`durably repair RUN` resets a run whose "
                "history does not replay, then tells it what the reset discarded)"
            )
        failed = reset.workflow_task_failed_event_attributes
        base = client.get_workflow_handle(check.workflow_id, run_id=failed.base_run_id)
        events = (await base.fetch_history()).events
        return RepairPlan(
            base_run_id=failed.base_run_id,
            kept_through=failed.started_event_id,
            reason=failed.failure.message[:1_000],
            fates=await fates_after(events, failed.started_event_id, client.data_converter),
        )

    @activity.defn(name=ACTIVITY_VERIFY_ORIGIN)
    async def verify_origin(self, check: OriginCheck) -> str:
        """Why the run must not honour what the workflow it came from passed it, or ""
        (see `durably.activities._origin`): a local activity of the run's first task."""
        return await origin_problem(activity.client(), check)

    @activity.defn(name=ACTIVITY_CONFIRM_STATUS)
    async def confirm_status(self, check: StatusCheck) -> str:
        """The status a run publishes, read from the server: what a parent or a session
        applies when a note (a signal anyone may send) says a run's status changed."""
        return await described_status(activity.client(), check)

    @activity.defn(name=ACTIVITY_CONFIRM_ADVANCED)
    async def confirm_advanced(self, check: AdvanceCheck) -> bool:
        """Whether the run's session took a later submission, asked of the session."""
        return await advanced_past(activity.client(), check)

    # -- approvals ----------------------------------------------------------

    @activity.defn(name=ACTIVITY_VERIFY_APPROVAL)
    async def verify_approval(self, request: VerifyApprovalRequest) -> str:
        """Why a signed decision is not accepted, or "" if it is.

        Runs where the keys are (a local activity of the run's worker), so a
        key never enters history; the allow-list is this worker's
        registration, which the run's pin digest proves it applies.
        """
        registration = self._registration(request.agent_id, request.version, request.fingerprint)
        allowed = registration.approvers.get(request.tool)
        if allowed is None:
            return (
                f"tool {request.tool!r} has no approvers in this worker's registration of "
                f"agent {request.agent_id!r} version {request.version!r}"
            )
        if self.approval_keys is None:
            return (
                "this worker holds no approval keys, so it cannot check any signed decision; "
                "set DURABLY_APPROVAL_KEYS (or pass approval_keys=) on every worker, then "
                "respond again"
            )
        if request.approver not in allowed:  # the list itself is not told to callers
            return (
                f"{request.approver!r} may not decide on tool {request.tool!r}: not among its "
                "approvers on this worker's registration"
            )
        problem = self.approval_keys.problem(
            request.token,
            operation_id=request.operation_id,
            interaction_id=request.interaction_id,
            args_digest=request.args_digest,
            approved=request.approved,
            approver=request.approver,
            reason=request.reason,
        )
        return problem or ""


def _run_id() -> str:
    """The durable run id: the id of the workflow that scheduled this activity."""
    workflow_id = activity.info().workflow_id
    if workflow_id is None:
        raise ApplicationError(
            "durably activities run only inside AgentRunWorkflow", non_retryable=True
        )
    return workflow_id


def _log_refusal(reason: str, agent_id: str, version: str | None) -> None:
    """One line for an operation the version check refused (the run parks on it)."""
    info = activity.info()
    _log.warning(
        "the run's agent version is not hosted as it pinned it",
        run_id=info.workflow_id,
        operation=info.activity_id,
        attempt=info.attempt,
        reason=reason,
        agent=agent_id,
        version=version,
    )


def _log_failure(what: str, key: str, exc: BaseException, *, attempt: int | None = None) -> None:
    """The worker's log gets the story (history gets only the message): one line, and
    the traceback at debug level (stdlib logging: skipped cheaply unless enabled, and
    never rendered with its frames' local variables)."""
    info = activity.info()
    error = f"{type(exc).__name__}: {exc}"[:500]
    # A model request the run retries itself says which attempt it is (Temporal's is 1).
    attempt = attempt or info.attempt
    _log.warning(what, run_id=info.workflow_id, operation=key, attempt=attempt, error=error)
    _tracebacks.debug("%s (%s of run %s)", what, key, info.workflow_id, exc_info=exc)


def _check_result_size(
    result: Any, what: str, remedy: str, details: dict[str, Any] | None = None
) -> None:
    """Refuse, with a cause and a remedy, a result Temporal would refuse anyway."""
    size = len(result.model_dump_json())
    if size > _MAX_RESULT_BYTES:
        raise ApplicationError(
            f"{what} is {size:,} bytes, more than one activity result can hold "
            f"({_MAX_RESULT_BYTES:,} bytes, under Temporal's 2 MiB payload limit); {remedy}",
            *([details] if details else []),
            type=ErrorType.RESULT_TOO_LARGE,
            non_retryable=True,
        )


def _normalise_calls(message: AssistantMessage) -> AssistantMessage:
    """Give every call a unique, non-empty id: checkpoint keys are built from them."""
    seen: set[str] = set()
    calls: list[ToolCall] = []
    for i, c in enumerate(message.tool_calls, start=1):
        call_id = _UNSAFE_IN_CALL_ID.sub(_percent, c.call_id.strip()) or f"call_{i}"
        if len(call_id) > _MAX_CALL_ID:  # call ids become part of activity ids
            call_id = f"call_{i}_{hashlib.sha256(call_id.encode()).hexdigest()[:16]}"
        while call_id in seen:
            call_id = f"{call_id}_{i}"
        seen.add(call_id)
        calls.append(c if call_id == c.call_id else c.model_copy(update={"call_id": call_id}))
    return message.model_copy(update={"tool_calls": tuple(calls)})


def _percent(match: re.Match[str]) -> str:
    return f"%{ord(match.group()):02X}"


def _priced(registration: AgentRegistration, usage: Usage, attempt: int) -> Usage:
    """A request's usage as the run counts it: priced by the registration's prices, and
    counting Temporal's earlier attempts of it (a worker that died mid-request), whose
    tokens nobody reported."""
    # The answered request counts once whatever the model reports (a custom model may
    # report none), and each earlier attempt Temporal made of it once more; a task run's
    # built-in script asks no model.
    if not getattr(registration.agent.model, "asks_no_model", False):
        usage = usage.model_copy(update={"requests": max(1, usage.requests) + attempt - 1})
    price = price_for(registration.prices, registration.agent.model.identity)
    if price is not None:
        usage = usage.model_copy(update={"cost_usd": cost_usd(usage, price)})
    return usage


def _call_errors(registration: AgentRegistration, calls: tuple[ToolCall, ...]) -> dict[str, str]:
    errors: dict[str, str] = {}
    delegates = {s.name for s in registration.agent._subagents}
    owned = {t.name: t for t in registration.agent.tasks}
    for c in calls:
        tool = registration.agent.tool(c.name) or owned.get(c.name)
        if c.name in delegates:
            task = c.arguments.get("task") if c.raw_arguments is None else None
            if not isinstance(task, str) or not task.strip():
                errors[c.call_id] = f"{c.name!r} takes {{'task': '...'}}: what it should do"
        elif tool is None:
            known = ", ".join(s.name for s in registration.agent.tool_specs) or "none"
            errors[c.call_id] = f"unknown tool {c.name[:200]!r}; available tools: {known}"
        elif c.raw_arguments is not None:
            errors[c.call_id] = (
                f"arguments for {c.name!r} are not a JSON object: {c.raw_arguments[:500]!r}"
            )
        else:
            try:
                tool.input_model.model_validate(c.arguments)
            except ValidationError as exc:
                errors[c.call_id] = f"invalid arguments for {c.name!r}: {_validation_message(exc)}"
    # Each error goes back to the model inline: enough to correct the call, bounded.
    return {
        call_id: e if len(e) <= _MAX_CALL_ERROR else f"{e[:_MAX_CALL_ERROR]}... (cut)"
        for call_id, e in errors.items()
    }


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"]) or "(root)"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def _error_result(call: ToolCall, message: str) -> ToolResultMessage:
    return ToolResultMessage(call_id=call.call_id, tool=call.name, content=message, is_error=True)
