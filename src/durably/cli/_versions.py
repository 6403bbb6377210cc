"""`durably versions`: the registrations unfinished runs pinned, and a worker's.

The seed's startup recipe, checkable before a deploy: `durably versions
--needed --agents myapp.agents:registrations` lists every `(agent, version,
fingerprint)` the task queue's unfinished runs pinned and whether those
registrations host each as pinned, exiting 1 when one is missing or differs.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from durably.cli._agents import import_from_cwd
from durably.cli._connection import Connection, TaskQueue, command
from durably.cli._terminal import console, fingerprint_text, safe, table
from durably.client import NeededVersion
from durably.contract import DEFAULT_TASK_QUEUE
from durably.errors import DurablyError

_CHECK_STYLE = {
    "matches": ("matches", "green"),
    "differs": ("differs", "bold red"),
    "not_hosted": ("not hosted", "bold red"),
    "fingerprint_unknown": ("fingerprint unknown", "yellow"),
    "unpinned": ("not pinned yet", ""),
}


@command
async def versions(
    needed: Annotated[
        bool,
        typer.Option(
            "--needed",
            help="List the (agent, version, fingerprint) the task queue's unfinished runs pinned.",
        ),
    ] = False,
    agents: Annotated[
        str | None,
        typer.Option(
            "--agents",
            help="A worker's registrations (`module:attr`, as for `durably worker`): list "
            "them, or with --needed check them against what the runs pinned.",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    *,
    conn: Connection,
    task_queue: TaskQueue = DEFAULT_TASK_QUEUE,
) -> None:
    """The versions unfinished runs need (--needed), and whether the registrations at
    --agents host each as pinned; exits 1 when one is missing or differs."""
    from durably.worker import load_registrations

    if not needed and agents is None:
        raise DurablyError(
            "nothing to show: pass --needed (what unfinished runs pinned), --agents "
            "module:attr (a worker's registrations), or both (are they the same?)"
        )
    registrations = None
    if agents is not None:
        import_from_cwd()
        registrations = load_registrations(agents)
    if not needed:
        assert registrations is not None
        hosted = sorted(registrations, key=lambda r: (r.agent_id, r.version))
        if as_json:
            rows = [
                {"agent_id": r.agent_id, "version": r.version, "fingerprint": r.pin_check}
                for r in hosted
            ]
            print(json.dumps(rows, indent=2))
            return
        shown = table()
        for name in ("agent", "version", "fingerprint"):
            shown.add_column(name, no_wrap=True)
        for r in hosted:
            shown.add_row(safe(r.agent_id), safe(r.version), fingerprint_text(r.pin_check))
        console.print(shown)
        return
    client = await conn.client(task_queue)
    found = await client.needed_versions(registrations)
    if as_json:
        print(json.dumps([n.model_dump(mode="json") for n in found], indent=2))
    elif not found:
        console.print(f"No unfinished runs on task queue {task_queue!r}.")
    else:
        console.print(_needed_table(found, checked=registrations is not None))
    if not all(n.ok for n in found):
        raise typer.Exit(1)


def _needed_table(found: list[NeededVersion], *, checked: bool) -> Table:
    rows = table()
    names = ["agent", "version", "fingerprint", "runs", "example run"]
    if checked:
        names += ["these agents", "changed"]
    for name in names:
        rows.add_column(
            name, no_wrap=name != "changed", justify="right" if name == "runs" else "left"
        )
    for n in found:
        cells: list[str | Text] = [
            safe(n.agent_id or "-"),
            safe(n.version or "-"),
            fingerprint_text(n.fingerprint, missing="unknown" if n.version else "-"),
            str(n.runs),
            safe(n.example_run_id),
        ]
        if checked and n.check is not None:
            label, style = _CHECK_STYLE[n.check]
            changed = ", ".join(n.changed) if n.changed is not None else "unknown"
            cells += [Text(label, style=style), safe(changed if n.check == "differs" else "")]
        rows.add_row(*cells)
    return rows
