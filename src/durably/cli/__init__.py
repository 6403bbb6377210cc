"""The `durably` command line.

::

    durably dev --demo                   local Temporal server + a worker with the example agent
    durably setup                        register durably's search attributes on a namespace
    durably worker --agents mod:attr     host your agents on any Temporal cluster
    durably start AGENT INPUT --wait     start a run (and wait for its output)
    durably runs list [--unfinished]     find runs
    durably versions --needed            what unfinished runs pinned (--agents: hosted as such?)
    durably runs show RUN [--json]       read one run's snapshot
    durably runs stats                   how many runs are in each status
    durably inbox                        what waits for a person, across all runs
    durably follow RUN|SESSION           its events live, the model's text as it is written
    durably serve                        live events over HTTP (SSE) for browsers and apps
    durably observe MODULE:ATTR          feed every run's committed events to your code
    durably approve RUN --as NAME        approve the pending tool call (deny: --reason)
    durably approve RUN --all --as NAME  approve every pending tool call at once (or deny)
    durably approval-key                 a new key for signed approvals
    durably encryption-key               a new key for encrypted payloads
    durably codec-server                 decode encrypted runs for the Web UI and `temporal`
    durably answer RUN TEXT --as NAME    answer the pending question
    durably resolve RUN OP --json V      supply an interrupted tool call's real result
    durably retry RUN                    run a failed run's failed operation again
    durably raise-limits RUN NAME=VALUE  raise a run's usage limits (budget_exceeded)
    durably repair RUN --as NAME         bring back a run whose history does not replay
    durably mcp lock MODULE[:ATTR]       write MCP toolsets' lock files from their servers
    durably tools MODULE:ATTR            each registered tool's recovery policy and approval
    durably cancel RUN                   cancel a run and wait until it has closed
    durably session start AGENT          start a session: one conversation, a run per message
    durably send SESSION TEXT --wait     the session's next message (--if-busy enqueue)
    durably session show SESSION         a session's runs in order, its conversation's size
    durably session list [--open]        find sessions
    durably session close SESSION        take no more messages; end once its runs are done

`--target`, `--namespace` and `--profile` go before the command or after it
(`durably --target H approve RUN` or `durably approve RUN --target H`); they
default to the standard `TEMPORAL_ADDRESS` / `TEMPORAL_NAMESPACE` environment
variables and Temporal config file (its profile `--profile`, else
`$TEMPORAL_PROFILE`, else `default`), else `localhost:7233` and `default`. A
`DurablyError` prints its message in red and exits with status 1. Every
command that connects encrypts and decrypts payloads with the keys in
`DURABLY_ENCRYPTION_KEYS` (or `DURABLY_ENCRYPTION_KEYS_FILE`), if set.

One job per module: `_connection` (the connection options, declared once, and
how an `async def` becomes a command), `_agents` (where `--agents module:attr`
is imported from), `_operate` (commands that change runs), `_read` (commands
that read and render them), `_sessions` (commands on sessions), `_serve`
(worker, dev server, approval keys), `_codec` (the codec server, encryption
keys), `_setup` (a namespace's search attributes), `_versions` (the versions
runs need), `_terminal` (what reaches the terminal).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys

import typer

from durably.cli import (
    _codec,
    _follow,
    _mcp,
    _operate,
    _read,
    _serve,
    _sessions,
    _setup,
    _versions,
    _web,
)
from durably.cli._connection import connection_options

__all__ = ["app", "main"]

app = typer.Typer(
    name="durably",
    help="Durable AI agent runs on Temporal.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
app.callback()(connection_options)
runs_app = typer.Typer(help="Find runs and read them.", no_args_is_help=True)
app.add_typer(runs_app, name="runs")
session_app = typer.Typer(
    help="Sessions: conversations, a run per message (`durably send`).", no_args_is_help=True
)
app.add_typer(session_app, name="session")
mcp_app = typer.Typer(help="MCP tool servers: lock what they serve.", no_args_is_help=True)
app.add_typer(mcp_app, name="mcp")

app.command()(_setup.setup)
app.command()(_serve.worker)
app.command()(_serve.dev)
app.command()(_operate.start)
app.command()(_operate.cancel)
app.command()(_operate.resolve)
app.command()(_operate.retry)
app.command(name="raise-limits")(_operate.raise_limits)
app.command()(_operate.repair)
app.command()(_operate.approve)
app.command()(_operate.deny)
app.command()(_operate.answer)
app.command("approval-key")(_serve.approval_key)
app.command("encryption-key")(_codec.encryption_key)
app.command("codec-server")(_codec.codec_server)
app.command()(_read.inbox)
app.command()(_follow.follow)
app.command()(_follow.observe)
app.command()(_web.serve)
app.command()(_versions.versions)
app.command()(_mcp.tools)
mcp_app.command("lock")(_mcp.lock)
runs_app.command("list")(_read.runs_list)
runs_app.command("show")(_read.runs_show)
runs_app.command("stats")(_read.runs_stats)
app.command()(_sessions.send)
session_app.command("start")(_sessions.session_start)
session_app.command("show")(_sessions.session_show)
session_app.command("list")(_sessions.session_list)
session_app.command("close")(_sessions.session_close)


def main(argv: list[str] | None = None) -> None:
    """The `durably` console script (also `python -m durably`).

    The process ends with `os._exit` once output is flushed: the Temporal
    client's native threads can crash CPython's interpreter teardown
    (temporalio/sdk-python#300), which would turn a clean exit into a
    SIGSEGV/SIGABRT status.
    """
    code = 0
    try:
        app(args=argv, prog_name="durably")
    except SystemExit as exit:
        if isinstance(exit.code, str):
            print(exit.code, file=sys.stderr)
            code = 1
        else:
            code = exit.code or 0
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
    os._exit(code)
