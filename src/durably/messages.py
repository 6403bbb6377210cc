"""The conversation between a run and its model, as pydantic models.

These cross every boundary (workflow, activities, client) and are stored in
the workflow history, so they stay small and plain JSON.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self, overload

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

__all__ = [
    "USAGE_ADDED",
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

    `call_id` is the id the model gave the call; the result it gets back
    names it too (`ToolResultMessage.call_id`). In JSON the field is `"id"`,
    as every recorded history and transcript holds it, and `ToolCall(id=...)`
    builds one as well as `ToolCall(call_id=...)`.

    `arguments` is the decoded JSON object; when the model produced text that
    is not a JSON object, `arguments` is empty and `raw_arguments` keeps the
    text so the error the model gets back can show it.

    .. versionchanged:: Unreleased
       The attribute is `call_id`; `id` still reads it, deprecated.
    """

    # The wire name stays "id": these travel in activity inputs and results and
    # feed the transcript digest, so every serialization must write it unchanged.
    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        validate_by_alias=True,
        validate_by_name=True,
        serialize_by_alias=True,
    )

    call_id: str = Field(alias="id")
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    raw_arguments: str | None = None

    if TYPE_CHECKING:  # both keywords build one (pydantic's mypy plugin would offer one)

        @overload
        def __init__(
            self,
            *,
            call_id: str,
            name: str,
            arguments: dict[str, Any] = ...,
            raw_arguments: str | None = ...,
        ) -> None: ...
        @overload
        def __init__(
            self,
            *,
            id: str,
            name: str,
            arguments: dict[str, Any] = ...,
            raw_arguments: str | None = ...,
        ) -> None: ...
        def __init__(self, **data: Any) -> None: ...

    @property
    def id(self) -> str:
        """Deprecated: the same value as `call_id`; read that instead."""
        warnings.warn(
            "ToolCall.id is deprecated and will be removed; read ToolCall.call_id",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.call_id

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with `update` applied; `update={"id": ...}` still sets `call_id` (deprecated)."""
        if update is not None and "id" in update:
            warnings.warn(
                "ToolCall.model_copy(update={'id': ...}) is deprecated; update 'call_id'",
                DeprecationWarning,
                stacklevel=2,
            )
            update = {("call_id" if k == "id" else k): v for k, v in update.items()}
        return super().model_copy(update=update, deep=deep)


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
    """What a run (or one operation) used: model requests and their tokens, tool calls,
    and the cost the registration's prices give them.

    `cached_input_tokens` are the part of `input_tokens` the provider served
    from its prompt cache, `reasoning_tokens` the part of `output_tokens`
    spent reasoning (each only where the provider reports it). `requests`
    counts every attempt the run saw, failed ones too; `tool_calls` every
    tool activity the run scheduled. Fields at zero stay out of the JSON:
    usage is stored in history with every model answer.
    """

    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0
    tool_calls: int = 0
    cost_usd: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            requests=self.requests + other.requests,
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cached_input_tokens=self.cached_input_tokens + other.cached_input_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
            tool_calls=self.tool_calls + other.tool_calls,
            cost_usd=round(self.cost_usd + other.cost_usd, 9),
        )

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @model_serializer(mode="wrap")
    def _lean(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for key in USAGE_ADDED:
            if not data.get(key):
                data.pop(key, None)
        return data


# Usage fields added after 0.1.0: left out of the JSON at zero (history stays as it was),
# and carried apart from the others in `RunState` (see `RunState._old_usage`).
USAGE_ADDED = ("cached_input_tokens", "reasoning_tokens", "tool_calls", "cost_usd")


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
