"""Commands on sessions (SPEC section 13): `session start`, `send`, `session show`,
`session list` and `session close`.

A session is one conversation with one agent; each message `send` submits is a
run that reads every earlier message. `send --wait` waits for that run exactly
as `start --wait` does (`print_result`). What a person or model wrote (a
message, a session or run id someone picked) is shown through `safe`.
"""

from __future__ import annotations

import asyncio
import json
from enum import StrEnum
from typing import Annotated

import typer
from rich.console import Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from durably._text import printable
from durably.cli._connection import Connection, TaskQueue, command
from durably.cli._operate import print_result
from durably.cli._read import AsJson
from durably.cli._terminal import clip, console, local_time, safe, table
from durably.client import DurableClient, RunHandle, SessionHandle
from durably.contract import (
    DEFAULT_TASK_QUEUE,
    SessionRun,
    SessionSnapshot,
    SessionSummary,
)
from durably.errors import DurablyError

SessionId = Annotated[str, typer.Argument(metavar="SESSION", help="The session id.")]

_RUN_STYLE = {
    "queued": "dim",
    "open": "cyan",
    "completed": "green",
    "failed": "bold red",
    "cancelled": "dim",
}


class IfBusy(StrEnum):
    """What `send` does while the session's latest run is still open."""

    REJECT = "reject"
    ENQUEUE = "enqueue"
    INTERRUPT = "interrupt"


@command
async def session_start(
    agent_id: Annotated[str, typer.Argument(metavar="AGENT", help="The agent to talk to.")],
    session_id: Annotated[
        str | None,
        typer.Option(
            "--session-id",
            help="Session id (default: generated; never reused).",
            show_default=False,
        ),
    ] = None,
    version: Annotated[
        str | None,
        typer.Option(
            "--version",
            help="Agent version every run of the session uses (default: newest registered).",
            show_default=False,
        ),
    ] = None,
    *,
    conn: Connection,
    task_queue: TaskQueue = DEFAULT_TASK_QUEUE,
) -> None:
    """Start a session (a conversation) with AGENT; `durably send` talks to it."""
    client = await conn.client(task_queue)
    session = await client.start_session(agent_id, session_id=session_id, version=version)
    console.print(safe(f"Started session {session.session_id}"))


@command
async def send(
    session_id: SessionId,
    text: Annotated[str, typer.Argument(metavar="TEXT", help="The user's next message.")],
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait for the message's run and print its output.")
    ] = False,
    if_busy: Annotated[
        IfBusy,
        typer.Option(
            "--if-busy",
            help="While the session's latest run is open: reject the message (exit 1), "
            "enqueue it to run after the runs before it, or interrupt (cancel) that run.",
        ),
    ] = IfBusy.REJECT,
    upgrade: Annotated[
        bool,
        typer.Option(
            "--upgrade",
            help="Run this message on the newest registered version of the agent; the "
            "session keeps that version from then on.",
        ),
    ] = False,
    *,
    conn: Connection,
) -> None:
    """Send TEXT to a session: a run that reads every earlier message of the session."""
    session = await _session(await conn.client(), session_id)
    run = await session.submit(text, if_busy=if_busy.value, upgrade=upgrade)
    queued = if_busy != IfBusy.REJECT and await _status(session, run.run_id) == "queued"
    if queued:
        console.print(
            safe(f"Queued run {run.run_id}: it starts once the session's earlier runs are done")
        )
    else:
        console.print(safe(f"Started run {run.run_id}"))
    if wait:
        if queued:
            await _until_started(session, run)
        await print_result(run)


async def _session(client: DurableClient, session_id: str) -> SessionHandle:
    """The session named on the command line (`get_session` refuses a run's id)."""
    return await client.get_session(session_id)


async def _status(session: SessionHandle, run_id: str) -> str | None:
    """The run's status as its session knows it (None if the session lists no such run)."""
    runs = (await session.snapshot()).runs
    return next((r.status for r in runs if r.run_id == run_id), None)


async def _until_started(session: SessionHandle, run: RunHandle) -> None:
    """Wait while the session keeps the run queued (the run does not exist till then)."""
    delay = 0.2
    while await _status(session, run.run_id) == "queued":
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, 2.0)


@command
async def session_show(
    session_id: SessionId,
    as_json: Annotated[bool, typer.Option("--json", help="Print the snapshot as JSON.")] = False,
    *,
    conn: Connection,
) -> None:
    """Show a session: its runs in order, the conversation's size, whether it is closing."""
    client = await conn.client()
    snap = await (await _session(client, session_id)).snapshot()
    if as_json:  # json.dumps escapes what pydantic leaves raw (C1 and bidi controls)
        print(json.dumps(snap.model_dump(mode="json"), indent=2))
        return
    console.print(_session_view(snap, await _open_statuses(client, snap)))


async def _open_statuses(client: DurableClient, snap: SessionSnapshot) -> dict[str, str]:
    """What each open run is doing (`waiting`, `failed`, …): the session only knows `open`."""

    async def status(run_id: str) -> str | None:
        try:
            return (await RunHandle(client.temporal, run_id).snapshot()).status.value
        except DurablyError:
            return None  # shown as plain `open`

    open_ids = [r.run_id for r in snap.runs if r.status == "open"]
    found = await asyncio.gather(*map(status, open_ids))
    return {run_id: s for run_id, s in zip(open_ids, found, strict=True) if s is not None}


def _session_view(snap: SessionSnapshot, doing: dict[str, str]) -> Group:
    """The session as a panel of fields, then its runs."""
    fields = Table.grid(padding=(0, 2))
    fields.add_column(style="bold", no_wrap=True)
    fields.add_column()
    fields.add_row(
        "agent", safe(f"{snap.agent_id}@{snap.version}" if snap.version else snap.agent_id)
    )
    fields.add_row("runs", str(len(snap.runs)))
    fields.add_row("messages", f"{snap.messages} in the conversation")
    if snap.closing:
        fields.add_row("closing", "yes: takes no more messages; closes once its runs are done")
    if snap.error:
        fields.add_row("error", safe(snap.error, keep_newlines=True, style="red"))
    panel = Panel(fields, title=escape(printable(f"session {snap.session_id}")), title_align="left")
    if not snap.runs:
        return Group(panel)
    return Group(panel, Text("runs", style="bold"), _runs_table(snap.runs, doing))


def _runs_table(runs: list[SessionRun], doing: dict[str, str]) -> Table:
    rows = table()
    for name in ("#", "run id", "status", "offset", "length", "input"):
        rows.add_column(name, no_wrap=True, justify="right" if name == "#" else "left")
    width = max(20, console.width - 80)
    for n, r in enumerate(runs, 1):
        status = Text(r.status, style=_RUN_STYLE.get(r.status, ""))
        if r.run_id in doing:
            status.append(f" ({doing[r.run_id]})")
        rows.add_row(
            str(n),
            safe(r.run_id),
            status,
            "-" if r.offset is None else str(r.offset),
            "-" if r.length is None else str(r.length),
            Text(clip(printable(r.input), width)),
        )
    return rows


@command
async def session_list(
    agent: Annotated[
        str | None,
        typer.Option("--agent", help="Only sessions with this agent.", show_default=False),
    ] = None,
    open_only: Annotated[
        bool, typer.Option("--open", help="Only sessions that are not closed.")
    ] = False,
    limit: Annotated[int, typer.Option("--limit", help="At most this many sessions.")] = 50,
    as_json: AsJson = False,
    *,
    conn: Connection,
) -> None:
    """List sessions, newest first."""
    client = await conn.client()
    sessions = await client.list_sessions(agent_id=agent, open_only=open_only, limit=limit)
    if as_json:
        print(json.dumps([s.model_dump(mode="json") for s in sessions], indent=2))
        return
    if not sessions:
        console.print("No sessions found.")
        return
    console.print(_sessions_table(sessions))


def _sessions_table(sessions: list[SessionSummary]) -> Table:
    rows = table()
    for name in ("session id", "agent", "state", "started", "closed"):
        rows.add_column(name, no_wrap=True)
    for s in sessions:
        rows.add_row(
            safe(s.session_id),
            safe(s.agent_id or "-"),
            Text("open", style="cyan") if s.open else Text("closed", style="dim"),
            local_time(s.started_at, "%m-%d %H:%M"),
            local_time(s.closed_at, "%m-%d %H:%M"),
        )
    return rows


@command
async def session_close(session_id: SessionId, *, conn: Connection) -> None:
    """Close a session: it takes no more messages, and ends once its runs are done."""
    session = await _session(await conn.client(), session_id)
    snap = await session.close()
    pending = [r.run_id for r in snap.runs if r.status in ("open", "queued")]
    if pending:
        console.print(
            safe(
                f"Session {session_id} is closing: it takes no more messages and ends once "
                f"run(s) {', '.join(pending)} are done."
            )
        )
    else:
        console.print(safe(f"Session {session_id} is closed: it takes no more messages."))
