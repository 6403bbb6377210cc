"""A workflow's live events (SPEC section 15), on `temporalio.contrib.workflow_streams`.

The events are published in the workflow's memory, as it replays them from
history: publishing records nothing. Followers read them through the
stream's poll *query* (`RunHandle.events`), which records nothing either.
The stream's other doors are closed: its publish signal would let any
caller forge events a person then reads as the run's, and its poll update
records every item it returns in history again, per follower and per poll.
Offsets go on across continue-as-new (the next run starts its stream where
this one ended); the log keeps the latest `EVENTS_RETAINED` items, and no
more than `RETAINED_BYTES` of them (a worker caches many runs at once).
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any

from pydantic import BaseModel
from temporalio import workflow
from temporalio.contrib.workflow_streams import WorkflowStream, WorkflowStreamState

with workflow.unsafe.imports_passed_through():
    from durably.contract import EVENTS_RETAINED, EVENTS_TOPIC

__all__ = ["POLL", "PUBLISH_SIGNAL", "LiveEvents"]

# The stream's handler names (`temporalio.contrib.workflow_streams`).
PUBLISH_SIGNAL = "__temporal_workflow_stream_publish"
POLL = "__temporal_workflow_stream_poll"
# The most a run keeps of its live events in the worker's memory, in payload bytes.
RETAINED_BYTES = 2 * 2**20


class LiveEvents:
    """The workflow's committed events, offset-addressed, for followers."""

    def __init__(self, offset: int) -> None:
        # WorkflowStream must be built from a method named __init__ (it checks).
        prior = None
        if offset:
            prior = WorkflowStreamState(log=[], base_offset=offset, publishers={})
        self._stream = WorkflowStream(prior_state=prior)
        workflow.set_signal_handler(PUBLISH_SIGNAL, None)
        workflow.set_update_handler(POLL, None)
        self._topic = self._stream.topic(EVENTS_TOPIC)
        self._base = offset
        self.next_offset = offset
        self._sizes: deque[int] = deque()  # of the retained items, oldest first
        self._bytes = 0

    def publish(self, event: BaseModel) -> None:
        """Append `event`; past `EVENTS_RETAINED` items or `RETAINED_BYTES`, the oldest
        retained ones go (the newest always stays)."""
        # Converted once: the stream keeps the payload, and its size is what it costs.
        payload = workflow.payload_converter().to_payloads([event])[0]
        size = payload.ByteSize()
        self._topic.publish(payload)
        self.next_offset += 1
        self._sizes.append(size)
        self._bytes += size
        keep_from = self._base
        while len(self._sizes) > 1 and (
            len(self._sizes) > EVENTS_RETAINED or self._bytes > RETAINED_BYTES
        ):
            self._bytes -= self._sizes.popleft()
            keep_from += 1
        if keep_from > self._base:
            self._stream.truncate(keep_from)
            self._base = keep_from

    def detach(self) -> None:
        """Before the run closes or continues as new (no poll update is served; kept so
        that enabling one later cannot block either)."""
        self._stream.detach_pollers()


def clipped(args: dict[str, Any], limit: int = 8 * 2**10) -> dict[str, Any] | None:
    """`args` if small; None when a follower should read them from the snapshot."""
    try:
        size = len(json.dumps(args, ensure_ascii=False, default=str))
    except (TypeError, ValueError, RecursionError):
        return None
    return args if size <= limit else None
