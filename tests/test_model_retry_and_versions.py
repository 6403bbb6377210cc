"""Model retry with persisted backoff, version checks, and the live registry."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    DurableConflictError,
    DurableRuntime,
    FunctionModel,
    ModelRequest,
    ModelRetry,
    RegistrationError,
    RunStatus,
    ScriptedModel,
    ToolContext,
    VersionMissing,
    tool,
)
from durably.dev import DevServer
from durably.messages import AssistantMessage, ToolCall
from durably.models import ModelErrorVerdict, last_tool_results
from durably.testing import capture_logs

from .conftest import Runtimes, eventually, record_history, serving, wait_for_status


class Overloaded(Exception):
    """What a provider adapter raises for a 429, with its Retry-After."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"rate limited, retry after {retry_after} s")
        self.retry_after = retry_after


def flaky_model(failures: int, attempts: list[tuple[int, float]]) -> FunctionModel:
    """Fails its first `failures` attempts, then answers (it counts the attempts itself:
    under `model_retry` each is an activity of its own, Temporal's attempt 1)."""

    def answer(request: ModelRequest) -> AssistantMessage:
        attempt = len(attempts) + 1
        attempts.append((attempt, time.monotonic()))
        if attempt <= failures:
            raise Overloaded(retry_after=7) if failures == 99 else ConnectionError("upstream reset")
        return AssistantMessage(content=f"answered on attempt {attempt}")

    return FunctionModel(answer, name="flaky")


class TestModelRetry:
    async def test_a_model_failing_twice_then_succeeding_completes_after_a_visible_retry_wait(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        attempts: list[tuple[int, float]] = []
        agent = Agent(id="flaky", model=flaky_model(2, attempts), instructions="")
        retry = ModelRetry(max_attempts=3, initial_delay_ms=1500, max_delay_ms=3000)
        await runtimes.start([AgentRegistration(agent, version="1", model_retry=retry)])
        run = await client.start_run("flaky", "hello")

        waiting = await wait_for_status(run, RunStatus.RETRY_WAIT)
        assert waiting.next_attempt_at is not None
        assert waiting.next_attempt_at > datetime.now(UTC)
        assert waiting.attempt == 2
        assert "upstream reset" in (waiting.error or "")

        async def findable() -> bool:  # in visibility, as the Web UI's filter finds it
            listed = await client.list_runs(status=RunStatus.RETRY_WAIT)
            return run.run_id in {r.run_id for r in listed}

        await eventually(findable)
        assert (waiting.current or "").startswith("**Retrying the model request at")
        result = await run.result()

        assert result.output == "answered on attempt 3"
        assert [a for a, _ in attempts] == [1, 2, 3]
        assert attempts[1][1] - attempts[0][1] >= 1.4
        assert attempts[2][1] - attempts[1][1] >= 2.9  # backoff 2.0
        await record_history(client, run.run_id, "completed_after_model_retry_wait")

    async def test_a_retried_model_error_logs_one_line_per_attempt_and_no_traceback(
        self, client: DurableClient, runtimes: Runtimes, caplog: pytest.LogCaptureFixture
    ) -> None:
        """The worker's log says what failed, once per attempt; the traceback is at debug."""
        attempts: list[tuple[int, float]] = []
        agent = Agent(id="flaky", model=flaky_model(1, attempts), instructions="")
        retry = ModelRetry(max_attempts=2, initial_delay_ms=10, max_delay_ms=10)
        await runtimes.start([AgentRegistration(agent, version="1", model_retry=retry)])
        caplog.set_level(logging.INFO)

        with capture_logs() as logged:
            run = await client.start_run("flaky", "hello")
            assert (await run.result()).output == "answered on attempt 2"

        failures = [e for e in logged if e["event"] == "model request failed"]
        assert [(e["log_level"], e["attempt"]) for e in failures] == [("warning", 1)]
        loud = [r for r in caplog.records if r.levelno >= logging.WARNING and r.exc_info]
        assert loud == [], [r.getMessage() for r in loud]

    async def test_without_model_retry_a_model_error_fails_the_run_at_once(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        attempts: list[tuple[int, float]] = []
        agent = Agent(id="flaky", model=flaky_model(1, attempts), instructions="")
        await runtimes.start([AgentRegistration(agent, version="1")])
        run = await client.start_run("flaky", "hello")

        snap = await wait_for_status(run, RunStatus.FAILED)

        assert "ConnectionError: upstream reset" in (snap.error or "")
        assert [a for a, _ in attempts] == [1]
        accepted = await run.retry()
        assert accepted.operation == "model:1"
        # retry() asks the model again, once.
        assert (await run.result()).output == "answered on attempt 2"
        assert [a for a, _ in attempts] == [1, 2]

    async def test_retry_after_from_the_provider_sets_the_next_delay(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        attempts: list[tuple[int, float]] = []

        def classify(error: BaseException) -> ModelErrorVerdict:
            if isinstance(error, Overloaded):
                return ModelErrorVerdict(True, timedelta(seconds=error.retry_after))
            return ModelErrorVerdict(True)

        base = flaky_model(99, attempts)

        def first_fails(request: ModelRequest) -> AssistantMessage:
            if not attempts:
                return base._fn(request)  # type: ignore[return-value]
            attempts.append((len(attempts) + 1, time.monotonic()))
            return AssistantMessage(content="after the wait")

        model = FunctionModel(first_fails, name="rate-limited", classify_error=classify)
        retry = ModelRetry(max_attempts=3, initial_delay_ms=100, max_delay_ms=30_000)
        agent = Agent(id="limited", model=model, instructions="")
        await runtimes.start([AgentRegistration(agent, version="1", model_retry=retry)])
        run = await client.start_run("limited", "hello")

        result = await asyncio.wait_for(run.result(), 60)

        assert result.output == "after the wait"
        waited = attempts[1][1] - attempts[0][1]
        assert 6.5 <= waited <= 12, waited


class TestRetryWait:
    """The run's own wait between model attempts (the seed-fidelity patch)."""

    async def test_cancelling_a_run_in_retry_wait_ends_it_with_no_attempt_pending(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        attempts: list[tuple[int, float]] = []
        agent = Agent(id="flaky", model=flaky_model(1, attempts), instructions="")
        retry = ModelRetry(max_attempts=2, initial_delay_ms=60_000, max_delay_ms=60_000)
        await runtimes.start([AgentRegistration(agent, version="1", model_retry=retry)])
        run = await client.start_run("flaky", "hello")
        await wait_for_status(run, RunStatus.RETRY_WAIT)

        with pytest.raises(DurableConflictError, match="waiting to retry its model request"):
            await run.retry()
        await run.cancel()

        snap = await run.snapshot()
        assert snap.status == RunStatus.CANCELLED
        assert (snap.next_attempt_at, snap.attempt) == (None, None)
        assert len(attempts) == 1

    async def test_attempts_used_up_fail_the_run_and_retry_starts_them_again(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        attempts: list[tuple[int, float]] = []
        agent = Agent(id="flaky", model=flaky_model(3, attempts), instructions="")
        retry = ModelRetry(max_attempts=2, initial_delay_ms=10, max_delay_ms=10)
        await runtimes.start([AgentRegistration(agent, version="1", model_retry=retry)])
        run = await client.start_run("flaky", "hello")

        failed = await wait_for_status(run, RunStatus.FAILED)
        assert len(attempts) == 2 and "upstream reset" in (failed.error or "")
        await run.retry()  # two fresh attempts: the third call fails, the fourth answers

        assert (await run.result()).output == "answered on attempt 4"

    async def test_a_retry_after_in_the_past_waits_the_policys_backoff(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """A classifier may compute Retry-After from a date already gone: never a stuck run."""
        attempts: list[tuple[int, float]] = []
        model = flaky_model(1, attempts)
        model = FunctionModel(
            model._fn,  # type: ignore[arg-type]
            name="past-date",
            classify_error=lambda error: ModelErrorVerdict(True, timedelta(seconds=-5)),
        )
        retry = ModelRetry(max_attempts=2, initial_delay_ms=10, max_delay_ms=10)
        agent = Agent(id="flaky", model=model, instructions="")
        await runtimes.start([AgentRegistration(agent, version="1", model_retry=retry)])
        run = await client.start_run("flaky", "hello")

        assert (await asyncio.wait_for(run.result(), 30)).output == "answered on attempt 2"

    async def test_a_long_retry_wait_continues_as_new_and_keeps_counting(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """Each failed attempt adds a dozen events: with many attempts the run continues
        as new between them, and the attempts go on where they were."""
        attempts: list[tuple[int, float]] = []
        agent = Agent(id="flaky", model=flaky_model(9, attempts), instructions="")
        retry = ModelRetry(max_attempts=9, initial_delay_ms=10, max_delay_ms=10)
        registration = AgentRegistration(
            agent, version="1", model_retry=retry, continue_as_new_events=40
        )
        await runtimes.start([registration])
        run = await client.start_run("flaky", "hello")

        await wait_for_status(run, RunStatus.FAILED)  # after exactly max_attempts, not more
        assert len(attempts) == 9
        chain = [w async for w in client.temporal.list_workflows(f"WorkflowId = '{run.run_id}'")]
        assert len(chain) >= 2, "the run never continued as new"
        await run.retry()
        assert (await run.result()).output == "answered on attempt 10"
        await record_history(client, run.run_id, "completed_after_continuing_while_retrying")


async def test_a_retry_wait_survives_a_dev_server_restart(dev_server: DevServer) -> None:
    attempts: list[tuple[int, float]] = []
    agent = Agent(id="flaky", model=flaky_model(1, attempts), instructions="")
    retry = ModelRetry(max_attempts=2, initial_delay_ms=12_000, max_delay_ms=12_000)
    agents = [AgentRegistration(agent, version="1", model_retry=retry)]

    async with serving(dev_server, agents, "retry-restart") as client:
        run = await client.start_run("flaky", "hello")
        before = await wait_for_status(run, RunStatus.RETRY_WAIT)
    restarted_at = time.monotonic()
    async with serving(dev_server, agents, "retry-restart") as client:
        run = await client.get_run(run.run_id)
        after = await run.snapshot()
        assert after.status == RunStatus.RETRY_WAIT
        assert after.next_attempt_at == before.next_attempt_at
        result = await asyncio.wait_for(run.result(), 60)

    assert result.output == "answered on attempt 2"
    assert [a for a, _ in attempts] == [1, 2]
    assert attempts[1][1] > restarted_at


class Refund(BaseModel):
    order: str


def approval_agent(instructions: str, calls: list[str]) -> Agent:
    """An agent whose run waits for an approval before its tool runs."""

    @tool(requires_approval=True)
    async def refund(args: Refund, ctx: ToolContext) -> str:
        """Refund an order."""
        calls.append(f"tool {args.order}")
        return f"refunded {args.order}"

    def model(request: ModelRequest) -> AssistantMessage:
        calls.append(f"model {instructions}")
        if last_tool_results(request):
            return AssistantMessage(content=last_tool_results(request)[0].content)
        return AssistantMessage(
            tool_calls=(ToolCall(id="c1", name="refund", arguments={"order": "A1"}),)
        )

    return Agent(
        id="refunder",
        model=FunctionModel(model, name="refund-model"),
        instructions=instructions,
        tools=[refund],
    )


APPROVE = {"type": "tool-approval", "approved": True}


async def waiting_on_a_worker_that_then_stops(
    client: DurableClient, registration: AgentRegistration
) -> Any:
    """A refunder run waiting for approval, left behind by a worker that has stopped."""
    async with await DurableRuntime.open(client=client, agents=[registration]) as rt:
        await rt.resume()
        run = await client.start_run("refunder", "refund A1")
        await wait_for_status(run, RunStatus.WAITING)
    return run


class TestVersions:
    async def test_a_changed_definition_under_the_same_version_blocks_until_restored(
        self, client: DurableClient
    ) -> None:
        calls: list[str] = []
        original = AgentRegistration(approval_agent("Refund politely.", calls), version="1")
        changed = AgentRegistration(approval_agent("Refund rudely.", calls), version="1")

        run = await waiting_on_a_worker_that_then_stops(client, original)

        async with await DurableRuntime.open(client=client, agents=[changed]) as rt:
            await rt.resume()
            await run.respond("approval:1:c1", APPROVE, responder="alice")
            snap = await wait_for_status(run, RunStatus.NEEDS_ATTENTION)
            assert snap.attention is not None
            assert snap.attention.reason == "version_incompatible"
            assert snap.blocked_operation == "tool:1:c1"
            assert "differs from the one the run started with" in (snap.current or "")

        assert calls == ["model Refund politely."]  # neither the tool nor the changed model ran

        async with await DurableRuntime.open(client=client, agents=[original]) as rt:
            await rt.resume()
            assert (await run.snapshot()).status == RunStatus.NEEDS_ATTENTION  # nothing by itself
            await run.retry()
            result = await run.result()

        assert result.output == "refunded A1"
        assert calls == ["model Refund politely.", "tool A1", "model Refund politely."]

    async def test_a_missing_version_blocks_with_version_missing(
        self, client: DurableClient
    ) -> None:
        calls: list[str] = []
        v1 = AgentRegistration(approval_agent("v1", calls), version="1")
        v2 = AgentRegistration(approval_agent("v2", calls), version="2")

        run = await waiting_on_a_worker_that_then_stops(client, v1)

        async with await DurableRuntime.open(client=client, agents=[v2]) as rt:
            await rt.resume()
            await run.respond("approval:1:c1", APPROVE, responder="alice")
            snap = await wait_for_status(run, RunStatus.NEEDS_ATTENTION)
            assert snap.attention is not None and snap.attention.reason == "version_missing"
            rt.register_agents([v1])
            assert (await run.snapshot()).status == RunStatus.NEEDS_ATTENTION
            await run.retry()
            assert (await run.result()).output == "refunded A1"
        await record_history(client, run.run_id, "version_missing_then_retried")

    async def test_a_run_for_an_agent_no_worker_hosts_needs_attention_until_retried(
        self, client: DurableClient
    ) -> None:
        """The seed's version_missing at the pin: nothing is called, the run waits in
        needs_attention saying what to do, replays to the same snapshot, and `retry()`
        after registering the agent continues it."""
        calls: list[str] = []
        other = Agent(id="other", model=ScriptedModel(["hi"]), instructions="", tools=[])
        refunder = AgentRegistration(approval_agent("v1", calls), version="1")

        async with await DurableRuntime.open(
            client=client, agents=[AgentRegistration(other, version="1")]
        ) as rt:
            await rt.resume()
            run = await client.start_run("refunder", "refund A1")
            parked = await wait_for_status(run, RunStatus.NEEDS_ATTENTION)
        attention = parked.attention
        assert isinstance(attention, VersionMissing)
        assert (attention.agent_id, attention.version) == ("refunder", None)
        assert "agent 'refunder' is not registered on this worker" in (attention.last_error or "")
        assert "Register it with DurableRuntime.register_agents" in (attention.last_error or "")
        assert (parked.current or "").startswith("**Needs attention, waiting for `durably retry`")
        assert [e.type for e in parked.events] == ["needs_attention"]
        assert calls == []

        # A new worker replays the run from its history: the same snapshot.
        async with await DurableRuntime.open(client=client, agents=[refunder]) as rt:
            await rt.resume()
            assert await run.snapshot() == parked
            await run.retry()
            snap = await wait_for_status(run, RunStatus.WAITING)
            assert [e.type for e in snap.events][:3] == [
                "needs_attention",
                "retried",
                "agent_pinned",
            ]
            await run.respond("approval:1:c1", APPROVE, responder="alice")
            assert (await run.result()).output == "refunded A1"
        assert calls == ["model v1", "tool A1", "model v1"]
        await record_history(client, run.run_id, "version_missing_at_pin_then_retried")


class TestStartupRecipe:
    async def test_open_with_no_agents_then_register_exactly_what_unfinished_runs_need(
        self, client: DurableClient
    ) -> None:
        """The seed's startup: `open()` runs nothing (no worker polls) until `resume()`;
        `list_runs(unfinished=True)` names the (agent, version) pairs still needed."""
        calls: list[str] = []
        v1 = AgentRegistration(approval_agent("v1", calls), version="1")
        v2 = AgentRegistration(approval_agent("v2", calls), version="2")
        run = await waiting_on_a_worker_that_then_stops(client, v1)

        available = {("refunder", "1"): v1, ("refunder", "2"): v2}
        handle = client.temporal.get_workflow_handle(run.run_id)
        async with await DurableRuntime.open(client=client) as rt:
            # An update would wait for a worker; the signal is stored for the run.
            approve = {"interaction_id": "approval:1:c1", "response": APPROVE, "responder": "a"}
            await handle.signal("respond_signal", approve)

            async def needed() -> set[tuple[str, str]]:
                runs = await client.list_runs(unfinished=True, task_queue=client.task_queue)
                return {(r.agent_id or "", r.agent_version or "") for r in runs}

            async def only_v1_needed() -> bool:
                return await needed() == {("refunder", "1")}

            await eventually(only_v1_needed)
            rt.register_agents([available[pair] for pair in sorted(await needed())])
            # Opened, registered, and nothing ran: the signal's workflow task waits.
            last = (await handle.fetch_history()).events[-1].event_type
            assert last == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED
            assert calls == ["model v1"]
            await rt.resume()

            assert (await run.result()).output == "refunded A1"
        assert calls == ["model v1", "tool A1", "model v1"]


async def _settled(run: Any) -> Any:
    """The run once it waits for a person or an operator (it pins first)."""
    async with asyncio.timeout(30):
        while True:
            snap = await run.snapshot()
            if snap.status in (RunStatus.WAITING, RunStatus.NEEDS_ATTENTION, RunStatus.FAILED):
                return snap
            await asyncio.sleep(0.05)


class TestRegistry:
    async def test_a_run_racing_unregister_is_refused_by_it_or_parks_never_fails(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """Visibility trails a run just started, so the guard may miss it. Either way the
        run is safe: the guard refuses, or the run parks as version_missing on the worker
        that no longer hosts the agent; it never fails and never runs elsewhere."""
        calls: list[str] = []
        v1 = AgentRegistration(approval_agent("v1", calls), version="1")
        runtime = await runtimes.start([v1])
        outcomes: list[str] = []

        async def unregister() -> bool:
            try:
                return await runtime.unregister_agent("refunder")
            except DurableConflictError:
                return False

        async def none_unfinished() -> bool:  # what the guard reads has caught up
            return not await client.list_runs(unfinished=True, task_queue=client.task_queue)

        for attempt in range(8):
            await eventually(none_unfinished)
            if attempt % 2:  # the run just started, as visibility may not show yet
                run = await client.start_run("refunder", "refund A1")
                unregistered = await unregister()
            else:  # both at once: the guard most likely reads before the run exists
                run, unregistered = await asyncio.gather(
                    client.start_run("refunder", "refund A1"), unregister()
                )
            if not unregistered:
                outcomes.append("refused")
                await wait_for_status(run, RunStatus.WAITING)
                await run.cancel()
                continue
            snap = await _settled(run)
            if snap.status == RunStatus.WAITING:  # pinned just before: its tool call parks
                await run.respond("approval:1:c1", APPROVE, responder="alice")
                snap = await wait_for_status(run, RunStatus.NEEDS_ATTENTION)
            assert isinstance(snap.attention, VersionMissing), snap
            outcomes.append("parked")
            await run.cancel()
            runtime.register_agents([v1])
        assert "tool A1" not in calls
        assert set(outcomes) <= {"refused", "parked"}

    async def test_unregister_is_refused_while_a_run_needs_the_agent(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        calls: list[str] = []
        runtime = await runtimes.start([AgentRegistration(approval_agent("x", calls), version="1")])
        run = await client.start_run("refunder", "refund A1")
        await wait_for_status(run, RunStatus.WAITING)

        async def listed() -> bool:
            return run.run_id in [r.run_id for r in await client.list_runs(unfinished=True)]

        await eventually(listed)

        with pytest.raises(
            DurableConflictError, match=f"still needed by 1 unfinished run.*{run.run_id}"
        ):
            await runtime.unregister_agent("refunder")

        await run.respond("approval:1:c1", APPROVE, responder="alice")
        await run.result()

        async def none_unfinished() -> bool:
            runs = await client.list_runs(
                agent_id="refunder", unfinished=True, task_queue=client.task_queue
            )
            return not runs

        await eventually(none_unfinished)
        assert await runtime.unregister_agent("refunder") is True
        assert await runtime.unregister_agent("refunder") is False

    async def test_versions_side_by_side_new_runs_take_the_newest_unless_asked(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        def agent(answer: str) -> Agent:
            return Agent(id="greeter", model=ScriptedModel([answer]), instructions=answer)

        runtime = await runtimes.start(
            [
                AgentRegistration(agent("v2"), version="2"),
                AgentRegistration(agent("v10"), version="10"),
            ]
        )
        newest = await client.start_run("greeter", "hi")
        pinned = await client.start_run("greeter", "hi", version="2")

        assert (await newest.result()).output == "v10"
        assert (await pinned.result()).output == "v2"
        assert (await pinned.snapshot()).agent_version == "2"

        with pytest.raises(RegistrationError, match="Nothing in this batch was registered"):
            runtime.register_agents(
                [
                    AgentRegistration(agent("v3"), version="3"),
                    AgentRegistration(agent("other"), version="2"),
                ]
            )
        assert runtime.registry.versions("greeter") == ["2", "10"]
