"""Observers (SPEC section 15): fed every committed event, in order per run, at least
once across a restart; one that raises never touches the run."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    FunctionModel,
    LiveItem,
    ModelRequest,
    ToolContext,
    tool,
)
from durably.messages import AssistantMessage, ToolCall
from durably.models import last_tool_results
from durably.observers import ObserverHost, SqliteCheckpoints

from .conftest import Runtimes, eventually


class Order(BaseModel):
    order: str


@tool
async def lookup(args: Order, ctx: ToolContext) -> str:
    """Look an order up."""
    return f"order {args.order} ships"


def looker() -> AgentRegistration:
    async def model(request: ModelRequest) -> AsyncIterator[str | AssistantMessage]:
        if last_tool_results(request):
            yield "It ships."
            return
        yield AssistantMessage(
            tool_calls=(ToolCall(id="c", name="lookup", arguments={"order": "A"}),)
        )

    agent = Agent(
        id="observed",
        model=FunctionModel(model, name="observers.looker"),
        instructions="",
        tools=[lookup],
    )
    return AgentRegistration(agent, version="1", tool_recovery={"lookup": "safe"})


class Host:
    """An observer host running in the test's loop until `stop()`."""

    def __init__(self, host: ObserverHost) -> None:
        self.host = host
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(host.run(self._stop))

    async def stop(self) -> None:
        self._stop.set()
        await self._task


async def history_types(client: DurableClient, run_id: str) -> list[str]:
    history = await client.temporal.get_workflow_handle(run_id).fetch_history()
    return [str(e.event_type) for e in history.events]


async def test_an_observer_sees_every_committed_event_once_across_a_restart(
    client: DurableClient, runtimes: Runtimes, tmp_path: Path
) -> None:
    await runtimes.start([looker()])
    seen: list[tuple[str, int, str]] = []

    def record(item: LiveItem) -> None:
        seen.append((getattr(item.event, "run_id", ""), item.offset, item.event.type))

    store = tmp_path / "observers.sqlite"
    first = Host(
        ObserverHost(client, [record], checkpoints=SqliteCheckpoints(store), poll_interval=0.1)
    )
    run_a = await client.start_run("observed", "where is A")
    await run_a.result()

    async def saw_a_complete() -> bool:
        return any(r == run_a.run_id and t == "run_completed" for r, _, t in seen)

    await eventually(saw_a_complete)
    await first.stop()

    run_b = await client.start_run("observed", "where is B")
    await run_b.result()
    second = Host(
        ObserverHost(client, [record], checkpoints=SqliteCheckpoints(store), poll_interval=0.1)
    )

    async def saw_b_complete() -> bool:
        return any(r == run_b.run_id and t == "run_completed" for r, _, t in seen)

    await eventually(saw_b_complete)
    await second.stop()

    for run in (run_a, run_b):
        mine = [(o, t) for r, o, t in seen if r == run.run_id]
        assert [o for o, _ in mine] == list(range(len(mine)))  # every one, in order, once
        assert [t for _, t in mine][-1] == "run_completed"
        assert "text_delta" not in [t for _, t in mine]


async def test_an_observer_that_raises_on_every_event_changes_nothing_in_the_run(
    client: DurableClient, runtimes: Runtimes, tmp_path: Path
) -> None:
    await runtimes.start([looker()])
    calls: list[int] = []

    async def broken(item: LiveItem) -> None:
        calls.append(item.offset)
        raise RuntimeError("the audit database is down")

    twin = await client.start_run("observed", "where is A")
    await twin.result()
    host = Host(
        ObserverHost(
            client,
            [broken],
            checkpoints=SqliteCheckpoints(tmp_path / "o.sqlite"),
            poll_interval=0.1,
        )
    )
    run = await client.start_run("observed", "where is A")
    result = await run.result()

    async def all_seen() -> bool:
        return len(calls) >= 8

    await eventually(all_seen)
    await host.stop()
    assert result.output == "It ships."
    assert await history_types(client, run.run_id) == await history_types(client, twin.run_id)
    assert calls == list(range(8))  # each event once, though each one failed


async def test_durably_observe_feeds_a_module_function_until_ctrl_c(
    client: DurableClient, runtimes: Runtimes, tmp_path: Path
) -> None:
    """The `durably observe module:fn` process, as an operator runs it."""
    import json
    import os
    import signal
    import sys

    await runtimes.start([looker()])
    observed = tmp_path / "observed.jsonl"
    observed.touch()
    target = client.temporal.service_client.config.target_host
    env = {
        **os.environ,
        "DURABLY_TEST_OBSERVED": str(observed),
        "PYTHONPATH": str(Path(__file__).parent.parent),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "durably", "observe", "tests.observed_events:record",
        "--store", str(tmp_path / "o.sqlite"), "--target", target,
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stderr is not None
        started = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert b"Observing every run with record" in started  # runs from now on
        run = await client.start_run("observed", "where is A")
        await run.result()

        async def completed_seen() -> bool:
            lines = [json.loads(x) for x in observed.read_text().splitlines()]
            return any(x["run_id"] == run.run_id and x["type"] == "run_completed" for x in lines)

        await eventually(completed_seen)
        proc.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(proc.communicate(), 20)
        assert proc.returncode == 0, err.decode()
        assert b"Observer stopped." in out
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_an_observer_that_blocks_or_never_returns_never_affects_the_run(
    client: DurableClient, runtimes: Runtimes, tmp_path: Path
) -> None:
    """In a worker's process, an observer that slept in `tool_started` starved a manual
    tool's heartbeat and parked a run whose tool had done its work, and an async one
    that never returned stalled its run's feed for good, without a word."""
    blocking_started = threading.Event()

    @tool
    async def ship(args: Order, ctx: ToolContext) -> str:
        """Ship an order: done once an observer has started blocking."""
        await asyncio.to_thread(blocking_started.wait)
        return f"order {args.order} shipped"

    def model(request: ModelRequest) -> AssistantMessage:
        if last_tool_results(request):
            return AssistantMessage(content="shipped")
        return AssistantMessage(
            tool_calls=(ToolCall(id="s", name="ship", arguments={"order": "A"}),)
        )

    agent = Agent(
        id="shipper",
        model=FunctionModel(model, name="observers.shipper"),
        instructions="",
        tools=[ship],
    )

    def sleeper(item: LiveItem) -> None:
        if item.event.type == "tool_started":
            blocking_started.set()
            time.sleep(8)  # four heartbeat timeouts of the tool

    async def stuck(item: LiveItem) -> None:
        if item.event.type == "tool_started":
            await asyncio.Event().wait()

    seen: list[str] = []
    await runtimes.start(
        [AgentRegistration(agent, version="1", heartbeat_timeout=timedelta(seconds=2))],
        observers=[sleeper, stuck, lambda item: seen.append(item.event.type)],
        observer_checkpoints=SqliteCheckpoints(tmp_path / "observers.sqlite"),
        observer_timeout=1.0,
    )
    run = await client.start_run("shipper", "ship A")

    assert (await run.result()).output == "shipped"
    types = [e.type for e in (await run.snapshot()).events]
    assert "needs_attention" not in types

    async def fed_to_the_end() -> bool:
        return "run_completed" in seen

    await eventually(fed_to_the_end)
