"""Reading a run's start input, which any Temporal client can send.

The failures this prevents:

- A malformed input (``{"agent_id": 5}``, a missing field, a bare string,
  two inputs) failed every workflow task with "Failed decoding arguments",
  retried forever, with no status published: a run invisible to
  `durably runs list` and the inbox. Here the raw payload is read and
  checked, and a problem ends the run `failed` with a message saying what
  the input must be.
- `carried` exists for continue-as-new, but any starter could set it: a
  forged `answered` entry pre-approved a call, a forged pin turned off
  approvals and made a manual tool `safe`. It is honoured only when
  Temporal says this run continues another one (`continued_run_id`, set by
  the server), and a run with a cron schedule or workflow retry policy is
  refused: either would start the same input again as a "continued" run,
  and a workflow retry repeats side effects.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from durably.contract import MAX_NAME_CHARS, MAX_RUN_INPUT_BYTES, RunInput
    from durably.workflows._validation import CONTROL, short

__all__ = ["EXPECTED", "read_run_input"]

EXPECTED = '{"agent_id": "...", "input": "...", "version": null}'
_MAX_VERSION_CHARS = 100


def read_run_input(
    payload: tuple[Any, ...], info: workflow.Info
) -> tuple[RunInput | None, str | None]:
    """The run's input, or None and what is wrong with it."""
    if len(payload) != 1 or not isinstance(payload[0], dict):
        got = f"{len(payload)} inputs" if len(payload) != 1 else short(payload[0], 100)
        return None, f"a run takes one input, a JSON object {EXPECTED}; got {got}"
    raw: dict[str, Any] = payload[0]
    if raw.get("carried") is not None and not info.continued_run_id:
        return None, (
            "the input sets `carried`, which only durably's own continue-as-new may set; "
            f"start a run with {EXPECTED}"
        )
    if info.cron_schedule or info.retry_policy is not None:
        what = "a cron schedule" if info.cron_schedule else "a workflow retry policy"
        return None, (
            f"the run was started with {what}; durably runs take neither (each would start "
            "the same input again, repeating its side effects). Start it without, and "
            "schedule runs with Temporal Schedules if they must repeat"
        )
    try:
        run_input = RunInput.model_validate(raw)
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
    if CONTROL.search(run_input.agent_id):
        return f"agent_id must not hold control characters, got {short(run_input.agent_id)}"
    version = run_input.version
    if version is not None and (
        not version.strip() or len(version) > _MAX_VERSION_CHARS or CONTROL.search(version)
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
    if CONTROL.search(info.workflow_id):
        return (
            f"the run id {short(info.workflow_id)} holds control characters (a newline, say); "
            "run ids appear in operation ids, logs and terminals: start the run with a plain id"
        )
    return None
