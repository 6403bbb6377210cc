"""durably: durable AI agent runs on Temporal.

Each run is a Temporal workflow; each model request and tool call is an
activity with retry settings from the tool's recovery policy. A committed
result is never recomputed, and an uncertain side effect is never repeated
unless its tool says it is safe to.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from durably.agents import Agent, AgentRegistration, ModelRetry, ToolRetry
    from durably.approvals import ApprovalKeys
    from durably.client import DurableClient, RunHandle
    from durably.contract import RunResult, RunSnapshot, RunStatus, RunSummary
    from durably.errors import (
        DurableConflictError,
        DurablyError,
        InteractionConflictError,
        InvalidResponseError,
        InvalidRunInputError,
        RegistrationError,
        RunCancelledError,
        RunClosedError,
        RunFailedError,
        RunNotFoundError,
        TemporalUnavailableError,
    )
    from durably.messages import (
        AssistantMessage,
        ModelRequest,
        ModelResponse,
        ToolCall,
        ToolResultMessage,
        ToolSpec,
        Usage,
        UserMessage,
    )
    from durably.models import (
        AnthropicModel,
        FunctionModel,
        Model,
        ModelErrorVerdict,
        OpenAIChatModel,
        ScriptedModel,
    )
    from durably.plugin import DurablyPlugin
    from durably.registry import AgentRegistry
    from durably.tools import Tool, ToolContext, ToolError, question_tool, tool
    from durably.worker import DurableRuntime

# Names load on first use, so importing `durably.workflows` inside the
# workflow sandbox does not drag in the client, worker and CLI.
_EXPORTS = {
    "Agent": "durably.agents",
    "AgentRegistration": "durably.agents",
    "AgentRegistry": "durably.registry",
    "AnthropicModel": "durably.models",
    "ApprovalKeys": "durably.approvals",
    "AssistantMessage": "durably.messages",
    "DurableClient": "durably.client",
    "DurableConflictError": "durably.errors",
    "DurableRuntime": "durably.worker",
    "DurablyError": "durably.errors",
    "DurablyPlugin": "durably.plugin",
    "FunctionModel": "durably.models",
    "InteractionConflictError": "durably.errors",
    "InvalidResponseError": "durably.errors",
    "InvalidRunInputError": "durably.errors",
    "Model": "durably.models",
    "ModelRequest": "durably.messages",
    "ModelResponse": "durably.messages",
    "ModelErrorVerdict": "durably.models",
    "ModelRetry": "durably.agents",
    "OpenAIChatModel": "durably.models",
    "RegistrationError": "durably.errors",
    "RunCancelledError": "durably.errors",
    "RunClosedError": "durably.errors",
    "RunFailedError": "durably.errors",
    "RunHandle": "durably.client",
    "RunNotFoundError": "durably.errors",
    "RunResult": "durably.contract",
    "RunSnapshot": "durably.contract",
    "RunStatus": "durably.contract",
    "RunSummary": "durably.contract",
    "ScriptedModel": "durably.models",
    "TemporalUnavailableError": "durably.errors",
    "Tool": "durably.tools",
    "ToolCall": "durably.messages",
    "ToolContext": "durably.tools",
    "ToolError": "durably.tools",
    "ToolResultMessage": "durably.messages",
    "ToolRetry": "durably.agents",
    "ToolSpec": "durably.messages",
    "Usage": "durably.messages",
    "UserMessage": "durably.messages",
    "question_tool": "durably.tools",
    "tool": "durably.tools",
}

__all__ = [
    "Agent",
    "AgentRegistration",
    "AgentRegistry",
    "AnthropicModel",
    "ApprovalKeys",
    "AssistantMessage",
    "DurableClient",
    "DurableConflictError",
    "DurableRuntime",
    "DurablyError",
    "DurablyPlugin",
    "FunctionModel",
    "InteractionConflictError",
    "InvalidResponseError",
    "InvalidRunInputError",
    "Model",
    "ModelErrorVerdict",
    "ModelRequest",
    "ModelResponse",
    "ModelRetry",
    "OpenAIChatModel",
    "RegistrationError",
    "RunCancelledError",
    "RunClosedError",
    "RunFailedError",
    "RunHandle",
    "RunNotFoundError",
    "RunResult",
    "RunSnapshot",
    "RunStatus",
    "RunSummary",
    "ScriptedModel",
    "TemporalUnavailableError",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "ToolResultMessage",
    "ToolRetry",
    "ToolSpec",
    "Usage",
    "UserMessage",
    "question_tool",
    "tool",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'durably' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
