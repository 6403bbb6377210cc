"""Models: the protocol, and the function/scripted models for tests and demos.

Provider adapters (OpenAI-compatible, Anthropic) live beside these and need
the `openai` / `anthropic` extras.
"""

from durably.models._base import (
    ErrorClassifier,
    Model,
    ModelErrorVerdict,
    classify_model_error,
)
from durably.models._function import (
    FunctionModel,
    ScriptedModel,
    Step,
    final,
    last_tool_results,
    tool_call,
)

__all__ = [
    "ErrorClassifier",
    "FunctionModel",
    "Model",
    "ModelErrorVerdict",
    "ScriptedModel",
    "Step",
    "classify_model_error",
    "final",
    "last_tool_results",
    "tool_call",
]
