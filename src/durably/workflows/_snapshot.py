"""The run as an operator sees it: the `snapshot` query's answer, derived from state.

A query result is never stored in history, so what this derives can change
between releases; only `RunState` is carried and replayed. The typed views
(`interactions`, `blocked_operations`, `output`, attention by reason) exist
only here: `RunState` keeps the shape every recorded history holds.

What the worker sends is another matter: clients of the previous release
read the same query, and a query result, like any payload, must stay under
Temporal's 2 MB. So each value travels once, in the shape every client reads
(`outcome`, `blocked_operation`, attention's `reason` and `detail`); a
client derives the typed views from it (`RunSnapshot` does, on parsing). A
tool call's large arguments shown twice would push a waiting run's snapshot
past the limit, and with it `snapshot()`, `result()` and the inbox.
"""

from __future__ import annotations

from typing import Any

from pydantic import SerializerFunctionWrapHandler, model_serializer

from durably.contract import (
    RunEvent,
    RunSnapshot,
    RunState,
    RunStatus,
)
from durably.workflows._limits import turn_budget
from durably.workflows._validation import pending_interactions

__all__ = ["build_snapshot"]


# The fields a client derives from the others, never sent when it derives them exactly.
_DERIVED = ("interactions", "blocked_operations", "output")


class _SentSnapshot(RunSnapshot):
    """A snapshot that serializes each value once (see the module docstring).

    The shape sent says everything while a run waits on one interaction at a
    time, and sends the lists when it waits on several; it is sent as is,
    never checked by a round trip (a NaN in a tool's arguments is not equal
    to itself, and the check would parse every snapshot a second time on the
    worker).
    """

    @model_serializer(mode="wrap")
    def _once(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        full: dict[str, Any] = handler(self)
        outcome = full.get("outcome") or {}
        from_outcome = [outcome["interaction"]] if outcome.get("type") == "interaction" else []
        blocked = full.get("blocked_operation")
        derivable = {
            "interactions": full["interactions"] == from_outcome,
            "blocked_operations": full["blocked_operations"] == ([blocked] if blocked else []),
            "output": True,
        }
        # What a client cannot derive is sent as it is (several calls of one turn pending,
        # or an interaction beside a parked call); `outcome` then stays out, so no
        # arguments travel twice (a client of the previous release sees none pending).
        sent = {k: v for k, v in full.items() if not (k in _DERIVED and derivable[k])}
        if "interactions" in sent and from_outcome:
            sent["outcome"] = None
        if sent.get("attention") is not None:
            sent["attention"] = {k: sent["attention"][k] for k in ("reason", "detail")}
        return sent


def build_snapshot(run_id: str, s: RunState, current: str | None) -> RunSnapshot:
    """The snapshot of run `run_id` in state `s`; `current` is its current details."""
    # Before the parallel patch, `interaction` is what the run waits on only while waiting.
    pending = pending_interactions(s) if s.interactions or s.status == RunStatus.WAITING else []
    blocked = [p.operation for p in s.parked if p.status == RunStatus.NEEDS_ATTENTION]
    failed = [p.operation for p in s.parked if p.status == RunStatus.FAILED]
    if not s.parked:
        blocked = [s.blocked_operation] if s.blocked_operation else []
        failed = [s.failed_operation] if s.status == RunStatus.FAILED else []
    return _SentSnapshot(
        run_id=run_id,
        agent_id=s.agent_id,
        agent_version=s.pin.version if s.pin else None,
        status=s.status,
        # The typed views (interactions, output, attention by reason) are derived by
        # RunSnapshot from these, exactly as a client parsing the sent JSON derives them.
        blocked_operation=s.blocked_operation,
        attention=s.attention,
        interactions=pending,
        blocked_operations=[o for o in blocked if o is not None],
        failed_operations=[o for o in failed if o is not None],
        children=list(s.children.values()),
        parent_run_id=s.parent.run_id if s.parent else None,
        outcome=s.outcome or _waiting_outcome(s),
        turns=s.turns,
        usage=s.usage,
        limits=s.limits if s.pin else None,
        max_turns=turn_budget(s.pin, s.max_turns) if s.pin else None,
        events=_merged(s.events, s.audit),
        error=s.error,
        next_attempt_at=s.next_attempt_at,
        attempt=s.attempt,
        current=current,
    )


def _waiting_outcome(s: RunState) -> dict[str, Any] | None:
    """The deprecated `outcome` of a waiting run whose state does not hold it (runs
    started under the hardening patch keep one copy of the arguments, in `interaction`)."""
    pending = pending_interactions(s)
    if not pending or s.status not in (RunStatus.WAITING, RunStatus.RUNNING):
        return None  # a parked run shows its interactions in `interactions` alone
    return {"type": "interaction", "interaction": pending[0].model_dump(mode="json")}


def _merged(events: list[RunEvent], audit: list[RunEvent]) -> list[RunEvent]:
    """Recent events plus the audit events older than them, in order."""
    seen = {e.seq for e in events}
    return sorted([*events, *(e for e in audit if e.seq not in seen)], key=lambda e: e.seq)
