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
from collections.abc import AsyncIterator

from temporalio import activity

__all__ = ["heartbeating"]


@contextlib.asynccontextmanager
async def heartbeating(interval: float) -> AsyncIterator[None]:
    """Heartbeat every `interval` seconds while the block runs."""

    async def beat() -> None:
        while True:
            await asyncio.sleep(interval)
            activity.heartbeat()

    task = asyncio.create_task(beat(), name="durably-heartbeat")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
