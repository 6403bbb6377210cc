"""Model text as it is written: previews for a run's live followers, never history.

A model adapter (or a `FunctionModel` generator) calls `emit_text` with each
piece of the answer as the provider streams it. Inside the model activity
the pieces go to the activity's heartbeat details, which Temporal keeps in
the run's mutable state, not in its history; followers read them with the
run's description (`RunHandle.events`). The committed response stays the
truth: a preview may lag, skip when a follower falls behind, and restart
with the next attempt of a failed request.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar

__all__ = ["emit_text", "text_sink"]

_sink: ContextVar[Callable[[str], None] | None] = ContextVar("durably_text_sink", default=None)


def emit_text(delta: str) -> None:
    """Hand the next piece of the model's answer to the run's live followers.

    Outside a model activity (a test calling the model directly) it does nothing.
    """
    sink = _sink.get()
    if sink is not None and delta:
        sink(delta)


@contextlib.contextmanager
def text_sink(sink: Callable[[str], None]) -> Iterator[None]:
    """Where `emit_text` sends the pieces while the block runs (the model activity)."""
    token = _sink.set(sink)
    try:
        yield
    finally:
        _sink.reset(token)
