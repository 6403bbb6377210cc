"""`durably mcp lock` (write MCP toolsets' lock files) and `durably tools` (what each
registered tool may do: its recovery policy and approval, and where it comes from)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from durably.cli._agents import import_from_cwd
from durably.cli._connection import command
from durably.cli._terminal import console, safe, table
from durably.errors import DurablyError

__all__ = ["lock", "tools"]

Spec = Annotated[
    str,
    typer.Argument(
        help="`module` or `module:attr`: the toolsets, or the registrations using them.",
        show_default=False,
    ),
]


@command
async def lock(
    spec: Spec,
    update: Annotated[
        bool,
        typer.Option(
            "--update",
            help="Also rewrite lock files whose server now lists other tools (the versions "
            "built from them get a new fingerprint: give changed tools a new version).",
        ),
    ] = False,
) -> None:
    """Write the lock file of each MCP toolset SPEC defines, from its server's listing.

    Review the file and commit it with the agent's code: a version's tools
    (and its fingerprint) come from it, so every worker agrees on them. A
    lock that would change is left alone without --update, and the command
    exits 1 saying how.
    """
    from durably.mcp import policy_of
    from durably.mcp._locking import lock_toolsets, toolsets_in

    import_from_cwd()
    kept: list[str] = []
    for toolset, written, changes in await lock_toolsets(toolsets_in(spec), update=update):
        if changes and not update:
            kept += [f"{toolset.lock_path}: {change}" for change in changes]
            continue
        console.print(
            safe(f"{toolset.lock_path}: {len(written.tools)} tool(s) of {toolset.name!r}")
        )
        rows = table()
        for column in ("tool", "annotations", "if trusted"):
            rows.add_column(column)
        for t in written.tools:
            recovery, approval = policy_of(t)
            rows.add_row(
                safe(t.name),
                safe(json.dumps(t.annotations, sort_keys=True)),
                safe(recovery + (", approval" if approval else "")),
            )
        console.print(rows)
    if kept:
        raise DurablyError(
            "these lock files were left as they are, since their servers now list other "
            "tools:\n" + "\n".join(f"  - {line}" for line in kept) + "\nRun again with "
            "--update to rewrite them (register the changed tools under a new version)"
        )


@command
async def tools(
    spec: Annotated[
        str,
        typer.Argument(help="A worker's registrations (`module:attr`, as for --agents)."),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Each registered tool's recovery policy and approval, as runs will pin them."""
    from durably.worker import load_registrations

    import_from_cwd()
    rows: list[dict[str, Any]] = []
    for r in sorted(load_registrations(spec), key=lambda r: (r.agent_id, r.version)):
        by_name = {t.name: t for t in r.agent.tools}
        for name, policy in r.pin().tools.items():
            origin = getattr(by_name.get(name), "origin", None)
            rows.append(
                {
                    "agent_id": r.agent_id,
                    "version": r.version,
                    "tool": name,
                    "recovery": policy.recovery,
                    "requires_approval": policy.requires_approval,
                    "source": (
                        f"mcp:{origin.name}"
                        if origin is not None
                        else ("subagent" if policy.subagent else "function")
                    ),
                }
            )
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    shown = table()
    for column in ("agent", "version", "tool", "recovery", "approval", "source"):
        shown.add_column(column)
    for row in rows:
        shown.add_row(
            safe(row["agent_id"]),
            safe(row["version"]),
            safe(row["tool"]),
            row["recovery"],
            "yes" if row["requires_approval"] else "",
            safe(row["source"]),
        )
    console.print(shown)
