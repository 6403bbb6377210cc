"""`OpenAIChatModel`: Chat Completions through the official `openai` SDK.

Any server that speaks the OpenAI Chat Completions API works through
`base_url`: OpenAI itself, Ollama, vLLM, LM Studio, OpenRouter. Needs the
`openai` extra (`pip install 'durably[openai]'`); this module imports
without it and says so when the model is built.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from durably.messages import (
    AssistantMessage,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolResultMessage,
    ToolSpec,
    Usage,
)
from durably.models._base import ErrorClassifier, ModelResponseError
from durably.models._live_text import emit_text
from durably.models._provider import ProviderModel, empty_answer, given, tool_arguments

if TYPE_CHECKING:
    from openai import AsyncOpenAI
    from openai.types import CompletionUsage
    from openai.types.chat import ChatCompletion

__all__ = [
    "OpenAIChatModel",
    "from_openai_completion",
    "openai_messages",
    "openai_tools",
]

# Prefixed to an error result's content: Chat Completions has no error flag.
ERROR_PREFIX = "Error: "


class OpenAIChatModel(ProviderModel["AsyncOpenAI"]):
    """A model behind an OpenAI-compatible Chat Completions API, with tool calling.

    Example::

        OpenAIChatModel("gpt-4o-mini", temperature=0)
        OpenAIChatModel("llama3.1", base_url="http://localhost:11434/v1", api_key="ollama")

    The key comes from `api_key`, else the SDK reads `OPENAI_API_KEY`; the
    server from `base_url`, else `OPENAI_BASE_URL`, else OpenAI. The client
    never retries on its own (`max_retries=0`): Temporal retries under the
    registration's `ModelRetry`, and `classify_error` tells it which errors
    are worth it and how long a `Retry-After` asks to wait. Pass
    `classify_error=` to judge errors your own way.

    `output_schema` (a pydantic model or a JSON schema) asks for a final
    answer that is JSON of that shape (`response_format` `json_schema`).
    `extra_body` is merged into every request, for server-specific settings.
    `max_tokens` is sent as `max_tokens`, which compatible servers expect;
    OpenAI's reasoning models want `extra_body={"max_completion_tokens": n}`.
    A ready `client` (an `openai.AsyncOpenAI`, e.g. for Azure) may replace
    `base_url`/`api_key`/`timeout`; durably uses a copy with retries off.

    The answer is streamed (`stream=False` turns it off), so a run's live
    followers read it as it is written; the committed answer is the same.

    .. versionchanged:: Unreleased
       Answers stream; the `stream` keyword.
    """

    _provider = "openai"
    _client_class = "AsyncOpenAI"
    _base_url_env = "OPENAI_BASE_URL"
    _example_model = "gpt-4o-mini"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        output_schema: type[BaseModel] | Mapping[str, Any] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        client: AsyncOpenAI | None = None,
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
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        self._settings = given(
            temperature=temperature,
            max_tokens=max_tokens,
            top_p=top_p,
            seed=seed,
            response_format=_response_format(output_schema) if output_schema else None,
        )

    async def request(self, request: ModelRequest) -> ModelResponse:
        params: dict[str, Any] = {
            "model": self._model,
            "messages": openai_messages(request),
            **self._settings,
        }
        if request.tools:
            params["tools"] = openai_tools(request.tools)
        if self._extra_body is not None:
            params["extra_body"] = self._extra_body
        client = self._client()
        if not self._stream:
            completion: ChatCompletion = await client.chat.completions.create(**params)
            return from_openai_completion(completion)
        params["stream_options"] = {"include_usage": True}
        async with client.chat.completions.stream(**params) as stream:
            async for event in stream:
                if event.type == "content.delta":
                    emit_text(event.delta)
            completion = await stream.get_final_completion()
        return from_openai_completion(completion)


def openai_messages(request: ModelRequest) -> list[dict[str, Any]]:
    """The request's instructions and transcript as Chat Completions messages.

    An error result's content starts with `Error: `, since a `tool` message
    has no error flag. A call whose arguments were not a JSON object (in a
    transcript from an earlier release, or built by your own model) is sent
    back with `{}`: several compatible servers reject a tool call whose
    arguments do not parse, and the error result quotes the text.
    """
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    for m in request.messages:
        if isinstance(m, AssistantMessage):
            out: dict[str, Any] = {"role": "assistant", "content": m.content}
            if m.tool_calls:
                out["tool_calls"] = [
                    {
                        "id": c.call_id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                    }
                    for c in m.tool_calls
                ]
            elif m.content is None:
                out["content"] = ""
            messages.append(out)
        elif isinstance(m, ToolResultMessage):
            content = f"{ERROR_PREFIX}{m.content}" if m.is_error else m.content
            messages.append({"role": "tool", "tool_call_id": m.call_id, "content": content})
        else:
            messages.append({"role": "user", "content": m.content})
    return messages


def openai_tools(tools: tuple[ToolSpec, ...]) -> list[dict[str, Any]]:
    """Tool specs as Chat Completions `function` tools."""
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters,
            },
        }
        for t in tools
    ]


def from_openai_completion(completion: ChatCompletion) -> ModelResponse:
    """The first choice of a chat completion as durably's answer, with its usage.

    An answer that cannot be read (no choices, a tool call whose arguments
    are not a JSON object, neither text nor tool calls) raises
    `ModelResponseError`: it is retried under `model_retry` like any error
    of the request, and fails the run without it.
    """
    if not completion.choices:
        raise ModelResponseError(
            f"the model's answer is empty: the chat completion {completion.id!r} has no choices"
        )
    choice = completion.choices[0]
    message = choice.message
    calls: list[ToolCall] = []
    for tc in message.tool_calls or ():
        function = getattr(tc, "function", None)
        if function is not None:
            name, text = function.name, function.arguments
        else:  # a non-function ("custom") tool call: its input is free text
            custom = getattr(tc, "custom", None)
            name, text = getattr(custom, "name", "?"), getattr(custom, "input", None)
            text = text if text is not None else ""
        arguments = tool_arguments(text, call_id=tc.id, tool=name)
        calls.append(ToolCall(id=tc.id, name=name, arguments=arguments))
    content = message.content if message.content is not None else message.refusal
    if not calls and not (content and content.strip()):
        raise empty_answer(
            f"the chat completion {completion.id!r} (finish_reason {choice.finish_reason!r})"
        )
    return ModelResponse(
        message=AssistantMessage(content=content, tool_calls=tuple(calls)),
        usage=_usage(completion.usage),
    )


def _usage(usage: CompletionUsage | None) -> Usage:
    """One request's usage. Streamed, it is the final chunk's (`include_usage`).

    `prompt_tokens` counts the cached tokens and `completion_tokens` the reasoning ones;
    many compatible servers send neither breakdown, which leaves those counts at 0.
    """
    if usage is None:
        return Usage(requests=1)
    prompt, completion = usage.prompt_tokens_details, usage.completion_tokens_details
    return Usage(
        requests=1,
        input_tokens=usage.prompt_tokens or 0,
        output_tokens=usage.completion_tokens or 0,
        cached_input_tokens=(prompt.cached_tokens or 0) if prompt else 0,
        reasoning_tokens=(completion.reasoning_tokens or 0) if completion else 0,
    )


def _response_format(schema: type[BaseModel] | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        name, body = schema.__name__, schema.model_json_schema()
    elif isinstance(schema, Mapping):
        body = dict(schema)
        name = str(body.get("title") or "output")
    else:
        raise TypeError(
            f"output_schema must be a pydantic model class or a JSON schema dict, got {schema!r}"
        )
    name = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64] or "output"
    return {"type": "json_schema", "json_schema": {"name": name, "schema": body}}
