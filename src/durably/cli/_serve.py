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
import shlex
import shutil
import signal
import sys
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.text import Text
from temporalio.client import Client
from temporalio.service import RPCError

from durably.agents import AgentRegistration
from durably.approvals import ApprovalKeys
from durably.cli._agents import import_from_cwd
from durably.cli._connection import Connection, TaskQueue, command
from durably.cli._terminal import clip, console, err_console, safe
from durably.client import DurableClient, RunHandle
from durably.codec import ENV_KEYS, ENV_KEYS_FILE, EncryptionCodec
from durably.codec_server import DEFAULT_PORT, CodecServer
from durably.contract import (
    DEFAULT_TASK_QUEUE,
    SA_AGENT,
    SA_STATUS,
    WORKFLOW_TYPE,
    Approval,
    Handler,
    Interaction,
    RespondRequest,
    RunSnapshot,
    RunStatus,
)
from durably.dev import DEFAULT_DB, DevServer, dev_key_file
from durably.errors import DurablyError

T = TypeVar("T")

Otel = Annotated[
    bool,
    typer.Option(
        "--otel",
        help="Trace runs with OpenTelemetry: to the tracer provider your --agents module "
        "sets, else to OTLP over HTTP as the OTEL_EXPORTER_OTLP_* variables say "
        "(needs durably's otel extra).",
    ),
]
Metrics = Annotated[
    str | None,
    typer.Option(
        "--metrics",
        metavar="HOST:PORT",
        help="Serve Prometheus metrics at http://HOST:PORT/metrics: Temporal's worker "
        "metrics and durably's counters (e.g. 127.0.0.1:9464).",
        show_default=False,
    ),
]


def _serve_metrics(bind: str | None) -> None:
    """Make every Temporal client this process connects serve metrics at `bind`."""
    if bind is not None:
        from temporalio.runtime import Runtime

        from durably.telemetry import metrics_runtime

        Runtime.set_default(metrics_runtime(bind), error_if_already_set=False)


# Where a demo run stops: done, or waiting for a person (or an operator).
_SETTLED = frozenset(
    {
        RunStatus.COMPLETED,
        RunStatus.WAITING,
        RunStatus.NEEDS_ATTENTION,
        RunStatus.FAILED,
        RunStatus.CANCELLED,
    }
)


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
    strict: Annotated[
        bool,
        typer.Option(
            "--strict",
            help="Refuse to start when unfinished runs pinned a version these agents lack "
            "or define differently (otherwise: a warning per version).",
        ),
    ] = False,
    encrypt: Annotated[
        bool,
        typer.Option(
            "--encrypt",
            help=f"Refuse to start without an encryption key (${ENV_KEYS} or "
            f"${ENV_KEYS_FILE}). With a key set, the worker encrypts either way.",
        ),
    ] = False,
    otel: Otel = False,
    metrics: Metrics = None,
    max_cached_workflows: Annotated[
        int | None,
        typer.Option(
            "--max-cached-workflows",
            metavar="N",
            help="Runs kept in memory between workflow tasks (default: Temporal's, 1000). "
            "0 replays every task from the run's history: no task's events are ever applied "
            "out of turn, at a CPU cost growing with history length; the worker then takes "
            "one workflow task at a time.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Host the agents at `module:attr` until Ctrl-C or SIGTERM, then drain and exit.

    Signed approvals are checked with the keys in $DURABLY_APPROVAL_KEYS (or the
    file $DURABLY_APPROVAL_KEYS_FILE names); payloads are encrypted with the keys
    in $DURABLY_ENCRYPTION_KEYS (or $DURABLY_ENCRYPTION_KEYS_FILE). At start,
    each version unfinished runs pinned that these agents lack or define
    differently is logged (`durably versions --needed` shows the same).
    `--otel` traces runs and `--metrics` serves metrics (`durably.telemetry`).
    """
    from durably.worker import check_max_cached_workflows, run_worker

    try:  # before anything is imported or connected
        check_max_cached_workflows(max_cached_workflows, "--max-cached-workflows")
    except ValueError as err:
        err_console.print(safe(f"error: {err}", style="red"))
        raise typer.Exit(2) from err
    if encrypt and EncryptionCodec.from_env() is None:
        raise DurablyError(
            f"--encrypt: no encryption key is set. Set {ENV_KEYS} (or {ENV_KEYS_FILE}) to "
            "the keys of this cluster's workers; `durably encryption-key` makes a first one"
        )
    import_from_cwd()
    _serve_metrics(metrics)  # before connecting: the client's runtime serves them
    await run_worker(
        agents,
        # Connected as every command connects, with the environment's encryption keys.
        client=await conn.client(task_queue),
        task_queue=task_queue,
        stop=_stop_on_signals(),
        transcript_cache_bytes=None if cache_mb is None else cache_mb * 2**20,
        strict_versions=strict,
        tracing=otel,
        max_cached_workflows=max_cached_workflows,
    )
    console.print("Worker stopped.")


@command
async def dev(
    demo: Annotated[
        bool,
        typer.Option(
            "--demo",
            help="Start two runs of the example agent: one completes, one waits for approval.",
        ),
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
    encrypt: Annotated[
        bool,
        typer.Option(
            "--encrypt",
            help=f"Encrypt payloads (with ${ENV_KEYS}, else a key kept beside the database) "
            "and serve a codec server the Web UI decodes them with.",
        ),
    ] = False,
    codec_port: Annotated[
        int, typer.Option("--codec-port", help="Port of the codec server (with --encrypt).")
    ] = DEFAULT_PORT,
    otel: Otel = False,
    metrics: Metrics = None,
    mcp_example: Annotated[
        bool,
        typer.Option(
            "--mcp-example",
            help="Also host the files-clerk example, whose tools are the MCP filesystem "
            "server's (started with npx); with --demo, start a run of it.",
        ),
    ] = False,
) -> None:
    """Run a local Temporal dev server and a worker hosting the support-desk example.

    The database is kept, so a rerun finds earlier runs and the worker finishes
    unfinished ones. Ctrl-C stops the worker, then the server. `--otel` traces runs
    and `--metrics` serves the worker's metrics (`durably.telemetry`).
    """
    from durably.examples import support_desk
    from durably.telemetry import otlp_tracer_provider
    from durably.worker import load_registrations

    import_from_cwd()
    _serve_metrics(metrics)
    # Every worker on a task queue must host the same agents: the dev worker
    # hosts the example and the user's agents together.
    registrations = list(support_desk.registrations)
    if mcp_example:
        from durably.examples import files_clerk

        registrations += files_clerk.build_registrations()
    for spec in agents or []:
        registrations += load_registrations(spec)
    codec, key_note = _dev_encryption(db, encrypt=encrypt)
    exporting = otlp_tracer_provider("durably-dev") if otel else None
    stop = _stop_on_signals()
    async with contextlib.AsyncExitStack() as stack:
        if exporting is not None:
            stack.callback(exporting.shutdown)
        codec_endpoint = None
        if encrypt:
            origins = [f"http://{host}:{ui_port}" for host in ("localhost", "127.0.0.1")]
            codec_server = CodecServer(codec, port=codec_port, cors_origins=origins)
            codec_endpoint = (await stack.enter_async_context(codec_server)).endpoint
        server = DevServer(db=db, port=port, ui_port=ui_port, ui_codec_endpoint=codec_endpoint)
        console.print(f"Starting the Temporal dev server on {server.address} (database {db}) …")
        try:
            temporal = await _until(stop, server.start())
            if temporal is not None:
                setup = _DevSetup(registrations, codec, key_note, tracing=otel)
                await _serve(
                    temporal, server, stop, setup, demo=demo, mcp_demo=demo and mcp_example
                )
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


@dataclass(frozen=True)
class _DevSetup:
    """What `durably dev` hosts, and how it encrypts."""

    registrations: list[AgentRegistration]
    codec: EncryptionCodec | None
    key_note: str | None  # where the key comes from, for the banner
    tracing: bool = False


def _dev_encryption(db: Path, *, encrypt: bool) -> tuple[EncryptionCodec | None, str | None]:
    """The dev worker's codec and where its key comes from: the environment's keys
    (with or without --encrypt: the worker must read what they encrypted), else,
    with --encrypt, the key file beside the database."""
    codec = EncryptionCodec.from_env()
    if codec is not None:
        source = f"${ENV_KEYS}" if os.environ.get(ENV_KEYS) else f"${ENV_KEYS_FILE}"
        return codec, f"keys {', '.join(codec.keys.key_ids)} from {source}"
    key_file = dev_key_file(db.parent, create=encrypt)
    if key_file is None:
        return None, None
    if not encrypt:
        err_console.print(
            safe(
                f"Not encrypting: runs this database holds that were encrypted need "
                f"--encrypt (their key is in {key_file}).",
                style="yellow",
            )
        )
        return None, None
    codec = EncryptionCodec.from_env({ENV_KEYS_FILE: str(key_file)})
    export = f"export {ENV_KEYS_FILE}={shlex.quote(str(key_file.resolve()))}"
    return codec, f"key file {key_file} (for other durably commands: {export})"


async def _serve(
    temporal: Client,
    server: DevServer,
    stop: asyncio.Event,
    setup: _DevSetup,
    *,
    demo: bool,
    mcp_demo: bool = False,
) -> None:
    """Host the registrations on `temporal` until `stop`; the worker drains before returning."""
    from durably.worker import DurableRuntime

    runtime = await DurableRuntime.open(
        client=DurableClient(temporal, encryption=setup.codec),
        agents=setup.registrations,
        encryption=setup.codec,
        tracing=setup.tracing,
    )
    try:
        await runtime.resume()
        _banner(server, runtime.registry.describe(), setup)
        await _report_unfinished(runtime.client)
        if demo:
            await _until(stop, _demo(runtime.client, server))
        if mcp_demo and not stop.is_set():
            await _until(stop, _demo_mcp(runtime.client, server))
        if not stop.is_set():
            console.print("Serving. Press Ctrl-C to stop.")
    except BaseException:
        await runtime.close()
        raise
    await runtime.serve(stop)
    console.print("Worker stopped.")


async def _demo(client: DurableClient, server: DevServer) -> None:
    """Two runs of the example and a session of two messages: the knowledge base answers
    the first run, which completes unattended; the second opens a ticket, so it waits for a
    person's approval; the session's second answer recalls its first."""

    await _demo_runs(client, server)
    await _demo_session(client, server)


async def _demo_mcp(client: DurableClient, server: DevServer) -> None:
    """A run of the files-clerk example: its note is written through the MCP filesystem
    server once a person approves `write_file`."""
    from durably.examples import files_clerk

    run = await client.start_run(files_clerk.AGENT_ID, files_clerk.demo_input())
    console.print(Text(f"MCP demo run: {run.run_id}", style="bold"))
    console.print(Text(f"  Web UI: {server.workflow_url(run.run_id)}"))
    console.print(Text(f"  Files:  {files_clerk.files_dir()}"))
    await _show_settled(run, server, "MCP demo")


async def _demo_session(client: DurableClient, server: DevServer) -> None:
    from durably.examples import support_desk

    session = await client.start_session(support_desk.AGENT_ID)
    console.print(Text(f"Demo session: {session.session_id}", style="bold"))
    console.print(Text(f"  Web UI: {server.workflow_url(session.session_id)}"))
    for number, text in enumerate(support_desk.demo_conversation(), start=1):
        console.print(Text(f"  Message {number}: {text}"))
        try:
            run = await session.submit(text)
            console.print(Text(f"  Session run: {run.run_id}"))
            snap = await _settled(run)
        except DurablyError as err:
            err_console.print(safe(f"Demo session did not answer: {err}", style="red"))
            return
        if snap.status != RunStatus.COMPLETED:
            err_console.print(
                safe(f"Demo session run {run.run_id} is {snap.status.value}", style="red")
            )
            return
        console.print(safe(f"  Answer {number}: {snap.output}", keep_newlines=True, style="green"))
    durably = _command("durably")
    target = "" if server.port == 7233 else f" --target {server.address}"
    sid = shlex.quote(session.session_id)
    console.print(Text("Go on with the conversation:", style="bold"))
    console.print(safe(f"  {durably} send {sid} 'My print jobs are stuck again'{target} --wait"))


async def _demo_runs(client: DurableClient, server: DevServer) -> None:
    from durably.examples import support_desk

    inputs = (support_desk.demo_input_unattended(), support_desk.demo_input())
    runs = [await client.start_run(support_desk.AGENT_ID, text) for text in inputs]
    for run, text in zip(runs, inputs, strict=True):
        console.print(Text(f"Demo run: {run.run_id}", style="bold"))
        console.print(Text(f"  Web UI: {server.workflow_url(run.run_id)}"))
        console.print(Text(f"  Input:  {text}"))
        await _show_settled(run, server, "Demo")


async def _show_settled(run: RunHandle, server: DevServer, label: str) -> None:
    """Wait until a demo run completed or stopped, and say what it gave or waits for."""
    try:
        snap = await _settled(run)
    except DurablyError as err:
        err_console.print(safe(f"{label} run did not complete: {err}", style="red"))
        return
    if snap.status == RunStatus.COMPLETED:
        console.print(safe(f"{label} output: {snap.output}", keep_newlines=True, style="green"))
    elif snap.interaction is not None and snap.interaction.type == "tool-approval":
        _how_to_answer(server, run.run_id, snap.interaction)
    else:
        err_console.print(
            safe(
                f"{label} run {run.run_id} is {snap.status.value}: {snap.error or snap.current}",
                style="red",
            )
        )


async def _settled(run: RunHandle) -> RunSnapshot:
    """The run's snapshot once it completed or stopped for a person or an operator."""
    while True:
        snap = await run.snapshot()
        if snap.status in _SETTLED and (snap.status != RunStatus.WAITING or snap.interactions):
            return snap
        await asyncio.sleep(0.1)  # nothing announces the change; the query is cheap


def _how_to_answer(server: DevServer, run_id: str, interaction: Interaction) -> None:
    """The three ways to answer an approval: durably's CLI, Temporal's CLI, the Web UI."""
    default_port = server.port == 7233
    target = "" if default_port else f" --target {server.address}"
    address = "" if default_port else f" --address {server.address}"
    run, name = shlex.quote(run_id), Handler.RESPOND_SIGNAL.value
    # The same input the run's current details (and the Web UI) show.
    request = RespondRequest(
        interaction_id=interaction.id,
        response=Approval(args_digest=interaction.args_digest).model_dump(
            mode="json", exclude_none=True
        ),
        responder="NAME",
    )
    signal_input = json.dumps(
        request.model_dump(mode="json", exclude_none=True), ensure_ascii=False
    )
    waiting = f'{SA_STATUS.name}="{RunStatus.WAITING.value}"'
    args = clip(json.dumps(interaction.args, ensure_ascii=False), 120)
    durably, temporal = _command("durably"), _command("temporal")
    console.print(
        safe(
            f"Demo run {run_id} is waiting for approval of {interaction.tool} with {args}",
            style="bold yellow",
        )
    )
    console.print(Text("Approve or deny it with durably:", style="bold"))
    console.print(safe(f"  {durably} approve {run} --as NAME{target}"))
    console.print(safe(f"  {durably} deny {run} --reason WHY --as NAME{target}"))
    console.print(Text("or with the Temporal CLI:", style="bold"))
    console.print(
        safe(
            f"  {temporal} workflow signal --workflow-id {run} --name {name}{address}"
            f"{_codec_flag(server)} --input {shlex.quote(signal_input)}"
        )
    )
    console.print(
        Text(
            f"or in the Web UI, from the runs waiting for a person ({waiting}): open the "
            "run, then Send a Signal with that name and input:",
            style="bold",
        )
    )
    console.print(Text(f"  {server.workflows_url(waiting)}"))


def _codec_flag(server: DevServer) -> str:
    """What makes the Temporal CLI encrypt what it sends (and decrypt what it shows)."""
    endpoint = server.ui_codec_endpoint
    return "" if endpoint is None else f" --codec-endpoint {endpoint}"


def _banner(server: DevServer, agents: str, setup: _DevSetup) -> None:
    """What runs where, and how to start a run; plain lines, so commands copy cleanly."""
    from durably.examples.support_desk import AGENT_ID, demo_input_unattended

    default_port = server.port == 7233
    address = "" if default_port else f" --address {server.address}"
    target = "" if default_port else f" --target {server.address}"
    prompt = demo_input_unattended()
    start_input = json.dumps(
        {"agent_id": AGENT_ID, "input": prompt, "version": None},
        separators=(",", ":"),
    )
    durably, temporal = _command("durably"), _command("temporal")
    console.print(Text("durably dev is running", style="bold green"))
    for name, value in (
        ("Temporal server", f"{server.address} (namespace {server.namespace})"),
        ("Database", f"{server.db} (server log: {server.log_path})"),
        ("Web UI", server.ui_url),
        ("Worker", f"task queue {DEFAULT_TASK_QUEUE}, agents {agents}"),
        ("Encryption", setup.key_note or "off (--encrypt turns it on)"),
    ):
        console.print(Text.assemble("  ", (f"{name:<17}", "bold"), value))
    if server.ui_codec_endpoint is not None:
        codec = f"{server.ui_codec_endpoint} (the Web UI and the Temporal CLI decode with it)"
        console.print(Text.assemble("  ", (f"{'Codec server':<17}", "bold"), codec))
    console.print(Text("Start a run:", style="bold"))
    console.print(Text(f"  {durably} start {AGENT_ID} '{prompt}'{target} --wait"))
    console.print(
        Text(
            f"  {temporal} workflow start --type {WORKFLOW_TYPE} --task-queue "
            f"{DEFAULT_TASK_QUEUE}{address}{_codec_flag(server)} --input '{start_input}'"
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


def _command(name: str) -> str:
    """How to type `name` here: bare if PATH finds this environment's copy."""
    beside = shutil.which(name, path=str(Path(sys.executable).parent))
    if beside is None or shutil.which(name) == beside:
        return name
    try:
        return str(Path(beside).relative_to(Path.cwd()))
    except ValueError:
        return beside
