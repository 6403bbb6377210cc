"""Live events (issue 17): history with followers, and a text piece's way to an SSE client.

Two measurements against one dev server started as ``compare.py`` starts it
(``_common.dev_server``: ``history.transferProcessorMaxPollRPS=1000``), every
system on its own task queue and worker in this process:

1. **History with followers.** ``compare.py``'s workload (N turns of one model
   request calling the tool and the tool returning 2,000 bytes, then a final
   answer; ``_impl_durably.py``) run on durably with no follower, one follower
   and ten followers, each follower ``async for item in run.events()`` from the
   run's start until ``run_completed`` (ten independent query-only readers),
   beside the raw Temporal floor (``_common.FloorWorkflow``, as ``compare.py``
   runs it). Then the same three with deltas: the model is a ``FunctionModel``
   async generator writing 200 characters in 10 pieces, 25 ms apart, on every
   model request (the N tool turns and the final answer); the pieces joined are
   the answer's text, so each committed answer also carries those 200
   characters. Measured per run (median of the runs, the systems alternating
   after one warm-up run each): history events and bytes (``compare.run_once``),
   their ratios to the floor, ten followers against one, deltas against none,
   and what each follower read. Targets (issue 17): history <= 1.3x the floor
   with followers; ten followers <= 1.10x one.

2. **Latency of a text piece.** A fake OpenAI server (``tests/fake_providers.py``,
   real HTTP) streams a 40-piece answer to an agent with ``OpenAIChatModel``
   (which streams), one piece every 0.2 s after a 1 s delay; an SSE client (raw
   asyncio HTTP) reads the run from ``durably.web.LiveServer``. The fake notes
   when it writes each piece (``time.monotonic()``: one clock, one process), the
   client when each piece's ``text_delta`` message arrives. Reported: median and
   p95 over every run's pieces (target: median <= 300 ms), also by path (a
   heartbeat preview, or the rest of the answer sent just before
   ``model_completed``). One more run, probed every 20 ms with ``describe``
   (when each piece's preview is visible on the server), splits a piece's
   latency into emit -> visible on the server (the heartbeat throttle) and
   visible -> received (the follower's polling and the SSE server), and times
   the follower's two reads (the stream's poll query and ``describe``).

Run ``python benchmarks/compare.py live`` (N=50, 3 runs) or
``python benchmarks/live.py --turns 10 --runs 2``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import itertools
import json
import os
import re
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import (
    INSTRUCTIONS,
    TOOL_NAME,
    dev_server,
    event_type,
    fetch_chain,
    page,
    print_footer,
    run_main,
)
from _impl_durably import fetch_page
from compare import (
    FLOOR,
    Durably,
    Floor,
    Implementation,
    RunRecord,
    fmt_bytes,
    fmt_ratio,
    rotated,
    run_once,
    text_table,
    verdict,
)
from temporalio.testing import WorkflowEnvironment

from durably import (
    Agent,
    AgentRegistration,
    AssistantMessage,
    DurableClient,
    DurableRuntime,
    FunctionModel,
    ModelRequest,
    RunHandle,
    ToolCall,
)
from durably.client._live import _poll, _text_preview
from durably.contract import SEARCH_ATTRIBUTES, LiveText
from durably.web import LiveServer
from durably.worker import HEARTBEAT_THROTTLE

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fake_providers import FakeOpenAI, Reply  # noqa: E402

TARGET_HISTORY = 1.3  # durably's history with followers, x the floor
TARGET_FOLLOWERS = 1.10  # ten followers against one
TARGET_MEDIAN_MS = 300.0  # provider chunk -> SSE client, median
# The deltas variant: every model request writes this much text, in pieces.
DELTA_CHARS = 200
DELTA_PIECES = 10
DELTA_GAP_S = 0.025
# The latency run: the fake provider's answer.
PIECES = 40
PIECE_GAP_S = 0.2
LEAD_S = 1.0  # the fake waits this long before its first byte (the SSE client connects)
PROBE_S = 0.02
ANSWER = " ".join(f"p{i:03d}" for i in range(PIECES))
MARK = re.compile(r"p(\d{3})(?!\d)")
POLL_INTERVAL = inspect.signature(RunHandle.events).parameters["poll_interval"].default

PLAIN, PLAIN_1, PLAIN_10 = "durably", "durably-1", "durably-10"
DELTAS, DELTAS_1, DELTAS_10 = "deltas", "deltas-1", "deltas-10"
# key: (followers, deltas)
VARIANTS = {
    PLAIN: (0, False),
    PLAIN_1: (1, False),
    PLAIN_10: (10, False),
    DELTAS: (0, True),
    DELTAS_1: (1, True),
    DELTAS_10: (10, True),
}
LABELS = {
    FLOOR: "raw Temporal (floor)",
    PLAIN: "durably",
    PLAIN_1: "durably",
    PLAIN_10: "durably",
    DELTAS: "durably, with deltas",
    DELTAS_1: "durably, with deltas",
    DELTAS_10: "durably, with deltas",
}


# -- history with followers ----------------------------------------------------------------


@dataclass
class Read:
    """What one follower read of one run."""

    committed: int = 0
    texts: int = 0
    text_chars: int = 0
    last: str = ""


async def follow(run: RunHandle) -> Read:
    """One follower, from the run's first event until it ends (`run.events()`)."""
    read = Read()
    async for item in run.events():
        if isinstance(item.event, LiveText):
            read.texts += 1
            read.text_chars += len(item.event.text)
        else:
            read.committed += 1
            read.last = item.event.type
    return read


def delta_registration(turns: int, *, prefix: str = "bench") -> AgentRegistration:
    """`_impl_durably.durably_registration`'s agent, its model writing text as it answers:
    `DELTA_CHARS` characters in `DELTA_PIECES` pieces per request, the answer's text."""
    size = DELTA_CHARS // DELTA_PIECES

    async def respond(request: ModelRequest) -> AsyncIterator[str | AssistantMessage]:
        done = sum(1 for m in request.messages if isinstance(m, AssistantMessage))
        text = page(done + 1)[:DELTA_CHARS]
        for i in range(DELTA_PIECES):
            await asyncio.sleep(DELTA_GAP_S)
            yield text[i * size : (i + 1) * size]
        if done < turns:
            turn = done + 1
            call = ToolCall(id=f"call_{turn}", name=TOOL_NAME, arguments={"turn": turn})
            yield AssistantMessage(content=text, tool_calls=(call,))
        else:
            yield AssistantMessage(content=f"{text} done after {done} tool turns")

    agent = Agent(
        id=f"{prefix}-{turns}",
        model=FunctionModel(respond, name=f"{prefix}-{turns}"),
        instructions=INSTRUCTIONS,
        tools=[fetch_page],
        max_turns=turns + 1,
    )
    return AgentRegistration(agent, version="1", tool_recovery={TOOL_NAME: "safe"})


class Followed(Durably):
    """`compare.Durably`, each run read by `followers` followers from its start; with
    `deltas`, its model writes its answers' text in pieces (`delta_registration`)."""

    def __init__(self, env: WorkflowEnvironment, turns: Sequence[int], key: str) -> None:
        self.key = key
        self.followers, self.deltas = VARIANTS[key]
        super().__init__(env, turns)
        # Names as long as compare.py's durably runs', the same for every variant: the task
        # queue is in most events and the run id in some, so the variants' bytes compare.
        self.task_queue = f"bench-durably-{uuid.uuid4().hex[:6]}"
        self._following: list[asyncio.Task[Read]] = []
        self.last_run = ""

    def _workflow_id(self, turns: int) -> str:
        return f"bench-durably-{turns}-{uuid.uuid4().hex[:10]}"

    async def open(self) -> None:
        if not self.deltas:
            await super().open()
            return
        self.runs = {}
        self.durable = DurableClient(self.env.client, task_queue=self.task_queue)
        self.registrations = {n: delta_registration(n) for n in self.turns}
        self.runtime = await DurableRuntime.open(
            client=self.durable, agents=list(self.registrations.values())
        )
        await self.runtime.resume()

    async def start(self, turns: int) -> Any:
        handle = await super().start(turns)
        self.last_run = handle.id
        run = self.runs[handle.id]
        self._following = [asyncio.create_task(follow(run)) for _ in range(self.followers)]
        return handle

    async def collect(self) -> list[Read]:
        """What the last run's followers read (once it completed; they end on their own)."""
        tasks, self._following = self._following, []
        if not tasks:
            return []
        done, pending = await asyncio.wait(tasks, timeout=60)
        for task in pending:
            task.cancel()
        return [t.result() for t in done if not t.cancelled() and t.exception() is None]


@dataclass
class Measured:
    record: RunRecord
    reads: list[Read] = field(default_factory=list)
    kinds: Counter[str] = field(default_factory=Counter)  # the history's events by type


async def measure_history(
    env: WorkflowEnvironment, turns: int, runs: int, log: Callable[[str], None]
) -> dict[str, list[Measured]]:
    sizes = sorted({2, turns})
    impls: dict[str, Implementation] = {FLOOR: Floor(env, sizes)}
    impls |= {key: Followed(env, sizes, key) for key in VARIANTS}
    results: dict[str, list[Measured]] = {key: [] for key in impls}
    opened: list[Implementation] = []
    try:
        for impl in impls.values():
            await impl.open()
            opened.append(impl)
        for impl in impls.values():  # warm up: first connections and tasks
            await run_once(impl, 2, limit_s=120, meter=None, inspect=False)
            if isinstance(impl, Followed):
                await impl.collect()
        for i in range(runs):
            for key in rotated(list(impls), i):
                impl = impls[key]
                record = await run_once(
                    impl, turns, limit_s=max(120.0, 2.0 * turns), meter=None, inspect=True
                )
                measured = Measured(record)
                if isinstance(impl, Followed):
                    measured.reads = await impl.collect()
                    chain = await fetch_chain(env.client, impl.last_run)
                    measured.kinds = Counter(event_type(e) for run in chain for e in run)
                results[key].append(measured)
                reads = measured.reads
                read = ""
                if reads:
                    read = (
                        f", {len(reads)} followers read {reads[0].committed} events"
                        f" + {reads[0].texts} text pieces"
                    )
                status = "" if record.ok else f", {record.status}"
                log(
                    f"  {key:<10} N={turns} {record.seconds:7.3f} s "
                    f"({record.seconds / turns * 1000:6.1f} ms/turn), {record.events} events, "
                    f"{fmt_bytes(record.bytes)}{read}{status}"
                )
    finally:
        for impl in opened:
            await impl.close()
    return results


def med(results: Mapping[str, list[Measured]], key: str, what: str) -> float:
    return float(statistics.median(getattr(m.record, what) for m in results[key]))


def history_rows(
    results: Mapping[str, list[Measured]], turns: int
) -> tuple[list[str], list[list[str]]]:
    header = [
        "system",
        "followers",
        "events",
        "history bytes",
        "runs' spread",
        "bytes/turn",
        "events x floor",
        "bytes x floor",
        "wall/turn",
        "each follower read",
    ]
    floor_events, floor_bytes = med(results, FLOOR, "events"), med(results, FLOOR, "bytes")
    rows = []
    for key in results:
        events, size = med(results, key, "events"), med(results, key, "bytes")
        sizes = [m.record.bytes or 0 for m in results[key]]
        wall = med(results, key, "seconds") / turns
        reads = [r for m in results[key] for r in m.reads]
        read = "-"
        if reads:
            read = f"{statistics.median(r.committed for r in reads):.0f} events"
            if any(r.texts for r in reads):
                read += f" + {statistics.median(r.texts for r in reads):.0f} text pieces"
        rows.append(
            [
                LABELS[key],
                str(VARIANTS[key][0]) if key in VARIANTS else "-",
                f"{events:.0f}",
                f"{size:,.0f} B",
                f"{max(sizes) - min(sizes):,} B",
                f"{size / turns:,.0f} B",
                fmt_ratio(events / floor_events),
                fmt_ratio(size / floor_bytes),
                f"{wall * 1000:.1f} ms",
                read,
            ]
        )
    return header, rows


def comparison_rows(
    results: Mapping[str, list[Measured]], turns: int
) -> tuple[list[str], list[list[str]]]:
    def row(label: str, mine: str, other: str) -> list[str]:
        return [
            label,
            fmt_ratio(med(results, mine, "bytes") / med(results, other, "bytes")),
            fmt_ratio(med(results, mine, "events") / med(results, other, "events")),
            f"{med(results, mine, 'bytes') - med(results, other, 'bytes'):+.0f} B",
        ]

    header = ["history of", "bytes", "events", "bytes difference"]
    rows = [
        row("durably: 1 follower / none", PLAIN_1, PLAIN),
        row("durably: 10 followers / 1", PLAIN_10, PLAIN_1),
        row("with deltas: 1 follower / none", DELTAS_1, DELTAS),
        row("with deltas: 10 followers / 1", DELTAS_10, DELTAS_1),
        row("with deltas / without, no follower", DELTAS, PLAIN),
        row("with deltas / without, 1 follower", DELTAS_1, PLAIN_1),
        row("with deltas / without, 10 followers", DELTAS_10, PLAIN_10),
    ]
    return header, rows


def history_lines(results: Mapping[str, list[Measured]], turns: int) -> list[str]:
    floor = med(results, FLOOR, "bytes")
    lines = []
    for key in (PLAIN_1, PLAIN_10):
        x = med(results, key, "bytes") / floor
        n = VARIANTS[key][0]
        lines.append(
            f"durably, {n} follower{'s' if n > 1 else ''}, N={turns}: history bytes {x:.2f}x "
            f"the floor (target <= {TARGET_HISTORY}x at N=50) -> {verdict(x <= TARGET_HISTORY)}"
        )
    for ten, one, what in ((PLAIN_10, PLAIN_1, "durably"), (DELTAS_10, DELTAS_1, "with deltas")):
        x = med(results, ten, "bytes") / med(results, one, "bytes")
        lines.append(
            f"{what}, 10 followers / 1 follower: history bytes {x:.2f}x "
            f"(target <= {TARGET_FOLLOWERS:.2f}x) -> {verdict(x <= TARGET_FOLLOWERS)}"
        )
    requests = turns + 1
    extra = (med(results, DELTAS_10, "bytes") - med(results, PLAIN_10, "bytes")) / requests
    lines.append(
        f"with deltas ({DELTA_CHARS} characters in {DELTA_PIECES} pieces {DELTA_GAP_S * 1000:.0f} "
        f"ms apart on each of the {requests} model requests, the answer's text), 10 followers: "
        f"{med(results, DELTAS_10, 'bytes') / floor:.2f}x the floor, "
        f"{med(results, DELTAS_10, 'bytes') / med(results, PLAIN_10, 'bytes'):.2f}x durably "
        f"without deltas; {extra:.0f} bytes more per model request for its {DELTA_CHARS} "
        "characters of committed text (the pieces themselves travel in heartbeats, not history)"
    )
    for key in VARIANTS:
        followers = VARIANTS[key][0]
        for m in results[key]:
            bad = [r for r in m.reads if r.last != "run_completed"]
            counts = {r.committed for r in m.reads}
            if len(m.reads) != followers or bad or len(counts) > 1:
                lines.append(
                    f"CHECK FAILED: {key}: {len(m.reads)}/{followers} followers ended, "
                    f"last events {[r.last for r in m.reads]}, committed counts {sorted(counts)}"
                )
            if not m.record.ok:
                lines.append(f"CHECK FAILED: {key}: a run ended {m.record.status}")
    for key in VARIANTS:  # a run whose events differ from the first run without followers
        base = results[DELTAS if VARIANTS[key][1] else PLAIN][0].kinds
        for m in results[key]:
            more, fewer = m.kinds - base, base - m.kinds
            if more or fewer:
                lines.append(
                    f"note: a {key} run's history differs from the first run without followers "
                    f"by {sum(more.values())} event(s) more {dict(more)} and "
                    f"{sum(fewer.values())} fewer {dict(fewer)}"
                )
    return lines


# -- latency: a piece from the provider to an SSE client --------------------------------------


class _Stamped:
    """A streamed reply's events, noting when each piece of text is handed to the socket."""

    def __init__(self, events: list[tuple[str, bool]], written: list[float]) -> None:
        self.events = events
        self.written = written

    def __iter__(self) -> Iterator[tuple[str, bool]]:
        for event, text in self.events:
            if text:  # the fake writes and flushes it as soon as this yields
                self.written.append(time.monotonic())
            yield event, text


class TimedOpenAI(FakeOpenAI):
    """`FakeOpenAI`, noting when it writes each piece of a streamed answer."""

    def __init__(self) -> None:
        super().__init__()
        self.streams: list[list[float]] = []

    def stream_events(
        self, body: Mapping[str, Any], request: Mapping[str, Any]
    ) -> list[tuple[str, bool]]:
        written: list[float] = []
        self.streams.append(written)
        return _Stamped(super().stream_events(body, request), written)  # type: ignore[return-value]


@dataclass
class Message:
    event: str
    data: dict[str, Any]
    at: float


async def sse(port: int, path: str) -> AsyncIterator[Message]:
    """A GET to the live server, read as Server-Sent Events (chunked), each stamped."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n".encode())
        status = (await reader.readline()).decode().strip()
        headers: dict[str, str] = {}
        while (line := (await reader.readline()).decode().strip()) != "":
            name, _, value = line.partition(":")
            headers[name.lower()] = value.strip().lower()
        if " 200 " not in f"{status} " or headers.get("transfer-encoding") != "chunked":
            raise SystemExit(f"the live server answered {status!r} {headers}")
        buffer = ""
        while True:
            while "\n\n" not in buffer:
                size = int((await reader.readline()).strip() or b"0", 16)
                if size == 0:
                    return
                buffer += (await reader.readexactly(size)).decode()
                await reader.readline()
            at = time.monotonic()
            block, buffer = buffer.split("\n\n", 1)
            fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
            if "data" in fields:
                yield Message(fields.get("event", ""), json.loads(fields["data"]), at)
    finally:
        writer.close()


@dataclass
class Piece:
    index: int
    emitted: float
    received: float | None = None
    path: str = ""  # "preview" or "commit"
    visible: float | None = None  # first seen in the run's heartbeat details (probed run)

    @property
    def latency(self) -> float | None:
        return None if self.received is None else self.received - self.emitted


@dataclass
class Probe:
    """Reads of a run beside its follower: when each piece's preview is on the server, and
    how long the follower's two reads take."""

    visible: dict[int, float] = field(default_factory=dict)
    describe: list[float] = field(default_factory=list)
    query: list[float] = field(default_factory=list)


async def probe(durable: DurableClient, run_id: str, into: Probe, stop: asyncio.Event) -> None:
    handle = durable.temporal.get_workflow_handle(run_id)
    ends = list(itertools.accumulate(len(p) for p in FakeOpenAI.pieces(ANSWER)))
    for i in itertools.count():
        if stop.is_set():
            return
        began = time.monotonic()
        preview = await _text_preview(durable.temporal, await handle.describe())
        done = time.monotonic()
        into.describe.append(done - began)
        if preview is not None:
            for index, end in enumerate(ends):
                if preview.length >= end:
                    into.visible.setdefault(index, (began + done) / 2)
        if i % 5 == 0:
            began = time.monotonic()
            with contextlib.suppress(Exception):
                await _poll(handle, 0, f"run {run_id!r}")
                into.query.append(time.monotonic() - began)
        await asyncio.sleep(PROBE_S)


async def latency_run(
    fake: TimedOpenAI, durable: DurableClient, server: LiveServer, agent_id: str, probed: bool
) -> tuple[list[Piece], Probe | None]:
    fake.script(Reply(fake.text(ANSWER).body, delay=LEAD_S, piece_delay=PIECE_GAP_S))
    stream = len(fake.streams)
    run = await durable.start_run(
        agent_id, "Write.", run_id=f"live-latency-{uuid.uuid4().hex[:10]}"
    )
    probing = Probe() if probed else None
    stop = asyncio.Event()
    task = None
    if probing is not None:
        task = asyncio.create_task(probe(durable, run.run_id, probing, stop))
    messages: list[Message] = []
    try:
        async with asyncio.timeout(120):
            async for message in sse(server.port, f"/runs/{run.run_id}/events"):
                messages.append(message)
                if message.event in ("run_completed", "run_cancelled", "error"):
                    break
    finally:
        stop.set()
        if task is not None:
            await task
    if (await run.result()).output != ANSWER:
        raise SystemExit("the latency run's answer is not the fake's")
    pieces = [Piece(i, at) for i, at in enumerate(fake.streams[stream])]
    text = ""
    for j, message in enumerate(messages):
        if message.event != "text_delta":
            continue
        after = messages[j + 1] if j + 1 < len(messages) else None
        at_commit = (
            after is not None and after.event == "model_completed" and after.at - message.at < 0.02
        )
        text += message.data["text"]
        for found in MARK.finditer(text):
            piece = pieces[int(found.group(1))]
            if piece.received is None:
                piece.received = message.at
                piece.path = "commit" if at_commit else "preview"
    if probing is not None:
        for piece in pieces:
            piece.visible = probing.visible.get(piece.index)
    return pieces, probing


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def p95(values: Sequence[float]) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[94]


def spread(label: str, values: Sequence[float]) -> list[str]:
    if not values:
        return [label, "0", "-", "-", "-", "-"]
    return [
        label,
        str(len(values)),
        ms(statistics.median(values)),
        ms(p95(values)),
        ms(min(values)),
        ms(max(values)),
    ]


@dataclass
class Latency:
    runs: list[list[Piece]]
    probed: list[Piece]
    probe: Probe

    def all(self) -> list[Piece]:
        return [p for run in self.runs for p in run]


async def measure_latency(
    env: WorkflowEnvironment, runs: int, log: Callable[[str], None]
) -> Latency:
    with TimedOpenAI() as fake:
        assert isinstance(fake, TimedOpenAI)
        durable = DurableClient(env.client, task_queue=f"live-latency-{uuid.uuid4().hex[:6]}")
        agent = Agent(id="live-latency", model=fake.model(), instructions="Write.")
        registration = AgentRegistration(agent, version="1")
        runtime = await DurableRuntime.open(client=durable, agents=[registration])
        await runtime.resume()
        try:
            async with LiveServer(durable, port=0) as server:
                await latency_run(fake, durable, server, registration.agent_id, False)  # warm up
                measured: list[list[Piece]] = []
                for _ in range(runs):
                    pieces, _probe = await latency_run(
                        fake, durable, server, registration.agent_id, False
                    )
                    measured.append(pieces)
                    got = [p.latency for p in pieces if p.latency is not None]
                    log(
                        f"  latency run: {len(got)}/{len(pieces)} pieces, median "
                        f"{ms(statistics.median(got))}, max {ms(max(got))}"
                    )
                probed, found = await latency_run(
                    fake, durable, server, registration.agent_id, True
                )
                assert found is not None
                got = [p.latency for p in probed if p.latency is not None]
                log(
                    f"  probed run: {len(got)}/{len(probed)} pieces, "
                    f"median {ms(statistics.median(got))}"
                )
        finally:
            await runtime.close()
    return Latency(measured, probed, found)


def latency_rows(lat: Latency) -> tuple[list[str], list[list[str]]]:
    pieces = lat.all()
    header = ["pieces", "count", "median", "p95", "min", "max"]
    rows = [
        spread("all", [p.latency for p in pieces if p.latency is not None]),
        spread(
            "by a heartbeat preview",
            [p.latency for p in pieces if p.latency is not None and p.path == "preview"],
        ),
        spread(
            "with model_completed (the rest)",
            [p.latency for p in pieces if p.latency is not None and p.path == "commit"],
        ),
        spread(
            "the first of each run",
            [first for run in lat.runs if (first := run[0].latency) is not None],
        ),
    ]
    missing = sum(1 for p in pieces if p.received is None)
    if missing:
        rows.append(["never received", str(missing), "-", "-", "-", "-"])
    return header, rows


def breakdown_rows(lat: Latency) -> tuple[list[str], list[list[str]]]:
    seen = [p for p in lat.probed if p.visible is not None and p.received is not None]
    header = ["probed run", "count", "median", "p95", "min", "max"]
    rows = [
        spread("emit -> received", [p.latency for p in lat.probed if p.latency is not None]),
        spread("emit -> visible on the server", [p.visible - p.emitted for p in seen]),  # type: ignore[operator]
        spread("visible -> received", [p.received - p.visible for p in seen]),  # type: ignore[operator]
        spread("describe round trip", lat.probe.describe),
        spread("poll query round trip", lat.probe.query),
    ]
    return header, rows


def latency_lines(lat: Latency) -> list[str]:
    got = [p.latency for p in lat.all() if p.latency is not None]
    median = statistics.median(got) * 1000
    describe = statistics.median(lat.probe.describe) * 1000
    query = statistics.median(lat.probe.query) * 1000 if lat.probe.query else float("nan")
    return [
        f"configuration: the fake provider writes {PIECES} pieces ({len(ANSWER)} characters) "
        f"{PIECE_GAP_S * 1000:.0f} ms apart after {LEAD_S:.0f} s; previews batched by the "
        f"heartbeat throttle {HEARTBEAT_THROTTLE.total_seconds() * 1000:.0f} ms "
        "(durably.worker.HEARTBEAT_THROTTLE); the follower's poll interval (cooldown once "
        f"caught up) {POLL_INTERVAL * 1000:.0f} ms (RunHandle.events' default, which "
        "LiveServer's shared follower uses); LiveServer defaults (port 0, no tokens); "
        f"server round trips (probed run, medians): poll query {query:.1f} ms, describe "
        f"{describe:.1f} ms; worker, follower, SSE server and SSE client in one event loop",
        f"chunk -> SSE client, median {median:.0f} ms, p95 {p95(got) * 1000:.0f} ms over "
        f"{len(got)} pieces of {len(lat.runs)} runs: median <= {TARGET_MEDIAN_MS:.0f} ms -> "
        f"{verdict(median <= TARGET_MEDIAN_MS)}",
    ]


# -- main --------------------------------------------------------------------------------


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--turns", type=int, default=50, help="N, tool turns per run (50)")
    parser.add_argument("--runs", type=int, default=3, help="runs per system, and latency runs (3)")
    parser.add_argument(
        "--only", choices=("history", "latency"), help="one of the two measurements"
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.turns < 1 or args.runs < 1:
        parser.error("--turns and --runs must be positive")

    def log(line: str) -> None:
        print(line, flush=True)

    load = [("start", os.getloadavg())]
    log(f"load average at start: {' '.join(f'{x:.2f}' for x in load[0][1])}")
    began = time.perf_counter()
    history: dict[str, list[Measured]] | None = None
    latency: Latency | None = None
    async with dev_server(SEARCH_ATTRIBUTES) as env:
        if args.only != "latency":
            history = await measure_history(env, args.turns, args.runs, log)
        if args.only != "history":
            latency = await measure_latency(env, args.runs, log)
    load.append(("end", os.getloadavg()))
    elapsed = time.perf_counter() - began

    if history is not None:
        print(f"\nhistory per run, N={args.turns} (median of {args.runs} runs)")
        print(text_table(*history_rows(history, args.turns)))
        print()
        print(text_table(*comparison_rows(history, args.turns)))
        print(
            "(runs differ by up to a few hundred bytes with the same events: the varint sizes "
            "of timestamps, task ids and history_size_bytes; see the runs' spread)"
        )
        print()
        for line in history_lines(history, args.turns):
            print(line)
    if latency is not None:
        print(
            f"\nlatency from the fake provider writing a piece to the SSE client receiving it "
            f"({len(latency.runs)} runs of {PIECES} pieces)"
        )
        print(text_table(*latency_rows(latency)))
        print(
            "\nwhere the time goes: one more run, its heartbeat details probed every "
            f"{PROBE_S * 1000:.0f} ms"
        )
        print(text_table(*breakdown_rows(latency)))
        print()
        for line in latency_lines(latency):
            print(line)
    print_footer(load, elapsed, "live.py", argv)


if __name__ == "__main__":
    run_main(main())
