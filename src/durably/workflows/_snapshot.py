"""The run as an operator sees it: the `snapshot` query's answer, derived from state.

A query result is never stored in history, so what this derives can change
freely between releases; only `RunState` is carried and replayed.
"""

from __future__ import annotations

from typing import Any

from durably.contract import RunEvent, RunSnapshot, RunState, RunStatus

__all__ = ["build_snapshot"]


def build_snapshot(run_id: str, s: RunState, current: str | None) -> RunSnapshot:
    """The snapshot of run `run_id` in state `s`; `current` is its current details."""
    return RunSnapshot(
        run_id=run_id,
        agent_id=s.agent_id,
        agent_version=s.pin.version if s.pin else None,
        status=s.status,
        outcome=s.outcome or _waiting_outcome(s),
        blocked_operation=s.blocked_operation,
        attention=s.attention,
        turns=s.turns,
        usage=s.usage,
        events=_merged(s.events, s.audit),
        error=s.error,
        current=current,
    )


def _waiting_outcome(s: RunState) -> dict[str, Any] | None:
    if s.status != RunStatus.WAITING or s.interaction is None:
        return None
    return {"type": "interaction", "interaction": s.interaction.model_dump(mode="json")}


def _merged(events: list[RunEvent], audit: list[RunEvent]) -> list[RunEvent]:
    """Recent events plus the audit events older than them, in order."""
    seen = {e.seq for e in events}
    return sorted([*events, *(e for e in audit if e.seq not in seen)], key=lambda e: e.seq)
