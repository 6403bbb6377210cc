"""`DurableRuntime`: a client plus a worker hosting a live agent registry.

Start-up that never strands a run: open with no agents, list the unfinished
runs, register the exact registrations they need, then `resume()`::

    runtime = await DurableRuntime.open()
    for run in await runtime.client.list_runs(unfinished=True): ...
    runtime.register_agents([AgentRegistration(agent, version="1")])
    await runtime.resume()

Run from a shell as `durably worker --agents module:attr` or
`python -m durably.worker --agents module:attr`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Sequence
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any

import structlog
from temporalio.client import Client
from temporalio.worker import Worker

from durably._imports import load_attr
from durably._search_attributes import check_on_start
from durably.activities import TranscriptCache
from durably.agents import AgentRegistration
from durably.approvals import ApprovalKeys
from durably.client import DurableClient, NeededVersion
from durably.codec import EncryptionCodec
from durably.contract import DEFAULT_TASK_QUEUE
from durably.errors import (
    DurableConflictError,
    DurablyError,
    RegistrationError,
    VersionDriftError,
)
from durably.mcp import MCPToolset
from durably.mcp._locking import toolsets_of
from durably.mcp._servers import POOL
from durably.observers import OBSERVER_TIMEOUT, Checkpoints, Observer, ObserverHost
from durably.plugin import DurablyPlugin
from durably.registry import AgentRegistry
from durably.telemetry import metrics_runtime, otlp_tracer_provider, traced_client

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

__all__ = ["DurableRuntime", "load_registrations", "main"]

_log = structlog.get_logger("durably.worker")

# A dead worker's sticky queue holds its runs' next workflow task (and
# queries) this long; keep it well under the tools' heartbeat timeout.
STICKY_TIMEOUT = timedelta(seconds=3)
# Heartbeats reach the server at least this often, so a cancellation
# reaches a running tool within about this long, and a model answer's text
# reaches live followers (it travels in the model activity's heartbeat
# details) within about this long. An activity that heartbeats in a tight
# loop sends at most this many heartbeats a second: 4.
HEARTBEAT_THROTTLE = timedelta(milliseconds=250)


class DurableRuntime:
    """A connected client and a worker that runs only after `resume()`."""

    def __init__(self, client: DurableClient, plugin: DurablyPlugin, worker: Worker) -> None:
        self.client = client
        self.plugin = plugin
        self.registry = plugin.registry
        self.worker = worker
        self._task: asyncio.Task[None] | None = None
        # The version check of a non-strict start, running beside polling.
        self._version_check: asyncio.Task[None] | None = None
        self.strict_versions = False
        # Observers fed in this process (`open(observers=...)`), from `resume()` on.
        self.observers: ObserverHost | None = None
        self._observing: asyncio.Task[None] | None = None
        self._stop_observing = asyncio.Event()

    @classmethod
    async def open(
        cls,
        target: str | None = None,
        namespace: str | None = None,
        task_queue: str = DEFAULT_TASK_QUEUE,
        *,
        agents: Iterable[AgentRegistration] = (),
        client: DurableClient | Client | None = None,
        profile: str | None = None,
        graceful_shutdown: timedelta = timedelta(seconds=10),
        transcript_cache_bytes: int | None = None,
        approval_keys: ApprovalKeys | None = None,
        strict_versions: bool = False,
        encryption: EncryptionCodec | None = None,
        observers: Sequence[Observer] = (),
        observer_checkpoints: Checkpoints | None = None,
        observer_timeout: float = OBSERVER_TIMEOUT,
        tracing: bool | TracerProvider = False,
        metrics_bind: str | None = None,
        max_cached_workflows: int | None = None,
        **worker_options: Any,
    ) -> DurableRuntime:
        """Connect (or use `client`) and register `agents`; executes nothing yet.

        `transcript_cache_bytes` bounds the worker's transcript cache (256 MiB
        by default, `0` turns it off): least recently used runs are evicted
        past it, and a run that does not fit rebuilds its transcript from the
        workflow on every model request. `approval_keys` check signed
        approvals (by default from `DURABLY_APPROVAL_KEYS`; see
        `durably.approvals`). `profile` names the Temporal config file's
        profile to connect with (`DurableClient.connect`). `resume()` logs a
        warning for each version unfinished runs pinned that this worker does
        not host, or hosts with another fingerprint (see
        `DurableClient.needed_versions`); `strict_versions=True` refuses to
        start instead. `encryption` (`durably.codec`) encrypts payloads; a
        given client keeps its own converter otherwise. `observers` are fed
        every run's committed events from `resume()` on, checkpointed in
        `observer_checkpoints`, each call bounded by `observer_timeout` seconds
        (see `durably.observers`). `tracing=True` (the
        global tracer provider) or a `TracerProvider` traces runs with
        OpenTelemetry, on the worker and on `runtime.client` (a given client is
        left as it is; the runtime's is a copy that traces). `metrics_bind`
        (``"127.0.0.1:9464"``) serves Temporal's and durably's metrics for
        Prometheus; it needs durably to connect, so not with `client` (connect
        yours with ``runtime=durably.telemetry.metrics_runtime(...)``). See
        `durably.telemetry`. `max_cached_workflows` bounds how many runs the
        worker keeps in memory between workflow tasks (Temporal's default,
        1000, when None). With `0` every workflow task replays the run's whole
        history, so no task's events are ever applied out of turn (the query
        race, `durably._query_guard`, cannot happen), at a CPU cost that grows
        with the history's length. Temporal's worker then holds one run at a
        time, so the worker takes one workflow task at a time
        (`max_concurrent_workflow_tasks=1`, unless given): the tasks it would
        take beyond that wait in the worker until they time out. Allowed more,
        it lets go of a run mid-task for another run's task, and a local
        activity in flight there (a run's pin) runs again when that task
        replays, which is safe: durably's only read. Other keywords go to
        Temporal's `Worker`.

        .. versionchanged:: Unreleased
           The `transcript_cache_bytes`, `approval_keys`, `profile`,
           `strict_versions`, `encryption`, `tracing`, `metrics_bind` and
           `max_cached_workflows` keywords.
        """
        # Checked before connecting: a bad bound should not cost a connection.
        cache = None if transcript_cache_bytes is None else TranscriptCache(transcript_cache_bytes)
        check_max_cached_workflows(max_cached_workflows, "max_cached_workflows")
        if metrics_bind is not None and client is not None:
            raise ValueError(
                "metrics_bind needs DurableRuntime.open to connect; a given client keeps its "
                "own runtime: connect it with runtime=durably.telemetry.metrics_runtime(...)"
            )
        if client is None:
            durable = await DurableClient.connect(
                target,
                namespace,
                task_queue,
                profile=profile,
                encryption=encryption,
                runtime=None if metrics_bind is None else metrics_runtime(metrics_bind),
            )
        elif isinstance(client, DurableClient):
            if task_queue != DEFAULT_TASK_QUEUE and task_queue != client.task_queue:
                raise ValueError(
                    f"task_queue={task_queue!r} differs from the given client's task queue "
                    f"{client.task_queue!r}; the client's wins, so pass one or the other"
                )
            durable = client
            if encryption is not None:
                durable = DurableClient(
                    client.temporal, task_queue=client.task_queue, encryption=encryption
                )
        else:
            durable = DurableClient(client, task_queue=task_queue, encryption=encryption)
        if tracing is not False:  # on the client: its worker and its runs' starts trace
            durable = DurableClient(
                traced_client(durable.temporal, tracing), task_queue=durable.task_queue
            )
        plugin = DurablyPlugin(
            AgentRegistry(agents),
            transcript_cache=cache,
            approval_keys=approval_keys,
            encryption=encryption,
        )
        options: dict[str, Any] = {
            "sticky_queue_schedule_to_start_timeout": STICKY_TIMEOUT,
            "max_heartbeat_throttle_interval": HEARTBEAT_THROTTLE,
            "graceful_shutdown_timeout": graceful_shutdown,
        }
        if max_cached_workflows is not None:
            options["max_cached_workflows"] = max_cached_workflows
        if max_cached_workflows == 0 and not {"max_concurrent_workflow_tasks", "tuner"} & set(
            worker_options
        ):
            # Without a cache Temporal's worker holds one run at a time; tasks it polled
            # beyond that wait in the worker until the server times them out (10 s each),
            # where another worker could have taken them.
            options["max_concurrent_workflow_tasks"] = 1
        options.update(worker_options)
        worker = Worker(
            durable.temporal,
            task_queue=durable.task_queue,
            plugins=[plugin],
            **options,
        )
        runtime = cls(durable, plugin, worker)
        runtime.strict_versions = strict_versions
        if observers:
            runtime.observers = ObserverHost(
                durable, observers, checkpoints=observer_checkpoints, timeout=observer_timeout
            )
        return runtime

    def register_agents(self, registrations: Iterable[AgentRegistration]) -> None:
        """Register a batch: all or nothing; an existing (id, version) is never replaced."""
        batch = list(registrations)
        self.plugin.check_approval_keys(batch, self.plugin.agent_activities.approval_keys)
        self.registry.register(batch)

    async def unregister_agent(self, agent_id: str, version: str | None = None) -> bool:
        """Remove an agent (or one version); refused while an unfinished run needs it.

        Runs on this runtime's task queue count; a run whose version is not
        known yet (still pinning) counts for every version.
        """
        wanted = [
            r
            for r in self.registry.all()
            if r.agent_id == agent_id and (version is None or r.version == version)
        ]
        if not wanted:
            return False
        versions = {r.version for r in wanted}
        blocking = [
            run.run_id
            for run in await self.client.list_runs(
                agent_id=agent_id, unfinished=True, task_queue=self.client.task_queue
            )
            if run.agent_version is None or run.agent_version in versions
        ]
        if blocking:
            shown = ", ".join(blocking[:5]) + (" …" if len(blocking) > 5 else "")
            raise DurableConflictError(
                f"agent {agent_id!r} ({', '.join(sorted(versions))}) is still needed by "
                f"{len(blocking)} unfinished run(s): {shown}. Let them finish, resolve or "
                "cancel them, then unregister."
            )
        self.registry.unregister(agent_id, version)
        return True

    async def resume(self) -> None:
        """Start polling: runs execute from now on.

        Raises `SearchAttributesMissingError`, polling nothing, when the
        namespace lacks durably's search attributes (`durably setup`). Checks
        the versions unfinished runs pinned against this worker's (see
        `open`'s `strict_versions`).

        The check lists every unfinished run on the task queue (a page of
        visibility per thousand or so runs), so only a strict worker waits
        for it before polling. Otherwise it runs in the background once
        polling has started, and only logs: a task queue with many waiting
        runs never delays a start, nor each worker of a rolling restart.

        .. versionchanged:: Unreleased
           The version check, in the background unless `strict_versions`.
        """
        if self._task is None:
            await check_on_start(self.client.temporal)
            if self.strict_versions:
                await self._check_versions()
                await self._check_mcp_servers()
            self._task = asyncio.create_task(self.worker.run(), name="durably-worker")
            if not self.strict_versions:
                self._version_check = asyncio.create_task(
                    self._check_versions_beside(), name="durably-version-check"
                )
            if self.observers is not None:
                self._observing = asyncio.create_task(
                    self.observers.run(self._stop_observing), name="durably-observers"
                )

    async def serve(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set, then drain; a worker that fails ends it at once.

        Temporal's worker fails for good on what polling cannot fix (the
        namespace is gone, the credentials are refused); waiting on `stop`
        alone would keep a process up that runs nothing.
        """
        await self.resume()
        assert self._task is not None
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({stopping, self._task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            try:
                await self.close()
            except Exception as err:
                raise DurablyError(
                    f"the worker stopped: {err}. Check the namespace, address and "
                    "credentials it connects with, then start it again."
                ) from err

    async def close(self) -> None:
        """Stop polling and let running activities finish (or see their abort signal).

        A version check still running in the background is cancelled.
        """
        if self._observing is not None:
            self._stop_observing.set()
            await self._observing
            self._observing = None
        if self._version_check is not None:
            self._version_check.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._version_check
            self._version_check = None
        if self._task is not None:
            await self.worker.shutdown()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        toolsets = self._mcp_toolsets()
        if toolsets:
            await POOL.close([t.server for t in toolsets])  # the servers this worker used

    def _mcp_toolsets(self) -> list[MCPToolset]:
        """The MCP toolsets whose tools the hosted agents use."""
        return toolsets_of(self.registry.all())

    async def _check_mcp_servers(self) -> None:
        """Compare each MCP server's live tool listing with its toolset's lock file.

        A difference is logged (strict: refused): a run calling a changed
        tool would park `version_incompatible` rather than call it, so the
        operator learns of the server's change here first.
        """
        problems: list[str] = []
        toolsets = self._mcp_toolsets()
        checked = await asyncio.gather(*(t.check() for t in toolsets), return_exceptions=True)
        for toolset, result in zip(toolsets, checked, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, DurablyError):
                    raise result
                _log.warning("MCP server unreachable", toolset=toolset.name, error=str(result))
                problems.append(f"{toolset.name}: {result}")
                continue
            drifted, changed = result
            if changed is not None:  # the same tools listed: runs go on, but say so
                _log.warning(
                    "MCP server's version differs from its lock file's, with the same tools "
                    "listed; check that they still do what the lock's version did",
                    toolset=toolset.name,
                    version=changed,
                )
            if drifted:
                _log.warning(
                    "MCP server's tools differ from the toolset's lock file; runs calling "
                    "those tools will park as version_incompatible",
                    toolset=toolset.name,
                    server=toolset.server.describe(),
                    lock=str(toolset.lock_path),
                    drift=drifted,
                )
                problems += [f"{toolset.name}: {line}" for line in drifted]
        if problems and self.strict_versions:
            raise VersionDriftError(
                "refusing to start (strict_versions): MCP servers differ from their lock "
                "files:\n" + "\n".join(f"  - {p}" for p in problems) + "\nRestore the "
                "servers the lock files describe, or lock again under a new agent version."
            )

    async def _check_versions_beside(self) -> None:
        """`_check_versions` (and the MCP servers' check) beside polling: whatever goes wrong
        is logged, never raised."""
        try:
            await self._check_versions()
            await self._check_mcp_servers()
        except Exception as err:  # a check gone wrong must never stop a polling worker
            _log.warning(
                "could not check the versions unfinished runs need",
                error=f"{type(err).__name__}: {err}",
            )

    async def _check_versions(self) -> None:
        """Log each version unfinished runs pinned that this worker lacks or hosts changed.

        With `strict_versions`, raise `VersionDriftError` instead of starting.
        Runs not pinned yet are only logged, even then: one started with a
        mistyped agent id must not keep every strict worker down.
        """
        try:
            needed = await self.client.needed_versions(self.registry)
        except DurablyError as err:
            if self.strict_versions:
                raise VersionDriftError(
                    f"refusing to start (strict_versions): could not list the versions "
                    f"unfinished runs need: {err}"
                ) from err
            _log.warning("could not check the versions unfinished runs need", error=str(err))
            return
        for n in needed:
            fields = {
                "agent": n.agent_id,
                "version": n.version,
                "runs": n.runs,
                "example_run": n.example_run_id,
            }
            if n.check == "differs":
                _log.warning(
                    "registration differs from what unfinished runs pinned; they will park "
                    "as version_incompatible",
                    **fields,
                    pinned_fingerprint=n.fingerprint,
                    hosted_fingerprint=n.hosted_fingerprint,
                    changed=list(n.changed) if n.changed is not None else "unknown",
                )
            elif n.check == "not_hosted" and n.version is None:
                _log.warning(
                    "unfinished runs name an agent this worker does not host and have not "
                    "pinned a version; they will park as version_missing (a mistyped agent id?)",
                    **fields,
                )
            elif n.check == "not_hosted":
                _log.warning(
                    "unfinished runs need a version this worker does not host; they will park "
                    "as version_missing",
                    **fields,
                )
            elif n.check == "fingerprint_unknown":
                _log.info("unfinished runs pinned no published fingerprint to check", **fields)
        # A run not pinned yet names an agent id only; it never refuses a start.
        drift = [n for n in needed if not n.ok and n.version is not None]
        if drift and self.strict_versions:
            raise VersionDriftError(_drift_message(drift), drift)

    async def __aenter__(self) -> DurableRuntime:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _drift_message(drift: Sequence[NeededVersion]) -> str:
    lines = "\n".join(f"  - {n.describe()}" for n in drift)
    return (
        "refusing to start (strict_versions): unfinished runs need definitions this worker "
        f"does not host as they pinned them:\n{lines}\n"
        "Register each original definition under its version again (and give a changed "
        "definition a new version), or start without strict to let these runs park in "
        "needs_attention until a worker hosts them."
    )


def check_max_cached_workflows(value: object, spelled: str) -> None:
    """Refuse a workflow cache bound that is not a count of runs, saying what to pass.

    Temporal's `Worker` refuses a negative or fractional bound with "failed to
    extract field WorkerConfig.max_cached_workflows", which names neither
    durably's option nor what to pass, and takes `True` for 1. `spelled` is
    the option as the caller wrote it (keyword or command-line flag).
    """
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return
    raise ValueError(
        f"{spelled}={value!r}: pass a whole number of runs, 0 or more (0 replays every "
        "workflow task from history), or leave it unset for Temporal's default"
    )


def load_registrations(spec: str) -> list[AgentRegistration]:
    """Import `module:attr` and return the registrations it names."""
    value: Any = load_attr(spec, "--agents", "myapp.agents:registrations")
    if callable(value) and not isinstance(value, AgentRegistration):
        value = value()
    items: Sequence[Any] = [value] if isinstance(value, AgentRegistration) else list(value)
    bad = [type(v).__name__ for v in items if not isinstance(v, AgentRegistration)]
    if bad:
        raise RegistrationError(
            f"--agents {spec!r} holds {bad}; it must be an AgentRegistration or a list of them "
            "(wrap an Agent as AgentRegistration(agent, version='1'))"
        )
    return list(items)


async def run_worker(
    agents: str,
    *,
    target: str | None = None,
    namespace: str | None = None,
    profile: str | None = None,
    task_queue: str = DEFAULT_TASK_QUEUE,
    stop: asyncio.Event | None = None,
    transcript_cache_bytes: int | None = None,
    strict_versions: bool = False,
    client: DurableClient | None = None,
    encryption: EncryptionCodec | None = None,
    tracing: bool = False,
    max_cached_workflows: int | None = None,
) -> None:
    """Host the registrations at `agents` until `stop` is set (or forever).

    `profile`, `transcript_cache_bytes`, `strict_versions`, `client`,
    `encryption` and `max_cached_workflows` are `DurableRuntime.open`'s.
    `tracing` traces with the tracer provider the `agents` module set, else
    with OTLP configured by the environment
    (`durably.telemetry.otlp_tracer_provider`).

    .. versionchanged:: Unreleased
       The `client`, `encryption`, `tracing` and `max_cached_workflows` keywords.
    """
    # Before importing the agents' module: a bad bound should not cost an import.
    check_max_cached_workflows(max_cached_workflows, "max_cached_workflows")
    registrations = load_registrations(agents)
    # After the agents' module is imported: it may have set a tracer provider.
    exporting = otlp_tracer_provider() if tracing else None
    try:
        await _host(
            registrations,
            target=target,
            namespace=namespace,
            profile=profile,
            task_queue=task_queue,
            stop=stop,
            transcript_cache_bytes=transcript_cache_bytes,
            strict_versions=strict_versions,
            client=client,
            encryption=encryption,
            tracing=tracing,
            max_cached_workflows=max_cached_workflows,
        )
    finally:
        if exporting is not None:
            exporting.shutdown()  # sends what is buffered


async def _host(
    registrations: list[AgentRegistration],
    *,
    target: str | None,
    namespace: str | None,
    profile: str | None,
    task_queue: str,
    stop: asyncio.Event | None,
    transcript_cache_bytes: int | None,
    strict_versions: bool,
    client: DurableClient | None,
    encryption: EncryptionCodec | None,
    tracing: bool,
    max_cached_workflows: int | None,
) -> None:
    runtime = await DurableRuntime.open(
        target,
        namespace,
        task_queue,
        agents=registrations,
        client=client,
        profile=profile,
        transcript_cache_bytes=transcript_cache_bytes,
        strict_versions=strict_versions,
        encryption=encryption,
        tracing=tracing,
        max_cached_workflows=max_cached_workflows,
    )
    await runtime.resume()  # checks the namespace before saying so
    encrypted = runtime.client.temporal.data_converter.payload_codec
    _log.info(
        "worker started",
        task_queue=runtime.client.task_queue,
        agents=runtime.registry.describe(),
        encrypted=isinstance(encrypted, EncryptionCodec),
        traced=tracing,
        max_cached_workflows=runtime.worker.config().get("max_cached_workflows"),
    )
    await runtime.serve(stop or asyncio.Event())


def main() -> None:
    """`python -m durably.worker`: the same as `durably worker` (or `python -m durably worker`).

    The CLI is imported here, when the command runs, not with this module:
    the CLI imports this module, and an import at the top would be a cycle.
    """
    import sys

    from durably.cli import main as cli_main

    cli_main(["worker", *sys.argv[1:]])


if __name__ == "__main__":
    main()
