"""What the provider adapters share: their SDK plumbing, HTTP error verdicts, the extras.

The failure this prevents: a provider SDK retrying inside one activity
attempt. Its retries are invisible to the history, stretch the attempt past
its heartbeat and start-to-close timeouts, and ignore the registration's
`ModelRetry`. So `ProviderModel` gives every adapter's client (built, or a
copy of one passed in) `max_retries=0`, and what the SDK would have decided
becomes a `ModelErrorVerdict` for Temporal. Under `model_retry` every error
of the completion attempt is retried, permanent ones (a 400, a validation
error) included, as the seed says: the default verdict never stops one, and
`retry-after-ms`, else `Retry-After` (seconds or an HTTP date), becomes the
next retry delay in place of the policy's backoff. Only a `classify_error`
the user gives stops retries explicitly.

An answer the adapter cannot read (a tool call whose arguments are not a
JSON object, an empty completion) raises `ModelResponseError` from inside
the completion attempt, through `tool_arguments` and `empty_answer`, so it
is retried (or fails the run) exactly as a provider's error is.

Keeping the client, the server and the identity in one base also keeps the
adapters' fingerprints built the same way: an adapter adds only its SDK's
names, its settings, and how it speaks to its API.
"""

from __future__ import annotations

import asyncio
import email.utils
import importlib
import json
import math
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from types import ModuleType
from typing import Any, ClassVar, Generic, Protocol, Self, TypeVar

from durably.messages import ModelRequest, ModelResponse
from durably.models._base import (
    RETRYABLE,
    ErrorClassifier,
    ModelErrorVerdict,
    ModelResponseError,
)

__all__ = [
    "ProviderModel",
    "empty_answer",
    "given",
    "http_verdict",
    "import_sdk",
    "retry_after",
    "tool_arguments",
]

# How much of an unreadable answer an error quotes: enough to see what went wrong,
# bounded, since the message is stored in the run's history.
_EXCERPT = 200


class _SDKClient(Protocol):
    """What the base needs of an SDK's async client (`AsyncOpenAI`, `AsyncAnthropic`)."""

    @property
    def base_url(self) -> object: ...

    def with_options(self, *, max_retries: int) -> Self: ...


_ClientT = TypeVar("_ClientT", bound=_SDKClient)


class ProviderModel(ABC, Generic[_ClientT]):
    """A model behind a provider's official SDK: its client, server and identity.

    A subclass names its provider in the class attributes, calls this
    `__init__` first (it imports the SDK, so a missing extra is reported
    before anything else), then checks its own settings and stores them in
    `_settings` with `given(...)`, in the order its requests send them. It
    implements `request` with `_client()`.
    """

    _provider: ClassVar[str]
    """The SDK package, the extra that installs it, and `identity["provider"]`."""
    _client_class: ClassVar[str]
    """The SDK's async client class, e.g. `AsyncOpenAI`."""
    _base_url_env: ClassVar[str]
    """The variable naming the server when no `base_url` is given."""
    _example_model: ClassVar[str]
    """The model name suggested when none is given."""

    _settings: dict[str, Any]

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None,
        api_key: str | None,
        timeout: float | None,
        client: _ClientT | None,
        extra_body: Mapping[str, Any] | None,
        classify_error: ErrorClassifier | None,
        stream: bool = True,
    ) -> None:
        name = type(self).__name__
        sdk = import_sdk(self._provider, extra=self._provider, user=name)
        client_class = getattr(sdk, self._client_class)
        if not isinstance(model, str) or not model.strip():
            raise ValueError(f"{name} needs a model name, e.g. {self._example_model!r}")
        if client is not None and not isinstance(client, client_class):
            raise TypeError(
                f"client must be an {self._provider}.{self._client_class}, "
                f"got {type(client).__name__}"
            )
        if client is not None and (base_url or api_key or timeout is not None):
            raise ValueError(
                "pass base_url, api_key and timeout either to your client or to "
                f"{name}, not to both"
            )
        if classify_error is not None and not callable(classify_error):
            raise TypeError("classify_error must be a callable taking the raised exception")
        self._model = model
        self._api_key = api_key
        self._timeout = timeout
        self._new_client: Callable[..., _ClientT] = client_class
        # A copy with retries off: Temporal owns retries.
        self._given_client: _ClientT | None = (
            client.with_options(max_retries=0) if client is not None else None
        )
        if client is not None:
            self._base_url: str | None = str(client.base_url)
        else:
            self._base_url = base_url or os.environ.get(self._base_url_env) or None
        self._extra_body = dict(extra_body) if extra_body else None
        self._classify = classify_error
        # Stream the answer, so live followers read it as it is written (`emit_text`).
        # The answer committed is the same either way: not part of the identity.
        self._stream = stream
        self._clients: tuple[asyncio.AbstractEventLoop, _ClientT] | None = None

    @property
    def model(self) -> str:
        return self._model

    @property
    def identity(self) -> Mapping[str, Any]:
        """Provider, model, server and every setting given; never the key.

        Settings left unset are left out, so a later release that learns a
        new setting does not change existing fingerprints.
        """
        identity: dict[str, Any] = {"provider": self._provider, "model": self._model}
        if self._base_url:
            identity["base_url"] = self._base_url.rstrip("/")
        identity.update(self._settings)
        if self._extra_body is not None:
            identity["extra_body"] = self._extra_body
        return identity

    def __repr__(self) -> str:
        where = f", base_url={self._base_url!r}" if self._base_url else ""
        return f"{type(self).__name__}({self._model!r}{where})"

    @abstractmethod
    async def request(self, request: ModelRequest) -> ModelResponse: ...

    def classify_error(self, error: BaseException) -> ModelErrorVerdict:
        """Whether Temporal should retry after `error`, and when.

        The `classify_error=` given to the constructor decides if there is
        one; otherwise `default_classify_error`.
        """
        if self._classify is not None:
            return self._classify(error)
        return self.default_classify_error(error)

    @classmethod
    def default_classify_error(cls, error: BaseException) -> ModelErrorVerdict:
        """The built-in verdict: every error is retryable (under `model_retry`); an HTTP
        error response's `retry-after-ms` / `Retry-After` sets the next delay."""
        sdk = importlib.import_module(cls._provider)
        if isinstance(error, sdk.APIStatusError):
            return http_verdict(error.status_code, error.response.headers)
        return RETRYABLE

    def _client(self) -> _ClientT:
        if self._given_client is not None:
            return self._given_client
        # One client per event loop: its pooled connections belong to the loop.
        loop = asyncio.get_running_loop()
        if self._clients is None or self._clients[0] is not loop:
            options: dict[str, Any] = {}
            if self._timeout is not None:
                options["timeout"] = self._timeout
            client = self._new_client(
                api_key=self._api_key,
                base_url=self._base_url,
                max_retries=0,
                **options,
            )
            self._clients = (loop, client)
        return self._clients[1]


def tool_arguments(value: object, *, call_id: str, tool: str) -> dict[str, Any]:
    """A tool call's arguments as a dict, or `ModelResponseError` saying why they are not one.

    `value` is what the provider sent: JSON text (Chat Completions), or an
    already decoded value (the Messages API's `input`). Empty text means no
    arguments (some servers send `""` for a tool without parameters). Only
    readability is checked here; whether the object fits the tool's input
    model is the model's own mistake to correct, told as the call's result.
    """
    if isinstance(value, str) and not value.strip():
        return {}
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except ValueError as exc:
            position = getattr(exc, "pos", None)
            where = f": character {position}" if position is not None else ""
            why = f"are not valid JSON ({getattr(exc, 'msg', exc)}{where})"
            raise _unreadable_call(why, value, call_id=call_id, tool=tool) from None
        text = value
    else:
        decoded = value
        text = json.dumps(value, default=str)
    if not isinstance(decoded, dict):
        why = f"are JSON {_json_kind(decoded)}, not an object"
        raise _unreadable_call(why, text, call_id=call_id, tool=tool)
    return decoded


def empty_answer(what: str) -> ModelResponseError:
    """The error for an answer with neither text nor tool calls; `what` describes it."""
    return ModelResponseError(f"the model's answer is empty: {what} has no text and no tool calls")


def _unreadable_call(why: str, text: str, *, call_id: str, tool: str) -> ModelResponseError:
    return ModelResponseError(
        f"the model's tool call {_quoted(call_id)} to {_quoted(tool)} has arguments that {why}: "
        f"{_quoted(text)}",
        call_id=call_id,
        tool=tool,
    )


def _quoted(text: str, limit: int = _EXCERPT) -> str:
    """`text` quoted, cut to `limit` characters (saying how long it was)."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text):,} characters)"


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, int | float):
        return "a number"
    return f"of type {type(value).__name__}"


def given(**settings: Any) -> dict[str, Any]:
    """The settings that are not None, in the order given."""
    return {k: v for k, v in settings.items() if v is not None}


def import_sdk(module: str, *, extra: str, user: str) -> ModuleType:
    """Import a provider SDK, or raise an ImportError naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{user} needs the `{module}` package, which is not installed; "
            f"install it with: pip install 'durably[{extra}]'"
        ) from exc


def http_verdict(status: int, headers: Mapping[str, str]) -> ModelErrorVerdict:
    """The default verdict on an HTTP error response: retryable whatever its status (a
    400 included, as the seed retries permanent errors), after the delay the response
    asks for, if any (`headers` looked up in lower case)."""
    return ModelErrorVerdict(retryable=True, retry_after=retry_after(headers))


def retry_after(headers: Mapping[str, str], *, now: datetime | None = None) -> timedelta | None:
    """The delay a response asks for, or None when it names none (or one in the past).

    `retry-after-ms` (milliseconds, as OpenAI and Anthropic send it) wins over
    `Retry-After`, which is seconds or an HTTP date.
    """
    millis = _seconds(headers.get("retry-after-ms"))
    if millis is not None:
        return timedelta(milliseconds=millis) if millis > 0 else None
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _seconds(value)
    if seconds is None:
        try:
            when = email.utils.parsedate_to_datetime(value.strip())
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    return timedelta(seconds=seconds) if seconds > 0 else None


def _seconds(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value.strip())
    except ValueError:
        return None
    return number if math.isfinite(number) else None
