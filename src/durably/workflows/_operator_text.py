"""What a run tells an operator in the Temporal Web UI (current details, Markdown).

Everything quoted here came from outside the workflow: a model wrote the
question and the arguments, a caller chose the run id and the reason. The
Web UI renders current details as Markdown, so each is escaped (`md_text`)
or fenced (`md_code`): a backtick in a tool's arguments must not end the
code span, and a model-written question must not place a link in front of
the person who approves.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from durably._text import md_code, md_text
    from durably.contract import Attention, Handler, Interaction, RunState, RunStatus
    from durably.tools import render_result
    from durably.workflows._limits import how_far, on_budget

__all__ = [
    "attention_details",
    "failed_details",
    "refused_details",
    "retry_wait_details",
    "status_details",
    "waiting_details",
]

_ARGS_SHOWN = 1_000


def status_details(
    run_id: str, s: RunState, *, running: Mapping[str, str] | None = None
) -> str | None:
    """What a run that is not running shows (None for a running one: what it runs does).

    A run that holds several calls of a turn (parallel patch) lists each one it
    waits on, the first of the status's kind first, then what still runs.
    """
    if (
        s.parked
        or s.children
        or len(s.interactions) > 1
        or (running and s.status == RunStatus.RUNNING)
    ):
        return _turn_details(run_id, s, running or {})
    if s.status == RunStatus.NEEDS_ATTENTION:
        attention = s.attention
        detail = attention.detail if attention else {}
        error = str(detail.get("last_error") or (attention.reason if attention else "unknown"))
        return attention_details(run_id, s.blocked_operation, attention, error)
    if s.status == RunStatus.FAILED:
        return failed_details(run_id, s.error or "", s.retryable)
    if s.status == RunStatus.WAITING and (s.interaction or s.interactions):
        return waiting_details(run_id, s.interaction or s.interactions[0])
    if s.status == RunStatus.RETRY_WAIT:
        return retry_wait_details(run_id, s)
    if s.status == RunStatus.COMPLETED:
        return f"Completed after {s.turns} turn(s)"
    if s.status == RunStatus.CANCELLED:
        return "Cancelled"
    return None


def _turn_details(run_id: str, s: RunState, running: Mapping[str, str]) -> str | None:
    """Every call of the turn the run waits on, and those still running."""
    parts: list[str] = []
    for parked in s.parked:
        if parked.status == RunStatus.NEEDS_ATTENTION:
            attention = parked.attention
            detail = attention.detail if attention else {}
            reason = attention.reason if attention else "unknown"
            error = str(detail.get("last_error") or reason)
            parts.append(attention_details(run_id, parked.operation, attention, error))
    parts += [
        failed_details(run_id, p.error or "", p.retryable)
        for p in s.parked
        if p.status == RunStatus.FAILED
    ]
    parts += [waiting_details(run_id, i) for i in s.interactions]
    approvals = [i for i in s.interactions if i.type == "tool-approval" and not i.signed]
    if len(approvals) > 1:
        run = md_code(run_id)
        parts.append(
            f"Approve all {len(approvals)} at once with `durably approve` {run} `--all --as "
            f"NAME`, or deny them with `durably deny` {run} `--all --reason ... --as NAME`."
        )
    parts += [_running_text(s, key, tool) for key, tool in running.items()]
    parts += [
        f"Waiting for subagent run {md_code(c.run_id)} ({md_code(c.operation)}): "
        f"{md_text(c.status)}{f', {md_code(c.detail)}' if c.detail else ''}"
        for c in s.children.values()
    ]
    return "\n\n".join(parts) if parts else None


def _running_text(s: RunState, key: str, tool: str) -> str:
    policy = s.pin.tools.get(tool) if s.pin is not None else None
    recovery = f", recovery: {policy.recovery}" if policy is not None else ""
    return f"Running tool {md_code(tool)} ({md_code(key)}{recovery})"


def retry_wait_details(run_id: str, s: RunState) -> str:
    """A model request waiting out its backoff: when it runs again, and why."""
    at = f"{s.next_attempt_at:%Y-%m-%d %H:%M:%S} UTC" if s.next_attempt_at else "soon"
    return (
        f"**Retrying the model request at {at}** (attempt {s.attempt}, `model_retry`) "
        f"after: {md_text(s.error or 'an error')}\n\n"
        f"Nothing to do; `durably cancel` {md_code(run_id)} stops it."
    )


def waiting_details(run_id: str, interaction: Interaction) -> str:
    run = md_code(run_id)
    if interaction.type == "question":
        return (
            f"**Waiting for an answer** ({md_code(interaction.id)}): "
            f"{md_text(interaction.question or '')}\n\n"
            f"Answer with `durably answer` {run} `TEXT --as NAME`, or send the signal "
            f"{_signal(interaction, {'type': 'question', 'answer': 'TEXT'})}."
        )
    args = render_result(interaction.args)
    if len(args) > _ARGS_SHOWN:
        args = f"{args[:_ARGS_SHOWN]}... ({len(args)} characters; the snapshot has them all)"
    if interaction.signed:
        how = (
            "Approve or deny with a signed token: `durably approve` "
            f"{run} `--as NAME` (or `durably deny`), with an approval key set."
        )
    else:
        approval = {
            "type": "tool-approval",
            "approved": True,
            "args_digest": interaction.args_digest,
        }
        how = (
            f"Approve with `durably approve` {run} `--as NAME`, deny with `durably deny` "
            f"{run} `--reason ... --as NAME`, or send the signal {_signal(interaction, approval)}."
        )
    return (
        f"**Waiting for approval** ({md_code(interaction.id)}) of tool "
        f"{md_code(interaction.tool)} with {md_code(args)}\n\n{how}"
    )


def _signal(interaction: Interaction, response: dict[str, object]) -> str:
    """The signal an operator can paste into the Web UI's *Send a Signal* dialog."""
    body = {"interaction_id": interaction.id, "response": response, "responder": "NAME"}
    return (
        f"{md_code(Handler.RESPOND_SIGNAL.value)} with input "
        f"{md_code(json.dumps(body, ensure_ascii=False))}"
    )


def attention_details(run_id: str, key: str | None, attention: Attention | None, error: str) -> str:
    # The first line says what the run waits for: Temporal shows it as Running.
    run = md_code(run_id)
    if attention is not None and attention.reason == "tool_interrupted":
        tool = str(attention.detail.get("tool"))
        return (
            f"**Needs attention, waiting for `durably resolve` {run} {md_code(key or '')}**: "
            f"tool {md_code(tool)} was interrupted and its outcome is unknown "
            f"({md_text(error)}).\n\nCheck in the external system whether it took effect, "
            "then resolve the operation with its real result (`--json`, `--error`, or "
            "`--rerun` once you know it did not happen)."
        )
    if attention is not None and on_budget(attention):
        limit = str(attention.detail.get("limit"))
        return (
            f"**Needs attention, waiting for `durably raise-limits` {run} "
            f"{md_code(limit + '=...')}**: the run reached its {md_code(limit)} limit "
            f"({md_text(how_far(attention.detail))}) before "
            f"{md_code(key or '')}.\n\nRaise the limit to let it go on (up to what the "
            "registration's `limit_cap` allows), or cancel the run."
        )
    reason = attention.reason if attention else "unknown"
    return (
        f"**Needs attention, waiting for `durably retry` {run}** ({md_text(reason)}): "
        f"{md_text(error)}"
    )


def failed_details(run_id: str, error: str, retryable: bool) -> str:
    run = md_code(run_id)
    if retryable:
        return (
            f"**Failed, waiting for `durably retry` {run}**: {md_text(error)}\n\n"
            "Fix the cause, then retry the run: committed results are kept."
        )
    return (
        f"**Failed for good, waiting for `durably cancel` {run}**: {md_text(error)}\n\n"
        "Retrying cannot fix this: cancel the run and start a new one."
    )


def refused_details(problem: str) -> str:
    return (
        f"**Failed**: the run's input was refused: {md_text(problem)}\n\n"
        "Start a new run with a valid input."
    )
