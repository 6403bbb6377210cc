"""Models: the protocol, provider adapters, and function/scripted models.

- `OpenAIChatModel` (any OpenAI-compatible Chat Completions server) and
  `AnthropicModel` (the Messages API) need the `openai` / `anthropic` extras;
  they load on first use, so importing durably never needs either SDK.
- `FunctionModel` and `ScriptedModel` answer from plain Python, for tests and
  the offline demo.

Provider errors become a `ModelErrorVerdict` for Temporal's retries. Under
`model_retry` every error of a completion attempt is retried, a 400 or a
validation error included (the seed retries permanent errors too): an
answer an adapter cannot read (a tool call whose arguments are not a JSON
object, an empty completion) raises `ModelResponseError` and is retried the
same way. `retry-after-ms` or `Retry-After` (seconds or an HTTP date) sets
the next retry delay. Each adapter takes `classify_error=` to stop retrying
errors you know are hopeless; without `model_retry` no error is retried.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from durably.models._base import (
    ErrorClassifier,
    Model,
    ModelErrorVerdict,
    ModelResponseError,
    classify_model_error,
)
from durably.models._function import (
    FunctionModel,
    ScriptedModel,
    Step,
    final,
    last_tool_results,
    since_last_user_message,
    tool_call,
)
from durably.models._live_text import emit_text

if TYPE_CHECKING:
    from durably.models._anthropic import AnthropicModel
    from durably.models._openai import OpenAIChatModel

__all__ = [
    "AnthropicModel",
    "ErrorClassifier",
    "FunctionModel",
    "Model",
    "ModelErrorVerdict",
    "ModelResponseError",
    "OpenAIChatModel",
    "ScriptedModel",
    "Step",
    "classify_model_error",
    "emit_text",
    "final",
    "last_tool_results",
    "since_last_user_message",
    "tool_call",
]

# Provider adapters load on first use (they stay out of the workflow sandbox).
_PROVIDERS = {
    "AnthropicModel": "durably.models._anthropic",
    "OpenAIChatModel": "durably.models._openai",
}


def __getattr__(name: str) -> Any:
    module = _PROVIDERS.get(name)
    if module is None:
        raise AttributeError(f"module 'durably.models' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
