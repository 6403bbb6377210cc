"""`AnthropicModel`: the Messages API through the official `anthropic` SDK.

Needs the `anthropic` extra (`pip install 'durably[anthropic]'`); this
module imports without it and says so when the model is built.
"""

from __future__ import annotations

import asyncio
import json
import os
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
from durably.models._base import ErrorClassifier, ModelErrorVerdict
from durably.models._provider import PERMANENT, RETRYABLE, http_verdict, import_sdk

if TYPE_CHECKING:
    from anthropic import AsyncAnthropic
    from anthropic.types import Message

__all__ = ["AnthropicModel", "anthropic_messages", "anthropic_tools", "from_anthropic_message"]

# What an assistant turn with neither text nor tool calls is sent as: the API
# rejects empty content.
_EMPTY_TURN = "(no answer)"


class AnthropicModel:
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
    """

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
    ) -> None:
        sdk = import_sdk("anthropic", extra="anthropic", user="AnthropicModel")
        if not isinstance(model, str) or not model.strip():
            raise ValueError("AnthropicModel needs a model name, e.g. 'claude-sonnet-4-5'")
        if client is not None and not isinstance(client, sdk.AsyncAnthropic):
            raise TypeError(
                f"client must be an anthropic.AsyncAnthropic, got {type(client).__name__}"
            )
        if client is not None and (base_url or api_key or timeout is not None):
            raise ValueError(
                "pass base_url, api_key and timeout either to your client or to "
                "AnthropicModel, not to both"
            )
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        if isinstance(stop_sequences, str):
            raise TypeError("stop_sequences must be a list of strings, not one string")
        if classify_error is not None and not callable(classify_error):
            raise TypeError("classify_error must be a callable taking the raised exception")
        self._model = model
        self._api_key = api_key
        self._timeout = timeout
        # A copy with retries off: Temporal owns retries.
        self._given_client: AsyncAnthropic | None = (
            client.with_options(max_retries=0) if client is not None else None
        )
        if client is not None:
            self._base_url: str | None = str(client.base_url)
        else:
            self._base_url = base_url or os.environ.get("ANTHROPIC_BASE_URL") or None
        self._settings: dict[str, Any] = {
            k: v
            for k, v in (
                ("max_tokens", max_tokens),
                ("temperature", temperature),
                ("top_p", top_p),
                ("stop_sequences", list(stop_sequences) if stop_sequences else None),
            )
            if v is not None
        }
        self._extra_body = dict(extra_body) if extra_body else None
        self._classify = classify_error
        self._clients: tuple[asyncio.AbstractEventLoop, AsyncAnthropic] | None = None

    @property
    def model(self) -> str:
        return self._model

    @property
    def identity(self) -> Mapping[str, Any]:
        """Provider, model, server and every setting given; never the key.

        Settings left unset are left out, so a later release that learns a
        new setting does not change existing fingerprints.
        """
        identity: dict[str, Any] = {"provider": "anthropic", "model": self._model}
        if self._base_url:
            identity["base_url"] = self._base_url.rstrip("/")
        identity.update(self._settings)
        if self._extra_body is not None:
            identity["extra_body"] = self._extra_body
        return identity

    def __repr__(self) -> str:
        where = f", base_url={self._base_url!r}" if self._base_url else ""
        return f"AnthropicModel({self._model!r}{where})"

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
        message: Message = await self._client().messages.create(**params)
        return from_anthropic_message(message)

    def classify_error(self, error: BaseException) -> ModelErrorVerdict:
        """Whether Temporal should retry after `error`, and when.

        The `classify_error=` given to the constructor decides if there is
        one; otherwise `default_classify_error`.
        """
        if self._classify is not None:
            return self._classify(error)
        return self.default_classify_error(error)

    @staticmethod
    def default_classify_error(error: BaseException) -> ModelErrorVerdict:
        """The built-in verdict: HTTP statuses and headers as `durably.models` documents.

        Connection errors and timeouts are retryable; other `anthropic`
        errors raised before a request is sent (missing credentials, bad
        options) are not; anything else is.
        """
        import anthropic

        if isinstance(error, anthropic.APIStatusError):
            return http_verdict(error.status_code, error.response.headers)
        retryable_types: tuple[type[BaseException], ...] = (
            anthropic.APIConnectionError,
            anthropic.APIResponseValidationError,
        )
        retryable_error = getattr(anthropic, "RetryableError", None)  # newer SDKs only
        if isinstance(retryable_error, type) and issubclass(retryable_error, BaseException):
            retryable_types += (retryable_error,)
        if isinstance(error, retryable_types):
            return RETRYABLE
        if isinstance(error, anthropic.AnthropicError):
            return PERMANENT
        return RETRYABLE

    def _client(self) -> AsyncAnthropic:
        if self._given_client is not None:
            return self._given_client
        # One client per event loop: its pooled connections belong to the loop.
        loop = asyncio.get_running_loop()
        if self._clients is None or self._clients[0] is not loop:
            from anthropic import AsyncAnthropic

            options: dict[str, Any] = {}
            if self._timeout is not None:
                options["timeout"] = self._timeout
            client = AsyncAnthropic(
                api_key=self._api_key,
                base_url=self._base_url,
                max_retries=0,
                **options,
            )
            self._clients = (loop, client)
        return self._clients[1]


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
                {"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}
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

    Other block types (thinking, server tools) are left out.
    """
    texts: list[str] = []
    calls: list[ToolCall] = []
    for block in message.content:
        if block.type == "text":
            texts.append(block.text)
        elif block.type == "tool_use":
            raw_input: object = block.input
            if isinstance(raw_input, dict):
                calls.append(ToolCall(id=block.id, name=block.name, arguments=dict(raw_input)))
            else:
                text = (
                    raw_input if isinstance(raw_input, str) else json.dumps(raw_input, default=str)
                )
                calls.append(ToolCall(id=block.id, name=block.name, raw_arguments=text))
    usage = message.usage
    input_tokens = (
        (usage.input_tokens or 0)
        + (getattr(usage, "cache_creation_input_tokens", None) or 0)
        + (getattr(usage, "cache_read_input_tokens", None) or 0)
    )
    return ModelResponse(
        message=AssistantMessage(content="".join(texts) or None, tool_calls=tuple(calls)),
        usage=Usage(requests=1, input_tokens=input_tokens, output_tokens=usage.output_tokens or 0),
    )
