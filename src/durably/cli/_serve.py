"""Commands that serve: `worker`, `dev` (a local server plus a worker) and
`approval-key` (a key for the workers that check signed approvals).

Both long-running commands stop on Ctrl-C or SIGTERM: the worker drains, then
(for `dev`) the server stops, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.text import Text
from temporalio.client import Client
from temporalio.service import RPCError

from durably.agents import AgentRegistration
from durably.approvals import ApprovalKeys
from durably.cli._connection import Connection, TaskQueue, command
from durably.cli._terminal import console, err_console, safe
from durably.client import DurableClient
from durably.contract import DEFAULT_TASK_QUEUE, SA_AGENT, SA_STATUS, WORKFLOW_TYPE
from durably.dev import DEFAULT_DB, DevServer
from durably.errors import DurablyError

T = TypeVar("T")

_DEMO_PROMPT = "My printer queue is stuck"


@command
async def worker(
    agents: Annotated[
        str,
        typer.Option(
            "--agents",
            help="Where the registrations are: `module:attr` naming an AgentRegistration, "
            "a list of them, or a function returning them.",
        ),
    ],
    *,
    conn: Connection,
    task_queue: TaskQueue = DEFAULT_TASK_QUEUE,
    cache_mb: Annotated[
        int | None,
        typer.Option(
            "--transcript-cache-mb",
            help="Bound of the worker's transcript cache in MiB (default 256; 0 turns it off).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Host the agents at `module:attr` until Ctrl-C or SIGTERM, then drain and exit.

    Signed approvals are checked with the keys in $DURABLY_APPROVAL_KEYS (or the
    file $DURABLY_APPROVAL_KEYS_FILE names).
    """
    from durably.worker import run_worker

    _import_from_cwd()
    await run_worker(
        agents,
        target=conn.target,
        namespace=conn.namespace,
        task_queue=task_queue,
        stop=_stop_on_signals(),
        transcript_cache_bytes=None if cache_mb is None else cache_mb * 2**20,
    )
    console.print("Worker stopped.")


@command
async def dev(
    demo: Annotated[
        bool, typer.Option("--demo", help="Start a run of the example agent and show its result.")
    ] = False,
    port: Annotated[int, typer.Option("--port", help="gRPC port of the Temporal server.")] = 7233,
    ui_port: Annotated[int, typer.Option("--ui-port", help="Port of the Temporal Web UI.")] = 8233,
    db: Annotated[
        Path, typer.Option("--db", help="SQLite file the server persists to (kept across runs).")
    ] = DEFAULT_DB,
    agents: Annotated[
        list[str] | None,
        typer.Option(
            "--agents",
            help="Also host the registrations at `module:attr` (repeatable).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run a local Temporal dev server and a worker hosting the support-desk example.

    The database is kept, so a rerun finds earlier runs and the worker finishes
    unfinished ones. Ctrl-C stops the worker, then the server.
    """
    from durably.examples import support_desk
    from durably.worker import load_registrations

    _import_from_cwd()
    # Every worker on a task queue must host the same agents: the dev worker
    # hosts the example and the user's agents together.
    registrations = list(support_desk.registrations)
    for spec in agents or []:
        registrations += load_registrations(spec)
    stop = _stop_on_signals()
    server = DevServer(db=db, port=port, ui_port=ui_port)
    console.print(f"Starting the Temporal dev server on {server.address} (database {db}) …")
    try:
        temporal = await _until(stop, server.start())
        if temporal is not None:
            await _serve(temporal, server, stop, registrations, demo=demo)
        console.print("Stopping the Temporal dev server …")
    finally:
        await server.stop()
    console.print("Stopped.")


def approval_key(
    key_id: Annotated[
        str, typer.Option("--id", help="The key's name (rotate by adding a new name first).")
    ] = "k1",
) -> None:
    """Print a new random approval key as ID:BASE64, for DURABLY_APPROVAL_KEYS.

    Workers check signed approvals with it; whoever holds it can sign as any
    approver, so give it to your approval service, not to people.
    """
    line = f"{key_id}:{ApprovalKeys.generate_key()}"
    try:
        ApprovalKeys.parse(line)  # checks the id
    except DurablyError as err:
        err_console.print(safe(f"error: {err}", style="red"))
        raise typer.Exit(2) from err
    print(line)


async def _serve(
    temporal: Client,
    server: DevServer,
    stop: asyncio.Event,
    registrations: list[AgentRegistration],
    *,
    demo: bool,
) -> None:
    """Host `registrations` on `temporal` until `stop`; the worker drains before returning."""
    from durably.examples import support_desk
    from durably.worker import DurableRuntime

    runtime = await DurableRuntime.open(client=DurableClient(temporal), agents=registrations)
    try:
        await runtime.resume()
        _banner(server, runtime.registry.describe())
        await _report_unfinished(runtime.client)
        if demo:
            await _until(stop, _demo(runtime.client, server, support_desk.demo_input()))
        if not stop.is_set():
            console.print("Serving. Press Ctrl-C to stop.")
    except BaseException:
        await runtime.close()
        raise
    await runtime.serve(stop)
    console.print("Worker stopped.")


async def _demo(client: DurableClient, server: DevServer, text: str) -> None:
    from durably.examples.support_desk import AGENT_ID

    run = await client.start_run(AGENT_ID, text)
    console.print(Text(f"Demo run: {run.run_id}", style="bold"))
    console.print(Text(f"  Web UI: {server.workflow_url(run.run_id)}"))
    console.print(Text(f"  Input:  {text}"))
    try:
        result = await run.result()
    except DurablyError as err:
        err_console.print(safe(f"Demo run did not complete: {err}", style="red"))
        return
    console.print(safe(f"Demo output: {result.output}", keep_newlines=True, style="green"))


def _banner(server: DevServer, agents: str) -> None:
    """What runs where, and how to start a run; plain lines, so commands copy cleanly."""
    from durably.examples.support_desk import AGENT_ID

    default_port = server.port == 7233
    address = "" if default_port else f" --address {server.address}"
    target = "" if default_port else f" --target {server.address}"
    start_input = json.dumps(
        {"agent_id": AGENT_ID, "input": _DEMO_PROMPT, "version": None},
        separators=(",", ":"),
    )
    durably, temporal = _command("durably"), _command("temporal")
    console.print(Text("durably dev is running", style="bold green"))
    for name, value in (
        ("Temporal server", f"{server.address} (namespace {server.namespace})"),
        ("Database", f"{server.db} (server log: {server.log_path})"),
        ("Web UI", server.ui_url),
        ("Worker", f"task queue {DEFAULT_TASK_QUEUE}, agents {agents}"),
    ):
        console.print(Text.assemble("  ", (f"{name:<17}", "bold"), value))
    console.print(Text("Start a run:", style="bold"))
    console.print(Text(f"  {durably} start {AGENT_ID} '{_DEMO_PROMPT}'{target} --wait"))
    console.print(
        Text(
            f"  {temporal} workflow start --type {WORKFLOW_TYPE} --task-queue "
            f"{DEFAULT_TASK_QUEUE}{address} --input '{start_input}'"
        )
    )
    console.print(
        Text.assemble(
            ("Find runs: ", "bold"),
            f"{durably} runs list{target}, or the Web UI (search attributes "
            f"{SA_STATUS.name}, {SA_AGENT.name})",
        )
    )


async def _report_unfinished(client: DurableClient) -> None:
    try:
        unfinished = await client.list_runs(unfinished=True, limit=100)
    except (RPCError, DurablyError):
        return
    if unfinished:
        console.print(
            f"{len(unfinished)} unfinished run(s) in this database; the worker continues "
            "those that can run (see `durably runs list --unfinished`)."
        )


def _stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT (Ctrl-C) or SIGTERM, for a clean shutdown."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    first: list[float] = []

    def on_signal() -> None:
        # A child forked at that instant can relay the same signal once more
        # (it shares the loop's wakeup fd until exec): answer only a real repeat.
        if first and loop.time() - first[0] > 1.0:
            console.print("Already stopping; waiting for the worker and server to exit …")
        first.append(loop.time())
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, on_signal)
        except (NotImplementedError, RuntimeError):  # no signal support in this loop
            signal.signal(sig, lambda *_: loop.call_soon_threadsafe(on_signal))
    return stop


async def _until(stop: asyncio.Event, work: Coroutine[Any, Any, T]) -> T | None:
    """Await `work` unless `stop` is set first (then cancel it and return None)."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


def _import_from_cwd() -> None:
    """Resolve `module:attr` from the working directory, as `python -m` does."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def _command(name: str) -> str:
    """How to type `name` here: bare if PATH finds this environment's copy."""
    beside = shutil.which(name, path=str(Path(sys.executable).parent))
    if beside is None or shutil.which(name) == beside:
        return name
    try:
        return str(Path(beside).relative_to(Path.cwd()))
    except ValueError:
        return beside
