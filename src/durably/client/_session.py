"""`SessionHandle`: what an operator or an app calls on one conversation (SPEC section 13)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
)
from temporalio.service import RPCError, RPCStatusCode

from durably._query_guard import ask
from durably.client._handle import RunHandle, execute_update, temporal_error
from durably.client._live import follow
from durably.contract import (
    CloseRequest,
    IfBusy,
    LiveItem,
    SessionHandler,
    SessionLiveEvent,
    SessionSnapshot,
    SubmitAccepted,
    SubmitRequest,
)
from durably.errors import (
    DurableConflictError,
    DurablyError,
    InvalidRunInputError,
    RunNotFoundError,
)

__all__ = ["SessionHandle"]

_CATCH_UP_S = 30.0


class SessionHandle:
    """One session: submit its next message, read it, close it.

    .. versionadded:: Unreleased
    """

    def __init__(self, client: Client, session_id: str) -> None:
        self._client = client
        self.session_id = session_id
        self._handle = client.get_workflow_handle(session_id)

    def __repr__(self) -> str:
        return f"SessionHandle({self.session_id!r})"

    async def submit(
        self, input: str, *, if_busy: IfBusy = "reject", upgrade: bool = False
    ) -> RunHandle:
        """The conversation's next user message; returns the handle of its run.

        The run reads every earlier message of the session (user, assistant,
        tool results) before its own. While an earlier run is still open,
        `if_busy="reject"` raises `DurableConflictError` naming it (nothing
        is recorded) and `"enqueue"` queues the run to start after it: its
        handle names the run, which exists once the session starts it
        (`snapshot()` shows it `queued` until then, `RunNotFoundError` from
        the handle meanwhile). `upgrade=True` runs this submission on the newest
        registered version of the agent, and the session keeps that version
        from then on (never mid-run: the runs before it keep theirs).
        """
        request = SubmitRequest(input=input, if_busy=if_busy, upgrade=upgrade)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _CATCH_UP_S
        while True:
            try:
                accepted: SubmitAccepted = await self._update(
                    SessionHandler.SUBMIT, request, SubmitAccepted
                )
                return RunHandle(self._client, accepted.run_id)
            except DurableConflictError:
                if if_busy != "reject" or loop.time() > deadline or not await self._catching_up():
                    raise
            await asyncio.sleep(0.05)

    async def _catching_up(self) -> bool:
        """Whether the session was refused as busy only with a run that has closed.

        A run's result reaches its caller a moment before its session has
        taken the run's messages (the session reads them once the run is
        closed): a caller who awaited `result()` and submits at once must
        not be refused for that, so `submit` tries again (for 30 s at most)
        while the run the session waits on has closed. False if it is
        really still open.
        """
        described = await self._handle.describe()
        if described.status != WorkflowExecutionStatus.RUNNING:
            return False  # the session itself has closed
        busy = next((r for r in (await self.snapshot()).runs if r.status == "open"), None)
        if busy is None:
            return True  # it caught up meanwhile
        run = await self._client.get_workflow_handle(busy.run_id).describe()
        return run.status != WorkflowExecutionStatus.RUNNING

    async def events(
        self, *, after: int | None = None, poll_interval: float = 0.2
    ) -> AsyncIterator[LiveItem]:
        """The session's events as they happen, and after each `run_started` every event
        of that run (`RunHandle.events`) until it ends; until the session closes.

        Offsets: a session event's is in the session's stream (resume with
        `after=` it: the runs started after it are followed again from their
        first event); a run event's is in its run's (resume inside a run with
        `RunHandle.events(after=...)`). Reading records nothing.

        .. versionadded:: Unreleased
        """
        async for item in follow(
            self._client,
            self.session_id,
            after=after,
            poll_interval=poll_interval,
            what=f"session {self.session_id!r}",
        ):
            yield item
            event = item.event
            if isinstance(event, SessionLiveEvent) and event.type == "run_started":
                run = RunHandle(self._client, event.run_id or "")
                async for run_item in run.events(poll_interval=poll_interval):
                    yield run_item

    async def snapshot(self) -> SessionSnapshot:
        """The session's runs in order, and how long its conversation is."""
        try:
            snapshot = await ask(self._handle, SessionHandler.SNAPSHOT, result_type=SessionSnapshot)
        except RPCError as err:
            raise self._error(err, "the snapshot") from err
        return snapshot

    async def runs(self) -> list[RunHandle]:
        """A handle on each run of the session, in submission order."""
        return [RunHandle(self._client, r.run_id) for r in (await self.snapshot()).runs]

    async def close(self) -> SessionSnapshot:
        """End the session once its open and queued runs are done; later submissions
        are refused."""
        closed: SessionSnapshot = await self._update(
            SessionHandler.CLOSE, CloseRequest(), SessionSnapshot
        )
        return closed

    async def _update(self, name: str, arg: BaseModel, result_type: type[Any]) -> Any:
        return await execute_update(
            self._client,
            self._handle,
            name,
            arg,
            result_type,
            subject=f"session {self.session_id!r}",
            refused=self._refused_update,
            too_large_as=InvalidRunInputError,
        )

    async def _refused_update(self, err: RPCError, name: str) -> DurablyError:
        return self._error(err, name)

    def _error(self, err: RPCError, what: str) -> DurablyError:
        if err.status == RPCStatusCode.NOT_FOUND and "already completed" in err.message:
            return DurableConflictError(
                f"session {self.session_id!r} is closed; start a new session to go on"
            )
        if err.status == RPCStatusCode.NOT_FOUND:
            return RunNotFoundError(
                f"no open session {self.session_id!r} in namespace {self._client.namespace!r}; "
                "check the id, or start one with start_session"
            )
        return temporal_error(err, self._client, f"{what} of session {self.session_id!r}")
