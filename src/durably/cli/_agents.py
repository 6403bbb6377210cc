"""Where the commands that take `--agents module:attr` find the module."""

from __future__ import annotations

import os
import sys

__all__ = ["import_from_cwd"]


def import_from_cwd() -> None:
    """Resolve `module:attr` from the working directory, as `python -m` does."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
