"""The workload on pydantic-ai's Temporal durability (`pydantic_ai.durable_exec.temporal`).

A pydantic-ai `Agent` with the `TemporalDurability` capability, run by
`agent.run` inside a `PydanticAIWorkflow`; the `PydanticAIPlugin` on the
client registers its model and tool activities on the worker. The model is a
`FunctionModel` answering from the messages it is sent: a tool call while
fewer than N tool results are in them, then a final answer. The default
request limit (50) is lifted; continue-as-new is left off (the default).
"""

from __future__ import annotations

from datetime import timedelta

from _common import INSTRUCTIONS, TOOL_NAME, page, prompt, turns_in
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic_ai import Agent
    from pydantic_ai.durable_exec.temporal import (
        PydanticAIPlugin,
        PydanticAIWorkflow,
        TemporalDurability,
    )
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.usage import UsageLimits
    from temporalio.workflow import ActivityConfig

__all__ = ["PydanticAIPlugin", "PydanticAIWorkflowImpl"]


async def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Zero latency: N tool calls, then an answer, decided from the messages alone."""
    requests = [m for m in messages if isinstance(m, ModelRequest)]
    first = next(str(p.content) for m in requests for p in m.parts if isinstance(p, UserPromptPart))
    turns = turns_in(first)
    done = sum(1 for m in requests for p in m.parts if isinstance(p, ToolReturnPart))
    if done < turns:
        turn = done + 1
        call = ToolCallPart(tool_name=TOOL_NAME, args={"turn": turn}, tool_call_id=f"call_{turn}")
        return ModelResponse(parts=[call])
    return ModelResponse(parts=[TextPart(f"done after {done} tool turns")])


agent: Agent[None, str] = Agent(
    FunctionModel(respond, model_name="benchmark-function"),
    name="benchmark",
    instructions=INSTRUCTIONS,
    capabilities=[
        TemporalDurability(
            activity_config=ActivityConfig(start_to_close_timeout=timedelta(minutes=10)),
            model_activity_config=ActivityConfig(start_to_close_timeout=timedelta(minutes=5)),
        )
    ],
)


@agent.tool_plain(name=TOOL_NAME)
async def fetch_page(turn: int) -> str:
    """Fetch the page for a turn (2,000 bytes)."""
    return page(turn)


@workflow.defn(name="BenchmarkPydanticAI")
class PydanticAIWorkflowImpl(PydanticAIWorkflow):
    __pydantic_ai_agents__ = (agent,)

    @workflow.run
    async def run(self, turns: int) -> str:
        result = await agent.run(prompt(turns), usage_limits=UsageLimits(request_limit=None))
        return result.output
