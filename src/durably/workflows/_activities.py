"""Every activity the run executes, in one place, and what their failures mean.

Each activity has a fixed name that dispatches through the worker's registry
and an activity id equal to its checkpoint key (`OperationKey`), so a renamed
function or a new agent never changes a history. Retry settings come from
the pinned registration: a tool's from its recovery policy, the model's from
`model_retry`. Temporal glue only; the decisions are `RunMachine`'s.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, FailureError
from temporalio.exceptions import TimeoutError as ActivityTimeoutError
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

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
        AdvanceCheck,
        AgentPin,
        ModelCallInput,
        ModelCallResult,
        OperationKey,
        OriginCheck,
        PinRequest,
        RepairCheck,
        RepairPlan,
        RetrySpec,
        RunTranscriptRequest,
        StatusCheck,
        ToolCallInput,
        TranscriptArchive,
        TranscriptPage,
        TranscriptRestoreRequest,
        VerifyApprovalRequest,
    )
    from durably.messages import ToolResultMessage, Usage
    from durably.workflows._machine import PIN

__all__ = [
    "confirm_advanced",
    "confirm_status",
    "describe",
    "failed_attempt_usage",
    "failure_details",
    "model_request",
    "next_attempt_in",
    "pin_agent",
    "restore_page",
    "tool_call",
    "verify_approval",
    "verify_origin",
    "verify_repair",
]

R = TypeVar("R")
# Crashed model requests (worker died, timed out) run again even without
# model_retry: a model request has no side effect.
_MODEL_CRASH_ATTEMPTS = 3
# How long an operation's error message stays in state.
_ERROR_KEPT = 2_000


async def pin_agent(request: PinRequest) -> AgentPin:
    """The registration the run is pinned to, as a local activity in the run's first
    workflow task: a round trip and an activity fewer per run."""
    pin: AgentPin = await workflow.execute_local_activity(
        ACTIVITY_PIN,
        request,
        result_type=AgentPin,
        start_to_close_timeout=timedelta(seconds=30),
        retry_policy=RetryPolicy(maximum_attempts=3),
        activity_id=str(PIN),
        summary=f"pin agent {request.agent_id}",
    )
    return pin


async def model_request(
    pin: AgentPin,
    request: ModelCallInput,
    turn: int,
    *,
    one_attempt: bool = False,
    summary: bool = True,
) -> ModelCallResult:
    """A model request, retried by Temporal; or (`one_attempt`) a single attempt, which
    the workflow retries itself after a durable timer (see `next_attempt_in`). Without
    `summary` its activity id (`model:N`) says what it is, at no cost in history."""
    retry = pin.model_retry or RetrySpec(max_attempts=_MODEL_CRASH_ATTEMPTS)
    return await _execute(
        ACTIVITY_MODEL,
        request,
        ModelCallResult,
        key=request.key,
        summary=f"model turn {turn}" if summary else None,
        start_to_close_s=pin.model_start_to_close_s,
        heartbeat_s=pin.model_heartbeat_timeout_s,
        retry=RetryPolicy(maximum_attempts=1) if one_attempt else _retry_policy(retry),
    )


def next_attempt_in(err: FailureError, spec: RetrySpec, attempt: int) -> timedelta | None:
    """How long after failed attempt `attempt` the next one starts, as Temporal's own
    retry would wait (`initial * 2^(attempt-1)`, capped; a provider's `Retry-After`
    wins, if it is positive); None when there is none: the error says not to retry,
    or the attempts are used up. A crash (a timeout) counts as an attempt, as it does
    for Temporal."""
    cause = _cause(err)
    if isinstance(cause, ApplicationError) and cause.non_retryable:
        return None
    if attempt >= spec.max_attempts:
        return None
    asked = cause.next_retry_delay if isinstance(cause, ApplicationError) else None
    if asked is not None and asked > timedelta(0):  # a classifier's past date means now
        return asked
    doublings = min(attempt - 1, 32)  # past 2^32 the cap decides anyway
    delay_ms = min(spec.initial_delay_ms * 2**doublings, spec.max_delay_ms)
    return timedelta(milliseconds=delay_ms)


async def tool_call(pin: AgentPin, request: ToolCallInput) -> ToolResultMessage:
    policy = pin.tools[request.call.name]
    return await _execute(
        ACTIVITY_TOOL,
        request,
        ToolResultMessage,
        key=request.key,
        summary=f"tool {request.call.name}",
        start_to_close_s=policy.start_to_close_s,
        heartbeat_s=policy.heartbeat_timeout_s,
        retry=_retry_policy(policy.retry),
    )


async def restore_page(
    archive: TranscriptArchive, offset: int, *, hardened: bool
) -> TranscriptPage:
    """A page of the previous run's transcript; it has no side effect, so a hardened run
    retries it until it comes."""
    page: TranscriptPage = await workflow.execute_activity(
        ACTIVITY_RESTORE,
        TranscriptRestoreRequest(archive=archive, offset=offset),
        result_type=TranscriptPage,
        start_to_close_timeout=timedelta(minutes=10),
        heartbeat_timeout=timedelta(seconds=30),
        retry_policy=(
            RetryPolicy(maximum_attempts=0, maximum_interval=timedelta(minutes=1))
            if hardened
            else RetryPolicy(maximum_attempts=10)
        ),
        activity_id=str(OperationKey.restore(offset)),
        summary=f"restore transcript from message {offset}",
    )
    if not page.messages:  # fail the task (it retries), never the run
        raise RuntimeError(
            f"restoring the transcript returned no messages at {offset} of {archive.length}; "
            "this is a bug in durably, please report it"
        )
    return page


async def run_transcript(request: RunTranscriptRequest) -> TranscriptPage:
    """A page of a closed run's own transcript, for its session (retried until it is read:
    the session must not lose a run's messages to a worker restart)."""
    page: TranscriptPage = await workflow.execute_activity(
        ACTIVITY_RUN_TRANSCRIPT,
        request,
        result_type=TranscriptPage,
        start_to_close_timeout=timedelta(minutes=5),
        heartbeat_timeout=timedelta(seconds=30),
        retry_policy=RetryPolicy(maximum_attempts=0, maximum_interval=timedelta(minutes=1)),
        summary=f"read run {request.run_id} from message {request.offset}",
    )
    return page


async def verify_approval(request: VerifyApprovalRequest) -> str:
    """Why a signed decision is not valid ("" when it is), checked by the worker with
    keys history never sees."""
    problem: str = await workflow.execute_local_activity(
        ACTIVITY_VERIFY_APPROVAL,
        request,
        result_type=str,
        start_to_close_timeout=timedelta(seconds=10),
        retry_policy=RetryPolicy(maximum_attempts=3),
        summary=f"verify approval {request.interaction_id}",
    )
    return problem


async def confirm_advanced(session_id: str, run_id: str) -> bool | None:
    """Whether the session took a submission after this run, asked of the session by the
    worker (None if it did not answer in a minute: the signal then changes nothing)."""
    return await _read_within_a_minute(
        ACTIVITY_CONFIRM_ADVANCED,
        AdvanceCheck(session_id=session_id, run_id=run_id),
        bool,
        summary=f"ask session {session_id[:200]} whether it went ahead",
    )


async def confirm_status(run_id: str) -> str:
    """The status run `run_id` publishes now, read by the worker from the server ("" if it
    has none, or the server did not say in a minute): a status note is a signal, which
    anyone may send."""
    status = await _read_within_a_minute(
        ACTIVITY_CONFIRM_STATUS,
        StatusCheck(workflow_id=run_id),
        str,
        summary=f"read the status of {run_id[:200]}",
    )
    return status or ""


async def _read_within_a_minute(
    name: str, request: Any, result_type: type[R], *, summary: str
) -> R | None:
    """A local activity that reads what a signal claims from the server (or a workflow),
    None if no answer came within a minute: the signal then changes nothing, and the
    handler that waits for it ends (a run waits for its handlers before it completes)."""
    try:
        result: R = await workflow.execute_local_activity(
            name,
            request,
            result_type=result_type,
            start_to_close_timeout=timedelta(seconds=30),
            schedule_to_close_timeout=timedelta(seconds=60),
            retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=10)),
            summary=summary,
        )
    except ActivityError:
        return None
    return result


async def verify_origin(check: OriginCheck) -> str:
    """Why the run must not honour what its predecessor or parent passed it ("" if it
    may), confirmed by the worker with the server (`durably.activities._origin`).

    Retried without end: a server the worker cannot reach holds the run's first task
    (the SDK backs off with timers past a minute), and deciding without the answer
    would either trust a forgery or fail a genuine run.
    """
    problem: str = await workflow.execute_local_activity(
        ACTIVITY_VERIFY_ORIGIN,
        check,
        result_type=str,
        start_to_close_timeout=timedelta(seconds=30),
        retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=30)),
        summary="confirm where this run came from",
    )
    return problem


async def verify_repair(check: RepairCheck) -> RepairPlan:
    """What the reset that made this run discarded (see `durably._repair`), read by the
    worker from the server: the run's first task after a reset waits for it."""
    plan: RepairPlan = await workflow.execute_local_activity(
        ACTIVITY_VERIFY_REPAIR,
        check,
        result_type=RepairPlan,
        start_to_close_timeout=timedelta(seconds=60),
        retry_policy=RetryPolicy(maximum_attempts=5),
        summary="read what the repair's reset discarded",
    )
    return plan


async def _execute(
    name: str,
    request: Any,
    result_type: type[R],
    *,
    key: str,
    summary: str | None,
    start_to_close_s: float,
    heartbeat_s: float,
    retry: RetryPolicy,
) -> R:
    """An operation's activity: its id is its key, and a cancelled run waits for it to
    stop (`WAIT_CANCELLATION_COMPLETED`): its outcome is known before the run ends."""
    result: R = await workflow.execute_activity(
        name,
        request,
        result_type=result_type,
        start_to_close_timeout=timedelta(seconds=start_to_close_s),
        heartbeat_timeout=timedelta(seconds=heartbeat_s),
        retry_policy=retry,
        cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        activity_id=key,
        summary=summary,
    )
    return result


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


def describe(err: FailureError) -> str:
    """An operation's failure in words, bounded: it is kept in state and carried."""
    cause = _cause(err)
    if isinstance(cause, ActivityTimeoutError):
        return f"activity timed out ({cause.type.name if cause.type else 'unknown'})"
    text = str(cause.message if hasattr(cause, "message") else cause) if cause else str(err)
    if len(text) > _ERROR_KEPT:
        text = f"{text[:_ERROR_KEPT]}... ({len(text)} characters)"
    return text


def failed_attempt_usage(err: FailureError) -> Usage:
    """What a failed model request used: one request (or the attempts its activity made,
    when Temporal retried it after a crash), plus the tokens and cost of an answer the
    provider gave that could not be kept."""
    details = failure_details(err) or {}
    try:
        usage = Usage.model_validate(details.get("usage") or {})
    except (ValidationError, TypeError):  # details from another release: the request alone
        return Usage(requests=1)
    return usage.model_copy(update={"requests": max(1, usage.requests)})


def failure_details(err: FailureError) -> dict[str, Any] | None:
    """The details an activity's failure carried (a version problem names its reason)."""
    cause = _cause(err)
    if isinstance(cause, ApplicationError) and cause.details:
        detail = cause.details[0]
        if isinstance(detail, dict):
            return detail
    return None
