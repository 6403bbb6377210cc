"""`RunHandle`: what an operator holds to inspect and steer one run."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.service import RPCError, RPCStatusCode

from durably.contract import RunResult, RunSnapshot, RunStatus
from durably.errors import RunCancelledError, RunFailedError, RunNotFoundError

__all__ = ["RunHandle"]

_QUERY_TIMEOUT = timedelta(seconds=10)


class RunHandle:
    """One run, by id. Reading it never changes it."""

    def __init__(self, client: Client, run_id: str) -> None:
        self._client = client
        self.run_id = run_id
        self._handle = client.get_workflow_handle(run_id, result_type=RunResult)

    def __repr__(self) -> str:
        return f"RunHandle({self.run_id!r})"

    async def snapshot(self) -> RunSnapshot:
        """The run's status, outcome, usage and recent events (a query: no history)."""
        try:
            snapshot: RunSnapshot = await self._handle.query(
                "snapshot", result_type=RunSnapshot, rpc_timeout=_QUERY_TIMEOUT
            )
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise RunNotFoundError(
                    f"no run {self.run_id!r} in namespace {self._client.namespace!r}; "
                    "check the id (`durably runs list`)"
                ) from err
            raise
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
                with contextlib.suppress(RPCError):
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
            desc = await self._handle.describe()
            if desc.status == WorkflowExecutionStatus.CANCELED:
                raise RunCancelledError(self.run_id) from err
            raise RunFailedError(self.run_id, str(err.cause or err)) from err
        return result

    async def cancel(self) -> None:
        """Cancel the run: the running tool's `abort_signal` is set, then the run closes."""
        try:
            await self._handle.cancel()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise RunNotFoundError(f"no run {self.run_id!r} to cancel") from err
            raise
