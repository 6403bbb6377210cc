"""What the benchmarks share: the workload, the plain-Temporal floor, the dev server, history sizes.

The workload: N turns, each one model request answering with one tool call
and one tool call returning the same 2,000 bytes for that turn (`page`),
then a final model request that answers. The model has zero latency.

The floor (`FloorWorkflow`) is the least any implementation of it can do on
Temporal: a hand-written workflow whose "model" activity gets only the turn
number and whose "tool" activity returns the page.

This module is imported by workflow code (the floor runs in Temporal's
sandbox), so it imports nothing but the standard library and `temporalio`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import socket
import sys
from collections.abc import AsyncIterator, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from google.protobuf.message import Message as ProtoMessage
from temporalio import activity, workflow
from temporalio.api.common.v1 import Payload
from temporalio.api.history.v1 import History, HistoryEvent
from temporalio.client import Client
from temporalio.common import SearchAttributeKey
from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.testing import WorkflowEnvironment

TOOL_NAME = "fetch_page"
RESULT_BYTES = 2_000
INSTRUCTIONS = "Fetch pages until told to stop."
# The stock value holds each workflow task ~40 ms on the dev server, which
# hides every difference between implementations.


def page(turn: int) -> str:
    """The tool's result for `turn`: 2,000 ASCII bytes, the same on every call."""
    seed = hashlib.sha256(f"turn-{turn}".encode()).hexdigest()
    return (seed * (RESULT_BYTES // len(seed) + 1))[:RESULT_BYTES]


def prompt(turns: int) -> str:
    """The user's input; models that only see the transcript read N from it."""
    return f"Fetch the pages of {turns} turns, one tool call per turn."


def turns_in(text: str) -> int:
    """N, read back from `prompt(N)`."""
    found = re.search(r"of (\d+) turns", text)
    if found is None:
        raise ValueError(f"no turn count in the prompt {text!r}")
    return int(found.group(1))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def dev_server(
    search_attributes: Sequence[SearchAttributeKey[Any]] = (),
    *,
    metrics_port: int | None = None,
) -> AsyncIterator[WorkflowEnvironment]:
    """A dev server (in memory) for the length of the block, with the benchmark's settings.

    The Temporal core's own warnings (e.g. each payload over 512 KB, which the
    implementations that resend the transcript write every turn) are silenced.
    """
    quiet = TelemetryFilter(core_level="ERROR", other_level="ERROR")
    Runtime.set_default(
        Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(filter=quiet))),
        error_if_already_set=False,
    )
    # Imported here, not with the module: the floor's workflow imports this module
    # inside the sandbox, and importing durably there made every floor run slower.
    from durably.dev import DEV_SERVER_ARGS, find_temporal

    extra = list(DEV_SERVER_ARGS)
    if metrics_port is not None:
        extra += ["--metrics-port", str(metrics_port)]
    async with await WorkflowEnvironment.start_local(
        dev_server_existing_path=find_temporal(),
        search_attributes=search_attributes,
        dev_server_log_level="error",
        dev_server_extra_args=extra,
    ) as env:
        yield env


def print_footer(
    load: Sequence[tuple[str, tuple[float, float, float]]],
    elapsed: float,
    script: str,
    argv: Sequence[str],
) -> None:
    """The last lines of a benchmark's report: the machine's load, and how to run it again."""
    shown = "; ".join(f"{w}: {' / '.join(f'{x:.2f}' for x in v)}" for w, v in load)
    print(f"load average: {shown}; {elapsed / 60:.1f} minutes")
    print("command: " + " ".join([f"python benchmarks/{script}", *argv]))


def run_main(main: Coroutine[Any, Any, None]) -> None:
    """Run `main`, then leave without interpreter finalisation.

    The Temporal core's threads can still call into Python while the
    interpreter finalises, which sometimes aborts the process (SIGABRT)
    after all the work is done; everything is stopped by then.
    """
    code = 0
    try:
        asyncio.run(main)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
        if exit_.code is not None and not isinstance(exit_.code, int):
            print(exit_.code, file=sys.stderr)
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# -- the floor: a plain Temporal workflow ---------------------------------------------


@activity.defn(name="floor.model_request")
async def floor_model(turn: int) -> dict[str, Any]:
    """A model request: a tool call for turns 1..N (the workflow decides when to stop)."""
    return {"id": f"call_{turn}", "name": TOOL_NAME, "arguments": {"turn": turn}}


@activity.defn(name="floor.final_answer")
async def floor_final(turn: int) -> dict[str, Any]:
    """The last model request: a final answer."""
    return {"content": f"done after {turn - 1} tool turns"}


@activity.defn(name="floor.tool_call")
async def floor_tool(call: dict[str, Any]) -> str:
    return page(int(call["arguments"]["turn"]))


FLOOR_ACTIVITIES = [floor_model, floor_tool, floor_final]


@workflow.defn(name="HistoryGrowthFloor")
class FloorWorkflow:
    @workflow.run
    async def run(self, turns: int) -> str:
        for turn in range(1, turns + 1):
            call: dict[str, Any] = await workflow.execute_activity(
                floor_model, turn, start_to_close_timeout=timedelta(minutes=5)
            )
            await workflow.execute_activity(
                floor_tool, call, start_to_close_timeout=timedelta(minutes=10)
            )
        answer: dict[str, Any] = await workflow.execute_activity(
            floor_final, turns + 1, start_to_close_timeout=timedelta(minutes=5)
        )
        return str(answer["content"])


# -- histories ---------------------------------------------------------------------------


@dataclass
class TypeStats:
    count: int = 0
    bytes: int = 0
    payload_bytes: int = 0


def payload_bytes(message: ProtoMessage) -> int:
    """The serialized size of every `Payload` inside `message` (data and metadata)."""
    if isinstance(message, Payload):
        return message.ByteSize()
    total = 0
    for descriptor, value in message.ListFields():
        if descriptor.message_type is None:
            continue
        if isinstance(value, ProtoMessage):
            items = [value]
        elif descriptor.message_type.GetOptions().map_entry:
            items = list(value.values())
        else:
            items = list(value)
        for item in items:
            if isinstance(item, ProtoMessage):
                total += payload_bytes(item)
    return total


def event_type(event: HistoryEvent) -> str:
    name = event.WhichOneof("attributes") or "unknown"
    return name.removesuffix("_event_attributes")


def activity_of(event: HistoryEvent, scheduled: dict[int, str]) -> str | None:
    """The activity type an activity event belongs to (None for other events)."""
    kind = event.WhichOneof("attributes")
    if kind == "activity_task_scheduled_event_attributes":
        name = event.activity_task_scheduled_event_attributes.activity_type.name
        scheduled[event.event_id] = name
        return name
    if kind is not None and kind.startswith("activity_task_"):
        return scheduled.get(getattr(event, kind).scheduled_event_id)
    return None


def history_bytes(events: Iterable[HistoryEvent]) -> int:
    """The size of the serialized `History` proto holding `events`."""
    return History(events=list(events)).ByteSize()


async def fetch_chain(client: Client, workflow_id: str) -> list[list[HistoryEvent]]:
    """Every run's history of `workflow_id`, oldest first (continue-as-new makes several)."""
    runs: list[list[HistoryEvent]] = []
    run_id: str | None = None
    while True:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        events = list(history.events)
        runs.insert(0, events)
        started = events[0].workflow_execution_started_event_attributes if events else None
        previous = started.continued_execution_run_id if started is not None else ""
        if not previous:
            return runs
        run_id = previous
