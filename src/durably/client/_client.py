"""`DurableClient`: start, find and list runs. Needs no registry and no worker."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Literal

from temporalio.client import Client, WorkflowExecution
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from durably.client._connect import connect_temporal, with_pydantic
from durably.client._handle import RunHandle
from durably.contract import (
    DEFAULT_TASK_QUEUE,
    SA_AGENT,
    SA_AGENT_VERSION,
    SA_STATUS,
    WORKFLOW_TYPE,
    InboxItem,
    Interaction,
    RunInput,
    RunSnapshot,
    RunStatus,
    RunSummary,
)
from durably.errors import DurableConflictError, DurablyError, RunNotFoundError

__all__ = ["DurableClient"]

_UNFINISHED = [s.value for s in RunStatus if s.unfinished]
_FINISHED = [s.value for s in RunStatus if not s.unfinished]
# The search-attribute statuses that wait for a person, and the inbox kind a
# run in them shows as when its snapshot cannot be read. (A retry wait is not
# among them: Temporal holds the backoff, the attribute stays `running`.)
_INBOX: dict[RunStatus, Literal["approval", "blocked", "failed"]] = {
    RunStatus.WAITING: "approval",
    RunStatus.NEEDS_ATTENTION: "blocked",
    RunStatus.FAILED: "failed",
}


class DurableClient:
    """Operators' entry point. Reach for `DurableClient.connect` first."""

    def __init__(self, client: Client, *, task_queue: str = DEFAULT_TASK_QUEUE) -> None:
        self.temporal = with_pydantic(client)
        self.task_queue = task_queue

    @classmethod
    async def connect(
        cls,
        target: str | None = None,
        namespace: str | None = None,
        task_queue: str = DEFAULT_TASK_QUEUE,
        *,
        profile: str | None = None,
    ) -> DurableClient:
        """Connect from arguments, else `TEMPORAL_ADDRESS`/`TEMPORAL_NAMESPACE`/config file."""
        return cls(
            await connect_temporal(target, namespace, profile=profile), task_queue=task_queue
        )

    async def start_run(
        self, agent_id: str, input: str, *, version: str | None = None, run_id: str | None = None
    ) -> RunHandle:
        """Start a run of `agent_id` (newest registered version unless `version`)."""
        run_id = run_id or f"{agent_id}-{uuid.uuid4().hex[:12]}"
        try:
            await self.temporal.start_workflow(
                WORKFLOW_TYPE,
                RunInput(agent_id=agent_id, input=input, version=version),
                id=run_id,
                task_queue=self.task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                search_attributes=TypedSearchAttributes(
                    [
                        SearchAttributePair(SA_STATUS, RunStatus.RUNNING.value),
                        SearchAttributePair(SA_AGENT, agent_id),
                    ]
                ),
                static_summary=f"{agent_id}: {_shorten(input, 120)}",
            )
        except WorkflowAlreadyStartedError as err:
            raise DurableConflictError(
                f"run id {run_id!r} was already used; run ids are never reused. "
                "Pick a new run_id, or omit it to get a generated one."
            ) from err
        except RPCError as err:
            if (
                err.status == RPCStatusCode.INVALID_ARGUMENT
                and "search attribute" in str(err).lower()
            ):
                raise DurablyError(
                    "the Temporal namespace lacks durably's search attributes. Register them: "
                    "`temporal operator search-attribute create --name DurablyStatus "
                    "--type Keyword --name DurablyAgent --type Keyword "
                    "--name DurablyAgentVersion --type Keyword` "
                    f"(server said: {err.message})"
                ) from err
            raise
        return RunHandle(self.temporal, run_id)

    async def get_run(self, run_id: str) -> RunHandle:
        """A handle on an existing run; `RunNotFoundError` if there is none."""
        handle = self.temporal.get_workflow_handle(run_id)
        try:
            await handle.describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise RunNotFoundError(
                    f"no run {run_id!r} in namespace {self.temporal.namespace!r}; "
                    "check the id (`durably runs list`)"
                ) from err
            raise
        return RunHandle(self.temporal, run_id)

    async def inbox(self, *, limit: int = 200) -> list[InboxItem]:
        """Everything that waits for a person, across all runs, oldest first.

        Pending approvals and questions, blocked operations, failed runs and
        retry waits: found through visibility, described by each run's
        snapshot.
        """
        # Running runs are read too, for retry waits, but apart: however many
        # runs are running, they never crowd a parked run out of `limit`.
        parked, running = await asyncio.gather(
            self.list_runs(status=list(_INBOX), limit=limit),
            self.list_runs(status=RunStatus.RUNNING, limit=limit),
        )
        runs = parked + running
        gate = asyncio.Semaphore(16)

        async def describe(run: RunSummary) -> InboxItem | None:
            async with gate:
                try:
                    snap = await RunHandle(self.temporal, run.run_id).snapshot()
                except (RPCError, DurablyError) as err:
                    return _unreadable(run, err)
            return _inbox_item(snap)

        items = [i for i in await asyncio.gather(*map(describe, runs)) if i is not None]
        return sorted(items, key=lambda i: (i.since is None, i.since))

    async def list_runs(
        self,
        *,
        status: RunStatus | str | Sequence[RunStatus | str] | None = None,
        agent_id: str | None = None,
        unfinished: bool | None = None,
        task_queue: str | None = None,
        limit: int | None = 1000,
    ) -> list[RunSummary]:
        """Runs from Temporal visibility, newest first (all task queues unless one is named).

        Visibility trails a run's state by a moment: a run that just changed
        status may still be listed under the old one.
        """
        clauses = [f"WorkflowType = '{WORKFLOW_TYPE}'"]
        if task_queue is not None:
            clauses.append(f"TaskQueue = {_quote(task_queue)}")
        if isinstance(status, str):
            clauses.append(f"{SA_STATUS.name} = {_quote(RunStatus(status).value)}")
        elif status is not None:
            wanted = ", ".join(_quote(RunStatus(v).value) for v in status)
            clauses.append(f"{SA_STATUS.name} IN ({wanted})")
        if agent_id is not None:
            clauses.append(f"{SA_AGENT.name} = {_quote(agent_id)}")
        if unfinished is True:
            clauses.append(f"{SA_STATUS.name} IN ({', '.join(map(_quote, _UNFINISHED))})")
        elif unfinished is False:
            clauses.append(f"{SA_STATUS.name} IN ({', '.join(map(_quote, _FINISHED))})")
        query = " AND ".join(clauses)
        return [_summary(e) async for e in self.temporal.list_workflows(query, limit=limit)]


def _inbox_item(snap: RunSnapshot) -> InboxItem | None:
    """What a parked run waits for, in words, or None if it no longer waits."""
    since = snap.events[-1].at if snap.events else None
    base = {"run_id": snap.run_id, "agent_id": snap.agent_id, "status": snap.status, "since": since}
    if snap.status == RunStatus.WAITING and snap.outcome and "interaction" in snap.outcome:
        i = Interaction.model_validate(snap.outcome["interaction"])
        if i.type == "question":
            return InboxItem(
                **base,
                kind="question",
                waiting_for=f"answer: {i.question}",
                interaction_id=i.id,
                operation=i.operation,
            )
        return InboxItem(
            **base,
            kind="approval",
            waiting_for=f"approve {i.tool}({_shorten(json.dumps(i.args), 80)})",
            interaction_id=i.id,
            operation=i.operation,
        )
    if snap.status == RunStatus.NEEDS_ATTENTION:
        reason = snap.attention.reason if snap.attention else "unknown"
        what = (
            f"verify {snap.attention.detail.get('tool')} in the external system, then resolve it"
            if snap.attention and reason == "tool_interrupted"
            else f"{reason}: fix it, then retry"
        )
        return InboxItem(**base, kind="blocked", waiting_for=what, operation=snap.blocked_operation)
    if snap.status == RunStatus.FAILED:
        return InboxItem(
            **base,
            kind="failed",
            waiting_for=f"retry after fixing: {_shorten(snap.error or '', 120)}",
        )
    if snap.status == RunStatus.RETRY_WAIT:
        return InboxItem(
            **base,
            kind="retry_wait",
            waiting_for=f"attempt {snap.attempt} of a model request",
            next_attempt_at=snap.next_attempt_at,
        )
    return None


def _unreadable(run: RunSummary, err: Exception) -> InboxItem | None:
    if run.status not in _INBOX:
        return None
    return InboxItem(
        run_id=run.run_id,
        agent_id=run.agent_id,
        status=run.status,
        kind=_INBOX[run.status],
        waiting_for=f"(snapshot unavailable: {err}; is a worker running?)",
    )


def _summary(e: WorkflowExecution) -> RunSummary:
    sa = e.typed_search_attributes
    status = sa.get(SA_STATUS)
    return RunSummary(
        run_id=e.id,
        agent_id=sa.get(SA_AGENT),
        agent_version=sa.get(SA_AGENT_VERSION),
        status=RunStatus(status) if status in set(RunStatus) else None,
        started_at=e.start_time,
        closed_at=e.close_time if isinstance(e.close_time, datetime) else None,
    )


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _shorten(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
