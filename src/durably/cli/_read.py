"""Commands that read runs and render them: `inbox`, `runs list`, `runs show`,
`runs stats`.

A run that belongs to a session shows its session id in `inbox` and `runs list`
(a `session` column, only when some listed run has one).

`--json` output is JSON with every non-ASCII character escaped (`json.dumps`
escapes what pydantic leaves raw, C1 and bidi controls among it); tables and
panels show text through `safe`/`printable`.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from durably._text import printable
from durably.cli._connection import Connection, RunId, command
from durably.cli._terminal import (
    clip,
    console,
    fingerprint_text,
    local_time,
    safe,
    status_text,
    table,
)
from durably.client import DurableClient
from durably.contract import OtherAttention, RunSnapshot, RunStatus, RunSummary
from durably.errors import DurablyError
from durably.messages import Usage

AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


@command
async def inbox(
    as_json: AsJson = False,
    task_queue: Annotated[
        str | None,
        typer.Option(
            "--task-queue",
            help="Only the runs of this task queue (one deployment); default: every run.",
            show_default=False,
        ),
    ] = None,
    *,
    conn: Connection,
) -> None:
    """Everything waiting for a person, across all runs: approvals, questions,
    blocked operations, failed runs and retry waits, one line each (a run whose
    turn holds several shows several)."""
    items = await (await conn.client()).inbox(task_queue=task_queue)
    if as_json:
        print(json.dumps([i.model_dump(mode="json") for i in items], indent=2))
        return
    if not items:
        console.print("Nothing waits for a person.")
        return
    rows = table()
    sessions = any(i.session_id for i in items)  # a column only if some run is a session's
    for name in ("run id", *(["session"] if sessions else []), "agent", "kind", "since"):
        rows.add_column(name, no_wrap=True)
    rows.add_column("waiting for")
    rows.add_column("id / operation", no_wrap=True)
    for i in items:
        rows.add_row(
            safe(i.run_id),
            *([safe(i.session_id or "-")] if sessions else []),
            safe(i.agent_id or "-"),
            _kind_text(i.kind),
            local_time(i.since, "%m-%d %H:%M"),
            safe(i.waiting_for),
            safe(i.interaction_id or i.operation or ""),
        )
    console.print(rows)


# A blocked or failed item shows in its status's colour. Not the run's status: under
# the parallel-tools patch one run can hold blocked, failed and pending items at once.
_KIND_STATUS = {"blocked": RunStatus.NEEDS_ATTENTION, "failed": RunStatus.FAILED}


def _kind_text(kind: str) -> Text:
    status = _KIND_STATUS.get(kind)
    return status_text(status) if status is not None else Text(kind)


@command
async def runs_list(
    status: Annotated[
        RunStatus | None,
        typer.Option("--status", help="Only runs in this status.", show_default=False),
    ] = None,
    agent: Annotated[
        str | None, typer.Option("--agent", help="Only runs of this agent.", show_default=False)
    ] = None,
    unfinished: Annotated[
        bool, typer.Option("--unfinished", help="Only runs that are not completed or cancelled.")
    ] = False,
    limit: Annotated[int, typer.Option("--limit", help="At most this many runs.")] = 50,
    as_json: AsJson = False,
    *,
    conn: Connection,
) -> None:
    """List runs, newest first."""
    client = await conn.client()
    runs = await client.list_runs(
        status=status, agent_id=agent, unfinished=True if unfinished else None, limit=limit
    )
    if as_json:
        print(json.dumps([r.model_dump(mode="json") for r in runs], indent=2))
        return
    if not runs:
        console.print("No runs found.")
        return
    console.print(_runs_table(runs))


@command
async def runs_stats(
    agent: Annotated[
        str | None, typer.Option("--agent", help="Only runs of this agent.", show_default=False)
    ] = None,
    task_queue: Annotated[
        str | None,
        typer.Option("--task-queue", help="Only runs on this task queue.", show_default=False),
    ] = None,
    as_json: AsJson = False,
    *,
    conn: Connection,
) -> None:
    """How many runs are in each status, from visibility.

    A run counts once; an unfinished status (running, waiting, ...) counts open
    runs only."""
    stats = await (await conn.client()).run_stats(agent_id=agent, task_queue=task_queue)
    if as_json:
        print(json.dumps({s.value: n for s, n in stats.items()}, indent=2))
        return
    rows = table()
    rows.add_column("status", no_wrap=True)
    rows.add_column("runs", justify="right")
    for status, count in stats.items():
        rows.add_row(status_text(status), str(count))
    rows.add_row(Text("total", style="bold"), Text(str(sum(stats.values())), style="bold"))
    console.print(rows)


@command
async def runs_show(
    run_id: RunId,
    as_json: Annotated[bool, typer.Option("--json", help="Print the snapshot as JSON.")] = False,
    *,
    conn: Connection,
) -> None:
    """Show a run's snapshot: status, outcome, what it waits for, recent events."""
    client = await conn.client()
    snap = await (await client.get_run(run_id)).snapshot()
    if as_json:  # json.dumps escapes what pydantic leaves raw (C1 and bidi controls)
        print(json.dumps(snap.model_dump(mode="json"), indent=2))
        return
    console.print(_snapshot_view(snap))
    if snap.children or snap.parent_run_id:
        console.print(await _run_tree(client, snap))


async def _run_tree(client: DurableClient, snap: RunSnapshot, depth: int = 4) -> Tree:
    """The run, its parent, and its open subagent runs and theirs, as a tree."""
    label = Text.assemble(safe(snap.run_id), " ", status_text(snap.status))
    if snap.parent_run_id:
        label.append_text(
            Text.assemble(("  (subagent of ", "dim"), safe(snap.parent_run_id), (")", "dim"))
        )
    tree = Tree(label)
    await _add_children(client, tree, snap, depth)
    return tree


async def _add_children(client: DurableClient, tree: Tree, snap: RunSnapshot, depth: int) -> None:
    for child in snap.children:
        line = Text.assemble(safe(child.run_id), " ", (child.status, "bold"))
        if child.detail:
            line.append_text(Text.assemble(" ", safe(child.detail[:120])))
        branch = tree.add(line)
        if depth > 1:
            try:
                child_snap = await (await client.get_run(child.run_id)).snapshot()
            except DurablyError:
                continue
            await _add_children(client, branch, child_snap, depth - 1)


def _runs_table(runs: list[RunSummary]) -> Table:
    rows = table()
    sessions = any(r.session_id for r in runs)  # a column only if some run is a session's
    names = ("run id", *(["session"] if sessions else []), "agent", "fingerprint", "status")
    for name in (*names, "started", "closed"):
        rows.add_column(name, no_wrap=True)
    for r in runs:
        agent = f"{r.agent_id or '-'}@{r.agent_version}" if r.agent_version else r.agent_id
        rows.add_row(
            safe(r.run_id),
            *([safe(r.session_id or "-")] if sessions else []),
            safe(agent or "-"),
            # Its first digits (--json has it whole).
            fingerprint_text(r.fingerprint, width=8),
            status_text(r.status),
            local_time(r.started_at, "%m-%d %H:%M"),
            local_time(r.closed_at, "%m-%d %H:%M"),
        )
    return rows


def _snapshot_view(snap: RunSnapshot) -> Group:
    """The snapshot as a panel of fields, then its recent events."""
    panel = Panel(
        _snapshot_fields(snap),
        title=escape(printable(f"run {snap.run_id}")),
        title_align="left",
    )
    if not snap.events:
        return Group(panel)
    return Group(panel, Text("recent events", style="bold"), _events_table(snap))


def _snapshot_fields(snap: RunSnapshot) -> Table:
    fields = Table.grid(padding=(0, 2))
    fields.add_column(style="bold", no_wrap=True)
    fields.add_column()

    def row(name: str, value: str | Text | None) -> None:
        if value:
            fields.add_row(name, value if isinstance(value, Text) else safe(value))

    row("status", status_text(snap.status))
    row("agent", f"{snap.agent_id}@{snap.agent_version}" if snap.agent_version else snap.agent_id)
    row("turns", f"{snap.turns}" + (f" of {snap.max_turns}" if snap.max_turns else ""))
    row("usage", usage_text(snap.usage))
    if snap.limits is not None:
        limits = snap.limits.model_dump(exclude_none=True)
        row("limits", ", ".join(f"{name} {value:g}" for name, value in limits.items()) or None)
    row("now", safe(snap.current or "", keep_newlines=True))
    if snap.output is not None:
        row("output", safe(snap.output, keep_newlines=True))
    for pending in snap.interactions:
        row("waiting for", json.dumps(pending.model_dump(mode="json"), ensure_ascii=False))
    row("blocked", ", ".join(snap.blocked_operations) or snap.blocked_operation)
    row("failed", ", ".join(snap.failed_operations) or None)
    if snap.attention is not None:
        hidden = {"reason"} if isinstance(snap.attention, OtherAttention) else {"reason", "detail"}
        fields_shown = snap.attention.model_dump(mode="json", exclude=hidden)
        shown = json.dumps(fields_shown, ensure_ascii=False) if fields_shown else ""
        row("attention", f"{snap.attention.reason} {shown}".strip())
    row("next attempt", local_time(snap.next_attempt_at) if snap.next_attempt_at else None)
    row("attempt", str(snap.attempt) if snap.attempt else None)
    row("trace", snap.trace_id)
    if snap.error:
        row("error", safe(snap.error, keep_newlines=True, style="red"))
    return fields


def usage_text(usage: Usage) -> str:
    """What a run used, in one line: requests, tokens (cached, reasoning), tools, cost."""
    tokens = f"{usage.input_tokens:,} input"
    if usage.cached_input_tokens:
        tokens += f" ({usage.cached_input_tokens:,} cached)"
    tokens += f" / {usage.output_tokens:,} output"
    if usage.reasoning_tokens:
        tokens += f" ({usage.reasoning_tokens:,} reasoning)"
    text = f"{usage.requests} model request(s), {tokens} tokens, {usage.tool_calls} tool call(s)"
    return text + (f", ${usage.cost_usd:,.4f}" if usage.cost_usd else "")


def _events_table(snap: RunSnapshot) -> Table:
    events = table(title_justify="left")
    for name in ("#", "at", "event", "operation", "detail"):
        events.add_column(name, no_wrap=True, justify="right" if name == "#" else "left")
    # Clip details to what is left of the line, so the other columns stay whole.
    used = sum(
        max(len(text) for text in column)
        for column in (
            [str(e.seq) for e in snap.events],
            ["00:00:00"],
            [printable(e.type) for e in snap.events],
            [printable(e.operation or "") for e in snap.events],
        )
    )
    room = max(20, console.width - used - 4 * 2)
    for e in snap.events:
        events.add_row(
            str(e.seq),
            local_time(e.at, "%H:%M:%S"),
            safe(e.type),
            safe(e.operation or ""),
            Text(clip(printable(e.detail or "", keep_newlines=True), room)),
        )
    return events
