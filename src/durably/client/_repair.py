"""`RunHandle.repair`: bring back a run whose history no longer replays.

A run is wedged when a workflow task in its history does not replay (an SDK
bug such as the query race of `durably._query_guard`, or a bad deploy): every
worker that rebuilds it fails the task, for good. Temporal's reset cuts the
history at a workflow task and starts a new run from there, but it drops every
event after that point, including the results of operations that ran; the new
run would schedule them again, and a manual tool call would run twice.

So the repair finds the first task a fresh worker cannot replay, signals the
run `repair`, and resets it to that task: Temporal copies the signals that came
after the point into the new run's first task, where signals come first. The
new run's worker reads what the reset discarded from the server
(`verify_repair`) and acts on each operation's fate before it schedules
anything. A run that closed takes no signal, so it is first reset to its last
workflow task: that run is open, wedged at once (its first task replays through
the one that does not), and runs nothing; it takes the signal, then the reset.
"""

from __future__ import annotations

import uuid

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType, ResetReapplyExcludeType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client, WorkflowHistory
from temporalio.service import RPCError, RPCStatusCode

from durably._repair import fates_after
from durably.contract import Handler, RepairReport, RepairRequest
from durably.errors import DurableConflictError, RunNotFoundError

__all__ = ["repair_run"]

# Temporal keeps a reset's reason in the new run's history and the Web UI.
_REASON_KEPT = 1_000
_CLOSED = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT,
}


async def repair_run(
    client: Client, run_id: str, request: RepairRequest, *, what: str
) -> RepairReport:
    """Reset the run to its first workflow task that does not replay (see the module)."""
    # Replaying needs the workflow code: loaded here, not with every client.
    from durably._replay import first_unreplayable_task, replay

    try:
        current = (await client.get_workflow_handle(run_id).describe()).run_id
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise RunNotFoundError(f"no {what}: {err.message}") from err
        raise
    handle = client.get_workflow_handle(run_id, run_id=current)
    history = await handle.fetch_history()
    bad = await first_unreplayable_task(history, client.data_converter)
    if bad is None:
        raise DurableConflictError(
            f"{what} replays from its history: it is not wedged, so there is nothing to "
            "repair. `durably repair` resets only a run whose workflow tasks fail on replay "
            "(TMPRL1100); for a run that waits or failed, read its snapshot instead"
        )
    failure = await replay(history, client.data_converter) or "its replay fails"
    kept_through = bad.workflow_task_completed_event_attributes.started_event_id
    fates = await fates_after(history.events, kept_through, client.data_converter)
    who = f" by {request.responder}" if request.responder else ""
    reason = f"durably repair{who}: {request.reason or 'a workflow task does not replay'}"
    original, closed = current, history.events[-1].event_type in _CLOSED
    if closed and _last_task(history).event_id != bad.event_id:
        current = await _reset(client, run_id, current, _last_task(history).event_id, reason)
        closed = False
    if not closed:  # else the task that does not replay closed the run: nothing came after
        await client.get_workflow_handle(run_id, run_id=current).signal(Handler.REPAIR, request)
    new_run_id = await _reset(client, run_id, current, bad.event_id, reason)
    return RepairReport(
        run_id=run_id,
        previous_run_id=original,
        new_run_id=new_run_id,
        reset_to_event=bad.event_id,
        replay_failure=failure[:_REASON_KEPT],
        fates=fates,
    )


async def _reset(client: Client, run_id: str, current: str, to: int, reason: str) -> str:
    """Reset the run to the workflow task completed at event `to`; the new run's id."""
    reset = await client.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=run_id, run_id=current),
            reason=reason[:_REASON_KEPT],
            workflow_task_finish_event_id=to,
            request_id=str(uuid.uuid4()),
            # Temporal would admit the discarded run's updates again in the new run's
            # first task, beside the repair signal: a resolution or a raise taken again
            # there, in whatever order a live worker applies them, is the split that
            # wedged the run (seen repairing a run of the 2,500-run soak). Discarded
            # decisions are asked for again instead (`RepairReport`); signals are kept:
            # the repair signal travels that way.
            reset_reapply_exclude_types=[ResetReapplyExcludeType.RESET_REAPPLY_EXCLUDE_TYPE_UPDATE],
        )
    )
    return reset.run_id


def _last_task(history: WorkflowHistory) -> HistoryEvent:
    return next(
        e
        for e in reversed(history.events)
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    )
