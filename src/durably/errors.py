"""Every error durably raises, as one tree.

::

    DurablyError
    ├── RegistrationError         a registration is invalid or clashes with a registered one
    │   └── VersionDriftError     unfinished runs pinned definitions a strict worker lacks
    ├── DurableConflictError      the run (or registry) is in a state that refuses the request
    │   └── InteractionConflictError  another response was already accepted for it
    ├── InvalidResponseError      a response or resolution does not fit what the run asked
    ├── InvalidRunInputError      a run cannot start with this agent id, run id or input
    ├── RunNotFoundError          no run with that id exists in the namespace
    ├── RunFailedError            the run failed; it stays open for `retry()`
    ├── RunCancelledError         the run was cancelled
    ├── RunClosedError            Temporal closed the run (terminated, timed out)
    ├── TemporalUnavailableError  the Temporal server (or a worker, for a query) did not answer
    ├── SearchAttributesMissingError  the namespace lacks durably's search attributes
    └── DevServerError            the local dev server could not start or serve

Each message says what was wrong and what to do about it. Any other request
Temporal refuses becomes a plain `DurablyError` naming the operation and
the server's message: the client never raises the SDK's `RPCError` as is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from temporalio.service import RPCError, RPCStatusCode

if TYPE_CHECKING:
    from durably.client import NeededVersion

__all__ = [
    "DevServerError",
    "DurableConflictError",
    "DurablyError",
    "InteractionConflictError",
    "InvalidResponseError",
    "InvalidRunInputError",
    "RegistrationError",
    "RunCancelledError",
    "RunClosedError",
    "RunFailedError",
    "RunNotFoundError",
    "SearchAttributesMissingError",
    "TemporalUnavailableError",
    "VersionDriftError",
]


class DurablyError(Exception):
    """Base class of every error raised by durably."""


class RegistrationError(DurablyError):
    """An agent registration is invalid or clashes with the live registry."""


class VersionDriftError(RegistrationError):
    """A strict worker refused to start: unfinished runs pinned definitions it lacks.

    Raised by `DurableRuntime.resume()` (and `durably worker --strict`) when
    a version an unfinished run pinned is not registered, or is registered
    with another fingerprint; `needed` lists each `NeededVersion` at fault.

    .. versionadded:: Unreleased
    """

    def __init__(self, message: str, needed: Sequence[NeededVersion] = ()) -> None:
        super().__init__(message)
        self.needed = list(needed)


class DurableConflictError(DurablyError):
    """The request does not fit the current state of the run or registry."""


class InteractionConflictError(DurableConflictError):
    """A different response was already accepted for this interaction."""


class InvalidResponseError(DurablyError):
    """A response or resolution does not match what the run is waiting for."""


class InvalidRunInputError(DurablyError):
    """`start_run` was given an agent id, run id or input a run cannot start with.

    Nothing was started.
    """


class RunNotFoundError(DurablyError):
    """No run with that id exists."""


class RunFailedError(DurablyError):
    """The run failed for good; it stays open for `retry()`."""

    def __init__(self, run_id: str, error: str) -> None:
        super().__init__(
            f"run {run_id!r} failed: {error.rstrip('.')}. The run stays open: fix the cause, "
            f"then call retry() on it (or `durably retry {run_id}`)."
        )
        self.run_id = run_id
        self.error = error


class RunCancelledError(DurablyError):
    """The run was cancelled by request."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id!r} was cancelled; start a new run to do the work again.")
        self.run_id = run_id


class RunClosedError(DurablyError):
    """Temporal closed the run before it finished (terminated, or its execution timed out)."""

    def __init__(self, run_id: str, how: str) -> None:
        super().__init__(
            f"run {run_id!r} was {how} in Temporal before it finished, so it cannot continue "
            "or be retried; start a new run to do the work again."
        )
        self.run_id = run_id


class TemporalUnavailableError(DurablyError, RPCError):
    """Temporal did not answer: the server is down or unreachable, or timed out.

    Also an `RPCError` with the server's status code, so code written against
    the Temporal SDK's own error keeps catching it.
    """

    def __init__(
        self,
        message: str,
        *,
        status: RPCStatusCode = RPCStatusCode.UNAVAILABLE,
        raw_grpc_status: bytes = b"",
    ) -> None:
        RPCError.__init__(self, message, status, raw_grpc_status)


class SearchAttributesMissingError(DurablyError):
    """The namespace lacks durably's search attributes (or holds one with another type).

    A worker raises it as it starts; `durably setup` registers them.
    """


class DevServerError(DurablyError):
    """The local Temporal dev server (`durably dev`) could not start or serve."""
