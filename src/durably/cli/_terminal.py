"""What reaches the operator's terminal, and how a command's coroutine is run.

Whatever a model, a tool, a caller or a run wrote goes through `safe` (or
`printable`) before it is printed, so an escape sequence or bidi control in it
shows as `\\x1b` / `\\u202e` instead of acting on the terminal. `run` turns the
errors an operator is expected to meet into one red line and exit status 1.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from datetime import datetime
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from temporalio.service import RPCError

from durably._text import printable
from durably.contract import PIN_DIGEST_PREFIX, RunStatus
from durably.errors import DurablyError

T = TypeVar("T")

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)

_STATUS_STYLE = {
    RunStatus.RUNNING: "cyan",
    RunStatus.WAITING: "yellow",
    RunStatus.RETRY_WAIT: "yellow",
    RunStatus.NEEDS_ATTENTION: "bold magenta",
    RunStatus.FAILED: "bold red",
    RunStatus.COMPLETED: "green",
    RunStatus.CANCELLED: "dim",
}


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine; expected errors become a red line and exit 1."""
    try:
        return asyncio.run(main)
    except DurablyError as err:
        err_console.print(safe(f"error: {err}", style="red"))
    except RPCError as err:
        err_console.print(safe(f"error: Temporal refused the request: {err.message}", style="red"))
    raise typer.Exit(1)


def safe(text: str, *, keep_newlines: bool = False, style: str = "") -> Text:
    """Text for the terminal, escape sequences and bidi controls shown, never obeyed."""
    return Text(printable(text, keep_newlines=keep_newlines), style=style)


def table(**options: Any) -> Table:
    """A borderless table: columns line up, lines copy cleanly."""
    return Table(box=None, pad_edge=False, padding=(0, 1), **options)


def status_text(status: RunStatus | None) -> Text:
    if status is None:
        return Text("-")
    return Text(status.value, style=_STATUS_STYLE.get(status, ""))


def fingerprint_text(
    published: str | None, *, width: int | None = None, missing: str = "-"
) -> Text:
    """A published `DurablyFingerprint` as people compare it: without its scheme
    prefix, the same in `durably runs` and `durably versions`."""
    if not published:
        return Text(missing)
    return safe(published.removeprefix(PIN_DIGEST_PREFIX)[:width])


def local_time(value: datetime | None, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    if value is None:
        return "-"
    return value.astimezone().strftime(fmt)


def clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
