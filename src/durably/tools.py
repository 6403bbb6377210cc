"""Tools: typed functions a model may call, run inside activities.

A tool is a plain typed function (`async def refund(ctx: ToolContext,
order_id: str, amount_cents: int) -> Refund`), its input model built from the
parameters, or takes one pydantic model (`async def refund(args: RefundArgs,
ctx: ToolContext) -> Refund`); its output is a pydantic model or any JSON
type, a plain `str` included. `_tool_signature.py` reads the function.
Either way the tool runs as `execute(args, ctx)`, and its `ToolContext`'s
`operation_id` is the key to pass to external services for deduplication:
it is the same on every retry, restart and `retry()` of this call, and
unique across runs.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import re
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Generic, TypeVar, get_type_hints, overload

import structlog
from pydantic import BaseModel, TypeAdapter

from durably._tool_signature import read_signature

_ANY: TypeAdapter[Any] = TypeAdapter(Any)
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")

__all__ = ["Question", "Tool", "ToolContext", "ToolDrift", "ToolError", "question_tool", "tool"]

ArgsT = TypeVar("ArgsT", bound=BaseModel)


class ToolDrift(Exception):
    """The tool's definition outside durably (an MCP server's listing) is no longer the
    one the run's version pinned: the call is not made, and the run parks in
    `needs_attention` (`version_incompatible`) until the definitions agree again."""


class ToolError(Exception):
    """A failure the tool reports itself; its message goes back to the model.

    Raising `ToolError` is a definite outcome: the call is not retried and the
    model reads the message as the tool's error result. Any other exception is
    an *uncertain* outcome and is handled by the tool's recovery policy.
    """


@dataclass(frozen=True, kw_only=True)
class ToolContext:
    """What a running tool knows about its call.

    Attributes:
        operation_id: `{run_id}/{first_run_id}/tool:{turn}:{call_id}`, where
            `first_run_id` is the first Temporal run id of the run's chain (runs
            started by 0.1.0: `{run_id}/tool:{turn}:{call_id}`); stable across
            retries, restarts, continue-as-new and `retry()`, unique in the
            namespace even when a run id is reused. Send it as the idempotency key.
        run_id: The durable run (the workflow id).
        agent_id: The agent that called the tool.
        agent_version: The registered version the run is pinned to.
        attempt: 1-based attempt of this call.
        abort_signal: Set when the run is cancelled or the worker must stop;
            long tools should watch it and return early.
        logger: A structlog logger bound with run and operation ids.
    """

    operation_id: str
    run_id: str
    agent_id: str
    agent_version: str
    attempt: int
    abort_signal: asyncio.Event
    logger: structlog.typing.FilteringBoundLogger
    _heartbeat: Callable[..., None] = field(repr=False)

    def heartbeat(self, details: Any = None) -> None:
        """Report progress now (durably also heartbeats in the background)."""
        if details is None:
            self._heartbeat()
        else:
            self._heartbeat(details)


Execute = Callable[[Any, ToolContext], Coroutine[Any, Any, Any]]
ToolFunction = Callable[..., Coroutine[Any, Any, Any]]


@dataclass(frozen=True, kw_only=True)
class Tool(Generic[ArgsT]):
    """A tool the model may call.

    Build one with the `@tool` decorator. `heartbeat_timeout` and
    `start_to_close_timeout` override the registration's defaults for this
    tool; `approval_timeout` denies an unanswered approval after that long.
    """

    name: str
    description: str
    input_model: type[ArgsT]
    execute: Execute
    output_model: type[BaseModel] | None = None
    requires_approval: bool = False
    approval_timeout: timedelta | None = None
    heartbeat_timeout: timedelta | None = None
    start_to_close_timeout: timedelta | None = None
    is_question: bool = False
    # The recovery policy the tool declares for itself (an MCP tool's, read from its
    # annotations); a registration's `tool_recovery` overrides it, and None is `manual`.
    recovery: str | None = None
    # Where the tool comes from when durably did not build it from a function (an
    # `MCPToolset`): the worker checks it against its source at startup.
    origin: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not _TOOL_NAME.fullmatch(self.name):
            raise ValueError(
                f"tool name {self.name!r} must be 1 to 64 ASCII letters, digits, '_' and '-' "
                "(what OpenAI and Anthropic accept)"
            )
        if not (isinstance(self.input_model, type) and issubclass(self.input_model, BaseModel)):
            raise TypeError(
                f"tool {self.name!r}: input_model must be a pydantic BaseModel subclass"
            )

    @functools.cached_property
    def input_schema(self) -> dict[str, Any]:
        return self.input_model.model_json_schema()

    @functools.cached_property
    def output_schema(self) -> dict[str, Any]:
        if self.output_model is None:
            return {}
        return self.output_model.model_json_schema()

    def validate_output(self, value: Any) -> Any:
        """Check a value against the output model and return its JSON form."""
        if self.output_model is None:
            return _ANY.dump_python(value, mode="json")
        return self.output_model.model_validate(value).model_dump(mode="json")


def render_result(value: Any) -> str:
    """A tool result as the model reads it: compact JSON, or the text itself."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _return_model(fn: Callable[..., Any]) -> type[BaseModel] | None:
    annotation = get_type_hints(fn).get("return")
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


@overload
def tool(fn: ToolFunction, /) -> Tool[Any]: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    requires_approval: bool = False,
    approval_timeout: timedelta | None = None,
    heartbeat_timeout: timedelta | None = None,
    start_to_close_timeout: timedelta | None = None,
) -> Callable[[ToolFunction], Tool[Any]]: ...


def tool(
    fn: ToolFunction | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    requires_approval: bool = False,
    approval_timeout: timedelta | None = None,
    heartbeat_timeout: timedelta | None = None,
    start_to_close_timeout: timedelta | None = None,
) -> Tool[Any] | Callable[[ToolFunction], Tool[Any]]:
    """Turn an `async def` function into a `Tool`, in one of two forms.

    **Plain form**: the arguments are the function's parameters::

        @tool
        async def refund(ctx: ToolContext, order_id: str, amount_cents: int = 0) -> Refund:
            \"""Refund an order.

            Args:
                order_id: The order to refund, e.g. "A-1".
                amount_cents: How much; 0 refunds it all.
            \"""

    The input model is built from the parameters' names, annotations and
    defaults (`Annotated[..., Field(...)]` and `= Field(...)` work as in
    pydantic); each parameter's description comes from the docstring's
    Google-style `Args:` section, the tool's description from the text
    before the docstring's first section (`Args:`, `Returns:`, `Raises:`,
    ...). The schema has no titles derived from the names (a
    `Field(title=...)` stays; nested models keep theirs); extra arguments
    are ignored, as in a default pydantic model.

    **Model form**: besides the context, exactly one parameter, annotated
    with a pydantic `BaseModel` subclass: `async def refund(args: RefundArgs,
    ctx: ToolContext) -> Refund`. The model is the input model, its schema
    as pydantic writes it, and the description is the whole docstring. So a
    function taking one model and nothing else is always this form (wrap
    the model in another, or add a parameter, for the plain form).

    In both, the context is the parameter annotated `ToolContext` (or
    `ToolContext | None`), in any position, optional, and never part of the
    schema; `(args: RefundArgs, ctx)` with `ctx` unannotated also works.
    The output model comes from the return annotation when it is a pydantic
    model; any other return value (a plain `str`, a dict, a list) is sent
    to the model as is, a `str` as its text, the rest as compact JSON.

    The name defaults to the function's name; `description` replaces the
    docstring's. A signature a tool cannot have (`*args`, `**kwargs`,
    positional-only or unannotated parameters, a name pydantic reserves such
    as `json` or `model_id`, an `Args:` entry naming no parameter) raises
    `RegistrationError` here, saying what to change. Tools must be `async def`.
    """

    def build(f: ToolFunction) -> Tool[Any]:
        if not inspect.iscoroutinefunction(f):
            raise TypeError(f"@tool {f.__qualname__}: tools must be `async def`")
        sig = read_signature(f, ToolContext)
        return Tool(
            name=name or f.__name__,
            description=description if description is not None else sig.description,
            input_model=sig.input_model,
            output_model=_return_model(f),
            execute=sig.execute,
            requires_approval=requires_approval,
            approval_timeout=approval_timeout,
            heartbeat_timeout=heartbeat_timeout,
            start_to_close_timeout=start_to_close_timeout,
        )

    return build(fn) if fn is not None else build


class Question(BaseModel):
    """What a question tool's caller asks the person."""

    question: str


async def _never_runs(args: Question, ctx: ToolContext) -> str:
    raise ToolError("a question tool has no code: the run waits for a person's answer")


def question_tool(
    *,
    name: str = "ask_user",
    description: str = "Ask the user a question and wait for the answer.",
    approval_timeout: timedelta | None = None,
) -> Tool[Question]:
    """A tool whose result is a person's answer: the run waits for `respond`.

    The model calls it with `{"question": "..."}`; the run becomes `waiting`
    with a `question` interaction, and the answer text is the tool's result.
    `approval_timeout` bounds the wait; an unanswered question then comes
    back to the model as an error.
    """
    return Tool(
        name=name,
        description=description,
        input_model=Question,
        execute=_never_runs,
        approval_timeout=approval_timeout,
        is_question=True,
    )


def tool_identity(t: Tool[Any]) -> Mapping[str, Any]:
    """What of a tool goes into the registration fingerprint."""
    return {
        "name": t.name,
        "description": t.description,
        "input_schema": t.input_schema,
        "output_schema": t.output_schema,
        "requires_approval": t.requires_approval,
        "is_question": t.is_question,
        "approval_timeout_s": t.approval_timeout.total_seconds() if t.approval_timeout else None,
        # Named only when set, so the fingerprints of function tools stay as they were.
        **({"recovery": t.recovery} if t.recovery is not None else {}),
    }
