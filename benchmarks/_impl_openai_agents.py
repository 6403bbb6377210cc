"""The workload on Temporal's OpenAI Agents integration (`temporalio.openai_agents`).

An `agents.Agent` run by `Runner.run` inside a workflow; the worker's
`OpenAIAgentsPlugin` turns each model request into its model activity, and
the tool is an activity made into a tool by `activity_as_tool`. The model is
a fake `Model` (from a `ModelProvider` given to the plugin) that answers from
the transcript it is sent: a tool call while fewer than N tool results are in
it, then a final answer. Tracing is off (no OpenAI key to export to).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from datetime import timedelta
from typing import Any

from _common import INSTRUCTIONS, TOOL_NAME, page, prompt, turns_in
from temporalio import activity, workflow

with workflow.unsafe.imports_passed_through():
    from agents import (
        Agent,
        AgentOutputSchemaBase,
        Handoff,
        Model,
        ModelProvider,
        ModelResponse,
        ModelSettings,
        ModelTracing,
        RunConfig,
        Runner,
        Tool,
        TResponseInputItem,
        Usage,
    )
    from agents.items import TResponseStreamEvent
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )
    from temporalio.openai_agents import ModelActivityParameters, OpenAIAgentsPlugin
    from temporalio.openai_agents.workflow import activity_as_tool

MODEL_NAME = "benchmark-fake"
TOOL_ACTIVITY = "openai_agents.fetch_page"


@activity.defn(name=TOOL_ACTIVITY)
async def fetch_page(turn: int) -> str:
    """Fetch the page for a turn (2,000 bytes)."""
    return page(turn)


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


class FakeModel(Model):
    """Zero latency: N tool calls, then an answer, decided from the transcript alone."""

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        **kwargs: Any,
    ) -> ModelResponse:
        items: list[Any] = [{"role": "user", "content": input}] if isinstance(input, str) else input
        first = next(str(_field(i, "content")) for i in items if _field(i, "role") == "user")
        turns = turns_in(first)
        done = sum(1 for i in items if _field(i, "type") == "function_call_output")
        output: Any
        if done < turns:
            turn = done + 1
            output = ResponseFunctionToolCall(
                arguments=json.dumps({"turn": turn}),
                call_id=f"call_{turn}",
                name=TOOL_NAME,
                type="function_call",
                id=f"fc_{turn}",
                status="completed",
            )
        else:
            text = ResponseOutputText(
                text=f"done after {done} tool turns", annotations=[], type="output_text"
            )
            output = ResponseOutputMessage(
                id=f"msg_{done}",
                content=[text],
                role="assistant",
                status="completed",
                type="message",
            )
        return ModelResponse(output=[output], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("the benchmark does not stream")


class FakeModelProvider(ModelProvider):
    def get_model(self, model_name: str | None) -> Model:
        return FakeModel()


def plugin() -> OpenAIAgentsPlugin:
    """The integration's plugin with the fake model (for a client or a worker)."""
    return OpenAIAgentsPlugin(
        model_params=ModelActivityParameters(start_to_close_timeout=timedelta(minutes=5)),
        model_provider=FakeModelProvider(),
    )


@workflow.defn(name="BenchmarkOpenAIAgents")
class OpenAIAgentsWorkflow:
    @workflow.run
    async def run(self, turns: int) -> str:
        agent: Agent[None] = Agent(
            name="benchmark",
            instructions=INSTRUCTIONS,
            model=MODEL_NAME,
            tools=[activity_as_tool(fetch_page, start_to_close_timeout=timedelta(minutes=10))],
        )
        result = await Runner.run(
            agent,
            prompt(turns),
            max_turns=turns + 2,
            run_config=RunConfig(tracing_disabled=True),
        )
        return str(result.final_output)
