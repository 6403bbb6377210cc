"""What model requests cost, from prices the user gives (SPEC section 17).

Providers publish prices per million tokens and change them; durably knows
none of them. A registration names its prices (`AgentRegistration.prices`),
the model activity computes each request's cost from the usage the provider
reported, and the run records it with the request (`Usage.cost_usd`) and
sums it. Prices are read when a request completes, not pinned with the run:
changing a price changes what later requests cost, never a run's version.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from durably.errors import RegistrationError
from durably.messages import Usage

__all__ = ["Price", "cost_usd", "price_for"]

# `prices` key that applies to every model the registration names no price for.
ANY_MODEL = "*"


@dataclass(frozen=True)
class Price:
    """USD per million tokens. `cached_input` is what the provider charges for input it
    served from its prompt cache (None: the `input` price); reasoning tokens are output
    tokens, priced as such."""

    input: float
    output: float
    cached_input: float | None = None

    def __post_init__(self) -> None:
        for name in ("input", "output", "cached_input"):
            value = getattr(self, name)
            if value is None and name == "cached_input":
                continue
            if (
                not isinstance(value, int | float)
                or isinstance(value, bool)
                or not math.isfinite(value)
                or value < 0
            ):
                raise RegistrationError(
                    f"Price.{name} must be a finite number of USD per million tokens, "
                    f"at least 0; got {value!r}"
                )


def price_for(prices: Mapping[str, Price], identity: Mapping[str, Any]) -> Price | None:
    """The price of the model a registration's agent uses (by its `identity["model"]`),
    else the `"*"` price, else None (its requests cost nothing that durably counts)."""
    name = identity.get("model")
    if isinstance(name, str) and name in prices:
        return prices[name]
    return prices.get(ANY_MODEL)


def cost_usd(usage: Usage, price: Price) -> float:
    """What `usage` costs at `price`: uncached input, cached input and output tokens."""
    cached = min(usage.cached_input_tokens, usage.input_tokens)
    cached_price = price.input if price.cached_input is None else price.cached_input
    total = (
        (usage.input_tokens - cached) * price.input
        + cached * cached_price
        + usage.output_tokens * price.output
    ) / 1_000_000
    return round(total, 9)
