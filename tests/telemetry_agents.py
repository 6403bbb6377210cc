"""The agent a `durably worker --otel` subprocess hosts in the telemetry crash test.

Importing this module sets the process's tracer provider (as an application's
`--agents` module may), exporting every span as one JSON line to the file
`DURABLY_TEST_SPANS` names, written and fsynced as the span ends: what a
worker exported before it was SIGKILLed stays on disk. `steps` calls `quick`,
then `read_once` (which hangs on its first attempt, until the test kills the
worker), then answers.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from datetime import timedelta

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from temporalio import activity

from durably import Agent, AgentRegistration, FunctionModel, ModelRequest, ToolContext, tool
from durably.messages import AssistantMessage, ToolCall
from durably.models import last_tool_results


class JsonLinesExporter(SpanExporter):
    """Each span as a JSON line: name, ids (hex), parent id, attributes."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a", encoding="utf-8") as f:
            for s in spans:
                assert s.context is not None
                line = {
                    "name": s.name,
                    "trace_id": f"{s.context.trace_id:032x}",
                    "span_id": f"{s.context.span_id:016x}",
                    "parent_id": f"{s.parent.span_id:016x}" if s.parent else None,
                    "attributes": dict(s.attributes or {}),
                }
                f.write(json.dumps(line) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return SpanExportResult.SUCCESS


_provider = TracerProvider()
_provider.add_span_processor(
    SimpleSpanProcessor(JsonLinesExporter(os.environ["DURABLY_TEST_SPANS"]))
)
trace.set_tracer_provider(_provider)


def _journal(**entry: object) -> None:
    with open(os.environ["DURABLY_TEST_JOURNAL"], "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")
        f.flush()
        os.fsync(f.fileno())


@tool
async def quick(ctx: ToolContext) -> str:
    """Return at once."""
    return "quick done"


@tool
async def read_once(ctx: ToolContext) -> str:
    """A read that hangs on its first attempt (the test kills the worker meanwhile)."""
    _journal(tool="read_once", attempt=ctx.attempt)
    if ctx.attempt == 1:
        await asyncio.Event().wait()
    return f"read on attempt {ctx.attempt}"


def _steps(request: ModelRequest) -> AssistantMessage:
    turn = 1 + sum(isinstance(m, AssistantMessage) for m in request.messages)
    _journal(model=turn, attempt=activity.info().attempt)
    if turn <= 2:
        name = "quick" if turn == 1 else "read_once"
        return AssistantMessage(tool_calls=(ToolCall(id=f"c{turn}", name=name, arguments={}),))
    return AssistantMessage(content=last_tool_results(request)[0].content)


registrations = [
    AgentRegistration(
        Agent(
            id="steps",
            model=FunctionModel(_steps, name="telemetry-tests.steps"),
            instructions="",
            tools=[quick, read_once],
        ),
        version="1",
        tool_recovery={"quick": "safe", "read_once": "safe"},
        heartbeat_timeout=timedelta(seconds=3),
    )
]
