"""Every error durably raises, as one tree.

::

    DurablyError
    ├── RegistrationError         a registration is invalid or clashes with a registered one
    ├── DurableConflictError      the run (or registry) is in a state that refuses the request
    │   └── InteractionConflictError  another response was already accepted for it
    ├── InvalidResponseError      a response or resolution does not fit what the run asked
    ├── RunNotFoundError          no run with that id exists in the namespace
    ├── RunFailedError            the run failed; it stays open for `retry()`
    ├── RunCancelledError         the run was cancelled
    └── DevServerError            the local dev server could not start or serve

Each message says what was wrong and what to do about it.
"""

from __future__ import annotations

__all__ = [
    "DevServerError",
    "DurableConflictError",
    "DurablyError",
    "InteractionConflictError",
    "InvalidResponseError",
    "RegistrationError",
    "RunCancelledError",
    "RunClosedError",
    "RunFailedError",
    "RunNotFoundError",
]


class DurablyError(Exception):
    """Base class of every error raised by durably."""


class RegistrationError(DurablyError):
    """An agent registration is invalid or clashes with the live registry."""


class DurableConflictError(DurablyError):
    """The request does not fit the current state of the run or registry."""


class InteractionConflictError(DurableConflictError):
    """A different response was already accepted for this interaction."""


class InvalidResponseError(DurablyError):
    """A response or resolution does not match what the run is waiting for."""


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


class DevServerError(DurablyError):
    """The local Temporal dev server (`durably dev`) could not start or serve."""
