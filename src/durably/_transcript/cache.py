"""A worker-side cache of run transcripts, bounded by bytes.

It prevents the failure that ends long agent runs elsewhere: sending the
whole transcript as activity input on every model request makes a run's
history grow with the square of its length until Temporal's history limit
terminates it. The workflow sends only a delta (new messages, and
references to results this worker's activities produced), and the model
activity rebuilds the full transcript here. On a miss (another worker ran
the previous step, this one restarted, or the run was evicted) the caller
falls back to querying the workflow, which costs no history.

It also prevents the opposite failure: a cache bounded by run count lets a
few hundred multi-megabyte transcripts take gigabytes of worker memory. The
bound is on bytes instead: every message is measured once, when it is
stored (its JSON size, `encoded_size`), and least recently used runs are
evicted until the total fits. A run larger than the whole bound is not
kept; its requests always rebuild from the workflow, which is correct,
just slower.
"""

from __future__ import annotations

import operator
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from durably._transcript.digest import EMPTY_DIGEST, encoded_size
from durably.messages import Message

__all__ = ["DEFAULT_MAX_BYTES", "TranscriptCache"]

DEFAULT_MAX_BYTES = 256 * 2**20
"""The default bound: 256 MiB of encoded messages per worker."""


@dataclass
class _RunEntry:
    messages: list[Message] = field(default_factory=list)
    # The encoded size of each message, in the same order, and their sum.
    sizes: list[int] = field(default_factory=list)
    messages_bytes: int = 0
    digest: str = ""
    # Operation key -> (message, its encoded size).
    outputs: dict[str, tuple[Message, int]] = field(default_factory=dict)
    outputs_bytes: int = 0

    @property
    def nbytes(self) -> int:
        return self.messages_bytes + self.outputs_bytes


class TranscriptCache:
    """Per-run transcripts and activity outputs, least recently used run first out.

    Args:
        max_bytes: The most bytes (the JSON size of the cached messages and
            outputs) kept across all runs; 256 MiB by default. In memory the
            messages take about that much for long text, more for many short
            messages.
            `0` disables caching: every model request then rebuilds its
            transcript from the workflow.
        max_runs: An optional bound on how many runs are kept as well (none
            by default); `0` also disables caching.

    Safe to share between threads and the event loop.

    .. versionchanged:: Unreleased
       Bounded by `max_bytes` rather than by 512 runs.
    """

    # No __len__: `AgentActivities` takes `cache or TranscriptCache()`, and an
    # empty cache must not read as false there.

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, *, max_runs: int | None = None) -> None:
        if max_bytes < 0:
            raise ValueError(
                f"TranscriptCache(max_bytes={max_bytes}): the bound must be 0 (no caching) "
                "or a number of bytes"
            )
        if max_runs is not None and max_runs < 0:
            raise ValueError(
                f"TranscriptCache(max_runs={max_runs}): the bound must be None (no limit), "
                "0 (no caching) or a number of runs"
            )
        self._max_bytes = max_bytes
        self._max_runs = max_runs
        self._enabled = max_bytes > 0 and max_runs != 0
        self._runs: OrderedDict[str, _RunEntry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def max_bytes(self) -> int:
        """The bound on the cached bytes (0: caching is disabled)."""
        return self._max_bytes

    @property
    def size_bytes(self) -> int:
        """The encoded size of every message and output cached now."""
        with self._lock:
            return self._bytes

    def put_output(self, run_id: str, key: str, message: Message) -> None:
        """Remember a message an activity produced, under its operation key."""
        if not self._enabled:
            return
        size = encoded_size(message)
        with self._lock:
            entry = self._entry(run_id)
            previous = entry.outputs.get(key)
            delta = size - (previous[1] if previous is not None else 0)
            entry.outputs[key] = (message, size)
            entry.outputs_bytes += delta
            self._bytes += delta
            self._fit(run_id, entry)

    def transcript(self, run_id: str, length: int) -> tuple[list[Message], str] | None:
        """The cached transcript and its digest, if it is exactly `length` messages long.

        The caller proves it is the run's own with the workflow's digest. Every
        run's empty transcript is known: a run's first request needs no lookup.
        """
        if length == 0:
            return [], EMPTY_DIGEST
        with self._lock:
            entry = self._runs.get(run_id)
            if entry is None or len(entry.messages) != length:
                return None
            self._runs.move_to_end(run_id)
            return list(entry.messages), entry.digest

    def output(self, run_id: str, key: str) -> Message | None:
        """The message an activity of the run produced under `key`, if still cached."""
        with self._lock:
            entry = self._runs.get(run_id)
            found = None if entry is None else entry.outputs.get(key)
            return None if found is None else found[0]

    def store(self, run_id: str, messages: list[Message], digest: str) -> None:
        """Replace the run's transcript with `messages` and drop the run's outputs.

        Usually `messages` is the cached transcript with new messages
        appended: only those are measured (and not even they when they came
        from `put_output`), so a store encodes no more at turn 500 than at
        turn 5. Which messages are already cached is told by identity (a
        pointer comparison, never re-encoding); anything else is measured.
        """
        if not self._enabled:
            return
        with self._lock:
            entry = self._entry(run_id)
            old, sizes = entry.messages, entry.sizes
            if len(messages) >= len(old) and all(map(operator.is_, old, messages)):
                kept, kept_bytes = len(old), entry.messages_bytes
            else:  # shorter, or not built from the cached list: reuse what is identical
                kept = next(
                    (i for i, (a, b) in enumerate(zip(old, messages, strict=False)) if a is not b),
                    min(len(old), len(messages)),
                )
                del sizes[kept:]
                kept_bytes = sum(sizes)
            # Outputs were measured by put_output; they are alive, so their ids are theirs.
            measured = {id(m): size for m, size in entry.outputs.values()}
            added = [
                measured[id(m)] if id(m) in measured else encoded_size(m) for m in messages[kept:]
            ]
            sizes.extend(added)
            messages_bytes = kept_bytes + sum(added)
            self._bytes += messages_bytes - entry.nbytes
            entry.messages = list(messages)  # the caller's list may change later
            entry.messages_bytes = messages_bytes
            entry.digest = digest
            entry.outputs.clear()
            entry.outputs_bytes = 0
            self._fit(run_id, entry)

    def forget(self, run_id: str) -> None:
        """Drop everything cached for the run (call it when the run has finished)."""
        with self._lock:
            self._drop(run_id)

    # -- under the lock --------------------------------------------------------

    def _entry(self, run_id: str) -> _RunEntry:
        entry = self._runs.get(run_id)
        if entry is None:
            entry = self._runs[run_id] = _RunEntry()
        self._runs.move_to_end(run_id)
        return entry

    def _fit(self, run_id: str, entry: _RunEntry) -> None:
        """Evict least recently used runs until the bounds hold; `run_id` was just used."""
        if entry.nbytes > self._max_bytes:
            self._drop(run_id)  # it alone does not fit: keep the others instead
        while self._bytes > self._max_bytes or (
            self._max_runs is not None and len(self._runs) > self._max_runs
        ):
            _, evicted = self._runs.popitem(last=False)
            self._bytes -= evicted.nbytes

    def _drop(self, run_id: str) -> None:
        entry = self._runs.pop(run_id, None)
        if entry is not None:
            self._bytes -= entry.nbytes
