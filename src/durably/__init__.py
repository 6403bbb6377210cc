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
    from durably.agents import Agent, AgentRegistration, ModelRetry, Subagent, ToolRetry
    from durably.approvals import ApprovalKeys
    from durably.client import DurableClient, NeededVersion, RunHandle, SessionHandle
    from durably.contract import (
        Answer,
        Approval,
        Denial,
        ErrorResolution,
        Interaction,
        JsonResolution,
        LiveEvent,
        LiveItem,
        OtherAttention,
        RerunResolution,
        RunAttention,
        RunResult,
        RunSnapshot,
        RunStatus,
        RunSummary,
        SessionLiveEvent,
        SessionSnapshot,
        SessionSummary,
        ToolInterrupted,
        VersionIncompatible,
        VersionMissing,
    )
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
        VersionDriftError,
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
        final,
        tool_call,
    )
    from durably.plugin import DurablyPlugin
    from durably.registry import AgentRegistry
    from durably.tasks import TaskRegistration, task
    from durably.tools import Tool, ToolContext, ToolError, question_tool, tool
    from durably.worker import DurableRuntime

# Names load on first use, so importing `durably.workflows` inside the
# workflow sandbox does not drag in the client, worker and CLI.
_EXPORTS = {
    "Agent": "durably.agents",
    "AgentRegistration": "durably.agents",
    "AgentRegistry": "durably.registry",
    "Answer": "durably.contract",
    "AnthropicModel": "durably.models",
    "Approval": "durably.contract",
    "ApprovalKeys": "durably.approvals",
    "AssistantMessage": "durably.messages",
    "Denial": "durably.contract",
    "DurableClient": "durably.client",
    "DurableConflictError": "durably.errors",
    "DurableRuntime": "durably.worker",
    "DurablyError": "durably.errors",
    "DurablyPlugin": "durably.plugin",
    "ErrorResolution": "durably.contract",
    "FunctionModel": "durably.models",
    "Interaction": "durably.contract",
    "InteractionConflictError": "durably.errors",
    "InvalidResponseError": "durably.errors",
    "InvalidRunInputError": "durably.errors",
    "JsonResolution": "durably.contract",
    "LiveEvent": "durably.contract",
    "LiveItem": "durably.contract",
    "SessionLiveEvent": "durably.contract",
    "Subagent": "durably.agents",
    "TaskRegistration": "durably.tasks",
    "task": "durably.tasks",
    "Model": "durably.models",
    "ModelErrorVerdict": "durably.models",
    "ModelRequest": "durably.messages",
    "ModelResponse": "durably.messages",
    "ModelRetry": "durably.agents",
    "NeededVersion": "durably.client",
    "OpenAIChatModel": "durably.models",
    "OtherAttention": "durably.contract",
    "RegistrationError": "durably.errors",
    "RerunResolution": "durably.contract",
    "RunAttention": "durably.contract",
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
    "SessionHandle": "durably.client",
    "SessionSnapshot": "durably.contract",
    "SessionSummary": "durably.contract",
    "TemporalUnavailableError": "durably.errors",
    "Tool": "durably.tools",
    "ToolCall": "durably.messages",
    "ToolContext": "durably.tools",
    "ToolError": "durably.tools",
    "ToolInterrupted": "durably.contract",
    "ToolResultMessage": "durably.messages",
    "ToolRetry": "durably.agents",
    "ToolSpec": "durably.messages",
    "Usage": "durably.messages",
    "UserMessage": "durably.messages",
    "VersionDriftError": "durably.errors",
    "VersionIncompatible": "durably.contract",
    "VersionMissing": "durably.contract",
    "final": "durably.models",
    "question_tool": "durably.tools",
    "tool": "durably.tools",
    "tool_call": "durably.models",
}

__all__ = [
    "Agent",
    "AgentRegistration",
    "AgentRegistry",
    "Answer",
    "AnthropicModel",
    "Approval",
    "ApprovalKeys",
    "AssistantMessage",
    "Denial",
    "DurableClient",
    "DurableConflictError",
    "DurableRuntime",
    "DurablyError",
    "DurablyPlugin",
    "ErrorResolution",
    "FunctionModel",
    "Interaction",
    "InteractionConflictError",
    "InvalidResponseError",
    "InvalidRunInputError",
    "JsonResolution",
    "LiveEvent",
    "LiveItem",
    "Model",
    "ModelErrorVerdict",
    "ModelRequest",
    "ModelResponse",
    "ModelRetry",
    "NeededVersion",
    "OpenAIChatModel",
    "OtherAttention",
    "RegistrationError",
    "RerunResolution",
    "RunAttention",
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
    "SessionHandle",
    "SessionLiveEvent",
    "SessionSnapshot",
    "SessionSummary",
    "Subagent",
    "TaskRegistration",
    "TemporalUnavailableError",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "ToolInterrupted",
    "ToolResultMessage",
    "ToolRetry",
    "ToolSpec",
    "Usage",
    "UserMessage",
    "VersionDriftError",
    "VersionIncompatible",
    "VersionMissing",
    "final",
    "question_tool",
    "task",
    "tool",
    "tool_call",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'durably' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
