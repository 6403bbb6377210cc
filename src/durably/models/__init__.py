"""Models: the protocol, and the function/scripted models for tests and demos.

Provider adapters (OpenAI-compatible, Anthropic) live beside these and need
the `openai` / `anthropic` extras.
"""

from durably.models._base import Model
from durably.models._function import (
    FunctionModel,
    ScriptedModel,
    Step,
    final,
    last_tool_results,
    tool_call,
)

__all__ = [
    "FunctionModel",
    "Model",
    "ScriptedModel",
    "Step",
    "final",
    "last_tool_results",
    "tool_call",
]
