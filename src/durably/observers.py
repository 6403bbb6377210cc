"""Observers (SPEC section 15): your code, fed every run's committed events.

An observer is a function of a `LiveItem` (sync or async): log it, index
it, count it, alert on it. `ObserverHost` finds the runs (Temporal's
visibility), follows each one by query (`RunHandle.events`: it records
nothing in the run's history), and calls every observer with each committed
event of each run, in order per run, at least once: the offset reached is
checkpointed after the observers saw the event (`Checkpoints`, a local
SQLite file by default), so a restarted host goes on where it stopped,
repeating at most the event it was handling.

An observer that raises is logged with the run and the event and is not
called again for that event (the seed: "observer failures are not
retried"); it never touches the run, whose outcome and history are the same
with or without observers.

Observers run off the host's event loop: a sync one in a small thread pool
of its own, an async one on an event loop of its own, each call bounded by
`timeout` (logged when it runs over, and the feed goes on). In a worker's
process that loop is the worker's: an observer that slept in `tool_started`
starved a manual tool's heartbeat and parked a run whose tool had done its
work, and an async one that never returned stalled its run's feed for good,
without a word. Run one with `durably observe module:fn`, or in
a worker's process with `DurableRuntime.open(observers=[fn])`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import structlog

from durably._imports import load_attr
from durably.client import DurableClient
from durably.contract import WORKFLOW_TYPE, LiveItem, LiveText
from durably.errors import DurablyError, RegistrationError, RunNotFoundError

__all__ = [
    "OBSERVER_TIMEOUT",
    "Checkpoints",
    "Observer",
    "ObserverHost",
    "SqliteCheckpoints",
    "load_observers",
]

Observer = Callable[[LiveItem], Awaitable[None] | None]
_log = structlog.get_logger("durably.observers")
# Runs that closed this long before a sweep are still looked at (visibility trails).
_CLOSED_WINDOW = timedelta(minutes=10)
# How long one observer may take with one event before the feed goes on without it.
OBSERVER_TIMEOUT = 30.0
# Sync observers' threads: one stuck observer holds one, never the host's loop.
_SYNC_THREADS = 4


class Checkpoints(Protocol):
    """Where an observer host keeps how far it got, by run."""

    def since(self) -> datetime:
        """When the host first started: it observes the runs started from then on."""
        ...

    def offset(self, run_id: str) -> int | None:
        """The offset of the last event the observers saw of `run_id` (None: none yet)."""
        ...

    def save(self, run_id: str, offset: int, *, finished: bool = False) -> None:
        """The observers saw `run_id`'s event at `offset` (`finished`: its last one)."""
        ...

    def finished(self, run_id: str) -> bool:
        """Whether the observers saw `run_id`'s last event."""
        ...


class SqliteCheckpoints:
    """`Checkpoints` in a local SQLite file (created on first use)."""

    def __init__(self, path: str | Path = ".durably/observers.sqlite") -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS checkpoints (run_id TEXT PRIMARY KEY,"
            " offset INTEGER NOT NULL, finished INTEGER NOT NULL DEFAULT 0)"
        )
        self._db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        self._db.execute(
            "INSERT OR IGNORE INTO meta VALUES ('since', ?)", (datetime.now(UTC).isoformat(),)
        )

    def since(self) -> datetime:
        (value,) = self._db.execute("SELECT value FROM meta WHERE key = 'since'").fetchone()
        return datetime.fromisoformat(value)

    def offset(self, run_id: str) -> int | None:
        row = self._db.execute(
            "SELECT offset FROM checkpoints WHERE run_id = ?", (run_id,)
        ).fetchone()
        return None if row is None else int(row[0])

    def save(self, run_id: str, offset: int, *, finished: bool = False) -> None:
        self._db.execute(
            "INSERT INTO checkpoints VALUES (?, ?, ?) ON CONFLICT(run_id) DO UPDATE"
            " SET offset = excluded.offset, finished = excluded.finished",
            (run_id, offset, int(finished)),
        )

    def finished(self, run_id: str) -> bool:
        row = self._db.execute(
            "SELECT finished FROM checkpoints WHERE run_id = ?", (run_id,)
        ).fetchone()
        return bool(row and row[0])

    def close(self) -> None:
        self._db.close()


class ObserverHost:
    """Feeds `observers` every committed event of every run (see the module docstring).

    `poll_interval` is how often it looks for new runs, in seconds.
    """

    def __init__(
        self,
        client: DurableClient,
        observers: Sequence[Observer],
        *,
        checkpoints: Checkpoints | None = None,
        poll_interval: float = 1.0,
        timeout: float = OBSERVER_TIMEOUT,
    ) -> None:
        if not observers:
            raise DurablyError("an observer host needs at least one observer")
        if not timeout > 0:
            raise DurablyError(f"an observer's timeout must be positive seconds, got {timeout!r}")
        self.client = client
        self.observers = list(observers)
        self.checkpoints: Checkpoints = checkpoints or SqliteCheckpoints()
        self.poll_interval = poll_interval
        self._following: dict[str, asyncio.Task[None]] = {}
        self.timeout = timeout
        self._calls: _OffLoop | None = None  # while `run` runs

    async def run(self, stop: asyncio.Event) -> None:
        """Observe until `stop` is set."""
        self._calls = _OffLoop(self.timeout)
        try:
            while not stop.is_set():
                try:
                    await self._sweep()
                except Exception as err:
                    _log.warning("could not list runs to observe", error=str(err))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.poll_interval)
        finally:
            for task in self._following.values():
                task.cancel()
            await asyncio.gather(*self._following.values(), return_exceptions=True)
            self._following.clear()
            self._calls.close()
            self._calls = None

    async def _sweep(self) -> None:
        """Start following each run not followed yet whose last event is not seen."""
        since = self.checkpoints.since().isoformat()
        recent = (datetime.now(UTC) - _CLOSED_WINDOW).isoformat()
        query = (
            f'WorkflowType = "{WORKFLOW_TYPE}" AND StartTime >= "{since}" AND '
            f'(ExecutionStatus = "Running" OR CloseTime >= "{recent}")'
        )
        async for execution in self.client.temporal.list_workflows(query):
            run_id = execution.id
            task = self._following.get(run_id)
            if task is not None and not task.done():
                continue
            if self.checkpoints.finished(run_id):
                continue
            self._following[run_id] = asyncio.create_task(self._follow(run_id))

    async def _follow(self, run_id: str) -> None:
        try:
            await self._feed(run_id)
        except RunNotFoundError:  # its history is gone (retention): nothing more comes
            self.checkpoints.save(run_id, self.checkpoints.offset(run_id) or -1, finished=True)
        except DurablyError as err:  # the next sweep follows it again from its checkpoint
            _log.warning("could not follow a run to observe", run_id=run_id, error=str(err))

    async def _feed(self, run_id: str) -> None:
        run = await self.client.get_run(run_id)
        ended = False
        async for item in run.events(after=self.checkpoints.offset(run_id)):
            if isinstance(item.event, LiveText):
                continue  # previews are not committed events
            for observer in self.observers:
                assert self._calls is not None  # fed only while `run` runs
                await self._calls.call(observer, item)
            ended = item.event.type in ("run_completed", "run_cancelled")
            self.checkpoints.save(run_id, item.offset, finished=ended)
        if not ended:  # closed otherwise (failed for good, terminated): nothing more comes
            last = self.checkpoints.offset(run_id)
            self.checkpoints.save(run_id, -1 if last is None else last, finished=True)


class _OffLoop:
    """Where observers run: sync ones in a pool of threads, async ones on an event loop in
    a thread of its own; never on the host's loop (a worker's, in a worker's process).
    Async observers run on that other loop: an object bound to the host's loop is not
    theirs to use."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._pool = concurrent.futures.ThreadPoolExecutor(
            _SYNC_THREADS, thread_name_prefix="durably-observer"
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="durably-observers", daemon=True
        )
        self._thread.start()

    async def call(self, observer: Observer, item: LiveItem) -> None:
        """Call one observer with one event; what it raises is logged, never retried, and
        a call past `timeout` is logged and left behind (an async one is cancelled)."""
        if _is_async(observer):
            running = asyncio.run_coroutine_threadsafe(_awaited(observer(item)), self._loop)
        else:
            running = self._pool.submit(self._sync, observer, item)
        try:
            await asyncio.wait_for(asyncio.wrap_future(running), self.timeout)
        except TimeoutError:
            running.cancel()  # a sync observer keeps its thread until it returns
            _log.warning(
                "an observer took too long with an event; the feed goes on without it",
                observer=_name(observer),
                timeout_s=self.timeout,
                **_where(item),
            )
        except Exception as err:  # a cancelled async observer too
            _log.warning(
                "an observer failed; it is not called again for this event",
                observer=_name(observer),
                error=f"{type(err).__name__}: {err}",
                **_where(item),
            )

    def _sync(self, observer: Observer, item: LiveItem) -> None:
        """A sync observer, in a pool thread; what it returns, if awaitable, runs on the
        observers' loop, bounded by `timeout` too."""
        result = observer(item)
        if inspect.isawaitable(result):
            done = asyncio.run_coroutine_threadsafe(_awaited(result), self._loop)
            try:
                done.result(self.timeout)
            except concurrent.futures.TimeoutError:
                done.cancel()
                raise

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()


def _is_async(observer: Observer) -> bool:
    call = getattr(observer, "__call__", None)  # noqa: B004 - an object's async __call__
    return inspect.iscoroutinefunction(observer) or inspect.iscoroutinefunction(call)


async def _awaited(result: Awaitable[Any] | None) -> None:
    if result is not None:
        await result


def _name(observer: Observer) -> str:
    return getattr(observer, "__qualname__", repr(observer))


def _where(item: LiveItem) -> dict[str, Any]:
    event: Any = item.event
    return {
        "run_id": getattr(event, "run_id", None),
        "offset": item.offset,
        "event_type": event.type,
    }


def load_observers(spec: str) -> list[Observer]:
    """Import `module:attr`: an observer function, or a list of them."""
    value: Any = load_attr(spec, "observers", "myapp.audit:observe")
    observers = list(value) if isinstance(value, list | tuple) else [value]
    if not observers or not all(callable(o) for o in observers):
        raise RegistrationError(
            f"{spec!r} must be a function of a LiveItem, or a list of them; got "
            f"{type(value).__name__}"
        )
    return observers
