"""Following a run's or a session's live events (SPEC section 15), by query only.

The workflow keeps its events on a `temporalio.contrib.workflow_streams`
stream in memory; a follower reads them with the stream's poll *query*,
which records nothing, so any number of followers leave history as it is
(the stream's poll *update*, which would record every item again per
follower, is closed on durably's workflows). A follower pins the Temporal
run it reads: when that run continues as new, it first drains it, then
goes on in the next run from the same offset (offsets go on across the
chain).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

from temporalio.api.common.v1 import Payload, WorkflowExecution
from temporalio.api.workflowservice.v1 import GetWorkflowExecutionHistoryReverseRequest
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryFailedError,
)
from temporalio.contrib.workflow_streams import PollInput, PollResult
from temporalio.service import RPCError, RPCStatusCode

from durably.contract import (
    ACTIVITY_MODEL,
    EVENTS_TOPIC,
    EventType,
    LiveEvent,
    LiveItem,
    LiveText,
    SessionLiveEvent,
    TextPreview,
)
from durably.errors import DurablyError, RunNotFoundError

__all__ = ["follow"]

_POLL = "__temporal_workflow_stream_poll"
# Event types after which a run's stream has nothing more to say.
_RUN_ENDS = {EventType.RUN_COMPLETED.value, EventType.RUN_CANCELLED.value}
_CLOSED = {
    WorkflowExecutionStatus.COMPLETED,
    WorkflowExecutionStatus.FAILED,
    WorkflowExecutionStatus.CANCELED,
    WorkflowExecutionStatus.TERMINATED,
    WorkflowExecutionStatus.TIMED_OUT,
}
_MAX_BACKOFF_S = 2.0


async def follow(
    client: Client,
    workflow_id: str,
    *,
    after: int | None,
    poll_interval: float,
    what: str,
) -> AsyncIterator[LiveItem]:
    """Every live event of `workflow_id` after offset `after` (from the first if None),
    in order, until the workflow ends; `what` names it in errors ("run 'x'"). While a
    model request runs, the pieces of its answer come as `LiveText` items."""
    f = _Follower(client, workflow_id, what, 0 if after is None else after + 1)
    # From the chain's first run: earlier offsets live in the runs that continued.
    f.pinned = await _first_run(client, workflow_id, what)
    backoff = poll_interval
    while True:
        handle = client.get_workflow_handle(workflow_id, run_id=f.pinned)
        try:
            result = await _poll(handle, f.offset, what)
        except RunNotFoundError:
            # An early run of the chain is gone (retention): go on in the latest, whose
            # stream starts where its kept events do.
            latest = await _current_run(client, workflow_id, what)
            if latest == f.pinned:
                raise
            f.pinned = latest
            continue
        except _Unavailable:
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _MAX_BACKOFF_S)
            continue
        backoff = poll_interval
        for item in f.take(result):
            yield item
        if result.more_ready:
            continue
        if f.ended:
            return
        # One description a round: the answer being written, and whether the run closed.
        description = await _described(handle, what)
        if f.preview is not None and description is not None:
            piece = f.preview.next(await _text_preview(client, description))
            if piece is not None:
                yield LiveItem(offset=f.offset - 1, event=piece)
        if f.closed:
            return  # read once more after it closed: a closed run says nothing more
        if await f.moved_on(description) or f.closed:
            continue  # read what the run said before it moved on or closed
        await asyncio.sleep(poll_interval)


class _Follower:
    """Where one follower is: its offset, the run it reads, the answer it previews."""

    def __init__(self, client: Client, workflow_id: str, what: str, offset: int) -> None:
        self.client = client
        self.workflow_id = workflow_id
        self.what = what
        self.offset = offset
        self.pinned = ""
        self.ended = False
        self.closed = False
        # The run that continued as new and was read once more after it closed (what
        # it published after the previous read would be lost otherwise).
        self.drained = ""
        self.preview: _Preview | None = None

    def take(self, result: PollResult) -> list[LiveItem]:
        """The items of one poll, each answer's remaining text before its event."""
        items: list[LiveItem] = []
        for wire in result.items:
            event = _decode(self.client, wire.data)
            if self.preview is not None and isinstance(event, LiveEvent):
                rest = self.preview.finish(event)
                if rest is not None:
                    items.append(LiveItem(offset=self.offset - 1, event=rest))
                if self.preview.done:
                    self.preview = None
            if isinstance(event, LiveEvent) and event.type == EventType.MODEL_STARTED:
                self.preview = _Preview(event)
            self.offset = wire.offset + 1
            items.append(LiveItem(offset=wire.offset, event=event))
            self.ended = self.ended or (isinstance(event, LiveEvent) and event.type in _RUN_ENDS)
        return items

    async def moved_on(self, description: WorkflowExecutionDescription | None) -> bool:
        """Whether the run it read continued as new and the next one is now pinned."""
        status = description.status if description is not None else None
        self.closed = status in _CLOSED
        if status == WorkflowExecutionStatus.CONTINUED_AS_NEW:
            self.closed = False
            if self.drained != self.pinned:  # read it once more now that it is closed
                self.drained = self.pinned
                return True
            following = await _next_run(self.client, self.workflow_id, self.pinned)
            if following is not None:
                self.pinned = following
                return True
        return False


class _Preview:
    """What one follower was shown of the model answer in flight."""

    def __init__(self, started: LiveEvent) -> None:
        self.run_id = started.run_id
        self.operation = started.operation or ""
        self.attempt = 0
        self.shown = 0  # characters of this attempt's answer shown
        self.text = ""  # the part of the answer shown so far (for the final check)
        self.done = False

    def next(self, current: TextPreview | None) -> LiveText | None:
        """The piece after what was shown, from the activity's latest heartbeat."""
        if current is None or current.operation != self.operation:
            return None
        if current.attempt != self.attempt:  # a new attempt writes its answer anew
            self.attempt, self.shown, self.text = current.attempt, 0, ""
        start = current.length - len(current.tail)
        if current.length <= self.shown:
            return None
        gap = self.shown < start
        piece = current.tail[max(self.shown - start, 0) :]
        self.shown = current.length
        self.text = "" if gap else self.text + piece
        return LiveText(
            run_id=self.run_id,
            operation=self.operation,
            attempt=self.attempt,
            text=piece,
            gap=gap,
        )

    def finish(self, event: LiveEvent) -> LiveText | None:
        """At the request's end: the rest of the committed answer, so the text a follower
        was shown always ends as the committed answer reads."""
        if event.operation != self.operation:
            return None
        self.done = True
        if event.type != EventType.MODEL_COMPLETED or not event.text:
            return None
        if self.text and not event.text.startswith(self.text):
            return None  # the preview was of another attempt; the committed text rules
        rest = event.text[len(self.text) :]
        if not rest:
            return None
        return LiveText(
            run_id=self.run_id,
            operation=self.operation,
            attempt=self.attempt,
            text=rest,
            gap=bool(self.shown) and not self.text,
        )


async def _text_preview(
    client: Client, description: WorkflowExecutionDescription
) -> TextPreview | None:
    """The model answer the run's model activity is receiving, from its heartbeat."""
    for pending in description.raw_description.pending_activities:
        if pending.activity_type.name != ACTIVITY_MODEL or not pending.heartbeat_details.payloads:
            continue
        try:
            [preview] = await client.data_converter.decode(
                pending.heartbeat_details.payloads, [TextPreview]
            )
        except Exception:  # a heartbeat from another release: no preview, not an error
            return None
        return preview if isinstance(preview, TextPreview) else None
    return None


class _Unavailable(Exception):
    """No worker answered the query this time (workers restarting): ask again."""


async def _poll(handle: WorkflowHandle[Any, Any], offset: int, what: str) -> PollResult:
    try:
        result: PollResult = await handle.query(
            _POLL, PollInput(topics=[EVENTS_TOPIC], from_offset=offset), result_type=PollResult
        )
        return result
    except WorkflowQueryFailedError as err:
        if "not found" in str(err).lower() or "unknown" in str(err).lower():
            raise DurablyError(
                f"{what} has no live events: its worker runs a durably older than live "
                f"events ({err}). Upgrade the workers, then follow it again"
            ) from err
        raise _Unavailable from err
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise RunNotFoundError(f"no {what}: {err.message}") from err
        raise _Unavailable from err


async def _describe(client: Client, workflow_id: str, what: str) -> WorkflowExecutionDescription:
    try:
        return await client.get_workflow_handle(workflow_id).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise RunNotFoundError(f"no {what}") from err
        raise DurablyError(f"{what} could not be read: {err.message}") from err


async def _current_run(client: Client, workflow_id: str, what: str) -> str:
    """The latest Temporal run of the workflow's chain."""
    return str((await _describe(client, workflow_id, what)).run_id)


async def _first_run(client: Client, workflow_id: str, what: str) -> str:
    """The first Temporal run of the workflow's continue-as-new chain."""
    description = await _describe(client, workflow_id, what)
    first = description.raw_description.workflow_execution_info.first_run_id
    return str(first or description.run_id)


async def _next_run(client: Client, workflow_id: str, run_id: str) -> str | None:
    """The run that `run_id` continued as new into (its history's last event names it)."""
    request = GetWorkflowExecutionHistoryReverseRequest(
        namespace=client.namespace,
        execution=WorkflowExecution(workflow_id=workflow_id, run_id=run_id),
        maximum_page_size=1,
    )
    try:
        response = await client.workflow_service.get_workflow_execution_history_reverse(request)
    except RPCError:
        return None
    for event in response.history.events:
        if event.HasField("workflow_execution_continued_as_new_event_attributes"):
            attributes = event.workflow_execution_continued_as_new_event_attributes
            return attributes.new_execution_run_id or None
    return None


async def _described(
    handle: WorkflowHandle[Any, Any], what: str
) -> WorkflowExecutionDescription | None:
    """The pinned run's description (None while the server does not answer)."""
    try:
        return await handle.describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise RunNotFoundError(f"no {what} (its history is gone)") from err
        return None


def _decode(client: Client, wire: str) -> LiveEvent | SessionLiveEvent:
    """One stream item: base64 of the payload the workflow's converter made (the codec,
    if any, applied once to the whole query answer)."""
    payload = Payload.FromString(base64.b64decode(wire))
    converter = client.data_converter.payload_converter
    data = converter.from_payload(payload)
    if isinstance(data, dict) and data.get("kind") == "session":
        return SessionLiveEvent.model_validate(data)
    return LiveEvent.model_validate(data)
