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
    "ModelResponseError",
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


class ModelResponseError(ValueError):
    """The model answered, but its answer cannot be read as a response.

    An adapter raises it from inside the completion attempt when a tool
    call's arguments are not a JSON object (malformed JSON, or JSON that is
    a list, a string, a number, null) or when the answer is empty (no text
    and no tool calls). The model activity treats it as it treats a
    provider's error: under the registration's `model_retry` the model is
    asked again (the default verdict is retryable; a `classify_error` that
    returns `ModelErrorVerdict(retryable=False)` for it stops that), and
    without `model_retry` the run fails, and `retry()` asks again. The
    answer itself is never recorded.

    Arguments that are a JSON object but do not fit the tool's input model
    are not this error: the model reads the validation error as that call's
    result and corrects its call on the next turn. That answer was read
    whole, so durably can tell the model exactly which field is wrong, and
    it goes into the transcript as it was. Unreadable arguments give the
    model nothing precise to correct, cannot be sent back to the provider as
    they were (servers reject a tool call whose arguments do not parse), and
    are usually a glitch of one completion (cut off at the token limit, a
    broken stream) that asking again fixes; like an empty answer, they are
    a validation error of the completion attempt, retried as the seed says.

    `call_id` and `tool` name the call at fault, or are None when the whole
    answer is (an empty one).

    .. versionadded:: Unreleased
    """

    def __init__(
        self, problem: str, *, call_id: str | None = None, tool: str | None = None
    ) -> None:
        self.problem = problem
        self.call_id = call_id
        self.tool = tool
        super().__init__(
            f"{problem}. The answer was not used: the model is asked again if the "
            "registration's model_retry allows another attempt; without model_retry the run "
            "fails, and retry() asks again"
        )


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
