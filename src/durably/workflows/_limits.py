"""A run's usage limits (SPEC section 17): which apply, how far they may rise, and
whether the run reached one. Pure functions of the pin, the state and the clock.

A limit is checked before each operation as "usage so far >= limit": a model
request's tokens are unknown until it is answered, so the request that
crosses a token or cost limit completes (it may overshoot by its own size)
and the next operation parks. No estimate parks a run earlier: an estimate
from the input size and the maximum output would park runs the provider
would have served within budget. Which limits each operation checks:

============  ===============================================================
operation     limits checked
============  ===============================================================
model         input, output and total tokens, requests, cost, wall-clock
tool call     tool calls, input, output and total tokens, cost, wall-clock
============  ===============================================================

(a request limit does not stop the calls of the answer already paid for, and
a tool-call limit does not stop the model from answering without tools.)
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from durably.contract import AgentPin, Attention, UsageLimits
from durably.messages import Usage

__all__ = [
    "BUDGET_EXCEEDED",
    "elapsed_s",
    "exceeded",
    "how_far",
    "on_budget",
    "raise_problem",
    "start_limits",
    "turn_budget",
]

# The attention reason of a run parked on a limit.
BUDGET_EXCEEDED = "budget_exceeded"

_LIMIT_FIELDS: tuple[str, ...] = tuple(UsageLimits.model_fields)
_MODEL_ONLY = {"requests"}
_TOOL_ONLY = {"tool_calls"}

_Exceeded = tuple[str, float, float]
"""The limit reached: its name, its value, and what the run used of it."""


def turn_budget(pin: AgentPin, own: int | None) -> int:
    """The turns a run may take: its starter's own budget, else the agent's."""
    return own or pin.max_turns


def elapsed_s(started_at: datetime | None, now: datetime) -> float:
    """Seconds since the run's chain started (what `wall_clock_s` limits)."""
    return (now - started_at).total_seconds() if started_at else 0.0


def on_budget(attention: Attention | None) -> bool:
    """The attention is a limit the run reached."""
    return attention is not None and attention.reason == BUDGET_EXCEEDED


def how_far(detail: Mapping[str, Any]) -> str:
    """A budget attention's limit and how far the run went, e.g. `total_tokens 1100 of
    1000` (its detail is the run's own, written by `RunMachine.over_budget`)."""
    return f"{detail.get('limit')} {detail.get('used', 0):g} of {detail.get('value', 0):g}"


def _ceiling(pin: AgentPin, name: str) -> tuple[float, str] | None:
    """How high a caller may set limit `name`, and which registration setting says so
    (None: no bound): the cap for it, else the registration's own limit."""
    for setting, source in (("limit_cap", pin.limit_cap), ("limits", pin.limits)):
        value = getattr(source, name) if source is not None else None
        if value is not None:
            return float(value), setting
    return None


def _over_ceiling(pin: AgentPin, wanted: UsageLimits) -> str | None:
    for name in _LIMIT_FIELDS:
        value = getattr(wanted, name)
        top = _ceiling(pin, name)
        if value is not None and top is not None and value > top[0]:
            return (
                f"{name} {value:g} is above what agent {pin.agent_id!r} version "
                f"{pin.version!r} allows ({top[0]:g}, its registration's {top[1]}); ask for "
                f"at most {top[0]:g}, or raise limit_cap in the registration"
            )
    return None


def start_limits(
    pin: AgentPin, requested: UsageLimits | None, max_turns: int | None
) -> tuple[UsageLimits | None, str | None]:
    """The limits a run applies from its pin and its starter's request, or why the
    request cannot be honoured."""
    if requested is not None:
        problem = _over_ceiling(pin, requested)
        if problem is not None:
            return None, f"the run's limits: {problem}"
    if max_turns is not None:
        top = max(pin.max_turns, pin.max_turns_cap or 0)
        if max_turns > top:
            return None, (
                f"the run's max_turns {max_turns} is above what agent {pin.agent_id!r} "
                f"version {pin.version!r} allows ({top}: its max_turns, or the "
                "registration's max_turns_cap); ask for at most that"
            )
    if pin.limits is None:
        return requested, None
    return (pin.limits.merged(requested) if requested is not None else pin.limits), None


def raise_problem(pin: AgentPin, wanted: UsageLimits) -> str | None:
    """Why `raise_limits` cannot set `wanted` (None: it can)."""
    if not wanted.model_dump(exclude_none=True):
        return "name at least one limit to raise, e.g. {'limits': {'total_tokens': 20000}}"
    return _over_ceiling(pin, wanted)


def exceeded(
    limits: UsageLimits | None,
    usage: Usage,
    elapsed_s: float,
    kind: Literal["model", "tool"],
) -> _Exceeded | None:
    """The first limit the run has reached before an operation of `kind`, if any."""
    if limits is None:
        return None
    used: dict[str, float] = {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
        "requests": usage.requests,
        "tool_calls": usage.tool_calls,
        "cost_usd": usage.cost_usd,
        "wall_clock_s": elapsed_s,
    }
    skip = _TOOL_ONLY if kind == "model" else _MODEL_ONLY
    for name in _LIMIT_FIELDS:
        value = getattr(limits, name)
        if name not in skip and value is not None and used[name] >= value:
            return name, float(value), float(used[name])
    return None
