"""The `durably` command line.

::

    durably dev --demo                   local Temporal server + a worker with the example agent
    durably worker --agents mod:attr     host your agents on any Temporal cluster
    durably start AGENT INPUT --wait     start a run (and wait for its output)
    durably runs list [--unfinished]     find runs
    durably runs show RUN [--json]       read one run's snapshot
    durably inbox                        what waits for a person, across all runs
    durably approve RUN --as NAME        approve the pending tool call (deny: --reason)
    durably approval-key                 a new key for signed approvals
    durably answer RUN TEXT --as NAME    answer the pending question
    durably resolve RUN OP --json V      supply an interrupted tool call's real result
    durably retry RUN                    run a failed run's failed operation again
    durably cancel RUN                   cancel a run and wait until it has closed

`--target` and `--namespace` default to the standard `TEMPORAL_ADDRESS` /
`TEMPORAL_NAMESPACE` environment variables and Temporal config file, else
`localhost:7233` and `default`. A `DurablyError` prints its message in red
and exits with status 1.

Whatever a model, a tool, a caller or a run wrote (outputs, questions,
arguments, names, ids, error messages) goes through `printable` before it
reaches the terminal, so an escape sequence or bidi control in it shows as
`\x1b` / `\u202e` instead of acting on the operator's terminal. `--json`
output is JSON with every non-ASCII character escaped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
from collections.abc import Coroutine
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import CancelledError, TerminatedError
from temporalio.exceptions import TimeoutError as TemporalTimeoutError
from temporalio.service import RPCError

from durably._text import printable
from durably.agents import AgentRegistration
from durably.approvals import ENV_KEYS, ENV_KEYS_FILE, ApprovalKeys
from durably.client import DurableClient, RunHandle
from durably.contract import (
    DEFAULT_TASK_QUEUE,
    SA_AGENT,
    SA_STATUS,
    WORKFLOW_TYPE,
    RunSnapshot,
    RunStatus,
    RunSummary,
)
from durably.dev import DEFAULT_DB, DevServer
from durably.errors import DurablyError

__all__ = ["app", "main"]

T = TypeVar("T")

app = typer.Typer(
    name="durably",
    help="Durable AI agent runs on Temporal.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
runs_app = typer.Typer(help="Find runs and read them.", no_args_is_help=True)
app.add_typer(runs_app, name="runs")

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

RunId = Annotated[str, typer.Argument(metavar="RUN", help="The run id.")]
Target = Annotated[
    str | None,
    typer.Option(
        "--target",
        help="Temporal address host:port. Default: $TEMPORAL_ADDRESS, the Temporal config "
        "file, else localhost:7233.",
        show_default=False,
    ),
]
Namespace = Annotated[
    str | None,
    typer.Option(
        "--namespace",
        help="Temporal namespace. Default: $TEMPORAL_NAMESPACE, the config file, else default.",
        show_default=False,
    ),
]
TaskQueue = Annotated[str, typer.Option("--task-queue", help="Task queue of durably's workers.")]


# -- long-running commands ---------------------------------------------------------


@app.command()
def worker(
    agents: Annotated[
        str,
        typer.Option(
            "--agents",
            help="Where the registrations are: `module:attr` naming an AgentRegistration, "
            "a list of them, or a function returning them.",
        ),
    ],
    target: Target = None,
    namespace: Namespace = None,
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
    _import_from_cwd()
    cache_bytes = None if cache_mb is None else cache_mb * 2**20
    _run(_worker(agents, target, namespace, task_queue, cache_bytes))


async def _worker(
    agents: str,
    target: str | None,
    namespace: str | None,
    task_queue: str,
    cache_bytes: int | None,
) -> None:
    from durably.worker import run_worker

    stop = _stop_on_signals()
    await run_worker(
        agents,
        target=target,
        namespace=namespace,
        task_queue=task_queue,
        stop=stop,
        transcript_cache_bytes=cache_bytes,
    )
    console.print("Worker stopped.")


@app.command()
def dev(
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
    _import_from_cwd()
    _run(_dev(demo=demo, port=port, ui_port=ui_port, db=db, agents=agents or []))


async def _dev(*, demo: bool, port: int, ui_port: int, db: Path, agents: list[str]) -> None:
    from durably.examples import support_desk
    from durably.worker import load_registrations

    # Every worker on a task queue must host the same agents: the dev worker
    # hosts the example and the user's agents together.
    registrations = list(support_desk.registrations)
    for spec in agents:
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
        err_console.print(_safe(f"Demo run did not complete: {err}", style="red"))
        return
    console.print(_safe(f"Demo output: {result.output}", keep_newlines=True, style="green"))


_DEMO_PROMPT = "My printer queue is stuck"


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


# -- runs -----------------------------------------------------------------------


@app.command()
def start(
    agent_id: Annotated[str, typer.Argument(help="The agent to run.")],
    input: Annotated[str, typer.Argument(help="The user's request.")],
    version: Annotated[
        str | None,
        typer.Option(
            "--version", help="Agent version (default: newest registered).", show_default=False
        ),
    ] = None,
    run_id: Annotated[
        str | None,
        typer.Option(
            "--run-id", help="Run id (default: generated; never reused).", show_default=False
        ),
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait for the run and print its output.")
    ] = False,
    target: Target = None,
    namespace: Namespace = None,
    task_queue: TaskQueue = DEFAULT_TASK_QUEUE,
) -> None:
    """Start a run of AGENT_ID with INPUT."""
    _run(_start(agent_id, input, version, run_id, wait, target, namespace, task_queue))


async def _start(
    agent_id: str,
    input: str,
    version: str | None,
    run_id: str | None,
    wait: bool,
    target: str | None,
    namespace: str | None,
    task_queue: str,
) -> None:
    client = await DurableClient.connect(target, namespace, task_queue)
    run = await client.start_run(agent_id, input, version=version, run_id=run_id)
    console.print(_safe(f"Started run {run.run_id}"))
    if wait:
        result = await run.result()
        console.print(Text(f"Completed after {result.turns} turn(s)", style="green"))
        console.print(_safe(result.output or "", keep_newlines=True))


@app.command()
def cancel(
    run_id: RunId,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait/--no-wait", help="Wait until the run has closed and say how it ended."
        ),
    ] = True,
    timeout: Annotated[
        float, typer.Option("--timeout", help="How long to wait, in seconds.", min=0)
    ] = 30.0,
    target: Target = None,
    namespace: Namespace = None,
) -> None:
    """Cancel a run: a running tool sees its abort signal, then the run ends cancelled.

    Exits with status 1 if the run has not closed within --timeout seconds.
    """
    _run(_cancel(run_id, wait, timeout, target, namespace))


async def _cancel(
    run_id: str, wait: bool, within: float, target: str | None, namespace: str | None
) -> None:
    client = await DurableClient.connect(target, namespace)
    run = await client.get_run(run_id)
    await run.cancel()
    if not wait:
        console.print(
            _safe(
                f"Cancellation of run {run_id} requested; it closes once its running tool or "
                f"model request has stopped (`durably runs show {run_id}`)."
            )
        )
        return
    try:
        async with asyncio.timeout(within):
            ended = await _how_it_closed(client, run_id)
    except TimeoutError:
        await _not_closed(run, within)
        raise typer.Exit(1) from None
    console.print(_safe(f"Run {run_id} {ended}."))


async def _how_it_closed(client: DurableClient, run_id: str) -> str:
    """Wait until the run's workflow closes; how it ended, in words."""
    handle = client.temporal.get_workflow_handle(run_id)
    try:
        await handle.result()
    except WorkflowFailureError as err:
        if isinstance(err.cause, CancelledError):
            return "was cancelled"
        if isinstance(err.cause, TerminatedError):
            return "was terminated"
        if isinstance(err.cause, TemporalTimeoutError):
            return "timed out"
        return f"failed: {err.cause or err}"
    return "completed before the cancellation took effect; its output stays readable"


async def _not_closed(run: RunHandle, waited: float) -> None:
    """Say that the run is still open, what it is doing, and the last resort."""
    try:
        snap = await run.snapshot()
        now = f"it is {snap.status.value}: {snap.current or 'no details'}"
    except DurablyError as err:
        now = f"its snapshot cannot be read ({err})"
    err_console.print(
        _safe(
            f"Run {run.run_id} has not closed {waited:g} s after its cancellation was "
            f"requested; {_clip(printable(now, keep_newlines=True), 300)}",
            style="red",
        )
    )
    err_console.print(
        _safe(
            "It closes once its running tool or model request stops (a tool sees "
            f"ctx.abort_signal). Wait longer (`durably cancel {run.run_id} --timeout 300`) "
            f"or check with `durably runs show {run.run_id}`. Only as a last resort: "
            f"`temporal workflow terminate --workflow-id {run.run_id}` ends it at once, but "
            "terminate skips the run's cleanup: no cancellation is recorded, its "
            "DurablyStatus stays as it is, and a running tool is not waited for."
        )
    )


@app.command()
def resolve(
    run_id: RunId,
    operation: Annotated[
        str,
        typer.Argument(
            metavar="OPERATION",
            help="The blocked operation, e.g. tool:2:call_1 (see `runs show`).",
        ),
    ],
    json_value: Annotated[
        str | None,
        typer.Option(
            "--json",
            help="The call's real result, as JSON (checked against the tool's output schema).",
            show_default=False,
        ),
    ] = None,
    error: Annotated[
        str | None,
        typer.Option(
            "--error",
            help="The call is known to have failed: this message goes to the model.",
            show_default=False,
        ),
    ] = None,
    rerun: Annotated[
        bool,
        typer.Option(
            "--rerun",
            help="You verified the effect did not happen: run the call "
            "once more with the same operation_id.",
        ),
    ] = False,
    target: Target = None,
    namespace: Namespace = None,
) -> None:
    """Resolve an interrupted tool call with its real outcome; the run continues.

    Check the external system first. If the outcome is still unknown, leave
    the run blocked: never make up a result.
    """
    chosen = [
        name
        for name, on in (
            ("--json", json_value is not None),
            ("--error", error is not None),
            ("--rerun", rerun),
        )
        if on
    ]
    if len(chosen) != 1:
        err_console.print(
            Text(
                "error: give exactly one of --json VALUE, --error MESSAGE or --rerun"
                + (f" (got {', '.join(chosen)})" if chosen else ""),
                style="red",
            )
        )
        raise typer.Exit(2)
    resolution: dict[str, Any]
    if json_value is not None:
        try:
            resolution = {"type": "json", "value": json.loads(json_value)}
        except json.JSONDecodeError as err:
            err_console.print(Text(f"error: --json is not valid JSON: {err}", style="red"))
            raise typer.Exit(2) from err
    elif error is not None:
        resolution = {"type": "error", "message": error}
    else:
        resolution = {"type": "rerun"}
    _run(_resolve(run_id, operation, resolution, target, namespace))


async def _resolve(
    run_id: str,
    operation: str,
    resolution: dict[str, Any],
    target: str | None,
    namespace: str | None,
) -> None:
    run = await _handle(run_id, target, namespace)
    await run.resolve_tool(operation, resolution)
    console.print(
        _safe(f"Resolved {operation} of run {run_id} ({resolution['type']}); the run continues.")
    )


@app.command()
def retry(
    run_id: RunId,
    target: Target = None,
    namespace: Namespace = None,
) -> None:
    """Run a failed run's failed operation again (committed results are kept)."""
    _run(_retry(run_id, target, namespace))


async def _retry(run_id: str, target: str | None, namespace: str | None) -> None:
    run = await _handle(run_id, target, namespace)
    accepted = await run.retry()
    what = accepted.operation or "the run"
    console.print(_safe(f"Retrying {what} of run {run_id} (was {accepted.previous_status.value})."))


Responder = Annotated[
    str,
    typer.Option(
        "--as", help="Who is answering (recorded in the run's events).", show_default=False
    ),
]
InteractionId = Annotated[
    str | None,
    typer.Option(
        "--interaction",
        help="The interaction to answer (default: the one pending now).",
        show_default=False,
    ),
]


Digest = Annotated[
    str | None,
    typer.Option(
        "--digest",
        help="The args_digest you reviewed; refused if the call's arguments differ.",
        show_default=False,
    ),
]


@app.command()
def approve(
    run_id: RunId,
    responder: Responder,
    interaction: InteractionId = None,
    digest: Digest = None,
    target: Target = None,
    namespace: Namespace = None,
) -> None:
    """Approve the tool call a run is waiting on; the tool then runs.

    The approval carries the args_digest of the call it was read with (or
    --digest), so it never approves other arguments than the ones printed.
    """
    response: dict[str, Any] = {"type": "tool-approval", "approved": True}
    if digest is not None:
        response["args_digest"] = digest
    _run(_respond(run_id, interaction, response, responder, target, namespace))


@app.command()
def deny(
    run_id: RunId,
    responder: Responder,
    reason: Annotated[
        str | None,
        typer.Option(
            "--reason", help="Why; the model reads `denied: <reason>`.", show_default=False
        ),
    ] = None,
    interaction: InteractionId = None,
    digest: Digest = None,
    target: Target = None,
    namespace: Namespace = None,
) -> None:
    """Deny the tool call a run is waiting on; the tool never runs."""
    response: dict[str, Any] = {"type": "tool-approval", "approved": False}
    if reason is not None:
        response["reason"] = reason
    if digest is not None:
        response["args_digest"] = digest
    _run(_respond(run_id, interaction, response, responder, target, namespace))


@app.command()
def answer(
    run_id: RunId,
    text: Annotated[str, typer.Argument(help="The answer the model will read.")],
    responder: Responder,
    interaction: InteractionId = None,
    target: Target = None,
    namespace: Namespace = None,
) -> None:
    """Answer the question a run is waiting on."""
    response = {"type": "question", "answer": text}
    _run(_respond(run_id, interaction, response, responder, target, namespace))


async def _respond(
    run_id: str,
    interaction_id: str | None,
    response: dict[str, Any],
    responder: str,
    target: str | None,
    namespace: str | None,
) -> None:
    run = await _handle(run_id, target, namespace)
    call: dict[str, Any] | None = None
    if interaction_id is None or response["type"] == "tool-approval":
        snap = await run.snapshot()
        pending = (
            (snap.outcome or {}).get("interaction") if snap.status == RunStatus.WAITING else None
        )
        if interaction_id is None:
            if pending is None:
                raise DurablyError(
                    f"run {run_id} is {snap.status.value} and waits for no approval or answer; "
                    "see `durably inbox`"
                )
            interaction_id = str(pending["id"])
        if response["type"] == "tool-approval":
            call = _reviewed_call(run_id, interaction_id, pending, response)
            if call is not None and call.get("signed"):
                response["token"] = _signed(call, response, responder)
    accepted = await run.respond(interaction_id, response, responder=responder)
    if accepted.type == "question":
        verdict = "answered"
    else:
        verdict = "approved" if accepted.approved else "denied"
    console.print(_safe(f"{interaction_id} of run {run_id}: {verdict} by {accepted.responder}."))
    if call is not None:
        args = json.dumps(call.get("args"), ensure_ascii=False, separators=(",", ":"))
        console.print(_safe(f"  tool {call.get('tool')}, arguments {_clip(args, 300)}"))


def _reviewed_call(
    run_id: str, interaction_id: str, pending: dict[str, Any] | None, response: dict[str, Any]
) -> dict[str, Any] | None:
    """The call an approval or denial is about; its args_digest goes into `response`.

    Without it, a run id reused by another run, or a call that changed since
    the snapshot was read, would get the same decision for other arguments.
    """
    if pending is not None and pending.get("id") == interaction_id:
        response.setdefault("args_digest", pending.get("args_digest"))
        return pending
    if "args_digest" in response:  # the operator names the call by its digest
        return None
    verdict = "approved" if response["approved"] else "denied"
    now = f"it waits on {pending['id']}" if pending is not None else "it waits on none"
    raise DurablyError(
        f"{interaction_id} is not the call run {run_id} waits for approval on ({now}), so "
        f"nothing was {verdict}. Omit --interaction to decide on the pending call, or pass "
        "the --digest you reviewed"
    )


def _signed(call: dict[str, Any], response: dict[str, Any], responder: str) -> str:
    """A token for a call whose registration names approvers (see `durably.approvals`)."""
    keys = ApprovalKeys.from_env()
    if keys is None:
        raise DurablyError(
            f"tool {call.get('tool')} takes only signed decisions, and no approval key is set "
            f"here: set {ENV_KEYS} (or {ENV_KEYS_FILE}) to a key the workers hold, or decide "
            "through the service that signs approvals for you"
        )
    return keys.sign(
        call,
        approved=bool(response["approved"]),
        approver=responder,
        reason=response.get("reason"),
    )


@app.command("approval-key")
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
        err_console.print(_safe(f"error: {err}", style="red"))
        raise typer.Exit(2) from err
    print(line)


@app.command()
def inbox(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    target: Target = None,
    namespace: Namespace = None,
) -> None:
    """Everything waiting for a person, across all runs: approvals, questions,
    blocked operations, failed runs and retry waits."""
    _run(_inbox(as_json, target, namespace))


async def _inbox(as_json: bool, target: str | None, namespace: str | None) -> None:
    client = await DurableClient.connect(target, namespace)
    items = await client.inbox()
    if as_json:
        print(json.dumps([i.model_dump(mode="json") for i in items], indent=2))
        return
    if not items:
        console.print("Nothing waits for a person.")
        return
    table = _table()
    for name in ("run id", "agent", "kind", "since", "waiting for", "id / operation"):
        table.add_column(name, no_wrap=name != "waiting for")
    for i in items:
        table.add_row(
            _safe(i.run_id),
            _safe(i.agent_id or "-"),
            _status_text(i.status) if i.kind in ("failed", "blocked") else Text(i.kind),
            _time(i.since, "%m-%d %H:%M"),
            _safe(i.waiting_for),
            _safe(i.interaction_id or i.operation or ""),
        )
    console.print(table)


@runs_app.command("list")
def runs_list(
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
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    target: Target = None,
    namespace: Namespace = None,
) -> None:
    """List runs, newest first."""
    _run(_runs_list(status, agent, unfinished, limit, as_json, target, namespace))


async def _runs_list(
    status: RunStatus | None,
    agent: str | None,
    unfinished: bool,
    limit: int,
    as_json: bool,
    target: str | None,
    namespace: str | None,
) -> None:
    client = await DurableClient.connect(target, namespace)
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


def _runs_table(runs: list[RunSummary]) -> Table:
    table = _table()
    for name in ("run id", "agent", "status", "started", "closed"):
        table.add_column(name, no_wrap=True)
    for r in runs:
        agent = f"{r.agent_id or '-'}@{r.agent_version}" if r.agent_version else r.agent_id
        table.add_row(
            _safe(r.run_id),
            _safe(agent or "-"),
            _status_text(r.status),
            _time(r.started_at, "%m-%d %H:%M"),
            _time(r.closed_at, "%m-%d %H:%M"),
        )
    return table


@runs_app.command("show")
def runs_show(
    run_id: RunId,
    as_json: Annotated[bool, typer.Option("--json", help="Print the snapshot as JSON.")] = False,
    target: Target = None,
    namespace: Namespace = None,
) -> None:
    """Show a run's snapshot: status, outcome, what it waits for, recent events."""
    _run(_runs_show(run_id, as_json, target, namespace))


async def _runs_show(run_id: str, as_json: bool, target: str | None, namespace: str | None) -> None:
    run = await _handle(run_id, target, namespace)
    snap = await run.snapshot()
    if as_json:  # json.dumps escapes what pydantic leaves raw (C1 and bidi controls)
        print(json.dumps(snap.model_dump(mode="json"), indent=2))
        return
    console.print(_snapshot_view(snap))


def _snapshot_view(snap: RunSnapshot) -> Group:
    """The snapshot as a panel of fields, then its recent events."""
    fields = Table.grid(padding=(0, 2))
    fields.add_column(style="bold", no_wrap=True)
    fields.add_column()

    def row(name: str, value: str | Text | None) -> None:
        if value:
            fields.add_row(name, value if isinstance(value, Text) else _safe(value))

    row("status", _status_text(snap.status))
    row("agent", f"{snap.agent_id}@{snap.agent_version}" if snap.agent_version else snap.agent_id)
    usage = snap.usage
    row(
        "turns",
        f"{snap.turns}  ({usage.requests} model request(s), {usage.input_tokens} input / "
        f"{usage.output_tokens} output tokens)",
    )
    row("now", _safe(snap.current or "", keep_newlines=True))
    outcome = snap.outcome or {}
    if outcome.get("type") == "completed":
        row("output", _safe(str(outcome.get("output") or ""), keep_newlines=True))
    elif outcome:
        row("waiting for", json.dumps(outcome.get("interaction", outcome), ensure_ascii=False))
    row("blocked", snap.blocked_operation)
    if snap.attention is not None:
        detail = snap.attention.detail
        shown = json.dumps(detail, ensure_ascii=False) if detail else ""
        row("attention", f"{snap.attention.reason} {shown}".strip())
    row("next attempt", _time(snap.next_attempt_at) if snap.next_attempt_at else None)
    row("attempt", str(snap.attempt) if snap.attempt else None)
    if snap.error:
        row("error", _safe(snap.error, keep_newlines=True, style="red"))
    panel = Panel(fields, title=escape(printable(f"run {snap.run_id}")), title_align="left")
    if not snap.events:
        return Group(panel)
    events = _table(title_justify="left")
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
            _time(e.at, "%H:%M:%S"),
            _safe(e.type),
            _safe(e.operation or ""),
            Text(_clip(printable(e.detail or "", keep_newlines=True), room)),
        )
    return Group(panel, Text("recent events", style="bold"), events)


# -- helpers ----------------------------------------------------------------------


def _table(**options: Any) -> Table:
    """A borderless table: columns line up, lines copy cleanly."""
    return Table(box=None, pad_edge=False, padding=(0, 1), **options)


async def _handle(run_id: str, target: str | None, namespace: str | None) -> RunHandle:
    """The run named on the command line, on the cluster the options name."""
    client = await DurableClient.connect(target, namespace)
    return await client.get_run(run_id)


def _run(main: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine; expected errors become a red line and exit 1."""
    try:
        return asyncio.run(main)
    except DurablyError as err:
        err_console.print(_safe(f"error: {err}", style="red"))
    except RPCError as err:
        err_console.print(_safe(f"error: Temporal refused the request: {err.message}", style="red"))
    raise typer.Exit(1)


def _safe(text: str, *, keep_newlines: bool = False, style: str = "") -> Text:
    """Text for the terminal, escape sequences and bidi controls shown, never obeyed."""
    return Text(printable(text, keep_newlines=keep_newlines), style=style)


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


def _status_text(status: RunStatus | None) -> Text:
    if status is None:
        return Text("-")
    return Text(status.value, style=_STATUS_STYLE.get(status, ""))


def _time(value: datetime | None, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    if value is None:
        return "-"
    return value.astimezone().strftime(fmt)


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _command(name: str) -> str:
    """How to type `name` here: bare if PATH finds this environment's copy."""
    beside = shutil.which(name, path=str(Path(sys.executable).parent))
    if beside is None or shutil.which(name) == beside:
        return name
    try:
        return str(Path(beside).relative_to(Path.cwd()))
    except ValueError:
        return beside


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
