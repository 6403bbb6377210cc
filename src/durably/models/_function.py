"""Models built from plain Python, for tests and the offline demo.

A durable model must answer from the request alone: a worker that crashes
and restarts sees the same request again and must give the same kind of
answer, so neither model here keeps a counter between calls.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from durably.messages import (
    AssistantMessage,
    Message,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from durably.models._base import RETRYABLE, ErrorClassifier, ModelErrorVerdict
from durably.models._live_text import emit_text

__all__ = [
    "FunctionModel",
    "ScriptedModel",
    "Step",
    "final",
    "last_tool_results",
    "since_last_user_message",
    "tool_call",
]

ModelFunction = Callable[
    [ModelRequest],
    "ModelResponse | AssistantMessage | Awaitable[ModelResponse | AssistantMessage]"
    " | AsyncIterator[str | AssistantMessage | ModelResponse]",
]


def _qualname(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


async def _call(fn: ModelFunction, request: ModelRequest) -> ModelResponse:
    answer = fn(request)
    if inspect.isasyncgen(answer):
        answer = await _streamed(fn, answer)
    if inspect.isawaitable(answer):
        answer = await answer
    if isinstance(answer, AssistantMessage):
        return ModelResponse(message=answer)
    if isinstance(answer, ModelResponse):
        return answer
    raise TypeError(
        f"model function {_qualname(fn)} returned {type(answer).__name__}; "
        "return a ModelResponse or an AssistantMessage"
    )


async def _streamed(fn: ModelFunction, chunks: AsyncIterator[Any]) -> Any:
    """A generator model function: each `str` it yields is a piece of the answer as it
    is written (shown to live followers); the `AssistantMessage` or `ModelResponse` it
    yields last is the answer, else the pieces joined are the final answer."""
    pieces: list[str] = []
    async for chunk in chunks:
        if isinstance(chunk, str):
            pieces.append(chunk)
            emit_text(chunk)
        elif isinstance(chunk, AssistantMessage | ModelResponse):
            return chunk
        else:
            raise TypeError(
                f"model function {_qualname(fn)} yielded {type(chunk).__name__}; yield text "
                "pieces (str), then optionally the AssistantMessage or ModelResponse"
            )
    return AssistantMessage(content="".join(pieces))


class FunctionModel:
    """A model whose answer is computed by a function of the request.

    The function may be an async generator: each `str` it yields is shown to
    the run's live followers as it is written (`RunHandle.events`), and the
    answer is the `AssistantMessage` it yields last, or the pieces joined.

    .. versionchanged:: Unreleased
       Async generator functions stream their answer.
    """

    def __init__(
        self,
        fn: ModelFunction,
        *,
        name: str | None = None,
        classify_error: ErrorClassifier | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError("FunctionModel needs a callable taking a ModelRequest")
        self._fn = fn
        self._name = name or _qualname(fn)
        self._classify = classify_error

    def classify_error(self, error: BaseException) -> ModelErrorVerdict:
        """Every error is retryable unless a `classify_error` was given."""
        return self._classify(error) if self._classify else RETRYABLE

    @property
    def identity(self) -> Mapping[str, Any]:
        return {"kind": "function", "name": self._name}

    async def request(self, request: ModelRequest) -> ModelResponse:
        return await _call(self._fn, request)


def tool_call(name: str, /, call_id: str | None = None, **arguments: Any) -> ToolCall:
    """A tool call for a scripted step (`call_id` defaults to `call_<name>`)."""
    return ToolCall(call_id=call_id or f"call_{name}", name=name, arguments=arguments)


def final(text: str) -> AssistantMessage:
    """A final answer for a scripted step."""
    return AssistantMessage(content=text)


Step = str | ToolCall | Sequence[ToolCall] | AssistantMessage | ModelResponse | ModelFunction


class ScriptedModel:
    """A model that plays a script: step N answers the N-th request of a run.

    Each step is a final answer (`str`), one or several `ToolCall`s, an
    `AssistantMessage`/`ModelResponse`, or a function of the request. The
    step is chosen by how many assistant messages the request holds after its
    last user message, so a retried or resumed request gets the same step
    again, and each submission of a session plays the script from the start
    while its steps can still read the whole conversation.
    """

    def __init__(self, steps: Sequence[Step], *, name: str = "scripted") -> None:
        if not steps:
            raise ValueError("ScriptedModel needs at least one step")
        self._steps = list(steps)
        self._name = name

    @property
    def identity(self) -> Mapping[str, Any]:
        return {
            "kind": "scripted",
            "name": self._name,
            "steps": [_describe(s) for s in self._steps],
        }

    async def request(self, request: ModelRequest) -> ModelResponse:
        current = since_last_user_message(request)
        index = sum(1 for m in current if isinstance(m, AssistantMessage))
        if index >= len(self._steps):
            raise IndexError(
                f"ScriptedModel {self._name!r} has {len(self._steps)} steps but was asked for "
                f"step {index + 1}; add steps or end the script with a final answer"
            )
        step = self._steps[index]
        if isinstance(step, str):
            return ModelResponse(message=final(step))
        if isinstance(step, ToolCall):
            return ModelResponse(message=AssistantMessage(tool_calls=(step,)))
        if isinstance(step, AssistantMessage):
            return ModelResponse(message=step)
        if isinstance(step, ModelResponse):
            return step
        if callable(step):
            return await _call(step, request)
        return ModelResponse(message=AssistantMessage(tool_calls=tuple(step)))


def _describe(step: Step) -> Any:
    if isinstance(step, str | ToolCall | AssistantMessage | ModelResponse):
        return step if isinstance(step, str) else step.model_dump(mode="json")
    if callable(step):
        return {"function": _qualname(step)}
    return [c.model_dump(mode="json", by_alias=True) for c in step]


def since_last_user_message(request: ModelRequest) -> list[Message]:
    """The messages after the request's last user message: what this run's model and tools
    added (in a session, earlier submissions' messages come before that user message)."""
    tail = list(
        itertools.takewhile(lambda m: not isinstance(m, UserMessage), reversed(request.messages))
    )
    return tail[::-1]


def last_tool_results(request: ModelRequest) -> list[ToolResultMessage]:
    """The tool results that arrived since the model's last answer."""
    tail = list(
        itertools.takewhile(lambda m: isinstance(m, ToolResultMessage), reversed(request.messages))
    )
    return [m for m in reversed(tail) if isinstance(m, ToolResultMessage)]
