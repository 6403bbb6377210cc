"""`RunHandle`: what an operator holds to inspect and steer one run.

Every failure reaches the caller as a `DurablyError` that says what to do:
a request Temporal refuses, a server that does not answer, a closed run
(with how it closed) or a run that does not exist. The SDK's `RPCError` and
pydantic's `ValidationError` never escape as they are.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import UTC, timedelta
from typing import Any

from pydantic import BaseModel, ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.api.errordetails.v1 import QueryFailedFailure
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.converter import PayloadConverter
from temporalio.exceptions import ApplicationError, CancelledError, TerminatedError
from temporalio.exceptions import TimeoutError as TemporalTimeoutError
from temporalio.service import RPCError, RPCStatusCode

from durably._query_guard import ask
from durably._text import printable
from durably.approvals import ApprovalKeys
from durably.client._live import follow
from durably.client._repair import repair_run
from durably.contract import (
    ACTIVITY_MODEL,
    MAX_NAME_CHARS,
    SA_SESSION,
    SA_STATUS,
    Answer,
    Approval,
    ApprovalResponse,
    Denial,
    ErrorResolution,
    ErrorType,
    Handler,
    Interaction,
    JsonResolution,
    LiveItem,
    RaiseLimitsAccepted,
    RaiseLimitsRequest,
    RepairReport,
    RepairRequest,
    RerunResolution,
    ResolveToolAccepted,
    ResolveToolRequest,
    RespondAccepted,
    RespondManyAccepted,
    RespondManyRequest,
    RespondRequest,
    RetryAccepted,
    RetryRequest,
    RunResult,
    RunSnapshot,
    RunStatus,
    UsageLimits,
)
from durably.errors import (
    DurableConflictError,
    DurablyError,
    InteractionConflictError,
    InvalidResponseError,
    InvalidRunInputError,
    RunCancelledError,
    RunClosedError,
    RunFailedError,
    RunNotFoundError,
    TemporalUnavailableError,
)

__all__ = ["RunHandle", "closed_how", "durably_error", "temporal_error", "too_large"]

_QUERY_TIMEOUT = timedelta(seconds=10)
# The failures a run raises on purpose that reach a client (an update's rejection,
# a refused start input), by `ApplicationError.type`, and the error each becomes.
_ERRORS: dict[str, type[DurablyError]] = {
    ErrorType.DURABLE_CONFLICT: DurableConflictError,
    ErrorType.INTERACTION_CONFLICT: InteractionConflictError,
    ErrorType.INVALID_RESPONSE: InvalidResponseError,
    ErrorType.INVALID_RUN_INPUT: InvalidRunInputError,
}
# What a request that got no answer ends with: the server is down or
# unreachable, or the call's deadline passed (the SDK reports its own
# rpc_timeout as CANCELLED).
_UNANSWERED = frozenset(
    {RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED}
)
_CLOSED = {
    WorkflowExecutionStatus.COMPLETED: "completed",
    WorkflowExecutionStatus.CANCELED: "cancelled",
    WorkflowExecutionStatus.TERMINATED: "terminated",
    WorkflowExecutionStatus.TIMED_OUT: "timed out",
    WorkflowExecutionStatus.FAILED: "failed (its Temporal workflow failed)",
    WorkflowExecutionStatus.CONTINUED_AS_NEW: "closed (continued as new, no newer run open)",
}
# The events that close a Temporal run, by the name of their attributes field.
_CLOSE_EVENTS = frozenset(
    {
        "workflow_execution_completed_event_attributes",
        "workflow_execution_failed_event_attributes",
        "workflow_execution_canceled_event_attributes",
        "workflow_execution_terminated_event_attributes",
        "workflow_execution_timed_out_event_attributes",
        "workflow_execution_continued_as_new_event_attributes",
    }
)
# Those that may name a next run of the chain (`new_execution_run_id`).
_FOLLOWED = _CLOSE_EVENTS - {
    "workflow_execution_canceled_event_attributes",
    "workflow_execution_terminated_event_attributes",
}
# How long `result()` waits before it first reads a run's history for a failure,
# and at most between two reads (each pause doubles): every event ends a history
# long poll, and a busy run writes dozens a second. A page of at least
# `_CATCH_UP` events may have more behind it (the server pages a long history,
# 512 events a page on the dev server), so the next one is read at once.
_FIRST_READ = 1.0
_SLOWEST_READ = 5.0
_CATCH_UP = 100


class RunHandle:
    """One run, by id. Reading it never changes it."""

    def __init__(self, client: Client, run_id: str) -> None:
        self._client = client
        self.run_id = run_id
        self._handle = client.get_workflow_handle(run_id, result_type=RunResult)

    def __repr__(self) -> str:
        return f"RunHandle({self.run_id!r})"

    async def snapshot(self) -> RunSnapshot:
        """The run's status, what it waits for, its output, usage and recent events.

        A query: it adds nothing to history and never changes the run.

        A run holds its own `retry_wait` (and `next_attempt_at`, `attempt`)
        while it waits out a model request's backoff in a durable timer. Runs
        started before the `durably-seed-fidelity` patch leave that backoff to
        Temporal's pending activity instead: such a running run is shown as
        `retry_wait`, with the server's `next_attempt_at` and the coming
        `attempt`, when its model request is in that state.
        """
        try:
            snapshot = await ask(
                self._handle, Handler.SNAPSHOT, result_type=RunSnapshot, rpc_timeout=_QUERY_TIMEOUT
            )
            if snapshot.status == RunStatus.RUNNING:
                snapshot = await self._with_retry_wait(snapshot)
        except WorkflowQueryFailedError as err:
            raise DurablyError(
                f"the worker could not answer the snapshot query of run {self.run_id!r}: "
                f"{await self._query_failure(err)}"
            ) from err
        except RPCError as err:
            if err.status in (RPCStatusCode.CANCELLED, RPCStatusCode.DEADLINE_EXCEEDED):
                # The server was reached; a query is answered by a worker.
                raise TemporalUnavailableError(
                    f"no answer to the snapshot query of run {self.run_id!r} within "
                    f"{_QUERY_TIMEOUT.total_seconds():.0f} s. A worker hosting the run's agent "
                    "answers queries: check that one is running on the run's task queue "
                    f"(`durably worker --agents ...`) and that Temporal at "
                    f"{_address(self._client)} is reachable, then try again.",
                    status=err.status,
                    raw_grpc_status=err.raw_grpc_status,
                ) from err
            raise self._rpc_error(err, f"the snapshot of run {self.run_id!r}") from err
        return snapshot

    async def _query_failure(self, err: WorkflowQueryFailedError) -> str:
        """Why a worker failed a query. With encryption on, the SDK gives only "Encoded
        failure"; the failure itself is in the server's error details, and this client
        may hold the key that decodes it (a worker missing a key says which)."""
        refused = err.__context__
        if isinstance(refused, RPCError) and refused.grpc_status is not None:
            for detail in refused.grpc_status.details:
                failed = QueryFailedFailure()
                if detail.Unpack(failed) and failed.HasField("failure"):
                    try:
                        decoded = await self._client.data_converter.decode_failure(failed.failure)
                    except Exception:  # not decodable here either: say what the server said
                        break
                    return str(decoded)
        return err.message

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

    async def result(self, *, poll_interval: float | None = None) -> RunResult:
        """Wait until the run completes; raise if it fails or is cancelled.

        Returns at `completed`; raises `RunFailedError` at `failed` (the run
        stays open for `retry()`), `RunCancelledError` when it is cancelled and
        `RunClosedError` when Temporal closes it (terminated, timed out). It
        keeps waiting through `waiting`, `retry_wait` and `needs_attention`,
        follows continue-as-new to the newest run, and never answers or
        approves anything.

        Nothing is polled: the run's end comes from Temporal's own
        `handle.result()` (a long poll for the close event), and a failure,
        which leaves the run open, from a second history long poll that reads
        the `DurablyStatus` the run publishes. A busy run's history is read at
        most once a second at first, then less often (every 5 s at most), so
        `failed` is noticed within that; a run that waits costs nothing.

        Each call reads the run's history once from its start (a long run's
        history may be megabytes) before it waits on new events: the cost of
        watching for a failure without a query. A `failed` status found
        there is confirmed by the run's snapshot; while no worker answers that
        query (workers being redeployed, say), the wait goes on and asks again
        at the next read.

        `poll_interval` is ignored; it is kept so that calls passing it still work.

        .. versionchanged:: Unreleased
           History long polls instead of describing the run every `poll_interval`.
        """
        del poll_interval
        closed = asyncio.create_task(self._closed_result())
        watching = asyncio.create_task(self._failure())
        try:
            await asyncio.wait({closed, watching}, return_when=asyncio.FIRST_COMPLETED)
            if watching.done() and not closed.done():
                watching.result()  # RunFailedError; or it saw the run close
            return await closed
        finally:
            for task in (closed, watching):
                task.cancel()
            await asyncio.gather(closed, watching, return_exceptions=True)

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
            error = durably_error(err.cause)
            if isinstance(error, InvalidRunInputError):
                raise InvalidRunInputError(
                    f"run {self.run_id!r} never started: {error}. Start a new run "
                    "with a valid input."
                ) from err
            raise RunFailedError(self.run_id, str(err.cause or err)) from err
        except RPCError as err:
            raise self._rpc_error(err, f"the result of run {self.run_id!r}") from err
        return result

    async def _failure(self) -> None:
        """Raise `RunFailedError` once the run parks as failed; return if its chain closes.

        Reads the history of the newest run of the chain as it grows (following
        continue-as-new), pausing between reads once caught up so that a busy
        run, whose every event would end a long poll, is read seldom. A
        `failed` status the run publishes is confirmed by its snapshot (which
        also gives the error): the run may have been retried since.
        """
        temporal_run: str | None = None  # None: the newest run of the chain
        token: bytes | None = None
        # The event that published a `failed` status still to be confirmed
        # (None: the newest status published is not `failed`).
        unconfirmed: tuple[str | None, int] | None = None
        pause = _FIRST_READ
        events: list[HistoryEvent] = []
        while True:
            if len(events) < _CATCH_UP:
                await asyncio.sleep(pause)
                pause = min(2 * pause, _SLOWEST_READ)
            events, token = await self._history_page(temporal_run, token)
            for event in events:
                published = _published_status(event)
                if published is not None:
                    failed = published == RunStatus.FAILED
                    unconfirmed = (temporal_run, event.event_id) if failed else None
                elif event.WhichOneof("attributes") in _CLOSE_EVENTS:
                    temporal_run = _next_run(event)
                    if temporal_run is None:
                        return  # the chain closed: its close event tells the rest
                    token, unconfirmed = None, None
                    break
            if unconfirmed is None or token is None:
                continue
            try:
                snap = await self.snapshot()
            except TemporalUnavailableError:
                continue  # no worker answered (one is being redeployed, say): ask at the next read
            if snap.status == RunStatus.FAILED:
                raise RunFailedError(self.run_id, snap.error or "unknown error")
            unconfirmed = None  # retried already: what it publishes next is in the history

    async def _history_page(
        self, temporal_run: str | None, token: bytes | None
    ) -> tuple[list[HistoryEvent], bytes | None]:
        """The run's events after `token`, once there are any (a long poll).

        `temporal_run` names one run of the chain (None: the newest); an empty
        page comes back when the server's long poll expires.
        """
        handle = self._client.get_workflow_handle(self.run_id, run_id=temporal_run)
        page = handle.fetch_history_events(
            next_page_token=token, wait_new_event=True, skip_archival=True
        )
        try:
            await page.fetch_next_page()
        except RPCError as err:
            raise self._rpc_error(err, f"the result of run {self.run_id!r}") from err
        return list(page.current_page or ()), page.next_page_token or token

    async def pending(self) -> list[Interaction]:
        """The approvals and questions the run waits on, oldest first (none: an empty list).

        Each can be passed to `approve`, `deny` or `answer` as it is.
        """
        return (await self.snapshot()).interactions

    async def approve(
        self,
        interaction: Interaction | str,
        *,
        responder: str | None = None,
        reason: str | None = None,
        args_digest: str | None = None,
        keys: ApprovalKeys | None = None,
        token: str | None = None,
    ) -> RespondAccepted:
        """Approve a pending tool call: it runs.

        `interaction` is the pending `Interaction` (from `pending()` or the
        snapshot) or its id. An `Interaction` binds the approval to the
        arguments it shows (its `args_digest`): if the call's arguments
        differ, `InvalidResponseError` and nothing is approved; with an id,
        pass `args_digest=` for the same. A tool whose registration names
        approvers takes signed decisions only: pass `keys` (they sign as
        `responder`) or a `token` signed elsewhere. Repeating an approval is
        harmless; see `respond` for what else is refused.
        """
        return await self._decide(
            interaction, Approval, reason, responder, args_digest, keys, token
        )

    async def deny(
        self,
        interaction: Interaction | str,
        *,
        reason: str | None = None,
        responder: str | None = None,
        args_digest: str | None = None,
        keys: ApprovalKeys | None = None,
        token: str | None = None,
    ) -> RespondAccepted:
        """Deny a pending tool call: it never runs; the model reads `denied: <reason>`.

        Arguments as for `approve`.
        """
        return await self._decide(interaction, Denial, reason, responder, args_digest, keys, token)

    async def answer(
        self, interaction: Interaction | str, text: str, *, responder: str | None = None
    ) -> RespondAccepted:
        """Answer a pending question: the model reads `text` as the question tool's result."""
        iid = interaction.id if isinstance(interaction, Interaction) else interaction
        return await self.respond(iid, Answer(answer=text), responder=responder)

    async def _decide(
        self,
        interaction: Interaction | str,
        decision: type[Approval] | type[Denial],
        reason: str | None,
        responder: str | None,
        args_digest: str | None,
        keys: ApprovalKeys | None,
        token: str | None,
    ) -> RespondAccepted:
        shown = interaction if isinstance(interaction, Interaction) else None
        iid = shown.id if shown is not None else interaction
        _check_type("interaction", iid, str, "an Interaction from pending(), or its id")
        if keys is not None and token is None:
            if responder is None:
                raise InvalidResponseError(
                    "a signed decision names its approver: pass responder= (who decides), "
                    "as the registration's approvers list them"
                )
            shown = shown if shown is not None else await self._pending_one(str(iid))
            try:
                token = keys.sign(
                    shown, approved=decision is Approval, approver=responder, reason=reason
                )
            except DurablyError as err:
                raise InvalidResponseError(str(err)) from err
        elif shown is not None and shown.signed and token is None:
            raise InvalidResponseError(
                f"interaction {shown.id!r} takes signed decisions only (tool {shown.tool!r} "
                "names its approvers): pass keys= (an ApprovalKeys holding a key the workers "
                "hold, e.g. ApprovalKeys.from_env()) with responder=, or a token="
            )
        if args_digest is None and shown is not None:
            args_digest = shown.args_digest
        response = decision(reason=reason, args_digest=args_digest, token=token)
        return await self.respond(str(iid), response, responder=responder)

    async def _pending_one(self, interaction_id: str) -> Interaction:
        pending = await self.pending()
        for interaction in pending:
            if interaction.id == interaction_id:
                return interaction
        now = ", ".join(repr(i.id) for i in pending) or "none"
        raise InvalidResponseError(
            f"run {self.run_id!r} waits on no interaction {interaction_id!r} (pending: {now}), "
            "so nothing was signed or sent; read pending() for the interaction to decide on"
        )

    async def respond(
        self,
        interaction_id: str,
        response: ApprovalResponse | Answer | dict[str, Any] | BaseModel,
        *,
        responder: str | None = None,
    ) -> RespondAccepted:
        """Answer a pending interaction: an approval decision or a question's answer.

        `approve`, `deny` and `answer` build the response for you. `response`
        is an `Approval`, `Denial` or `Answer`, or the same as JSON:
        `{"type": "tool-approval", "approved": bool, "reason"?: str,
        "args_digest"?: str, "token"?: str}` or `{"type": "question", "answer":
        str}`. Sending the same response again is harmless and returns the same
        acceptance (it carries the same update id, so history does not grow);
        a different one raises `InteractionConflictError`; an unknown id, wrong
        type or mismatched `args_digest`, or arguments of the wrong type, raise
        `InvalidResponseError`.
        """
        if isinstance(response, BaseModel):
            response = response.model_dump(mode="json", exclude_none=True)
        _check_type("interaction_id", interaction_id, str, "such as 'approval:1:call_7'")
        _check_type(
            "response",
            response,
            dict,
            "such as {'type': 'tool-approval', 'approved': True} or a pydantic model",
        )
        _check_type("responder", responder, (str, type(None)), "naming who answered")
        decision = _canonical_json("response", response)
        request = _request(
            RespondRequest,
            interaction_id=interaction_id,
            response=response,
            responder=responder,
            identity=_identity(self._client),
        )
        digest = hashlib.sha256(f"{interaction_id}\n{decision}".encode()).hexdigest()[:32]
        update_id = f"respond/{interaction_id[:200]}/{digest}"  # ids: at most 1,000 chars
        accepted: RespondAccepted = await self._update(
            Handler.RESPOND, request, RespondAccepted, update_id=update_id
        )
        return accepted

    async def respond_many(
        self,
        responses: Mapping[str, ApprovalResponse | Answer | dict[str, Any] | BaseModel],
        *,
        responder: str | None = None,
    ) -> list[RespondAccepted]:
        """Answer several pending interactions at once, by id: all are accepted or none.

        Each response follows `respond`'s rules; if any is refused (unknown
        id, wrong type, a different decision than one already taken, a
        mismatched `args_digest`), the error names it and nothing is
        recorded. Repeating the same batch is harmless. `approve_all` and
        `deny_all` build the batch for you.

        .. versionadded:: Unreleased
        """
        _check_type("responses", responses, Mapping, "a mapping of interaction id to response")
        _check_type("responder", responder, (str, type(None)), "naming who answered")
        entries: list[dict[str, Any]] = []
        for interaction_id, response in responses.items():
            if isinstance(response, BaseModel):
                response = response.model_dump(mode="json", exclude_none=True)
            _check_type("interaction_id", interaction_id, str, "such as 'approval:1:call_7'")
            _check_type("response", response, dict, "such as {'type': 'tool-approval', ...}")
            entries.append({"interaction_id": interaction_id, "response": response})
        batch = _canonical_json("responses", entries)
        request = _request(
            RespondManyRequest,
            responses=[
                RespondRequest(**e, responder=responder, identity=_identity(self._client))
                for e in entries
            ],
        )
        digest = hashlib.sha256(batch.encode()).hexdigest()[:32]
        accepted: RespondManyAccepted = await self._update(
            Handler.RESPOND_MANY, request, RespondManyAccepted, update_id=f"respond_many/{digest}"
        )
        return accepted.accepted

    async def approve_all(
        self,
        interactions: Sequence[Interaction],
        *,
        responder: str | None = None,
        reason: str | None = None,
        keys: ApprovalKeys | None = None,
    ) -> list[RespondAccepted]:
        """Approve each of these tool calls (as shown: their `args_digest`), all or none.

        Pass the interactions a person reviewed, never a fresh `pending()`:
        an interaction that appeared since is not approved. Signed calls need
        `keys` (they sign as `responder`).

        .. versionadded:: Unreleased
        """
        return await self._decide_all(interactions, Approval, reason, responder, keys)

    async def deny_all(
        self,
        interactions: Sequence[Interaction],
        *,
        reason: str | None = None,
        responder: str | None = None,
        keys: ApprovalKeys | None = None,
    ) -> list[RespondAccepted]:
        """Deny each of these tool calls, all or none (see `approve_all`).

        .. versionadded:: Unreleased
        """
        return await self._decide_all(interactions, Denial, reason, responder, keys)

    async def _decide_all(
        self,
        interactions: Sequence[Interaction],
        decision: type[Approval] | type[Denial],
        reason: str | None,
        responder: str | None,
        keys: ApprovalKeys | None,
    ) -> list[RespondAccepted]:
        responses: dict[str, BaseModel] = {}
        for shown in interactions:
            _check_type("interactions", shown, Interaction, "Interactions from pending()")
            if shown.type != "tool-approval":
                raise InvalidResponseError(
                    f"interaction {shown.id!r} is a question, not an approval; answer it "
                    "with answer(), and pass only tool approvals here"
                )
            token = None
            if shown.signed:
                if keys is None or responder is None:
                    raise InvalidResponseError(
                        f"interaction {shown.id!r} takes signed decisions only (tool "
                        f"{shown.tool!r} names its approvers): pass keys= and responder="
                    )
                try:
                    token = keys.sign(
                        shown, approved=decision is Approval, approver=responder, reason=reason
                    )
                except DurablyError as err:
                    raise InvalidResponseError(str(err)) from err
            responses[shown.id] = decision(
                reason=reason, args_digest=shown.args_digest, token=token
            )
        return await self.respond_many(responses, responder=responder)

    async def resolve_tool(
        self,
        operation: str,
        resolution: JsonResolution | ErrorResolution | RerunResolution | dict[str, Any] | BaseModel,
    ) -> ResolveToolAccepted:
        """Supply the real outcome of the interrupted tool call `operation`.

        `operation` is the snapshot's `blocked_operation` (one of
        `blocked_operations`). `resolution` is `JsonResolution(value=...)`
        (the call's result, checked against the tool's output schema),
        `ErrorResolution(message=...)` (it failed), or `RerunResolution()` once
        you verified the effect did not happen; or the same as JSON
        (`{"type": "json", "value": ...}`, `{"type": "error", "message": ...}`,
        `{"type": "rerun"}`). A rejected resolution changes nothing and raises
        `DurableConflictError` or `InvalidResponseError`.
        """
        if isinstance(resolution, BaseModel):
            resolution = resolution.model_dump(mode="json")
        _check_type("operation", operation, str, "such as 'tool:2:call_1'")
        _check_type("resolution", resolution, dict, "such as {'type': 'rerun'}")
        _canonical_json("resolution", resolution)
        request = _request(ResolveToolRequest, operation=operation, resolution=resolution)
        accepted: ResolveToolAccepted = await self._update(
            Handler.RESOLVE_TOOL, request, ResolveToolAccepted
        )
        return accepted

    async def raise_limits(
        self, limits: UsageLimits | Mapping[str, Any], *, responder: str | None = None
    ) -> RaiseLimitsAccepted:
        """Set some of the run's usage limits (the others stay): a run parked on a limit
        (`budget_exceeded`) goes on once it is under every limit again.

        Each value may be at most what the registration's `limit_cap` allows.
        A value that would leave the parked run still over the limit, or above
        the cap, is refused with `InvalidResponseError`, changing nothing;
        `responder` is recorded in the run's events (self-declared).
        """
        if isinstance(limits, Mapping):
            limits = _request(UsageLimits, **dict(limits))
        _check_type("limits", limits, UsageLimits, "such as {'total_tokens': 20000}")
        request = _request(RaiseLimitsRequest, limits=limits, responder=responder)
        accepted: RaiseLimitsAccepted = await self._update(
            Handler.RAISE_LIMITS, request, RaiseLimitsAccepted
        )
        return accepted

    async def retry(self) -> RetryAccepted:
        """Run a failed (or version-blocked) run's failed operation again.

        Committed results are kept; a call blocked on an interrupted manual
        tool stays blocked (resolve it instead). Raises `DurableConflictError`
        on a run that is running, waiting, completed or cancelled.
        """
        accepted: RetryAccepted = await self._update(Handler.RETRY, RetryRequest(), RetryAccepted)
        return accepted

    async def repair(
        self, *, responder: str | None = None, reason: str | None = None
    ) -> RepairReport:
        """Bring back a wedged run: one whose history no longer replays, so every workflow
        task fails (TMPRL1100) whichever worker takes it.

        The run is reset to its first workflow task that does not replay. The new
        run keeps every committed result from before that point and, before it
        schedules anything, learns what became of each operation the reset
        discarded: a result that committed is kept, a manual call that started
        (or may have) parks in `needs_attention` as after a crash, and any other
        operation runs again under its unchanged `operation_id`. `responder` and
        `reason` are recorded in the run's events and the reset's reason. Raises
        `DurableConflictError` for a run that replays (nothing to repair).

        .. versionadded:: Unreleased
        """
        request = _request(RepairRequest, responder=responder, reason=reason)
        return await repair_run(self._client, self.run_id, request, what=f"run {self.run_id!r}")

    async def _update(
        self, name: str, arg: BaseModel, result_type: type[Any], *, update_id: str | None = None
    ) -> Any:
        return await execute_update(
            self._client,
            self._handle,
            name,
            arg,
            result_type,
            subject=f"run {self.run_id!r}",
            refused=self._refused_update,
            update_id=update_id,
        )

    async def _refused_update(self, err: RPCError, name: str) -> DurablyError:
        if err.status == RPCStatusCode.NOT_FOUND:
            return await self._not_open(name)
        return temporal_error(err, self._client, f"{name} of run {self.run_id!r}")

    async def events(
        self, *, after: int | None = None, poll_interval: float = 0.2
    ) -> AsyncIterator[LiveItem]:
        """The run's committed events as they happen, from offset `after` on (from its
        first event if None), until the run completes or is cancelled.

        Each `LiveItem` holds its `offset`: pass the last one you handled as
        `after` to resume, missing and repeating nothing (the run keeps its
        latest 1,000 events for followers). It follows the run through
        continue-as-new, and through workers restarting. Reading records
        nothing in the run's history, however many follow it; it never
        answers or approves anything. `poll_interval` is how long it waits
        between reads once it has caught up.

        .. versionadded:: Unreleased
        """
        async for item in follow(
            self._client,
            self.run_id,
            after=after,
            poll_interval=poll_interval,
            what=f"run {self.run_id!r}",
        ):
            yield item

    async def cancel(self) -> None:
        """Cancel the run: the running tool's `abort_signal` is set, then the run closes.

        Raises `DurableConflictError` if the run is already closed (nothing is
        cancelled then) and `RunNotFoundError` if there is no such run. Asking
        again while a cancellation is pending is harmless.
        """
        operation = f"cancel of run {self.run_id!r}"
        try:
            described = await self._handle.describe(rpc_timeout=_QUERY_TIMEOUT)
            how = closed_how(described.status)
            if how is None:
                await self._handle.cancel(rpc_timeout=_QUERY_TIMEOUT)
                return
        except RPCError as err:
            raise self._rpc_error(err, operation) from err
        raise DurableConflictError(
            f"run {self.run_id!r} is already {how}; nothing was cancelled. {_after_close(how)}"
        )

    async def _not_open(self, operation: str) -> DurablyError:
        """Why `operation` found no open run: how the run closed, or that there is none."""
        try:
            described = await self._handle.describe(rpc_timeout=_QUERY_TIMEOUT)
        except RPCError as err:
            return self._rpc_error(err, f"{operation} of run {self.run_id!r}")
        how = closed_how(described.status)
        if how is None:  # open after all: it continued as new while the request was sent
            return DurableConflictError(
                f"run {self.run_id!r} moved on to a new Temporal run while {operation} was "
                "sent; send it again"
            )
        session = described.typed_search_attributes.get(SA_SESSION)
        if session is not None and how.startswith("failed"):
            return DurableConflictError(
                f"run {self.run_id!r} failed and a later submission has advanced session "
                f"{session!r}; {operation} needs an open run, so nothing was changed. Its "
                "committed messages stay in the session's conversation"
            )
        return DurableConflictError(
            f"run {self.run_id!r} is {how}; {operation} needs an open run, so nothing was "
            f"changed. {_after_close(how)}"
        )

    def _rpc_error(self, err: RPCError, operation: str) -> DurablyError:
        """The durably error for an RPC failure of `operation` on this run: no such
        run is `RunNotFoundError`, anything else `temporal_error`'s."""
        if err.status == RPCStatusCode.NOT_FOUND:
            return self._not_found()
        return temporal_error(err, self._client, operation)

    def _not_found(self) -> RunNotFoundError:
        return RunNotFoundError(
            f"no run {self.run_id!r} in namespace {self._client.namespace!r}; "
            "check the id (`durably runs list`)"
        )


def durably_error(failure: BaseException | None) -> DurablyError | None:
    """The durably error a run's deliberate failure stands for (its message kept), or None.

    Every place the client reads a failure type goes through this one table.
    """
    if isinstance(failure, ApplicationError) and failure.type in _ERRORS:
        return _ERRORS[failure.type](failure.message)
    return None


def closed_how(status: WorkflowExecutionStatus | None) -> str | None:
    """How a closed workflow ended, in words; None while it is open."""
    if status == WorkflowExecutionStatus.RUNNING:
        return None
    return _CLOSED.get(status, "closed") if status is not None else "closed"


def temporal_error(err: RPCError, client: Client, operation: str) -> DurablyError:
    """The durably error for an RPC failure that has no more specific meaning.

    No answer at all is `TemporalUnavailableError`; anything else Temporal
    refused is a `DurablyError` naming `operation` and the server's message.
    """
    address = _address(client)
    if err.status in _UNANSWERED:
        return TemporalUnavailableError(
            f"Temporal at {address} did not answer {operation} ({err.status.name}: "
            f"{err.message}). Check that the server is running and reachable from here "
            f"(`temporal operator cluster health --address {address}`), then try again.",
            status=err.status,
            raw_grpc_status=err.raw_grpc_status,
        )
    if err.status in (RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.UNAUTHENTICATED):
        advice = (
            f"check the credentials (TLS certificate or API key) and that they grant "
            f"namespace {client.namespace!r}"
        )
    elif err.status == RPCStatusCode.RESOURCE_EXHAUSTED and not too_large(err):
        advice = "the server is rate-limiting requests; wait a moment and try again"
    else:
        advice = "the server's message says why; if it does not, check the server's log"
    return DurablyError(
        f"Temporal at {address} refused {operation} ({err.status.name}: {err.message}); {advice}"
    )


async def execute_update(
    client: Client,
    handle: WorkflowHandle[Any, Any],
    name: str,
    arg: BaseModel,
    result_type: type[Any],
    *,
    subject: str,
    refused: Callable[[RPCError, str], Awaitable[DurablyError]],
    update_id: str | None = None,
    too_large_as: type[DurablyError] = InvalidResponseError,
) -> Any:
    """An update of a run or a session (`subject` names it), every failure as the durably
    error it stands for; `refused` maps what else Temporal refuses (a closed workflow)."""
    try:
        return await handle.execute_update(name, arg, result_type=result_type, id=update_id)
    except WorkflowUpdateFailedError as err:
        raise (
            durably_error(err.cause) or DurablyError(f"{subject} rejected {name}: {err.cause}")
        ) from err
    except WorkflowUpdateRPCTimeoutOrCancelledError as err:
        raise TemporalUnavailableError(
            f"Temporal at {_address(client)} did not confirm {name} of {subject} in "
            "time; it may still be applied. Read its snapshot to see whether it was before "
            "sending it again.",
            status=RPCStatusCode.DEADLINE_EXCEEDED,
        ) from err
    except RPCError as err:
        if too_large(err):
            raise too_large_as(
                f"the {name} request is too large for Temporal ({err.message}); send a smaller one"
            ) from err
        raise await refused(err, name) from err


def too_large(err: RPCError) -> bool:
    """Whether Temporal refused a payload (2 MB) or gRPC a message (4 MB) as too large."""
    message = err.message.lower()
    return (err.status == RPCStatusCode.INVALID_ARGUMENT and "size exceeds" in message) or (
        err.status == RPCStatusCode.RESOURCE_EXHAUSTED and "larger than max" in message
    )


def _published_status(event: HistoryEvent) -> str | None:
    """The `DurablyStatus` a run's start or search-attribute upsert sets, if it sets one."""
    if event.HasField("upsert_workflow_search_attributes_event_attributes"):
        fields = event.upsert_workflow_search_attributes_event_attributes.search_attributes
    elif event.HasField("workflow_execution_started_event_attributes"):
        fields = event.workflow_execution_started_event_attributes.search_attributes
    else:
        return None
    payload = fields.indexed_fields.get(SA_STATUS.name)
    return _keyword(payload) if payload is not None else None


def _keyword(payload: Payload) -> str | None:
    """A keyword search attribute's value (the payload holds it alone or in a list)."""
    try:
        value = PayloadConverter.default.from_payload(payload)
    except Exception:  # not JSON (Temporal validates it, but a value is never worth a crash)
        return None
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    return value if isinstance(value, str) else None


def _next_run(event: HistoryEvent) -> str | None:
    """The run that continues the chain after the close event `event`, if any
    (continue-as-new; a cron schedule or Temporal's own workflow retry too)."""
    kind = event.WhichOneof("attributes")
    if kind not in _FOLLOWED:
        return None  # cancelled and terminated runs end their chain
    next_run: str = getattr(event, kind).new_execution_run_id
    return next_run or None


def _after_close(how: str) -> str:
    if how == "completed":
        return "Its result stays readable (`result()`, `durably runs show`)."
    return "Start a new run to do the work again."


def _identity(client: Client) -> str:
    """The client's identity as the run records it (self-declared, like `responder`)."""
    return printable(client.identity)[:MAX_NAME_CHARS]


def _address(client: Client) -> str:
    return client.service_client.config.target_host


def _check_type(field: str, value: Any, expected: type | tuple[type, ...], hint: str) -> None:
    """Raise `InvalidResponseError` naming `field` unless `value` has the expected type."""
    if not isinstance(value, expected):
        names = expected if isinstance(expected, tuple) else (expected,)
        wanted = " or ".join("None" if t is type(None) else t.__name__ for t in names)
        raise InvalidResponseError(
            f"{field} must be a {wanted} ({hint}); got {type(value).__name__}"
        )


def _canonical_json(field: str, value: dict[str, Any] | list[dict[str, Any]]) -> str:
    """`value` as canonical JSON, or `InvalidResponseError` if it is not plain JSON data."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as err:
        raise InvalidResponseError(
            f"{field} must hold only JSON data (strings as keys; strings, numbers, booleans, "
            f"None, lists and dicts as values): {err}"
        ) from err


def _request(model: type[BaseModel], **fields: Any) -> Any:
    """`model(**fields)`; a field that does not fit is an `InvalidResponseError` naming it."""
    try:
        return model(**fields)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "(root)"
        raise InvalidResponseError(f"{where[:100]}: {first['msg'][:200]}") from err
