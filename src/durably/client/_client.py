"""`DurableClient`: start, find and list runs. Needs no registry and no worker."""

from __future__ import annotations

import uuid
from datetime import datetime

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
    RunInput,
    RunStatus,
    RunSummary,
)
from durably.errors import DurableConflictError, DurablyError, RunNotFoundError

__all__ = ["DurableClient"]

_UNFINISHED = [s.value for s in RunStatus if s.unfinished]


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

    async def list_runs(
        self,
        *,
        status: RunStatus | str | None = None,
        agent_id: str | None = None,
        unfinished: bool | None = None,
        limit: int | None = 1000,
    ) -> list[RunSummary]:
        """Runs from Temporal visibility, newest first."""
        clauses = [f"WorkflowType = '{WORKFLOW_TYPE}'"]
        if status is not None:
            clauses.append(f"{SA_STATUS.name} = {_quote(RunStatus(status).value)}")
        if agent_id is not None:
            clauses.append(f"{SA_AGENT.name} = {_quote(agent_id)}")
        if unfinished is True:
            clauses.append(f"{SA_STATUS.name} IN ({', '.join(map(_quote, _UNFINISHED))})")
        elif unfinished is False:
            clauses.append(f"{SA_STATUS.name} IN ('completed', 'cancelled')")
        query = " AND ".join(clauses)
        return [_summary(e) async for e in self.temporal.list_workflows(query, limit=limit)]


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
