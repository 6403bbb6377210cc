"""Checks behind the update validators and the signal handler.

Pure functions of the run's state: they run inside validators, which must
not change anything, and they only ever raise. A rejection raised here never
reaches history; its `ApplicationError.type` names the durably error the
client raises (`DurableConflictError`, `InteractionConflictError`,
`InvalidResponseError`).
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    import jsonschema
    from pydantic import TypeAdapter, ValidationError

    from durably.contract import (
        ApprovalResponse,
        ErrorResolution,
        JsonResolution,
        QuestionResponse,
        RerunResolution,
        Resolution,
        ResolveToolRequest,
        RespondAccepted,
        RespondRequest,
        Response,
        RunState,
        RunStatus,
    )
    from durably.messages import AssistantMessage, ToolCall

__all__ = [
    "check_resolution",
    "check_response",
    "check_retry",
    "find_call",
    "parse_request",
    "rejection",
    "short",
]

_RESOLUTION: TypeAdapter[JsonResolution | ErrorResolution | RerunResolution] = TypeAdapter(
    Resolution
)
_RESPONSE: TypeAdapter[ApprovalResponse | QuestionResponse] = TypeAdapter(Response)


def short(value: Any, limit: int = 200) -> str:
    """`repr(value)`, cut to `limit` characters: rejections never echo a huge input."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def parse_request(model: type[Any], payload: tuple[Any, ...], what: str) -> Any:
    """The one `model` argument of an update or signal, or an InvalidResponseError."""
    if len(payload) != 1:
        raise rejection(
            "InvalidResponseError",
            f"{what} takes one argument, a {model.__name__} object; got {len(payload)}",
        )
    try:
        return model.model_validate(payload[0])
    except ValidationError as err:
        raise rejection(
            "InvalidResponseError",
            f"{what} takes a {model.__name__} object; got {short(payload[0])} "
            f"({_first_error(err)})",
        ) from None


def rejection(kind: str, message: str) -> ApplicationError:
    """A rejection the client maps back to the durably error named `kind`."""
    return ApplicationError(message, type=kind, non_retryable=True)


def check_resolution(
    run_id: str, s: RunState, request: ResolveToolRequest
) -> JsonResolution | ErrorResolution | RerunResolution:
    """The resolution, if the run accepts it now."""
    if s.status != RunStatus.NEEDS_ATTENTION or s.blocked_operation is None:
        raise rejection(
            "DurableConflictError",
            f"run {run_id!r} is {s.status.value}, not needs_attention; resolve_tool applies "
            "only to a run blocked on an interrupted tool call",
        )
    if request.operation != s.blocked_operation:
        raise rejection(
            "DurableConflictError",
            f"run {run_id!r} is blocked on {s.blocked_operation!r}, not "
            f"{short(request.operation)}; resolve the blocked operation",
        )
    if s.attention is None or s.attention.reason != "tool_interrupted":
        reason = s.attention.reason if s.attention else "unknown"
        raise rejection(
            "DurableConflictError",
            f"run {run_id!r} is blocked by {reason}, not an interrupted tool; fix the cause, "
            "then call retry()",
        )
    try:
        resolution = _RESOLUTION.validate_python(request.resolution)
    except ValidationError as err:
        raise rejection(
            "InvalidResponseError",
            "a resolution is {'type': 'json', 'value': ...}, "
            "{'type': 'error', 'message': '...'} or {'type': 'rerun'}; "
            f"got {short(request.resolution)} ({_first_error(err)})",
        ) from None
    if isinstance(resolution, JsonResolution) and s.pin is not None:
        call = find_call(s, s.blocked_operation)
        problem = _schema_problem(s.pin.tools[call.name].output_schema, resolution.value)
        if problem is not None:
            raise rejection(
                "InvalidResponseError",
                f"the value does not fit the output schema of tool {call.name!r}: {problem}",
            )
    return resolution


def check_retry(run_id: str, s: RunState) -> None:
    """Raise unless `retry()` applies to the run as it is."""
    if s.status == RunStatus.NEEDS_ATTENTION and s.attention is not None:
        if s.attention.reason == "tool_interrupted":
            raise rejection(
                "DurableConflictError",
                f"run {run_id!r} is blocked on the interrupted manual tool call "
                f"{s.blocked_operation!r}; retry() never repeats a manual call. Check the "
                "external system, then resolve_tool it (json, error, or rerun)",
            )
        return
    if s.status != RunStatus.FAILED:
        raise rejection(
            "DurableConflictError",
            f"run {run_id!r} is {s.status.value}; retry() applies only to failed or "
            "needs_attention runs",
        )
    if not s.retryable:
        raise rejection(
            "DurableConflictError",
            f"run {run_id!r} failed for a reason retrying cannot fix ({s.error}); cancel it "
            "and start a new run",
        )


def check_response(
    run_id: str, s: RunState, request: RespondRequest
) -> tuple[RespondAccepted, bool]:
    """The acceptance of a response, and whether it is new (False: a harmless repeat)."""
    iid = request.interaction_id
    pending = s.interaction if s.interaction is not None and s.interaction.id == iid else None
    answered = s.answered.get(iid)
    if pending is None and answered is None:
        now = f"the pending one is {s.interaction.id!r}" if s.interaction else "none is pending"
        raise rejection(
            "InvalidResponseError",
            f"run {run_id!r} has no interaction {short(iid)} ({now}); read the run's snapshot "
            "for the interaction to answer",
        )
    kind = pending.type if pending is not None else answered.type  # type: ignore[union-attr]
    example = (
        "{'type': 'tool-approval', 'approved': true|false, 'reason'?: '...'}"
        if kind == "tool-approval"
        else "{'type': 'question', 'answer': '...'}"
    )
    try:
        response = _RESPONSE.validate_python(request.response)
    except ValidationError as err:
        raise rejection(
            "InvalidResponseError",
            f"interaction {iid!r} is a {kind}; respond with {example} "
            f"(got {short(request.response)}: {_first_error(err)})",
        ) from None
    if response.type != kind:
        raise rejection(
            "InvalidResponseError",
            f"interaction {iid!r} is a {kind}, not a {response.type}; respond with {example}",
        )
    digest = pending.args_digest if pending is not None else answered.args_digest  # type: ignore[union-attr]
    if isinstance(response, ApprovalResponse) and response.args_digest not in (None, digest):
        raise rejection(
            "InvalidResponseError",
            f"args_digest {short(response.args_digest)} does not match the call awaiting "
            f"approval ({digest!r}): the arguments differ from what you reviewed. Read the "
            "interaction again and approve what it shows",
        )
    accepted = RespondAccepted(
        interaction_id=iid,
        type=kind,
        approved=response.approved if isinstance(response, ApprovalResponse) else None,
        reason=response.reason if isinstance(response, ApprovalResponse) else None,
        answer=response.answer if isinstance(response, QuestionResponse) else None,
        responder=request.responder,
        args_digest=digest,
    )
    if answered is None:
        return accepted, True
    if _decision(answered) == _decision(accepted):
        return answered, False
    raise rejection(
        "InteractionConflictError",
        f"interaction {iid!r} was already answered ({_describe(answered)}); a different "
        "response cannot replace it",
    )


def find_call(s: RunState, key: str) -> ToolCall:
    """The committed tool call behind checkpoint key `tool:{turn}:{call_id}`."""
    _, turn, call_id = key.split(":", 2)
    assistant = [m for m in s.transcript if isinstance(m, AssistantMessage)]
    for c in assistant[int(turn) - 1].tool_calls if int(turn) <= len(assistant) else ():
        if c.id == call_id:
            return c
    raise LookupError(f"no tool call {call_id!r} in turn {turn}")


def _decision(a: RespondAccepted) -> tuple[Any, ...]:
    return (a.type, a.approved, a.reason, a.answer)


def _describe(a: RespondAccepted) -> str:
    who = f" by {a.responder}" if a.responder else ""
    if a.type == "question":
        return f"answer {a.answer!r}{who}"
    verdict = "approved" if a.approved else "denied"
    return f"{verdict}{f' ({a.reason})' if a.reason else ''}{who}"


def _first_error(err: ValidationError) -> str:
    first = err.errors(include_url=False)[0]
    where = ".".join(str(p) for p in first["loc"]) or "(root)"
    return f"{where[:100]}: {first['msg'][:200]}"


def _schema_problem(schema: dict[str, Any], value: Any) -> str | None:
    """Why `value` does not fit the JSON schema, or None if it does."""
    if not schema:
        return None
    error = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(schema).iter_errors(value)
    )
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "(root)"
    return f"{where[:100]}: {error.message[:300]}"
