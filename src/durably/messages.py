"""The conversation between a run and its model, as pydantic models.

These cross every boundary (workflow, activities, client) and are stored in
the workflow history, so they stay small and plain JSON.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self, overload

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
