"""Background heartbeating for model and tool activities.

Without it a dead worker is noticed only at the start-to-close timeout
(minutes); with it, within the heartbeat timeout. Heartbeats are also how a
cancellation reaches a running activity.

The first heartbeat waits one interval: the server times out an activity
that never heartbeats one heartbeat timeout after it started, so a beat at
the start proves nothing, while it costs a billable action and an RPC on
every short model request and tool call.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from temporalio import activity

from durably.contract import TextPreview

__all__ = ["TextPreviews", "heartbeating"]


@contextlib.asynccontextmanager
async def heartbeating(
    interval: float, details: Callable[[], tuple[Any, ...]] = tuple
) -> AsyncIterator[None]:
    """Heartbeat every `interval` seconds while the block runs, with `details()` (a beat
    replaces the details the last one left, which live followers read)."""

    async def beat() -> None:
        while True:
            await asyncio.sleep(interval)
            activity.heartbeat(*details())

    task = asyncio.create_task(beat(), name="durably-heartbeat")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class TextPreviews:
    """The model's answer as it streams in, shown in the activity's heartbeat details
    (not history: see `durably.models.emit_text`). Only the last `TAIL` characters
    travel; a follower that fell behind further skips ahead."""

    TAIL = 16 * 2**10

    def __init__(self, operation: str, attempt: int) -> None:
        self._operation = operation
        self._attempt = attempt
        self._length = 0
        self._tail = ""

    def add(self, delta: str) -> None:
        self._length += len(delta)
        self._tail = (self._tail + delta)[-self.TAIL :]
        activity.heartbeat(*self.details())  # the worker sends at most one per throttle

    def details(self) -> tuple[Any, ...]:
        if not self._length:
            return ()
        return (
            TextPreview(
                operation=self._operation,
                attempt=self._attempt,
                length=self._length,
                tail=self._tail,
            ),
        )
