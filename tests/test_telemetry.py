"""Telemetry (SPEC section 17): one trace per run with `gen_ai` spans, replay-safe across
a SIGKILLed worker; Prometheus metrics; runs by status from visibility."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    DurableRuntime,
    FunctionModel,
    ModelRequest,
    RunStatus,
    ToolContext,
    ToolRetry,
    tool,
)
from durably._tracing import run_root_ids
from durably.agents import Subagent
from durably.messages import AssistantMessage, ModelResponse, ToolCall, Usage
from durably.models import last_tool_results
from durably.plugin import DurablyPlugin
from durably.pricing import Price

from .conftest import Runtimes, asker, cli, eventually, free_ports, operation_id, wait_for_status
from .test_crash_recovery import ROOT, WorkerProcess


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


@tool
async def lookup(order: str, ctx: ToolContext) -> str:
    """Look an order up.

    Args:
        order: The order id.
    """
    return f"order {order} shipped"


@tool
async def note(text: str, ctx: ToolContext) -> str:
    """Note something down.

    Args:
        text: What to note.
    """
    return "noted"


def two_tools(request: ModelRequest) -> ModelResponse:
    """Calls `lookup` and `note` in one answer, then answers with their results."""
    results = last_tool_results(request)
    usage = Usage(requests=1, input_tokens=1000, output_tokens=100)
    if results:
        message = AssistantMessage(content=" | ".join(r.content for r in results))
        return ModelResponse(message=message, usage=usage)
    calls = (
        ToolCall(id="c1", name="lookup", arguments={"order": "A-1"}),
        ToolCall(id="c2", name="note", arguments={"text": "customer asked"}),
    )
    return ModelResponse(message=AssistantMessage(tool_calls=calls), usage=usage)


def clerk() -> AgentRegistration:
    agent = Agent(
        id="clerk",
        model=FunctionModel(two_tools, name="telemetry.clerk"),
        instructions="",
        tools=[lookup, note],
    )
    return AgentRegistration(
        agent,
        version="3",
        tool_recovery={"lookup": "safe", "note": "idempotent"},
        prices={"*": Price(input=10.0, output=30.0)},
    )


def of_run(exporter: InMemorySpanExporter, run_id: str) -> list[ReadableSpan]:
    return [
        s
        for s in exporter.get_finished_spans()
        if (s.attributes or {}).get("temporalWorkflowID") == run_id
        or (s.attributes or {}).get("durably.run_id") == run_id
    ]


def named(spans: list[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return sorted(
        (s for s in spans if s.name.startswith(prefix)),
        key=lambda s: str((s.attributes or {}).get("durably.operation_key")),
    )


def hex_trace(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"{span.context.trace_id:032x}"


class TestTracing:
    async def test_a_run_is_one_trace_with_a_span_per_model_request_and_tool_call(
        self,
        runtimes: Runtimes,
        client: DurableClient,
        spans: tuple[TracerProvider, InMemorySpanExporter],
    ) -> None:
        """Started by an untraced client (as the Temporal CLI would), the run gets a root
        span of its own; every span of it shares its trace id, which its snapshot names."""
        provider, exporter = spans
        await runtimes.start([clerk()], tracing=provider)
        run = await client.start_run("clerk", "where is A-1?")
        result = await run.result()
        assert result.output == "order A-1 shipped | noted"

        mine = of_run(exporter, run.run_id)
        trace_id = (await run.snapshot()).trace_id
        assert {hex_trace(s) for s in mine} == {trace_id}
        target = client.temporal.service_client.config.target_host
        shown = await cli(
            sys.executable, "-m", "durably", "runs", "show", run.run_id, "--target", target
        )
        assert re.search(rf"\btrace\s+{trace_id}", shown.stdout), shown.stdout
        roots = [s for s in mine if s.parent is None]
        assert [r.name for r in roots] == ["RunWorkflow:AgentRunWorkflow"]
        description = await client.temporal.get_workflow_handle(run.run_id).describe()
        first_run = description.raw_description.workflow_execution_info.first_run_id
        assert roots[0].context is not None
        assert (roots[0].context.trace_id, roots[0].context.span_id) == run_root_ids(
            run.run_id, first_run
        )

        chats = named(mine, "chat ")
        assert [s.name for s in chats] == ["chat telemetry.clerk"] * 2
        by_id = {s.context.span_id: s for s in mine if s.context is not None}
        for span in chats:
            attributes = dict(span.attributes or {})
            assert span.parent is not None
            assert by_id[span.parent.span_id].name == "RunActivity:durably.model_request"
            assert {k: v for k, v in attributes.items() if k != "durably.operation_key"} == {
                "gen_ai.operation.name": "chat",
                "gen_ai.system": "_OTHER",
                "gen_ai.provider.name": "_OTHER",
                "gen_ai.request.model": "telemetry.clerk",
                "gen_ai.agent.name": "clerk",
                "gen_ai.usage.input_tokens": 1000,
                "gen_ai.usage.output_tokens": 100,
                "durably.run_id": run.run_id,
                "durably.operation_id": f"{run.run_id}/{attributes['durably.operation_key']}",
                "durably.agent_id": "clerk",
                "durably.agent_version": "3",
                "durably.attempt": 1,
                "durably.model_policy": "none",
                "durably.cost_usd": pytest.approx(0.013),
                "durably.tool_calls": 2 if attributes["durably.operation_key"] == "model:1" else 0,
            }
        tools = named(mine, "execute_tool ")
        assert [s.name for s in tools] == ["execute_tool lookup", "execute_tool note"]
        for span, call_id, policy in zip(tools, ("c1", "c2"), ("safe", "idempotent"), strict=True):
            attributes = dict(span.attributes or {})
            key = f"tool:1:{call_id}"
            assert span.parent is not None
            assert by_id[span.parent.span_id].name == "RunActivity:durably.tool_call"
            assert attributes == {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": span.name.removeprefix("execute_tool "),
                "gen_ai.tool.call.id": call_id,
                "gen_ai.tool.type": "function",
                "gen_ai.agent.name": "clerk",
                "durably.run_id": run.run_id,
                "durably.operation_key": key,
                "durably.operation_id": await operation_id(client, run, key),
                "durably.agent_id": "clerk",
                "durably.agent_version": "3",
                "durably.attempt": 1,
                "durably.recovery": policy,
            }

    async def test_a_run_started_by_a_traced_client_is_in_the_callers_trace(
        self, runtimes: Runtimes, spans: tuple[TracerProvider, InMemorySpanExporter]
    ) -> None:
        provider, exporter = spans
        runtime = await runtimes.start([clerk()], tracing=provider)
        with provider.get_tracer("test").start_as_current_span("handle request") as request:
            run = await runtime.client.start_run("clerk", "where is A-1?")
        await run.result()

        trace_id = f"{request.get_span_context().trace_id:032x}"
        mine = of_run(exporter, run.run_id)
        assert {hex_trace(s) for s in mine} == {trace_id}
        assert len(named(mine, "chat ")) == 2
        assert len(named(mine, "execute_tool ")) == 2
        # A traced caller's query is the caller's own operation: a trace of its own.
        assert (await run.snapshot()).trace_id == trace_id
        queries = named(of_run(exporter, run.run_id), "HandleQuery:snapshot")
        assert len(queries) == 1 and hex_trace(queries[0]) != trace_id

    async def test_continue_as_new_and_a_subagent_stay_in_the_runs_trace(
        self,
        runtimes: Runtimes,
        client: DurableClient,
        spans: tuple[TracerProvider, InMemorySpanExporter],
    ) -> None:
        provider, exporter = spans

        def manager(request: ModelRequest) -> AssistantMessage:
            turn = 1 + sum(isinstance(m, AssistantMessage) for m in request.messages)
            if turn == 1:
                call = ToolCall(id="d", name="helper", arguments={"task": "say hi"})
            elif turn <= 3:
                call = ToolCall(id=f"n{turn}", name="note", arguments={"text": str(turn)})
            else:
                return AssistantMessage(content=last_tool_results(request)[0].content)
            return AssistantMessage(tool_calls=(call,))

        helper = Agent(
            id="helper", model=FunctionModel(lambda r: AssistantMessage(content="hi")),
            instructions="",
        )  # fmt: skip
        boss = Agent(
            id="boss", model=FunctionModel(manager, name="telemetry.boss"), instructions="",
            tools=[note], subagents=[Subagent("helper")],
        )  # fmt: skip
        await runtimes.start(
            [
                AgentRegistration(helper, version="1"),
                AgentRegistration(
                    boss, version="1", tool_recovery={"note": "safe"}, continue_as_new_events=10
                ),
            ],
            tracing=provider,
        )
        run = await client.start_run("boss", "go")
        await run.result()

        child_id = await operation_id(client, run, "tool:1:d")
        mine = of_run(exporter, run.run_id)
        child = of_run(exporter, child_id)
        assert {hex_trace(s) for s in mine + child} == {(await run.snapshot()).trace_id}
        runs = {(s.attributes or {}).get("temporalRunID") for s in mine}
        assert len(runs - {None}) >= 2, "the run continued as new"
        assert len(named(mine, "execute_tool note")) == 2
        (child_root,) = [s for s in child if s.name == "RunWorkflow:AgentRunWorkflow"]
        by_id = {s.context.span_id: s for s in mine if s.context is not None}
        assert child_root.parent is not None
        assert by_id[child_root.parent.span_id].name == "StartChildWorkflow:AgentRunWorkflow"

    async def test_a_failed_attempt_is_a_span_with_its_error_and_its_retry_another(
        self,
        runtimes: Runtimes,
        client: DurableClient,
        spans: tuple[TracerProvider, InMemorySpanExporter],
    ) -> None:
        provider, exporter = spans

        @tool
        async def flaky(ctx: ToolContext) -> str:
            """Fails on its first attempt."""
            if ctx.attempt == 1:
                raise ConnectionError("reset by peer")
            return "ok"

        def model(request: ModelRequest) -> AssistantMessage:
            if last_tool_results(request):
                return AssistantMessage(content="done")
            return AssistantMessage(tool_calls=(ToolCall(id="f", name="flaky", arguments={}),))

        agent = Agent(id="flaky", model=FunctionModel(model), instructions="", tools=[flaky])
        retry = ToolRetry(max_attempts=2, initial_delay_ms=10, max_delay_ms=10)
        registration = AgentRegistration(
            agent, version="1", tool_recovery={"flaky": "safe"}, tool_retry=retry
        )
        await runtimes.start([registration], tracing=provider)
        run = await client.start_run("flaky", "go")
        assert (await run.result()).output == "done"

        attempts = named(of_run(exporter, run.run_id), "execute_tool flaky")
        assert [(s.attributes or {}).get("durably.attempt") for s in attempts] == [1, 2]
        failed, succeeded = attempts
        assert failed.status.status_code == StatusCode.ERROR
        assert "reset by peer" in (failed.status.description or "")
        assert (failed.attributes or {}).get("error.type") == "DurablyToolCrashed"
        assert succeeded.status.status_code == StatusCode.UNSET

    async def test_durablys_plugin_traces_a_workers_runs(
        self, client: DurableClient, spans: tuple[TracerProvider, InMemorySpanExporter]
    ) -> None:
        """In the user's own `Worker`, `DurablyPlugin(..., tracing=provider)` traces too."""
        provider, exporter = spans
        plugin = DurablyPlugin([clerk()], tracing=provider)
        async with Worker(client.temporal, task_queue=client.task_queue, plugins=[plugin]):
            run = await client.start_run("clerk", "where is A-1?")
            await run.result()
            trace_id = (await run.snapshot()).trace_id
        mine = of_run(exporter, run.run_id)
        assert trace_id is not None and {hex_trace(s) for s in mine} == {trace_id}
        assert len(named(mine, "execute_tool ")) == 2

    async def test_without_tracing_a_snapshot_names_no_trace(
        self, runtimes: Runtimes, client: DurableClient
    ) -> None:
        await runtimes.start([clerk()])
        run = await client.start_run("clerk", "where is A-1?")
        await run.result()
        assert (await run.snapshot()).trace_id is None


class OtelWorker:
    """`durably worker --otel` hosting `tests.telemetry_agents`, in its own process group."""

    def __init__(self, env: WorkflowEnvironment, task_queue: str, tmp: Path) -> None:
        self.target = env.client.service_client.config.target_host
        self.task_queue = task_queue
        self.spans = tmp / "spans.jsonl"
        self.journal = tmp / "journal.jsonl"
        self.spans.touch()
        self.journal.touch()
        self.workers: list[WorkerProcess] = []

    def start(self, *options: str) -> WorkerProcess:
        environ = {
            **os.environ,
            "DURABLY_TEST_SPANS": str(self.spans),
            "DURABLY_TEST_JOURNAL": str(self.journal),
            "PYTHONPATH": str(ROOT),
        }
        worker = WorkerProcess(
            self.target,
            self.task_queue,
            environ,
            agents="tests.telemetry_agents:registrations",
            options=("--otel", *options),
        )
        self.workers.append(worker)
        return worker

    def entries(self, path: Path) -> list[dict[str, Any]]:
        return [json.loads(line) for line in path.read_text().splitlines()]

    def close(self) -> None:
        for worker in self.workers:
            if worker.proc.poll() is None:
                worker.kill()


@pytest.fixture
def otel_worker(env: WorkflowEnvironment, task_queue: str, tmp_path: Path) -> Iterator[OtelWorker]:
    worker = OtelWorker(env, task_queue, tmp_path)
    yield worker
    worker.close()


async def test_a_worker_killed_mid_run_and_restarted_never_repeats_a_committed_span(
    otel_worker: OtelWorker, client: DurableClient
) -> None:
    """SIGKILL while the run's second tool hangs, then a new worker: each operation has
    one `chat`/`execute_tool` span (the killed attempt never ended its span), and the
    new worker, replaying, emits no workflow-side span for what was committed."""
    first = otel_worker.start()
    run = await client.start_run("steps", "go")

    async def hanging() -> bool:
        return any(e.get("tool") == "read_once" for e in otel_worker.entries(otel_worker.journal))

    await eventually(hanging)
    first.kill()
    (port,) = free_ports(1)
    otel_worker.start("--metrics", f"127.0.0.1:{port}")
    assert (await asyncio.wait_for(run.result(), 60)).output == "read on attempt 2"

    spans = otel_worker.entries(otel_worker.spans)
    operations = [
        (s["attributes"]["durably.operation_id"], s["attributes"]["durably.attempt"])
        for s in spans
        if s["name"].startswith(("chat ", "execute_tool "))
    ]
    tool_2 = await operation_id(client, run, "tool:2:c2")
    assert sorted(operations) == sorted(
        [
            (f"{run.run_id}/model:1", 1),
            (await operation_id(client, run, "tool:1:c1"), 1),
            (f"{run.run_id}/model:2", 1),
            (tool_2, 2),
            (f"{run.run_id}/model:3", 1),
        ]
    )
    names = [s["name"] for s in spans]
    assert names.count("RunWorkflow:AgentRunWorkflow") == 1
    assert names.count("StartActivity:durably.tool_call") == 2
    assert names.count("StartActivity:durably.model_request") == 3
    assert len({s["trace_id"] for s in spans}) == 1
    assert (await run.snapshot()).trace_id == spans[0]["trace_id"]
    # `durably worker --metrics`: what the second worker ran, on its endpoint.
    text = await asyncio.to_thread(scrape, port)
    assert samples(text, "durably_operations_completed", kind="tool", policy="safe") == 1
    assert samples(text, "durably_operations_completed", kind="model") == 1
    assert samples(text, "durably_status_transitions", status="completed") == 1


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def samples(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        head, value = line.rsplit(" ", 1)
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


async def test_the_prometheus_endpoint_serves_durablys_counters(
    env: WorkflowEnvironment, task_queue: str
) -> None:
    (port,) = free_ports(1)
    target = env.client.service_client.config.target_host
    async with await DurableRuntime.open(
        target, task_queue=task_queue, agents=[clerk()], metrics_bind=f"127.0.0.1:{port}"
    ) as runtime:
        await runtime.resume()
        run = await runtime.client.start_run("clerk", "where is A-1?")
        await run.result()
        text = await asyncio.to_thread(scrape, port)

    queue = {"task_queue": task_queue}
    assert samples(text, "durably_operations_started", kind="model", **queue) == 2
    assert samples(text, "durably_operations_completed", kind="model", policy="none", **queue) == 2
    assert samples(text, "durably_operations_started", kind="tool", policy="safe", **queue) == 1
    assert samples(text, "durably_operations_completed", kind="tool", **queue) == 2
    assert samples(text, "durably_operations_failed", **queue) == 0
    assert samples(text, "durably_model_tokens", token_type="input", **queue) == 2000
    assert samples(text, "durably_status_transitions", status="completed", **queue) == 1
    assert "temporal_" in text  # Temporal's own worker metrics, on the same endpoint


async def test_runs_stats_counts_runs_by_status(
    env: WorkflowEnvironment, runtimes: Runtimes, client: DurableClient, task_queue: str
) -> None:
    await runtimes.start([clerk(), asker()])
    done = await client.start_run("clerk", "where is A-1?")
    await done.result()
    waiting = await client.start_run("asker", "help")
    await wait_for_status(waiting, RunStatus.WAITING)

    expected = {s: 0 for s in RunStatus} | {RunStatus.COMPLETED: 1, RunStatus.WAITING: 1}

    async def counted() -> bool:
        return await client.run_stats(task_queue=task_queue) == expected

    await eventually(counted)
    assert await client.run_stats(task_queue=task_queue, agent_id="asker") == {
        s: int(s == RunStatus.WAITING) for s in RunStatus
    }
    target = env.client.service_client.config.target_host
    shown = await cli(
        sys.executable, "-m", "durably", "runs", "stats", "--task-queue", task_queue,
        "--json", "--target", target,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == {s.value: n for s, n in expected.items()}
    table = await cli(
        sys.executable, "-m", "durably", "runs", "stats", "--task-queue", task_queue,
        "--target", target,
    )  # fmt: skip
    assert "waiting" in table.stdout and "total" in table.stdout, table.stdout
    await waiting.cancel()


def test_a_run_root_is_derived_from_its_ids_alone() -> None:
    first = f"{uuid.uuid4()}"
    assert run_root_ids("r-1", first) == run_root_ids("r-1", first)
    assert run_root_ids("r-1", first) != run_root_ids("r-2", first)
