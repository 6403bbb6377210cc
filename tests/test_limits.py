"""Usage limits and cost (SPEC section 17): a run that reaches a limit parks in
`needs_attention` (`budget_exceeded`) before its next operation, and goes on when an
operator raises the limit; cost comes from the registration's prices."""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Iterator

import pytest
from pydantic import BaseModel
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory, WorkflowUpdateFailedError
from temporalio.common import RawValue
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from durably import (
    Agent,
    AgentRegistration,
    BudgetExceeded,
    DurableClient,
    DurableConflictError,
    FunctionModel,
    InvalidResponseError,
    InvalidRunInputError,
    ModelRequest,
    ModelResponse,
    Price,
    RunStatus,
    ToolContext,
    Usage,
    UsageLimits,
    tool,
)
from durably.contract import Handler
from durably.messages import AssistantMessage, ToolCall
from durably.models import last_tool_results
from durably.workflows import AgentRunWorkflow

from .conftest import (
    TASK_BOOKKEEPING,
    Runtimes,
    binary,
    chain_histories,
    cli,
    eventually,
    failed_tasks,
    history_length,
    record_history,
    wait_for_status,
)
from .fake_providers import FakeOpenAI
from .test_replay import HISTORIES, recorded_id

# USD per million tokens: 1,000 input and 100 output tokens cost $0.013.
PRICES = {"gpt-4o-mini": Price(input=10.0, output=30.0, cached_input=2.5)}


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


class Order(BaseModel):
    order: str


def shop(model: object, looked_up: list[str], **settings: object) -> AgentRegistration:
    """An agent with one read-only tool that records every order it looks up."""

    @tool
    async def lookup(args: Order, ctx: ToolContext) -> str:
        """Look an order up."""
        looked_up.append(args.order)
        return f"order {args.order} shipped"

    agent = Agent(id="shop", model=model, instructions="Answer about orders.", tools=[lookup])  # type: ignore[arg-type]
    return AgentRegistration(
        agent,
        version="1",
        tool_recovery={"lookup": "safe"},
        prices=PRICES,
        **settings,  # type: ignore[arg-type]
    )


def calls(*orders: str) -> AssistantMessage:
    return AssistantMessage(
        tool_calls=tuple(
            ToolCall(id=f"c{n}", name="lookup", arguments={"order": o})
            for n, o in enumerate(orders, start=1)
        )
    )


class TestTokenAndCostLimits:
    async def test_a_token_limit_parks_before_the_next_request_and_raising_it_goes_on(
        self, client: DurableClient, runtimes: Runtimes, fake_openai: FakeOpenAI
    ) -> None:
        fake_openai.script(
            fake_openai.tool_calls(("call_1", "lookup", {"order": "A-1"}), usage=(1000, 100)),
            fake_openai.text("A-1 shipped.", usage=(1200, 10), cached=1000),
        )
        looked_up: list[str] = []
        await runtimes.start(
            [
                shop(
                    fake_openai.model(),
                    looked_up,
                    limits=UsageLimits(total_tokens=1000),
                    limit_cap=UsageLimits(total_tokens=10_000),
                )
            ]
        )
        run = await client.start_run("shop", "Where is A-1?")

        parked = await wait_for_status(run, RunStatus.NEEDS_ATTENTION)
        assert len(fake_openai.received) == 1 and looked_up == []
        attention = parked.attention
        assert isinstance(attention, BudgetExceeded)
        assert (attention.limit, attention.value, attention.used) == ("total_tokens", 1000, 1100)
        assert attention.operation == "tool:1:call_1" and attention.tool == "lookup"
        assert parked.blocked_operations == ["tool:1:call_1"]
        assert "waiting for `durably raise-limits`" in (parked.current or "")  # the Web UI's
        assert parked.usage.cost_usd == pytest.approx(0.013)
        model_event = next(e for e in parked.events if e.type == "model_completed")
        assert model_event.usage is not None and model_event.usage.input_tokens == 1000

        # What an operator may not do: rerun it as is, go past the cap, stay over the limit.
        with pytest.raises(DurableConflictError, match="raise_limits"):
            await run.retry()
        with pytest.raises(InvalidResponseError, match="10000"):
            await run.raise_limits({"total_tokens": 20_000})
        with pytest.raises(InvalidResponseError, match="still be over its total_tokens"):
            await run.raise_limits(UsageLimits(total_tokens=1050))
        assert (await run.snapshot()).limits == UsageLimits(total_tokens=1000)

        accepted = await run.raise_limits({"total_tokens": 5000}, responder="ops@example.com")
        assert accepted.resumed == ["tool:1:call_1"]
        result = await run.result()
        assert result.output == "A-1 shipped." and looked_up == ["A-1"]
        assert len(fake_openai.received) == 2
        # 1,000 + 200 uncached input at $10/M, 1,000 cached at $2.50/M, 110 output at $30/M.
        assert result.usage.cost_usd == pytest.approx(0.012 + 0.0025 + 0.0033)
        assert result.usage.cached_input_tokens == 1000
        assert result.usage.tool_calls == 1
        raised = next(e for e in (await run.snapshot()).events if e.type == "limits_raised")
        assert raised.detail == "total_tokens 5000 by ops@example.com"
        await record_history(client, run.run_id, "token_limit_parks_then_raised")

    async def test_a_cost_limit_parks_the_next_operation(
        self, client: DurableClient, runtimes: Runtimes, fake_openai: FakeOpenAI
    ) -> None:
        fake_openai.script(
            fake_openai.tool_calls(("call_1", "lookup", {"order": "A-1"}), usage=(1000, 100)),
            fake_openai.text("A-1 shipped.", usage=(10, 5)),
        )
        looked_up: list[str] = []
        await runtimes.start([shop(fake_openai.model(), looked_up)])
        # Cost is checked before every operation: the answer's tool call parks.
        run = await client.start_run("shop", "Where is A-1?", limits={"cost_usd": 0.01})

        parked = await wait_for_status(run, RunStatus.NEEDS_ATTENTION)
        attention = parked.attention
        assert isinstance(attention, BudgetExceeded)
        assert attention.limit == "cost_usd" and attention.used == pytest.approx(0.013)
        assert len(fake_openai.received) == 1 and looked_up == []
        # No limit_cap: a caller may raise a limit the registration does not set at all.
        await run.raise_limits({"cost_usd": 1.0})
        assert (await run.result()).output == "A-1 shipped."


def _answer(request: ModelRequest) -> ModelResponse:
    """Three lookups, then an answer naming what they returned."""
    results = last_tool_results(request)
    if not results:
        # A custom model may report no requests: each answer counts as one all the same.
        return ModelResponse(message=calls("1", "2", "3"), usage=Usage(input_tokens=5))
    return ModelResponse(
        message=AssistantMessage(content=json.dumps([r.content for r in results])),
        usage=Usage(input_tokens=5),
    )


class TestRequestAndToolCallLimits:
    async def test_a_tool_call_limit_parks_the_calls_of_a_batch_past_it(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        looked_up: list[str] = []
        await runtimes.start([shop(FunctionModel(_answer), looked_up)])
        run = await client.start_run("shop", "Look up 1, 2, 3", limits={"tool_calls": 2})

        parked = await wait_for_status(run, RunStatus.NEEDS_ATTENTION)
        assert parked.blocked_operations == ["tool:1:c3"]
        assert sorted(looked_up) == ["1", "2"]
        await run.raise_limits({"tool_calls": 3})
        result = await run.result()
        assert json.loads(result.output or "") == [f"order {n} shipped" for n in "123"]
        assert result.usage.tool_calls == 3 and result.usage.requests == 2
        await record_history(client, run.run_id, "tool_call_limit_in_a_batch")

    async def test_limits_and_max_turns_set_from_the_temporal_cli_json_are_honoured(
        self,
        env: WorkflowEnvironment,
        client: DurableClient,
        runtimes: Runtimes,
        task_queue: str,
    ) -> None:
        looked_up: list[str] = []
        await runtimes.start([shop(FunctionModel(_answer), looked_up)])

        async def temporal_start(run_id: str, run_input: dict[str, object]) -> None:
            done = await cli(
                binary("temporal"),
                *("workflow", "start", "--type", "AgentRunWorkflow", "--task-queue", task_queue),
                *("--address", env.client.service_client.config.target_host),
                *("--workflow-id", run_id, "--input", json.dumps(run_input)),
            )
            assert done.returncode == 0, done.stderr

        await temporal_start(
            "by-cli", {"agent_id": "shop", "input": "1 2 3", "limits": {"requests": 1}}
        )
        run = await client.get_run("by-cli")
        parked = await wait_for_status(run, RunStatus.NEEDS_ATTENTION)
        attention = parked.attention
        assert isinstance(attention, BudgetExceeded)
        assert (attention.limit, attention.operation) == ("requests", "model:2")
        assert sorted(looked_up) == ["1", "2", "3"]  # the answer's calls were paid for
        await run.raise_limits({"requests": 2})
        assert (await run.result()).usage.requests == 2
        await record_history(client, run.run_id, "request_limit_from_the_temporal_cli")

        await temporal_start("one-turn", {"agent_id": "shop", "input": "1 2 3", "max_turns": 1})
        failed = await wait_for_status(await client.get_run("one-turn"), RunStatus.FAILED)
        assert "the run used all 1 turns its starter gave it" in (failed.error or "")
        await record_history(client, "one-turn", "run_max_turns_from_the_temporal_cli")

    async def test_a_run_asking_for_more_than_the_registration_allows_is_refused(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        await runtimes.start(
            [shop(FunctionModel(_answer), [], limits=UsageLimits(requests=5), max_turns_cap=40)]
        )
        run = await client.start_run("shop", "hi", limits={"requests": 6})
        failed = await wait_for_status(run, RunStatus.FAILED)
        assert "requests 6 is above what agent 'shop' version '1' allows (5" in (failed.error or "")
        run = await client.start_run("shop", "hi", max_turns=41)
        failed = await wait_for_status(run, RunStatus.FAILED)
        assert "max_turns 41 is above" in (failed.error or "")
        await record_history(client, run.run_id, "max_turns_above_the_cap_refused")
        with pytest.raises(InvalidRunInputError, match="tokens"):
            await client.start_run("shop", "hi", limits={"tokens": 5})


class TestAttemptsCount:
    async def test_a_failed_attempts_tokens_count_toward_the_runs_usage(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        answers = [
            # An answer no activity result can hold: it fails, but it was paid for.
            ModelResponse(
                message=AssistantMessage(content="x" * (2 * 2**20)),
                usage=Usage(requests=1, input_tokens=500, output_tokens=600_000),
            ),
            ModelResponse(
                message=AssistantMessage(content="short"),
                usage=Usage(requests=1, input_tokens=500, output_tokens=2),
            ),
        ]
        await runtimes.start([shop(FunctionModel(lambda _: answers.pop(0)), [])])
        run = await client.start_run("shop", "hi")
        failed = await wait_for_status(run, RunStatus.FAILED)
        assert failed.usage.requests == 1 and failed.usage.output_tokens == 600_000
        await run.retry()
        result = await run.result()
        assert result.usage.requests == 2
        assert (result.usage.input_tokens, result.usage.output_tokens) == (1000, 600_002)
        await record_history(client, run.run_id, "failed_attempt_usage_counted")


class TestOperatorCommands:
    async def test_start_with_limits_then_runs_show_inbox_and_raise_limits(
        self,
        env: WorkflowEnvironment,
        client: DurableClient,
        runtimes: Runtimes,
        task_queue: str,
        fake_openai: FakeOpenAI,
    ) -> None:
        fake_openai.script(
            fake_openai.tool_calls(("call_1", "lookup", {"order": "A-1"}), usage=(1000, 100)),
            fake_openai.text("A-1 shipped.", usage=(10, 5)),
        )
        await runtimes.start([shop(fake_openai.model(), [])])

        async def durably(*args: str) -> str:
            target = env.client.service_client.config.target_host
            done = await cli(sys.executable, "-m", "durably", *args, "--target", target)
            assert done.returncode == 0, done.stderr + done.stdout
            return done.stdout

        await durably(
            "start", "shop", "Where is A-1?", "--run-id", "cli-limits", "--task-queue", task_queue,
            "--limit", "total_tokens=500", "--limit", "cost_usd=5", "--max-turns", "4",
        )  # fmt: skip
        run = await client.get_run("cli-limits")
        await wait_for_status(run, RunStatus.NEEDS_ATTENTION)

        shown = await durably("runs", "show", "cli-limits")
        assert "budget_exceeded" in shown and "total_tokens 500, cost_usd 5" in shown
        assert "1,000 input / 100 output tokens" in shown and "$0.0130" in shown
        assert "1 of 4" in shown
        inbox = await durably("inbox", "--task-queue", task_queue)
        assert "total_tokens limit (1100 of 500) is reached" in inbox

        raised = await durably("raise-limits", "cli-limits", "total_tokens=2000", "--as", "ops")
        assert "Going on with tool:1:call_1" in raised
        assert (await run.result()).output == "A-1 shipped."
        items = [i for i in await client.inbox(task_queue=task_queue) if i.run_id == "cli-limits"]
        assert items == []


DURABLY_REJECTIONS = ("InvalidResponseError", "DurableConflictError")


class TestRaiseLimitsFromAnyCaller:
    async def test_malformed_and_huge_raise_limits_are_refused_and_change_nothing(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """`raise_limits` sent raw by any Temporal client: each bad payload (wrong shapes,
        NaN, negatives, unknown limits, near 1 MB of JSON, 5,000 levels deep) is refused
        as a durably error, adds nothing to history, and fails no workflow task; the
        signal of that name is recorded as rejected."""
        looked_up: list[str] = []
        await runtimes.start(
            [shop(FunctionModel(_answer), looked_up, limit_cap=UsageLimits(tool_calls=10))]
        )
        run = await client.start_run("shop", "1 2 3", limits={"tool_calls": 1})
        await wait_for_status(run, RunStatus.NEEDS_ATTENTION)
        raw = client.temporal.get_workflow_handle(run.run_id)
        # 5,000 levels deep, as JSON no serializer would write.
        deep = RawValue(
            Payload(
                metadata={"encoding": b"json/plain"},
                data=b'{"limits": ' + b"[" * 5_000 + b"1" + b"]" * 5_000 + b"}",
            )
        )
        payloads: list[list[object]] = [
            [],
            [None],
            ["raise"],
            [{"limits": None}],
            [{"limits": {}}],
            [{"limits": {"tool_calls": -1}}],
            [{"limits": {"tool_calls": 11}}],  # above the cap
            [{"limits": {"tool_calls": 1}}],  # still over
            [{"limits": {"cost_usd": float("nan")}}],
            [{"limits": {"tokens": 5}}],
            [{"limits": {"tool_calls": "x" * 900_000}}],
            [{"limits": {"tool_calls": 5}, "responder": "r" * 900_000}],
            [{"limits": {"tool_calls": 5}}, {"limits": {"tool_calls": 6}}],
            [deep],
        ]
        before = await history_length(client, run)
        for args in payloads:
            with pytest.raises(WorkflowUpdateFailedError) as caught:
                await raw.execute_update(Handler.RAISE_LIMITS, args=args)
            cause = caught.value.cause
            assert isinstance(cause, ApplicationError)
            # Past what JSON decoding takes, the SDK refuses the update before durably sees it.
            expected = ("RuntimeError",) if args == [deep] else DURABLY_REJECTIONS
            assert cause.type in expected, cause
            assert cause.message and len(cause.message) < 2_000
        assert await history_length(client, run) == before
        events_before = (await raw.fetch_history()).events
        await raw.signal(Handler.RAISE_LIMITS, {"limits": {"tool_calls": 5}})

        async def rejected() -> bool:
            return any(e.type == "signal_rejected" for e in (await run.snapshot()).events)

        await eventually(rejected)
        # The signal, and the marker of `durably-signals-commute` (the run's first signal),
        # beside the bookkeeping of the task that took it.
        # The signal, and the marker of `durably-signals-commute` (the run's first signal)
        # with the SDK's `TemporalChangeVersion` upsert, beside the bookkeeping of the task
        # that took it: no state of the run's own.
        added = [
            e
            for e in (await raw.fetch_history()).events[len(events_before) :]
            if e.event_type not in TASK_BOOKKEEPING
        ]
        assert sorted(EventType.Name(e.event_type) for e in added) == [
            "EVENT_TYPE_MARKER_RECORDED",
            "EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES",
            "EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED",
        ], added
        upserted = [
            set(
                e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
            )
            for e in added
            if e.HasField("upsert_workflow_search_attributes_event_attributes")
        ]
        assert upserted == [{"TemporalChangeVersion"}]
        snap = await run.snapshot()
        assert snap.status == RunStatus.NEEDS_ATTENTION and snap.limits == UsageLimits(tool_calls=1)
        assert failed_tasks(await chain_histories(client, run.run_id)) == []
        await run.raise_limits({"tool_calls": 3})
        assert (await run.result()).usage.tool_calls == 3 and len(looked_up) == 3


class TestHistoriesFromBeforeLimits:
    @pytest.mark.parametrize(
        "own",
        [
            {"max_turns": 0},
            {"limits": {"tokens": 5}},
            {"limits": "none", "max_turns": 1},  # valid turns: applied only where it bites
        ],
    )
    async def test_start_inputs_the_old_code_ignored_still_replay(
        self, own: dict[str, object]
    ) -> None:
        """Before the limits patch `limits` and `max_turns` were unknown keys, ignored
        whatever they held: a run started then with such keys replays as it ran."""
        name = "durably-parallel-tools/completed_after_model_retry_wait"
        history = json.loads(HISTORIES[name])
        started = history["events"][0]["workflowExecutionStartedEventAttributes"]
        payload = started["input"]["payloads"][0]
        run_input = json.loads(base64.b64decode(payload["data"]))
        payload["data"] = base64.b64encode(json.dumps({**run_input, **own}).encode()).decode()
        replayer = Replayer(workflows=[AgentRunWorkflow], data_converter=pydantic_data_converter)
        await replayer.replay_workflow(
            WorkflowHistory.from_json(recorded_id(name), json.dumps(history))
        )
