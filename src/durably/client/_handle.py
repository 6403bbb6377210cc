"""`RunHandle`: what an operator holds to inspect and steer one run."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from datetime import UTC, timedelta
from typing import Any

from pydantic import BaseModel
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import (
    Client,
    WorkflowFailureError,
    WorkflowUpdateFailedError,
)
from temporalio.exceptions import ApplicationError, CancelledError, TerminatedError
from temporalio.exceptions import TimeoutError as TemporalTimeoutError
from temporalio.service import RPCError, RPCStatusCode

from durably.contract import (
    ACTIVITY_MODEL,
    SA_STATUS,
    ResolveToolAccepted,
    ResolveToolRequest,
    RespondAccepted,
    RespondRequest,
    RetryAccepted,
    RetryRequest,
    RunResult,
    RunSnapshot,
    RunStatus,
)
from durably.errors import (
    DurableConflictError,
    DurablyError,
    InteractionConflictError,
    InvalidResponseError,
    RunCancelledError,
    RunClosedError,
    RunFailedError,
    RunNotFoundError,
)

__all__ = ["RunHandle"]

_QUERY_TIMEOUT = timedelta(seconds=10)
# Update rejections carry the durably error's name as the ApplicationError type.
_REJECTIONS: dict[str, type[DurablyError]] = {
    "DurableConflictError": DurableConflictError,
    "InteractionConflictError": InteractionConflictError,
    "InvalidResponseError": InvalidResponseError,
}


class RunHandle:
    """One run, by id. Reading it never changes it."""

    def __init__(self, client: Client, run_id: str) -> None:
        self._client = client
        self.run_id = run_id
        self._handle = client.get_workflow_handle(run_id, result_type=RunResult)

    def __repr__(self) -> str:
        return f"RunHandle({self.run_id!r})"

    async def snapshot(self) -> RunSnapshot:
        """The run's status, outcome, usage and recent events (a query: no history).

        A model request waiting out its retry backoff lives in Temporal's
        pending activity, not in the workflow; a running run is shown as
        `retry_wait`, with the server's `next_attempt_at` and the coming
        `attempt`, when its model request is in that state.
        """
        try:
            snapshot: RunSnapshot = await self._handle.query(
                "snapshot", result_type=RunSnapshot, rpc_timeout=_QUERY_TIMEOUT
            )
            if snapshot.status == RunStatus.RUNNING:
                snapshot = await self._with_retry_wait(snapshot)
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise RunNotFoundError(
                    f"no run {self.run_id!r} in namespace {self._client.namespace!r}; "
                    "check the id (`durably runs list`)"
                ) from err
            raise
        return snapshot

    async def _with_retry_wait(self, snapshot: RunSnapshot) -> RunSnapshot:
        description = await self._handle.describe(rpc_timeout=_QUERY_TIMEOUT)
        for pending in description.raw_description.pending_activities:
            waiting = (
                pending.activity_type.name == ACTIVITY_MODEL
                and pending.state == PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED
                and pending.HasField("next_attempt_schedule_time")
            )
            if waiting:
                return snapshot.model_copy(
                    update={
                        "status": RunStatus.RETRY_WAIT,
                        "next_attempt_at": pending.next_attempt_schedule_time.ToDatetime(
                            tzinfo=UTC
                        ),
                        "attempt": pending.attempt,
                        "error": pending.last_failure.message or None,
                    }
                )
        return snapshot

    async def result(self, *, poll_interval: float = 0.5) -> RunResult:
        """Wait until the run completes; raise if it fails or is cancelled.

        A failed run stays open for `retry()`, so failure is read from the
        snapshot while completion is long-polled from Temporal. Waiting never
        answers or approves anything.
        """
        closed = asyncio.create_task(self._closed_result())
        try:
            while True:
                done, _ = await asyncio.wait({closed}, timeout=poll_interval)
                if done:
                    return closed.result()
                # The search attribute, not a query: describing a run needs no
                # worker and is not a billable action.
                with contextlib.suppress(RPCError):
                    described = await self._handle.describe(rpc_timeout=_QUERY_TIMEOUT)
                    if described.typed_search_attributes.get(SA_STATUS) == RunStatus.FAILED:
                        snap = await self.snapshot()
                        if snap.status == RunStatus.FAILED:
                            raise RunFailedError(self.run_id, snap.error or "unknown error")
        finally:
            closed.cancel()
            with contextlib.suppress(BaseException):
                await closed

    async def _closed_result(self) -> RunResult:
        try:
            result: RunResult = await self._handle.result()
        except WorkflowFailureError as err:
            if isinstance(err.cause, CancelledError):
                raise RunCancelledError(self.run_id) from err
            if isinstance(err.cause, TerminatedError):
                raise RunClosedError(self.run_id, "terminated") from err
            if isinstance(err.cause, TemporalTimeoutError):
                raise RunClosedError(self.run_id, "timed out") from err
            raise RunFailedError(self.run_id, str(err.cause or err)) from err
        return result

    async def respond(
        self,
        interaction_id: str,
        response: dict[str, Any] | BaseModel,
        *,
        responder: str | None = None,
    ) -> RespondAccepted:
        """Answer the pending interaction: an approval decision or a question's answer.

        `response` is `{"type": "tool-approval", "approved": bool, "reason"?: str,
        "args_digest"?: str}` or `{"type": "question", "answer": str}`. Sending
        the same response again is harmless and returns the same acceptance
        (it carries the same update id, so history does not grow); a different
        one raises `InteractionConflictError`; an unknown id, wrong type or
        mismatched `args_digest` raises `InvalidResponseError`.
        """
        if isinstance(response, BaseModel):
            response = response.model_dump(mode="json", exclude_none=True)
        request = RespondRequest(
            interaction_id=interaction_id, response=response, responder=responder
        )
        decision = json.dumps(response, sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(f"{interaction_id}\n{decision}".encode()).hexdigest()[:32]
        update_id = f"respond/{interaction_id[:200]}/{digest}"  # ids: at most 1,000 chars
        accepted: RespondAccepted = await self._update(
            "respond", request, RespondAccepted, update_id=update_id
        )
        return accepted

    async def resolve_tool(
        self, operation: str, resolution: dict[str, Any] | BaseModel
    ) -> ResolveToolAccepted:
        """Supply the real outcome of the interrupted tool call `operation`.

        `resolution` is `{"type": "json", "value": ...}` (checked against the
        tool's output schema), `{"type": "error", "message": ...}`, or
        `{"type": "rerun"}` once you verified the effect did not happen. A
        rejected resolution changes nothing and raises `DurableConflictError`
        or `InvalidResponseError`.
        """
        if isinstance(resolution, BaseModel):
            resolution = resolution.model_dump(mode="json")
        request = ResolveToolRequest(operation=operation, resolution=resolution)
        accepted: ResolveToolAccepted = await self._update(
            "resolve_tool", request, ResolveToolAccepted
        )
        return accepted

    async def retry(self) -> RetryAccepted:
        """Run a failed (or version-blocked) run's failed operation again.

        Committed results are kept; a call blocked on an interrupted manual
        tool stays blocked (resolve it instead). Raises `DurableConflictError`
        on a run that is running, waiting, completed or cancelled.
        """
        accepted: RetryAccepted = await self._update("retry", RetryRequest(), RetryAccepted)
        return accepted

    async def _update(
        self, name: str, arg: BaseModel, result_type: type[Any], *, update_id: str | None = None
    ) -> Any:
        try:
            return await self._handle.execute_update(
                name, arg, result_type=result_type, id=update_id
            )
        except WorkflowUpdateFailedError as err:
            cause = err.cause
            if isinstance(cause, ApplicationError) and cause.type in _REJECTIONS:
                raise _REJECTIONS[cause.type](cause.message) from err
            raise DurablyError(f"run {self.run_id!r} rejected {name}: {cause}") from err
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise DurableConflictError(
                    f"run {self.run_id!r} is closed (completed or cancelled) or does not "
                    f"exist; {name} needs an open run"
                ) from err
            raise

    async def cancel(self) -> None:
        """Cancel the run: the running tool's `abort_signal` is set, then the run closes."""
        try:
            await self._handle.cancel()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise RunNotFoundError(f"no run {self.run_id!r} to cancel") from err
            raise
