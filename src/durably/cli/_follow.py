"""Commands that watch runs live: `durably follow RUN|SESSION` prints a run's or a
session's events as they happen; `durably observe module:fn` feeds every run's
committed events to your code (`durably.observers`).

Both read by query only (`RunHandle.events`): watching records nothing in a
run's history and never answers or approves anything.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text
from temporalio.service import RPCError

from durably.cli._connection import Connection, command
from durably.cli._terminal import console, local_time, safe
from durably.contract import SESSION_WORKFLOW_TYPE, LiveEvent, LiveItem, LiveText
from durably.errors import RunNotFoundError
from durably.observers import ObserverHost, SqliteCheckpoints, load_observers

Target = Annotated[str, typer.Argument(metavar="RUN|SESSION", help="A run id or a session id.")]

_STYLE = {
    "run_completed": "green",
    "run_failed": "red",
    "needs_attention": "bold red",
    "waiting": "bold yellow",
    "retry_wait": "yellow",
    "run_cancelled": "dim",
}


@command
async def follow(
    watched: Target,
    after: Annotated[
        int | None,
        typer.Option("--after", help="Resume after this offset (the last one you saw)."),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per line, text pieces included.")
    ] = False,
    *,
    conn: Connection,
) -> None:
    """Print a run's (or a session's and its runs') events live until it ends."""
    client = await conn.client()
    try:
        described = await client.temporal.get_workflow_handle(watched).describe()
    except RPCError as err:
        raise RunNotFoundError(f"no run or session {watched!r}: {err.message}") from err
    if described.workflow_type == SESSION_WORKFLOW_TYPE:
        events = (await client.get_session(watched)).events(after=after)
    else:
        events = (await client.get_run(watched)).events(after=after)
    printer = _Printer(as_json)
    async for item in events:
        printer.show(item)
    printer.end()


class _Printer:
    """Pieces of text on one line as they come; each committed event on a line."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.in_text = False

    def show(self, item: LiveItem) -> None:
        if self.as_json:
            print(json.dumps(item.model_dump(mode="json")), flush=True)
            return
        event = item.event
        if isinstance(event, LiveText):
            if not self.in_text:
                console.print(Text(f"  {event.operation}: ", style="dim"), end="")
                self.in_text = True
            console.print(safe(event.text), end="", soft_wrap=True)
            return
        self.end()
        where = f" {event.operation}" if isinstance(event, LiveEvent) and event.operation else ""
        run = f" {event.run_id}" if isinstance(event, LiveEvent) else f" {event.run_id or ''}"
        detail = (event.detail if isinstance(event, LiveEvent) else (event.status or "")) or ""
        line = Text.assemble(
            (f"{item.offset:>5} ", "dim"),
            (f"{local_time(event.at)} ", "dim"),
            (event.type, _STYLE.get(event.type, "bold")),
            where,
            (run if not isinstance(event, LiveEvent) else "", "dim"),
            " ",
        )
        line.append_text(safe(detail[:300]))
        console.print(line)

    def end(self) -> None:
        if self.in_text:
            console.print()
            self.in_text = False


@command
async def observe(
    observers: Annotated[
        str,
        typer.Argument(
            metavar="MODULE:ATTR",
            help="An observer function (of a LiveItem) or a list of them, e.g. myapp.audit:log.",
        ),
    ],
    store: Annotated[
        Path,
        typer.Option("--store", help="The SQLite file where how far it got is kept."),
    ] = Path(".durably/observers.sqlite"),
    *,
    conn: Connection,
) -> None:
    """Feed every run's committed events to your observers, at least once, in order per
    run, until Ctrl-C; a restart goes on where it stopped."""
    from durably.cli._serve import _stop_on_signals

    loaded = load_observers(observers)
    stop = _stop_on_signals()
    checkpoints = SqliteCheckpoints(store)
    host = ObserverHost(await conn.client(), loaded, checkpoints=checkpoints)
    names = ", ".join(getattr(o, "__qualname__", repr(o)) for o in loaded)
    console.print(Text(f"Observing every run with {names} (checkpoints in {store})"))
    console.print("Press Ctrl-C to stop.")
    try:
        await host.run(stop)
    finally:
        checkpoints.close()
    console.print("Observer stopped.")
