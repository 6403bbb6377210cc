"""`AnthropicModel`: the Messages API through the official `anthropic` SDK.

Needs the `anthropic` extra (`pip install 'durably[anthropic]'`); this
module imports without it and says so when the model is built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from durably.messages import (
    AssistantMessage,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolResultMessage,
    ToolSpec,
    Usage,
)
from durably.models._base import ErrorClassifier
from durably.models._live_text import emit_text
from durably.models._provider import ProviderModel, empty_answer, given, tool_arguments

if TYPE_CHECKING:
    from anthropic import AsyncAnthropic
    from anthropic.types import Message
    from anthropic.types import Usage as AnthropicUsage

__all__ = ["AnthropicModel", "anthropic_messages", "anthropic_tools", "from_anthropic_message"]

# What an assistant turn with neither text nor tool calls is sent as: the API
# rejects empty content.
_EMPTY_TURN = "(no answer)"


class AnthropicModel(ProviderModel["AsyncAnthropic"]):
    """A Claude model behind the Anthropic Messages API, with tool use.

    Example::

        AnthropicModel("claude-sonnet-4-5", max_tokens=2048, temperature=0)

    The key comes from `api_key`, else the SDK reads `ANTHROPIC_API_KEY`;
    the server from `base_url`, else `ANTHROPIC_BASE_URL`. The client never
    retries on its own (`max_retries=0`): Temporal retries under the
    registration's `ModelRetry`, and `classify_error` tells it which errors
    are worth it and how long a `Retry-After` asks to wait. Pass
    `classify_error=` to judge errors your own way.

    `max_tokens` is required by the API (4096 unless given). `extra_body` is
    merged into every request. A ready `client` (an
    `anthropic.AsyncAnthropic`) may replace `base_url`/`api_key`/`timeout`;
    durably uses a copy with retries off.

    The answer is streamed (`stream=False` turns it off), so a run's live
    followers read it as it is written; the committed answer is the same.

    .. versionchanged:: Unreleased
       Answers stream; the `stream` keyword.
    """

    _provider = "anthropic"
    _client_class = "AsyncAnthropic"
    _base_url_env = "ANTHROPIC_BASE_URL"
    _example_model = "claude-sonnet-4-5"

    def __init__(
        self,
        model: str,
        *,
        max_tokens: int = 4096,
        base_url: str | None = None,
        api_key: str | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop_sequences: Sequence[str] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        client: AsyncAnthropic | None = None,
        classify_error: ErrorClassifier | None = None,
        stream: bool = True,
    ) -> None:
        super().__init__(
            model,
            base_url=base_url,
            api_key=api_key,
            timeout=timeout,
            client=client,
            extra_body=extra_body,
            classify_error=classify_error,
            stream=stream,
        )
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        if isinstance(stop_sequences, str):
            raise TypeError("stop_sequences must be a list of strings, not one string")
        self._settings = given(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            stop_sequences=list(stop_sequences) if stop_sequences else None,
        )

    async def request(self, request: ModelRequest) -> ModelResponse:
        params: dict[str, Any] = {
            "model": self._model,
            "messages": anthropic_messages(request),
            **self._settings,
        }
        if request.instructions:
            params["system"] = request.instructions
        if request.tools:
            params["tools"] = anthropic_tools(request.tools)
        if self._extra_body is not None:
            params["extra_body"] = self._extra_body
        client = self._client()
        if not self._stream:
            message: Message = await client.messages.create(**params)
            return from_anthropic_message(message)
        async with client.messages.stream(**params) as stream:
            async for text in stream.text_stream:
                emit_text(text)
            message = await stream.get_final_message()
        return from_anthropic_message(message)


def anthropic_messages(request: ModelRequest) -> list[dict[str, Any]]:
    """The transcript as Messages API turns (the instructions go in `system`).

    Consecutive user-side messages share one turn, so the results of several
    tool calls answer their `tool_use` blocks together; an error result is a
    `tool_result` block with `is_error: true`.
    """
    turns: list[dict[str, Any]] = []

    def add(role: str, block: dict[str, Any]) -> None:
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].append(block)
        else:
            turns.append({"role": role, "content": [block]})

    for m in request.messages:
        if isinstance(m, AssistantMessage):
            blocks: list[dict[str, Any]] = []
            if m.content:
                blocks.append({"type": "text", "text": m.content})
            blocks.extend(
                {"type": "tool_use", "id": c.call_id, "name": c.name, "input": c.arguments}
                for c in m.tool_calls
            )
            for block in blocks or [{"type": "text", "text": _EMPTY_TURN}]:
                add("assistant", block)
        elif isinstance(m, ToolResultMessage):
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": m.call_id,
                "content": m.content,
            }
            if m.is_error:
                result["is_error"] = True
            add("user", result)
        else:
            add("user", {"type": "text", "text": m.content})
    return turns


def anthropic_tools(tools: tuple[ToolSpec, ...]) -> list[dict[str, Any]]:
    """Tool specs as Messages API tools."""
    return [
        {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools
    ]


def from_anthropic_message(message: Message) -> ModelResponse:
    """A Messages API answer as durably's: its text, its `tool_use` blocks, its usage.

    Other block types (thinking, server tools) are left out. An answer that
    cannot be read (a `tool_use` input that is not a JSON object, or neither
    text nor tool use, e.g. an empty content list) raises
    `ModelResponseError`: it is retried under `model_retry` like any error
    of the request, and fails the run without it.
    """
    texts: list[str] = []
    calls: list[ToolCall] = []
    for block in message.content:
        if block.type == "text":
            texts.append(block.text)
        elif block.type == "tool_use":
            raw_input: object = block.input
            arguments = tool_arguments(raw_input, call_id=block.id, tool=block.name)
            calls.append(ToolCall(id=block.id, name=block.name, arguments=arguments))
    content = "".join(texts) or None
    if not calls and not (content and content.strip()):
        kinds = ", ".join(block.type for block in message.content) or "none"
        raise empty_answer(
            f"the message {message.id!r} (stop_reason {message.stop_reason!r}; "
            f"content blocks: {kinds})"
        )
    return ModelResponse(
        message=AssistantMessage(content=content, tool_calls=tuple(calls)),
        usage=_usage(message.usage),
    )


def _usage(usage: AnthropicUsage) -> Usage:
    """One request's usage. Streamed, the SDK builds it from `message_start`'s usage,
    overwritten by the cumulative counts in `message_delta`'s.

    The API's `input_tokens` leaves out the tokens written to and read from the prompt
    cache: durably's input counts all three, and the cache reads are its cached part.
    Thinking is counted in `output_tokens`; only newer API versions break it out
    (`output_tokens_details.thinking_tokens`), and without that `reasoning_tokens`
    stays 0. Fields an older SDK does not know are read with `getattr`.
    """
    cache_read = getattr(usage, "cache_read_input_tokens", None) or 0
    cache_write = getattr(usage, "cache_creation_input_tokens", None) or 0
    details = getattr(usage, "output_tokens_details", None)
    return Usage(
        requests=1,
        input_tokens=(usage.input_tokens or 0) + cache_write + cache_read,
        output_tokens=usage.output_tokens or 0,
        cached_input_tokens=cache_read,
        reasoning_tokens=getattr(details, "thinking_tokens", None) or 0,
    )
