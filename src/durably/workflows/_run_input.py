"""Reading a run's start input, which any Temporal client can send.

The failures this prevents:

- A malformed input (``{"agent_id": 5}``, a missing field, a bare string,
  two inputs, JSON nested past what pydantic decodes) failed every workflow
  task with "Failed decoding arguments", retried forever, with no status
  published: a run invisible to `durably runs list` and the inbox. Here the
  raw payload is decoded and checked by the run (`one_raw_argument`), and a
  problem ends the run `failed` with a message saying what the input must
  be.
- `parent` makes a run a subagent's, which tells its parent its status:
  honoured only when Temporal says that run is the run's parent.
- `session` points a run at a session's conversation, which its model
  then reads: honoured only when Temporal says that session is the run's
  parent (`workflow.info().parent`), so a starter cannot point a run at
  another conversation.
- `carried` exists for continue-as-new, but any starter could set it: a
  forged `answered` entry pre-approved a call, a forged pin turned off
  approvals and made a manual tool `safe`. It is honoured only when
  Temporal says this run continues another one (`continued_run_id`, set by
  the server), and a run with a cron schedule or workflow retry policy is
  refused: either would start the same input again as a "continued" run,
  and a workflow retry repeats side effects.
- Temporal says only *that* a workflow continued into or started the run,
  not that it was durably's: a caller's own workflow continued as new into
  `AgentRunWorkflow` with a forged approval. `origin_check` names what the
  run's worker must confirm before the run honours any of it
  (`durably.activities._origin`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar, get_type_hints

from temporalio import workflow
from temporalio.common import RawValue

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from durably._transcript import EMPTY_DIGEST
    from durably.codec import EncryptionKeyError, undecryptable
    from durably.contract import (
        CONTROL_CHARACTERS,
        MAX_NAME_CHARS,
        MAX_RUN_INPUT_BYTES,
        SESSION_WORKFLOW_TYPE,
        WORKFLOW_TYPE,
        OriginCheck,
        RunInput,
        RunState,
        RunStatus,
    )
    from durably.workflows._validation import short

__all__ = [
    "EXPECTED",
    "decode_arguments",
    "initial_state",
    "missing_key",
    "one_raw_argument",
    "origin_check",
    "read_run_input",
    "refused_state",
    "sender_check",
    "waits_for_key",
]

# Start input keys the limits patch added (SPEC section 17).
_LIMIT_KEYS = ("limits", "max_turns")
EXPECTED = '{"agent_id": "...", "input": "...", "version": null}'
_MAX_VERSION_CHARS = MAX_NAME_CHARS
F = TypeVar("F", bound=Callable[..., Any])


def one_raw_argument(fn: F) -> F:
    """Have the SDK hand the workflow its one start argument undecoded (a `RawValue`).

    The SDK decodes start arguments by the run method's signature before any
    workflow code runs; a payload it cannot decode fails every workflow task.
    Declared as taking one `RawValue`, the payload arrives as it was sent and
    `decode_arguments` reads it. The function itself takes `*payload`: a
    start with no argument or with several still reaches it (the SDK decodes
    those as plain JSON, since the count does not match the declaration).
    `__init__` and `run` must be declared alike (the SDK compares them).
    """
    returns = get_type_hints(fn).get("return")
    fn.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
            inspect.Parameter(
                "payload", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=RawValue
            ),
        ],
        return_annotation=returns,
    )
    fn.__annotations__ = {"payload": RawValue, "return": returns}
    return fn


def decode_arguments(payload: tuple[Any, ...]) -> tuple[tuple[Any, ...], str | None]:
    """The start arguments decoded, or what made one undecodable."""
    values: list[Any] = []
    for value in payload:
        if isinstance(value, RawValue):
            sealed = undecryptable(value.payload)
            if sealed is not None:
                return (), (
                    f"the input could not be decrypted: {short(str(sealed), 400)}. Start the "
                    "run again with a client that holds the workers' encryption keys"
                )
            try:
                value = workflow.payload_converter().from_payload(value.payload)
            except Exception as err:
                encoding = value.payload.metadata.get("encoding", b"").decode(errors="replace")
                return (), (
                    f"the input could not be decoded (encoding {short(encoding, 60)}: "
                    f"{short(str(err), 200)}); start a run with the JSON object {EXPECTED}"
                )
        values.append(value)
    return tuple(values), None


def read_run_input(
    payload: tuple[Any, ...], info: workflow.Info, limits_apply: Callable[[], bool] = bool
) -> tuple[RunInput | None, str | None]:
    """The run's input, or None and what is wrong with it.

    `limits_apply` says whether the run is under the limits patch: before it,
    `limits` and `max_turns` were unknown keys, ignored whatever they held, and
    a run started then must replay as it ran.
    """
    if len(payload) != 1 or not isinstance(payload[0], dict):
        got = f"{len(payload)} inputs" if len(payload) != 1 else short(payload[0], 100)
        return None, f"a run takes one input, a JSON object {EXPECTED}; got {got}"
    raw: dict[str, Any] = payload[0]
    if raw.get("carried") is not None and not info.continued_run_id:
        return None, (
            "the input sets `carried`, which only durably's own continue-as-new may set; "
            f"start a run with {EXPECTED}"
        )
    session = raw.get("session")
    if session is not None:
        session_id = session.get("session_id") if isinstance(session, dict) else None
        if info.parent is None or info.parent.workflow_id != session_id:
            return None, (
                "the input sets `session`, which only the session workflow that starts the "
                f"run as its child may set; start a run with {EXPECTED}, or submit to the "
                "session (its `submit` update)"
            )
    parent = raw.get("parent")
    if parent is not None:
        parent_id = parent.get("run_id") if isinstance(parent, dict) else None
        if info.parent is None or info.parent.workflow_id != parent_id:
            return None, (
                "the input sets `parent`, which only the run whose subagent call starts this "
                f"run as its child may set; start a run with {EXPECTED}"
            )
    if info.cron_schedule or info.retry_policy is not None:
        what = "a cron schedule" if info.cron_schedule else "a workflow retry policy"
        return None, (
            f"the run was started with {what}; durably runs take neither (each would start "
            "the same input again, repeating its side effects). Start it without, and "
            "schedule runs with Temporal Schedules if they must repeat"
        )
    own = {k: raw[k] for k in _LIMIT_KEYS if k in raw}
    try:
        run_input = RunInput.model_validate({k: v for k, v in raw.items() if k not in own})
        if own:
            try:
                run_input = RunInput.model_validate(raw)
            except ValidationError:
                if limits_apply():
                    raise
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "(root)"
        return None, (
            f"the input must be a JSON object {EXPECTED}; {where[:100]}: {first['msg'][:200]} "
            f"(got {short(raw, 200)})"
        )
    return run_input, _problem(run_input, info)


def _problem(run_input: RunInput, info: workflow.Info) -> str | None:
    if not run_input.agent_id.strip() or len(run_input.agent_id) > MAX_NAME_CHARS:
        return f"agent_id must be 1 to {MAX_NAME_CHARS} characters, got {short(run_input.agent_id)}"
    if CONTROL_CHARACTERS.search(run_input.agent_id):
        return f"agent_id must not hold control characters, got {short(run_input.agent_id)}"
    version = run_input.version
    if version is not None and (
        not version.strip()
        or len(version) > _MAX_VERSION_CHARS
        or CONTROL_CHARACTERS.search(version)
    ):
        return (
            f"version must be null or 1 to {_MAX_VERSION_CHARS} characters with no control "
            f"characters, got {short(version)}"
        )
    size = len(run_input.input.encode("utf-8", "surrogatepass"))
    if size > MAX_RUN_INPUT_BYTES:
        return (
            f"the input text is {size:,} bytes; a run's input may be at most "
            f"{MAX_RUN_INPUT_BYTES:,} bytes. Put a large document where the agent's tools "
            "can read it and start the run with where it is"
        )
    if CONTROL_CHARACTERS.search(info.workflow_id):
        return (
            f"the run id {short(info.workflow_id)} holds control characters (a newline, say); "
            "run ids appear in operation ids, logs and terminals: start the run with a plain id"
        )
    return None


def initial_state(
    payload: tuple[Any, ...],
    info: workflow.Info,
    *,
    hardened: bool,
    limits_apply: Callable[[], bool] = bool,
) -> tuple[RunState, str | None]:
    """The run's state from its start input, and why the input was refused (None: it was
    not; the state is then a failed run's)."""
    values, problem = decode_arguments(payload)
    run_input: RunInput | None = None
    if hardened:
        if problem is None:
            run_input, problem = read_run_input(values, info, limits_apply)
    elif problem is not None:  # 0.1.0 failed the task on it
        raise RuntimeError(problem)
    else:  # 0.1.0 trusted its input; its histories replay as they ran
        raw = {k: v for k, v in values[0].items() if k not in _LIMIT_KEYS}
        run_input = RunInput.model_validate(raw)
    if run_input is None or problem is not None:
        return refused_state(_agent_id_of(values), problem), problem
    state = run_input.carried or RunState(
        agent_id=run_input.agent_id,
        input=run_input.input,
        requested_version=run_input.version,
        digest=EMPTY_DIGEST,
        chain=info.first_execution_run_id if hardened else None,
        session=run_input.session,
        parent=run_input.parent,
        limits=run_input.limits,
        max_turns=run_input.max_turns,
        started_at=info.workflow_start_time,
    )
    if not state.input:  # carried without it: see _continuation
        state.input = run_input.input
    return state, None


def missing_key(payload: tuple[Any, ...]) -> EncryptionKeyError | None:
    """The key the input needs and this worker does not hold, if its codec said so
    (`durably.codec.UNDECRYPTABLE`); what the run does about it is `waits_for_key`'s."""
    for value in payload:
        sealed = undecryptable(value.payload) if isinstance(value, RawValue) else None
        if sealed is not None and sealed.key_missing:
            return sealed
    return None


def waits_for_key(info: workflow.Info) -> bool:
    """Whether a run whose input needs a key this worker lacks waits for the key (every
    workflow task fails until a worker holds it; SPEC section 18) rather than refusing it.

    Replayed, the input is one the run accepted once (or refused: then it is closed, and
    only a query replays it): the run waits. A continued run's input is durably's own,
    carrying what the run did, and a child's is its session's or parent run's: they wait
    too, once their origin is confirmed (`sender_check`). Only a client's new input is
    refused: the run has done nothing, and a forged one with a key
    id nobody holds would otherwise make a run no operator sees.
    """
    return workflow.unsafe.is_replaying() or bool(info.continued_run_id) or info.parent is not None


def refused_state(agent_id: str, problem: str | None) -> RunState:
    """The state of a run whose start durably refused: failed, holding nothing it was sent."""
    return RunState(
        agent_id=agent_id,
        input="",
        digest=EMPTY_DIGEST,
        status=RunStatus.FAILED,
        error=problem,
        retryable=False,
    )


def sender_check(info: workflow.Info) -> OriginCheck | None:
    """What the worker confirms before a run waits for the key of an input it cannot
    read: the predecessor or the parent that sent it is durably's own."""
    if info.continued_run_id:
        return OriginCheck(
            workflow_id=info.workflow_id,
            task_queue=info.task_queue,
            predecessor_run_id=info.continued_run_id,
            predecessor_type=info.workflow_type,
        )
    if info.parent is not None:
        return OriginCheck(
            workflow_id=info.workflow_id,
            task_queue=info.task_queue,
            parent_workflow_id=info.parent.workflow_id,
            parent_run_id=info.parent.run_id,
        )
    return None


def origin_check(state: RunState, info: workflow.Info) -> OriginCheck | None:
    """What the worker must confirm before the run honours what it was passed, or None.

    A run that continues another confirms its predecessor (which confirmed its
    own parent when its chain began); a session's or a subagent's first run
    confirms its parent. A run started by a client honours nothing of the kind.
    """
    if info.continued_run_id:
        return OriginCheck(
            workflow_id=info.workflow_id,
            task_queue=info.task_queue,
            predecessor_run_id=info.continued_run_id,
        )
    if info.parent is not None and (state.session is not None or state.parent is not None):
        return OriginCheck(
            workflow_id=info.workflow_id,
            task_queue=info.task_queue,
            parent_workflow_id=info.parent.workflow_id,
            parent_run_id=info.parent.run_id,
            parent_type=SESSION_WORKFLOW_TYPE if state.session is not None else WORKFLOW_TYPE,
        )
    return None


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
