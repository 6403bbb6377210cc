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

from temporalio.api.common.v1 import Payload
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryFailedError,
)
from temporalio.contrib.workflow_streams import PollInput, PollResult
from temporalio.service import RPCError, RPCStatusCode

from durably.contract import (
    EVENTS_TOPIC,
    EventType,
    LiveEvent,
    LiveItem,
    SessionLiveEvent,
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
    in order, until the workflow ends; `what` names it in errors ("run 'x'")."""
    offset = 0 if after is None else after + 1
    pinned = await _current_run(client, workflow_id, what)
    continued = False
    backoff = poll_interval
    while True:
        handle = client.get_workflow_handle(workflow_id, run_id=pinned)
        try:
            result = await _poll(handle, offset, what)
        except _Unavailable:
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _MAX_BACKOFF_S)
            continue
        backoff = poll_interval
        ended = False
        for wire in result.items:
            item = LiveItem(offset=wire.offset, event=_decode(client, wire.data))
            offset = wire.offset + 1
            yield item
            kind = item.event.type
            continued = continued or kind in ("continued_as_new", EventType.CONTINUED_AS_NEW)
            ended = ended or (isinstance(item.event, LiveEvent) and kind in _RUN_ENDS)
        if result.more_ready:
            continue
        if ended:
            return
        status = await _status(handle, what)
        if continued or status == WorkflowExecutionStatus.CONTINUED_AS_NEW:
            latest = await _current_run(client, workflow_id, what)
            if latest != pinned:
                pinned, continued = latest, False
                continue
        elif status in _CLOSED:
            return  # drained: a closed run says nothing more
        await asyncio.sleep(poll_interval)


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


async def _current_run(client: Client, workflow_id: str, what: str) -> str:
    try:
        description = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise RunNotFoundError(f"no {what}") from err
        raise DurablyError(f"{what} could not be read: {err.message}") from err
    return description.run_id


async def _status(handle: WorkflowHandle[Any, Any], what: str) -> WorkflowExecutionStatus | None:
    try:
        return (await handle.describe()).status
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
