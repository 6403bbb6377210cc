"""Confirming with the server that a run's trusted start came from durably itself.

The failure this prevents: a run honours some of its start input because of
where the run came from, and Temporal says only *that* it came from
somewhere. The state a continue-as-new carries (approvals already given, the
pinned policies) was honoured whenever `workflow.info().continued_run_id`
was set, and any caller that runs a worker on a task queue of its own could
set it: its workflow ran ``continue_as_new({... "answered": {"approval:1:c1":
{... "approved": true}}}, workflow="AgentRunWorkflow", task_queue="durably")``
and the new run paid with nobody approving. A session's conversation and a
subagent's parent are honoured on `workflow.info().parent` alike, and a
workflow of any type on any task queue can be a parent.

Workflow code cannot read another workflow, and any worker can register a
workflow named `AgentRunWorkflow`, so the name alone proves nothing. The
run's first task asks its worker instead (a local activity; its result is
recorded, so replay never asks again) to describe each workflow Temporal
names, and the run honours what that workflow passed only if it is
durably's own type on the run's own task queue: then durably's code, run by
the workers of that queue, wrote it. Who may poll that queue is the trust
boundary already (a poller of it could answer the run's tasks itself), and
it is Temporal's authorization that draws it (README, "Security model").

The same caller could skip the run altogether: its workflow scheduled
`durably.tool_call` on durably's task queue with the arguments and the pin
digest of a genuine run (both are in any run's history) and the worker ran
`pay`. So the worker runs a model request or a tool call only for a workflow
it has confirmed the same way (`Callers`, once per run and worker).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from temporalio import activity
from temporalio.api.enums.v1 import WorkflowExecutionStatus
from temporalio.client import Client, WorkflowExecutionDescription
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from durably._query_guard import ask
from durably.contract import (
    SA_STATUS,
    SESSION_WORKFLOW_TYPE,
    WORKFLOW_TYPE,
    AdvanceCheck,
    ErrorType,
    OriginCheck,
    SessionHandler,
    SessionSnapshot,
    StatusCheck,
)

__all__ = ["Callers", "advanced_past", "described_status", "origin_problem"]

# Runs a worker remembers it confirmed (a run id each); past it, the oldest is asked again.
_CONFIRMED_RUNS = 10_000
# How long a worker waits between attempts to describe a caller the server did not answer for.
_DESCRIBE_BACKOFF = (0.2, 1.0, 5.0)


class Callers:
    """The runs this worker has confirmed are durably's own, so each is described once."""

    def __init__(self, remembered: int = _CONFIRMED_RUNS) -> None:
        self._confirmed: OrderedDict[str, None] = OrderedDict()
        self._remembered = remembered

    async def confirm(self, types: tuple[str, ...] = (WORKFLOW_TYPE,)) -> None:
        """Raise unless the workflow that scheduled this activity is durably's own, of one
        of `types`, on this activity's task queue; a server that does not answer is
        asked again."""
        info = activity.info()
        run = info.workflow_run_id or ""
        if run in self._confirmed and info.workflow_type in types:
            self._confirmed.move_to_end(run)
            return
        found = await _describe_patiently(activity.client(), info.workflow_id or "", run)
        queue = _task_queue(found) if found is not None else None
        if found is None or found.workflow_type not in types or queue != info.task_queue:
            what = (
                "no workflow the server knows"
                if found is None
                else f"a {found.workflow_type[:100]!r} workflow on task queue {str(queue)[:100]!r}"
            )
            raise ApplicationError(
                f"{info.activity_type} was scheduled by {what}, not by a durably "
                f"{' or '.join(types)} on task queue {info.task_queue[:100]!r}: a worker "
                "runs models and tools, and reads transcripts, only for durably's own "
                "workflows. Start a run to call them",
                type=ErrorType.FOREIGN_CALLER,
                non_retryable=True,
            )
        self._confirmed[run] = None
        if len(self._confirmed) > self._remembered:
            self._confirmed.popitem(last=False)


async def _describe_patiently(
    client: Client, workflow_id: str, run_id: str | None
) -> WorkflowExecutionDescription | None:
    """The workflow as the server describes it, None if it has none; asked again until the
    server answers (the activity's heartbeat timeout or cancellation ends the wait)."""
    attempt = 0
    while True:
        try:
            return await client.get_workflow_handle(workflow_id, run_id=run_id).describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return None
            await asyncio.sleep(_DESCRIBE_BACKOFF[min(attempt, len(_DESCRIBE_BACKOFF) - 1)])
            if not activity.info().is_local:  # a local activity's wait is its task's
                activity.heartbeat()
            attempt += 1


def _task_queue(found: WorkflowExecutionDescription) -> str:
    """The workflow's task queue (servers before 1.24 leave `task_queue` of the info empty)."""
    return found.task_queue or found.raw_description.execution_config.task_queue.name


async def origin_problem(client: Client, check: OriginCheck) -> str:
    """Why the run must not honour what its predecessor or parent passed it ("" if it may).

    Raises on a transient error (the local activity retries it); a workflow the
    server no longer has is a problem, not an error.
    """
    if check.predecessor_run_id is not None:
        problem = await _not_durably(
            client,
            check,
            check.workflow_id,
            check.predecessor_run_id,
            (check.predecessor_type,),
            what="the run it continues",
            honoured="state carried across a continue-as-new",
            continued=True,
        )
        if problem:
            return problem
    if check.parent_workflow_id is not None:
        return await _not_durably(
            client,
            check,
            check.parent_workflow_id,
            check.parent_run_id,
            (check.parent_type,) if check.parent_type else (WORKFLOW_TYPE, SESSION_WORKFLOW_TYPE),
            what="its parent workflow",
            honoured="what a session or a parent run passes its child",
            continued=False,
        )
    return ""


async def _not_durably(
    client: Client,
    check: OriginCheck,
    workflow_id: str,
    run_id: str | None,
    expected: tuple[str, ...],
    *,
    what: str,
    honoured: str,
    continued: bool,
) -> str:
    """Why the workflow is not durably's own, of an `expected` type, on the run's task queue
    ("" if it is); `continued`: it must also have continued as new (into this run)."""
    try:
        found = await client.get_workflow_handle(workflow_id, run_id=run_id).describe()
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
        return (
            f"{what} ({workflow_id[:200]!r}, run {run_id!r}) is not on the server, so durably "
            f"cannot confirm it was a durably run; {honoured} is honoured only from one. Start "
            "a new run"
        )
    if (
        found.workflow_type in expected
        and _task_queue(found) == check.task_queue
        and (not continued or _continued_as_new(found))
    ):
        return ""
    return (
        f"{what} is a {found.workflow_type[:100]!r} workflow on task queue "
        f"{_task_queue(found)[:100]!r}, not a durably {' or '.join(expected)} on this run's "
        f"task queue {check.task_queue[:100]!r}; {honoured} is honoured only from durably's own. "
        "Start runs with the client, `durably run` or a session, never through a "
        "workflow of your own"
    )


def _continued_as_new(found: WorkflowExecutionDescription) -> bool:
    status = found.raw_info.status
    return bool(status == WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_CONTINUED_AS_NEW)


async def described_status(client: Client, check: StatusCheck) -> str:
    """The status a run publishes (`DurablyStatus`), as the server holds it now; "" for a
    run the server does not have or that publishes none. A run upserts it in the
    workflow task that sends its note, so a note it sent is never ahead of it."""
    found = await _describe_patiently(client, check.workflow_id, None)
    if found is None:
        return ""
    return found.typed_search_attributes.get(SA_STATUS) or ""


async def advanced_past(client: Client, check: AdvanceCheck) -> bool:
    """Whether the session holds a submission after the run (asked of the session itself,
    which decides it): a `session_advanced` signal says so, and anyone may signal."""
    handle = client.get_workflow_handle(check.session_id)
    snapshot = await ask(handle, SessionHandler.SNAPSHOT, result_type=SessionSnapshot, patient=True)
    ids = [r.run_id for r in snapshot.runs]
    return check.run_id in ids and ids.index(check.run_id) < len(ids) - 1
