"""What tracing costs a run: durably with OpenTelemetry tracing on, and off (issue 19).

Workload: compare.py's (N turns of one model request answering with one tool
call and the tool returning 2,000 bytes, then a final answer; the model has
zero latency, so a run is pure orchestration and tracing's share is the
largest it can be). Two systems, each a `DurableRuntime` on its own task queue
in this process, against one dev server started as compare.py starts it
(``_common.dev_server``):

- **off**: no tracing (`durably.telemetry`'s hooks run, finding no tracer);
- **on**: ``DurableRuntime.open(..., tracing=provider)``: an OpenTelemetry SDK
  `TracerProvider` with a `BatchSpanProcessor` whose exporter encodes every
  span to OTLP protobuf (what an OTLP exporter sends) and drops the bytes, so
  the measurement holds the spans' whole cost in the worker but no network.
  Runs are started through the runtime's traced client (a client span, and the
  trace header the run carries).

Each run is started with ``start_run`` and awaited with ``run.result()``; wall
time per turn is the run's wall time over its N+1 model requests. Runs go in
rounds of one run of each system (the order alternating), after one warm-up
run each; the ratio is the median of the rounds' ratios on/off. Target (SPEC
section 19): tracing on costs at most 10% wall per turn at N = 50.

Run ``python benchmarks/compare.py tracing`` (N = 5 and 50, 7 rounds) or
``python benchmarks/tracing.py --turns 50 --runs 9``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from _common import dev_server, print_footer, prompt, run_main
from _impl_durably import durably_registration
from compare import fmt_ratio, text_table, verdict
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from temporalio.testing import WorkflowEnvironment

from durably import DurableClient, DurableRuntime
from durably.contract import SEARCH_ATTRIBUTES

TARGET = 1.10  # wall per turn, tracing on / off, at N = 50 (SPEC section 19)
SYSTEMS = ("off", "on")


class EncodingExporter(SpanExporter):
    """Encodes each batch as OTLP protobuf (what an OTLP exporter sends), then drops it."""

    def __init__(self) -> None:
        self.spans = 0
        self.bytes = 0
        try:
            from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
        except ImportError:  # no OTLP exporter installed: count the spans only
            self._encode: Any = None
        else:
            self._encode = encode_spans

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        if self._encode is not None:
            self.bytes += len(self._encode(spans).SerializeToString())
        return SpanExportResult.SUCCESS


@dataclass
class System:
    key: str
    runtime: DurableRuntime
    walls: dict[int, list[float]] = field(default_factory=dict)

    async def run(self, turns: int) -> float:
        """One run of `turns` tool turns, to its result; wall seconds per model request."""
        run_id = f"tracing-{self.key}-{turns}-{uuid.uuid4().hex[:8]}"
        started = time.perf_counter()
        handle = await self.runtime.client.start_run(
            f"tracing-{turns}", prompt(turns), run_id=run_id
        )
        await handle.result()
        return (time.perf_counter() - started) / (turns + 1)


async def open_systems(
    env: WorkflowEnvironment, turns: Sequence[int], provider: TracerProvider
) -> dict[str, System]:
    systems = {}
    for key in SYSTEMS:
        client = DurableClient(env.client, task_queue=f"tracing-{key}-{uuid.uuid4().hex[:6]}")
        runtime = await DurableRuntime.open(
            client=client,
            agents=[durably_registration(n, prefix="tracing") for n in turns],
            tracing=provider if key == "on" else False,
        )
        await runtime.resume()
        systems[key] = System(key, runtime)
    return systems


async def measure(turns: Sequence[int], rounds: int) -> tuple[dict[str, System], EncodingExporter]:
    exporter = EncodingExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    async with dev_server(SEARCH_ATTRIBUTES) as env:
        systems = await open_systems(env, turns, provider)
        try:
            for key in SYSTEMS:  # warm up: imports, caches, sticky queues
                await systems[key].run(min(turns))
            for n in turns:
                for r in range(rounds):
                    order = SYSTEMS if r % 2 == 0 else tuple(reversed(SYSTEMS))
                    for key in order:
                        wall = await systems[key].run(n)
                        systems[key].walls.setdefault(n, []).append(wall)
                    print(
                        f"N={n} round {r + 1}/{rounds}: "
                        + ", ".join(
                            f"{k} {systems[k].walls[n][-1] * 1000:.1f} ms/turn" for k in SYSTEMS
                        ),
                        flush=True,
                    )
        finally:
            for system in systems.values():
                await system.runtime.close()
            provider.shutdown()
    return systems, exporter


def report(systems: dict[str, System], exporter: EncodingExporter, turns: Sequence[int]) -> None:
    off, on = systems["off"], systems["on"]
    rows = []
    for n in turns:
        ratios = [b / a for a, b in zip(off.walls[n], on.walls[n], strict=True)]
        rows.append(
            [
                str(n),
                f"{statistics.median(off.walls[n]) * 1000:.1f} ms",
                f"{statistics.median(on.walls[n]) * 1000:.1f} ms",
                fmt_ratio(statistics.median(ratios)),
                f"{min(ratios):.2f}-{max(ratios):.2f}x",
                str(len(ratios)),
            ]
        )
    print()
    print("wall time per turn (per model request), tracing off and on")
    header = ["N", "off", "on", "on/off (median of rounds)", "range", "rounds"]
    print(text_table(header, rows))
    runs = sum(len(w) for w in on.walls.values()) + 1  # + the warm-up run
    shown = f"{exporter.spans} spans from {runs} traced runs"
    if exporter.bytes:
        shown += f", {exporter.bytes / 1000:.0f} kB of OTLP protobuf"
    print(shown)
    at = 50 if 50 in turns else max(turns)
    ratio = statistics.median(b / a for a, b in zip(off.walls[at], on.walls[at], strict=True))
    print(
        f"tracing on / off, wall per turn at N={at}: {ratio:.2f}x "
        f"(target <= {TARGET:.2f}x: {verdict(ratio <= TARGET)})"
    )


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[5, 50], help="N values")
    parser.add_argument("--runs", type=int, default=7, help="rounds per N")
    args = parser.parse_args(argv)
    if args.runs < 1 or any(n < 1 for n in args.turns):
        parser.error("--turns and --runs must be positive")
    return args


async def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    began = time.monotonic()
    load = [("start", os.getloadavg())]
    systems, exporter = await measure(args.turns, args.runs)
    load.append(("end", os.getloadavg()))
    report(systems, exporter, args.turns)
    print_footer(load, time.monotonic() - began, "tracing.py", argv)


if __name__ == "__main__":
    run_main(main())
