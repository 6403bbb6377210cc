"""What a reset discards, read from the history it was cut from.

`durably repair` resets a wedged run to the first workflow task that does not
replay. Temporal keeps the history up to that task and drops the rest, so the
new run would schedule again every operation the old run scheduled after that
point: a manual tool call that ran (or may have) would run twice. Before the
new run schedules anything, it is told each such operation's fate, read from
the old run's history here (by the worker, in the `verify_repair` local
activity, and by the client for its report): a result that committed is kept,
a call whose outcome is unknown is treated as after a crash.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.history.v1 import HistoryEvent
from temporalio.converter import DataConverter

from durably.contract import ACTIVITY_MODEL, ACTIVITY_TOOL, OperationFate

__all__ = ["MAX_CARRIED_RESULT_BYTES", "fates_after", "reset_of"]

# Results carried to the repaired run together (they travel in one local activity's
# result, under Temporal's 2 MB payload limit); past it, a completed operation is
# treated as uncertain (a manual call parks instead of losing its result).
MAX_CARRIED_RESULT_BYTES = 1_000_000
_OPERATIONS = (ACTIVITY_TOOL, ACTIVITY_MODEL)
_RESET = WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_WORKFLOW
_UNCERTAIN = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: "it failed",
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: "it timed out",
    EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED: "it was cancelled",
}


def reset_of(events: Sequence[HistoryEvent], run_id: str) -> HistoryEvent | None:
    """The workflow task failure Temporal wrote when it reset a run into `run_id` (the
    latest, if the run was reset more than once), if it was."""
    found = None
    for e in events:
        attributes = e.workflow_task_failed_event_attributes
        if (
            e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
            and attributes.cause == _RESET
            and attributes.new_run_id == run_id
        ):
            found = e
    return found


async def fates_after(
    events: Sequence[HistoryEvent], kept_through: int, converter: DataConverter
) -> list[OperationFate]:
    """The fate of each model request and tool call scheduled after event `kept_through`
    (the last one a reset keeps), in the order they were scheduled; for one scheduled
    more than once, its latest."""
    scheduled, started, closed = _operations_after(events, kept_through)
    fates: dict[str, OperationFate] = {}
    carried = 0
    for event_id, (key, activity) in scheduled.items():
        end = closed.get(event_id)
        fate = OperationFate(operation=key, activity=activity, outcome="uncertain")
        if end is None:
            if event_id not in started:
                fate.outcome, fate.detail = "not_started", "it was scheduled and never started"
            else:
                fate.detail = "it was still running"
        elif end.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            result = await _result(end, converter)
            size = len(end.activity_task_completed_event_attributes.result.SerializeToString())
            if result is not None and carried + size <= MAX_CARRIED_RESULT_BYTES:
                carried += size
                fate.outcome, fate.result, fate.detail = "completed", result, "it completed"
            else:
                fate.detail = "it completed, but its result is too large to carry"
        else:
            fate.detail = _UNCERTAIN[end.event_type]
        fates.pop(key, None)
        fates[key] = fate
    return list(fates.values())


def _operations_after(
    events: Sequence[HistoryEvent], kept_through: int
) -> tuple[dict[int, tuple[str, str]], set[int], dict[int, HistoryEvent]]:
    """After `kept_through`: each operation scheduled (scheduled event id -> key and
    activity), which of them started, and the event that closed each that closed."""
    scheduled: dict[int, tuple[str, str]] = {}
    started: set[int] = set()
    closed: dict[int, HistoryEvent] = {}
    for e in events:
        if e.event_id <= kept_through:
            continue
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            a = e.activity_task_scheduled_event_attributes
            if a.activity_type.name in _OPERATIONS:
                scheduled[e.event_id] = (a.activity_id, a.activity_type.name)
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started.add(e.activity_task_started_event_attributes.scheduled_event_id)
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            closed[e.activity_task_completed_event_attributes.scheduled_event_id] = e
        elif e.event_type in _UNCERTAIN:
            closed[_scheduled_id(e)] = e
    return scheduled, started, closed


def _scheduled_id(e: HistoryEvent) -> int:
    if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
        return e.activity_task_failed_event_attributes.scheduled_event_id
    if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
        return e.activity_task_timed_out_event_attributes.scheduled_event_id
    return e.activity_task_canceled_event_attributes.scheduled_event_id


async def _result(e: HistoryEvent, converter: DataConverter) -> dict[str, Any] | None:
    """A completed activity's result as JSON (decoded with the run's converter)."""
    payloads = e.activity_task_completed_event_attributes.result.payloads
    if len(payloads) != 1:
        return None
    (value,) = await converter.decode(payloads, [dict])
    return value if isinstance(value, dict) else None
