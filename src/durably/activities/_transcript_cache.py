"""A worker-side cache of run transcripts.

It prevents the failure that ends long agent runs elsewhere: sending the
whole transcript as activity input on every model request makes a run's
history grow with the square of its length until Temporal's history limit
terminates it. The workflow sends only a delta (new messages, and
references to results this worker's activities produced), and the model
activity rebuilds the full transcript here. On a miss (another worker ran
the previous step, or this one restarted) the caller falls back to querying
the workflow, which costs no history.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from durably._digests import EMPTY_DIGEST
from durably.messages import Message

__all__ = ["TranscriptCache"]


@dataclass
class _RunEntry:
    messages: list[Message] = field(default_factory=list)
    digest: str = ""
    outputs: dict[str, Message] = field(default_factory=dict)


class TranscriptCache:
    """Per-run transcripts and activity outputs, least recently used first out.

    `max_runs=0` disables caching: every model request then rebuilds its
    transcript from the workflow.
    """

    def __init__(self, max_runs: int = 512) -> None:
        self._max_runs = max_runs
        self._runs: OrderedDict[str, _RunEntry] = OrderedDict()
        self._lock = threading.Lock()

    def _entry(self, run_id: str) -> _RunEntry:
        entry = self._runs.get(run_id)
        if entry is None:
            entry = _RunEntry()
            if self._max_runs == 0:
                return entry
            self._runs[run_id] = entry
            while len(self._runs) > self._max_runs:
                self._runs.popitem(last=False)
        self._runs.move_to_end(run_id)
        return entry

    def put_output(self, run_id: str, key: str, message: Message) -> None:
        """Remember a message an activity produced, under its operation key."""
        with self._lock:
            self._entry(run_id).outputs[key] = message

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
            return list(entry.messages), entry.digest

    def output(self, run_id: str, key: str) -> Message | None:
        with self._lock:
            entry = self._runs.get(run_id)
            return None if entry is None else entry.outputs.get(key)

    def store(self, run_id: str, messages: list[Message], digest: str) -> None:
        """Replace the run's transcript; outputs it now contains are dropped."""
        with self._lock:
            entry = self._entry(run_id)
            entry.messages = messages
            entry.digest = digest
            entry.outputs.clear()

    def forget(self, run_id: str) -> None:
        with self._lock:
            self._runs.pop(run_id, None)
