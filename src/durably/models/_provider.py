"""What the provider adapters share: HTTP error verdicts and the SDK extras.

The failure this prevents: a provider SDK retrying inside one activity
attempt. Its retries are invisible to the history, stretch the attempt past
its heartbeat and start-to-close timeouts, and ignore the registration's
`ModelRetry`. So every adapter builds its client with `max_retries=0`, and
what the SDK would have decided becomes a `ModelErrorVerdict` for Temporal:

- `x-should-retry: true|false` decides when the server sends it;
- otherwise 408, 409, 429 and every 5xx are retryable, other statuses are not;
- `retry-after-ms`, else `Retry-After` (seconds or an HTTP date), becomes
  the next retry delay in place of the policy's backoff.
"""

from __future__ import annotations

import email.utils
import importlib
import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from types import ModuleType

from durably.models._base import ModelErrorVerdict

__all__ = [
    "PERMANENT",
    "RETRYABLE",
    "http_verdict",
    "import_sdk",
    "retry_after",
]

RETRYABLE = ModelErrorVerdict(retryable=True)
PERMANENT = ModelErrorVerdict(retryable=False)

_RETRYABLE_STATUS = frozenset({408, 409, 429})


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
    """The verdict on an HTTP error response (`headers` looked up in lower case)."""
    should_retry = (headers.get("x-should-retry") or "").strip().lower()
    if should_retry in ("true", "false"):
        retryable = should_retry == "true"
    else:
        retryable = status in _RETRYABLE_STATUS or status >= 500
    if not retryable:
        return PERMANENT
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
