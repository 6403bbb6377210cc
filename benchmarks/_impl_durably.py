"""The workload as a durably agent: a `FunctionModel` and one `safe` tool."""

from __future__ import annotations

from _common import INSTRUCTIONS, TOOL_NAME, page
from pydantic import BaseModel

from durably import (
    Agent,
    AgentRegistration,
    AssistantMessage,
    FunctionModel,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolContext,
    tool,
)


class FetchArgs(BaseModel):
    turn: int


@tool(name=TOOL_NAME)
async def fetch_page(args: FetchArgs, ctx: ToolContext) -> str:
    """Fetch the page for a turn (2,000 bytes)."""
    return page(args.turn)


def durably_registration(turns: int, *, prefix: str = "history-growth") -> AgentRegistration:
    """An agent that calls the tool for turns 1..`turns`, then answers."""

    def respond(request: ModelRequest) -> ModelResponse:
        done = sum(1 for m in request.messages if isinstance(m, AssistantMessage))
        if done < turns:
            turn = done + 1
            call = ToolCall(id=f"call_{turn}", name=TOOL_NAME, arguments={"turn": turn})
            return ModelResponse(message=AssistantMessage(tool_calls=(call,)))
        return ModelResponse(message=AssistantMessage(content=f"done after {done} tool turns"))

    agent = Agent(
        id=f"{prefix}-{turns}",
        model=FunctionModel(respond, name=f"{prefix}-{turns}"),
        instructions=INSTRUCTIONS,
        tools=[fetch_page],
        max_turns=turns + 1,
    )
    return AgentRegistration(agent, version="1", tool_recovery={TOOL_NAME: "safe"})
