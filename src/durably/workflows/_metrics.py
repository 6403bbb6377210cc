"""What a run reports to telemetry from inside the workflow: the status transitions it
publishes, counted, and the trace it belongs to.

Neither records a command, so neither needs a patch: `workflow.metric_meter()`
reaches the worker's metric meter through an extern function and drops what is
recorded while the workflow replays (a restarted worker never counts a
committed transition twice), and the trace id is read from the workflow's
start header by an extern function durably's tracing interceptor
(`durably.telemetry`) registers; a worker without it reports none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeUpdate

from durably.contract import SA_STATUS
from durably.telemetry import STATUS_TRANSITIONS, TRACE_ID_EXTERN

__all__ = ["run_trace_id", "status_published"]


def status_published(updates: Sequence[SearchAttributeUpdate[Any]], agent_id: str) -> None:
    """Count a `DurablyStatus` this run has just upserted (a transition another
    worker already published and this one replays is not counted again)."""
    for update in updates:
        if update.key.name == SA_STATUS.name:
            counter = workflow.metric_meter().create_counter(
                STATUS_TRANSITIONS, "Run status transitions published by this worker."
            )
            counter.add(1, {"status": str(update.value), "agent_id": agent_id or "-"})


def run_trace_id() -> str | None:
    """The run's trace id (32 hex digits) if this worker traces runs, else None.

    Read, not recorded: the same on every replay and every worker tracing
    the run, so a query may call it.
    """
    read: Callable[[], str | None] | None = workflow.extern_functions().get(TRACE_ID_EXTERN)
    return read() if read is not None else None
