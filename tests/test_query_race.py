"""The query race (`docs/design.md`, "The query race"), against a real dev server.

A snapshot query sent while a run is idle, just after its worker was SIGKILLed
mid-call, waits in the server's matching service. The manual tool's heartbeat
then times out; a fresh worker takes the query, rebuilds the run from history
and applies the timeout ahead of the workflow task it belongs to. An operator
who reads "needs_attention" and resolves the call lands that update in the
same task. Without durably's query guard the history no longer replays (every
later workflow task fails for good); with it, the same steps replay.

Every step waits on progress: the query's dispatch is read from the server's
own metrics (its namespace alone), the timeout from the history.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType, TaskQueueKind
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import PollWorkflowTaskQueueRequest
from temporalio.client import WorkflowHandle, WorkflowHistory, WorkflowQueryFailedError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from durably import (
    DurableClient,
    DurableConflictError,
    DurableRuntime,
    DurablyPlugin,
    RunHandle,
    RunStatus,
)
from durably._query_guard import ask, refused
from durably._replay import replay, task_failures
from durably.contract import Handler, RunSnapshot
from durably.workflows import AgentRunWorkflow, AgentSessionWorkflow

from . import crash_agents
from .conftest import (
    QUIET_NAMESPACE,
    binary,
    cli,
    eventually,
    record_history,
    server_metric,
    wait_for_status,
)

ROOT = Path(__file__).resolve().parent.parent
# The first worker keeps the run's next task (and the query) on its sticky queue for
# longer than the tool's heartbeat timeout, so the fresh worker is polling before either
# reaches it, and the operator has the heartbeat timeout's length to resolve the call
# before that task is handed over.
_FIRST_WORKER = """
import asyncio, sys
from datetime import timedelta
from durably import DurableRuntime
from tests.crash_agents import registrations

async def main() -> None:
    runtime = await DurableRuntime.open(
        sys.argv[1], sys.argv[2], sys.argv[3], agents=registrations,
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=float(sys.argv[4])),
    )
    await runtime.resume()
    await asyncio.Event().wait()

asyncio.run(main())
"""


class Race:
    """One run taken through the race's steps, on its own task queue."""

    def __init__(self, env: WorkflowEnvironment, tmp: Path) -> None:
        self.target = env.client.service_client.config.target_host
        self.task_queue = f"race-{uuid.uuid4().hex[:8]}"
        self.journal = tmp / "journal.jsonl"
        self.journal.touch()
        self.client: DurableClient | None = None

    async def connect(self) -> DurableClient:
        self.client = await DurableClient.connect(self.target, QUIET_NAMESPACE, self.task_queue)
        return self.client

    def first_worker(self, sticky_seconds: float = 5) -> subprocess.Popen[bytes]:
        env = {**os.environ, "DURABLY_TEST_JOURNAL": str(self.journal), "PYTHONPATH": str(ROOT)}
        argv = [self.target, QUIET_NAMESPACE, self.task_queue, str(sticky_seconds)]
        return subprocess.Popen(
            [sys.executable, "-c", _FIRST_WORKER, *argv],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def journal_entries(self, **match: Any) -> list[dict[str, Any]]:
        entries = [json.loads(line) for line in self.journal.read_text().splitlines()]
        return [e for e in entries if all(e.get(k) == v for k, v in match.items())]

    async def until_journal(self, **match: Any) -> None:
        """Until a worker's tool or model wrote an entry matching `match`."""

        async def written() -> bool:
            return bool(self.journal_entries(**match))

        await eventually(written, within=60)

    async def until_in_history(self, run: RunHandle, event_type: EventType.ValueType) -> None:
        assert self.client is not None
        handle = self.client.temporal.get_workflow_handle(run.run_id)

        async def written() -> bool:
            return await _in_history(handle, event_type)

        try:
            await eventually(written, within=60)
        except TimeoutError:  # say where the run stood
            events = (await handle.fetch_history()).events
            shown = [f"{e.event_id} {EventType.Name(e.event_type)}" for e in events[-12:]]
            raise AssertionError(f"no {EventType.Name(event_type)} in 60 s: {shown}") from None

    async def dispatched_first(self, run: RunHandle, before: float) -> bool:
        """Whether the server handed the query to its matching service (a legacy query)
        before the tool's heartbeat timed out; False when the timeout came first (a
        loaded machine took longer than the heartbeat timeout to send the query, which
        then rides the timeout's workflow task instead)."""
        assert self.client is not None
        handle = self.client.temporal.get_workflow_handle(run.run_id)
        outcome: list[bool] = []

        async def decided() -> bool:
            if await _dispatched() > before:
                outcome.append(True)
            elif any(
                e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT
                for e in (await handle.fetch_history()).events
            ):
                outcome.append(await _dispatched() > before)
            return bool(outcome)

        await eventually(decided, within=60)
        return outcome[0]

    def start_again(self) -> None:
        """A new task queue and an empty journal, for another try at the race's steps."""
        self.task_queue = f"race-{uuid.uuid4().hex[:8]}"
        self.journal.write_text("")


async def _dispatched() -> float:
    return await server_metric(
        "client_requests", operation="MatchingClientQueryWorkflow", namespace=QUIET_NAMESPACE
    )


@pytest.fixture
async def race(
    env: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Race]:
    monkeypatch.setenv("DURABLY_TEST_JOURNAL", str(tmp_path / "journal.jsonl"))
    yield Race(env, tmp_path)


def _unguarded_worker(client: DurableClient) -> Worker:
    """A worker as durably built them before the query guard: the SDK's own runner."""
    plugin = DurablyPlugin(crash_agents.registrations)
    return Worker(
        client.temporal,
        task_queue=client.task_queue,
        workflows=[AgentRunWorkflow, AgentSessionWorkflow],
        activities=plugin.agent_activities.methods(),
        unsandboxed_workflow_runner=UnsandboxedWorkflowRunner(),
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=3),
    )


async def _replay_failure(client: DurableClient, run: RunHandle) -> str | None:
    """Why a fresh worker (no cache) cannot replay the run's history, if it cannot."""
    history = await client.temporal.get_workflow_handle(run.run_id).fetch_history()
    return await replay(history, client.temporal.data_converter)


async def _finishes(run: RunHandle) -> None:
    result = await asyncio.wait_for(run.result(), 60)
    assert result.output == '{"ticket_id":"T-7"}'


async def _race(
    race: Race,
    *,
    guarded: bool,
    agent: str = "manual",
    then: Callable[[RunHandle], Awaitable[None]] = _finishes,
) -> tuple[RunHandle, Exception | RunSnapshot]:
    """The race's steps up to the operator's resolution, then `then` while the second
    worker still runs; what the first query got back."""
    for attempt in range(3):
        client = await race.connect()
        first = race.first_worker()
        try:
            run = await client.start_run(agent, "my vpn is down")
            await race.until_journal(kind="tool", tool="manual_hang")
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(10)
        # The run is idle: its snapshot query goes to matching, and waits for a worker.
        before = await _dispatched()
        handle = client.temporal.get_workflow_handle(run.run_id)
        query = asyncio.create_task(handle.query(Handler.SNAPSHOT, result_type=RunSnapshot))
        if await race.dispatched_first(run, before):
            break
        query.cancel()
        await handle.terminate("the query came after the timeout: trying the race again")
        assert attempt < 2, "three times the heartbeat timed out before the query was sent"
        race.start_again()
    async with contextlib.AsyncExitStack() as stack:
        await _fresh_worker(client, stack, guarded=guarded)
        await race.until_in_history(run, EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT)
        first_answer = await _answer(query)
        # The operator resolves the call as soon as a snapshot says it is blocked (durably's
        # client asks again while a guard refuses: the run's next task has run by then).
        snap = first_answer if isinstance(first_answer, RunSnapshot) else await run.snapshot()
        assert snap.status == RunStatus.NEEDS_ATTENTION, snap
        await run.resolve_tool("tool:1:c1", {"type": "json", "value": {"ticket_id": "T-7"}})
        await then(run)
    return run, first_answer


async def _wedging_race(race: Race, **steps: Any) -> tuple[RunHandle, Exception | RunSnapshot]:
    """The race's steps without the guard, until they leave a history that does not
    replay: on a loaded machine the resolution can still reach a task of its own (the
    timeout's task ran first), and the steps are tried again."""
    for _ in range(3):
        run, first_answer = await _race(race, guarded=False, **steps)
        assert race.client is not None
        if await _replay_failure(race.client, run) is not None:
            return run, first_answer
        with contextlib.suppress(RPCError):  # a run that completed needs no terminating
            await race.client.temporal.get_workflow_handle(run.run_id).terminate("try again")
        race.start_again()
    raise AssertionError("three times the resolution reached a task of its own")


class TestQueryRace:
    async def test_the_race_leaves_an_unreplayable_history_that_repair_brings_back(
        self, race: Race
    ) -> None:
        """Without the guard, the fresh worker answers from the early timeout, and the
        resolution it accepts in the same task cannot be replayed (the run completed, but
        any worker that rebuilds it fails). `repair` resets it past that task: the
        resolution is asked for again, the model's committed final answer is kept (not
        asked again), and the manual tool ran once in all."""
        run, first_answer = await _wedging_race(race)

        assert isinstance(first_answer, RunSnapshot), first_answer
        assert first_answer.status == RunStatus.NEEDS_ATTENTION
        client = race.client
        assert client is not None
        failure = await _replay_failure(client, run)
        assert failure is not None and "Nondeterminism" in failure, failure

        async with await DurableRuntime.open(
            client=client, agents=crash_agents.registrations
        ) as runtime:
            await runtime.resume()
            report = await run.repair(responder="oncall", reason="the query race")
            assert "Nondeterminism" in report.replay_failure
            assert [(f.operation, f.outcome) for f in report.fates] == [("model:2", "completed")]
            snap = await wait_for_status(run, RunStatus.NEEDS_ATTENTION, within=60)
            assert snap.blocked_operation == "tool:1:c1"
            await run.resolve_tool("tool:1:c1", {"type": "json", "value": {"ticket_id": "T-7"}})
            await _finishes(run)
            snap = await run.snapshot()

        assert len(race.journal_entries(kind="tool", tool="manual_hang")) == 1
        assert len(race.journal_entries(kind="model", turn=2)) == 1
        repaired = [e for e in snap.events if e.type == "repaired"]
        assert len(repaired) == 1 and "by oncall (the query race)" in (repaired[0].detail or "")
        assert await _replay_failure(client, run) is None
        await record_history(client, run.run_id, "repaired_after_the_query_race")

    async def test_the_guard_refuses_that_query_once_and_the_history_replays(
        self, race: Race
    ) -> None:
        """With durably's worker, the same steps: the early query is refused (the worker
        lets go of the run), durably's client asks again, and the history replays."""
        run, first_answer = await _race(race, guarded=True)

        assert isinstance(first_answer, WorkflowQueryFailedError), first_answer
        assert refused(first_answer), first_answer
        assert race.client is not None
        assert await _replay_failure(race.client, run) is None


class TestClosedRuns:
    async def test_a_run_terminated_before_a_task_took_its_timeout_is_answered(
        self, race: Race
    ) -> None:
        """A run terminated while its call's heartbeat timeout waited for a task: every
        rebuild for a query applies that timeout live, as in the race, but no task can
        follow a closed run. Its worker refuses the first query and answers the one asked
        again at the same history (before, every query of it was refused for good)."""
        client = await race.connect()
        first = race.first_worker()
        try:
            run = await client.start_run("manual", "my vpn is down")
            await race.until_journal(kind="tool", tool="manual_hang")
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(10)
        await race.until_in_history(run, EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT)
        handle = client.temporal.get_workflow_handle(run.run_id)
        await handle.terminate("closed before any task took the timeout")
        async with await DurableRuntime.open(
            client=client, agents=crash_agents.registrations
        ) as runtime:
            await runtime.resume()
            snap = await run.snapshot()
        assert snap.run_id == run.run_id
        assert await _replay_failure(client, run) is None


# The path the 2,500-run soak found: a worker starved past the workflow task timeout
# takes the run's next task and never answers it. Its start is in history when the
# fresh worker takes the query, and Core stamps the early activation with that start.
STARVED = "starved-worker"
# The dead worker's sticky queue holds the query this long: past the (slow) heartbeat
# timeout, so the starved worker has the task first, and short of that task's own
# 10 s timeout after it, so the fresh worker answers the query while the task is out.
STARVED_STICKY_SECONDS = crash_agents.SLOW_HEARTBEAT.total_seconds() + 5


async def _starved_race(
    race: Race, tmp: Path, *, guarded: bool
) -> tuple[RunHandle, Exception | RunSnapshot]:
    """The starved worker's path up to the operator's resolution, then the run's end."""
    for attempt in range(3):
        race.journal = tmp / f"journal-{attempt}.jsonl"
        race.journal.touch()
        client = await race.connect()
        first = race.first_worker(sticky_seconds=STARVED_STICKY_SECONDS)
        try:
            run = await client.start_run("manual-slow-heartbeat", "my vpn is down")
            await race.until_journal(kind="tool", tool="manual_hang")
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(10)
        handle = client.temporal.get_workflow_handle(run.run_id)
        # Sent while the run is idle, the query waits on the dead worker's sticky queue.
        query = asyncio.create_task(handle.query(Handler.SNAPSHOT, result_type=RunSnapshot))
        taken = await client.temporal.workflow_service.poll_workflow_task_queue(
            PollWorkflowTaskQueueRequest(
                namespace=QUIET_NAMESPACE,
                task_queue=TaskQueue(
                    name=race.task_queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL
                ),
                identity=STARVED,
            ),
            timeout=timedelta(seconds=90),
        )
        if taken.started_event_id and not taken.HasField("query"):
            async with contextlib.AsyncExitStack() as stack:
                await _fresh_worker(client, stack, guarded=guarded)
                first_answer = await _answer(query)
                if not await _in_history(handle, EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT):
                    # The starved worker still holds the task: the operator resolves the
                    # call as soon as a snapshot says it is blocked.
                    snap = first_answer
                    if not isinstance(snap, RunSnapshot):
                        snap = await run.snapshot()
                    assert snap.status == RunStatus.NEEDS_ATTENTION, snap
                    await run.resolve_tool(
                        "tool:1:c1", {"type": "json", "value": {"ticket_id": "T-7"}}
                    )
                    await _finishes(run)
                    return run, first_answer
        # The server's timing put the query elsewhere (a loaded machine): try again.
        query.cancel()
        await handle.terminate("the starved worker's path did not happen: trying again")
        race.start_again()
    raise AssertionError("three times the starved worker's path did not happen")


async def _fresh_worker(
    client: DurableClient, stack: contextlib.AsyncExitStack, *, guarded: bool
) -> None:
    if guarded:
        runtime = await DurableRuntime.open(client=client, agents=crash_agents.registrations)
        await runtime.resume()
        stack.push_async_callback(runtime.close)
    else:
        worker = _unguarded_worker(client)
        serving = asyncio.create_task(worker.run())
        stack.push_async_callback(lambda: serving)
        stack.push_async_callback(worker.shutdown)


async def _in_history(handle: WorkflowHandle[Any, Any], event_type: EventType.ValueType) -> bool:
    return any(e.event_type == event_type for e in (await handle.fetch_history()).events)


async def _answer(query: asyncio.Task[RunSnapshot]) -> Exception | RunSnapshot:
    """What the first query got back: the snapshot, or the failure (a guard's refusal)."""
    try:
        return await query
    except WorkflowQueryFailedError as err:
        return err


class TestAStarvedWorker:
    async def test_a_task_a_starved_worker_lost_hides_the_early_query_from_no_guard(
        self, env: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The same steps, side by side: the SDK's runner answers the early query and the
        run's history does not replay; durably's refuses it (a worker's first legacy query
        of a run it applied live events of), and the history replays. In both, the task
        the starved worker took timed out between the call's heartbeat timeout and the
        task that took the resolution, and the manual tool ran once."""
        fresh_journal = tmp_path / "fresh-workers.jsonl"  # what this process's workers ran
        monkeypatch.setenv("DURABLY_TEST_JOURNAL", str(fresh_journal))
        for name in ("sdk", "durably"):
            (tmp_path / name).mkdir()
        races = [Race(env, tmp_path / name) for name in ("sdk", "durably")]
        (sdk_run, sdk_answer), (run, answer) = await asyncio.gather(
            _starved_race(races[0], tmp_path / "sdk", guarded=False),
            _starved_race(races[1], tmp_path / "durably", guarded=True),
        )

        assert isinstance(sdk_answer, RunSnapshot), sdk_answer
        assert isinstance(answer, WorkflowQueryFailedError) and refused(answer), answer
        for race, each in zip(races, (sdk_run, run), strict=True):
            assert race.client is not None
            events = (await _history(race.client, each)).events
            starved = [
                i
                for i, e in enumerate(events)
                if e.workflow_task_started_event_attributes.identity == STARVED
            ]
            assert len(starved) == 1, starved
            lost = events[starved[0] + 1]
            assert lost.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT, lost
            assert len(race.journal_entries(kind="tool", tool="manual_hang")) == 1
        assert "manual_hang" not in fresh_journal.read_text()  # no fresh worker ran it again
        assert races[0].client is not None and races[1].client is not None
        failure = await _replay_failure(races[0].client, sdk_run)
        assert failure is not None and "Nondeterminism" in failure, failure
        assert await _replay_failure(races[1].client, run) is None
        await record_history(races[1].client, run.run_id, "guard_refused_after_a_starved_task")


class TestRepair:
    async def test_repair_brings_back_a_wedged_open_run_running_no_manual_call_twice(
        self, race: Race
    ) -> None:
        """A run the race left open (its final answer hung) is wedged once a fresh worker
        takes it: every workflow task fails (TMPRL1100). Repair resets it past the task;
        the model request it discarded (its outcome unknown) runs again, the resolution is
        asked for again, and the manual tool ran once in all."""

        async def answering(run: RunHandle) -> None:  # the final answer's first attempt hangs
            await race.until_journal(kind="model", turn=2, attempt=1)

        run, _ = await _wedging_race(race, agent="manual-slow-answer", then=answering)
        client = race.client
        assert client is not None
        async with await DurableRuntime.open(
            client=client, agents=crash_agents.registrations
        ) as runtime:
            await runtime.resume()
            await race.until_in_history(run, EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED)
            failures = task_failures((await _history(client, run)).events)
            assert set(failures) == {"NON_DETERMINISTIC_ERROR"}, failures

            report = await run.repair(responder="oncall", reason="the query race")

            assert [(f.operation, f.outcome) for f in report.fates] == [("model:2", "uncertain")]
            snap = await wait_for_status(run, RunStatus.NEEDS_ATTENTION, within=60)
            assert snap.blocked_operation == "tool:1:c1"
            await run.resolve_tool("tool:1:c1", {"type": "json", "value": {"ticket_id": "T-7"}})
            await _finishes(run)

        assert len(race.journal_entries(kind="tool", tool="manual_hang")) == 1
        assert await _replay_failure(client, run) is None
        await record_history(client, run.run_id, "repaired_a_wedged_open_run")

    async def test_a_run_that_replays_is_not_reset(self, race: Race) -> None:
        """Repair refuses a healthy run, changing nothing."""
        client = await race.connect()
        async with await DurableRuntime.open(
            client=client, agents=crash_agents.registrations
        ) as runtime:
            await runtime.resume()
            run = await client.start_run("commit-window", "quick")
            with pytest.raises(DurableConflictError, match="not wedged"):
                await run.repair(responder="oncall")
            shown = await cli(
                *(binary("durably"), "repair", run.run_id, "--as", "oncall"),
                *("--target", race.target, "--namespace", QUIET_NAMESPACE),
            )
            assert shown.returncode == 1, shown
            assert "not wedged, so there is nothing to repair" in " ".join(shown.stderr.split())
            assert (await _history(client, run)).events[-1].event_type != (
                EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED
            )


async def _history(client: DurableClient, run: RunHandle) -> WorkflowHistory:
    return await client.temporal.get_workflow_handle(run.run_id).fetch_history()


# A workflow whose workflow task fails (a bug, or a worker that died holding it) until
# the test lets it through: between attempts the server answers no query.
_TASK_FAILS = {"now": True}


@workflow.defn(name="durably-test-failing-task", sandboxed=False)
class _FailingTask:
    def __init__(self) -> None:
        self._poked = False

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: self._poked)
        if _TASK_FAILS["now"]:
            raise RuntimeError("this workflow task fails until the test says otherwise")
        await workflow.wait_condition(lambda: False)

    @workflow.signal
    def poke(self) -> None:
        self._poked = True

    @workflow.query
    def ready(self) -> str:
        return "ready"


class TestPatientAsk:
    async def test_a_patient_query_waits_while_the_runs_workflow_task_is_retried(
        self, env: WorkflowEnvironment
    ) -> None:
        """A session's next run reads the earlier run's transcript by query; the server
        refuses every query while that run's workflow task is on a later attempt (seen in
        the 2,500-run soak, after a kill): the patient ask waits it out instead of failing
        the model request."""
        _TASK_FAILS["now"] = True
        task_queue = f"failing-{uuid.uuid4().hex[:8]}"
        async with Worker(
            env.client,
            task_queue=task_queue,
            workflows=[_FailingTask],
            workflow_runner=UnsandboxedWorkflowRunner(),
        ):
            handle = await env.client.start_workflow(
                _FailingTask.run, id=f"failing-{uuid.uuid4().hex[:8]}", task_queue=task_queue
            )
            assert await ask(handle, "ready", result_type=str) == "ready"
            await handle.signal(_FailingTask.poke)

            async def task_retried() -> bool:
                pending = (await handle.describe()).raw_description.pending_workflow_task
                return pending.attempt > 2

            await eventually(task_retried)
            with pytest.raises(RPCError) as impatient:
                await ask(handle, "ready", result_type=str)
            assert impatient.value.status == RPCStatusCode.FAILED_PRECONDITION

            answer = asyncio.create_task(
                ask(handle, "ready", result_type=str, patient=True, within=timedelta(minutes=2))
            )
            _TASK_FAILS["now"] = False  # the next attempt (Temporal's backoff) gets through
            assert await answer == "ready"
            await handle.terminate()
