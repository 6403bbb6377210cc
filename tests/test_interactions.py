"""Approvals and questions: waiting runs, respond by update or signal, the inbox."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    DurableRuntime,
    FunctionModel,
    InteractionConflictError,
    InvalidResponseError,
    ModelRequest,
    ModelRetry,
    RunStatus,
    ScriptedModel,
    ToolContext,
    ToolRetry,
    tool,
)
from durably.contract import SA_STATUS, SEARCH_ATTRIBUTES
from durably.dev import DevServer
from durably.messages import AssistantMessage, ToolCall
from durably.models import tool_call
from durably.tools import question_tool

from .conftest import (
    Runtimes,
    asker,
    binary,
    cli,
    echo,
    eventually,
    history_length,
    operation_id,
    record_history,
    search_attribute,
    serving,
    wait_for_interaction,
    wait_for_status,
)


class Refund(BaseModel):
    order: str
    amount: int


class Receipt(BaseModel):
    refund_id: str


class Refunds:
    """The external system: refunds that really happened."""

    def __init__(self) -> None:
        self.made: list[tuple[str, str]] = []
        self.release = asyncio.Event()
        self.release.set()

    def registration(
        self, *calls: ToolCall, approval_timeout: timedelta | None = None
    ) -> AgentRegistration:
        refunds = self

        @tool(requires_approval=True, approval_timeout=approval_timeout)
        async def refund(args: Refund, ctx: ToolContext) -> Receipt:
            """Refund an order."""
            await refunds.release.wait()
            refunds.made.append((args.order, ctx.operation_id))
            return Receipt(refund_id=f"R-{args.order}")

        calls = calls or (
            ToolCall(id="c1", name="refund", arguments={"order": "A1", "amount": 30}),
        )
        agent = Agent(
            id="refunder",
            model=ScriptedModel([AssistantMessage(tool_calls=calls), echo]),
            instructions="",
            tools=[refund],
        )
        return AgentRegistration(
            agent,
            version="1",
            tool_recovery={"refund": "idempotent"},
            tool_retry=ToolRetry(2, 10, 10),
        )


APPROVE = {"type": "tool-approval", "approved": True}


class TestWhatAPersonReads:
    async def test_the_signal_the_web_ui_shows_can_be_pasted_to_approve(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """Current details hold the `respond_signal` input for this call; sent as it
        reads (a name filled in), it approves exactly this call."""
        refunds = Refunds()
        await runtimes.start([refunds.registration()])
        run = await client.start_run("refunder", "refund A1")
        snap = await wait_for_status(run, RunStatus.WAITING)

        shown = (snap.current or "").split("`respond_signal` with input `", 1)[1]
        pasted = json.loads(shown.split("`", 1)[0].replace('"NAME"', '"alice"'))
        await client.temporal.get_workflow_handle(run.run_id).signal("respond_signal", pasted)

        assert (await run.result()).output is not None
        assert [order for order, _ in refunds.made] == ["A1"]
        assert pasted["response"]["args_digest"] == (snap.interaction or _none()).args_digest

    async def test_the_runs_input_holds_only_what_the_caller_gave(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """The Web UI shows the start input: no internal (`carried`) or empty fields."""
        await runtimes.start([Refunds().registration()])
        run = await client.start_run("refunder", "refund A1")

        history = await client.temporal.get_workflow_handle(run.run_id).fetch_history()
        started = history.events[0].workflow_execution_started_event_attributes
        await run.cancel()

        assert json.loads(started.input.payloads[0].data) == {
            "agent_id": "refunder",
            "input": "refund A1",
        }


def _none() -> Any:
    raise AssertionError("the run shows no interaction")


class TestApproval:
    async def test_a_waiting_run_shows_the_call_and_runs_it_only_once_approved(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        refunds = Refunds()
        await runtimes.start([refunds.registration()])
        run = await client.start_run("refunder", "refund A1")

        snap = await wait_for_status(run, RunStatus.WAITING)

        interaction = snap.interaction
        assert interaction is not None
        assert interaction.id == "approval:1:c1"
        assert interaction.type == "tool-approval"
        assert interaction.operation == "tool:1:c1"
        assert (interaction.tool, interaction.args) == (
            "refund",
            {"order": "A1", "amount": 30},
        )
        assert len(interaction.args_digest) == 32
        shown = 'of tool `refund` with `{"order":"A1","amount":30}`'
        assert f"Waiting for approval** (`approval:1:c1`) {shown}" in (snap.current or "")
        assert await search_attribute(client, run, SA_STATUS, "waiting") == "waiting"
        assert refunds.made == []

        accepted = await run.respond(
            "approval:1:c1",
            {**APPROVE, "args_digest": interaction.args_digest},
            responder="alice",
        )
        result = await run.result()

        assert (accepted.approved, accepted.responder) == (True, "alice")
        assert accepted.identity == client.temporal.identity  # recorded beside the name
        assert refunds.made == [("A1", await operation_id(client, run, "tool:1:c1"))]
        assert json.loads(result.output or "") == [
            {"error": False, "content": '{"refund_id":"R-A1"}'}
        ]
        events = {e.type: e for e in (await run.snapshot()).events}
        assert events["approved"].detail == (
            f"approved by alice (client {client.temporal.identity}; both self-declared)"
        )
        await record_history(client, run.run_id, "waiting_then_approved")

    async def test_two_approvals_in_one_turn_are_asked_in_order_and_the_model_sees_both(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        refunds = Refunds()
        await runtimes.start(
            [
                refunds.registration(
                    ToolCall(id="a", name="refund", arguments={"order": "A1", "amount": 30}),
                    ToolCall(id="b", name="refund", arguments={"order": "B2", "amount": 900}),
                )
            ]
        )
        run = await client.start_run("refunder", "refund both")

        first = await wait_for_status(run, RunStatus.WAITING)
        assert first.interaction is not None
        assert first.interaction.id == "approval:1:a"
        await run.respond("approval:1:a", APPROVE, responder="alice")
        await wait_for_interaction(run, "approval:1:b")
        await run.respond(
            "approval:1:b",
            {"type": "tool-approval", "approved": False, "reason": "too large"},
            responder="bob",
        )
        seen = json.loads((await run.result()).output or "")

        assert seen == [
            {"error": False, "content": '{"refund_id":"R-A1"}'},
            {"error": True, "content": "denied: too large"},
        ]
        assert [order for order, _ in refunds.made] == ["A1"]
        await record_history(client, run.run_id, "two_approvals_one_denied")


class TestResponses:
    async def test_the_same_response_twice_is_one_acceptance_and_a_different_one_conflicts(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        refunds = Refunds()
        refunds.release.clear()  # the approved refund stays in flight: the run stays open
        await runtimes.start([refunds.registration()])
        run = await client.start_run("refunder", "refund A1")
        await wait_for_status(run, RunStatus.WAITING)

        first = await run.respond("approval:1:c1", APPROVE, responder="alice")
        after_first = await history_length(client, run)
        again = await run.respond("approval:1:c1", APPROVE, responder="alice")
        after_again = await history_length(client, run)
        with pytest.raises(
            InteractionConflictError, match=r"already answered \(approved by alice\)"
        ):
            await run.respond("approval:1:c1", {"type": "tool-approval", "approved": False})

        assert again == first
        assert after_again == after_first
        assert await history_length(client, run) == after_first
        refunds.release.set()
        await run.result()
        assert len(refunds.made) == 1

    async def test_unknown_id_wrong_type_and_wrong_digest_are_invalid_and_change_nothing(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        refunds = Refunds()
        await runtimes.start([refunds.registration()])
        run = await client.start_run("refunder", "refund A1")
        await wait_for_status(run, RunStatus.WAITING)
        before = await history_length(client, run)

        with pytest.raises(InvalidResponseError, match="has no interaction 'approval:9:x'"):
            await run.respond("approval:9:x", APPROVE)
        with pytest.raises(InvalidResponseError, match="is a tool-approval, not a question"):
            await run.respond("approval:1:c1", {"type": "question", "answer": "yes"})
        with pytest.raises(
            InvalidResponseError, match="the arguments differ from what you reviewed"
        ):
            await run.respond("approval:1:c1", {**APPROVE, "args_digest": "0" * 32})
        with pytest.raises(InvalidResponseError, match="respond with"):
            await run.respond("approval:1:c1", {"type": "tool-approval"})

        assert await history_length(client, run) == before
        assert (await run.snapshot()).status == RunStatus.WAITING
        assert refunds.made == []
        await run.cancel()

    async def test_a_question_tool_waits_for_the_answer(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        await runtimes.start([asker()])
        run = await client.start_run("asker", "help me")
        snap = await wait_for_status(run, RunStatus.WAITING)
        assert snap.interaction is not None
        assert snap.interaction.type == "question"
        assert snap.interaction.question == "Which order?"

        await run.respond(
            "question:1:call_ask_user", {"type": "question", "answer": "A1"}, responder="carol"
        )

        assert json.loads((await run.result()).output or "") == [{"error": False, "content": "A1"}]


class TestTemporalCliSignal:
    async def test_an_approval_signalled_with_the_temporal_cli_completes_the_run(
        self, env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes
    ) -> None:
        refunds = Refunds()
        await runtimes.start([refunds.registration()])
        run = await client.start_run("refunder", "refund A1")
        await wait_for_status(run, RunStatus.WAITING)
        target = env.client.service_client.config.target_host

        async def signal(payload: dict[str, object]) -> None:
            done = await cli(
                binary("temporal"), "workflow", "signal", "--address", target,
                "--workflow-id", run.run_id, "--name", "respond_signal",
                "--input", json.dumps(payload),
            )  # fmt: skip
            assert done.returncode == 0, done.stderr

        await signal(
            {"interaction_id": "approval:1:c1", "response": {"type": "question", "answer": "x"}}
        )
        await signal(
            {"interaction_id": "approval:1:c1", "response": APPROVE, "responder": "dave (cli)"}
        )
        result = await run.result()

        assert json.loads(result.output or "") == [
            {"error": False, "content": '{"refund_id":"R-A1"}'}
        ]
        events = [(e.type, e.detail) for e in (await run.snapshot()).events]
        rejected = [d for t, d in events if t == "response_rejected"]
        assert len(rejected) == 1 and "InvalidResponseError" in (rejected[0] or "")
        assert ("approved", "approved by dave (cli)") in [
            (t, d) for t, d in events if t == "approved"
        ]


class TestRestarts:
    async def test_a_worker_restart_and_awaiting_the_result_approve_nothing(
        self, client: DurableClient
    ) -> None:
        refunds = Refunds()
        registration = refunds.registration()
        async with await DurableRuntime.open(client=client, agents=[registration]) as rt:
            await rt.resume()
            run = await client.start_run("refunder", "refund A1")
            before = await wait_for_status(run, RunStatus.WAITING)

        async with await DurableRuntime.open(client=client, agents=[registration]) as rt:
            await rt.resume()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(run.result(), 2)
            after = await run.snapshot()
            assert after == before
            assert refunds.made == []
            await run.respond("approval:1:c1", APPROVE, responder="erin")
            await run.result()
        assert len(refunds.made) == 1

    async def test_a_dev_server_restart_keeps_the_interaction_pending(
        self, dev_server: DevServer
    ) -> None:
        refunds = Refunds()
        agents = [refunds.registration()]
        async with serving(dev_server, agents, "restart") as client:
            run = await client.start_run("refunder", "refund A1")
            before = await wait_for_status(run, RunStatus.WAITING)
        async with serving(dev_server, agents, "restart") as client:
            run = await client.get_run(run.run_id)
            assert await run.snapshot() == before
            assert refunds.made == []
            await run.respond("approval:1:c1", APPROVE, responder="frank")
            await run.result()
        assert len(refunds.made) == 1


@pytest.fixture(scope="module")
async def time_skipping() -> AsyncIterator[WorkflowEnvironment]:
    async with await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=binary("temporal-test-server"),
        data_converter=pydantic_data_converter,
    ) as env:
        await env.client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(
                namespace=env.client.namespace,
                search_attributes={
                    k.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD for k in SEARCH_ATTRIBUTES
                },
            )
        )
        yield env


async def test_an_unanswered_approval_is_denied_when_its_timeout_passes(
    time_skipping: WorkflowEnvironment,
) -> None:
    refunds = Refunds()
    client = DurableClient(time_skipping.client, task_queue="approval-timeout")
    registration = refunds.registration(approval_timeout=timedelta(hours=4))
    async with await DurableRuntime.open(client=client, agents=[registration]) as rt:
        await rt.resume()
        run = await client.start_run("refunder", "refund A1")
        await wait_for_status(run, RunStatus.WAITING)

        await time_skipping.sleep(timedelta(hours=5))
        result = await run.result()

    assert json.loads(result.output or "") == [
        {"error": True, "content": "denied: approval timed out"}
    ]
    assert refunds.made == []


async def test_durably_inbox_lists_what_each_parked_run_waits_for(
    env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes
) -> None:
    refunds = Refunds()

    @tool
    async def crash(args: Refund, ctx: ToolContext) -> Receipt:
        """Always crashes."""
        raise RuntimeError("boom")

    def crasher(agent_id: str, recovery: str) -> AgentRegistration:
        agent = Agent(
            id=agent_id,
            model=ScriptedModel([tool_call("crash", order="Z", amount=1), "done"]),
            instructions="",
            tools=[crash],
        )
        return AgentRegistration(
            agent,
            version="1",
            tool_recovery={"crash": recovery},
            tool_retry=ToolRetry(1, 10, 10),  # type: ignore[dict-item]
        )

    def overloaded(request: ModelRequest) -> AssistantMessage:
        raise ConnectionError("the provider is overloaded")

    asker = Agent(
        id="asker",
        model=ScriptedModel([tool_call("ask", question="Which order?"), "done"]),
        instructions="",
        tools=[question_tool(name="ask", description="Ask the customer.")],
    )
    retrier = Agent(id="retrier", model=FunctionModel(overloaded), instructions="")
    await runtimes.start(
        [
            refunds.registration(),
            crasher("blocked", "manual"),
            crasher("broken", "safe"),
            AgentRegistration(asker, version="1"),
            AgentRegistration(retrier, version="1", model_retry=ModelRetry(3, 60_000, 60_000)),
        ]
    )
    waiting = await client.start_run("refunder", "refund A1")
    blocked = await client.start_run("blocked", "go")
    failed = await client.start_run("broken", "go")
    question = await client.start_run("asker", "help")
    backing_off = await client.start_run("retrier", "go")
    await wait_for_status(waiting, RunStatus.WAITING)
    await wait_for_status(blocked, RunStatus.NEEDS_ATTENTION)
    await wait_for_status(failed, RunStatus.FAILED)
    await wait_for_status(question, RunStatus.WAITING)
    await wait_for_status(backing_off, RunStatus.RETRY_WAIT)
    everyone = {r.run_id for r in (waiting, blocked, failed, question, backing_off)}

    async def all_listed() -> bool:  # visibility trails the runs by a moment
        return everyone <= {i.run_id for i in await client.inbox(task_queue=client.task_queue)}

    await eventually(all_listed)
    target = env.client.service_client.config.target_host
    shown = await cli(
        sys.executable, "-m", "durably", "inbox", "--json", "--target", target,
        "--task-queue", client.task_queue,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    items = {i["run_id"]: i for i in json.loads(shown.stdout)}

    assert items[waiting.run_id]["kind"] == "approval"
    assert items[waiting.run_id]["interaction_id"] == "approval:1:c1"
    assert items[waiting.run_id]["waiting_for"].startswith("approve refund(")
    assert items[blocked.run_id]["kind"] == "blocked"
    assert items[blocked.run_id]["operation"] == "tool:1:call_crash"
    assert "verify crash in the external system" in items[blocked.run_id]["waiting_for"]
    assert items[failed.run_id]["kind"] == "failed"
    assert "RuntimeError: boom" in items[failed.run_id]["waiting_for"]
    assert items[question.run_id]["kind"] == "question"
    assert items[question.run_id]["interaction_id"] == "question:1:call_ask"
    assert "Which order?" in items[question.run_id]["waiting_for"]
    assert items[backing_off.run_id]["kind"] == "retry_wait"
    assert items[backing_off.run_id]["next_attempt_at"] is not None
    for run in (waiting, blocked, failed, question, backing_off):
        await run.cancel()
