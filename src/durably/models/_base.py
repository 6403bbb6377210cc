"""The `Model` protocol every adapter implements, and how its errors are judged."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol, runtime_checkable

from durably.messages import ModelRequest, ModelResponse

__all__ = [
    "PERMANENT",
    "RETRYABLE",
    "ErrorClassifier",
    "Model",
    "ModelErrorVerdict",
    "classify_model_error",
]


@runtime_checkable
class Model(Protocol):
    """A chat model that can call tools.

    `request` runs inside an activity, so it may do I/O. It must not retry on
    its own: Temporal owns retries (see `ModelRetry`). `identity` names the
    model and every setting that changes its behaviour; it goes into the
    registration fingerprint, so a run is never continued by a different model.

    A model may also define `classify_error(error) -> ModelErrorVerdict` to
    say which of its errors are worth retrying and after how long.
    """

    @property
    def identity(self) -> Mapping[str, Any]: ...

    async def request(self, request: ModelRequest) -> ModelResponse: ...


@dataclass(frozen=True)
class ModelErrorVerdict:
    """Whether a failed model request may be retried, and when.

    `retry_after` (e.g. from a provider's `Retry-After` header) replaces the
    retry policy's backoff for the next attempt.
    """

    retryable: bool
    retry_after: timedelta | None = None


ErrorClassifier = Callable[[BaseException], ModelErrorVerdict]

RETRYABLE = ModelErrorVerdict(retryable=True)
PERMANENT = ModelErrorVerdict(retryable=False)


def classify_model_error(model: Model, error: BaseException) -> ModelErrorVerdict:
    """The model's own verdict on `error`; by default every error is retryable.

    Retryable only matters under `model_retry`: without it no model error is
    retried (a crashed request still is).
    """
    classify: ErrorClassifier | None = getattr(model, "classify_error", None)
    if classify is None:
        return RETRYABLE
    return classify(error)
