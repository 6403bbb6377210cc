"""The conversation between a run and its model, as pydantic models.

These cross every boundary (workflow, activities, client) and are stored in
the workflow history, so they stay small and plain JSON.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "AssistantMessage",
    "Message",
    "ModelRequest",
    "ModelResponse",
    "ToolCall",
    "ToolResultMessage",
    "ToolSpec",
    "Usage",
    "UserMessage",
]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class UserMessage(_Frozen):
    """What the person (or the run's input) said."""

    role: Literal["user"] = "user"
    content: str


class ToolCall(_Frozen):
    """One tool call the model asked for.

    `arguments` is the decoded JSON object; when the model produced text that
    is not a JSON object, `arguments` is empty and `raw_arguments` keeps the
    text so the error the model gets back can show it.
    """

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    raw_arguments: str | None = None


class AssistantMessage(_Frozen):
    """What the model answered: text, tool calls, or both."""

    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()


class ToolResultMessage(_Frozen):
    """A tool's result (or error) for one call, as the model will read it."""

    role: Literal["tool"] = "tool"
    call_id: str
    tool: str
    content: str
    is_error: bool = False


Message = Annotated[UserMessage | AssistantMessage | ToolResultMessage, Field(discriminator="role")]


class Usage(_Frozen):
    """Token usage, summed over a run's model requests."""

    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            requests=self.requests + other.requests,
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
        )

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


class ToolSpec(_Frozen):
    """A tool as the model sees it: a name, a description, a JSON schema."""

    name: str
    description: str
    parameters: dict[str, Any]


class ModelRequest(_Frozen):
    """Everything a model needs for one request."""

    instructions: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()


class ModelResponse(_Frozen):
    """One model answer with the usage it cost.

    `usage.requests` defaults to 1: one response is one request.
    """

    message: AssistantMessage
    usage: Usage = Field(default_factory=lambda: Usage(requests=1))
