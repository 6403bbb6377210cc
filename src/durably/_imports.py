"""Loading what a command names as `module:attr` (`--agents`, `durably observe`)."""

from __future__ import annotations

import importlib
from typing import Any

from durably.errors import RegistrationError

__all__ = ["load_attr"]


def load_attr(spec: str, what: str, example: str) -> Any:
    """The attribute `spec` (`module:attr`) names; `what` and `example` word the error."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise RegistrationError(f"{what} {spec!r}: expected `module:attr`, e.g. `{example}`")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise RegistrationError(f"{what} {spec!r}: cannot load it ({err})") from err
