"""Three tool calls of one model answer: durably's tool phase against raw Temporal (issue 16).

Workload: the first model request answers with three calls of one tool
(`nap`, arguments ``{"index": 1..3}``, call ids ``call_1..3``), each call
sleeping 1 s (``asyncio.sleep``); the second model request answers. The
model has zero latency, so the tool phase is one second of tools plus
orchestration. Two systems, each on its own task queue and worker in this
process, against one dev server started as ``compare.py`` starts it
(``_common.dev_server``: ``history.transferProcessorMaxPollRPS=1000``):

- **floor**: a plain Temporal workflow (unsandboxed, as durably's) calling a
  model activity, the three tool activities with ``asyncio.gather``, and the
  model activity again;
- **durably**: an ``Agent`` with a ``FunctionModel`` and the tool, ``safe``
  (``tool_recovery``), default ``max_parallel_tools`` (all calls at once), run
  by a ``DurableRuntime``, started with ``DurableClient.start_run`` and awaited
  with ``run.result()``.

Measured from each run's history: the **tool phase**, from the first model
activity's ``ActivityTaskCompleted`` to the second model activity's
``ActivityTaskScheduled`` (durably's are ``durably.model_request`` and
``durably.tool_call``), split into the wait for the tools to be scheduled,
the tools' own span (first scheduled to last completed) and the wait for the
second model request; whether every tool was scheduled before the first one
completed; and the wall time (start request to result). Medians of N runs,
the systems alternating, after one warm-up run each. Target (issue 16):
durably's tool phase <= 1.3 s. Also checked, on every durably run: the three
tool results entered the transcript (the run's ``transcript`` query) in call
order, whatever order the tools completed in (shown from the history).

Run ``python benchmarks/compare.py tools`` (5 runs each) or
``python benchmarks/parallel_tools.py --runs 9``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from _common import INSTRUCTIONS, activity_of, dev_server, fetch_chain, print_footer, run_main
from compare import DURABLY, FLOOR, _seconds, fmt_ratio, rotated, text_table, verdict
from temporalio import activity, workflow
from temporalio.api.history.v1 import HistoryEvent
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from durably import (
    Agent,
    AgentRegistration,
    AssistantMessage,
    DurableClient,
    DurableRuntime,
    FunctionModel,
    ModelRequest,
    ToolCall,
    tool,
)
from durably._query_guard import ask
from durably.contract import (
    ACTIVITY_MODEL,
    ACTIVITY_TOOL,
    SEARCH_ATTRIBUTES,
    Handler,
    TranscriptPage,
)
from durably.messages import ToolResultMessage

CALLS = 3
NAP_S = 1.0
TARGET_S = 1.3  # durably's tool phase (issue 16)
TOOL = "nap"
SYSTEMS = (FLOOR, DURABLY)
LABELS = {FLOOR: "raw Temporal, asyncio.gather (floor)", DURABLY: "durably"}
CALL_IDS = [f"call_{i}" for i in range(1, CALLS + 1)]
ANSWER = f"done after {CALLS} naps"


def calls() -> list[dict[str, Any]]:
    """The first model answer's tool calls, in the model's order."""
    return [{"id": c, "name": TOOL, "arguments": {"index": i}} for i, c in enumerate(CALL_IDS, 1)]


# -- the floor: a plain Temporal workflow ---------------------------------------------


@activity.defn(name="tools_floor.model_request")
async def floor_model(results: int) -> dict[str, Any]:
    """Three tool calls before any result, then the answer."""
    return {"content": ANSWER} if results else {"calls": calls()}


@activity.defn(name="tools_floor.tool_call")
async def floor_nap(call: dict[str, Any]) -> str:
    await asyncio.sleep(NAP_S)
    return f"nap {call['arguments']['index']} done"


@workflow.defn(name="ParallelToolsFloor", sandboxed=False)
class FloorTools:
    @workflow.run
    async def run(self) -> str:
        first: dict[str, Any] = await workflow.execute_activity(
            floor_model, 0, start_to_close_timeout=timedelta(minutes=5)
        )
        results = await asyncio.gather(
            *(
                workflow.execute_activity(
                    floor_nap,
                    call,
                    activity_id=call["id"],
                    start_to_close_timeout=timedelta(minutes=5),
                )
                for call in first["calls"]
            )
        )
        answer: dict[str, Any] = await workflow.execute_activity(
            floor_model, len(results), start_to_close_timeout=timedelta(minutes=5)
        )
        return str(answer["content"])


# -- durably ---------------------------------------------------------------------------


@tool(name=TOOL)
async def nap(index: int) -> str:
    """Sleep one second.

    Args:
        index: Which nap of the answer.
    """
    await asyncio.sleep(NAP_S)
    return f"nap {index} done"


def registration() -> AgentRegistration:
    def respond(request: ModelRequest) -> AssistantMessage:
        if any(isinstance(m, ToolResultMessage) for m in request.messages):
            return AssistantMessage(content=ANSWER)
        return AssistantMessage(
            tool_calls=tuple(
                ToolCall(id=c["id"], name=c["name"], arguments=c["arguments"]) for c in calls()
            )
        )

    agent = Agent(
        id="parallel-tools-bench",
        model=FunctionModel(respond, name="parallel-tools-bench"),
        instructions=INSTRUCTIONS,
        tools=[nap],
    )
    return AgentRegistration(agent, version="1", tool_recovery={TOOL: "safe"})


# -- the systems ---------------------------------------------------------------------


class System:
    key: str
    model_activity: str
    tool_activity: str

    def __init__(self, env: WorkflowEnvironment) -> None:
        self.env = env
        self.task_queue = f"tools-{self.key}-{uuid.uuid4().hex[:6]}"

    async def open(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def run(self) -> str:
        """One run, to its answer; its workflow id."""
        raise NotImplementedError

    async def transcript_order(self, workflow_id: str) -> list[str] | None:
        """The call ids of the tool results in the run's transcript, in order."""
        return None


class FloorSystem(System):
    key = FLOOR
    model_activity = "tools_floor.model_request"
    tool_activity = "tools_floor.tool_call"

    async def open(self) -> None:
        self._worker = Worker(
            self.env.client,
            task_queue=self.task_queue,
            workflows=[FloorTools],
            activities=[floor_model, floor_nap],
        )
        self._task = asyncio.create_task(self._worker.run())

    async def close(self) -> None:
        await self._worker.shutdown()
        await self._task

    async def run(self) -> str:
        workflow_id = f"tools-{self.key}-{uuid.uuid4().hex[:10]}"
        answer = await self.env.client.execute_workflow(
            FloorTools.run, id=workflow_id, task_queue=self.task_queue
        )
        if answer != ANSWER:
            raise SystemExit(f"{self.key}: unexpected answer {answer!r}")
        return workflow_id


class DurablySystem(System):
    key = DURABLY
    model_activity = ACTIVITY_MODEL
    tool_activity = ACTIVITY_TOOL

    async def open(self) -> None:
        self.durable = DurableClient(self.env.client, task_queue=self.task_queue)
        self.registration = registration()
        self.runtime = await DurableRuntime.open(client=self.durable, agents=[self.registration])
        await self.runtime.resume()

    async def close(self) -> None:
        await self.runtime.close()

    async def run(self) -> str:
        run = await self.durable.start_run(
            self.registration.agent_id,
            "Take three naps at once.",
            run_id=f"tools-{self.key}-{uuid.uuid4().hex[:10]}",
        )
        result = await run.result()
        if result.output != ANSWER:
            raise SystemExit(f"{self.key}: unexpected answer {result.output!r}")
        return run.run_id

    async def transcript_order(self, workflow_id: str) -> list[str] | None:
        handle = self.durable.temporal.get_workflow_handle(workflow_id)
        page = await ask(handle, Handler.TRANSCRIPT, 0, None, result_type=TranscriptPage)
        return [m.call_id for m in page.messages if isinstance(m, ToolResultMessage)]


# -- a run, from its history -----------------------------------------------------------


@dataclass
class Run:
    key: str
    wall: float
    phase: float  # first model completed -> second model scheduled
    to_tools: float  # first model completed -> first tool scheduled
    tools: float  # first tool scheduled -> last tool completed
    to_model: float  # last tool completed -> second model scheduled
    overlapped: bool  # every tool scheduled before the first one completed
    completed: list[str]  # call ids, in the order the tools completed
    transcript: list[str] | None  # call ids of the transcript's tool results


def tool_phase(
    system: System, events: Sequence[HistoryEvent]
) -> tuple[float, float, float, float, bool, list[str]]:
    scheduled: dict[int, str] = {}
    model_completed: list[float] = []
    model_scheduled: list[float] = []
    tools_scheduled: list[float] = []
    tools_completed: list[tuple[float, str]] = []
    call_of: dict[int, str] = {}
    for event in events:
        name = activity_of(event, scheduled)
        kind = event.WhichOneof("attributes")
        at = _seconds(event)
        if kind == "activity_task_scheduled_event_attributes":
            if name == system.model_activity:
                model_scheduled.append(at)
            elif name == system.tool_activity:
                tools_scheduled.append(at)
                found = re.search(
                    r"call_\d+", event.activity_task_scheduled_event_attributes.activity_id
                )
                call_of[event.event_id] = found.group(0) if found else "?"
        elif kind == "activity_task_completed_event_attributes":
            attrs = event.activity_task_completed_event_attributes
            if name == system.model_activity:
                model_completed.append(at)
            elif name == system.tool_activity:
                tools_completed.append((at, call_of[attrs.scheduled_event_id]))
    if len(model_completed) < 1 or len(model_scheduled) < 2 or len(tools_completed) != CALLS:
        raise SystemExit(
            f"{system.key}: expected 2 model requests and {CALLS} tool calls in the history, "
            f"found {len(model_scheduled)} and {len(tools_completed)}"
        )
    begin, end = model_completed[0], model_scheduled[1]
    last_tool = max(at for at, _ in tools_completed)
    return (
        end - begin,
        min(tools_scheduled) - begin,
        last_tool - min(tools_scheduled),
        end - last_tool,
        max(tools_scheduled) < min(at for at, _ in tools_completed),
        [call for _, call in tools_completed],  # history order
    )


async def measure(system: System) -> Run:
    started = time.perf_counter()
    workflow_id = await system.run()
    wall = time.perf_counter() - started
    (events,) = await fetch_chain(system.env.client, workflow_id)
    phase, to_tools, tools, to_model, overlapped, completed = tool_phase(system, events)
    transcript = await system.transcript_order(workflow_id)
    return Run(
        system.key, wall, phase, to_tools, tools, to_model, overlapped, completed, transcript
    )


# -- the report --------------------------------------------------------------------------


def median(runs: Sequence[Run], field: str) -> float:
    return statistics.median(getattr(r, field) for r in runs)


def rows(runs: dict[str, list[Run]]) -> tuple[list[str], list[list[str]]]:
    header = [
        "system",
        "tool phase",
        "x floor",
        "to tools scheduled",
        "tools (span)",
        "to 2nd model scheduled",
        "wall",
        "x floor",
        "overlapped",
    ]
    floor = runs[FLOOR]
    table = []
    for key, mine in runs.items():
        table.append(
            [
                LABELS[key],
                f"{median(mine, 'phase'):.3f} s",
                fmt_ratio(median(mine, "phase") / median(floor, "phase")),
                f"{median(mine, 'to_tools') * 1000:.0f} ms",
                f"{median(mine, 'tools'):.3f} s",
                f"{median(mine, 'to_model') * 1000:.0f} ms",
                f"{median(mine, 'wall'):.3f} s",
                fmt_ratio(median(mine, "wall") / median(floor, "wall")),
                f"{sum(r.overlapped for r in mine)}/{len(mine)}",
            ]
        )
    return header, table


def target_lines(runs: dict[str, list[Run]]) -> list[str]:
    durably, floor = runs[DURABLY], runs[FLOOR]
    phase, floor_phase = median(durably, "phase"), median(floor, "phase")
    in_order = [r for r in durably if r.transcript == CALL_IDS]
    shuffled = [r for r in durably if r.completed != CALL_IDS]
    lines = [
        f"durably tool phase: {phase:.3f} s (target <= {TARGET_S} s) -> "
        f"{verdict(phase <= TARGET_S)}",
        f"durably / raw-Temporal floor, tool phase: {phase / floor_phase:.2f}x "
        f"({phase:.3f} s / {floor_phase:.3f} s); "
        f"over the {NAP_S:.0f} s nap: {(phase - NAP_S) * 1000:.0f} ms against "
        f"{(floor_phase - NAP_S) * 1000:.0f} ms",
        f"durably's {CALLS} tool results entered the transcript in call order: "
        f"{len(in_order)}/{len(durably)} runs"
        + ("" if len(in_order) == len(durably) else " -> CHECK FAILED")
        + (
            f" ({len(shuffled)} of them completed out of call order, e.g. "
            f"{', '.join(shuffled[0].completed)})"
            if shuffled
            else " (every run's tools completed in call order: the order was not put to the test)"
        ),
    ]
    for r in durably:
        if r.transcript != CALL_IDS:
            lines.append(f"CHECK FAILED: transcript tool results {r.transcript}, calls {CALL_IDS}")
    return lines


# -- main --------------------------------------------------------------------------------


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=5, help="runs per system (5)")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be positive")

    def log(line: str) -> None:
        print(line, flush=True)

    load = [("start", os.getloadavg())]
    log(f"load average at start: {' '.join(f'{x:.2f}' for x in load[0][1])}")
    began = time.perf_counter()
    runs: dict[str, list[Run]] = {key: [] for key in SYSTEMS}
    async with dev_server(SEARCH_ATTRIBUTES) as env:
        systems = {key: (FloorSystem if key == FLOOR else DurablySystem)(env) for key in SYSTEMS}
        opened: list[System] = []
        try:
            for system in systems.values():
                await system.open()
                opened.append(system)
            for system in systems.values():  # warm up: first connections and tasks
                await system.run()
            for i in range(args.runs):
                for key in rotated(SYSTEMS, i):
                    run = await measure(systems[key])
                    runs[key].append(run)
                    log(
                        f"  {key:<8} tool phase {run.phase:.3f} s (tools {run.tools:.3f} s), "
                        f"wall {run.wall:.3f} s, completed {' '.join(run.completed)}"
                    )
        finally:
            for system in opened:
                await system.close()
    load.append(("end", os.getloadavg()))
    elapsed = time.perf_counter() - began

    print(
        f"\n{CALLS} tool calls of one model answer, {NAP_S:.0f} s each; medians of {args.runs} runs"
    )
    print(text_table(*rows(runs)))
    print()
    for line in target_lines(runs):
        print(line)
    print_footer(load, elapsed, "parallel_tools.py", argv)


if __name__ == "__main__":
    run_main(main())
