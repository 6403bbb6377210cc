"""The `Model` protocol every adapter implements."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from durably.messages import ModelRequest, ModelResponse

__all__ = ["Model"]


@runtime_checkable
class Model(Protocol):
    """A chat model that can call tools.

    `request` runs inside an activity, so it may do I/O. It must not retry on
    its own: Temporal owns retries (see `ModelRetry`). `identity` names the
    model and every setting that changes its behaviour; it goes into the
    registration fingerprint, so a run is never continued by a different model.
    """

    @property
    def identity(self) -> Mapping[str, Any]: ...

    async def request(self, request: ModelRequest) -> ModelResponse: ...
