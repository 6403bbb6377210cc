"""Checks behind the update validators and the signal handler.

Pure functions of the run's state (no Temporal here): they run inside
validators, which must not change anything, and they only ever raise
`Rejected`. The workflow turns a rejection into an `ApplicationError` whose
type names the durably error the client raises (`ErrorType`); raised from a
validator, it never reaches history.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import TypeAdapter, ValidationError

from durably._digests import response_digest
from durably._json_schema import schema_problem, validator
from durably.contract import (
    CONTROL_CHARACTERS,
    MAX_ANSWER_BYTES,
    MAX_BATCH_ANSWER_BYTES,
    MAX_BATCH_RESPONSES,
    MAX_NAME_CHARS,
    MAX_REASON_CHARS,
    MAX_TOKEN_CHARS,
    Answer,
    ApprovalResponse,
    ErrorResolution,
    ErrorType,
    Interaction,
    JsonResolution,
    ParkedCall,
    RerunResolution,
    Resolution,
    ResolveToolRequest,
    RespondAccepted,
    RespondManyRequest,
    RespondRequest,
    Response,
    RunState,
    RunStatus,
)
from durably.workflows._limits import BUDGET_EXCEEDED, how_far, on_budget

__all__ = [
    "EXTRA_BYTES",
    "Rejected",
    "admit_request",
    "check_many",
    "check_resolution",
    "check_response",
    "check_retry",
    "parse_request",
    "pending_interactions",
    "rejection",
    "retried_operations",
    "short",
]

_RESOLUTION: TypeAdapter[JsonResolution | ErrorResolution | RerunResolution] = TypeAdapter(
    Resolution
)
_RESPONSE: TypeAdapter[ApprovalResponse | Answer] = TypeAdapter(Response)


def short(value: Any, limit: int = 200) -> str:
    """`repr(value)`, cut to `limit` characters: rejections never echo a huge input."""
    try:
        text = repr(value)
    except RecursionError:  # raising here would fail the workflow task
        return f"(a {type(value).__name__} nested too deeply to show)"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def parse_request(model: type[Any], payload: tuple[Any, ...], what: str) -> Any:
    """The one `model` argument of an update or signal, or an InvalidResponseError."""
    if len(payload) != 1:
        raise rejection(
            ErrorType.INVALID_RESPONSE,
            f"{what} takes one argument, a {model.__name__} object; got {len(payload)}",
        )
    try:
        return model.model_validate(payload[0])
    except ValidationError as err:
        raise rejection(
            ErrorType.INVALID_RESPONSE,
            f"{what} takes a {model.__name__} object; got {short(payload[0])} "
            f"({_first_error(err)})",
        ) from None


# What an update may carry beyond what its handler reads: history keeps the whole
# payload of every accepted update, so unknown fields were stored whatever their size
# (five `respond` updates with 1.9 MB of them took a history from 8.5 KB to 9.5 MB).
EXTRA_BYTES = 4 * 2**10


def admit_request(
    model: type[Any], payload: tuple[Any, ...], what: str, *, strict: bool = False
) -> Any:
    """`parse_request` as a validator runs it: also refused when the payload carries more
    than `EXTRA_BYTES` the handler does not read, and, `strict`, when a value has to be
    coerced (``"5"`` or ``true`` for a number). Validators only: an update accepted before
    these checks must still be taken when its handler is replayed."""
    request = parse_request(model, payload, what)
    if strict:
        try:
            model.model_validate(payload[0], strict=True)
        except ValidationError as err:
            raise rejection(
                ErrorType.INVALID_RESPONSE,
                f"{what} takes a {model.__name__} object with values of their own types "
                f"(a number, not a string or a boolean); {_first_error(err)}",
            ) from None
    kept = _kept_size(request)
    if kept is None:  # what it sent does not parse: the check that follows says why
        return request
    try:
        sent = len(
            json.dumps(payload[0], ensure_ascii=False, separators=(",", ":"), default=str).encode(
                "utf-8", "surrogatepass"
            )
        )
    except (RecursionError, ValueError):
        sent = EXTRA_BYTES * 2**10  # no handler reads what cannot even be measured
    if sent > kept + EXTRA_BYTES:
        raise rejection(
            ErrorType.INVALID_RESPONSE,
            f"{what} carried {sent:,} bytes, {sent - kept:,} of them in fields a "
            f"{model.__name__} does not have (at most {EXTRA_BYTES:,} are allowed: history "
            "keeps every byte of an accepted update); send only its fields",
        )
    return request


def _kept_size(request: Any) -> int | None:
    """The encoded size of what the handler reads of `request` (a response is read as
    `Response`: its own unknown fields are not read either); None when a part of it does
    not parse (the checks that follow refuse it, saying why)."""
    if isinstance(request, RespondManyRequest):
        sizes = [_kept_size(r) for r in request.responses]
        return None if None in sizes else sum(s for s in sizes if s is not None) + 64
    try:
        if isinstance(request, RespondRequest):
            read: Any = _RESPONSE.validate_python(request.response).model_dump()
            request = request.model_copy(update={"response": read})
        return len(request.model_dump_json().encode())
    except (ValidationError, ValueError):  # a lone surrogate does not serialise
        return None


class Rejected(Exception):
    """A request the run refuses; `kind` names the error the client raises."""

    def __init__(self, kind: ErrorType, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def rejection(kind: ErrorType, message: str) -> Rejected:
    """A rejection the client maps back to the durably error named `kind`."""
    return Rejected(kind, message)


def pending_interactions(s: RunState) -> list[Interaction]:
    """Every interaction the run waits on, oldest first (one before the parallel patch)."""
    if s.interactions:
        return list(s.interactions)
    return [s.interaction] if s.interaction is not None else []


def _blocked(s: RunState) -> list[ParkedCall]:
    """The operations the run is blocked on, oldest first (one before the parallel patch)."""
    if s.parked:
        return [p for p in s.parked if p.status == RunStatus.NEEDS_ATTENTION]
    if s.status != RunStatus.NEEDS_ATTENTION or s.blocked_operation is None:
        return []
    return [ParkedCall(operation=s.blocked_operation, status=s.status, attention=s.attention)]


def check_resolution(
    run_id: str, s: RunState, request: ResolveToolRequest, *, strict: bool
) -> JsonResolution | ErrorResolution | RerunResolution:
    """The resolution, if the run accepts it now (`strict`: bounded, as responses are)."""
    blocked = _blocked(s)
    if not blocked:
        raise rejection(
            ErrorType.DURABLE_CONFLICT,
            f"run {run_id!r} is {s.status.value}, not needs_attention; resolve_tool applies "
            "only to a run blocked on an interrupted tool call",
        )
    entry = next((b for b in blocked if b.operation == request.operation), None)
    if entry is None:
        names = ", ".join(repr(b.operation) for b in blocked[:10])
        raise rejection(
            ErrorType.DURABLE_CONFLICT,
            f"run {run_id!r} is blocked on {names}, not {short(request.operation)}; resolve "
            "a blocked operation",
        )
    attention = entry.attention
    delegated = attention is not None and attention.reason == "subagent_failed"
    if delegated and request.resolution.get("type") == "rerun":
        child = attention.detail.get("child_run_id") if attention else None
        raise rejection(
            ErrorType.DURABLE_CONFLICT,
            f"{short(request.operation)} delegated to subagent run {child!r}, which is still "
            "open: a rerun would only wait for it again. Retry that run once its cause is "
            "fixed (this run goes on by itself), or resolve this call with json or error",
        )
    if on_budget(attention):
        raise rejection(ErrorType.DURABLE_CONFLICT, _over_budget(run_id, [entry]))
    if attention is None or attention.reason not in ("tool_interrupted", "subagent_failed"):
        reason = attention.reason if attention else "unknown"
        raise rejection(
            ErrorType.DURABLE_CONFLICT,
            f"run {run_id!r} is blocked by {reason}, not an interrupted tool; fix the cause, "
            "then call retry()",
        )
    try:
        resolution = _RESOLUTION.validate_python(request.resolution)
    except ValidationError as err:
        raise rejection(
            ErrorType.INVALID_RESPONSE,
            "a resolution is {'type': 'json', 'value': ...}, "
            "{'type': 'error', 'message': '...'} or {'type': 'rerun'}; "
            f"got {short(request.resolution)} ({_first_error(err)})",
        ) from None
    if strict:
        _check_resolution_size(resolution)
    tool = attention.detail.get("tool")
    if isinstance(resolution, JsonResolution) and s.pin is not None and tool in s.pin.tools:
        # The attention names the tool: the transcript may still be restoring.
        problem = _schema_problem(s.pin.tools[tool].output_schema, resolution.value)
        if problem is not None:
            raise rejection(
                ErrorType.INVALID_RESPONSE,
                f"the value does not fit the output schema of tool {tool!r}: {problem}",
            )
    return resolution


def _check_resolution_size(resolution: JsonResolution | ErrorResolution | RerunResolution) -> None:
    """A resolution becomes the call's result, read by the model: bounded like an answer."""
    if isinstance(resolution, ErrorResolution) and len(resolution.message) > MAX_REASON_CHARS:
        raise rejection(
            ErrorType.INVALID_RESPONSE,
            f"the error message is {len(resolution.message):,} characters; it may be at most "
            f"{MAX_REASON_CHARS:,}: say briefly what happened, the model reads it",
        )
    if isinstance(resolution, JsonResolution):
        size = len(
            json.dumps(resolution.value, ensure_ascii=False).encode("utf-8", "surrogatepass")
        )
        if size > MAX_ANSWER_BYTES:
            raise rejection(
                ErrorType.INVALID_RESPONSE,
                f"the value is {size:,} bytes of JSON; a resolution may be at most "
                f"{MAX_ANSWER_BYTES:,} (what the tool returns to the model, not a document)",
            )


def retried_operations(run_id: str, s: RunState, *, taken: set[str | None]) -> list[str | None]:
    """What `retry()` runs again of a run that may hold several parked operations (the
    parallel patch): every failed one that a retry can fix, and every one blocked for a
    reason other than an interrupted manual call; raise if there is none. `taken`: those
    whose decision is already on its way."""
    if s.status == RunStatus.RETRY_WAIT or not s.parked:
        _check_retry_one(run_id, s)
    eligible = [
        p.operation
        for p in s.parked
        if p.operation not in taken
        and (
            (p.status == RunStatus.FAILED and p.retryable)
            or (
                p.status == RunStatus.NEEDS_ATTENTION
                and (
                    p.attention is None
                    or p.attention.reason
                    not in ("tool_interrupted", "subagent_failed", BUDGET_EXCEEDED)
                )
            )
        )
    ]
    if eligible:
        return eligible
    delegated = [
        p.attention.detail.get("child_run_id")
        for p in _blocked(s)
        if p.attention is not None and p.attention.reason == "subagent_failed"
    ]
    if delegated:
        children = ", ".join(repr(child) for child in delegated[:5])
        raise rejection(
            ErrorType.DURABLE_CONFLICT,
            f"run {run_id!r} waits on failed subagent run(s) {children}: retry() those runs "
            "once their cause is fixed (this run goes on by itself), or resolve_tool this "
            "run's call with json or error",
        )
    budget = [p for p in _blocked(s) if on_budget(p.attention)]
    interrupted = [p.operation for p in _blocked(s) if p.operation not in taken and p not in budget]
    if budget and not interrupted:
        raise rejection(ErrorType.DURABLE_CONFLICT, _over_budget(run_id, budget))
    if interrupted:
        names = ", ".join(repr(o) for o in interrupted[:10])
        raise rejection(
            ErrorType.DURABLE_CONFLICT,
            f"run {run_id!r} is blocked on the interrupted manual tool call(s) {names}; "
            "retry() never repeats a manual call. Check the external system, then "
            "resolve_tool each (json, error, or rerun)",
        )
    if any(p.operation in taken for p in s.parked):
        raise rejection(
            ErrorType.DURABLE_CONFLICT,
            f"run {run_id!r} already accepted a decision for every parked operation; it is "
            "being applied",
        )
    _check_retry_one(run_id, s)  # not retryable: say why
    raise rejection(ErrorType.DURABLE_CONFLICT, f"run {run_id!r} has nothing to retry")


def _over_budget(run_id: str, parked: list[ParkedCall]) -> str:
    """What to do about a run parked on a usage limit (retrying would park it again)."""
    detail = parked[0].attention.detail if parked[0].attention else {}
    return (
        f"run {run_id!r} reached a limit ({how_far(detail)}) before "
        f"{parked[0].operation!r}; raise the limit (raise_limits, `durably raise-limits`) "
        "to let it go on, or cancel it"
    )


def check_retry(run_id: str, s: RunState, *, taken: set[str | None] | None = None) -> None:
    """Raise unless `retry()` applies to the run as it is."""
    if s.parked and s.status != RunStatus.RETRY_WAIT:
        retried_operations(run_id, s, taken=taken or set())
        return
    _check_retry_one(run_id, s)


def _check_retry_one(run_id: str, s: RunState) -> None:
    """`check_retry` of a run parked on one operation, from its singular fields."""
    if s.status == RunStatus.NEEDS_ATTENTION and s.attention is not None:
        if s.attention.reason == "subagent_failed":
            child = s.attention.detail.get("child_run_id")
            raise rejection(
                ErrorType.DURABLE_CONFLICT,
                f"run {run_id!r} waits on the failed subagent run {child!r}: retry() that run "
                "once its cause is fixed (this run goes on by itself), or resolve_tool this "
                "run's call with json or error",
            )
        if on_budget(s.attention):
            raise rejection(ErrorType.DURABLE_CONFLICT, _over_budget(run_id, _blocked(s)))
        if s.attention.reason == "tool_interrupted":
            raise rejection(
                ErrorType.DURABLE_CONFLICT,
                f"run {run_id!r} is blocked on the interrupted manual tool call "
                f"{s.blocked_operation!r}; retry() never repeats a manual call. Check the "
                "external system, then resolve_tool it (json, error, or rerun)",
            )
        return
    if s.status == RunStatus.RETRY_WAIT:
        at = f"{s.next_attempt_at:%Y-%m-%d %H:%M:%S} UTC" if s.next_attempt_at else "soon"
        raise rejection(
            ErrorType.DURABLE_CONFLICT,
            f"run {run_id!r} is waiting to retry its model request (attempt {s.attempt} at "
            f"{at}, under model_retry); it needs no retry(). Wait, or cancel the run",
        )
    if s.status != RunStatus.FAILED:
        raise rejection(
            ErrorType.DURABLE_CONFLICT,
            f"run {run_id!r} is {s.status.value}; retry() applies only to failed or "
            "needs_attention runs",
        )
    if not s.retryable:
        raise rejection(
            ErrorType.DURABLE_CONFLICT,
            f"run {run_id!r} failed for a reason retrying cannot fix ({s.error}); cancel it "
            "and start a new run",
        )


def check_response(
    run_id: str, s: RunState, request: RespondRequest, *, strict: bool
) -> tuple[RespondAccepted, bool, ApprovalResponse | Answer]:
    """The acceptance of a response, whether it is new (False: a harmless repeat),
    and the response itself.

    `strict` (runs under the hardening patch): a bool is a bool (not "on"
    or "1"); answers, reasons and names are bounded; the acceptance keeps a
    digest of the answer or reason instead of a second copy of it.
    """
    iid = request.interaction_id
    waiting = pending_interactions(s)
    pending = next((i for i in waiting if i.id == iid), None)
    answered = s.answered.get(iid)
    if pending is None and answered is None:
        ids = ", ".join(repr(i.id) for i in waiting[:10])
        now = f"pending: {ids}" if waiting else "none is pending"
        raise rejection(
            ErrorType.INVALID_RESPONSE,
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
        response = _RESPONSE.validate_python(request.response, strict=strict)
    except ValidationError as err:
        raise rejection(
            ErrorType.INVALID_RESPONSE,
            f"interaction {iid!r} is a {kind}; respond with {example} "
            f"(got {short(request.response)}: {_first_error(err)})",
        ) from None
    if response.type != kind:
        raise rejection(
            ErrorType.INVALID_RESPONSE,
            f"interaction {iid!r} is a {kind}, not a {response.type}; respond with {example}",
        )
    if strict:
        _check_bounds(request, response)
    digest = pending.args_digest if pending is not None else answered.args_digest  # type: ignore[union-attr]
    if isinstance(response, ApprovalResponse) and response.args_digest not in (None, digest):
        raise rejection(
            ErrorType.INVALID_RESPONSE,
            f"args_digest {short(response.args_digest)} does not match the call awaiting "
            f"approval ({digest!r}): the arguments differ from what you reviewed. Read the "
            "interaction again and approve what it shows",
        )
    signed = pending.signed if pending is not None else False
    if strict and signed and isinstance(response, ApprovalResponse) and not response.token:
        raise rejection(
            ErrorType.INVALID_RESPONSE,
            f"interaction {iid!r} needs a signed decision: tool {pending.tool!r} accepts "  # type: ignore[union-attr]
            "approvals and denials only with a 'token' made by durably.approvals.ApprovalKeys "
            "from a key the worker holds, for an approver on the registration's allow-list",
        )
    approval = response if isinstance(response, ApprovalResponse) else None
    answer = response.answer if isinstance(response, Answer) else None
    accepted = RespondAccepted(
        interaction_id=iid,
        type=kind,
        approved=approval.approved if approval else None,
        reason=None if strict or approval is None else approval.reason,
        answer=None if strict else answer,
        responder=request.responder,
        args_digest=digest,
        identity=request.identity if strict else None,
        response_digest=(
            response_digest(
                kind,
                approval.approved if approval else None,
                approval.reason if approval else None,
                answer,
            )
            if strict
            else None
        ),
    )
    if answered is None:
        return accepted, True, response
    if _decision(answered) == _decision(accepted):
        return answered, False, response
    raise rejection(
        ErrorType.INTERACTION_CONFLICT,
        f"interaction {iid!r} was already answered ({_describe(answered)}); a different "
        "response cannot replace it",
    )


def check_many(
    run_id: str, s: RunState, requests: list[RespondRequest], *, strict: bool
) -> list[tuple[RespondAccepted, bool, ApprovalResponse | Answer]]:
    """`check_response` of each response of a batch; one refused refuses them all, saying
    which. A batch names each interaction once and is bounded (`MAX_BATCH_*`)."""
    if not requests or len(requests) > MAX_BATCH_RESPONSES:
        raise rejection(
            ErrorType.INVALID_RESPONSE,
            f"respond_many takes 1 to {MAX_BATCH_RESPONSES} responses; got {len(requests)}",
        )
    seen: set[str] = set()
    answers = 0
    checked: list[tuple[RespondAccepted, bool, ApprovalResponse | Answer]] = []
    for n, request in enumerate(requests, start=1):
        if request.interaction_id in seen:
            raise rejection(
                ErrorType.INVALID_RESPONSE,
                f"response {n} answers {short(request.interaction_id)} again; a batch answers "
                "each interaction once. Nothing in the batch was accepted",
            )
        seen.add(request.interaction_id)
        try:
            accepted, new, response = check_response(run_id, s, request, strict=strict)
        except Rejected as err:
            raise rejection(
                err.kind,
                f"response {n} of {len(requests)}: {err.message}. Nothing in the "
                "batch was accepted",
            ) from None
        if isinstance(response, Answer):
            answers += len(response.answer.encode("utf-8", "surrogatepass"))
            if answers > MAX_BATCH_ANSWER_BYTES:
                raise rejection(
                    ErrorType.INVALID_RESPONSE,
                    f"the answers of a batch may hold at most {MAX_BATCH_ANSWER_BYTES:,} bytes "
                    f"together; response {n} passes that. Send them in smaller batches",
                )
        checked.append((accepted, new, response))
    return checked


def check_name(field: str, value: str | None) -> None:
    """A responder's or client's name: bounded, with no control characters."""
    if value is not None and (len(value) > MAX_NAME_CHARS or CONTROL_CHARACTERS.search(value)):
        raise rejection(
            ErrorType.INVALID_RESPONSE,
            f"{field} must be at most {MAX_NAME_CHARS} characters with no control "
            f"characters; got {short(value, 60)}",
        )


def _check_bounds(request: RespondRequest, response: ApprovalResponse | Answer) -> None:
    """What one response may hold: see `durably.contract.MAX_*`."""
    check_name("responder", request.responder)
    check_name("identity", request.identity)
    if isinstance(response, Answer):
        size = len(response.answer.encode("utf-8", "surrogatepass"))
        if size > MAX_ANSWER_BYTES:
            raise rejection(
                ErrorType.INVALID_RESPONSE,
                f"the answer is {size:,} bytes; an answer may be at most {MAX_ANSWER_BYTES:,} "
                "bytes (it is a person's text for the model, stored in the run's history). "
                "Put a large document where the agent's tools can read it and answer with "
                "where it is",
            )
        return
    if response.reason is not None and len(response.reason) > MAX_REASON_CHARS:
        raise rejection(
            ErrorType.INVALID_RESPONSE,
            f"the reason is {len(response.reason):,} characters; a reason may be at most "
            f"{MAX_REASON_CHARS:,}: say briefly why, the model reads it",
        )
    if response.token is not None and len(response.token) > MAX_TOKEN_CHARS:
        raise rejection(
            ErrorType.INVALID_RESPONSE,
            f"the token is {len(response.token):,} characters; a signed approval token is at "
            f"most {MAX_TOKEN_CHARS} (made by durably.approvals.ApprovalKeys.sign)",
        )


def _decision(a: RespondAccepted) -> tuple[Any, ...]:
    """What makes two responses the same decision (who sent it does not)."""
    return (
        a.type,
        a.approved,
        a.response_digest or response_digest(a.type, a.approved, a.reason, a.answer),
    )


def _describe(a: RespondAccepted) -> str:
    who = f" by {_cut(a.responder, 100)}" if a.responder else ""
    if a.type == "question":
        return f"answer {short(a.answer, 100)}{who}" if a.answer is not None else f"answered{who}"
    verdict = "approved" if a.approved else "denied"
    return f"{verdict}{f' ({_cut(a.reason, 200)})' if a.reason else ''}{who}"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _first_error(err: ValidationError) -> str:
    first = err.errors(include_url=False)[0]
    where = ".".join(str(p) for p in first["loc"]) or "(root)"
    return f"{where[:100]}: {first['msg'][:200]}"


def _schema_problem(schema: dict[str, Any], value: Any) -> str | None:
    """Why `value` does not fit the JSON schema, or None if it does."""
    if not schema:
        return None
    return schema_problem(validator(schema), value)
