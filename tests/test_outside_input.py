"""Every start input, signal and update comes from an untrusted caller (SPEC section 20).

Each test starts or steers a run the way an outside caller can: the raw
`temporal` CLI, a raw SDK client, or durably's client with inputs near
Temporal's limits. None may change what the run is allowed to do, put it
into a workflow-task failure loop, or hide it from operators.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.common import RawValue, RetryPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Worker

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    DurableConflictError,
    FunctionModel,
    InvalidResponseError,
    ModelRequest,
    RunCancelledError,
    RunHandle,
    RunStatus,
    ScriptedModel,
    ToolCall,
    ToolContext,
    ToolInterrupted,
    ToolRetry,
    question_tool,
    tool,
)
from durably._digests import args_digest, policy_digest
from durably._query_guard import ask
from durably._transcript import EMPTY_DIGEST
from durably.activities import TranscriptCache
from durably.contract import (
    PIN_DIGEST_PREFIX,
    SA_STATUS,
    SESSION_WORKFLOW_TYPE,
    ConversationRef,
    RespondAccepted,
    RunInput,
    RunState,
    ToolCallInput,
)
from durably.messages import AssistantMessage
from durably.models import last_tool_results, tool_call

from .conftest import (
    Runtimes,
    binary,
    chain_histories,
    cli,
    eventually,
    failed_tasks,
    record_history,
    wait_for_interaction,
    wait_for_status,
)

APPROVE = {"type": "tool-approval", "approved": True}


class Payment(BaseModel):
    to: str
    cents: int


class Paid(BaseModel):
    payment_id: str


class Ledger:
    """The payment service: what really left the account, and under which operation id."""

    def __init__(self) -> None:
        self.paid: list[tuple[str, int, str]] = []

    def tool(self) -> Any:
        ledger = self

        @tool(requires_approval=True)
        async def pay(args: Payment, ctx: ToolContext) -> Paid:
            """Send money."""
            ledger.paid.append((args.to, args.cents, ctx.operation_id))
            return Paid(payment_id=f"P-{len(ledger.paid)}")

        return pay

    def registration(self, *calls: ToolCall, **options: Any) -> AgentRegistration:
        calls = calls or (ToolCall(id="c1", name="pay", arguments={"to": "bob", "cents": 5}),)
        agent = Agent(
            id="payer",
            model=ScriptedModel([AssistantMessage(tool_calls=calls), _results]),
            instructions="",
            tools=[self.tool()],
        )
        return AgentRegistration(agent, version="1", **options)


def _one_call(
    agent_id: str, t: Any, *, call_id: str = "c1", to: str = "a", cents: int = 1
) -> Agent:
    """An agent that calls `t` once (`tool:1:{call_id}`), then reports what came back."""
    return Agent(
        id=agent_id,
        model=ScriptedModel([tool_call(t.name, call_id=call_id, to=to, cents=cents), _results]),
        instructions="",
        tools=[t],
    )


def _results(request: ModelRequest) -> AssistantMessage:
    return AssistantMessage(
        content=json.dumps([[r.is_error, r.content[:200]] for r in last_tool_results(request)])
    )


def _target(env: WorkflowEnvironment) -> str:
    return env.client.service_client.config.target_host


async def _temporal_start(
    env: WorkflowEnvironment, task_queue: str, run_id: str, *inputs: str
) -> None:
    """Start a run as anyone with the Temporal CLI can: any input, default policies."""
    args = [
        *("workflow", "start", "--type", "AgentRunWorkflow", "--task-queue", task_queue),
        *("--address", _target(env), "--workflow-id", run_id),
    ]
    for text in inputs:
        args += ["--input", text]
    done = await cli(binary("temporal"), *args)
    assert done.returncode == 0, done.stderr


async def _refusal(client: DurableClient, run_id: str) -> str:
    """How a refused run ended: Temporal-failed, non-retryable, saying why."""
    handle = client.temporal.get_workflow_handle(run_id)
    with pytest.raises(WorkflowFailureError) as caught:
        await asyncio.wait_for(handle.result(), 30)
    cause = caught.value.cause
    assert isinstance(cause, ApplicationError)
    assert cause.type == "DurablyInvalidRunInput" and cause.non_retryable
    return cause.message


class TestForgedStartInput:
    """`carried` is for durably's own continue-as-new; a starter can never set it."""

    async def test_a_forged_pre_approval_started_with_the_temporal_cli_never_pays(
        self, env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes
    ) -> None:
        ledger = Ledger()
        await runtimes.start([ledger.registration()])
        run_id = f"forged-{uuid.uuid4().hex[:8]}"
        start = RunInput(agent_id="payer", input="pay bob", carried=_pre_approved())

        await _temporal_start(env, client.task_queue, run_id, start.model_dump_json())

        message = await _refusal(client, run_id)
        assert "`carried`" in message and "continue-as-new" in message
        assert ledger.paid == []
        run = RunHandle(client.temporal, run_id)
        snap = await run.snapshot()  # a closed run is still readable
        assert snap.status == RunStatus.FAILED and "carried" in (snap.error or "")
        described = await client.temporal.get_workflow_handle(run_id).describe()
        assert described.typed_search_attributes.get(SA_STATUS) == "failed"

    @pytest.mark.parametrize("forger", ["ForgedChainWorkflow", "AgentRunWorkflow"])
    async def test_a_callers_own_workflow_cannot_continue_as_new_into_a_pre_approved_run(
        self, env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes, forger: str
    ) -> None:
        """Temporal sets `continued_run_id` for any workflow that continues as new into a
        run: one of the caller's own, on a task queue it polls (named `AgentRunWorkflow`
        too, since a name proves nothing), carried a forged approval and `pay` ran."""
        ledger = Ledger()
        await runtimes.start([ledger.registration()])
        run_id = f"forged-chain-{uuid.uuid4().hex[:8]}"
        start = RunInput(agent_id="payer", input="pay bob", carried=_pre_approved())
        own_queue = f"callers-own-{uuid.uuid4().hex[:8]}"

        async with Worker(env.client, task_queue=own_queue, workflows=[FORGERS[forger]]):
            await env.client.start_workflow(
                forger,
                ForgedChain(input=start.model_dump(mode="json"), task_queue=client.task_queue),
                id=run_id,
                task_queue=own_queue,
            )
            message = await _refusal(client, run_id)

        assert "not a durably AgentRunWorkflow" in message and own_queue in message
        assert ledger.paid == []
        snap = await RunHandle(client.temporal, run_id).snapshot()
        assert snap.status == RunStatus.FAILED and snap.interactions == []
        described = await client.temporal.get_workflow_handle(run_id).describe()
        assert described.typed_search_attributes.get(SA_STATUS) == "failed"
        histories = await chain_histories(client, run_id)
        assert failed_tasks(histories) == []
        await record_history(client, run_id, f"refused_a_chain_from_{forger}")

    async def test_a_callers_own_workflow_cannot_continue_as_new_into_a_session(
        self, env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """A session's carried state names its runs and the run its conversation is read
        from: a caller's own workflow continued as new into `AgentSessionWorkflow` with a
        conversation of its making, and the session's runs read it as their own."""
        ledger = Ledger()
        await runtimes.start([ledger.registration()])
        session_id = f"forged-session-{uuid.uuid4().hex[:8]}"
        forged = {
            "agent_id": "payer",
            "carried": {
                "version": "1",
                "runs": [{"run_id": f"{session_id}-1-a", "status": "queued", "input": "pay"}],
                "archive": {
                    "run_id": str(uuid.uuid4()),
                    "length": 0,
                    "digest": EMPTY_DIGEST,
                    "base_length": 0,
                    "new": [],
                },
            },
        }
        own_queue = f"callers-own-{uuid.uuid4().hex[:8]}"

        async with Worker(env.client, task_queue=own_queue, workflows=[ForgedChainWorkflow]):
            await env.client.start_workflow(
                "ForgedChainWorkflow",
                ForgedChain(input=forged, task_queue=client.task_queue, into=SESSION_WORKFLOW_TYPE),
                id=session_id,
                task_queue=own_queue,
            )
            message = await _refusal(client, session_id)

        assert "not a durably AgentSessionWorkflow" in message and own_queue in message
        assert ledger.paid == []
        histories = await chain_histories(client, session_id)
        assert failed_tasks(histories) == []
        assert not [
            e
            for h in histories
            for e in h.events
            if e.HasField("start_child_workflow_execution_initiated_event_attributes")
        ]

    async def test_a_callers_own_workflow_cannot_start_a_run_into_a_sessions_conversation(
        self, env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """A run reads the conversation its `session` names when Temporal says that
        session is its parent; a caller's workflow named like the session is no session."""
        ledger = Ledger()
        await runtimes.start([ledger.registration()])
        session_id = f"not-a-session-{uuid.uuid4().hex[:8]}"
        run_id = f"{session_id}/run-1"
        start = RunInput(
            agent_id="payer",
            input="pay bob",
            session=ConversationRef(session_id=session_id, length=0, digest=EMPTY_DIGEST),
        )
        own_queue = f"callers-own-{uuid.uuid4().hex[:8]}"

        async with Worker(env.client, task_queue=own_queue, workflows=[ForgedParentWorkflow]):
            parent = await env.client.start_workflow(
                ForgedParentWorkflow.run,
                ForgedChain(input=start.model_dump(mode="json"), task_queue=client.task_queue),
                id=session_id,
                task_queue=own_queue,
            )
            child_ended = await parent.result()
            message = await _refusal(client, run_id)

        assert "ChildWorkflowError" in child_ended or "failed" in child_ended.lower()
        assert "not a durably AgentSessionWorkflow" in message and own_queue in message
        assert ledger.paid == []
        await record_history(client, run_id, "refused_a_run_a_forged_session_started")

    @pytest.mark.parametrize(
        "option",
        [
            {"cron_schedule": "@every 1s"},
            {"retry_policy": RetryPolicy(maximum_attempts=5)},
        ],
        ids=["cron", "workflow-retry"],
    )
    async def test_a_run_started_to_repeat_is_refused_before_it_does_anything(
        self, client: DurableClient, runtimes: Runtimes, option: dict[str, Any]
    ) -> None:
        """A cron schedule or workflow retry would start the same input again as a
        "continued" run (honouring its `carried`) and repeat side effects."""
        ledger = Ledger()
        await runtimes.start([ledger.registration()])
        run_id = f"repeat-{uuid.uuid4().hex[:8]}"

        started = await client.temporal.start_workflow(
            "AgentRunWorkflow",
            RunInput(agent_id="payer", input="pay bob"),
            id=run_id,
            task_queue=client.task_queue,
            **option,
        )

        handle = client.temporal.get_workflow_handle(run_id, run_id=started.result_run_id)
        history = await _closed_history(handle)
        failed = history.events[-1].workflow_execution_failed_event_attributes
        assert "durably runs take neither" in failed.failure.message
        assert ledger.paid == []
        if "cron_schedule" in option:  # the schedule goes on: end it
            await client.temporal.get_workflow_handle(run_id).terminate("test cleanup")

    @pytest.mark.parametrize(
        "inputs",
        [
            ['{"agent_id": 5, "input": "x"}'],
            ['{"input": "x"}'],
            ['"pay bob"'],
            ['{"agent_id": "payer", "input": "x"}', '{"agent_id": "payer", "input": "y"}'],
            ['{"agent_id": "payer\\n", "input": "x"}'],
            # Valid JSON, but nested deeper than the SDK's converter decodes.
            ['{"agent_id": "payer", "input": "x", "v": ' + "[" * 300 + "]" * 300 + "}"],
        ],
        ids=[
            "agent-id-not-a-string",
            "no-agent-id",
            "bare-string",
            "two-inputs",
            "control-char",
            "undecodable",
        ],
    )
    async def test_a_malformed_start_input_fails_the_run_visibly_saying_what_it_must_be(
        self, env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes, inputs: list[str]
    ) -> None:
        """Before, such a run failed every workflow task forever ("Failed decoding
        arguments") with no status: invisible to `durably runs list` and the inbox."""
        await runtimes.start([Ledger().registration()])
        run_id = f"malformed-{uuid.uuid4().hex[:8]}"

        await _temporal_start(env, client.task_queue, run_id, *inputs)

        message = await _refusal(client, run_id)
        assert '{"agent_id": "...", "input": "...", "version": null}' in message or (
            "agent_id" in message
        ), message
        history = await client.temporal.get_workflow_handle(run_id).fetch_history()
        assert failed_tasks([history]) == []
        failed = [r.run_id for r in await client.list_runs(status=RunStatus.FAILED, limit=100)]
        assert run_id in failed or await _eventually_listed(client, run_id)

    async def test_a_run_id_with_a_newline_is_refused(
        self, env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes
    ) -> None:
        await runtimes.start([Ledger().registration()])
        run_id = f"two\nlines-{uuid.uuid4().hex[:8]}"
        await client.temporal.start_workflow(
            "AgentRunWorkflow",
            RunInput(agent_id="payer", input="x"),
            id=run_id,
            task_queue=client.task_queue,
        )
        assert "control characters" in await _refusal(client, run_id)

    async def test_an_input_over_the_bound_is_refused_and_nothing_runs(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        ledger = Ledger()
        await runtimes.start([ledger.registration()])
        run_id = f"big-{uuid.uuid4().hex[:8]}"
        await client.temporal.start_workflow(
            "AgentRunWorkflow",
            RunInput(agent_id="payer", input="x" * (2**20 + 1)),
            id=run_id,
            task_queue=client.task_queue,
        )
        assert "at most 1,048,576 bytes" in await _refusal(client, run_id)
        assert ledger.paid == []


async def _closed_history(handle: Any) -> Any:
    async with asyncio.timeout(30):
        while True:
            history = await handle.fetch_history()
            if history.events[-1].HasField("workflow_execution_failed_event_attributes"):
                return history
            await asyncio.sleep(0.1)


async def _eventually_listed(client: DurableClient, run_id: str) -> bool:
    async with asyncio.timeout(20):
        while True:
            runs = await client.list_runs(status=RunStatus.FAILED, limit=200)
            if run_id in [r.run_id for r in runs]:
                return True
            await asyncio.sleep(0.2)


def _pre_approved() -> RunState:
    """A run's state that holds an approval of `pay(bob, 5)` nobody gave."""
    return RunState(
        agent_id="payer",
        input="pay bob",
        digest=EMPTY_DIGEST,
        answered={
            "approval:1:c1": RespondAccepted(
                interaction_id="approval:1:c1",
                type="tool-approval",
                approved=True,
                responder="mallory",
                args_digest=args_digest({"to": "bob", "cents": 5}),
            )
        },
    )


@dataclass
class ForgedChain:
    """A start input for durably's task queue, sent by a workflow of the caller's own."""

    input: dict[str, Any]
    task_queue: str
    into: str = "AgentRunWorkflow"


def _continue_into(chain: ForgedChain) -> None:
    workflow.continue_as_new(chain.input, workflow=chain.into, task_queue=chain.task_queue)


@workflow.defn(name="ForgedChainWorkflow", sandboxed=False)
class ForgedChainWorkflow:
    """A caller's own workflow that continues as new into a durably run."""

    @workflow.run
    async def run(self, chain: ForgedChain) -> None:
        _continue_into(chain)


@workflow.defn(name="AgentRunWorkflow", sandboxed=False)
class ImpostorRunWorkflow:
    """The same, named as durably's run workflow, on the caller's own task queue."""

    @workflow.run
    async def run(self, chain: ForgedChain) -> None:
        _continue_into(chain)


FORGERS = {"ForgedChainWorkflow": ForgedChainWorkflow, "AgentRunWorkflow": ImpostorRunWorkflow}


@workflow.defn(name="AgentSessionWorkflow", sandboxed=False)
class ForgedParentWorkflow:
    """A caller's own workflow, named as durably's session workflow on the caller's own
    task queue, that starts a run as its child."""

    @workflow.run
    async def run(self, chain: ForgedChain) -> str:
        try:
            await workflow.execute_child_workflow(
                "AgentRunWorkflow",
                chain.input,
                id=f"{workflow.info().workflow_id}/run-1",
                task_queue=chain.task_queue,
            )
        except Exception as err:
            return f"{type(err).__name__}: {err}"
        return "completed"


@workflow.defn(name="ForgedPolicyWorkflow", sandboxed=False)
class ForgedPolicyWorkflow:
    """A caller's own workflow that asks durably's worker to run a tool, skipping the run."""

    @workflow.run
    async def run(self, call: dict[str, Any]) -> str:
        try:
            result = await workflow.execute_activity(
                "durably.tool_call",
                call.pop("input"),
                task_queue=call.pop("task_queue"),
                start_to_close_timeout=timedelta(seconds=10),
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
        except ActivityError as err:
            return f"refused: {err.cause}"
        return f"ran: {result}"


@workflow.defn(name="AgentRunWorkflow", sandboxed=False)
class ImpostorPolicyWorkflow(ForgedPolicyWorkflow):
    """The same, named as durably's run workflow, on the caller's own task queue."""

    @workflow.run
    async def run(self, call: dict[str, Any]) -> str:
        return await super().run(call)


def _pay_mallory(fingerprint: str) -> ToolCallInput:
    return ToolCallInput(
        agent_id="payer",
        version="1",
        fingerprint=PIN_DIGEST_PREFIX + fingerprint,
        key="tool:1:c1",
        call=ToolCall(id="c1", name="pay", arguments={"to": "mallory", "cents": 99999}),
    )


class TestPinnedPolicies:
    @pytest.mark.parametrize("forger", [ForgedPolicyWorkflow, ImpostorPolicyWorkflow])
    async def test_a_worker_runs_a_tool_only_for_a_durably_run_on_its_task_queue(
        self,
        env: WorkflowEnvironment,
        client: DurableClient,
        runtimes: Runtimes,
        forger: type[ForgedPolicyWorkflow],
    ) -> None:
        """A caller's own workflow scheduled `durably.tool_call` on durably's task queue
        with the genuine pin digest (it is in every run's history), and `pay` ran with
        nobody approving; named `AgentRunWorkflow` on its own queue, too."""
        ledger = Ledger()
        registration = ledger.registration()
        await runtimes.start([registration])
        own_queue = f"callers-own-{uuid.uuid4().hex[:8]}"
        call = _pay_mallory(registration.pin_digest).model_dump(mode="json")

        async with Worker(env.client, task_queue=own_queue, workflows=[forger]):
            refused: str = await env.client.execute_workflow(
                "AgentRunWorkflow" if forger is ImpostorPolicyWorkflow else "ForgedPolicyWorkflow",
                {"input": call, "task_queue": client.task_queue},
                id=f"forger-{uuid.uuid4().hex[:8]}",
                task_queue=own_queue,
            )

        assert refused.startswith("refused:") and "not by a durably AgentRunWorkflow" in refused
        assert own_queue in refused
        assert ledger.paid == []

    async def test_a_worker_runs_a_tool_only_under_the_policies_it_registered(
        self, env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """Activities compare a digest of the whole pin the run applies (approval flags,
        recovery, retries, schemas) with their registration, not the copyable fingerprint:
        a pin with the right fingerprint and `requires_approval` turned off is refused, even
        for a genuine run."""
        ledger = Ledger()
        registration = ledger.registration()
        runtime = await runtimes.start([registration])
        run = await client.start_run("payer", "pay bob")
        await wait_for_interaction(run, "approval:1:c1")
        described = await client.temporal.get_workflow_handle(run.run_id).describe()
        activity_env = ActivityEnvironment(client=env.client)
        activity_env.info = dataclasses.replace(
            activity_env.info,
            workflow_id=run.run_id,
            workflow_run_id=described.run_id,
            task_queue=client.task_queue,
        )
        forged = registration.pin()
        forged.tools["pay"].requires_approval = False
        forged.tools["pay"].recovery = "safe"
        activities = runtime.plugin.agent_activities

        with pytest.raises(ApplicationError) as refused:
            await activity_env.run(activities.tool_call, _pay_mallory(policy_digest(forged)))

        assert "differs from the one the run started" in refused.value.message
        assert ledger.paid == []
        ran = await activity_env.run(activities.tool_call, _pay_mallory(registration.pin_digest))
        assert ran.content and ledger.paid == [("mallory", 99999, ledger.paid[0][2])]
        await run.cancel()


# -- responses near Temporal's limits -------------------------------------------------


def _asker(questions: int = 1, **options: Any) -> AgentRegistration:
    """Asks `questions` questions in one turn; answers with what it read (sizes, digests)."""

    def model(request: ModelRequest) -> AssistantMessage:
        if not any(isinstance(m, AssistantMessage) for m in request.messages):
            return AssistantMessage(
                tool_calls=tuple(
                    ToolCall(id=f"q{i}", name="ask_user", arguments={"question": f"part {i}?"})
                    for i in range(questions)
                )
            )
        return AssistantMessage(
            content=json.dumps(
                [
                    [len(r.content), hashlib.sha256(r.content.encode()).hexdigest()[:12]]
                    for r in last_tool_results(request)
                ]
            )
        )

    agent = Agent(
        id="asker",
        model=FunctionModel(model, name="asker"),
        instructions="",
        tools=[question_tool()],
    )
    return AgentRegistration(agent, version="1", **options)


def _seen(text: str) -> list[Any]:
    return [len(text), hashlib.sha256(text.encode()).hexdigest()[:12]]


async def _model_inputs(client: DurableClient, run: RunHandle) -> list[int]:
    """The size of each model request's input in history."""
    history = await client.temporal.get_workflow_handle(run.run_id).fetch_history()
    return [
        e.activity_task_scheduled_event_attributes.input.ByteSize()
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name == "durably.model_request"
    ]


class TestLargeResponses:
    async def test_an_answer_over_the_bound_is_refused_and_one_under_it_is_stored_once(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """Before, a 1.4 MB answer went into one workflow-task completion three times
        (acceptance, update result, next model input), past gRPC's 4 MB: Temporal
        terminated the run. Now an answer is bounded, never echoed, and reaches the
        model by reference."""
        await runtimes.start([_asker()])
        run = await client.start_run("asker", "go")
        await wait_for_interaction(run, "question:1:q0")

        with pytest.raises(InvalidResponseError, match="an answer may be at most 524,288"):
            await run.respond("question:1:q0", {"type": "question", "answer": "x" * 1_400_000})
        answer = "é" * 50_000  # 100 KB: far past what goes inline, recorded once
        accepted = await run.respond("question:1:q0", {"type": "question", "answer": answer})

        assert accepted.answer is None and accepted.response_digest  # no second copy
        result = await asyncio.wait_for(run.result(), 30)
        assert json.loads(result.output or "") == [_seen(answer)]
        assert max(await _model_inputs(client, run)) < 4_000
        handle = client.temporal.get_workflow_handle(run.run_id)
        assert failed_tasks([await handle.fetch_history()]) == []
        described = (await handle.describe()).raw_description.workflow_execution_info
        assert described.history_size_bytes < 100_000 + 64_000  # the answer, once
        await record_history(client, run.run_id, "completed_after_a_large_answer")

    async def test_two_large_answers_by_signal_reach_the_model_by_reference(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """Before, two 1.2 MB signal answers made the next model input 2.4 MB: every
        workflow task failed PAYLOADS_TOO_LARGE forever and cancel did nothing."""
        await runtimes.start([_asker(questions=2)])
        run = await client.start_run("asker", "go")
        handle = client.temporal.get_workflow_handle(run.run_id)
        answers = ["a" * 400_000, "b" * 500_000]
        too_big = {"type": "question", "answer": "c" * 1_200_000}

        await wait_for_interaction(run, "question:1:q0")
        await handle.signal(
            "respond_signal", {"interaction_id": "question:1:q0", "response": too_big}
        )
        for i, text in enumerate(answers):
            await wait_for_interaction(run, f"question:1:q{i}")
            await handle.signal(
                "respond_signal",
                {
                    "interaction_id": f"question:1:q{i}",
                    "response": {"type": "question", "answer": text},
                },
            )

        result = await asyncio.wait_for(run.result(), 30)
        assert json.loads(result.output or "") == [_seen(a) for a in answers]
        assert max(await _model_inputs(client, run)) < 4_000
        snap = await run.snapshot()
        [rejected] = [e for e in snap.events if e.type == "response_rejected"]
        assert "an answer may be at most" in (rejected.detail or "")
        assert failed_tasks([await handle.fetch_history()]) == []

    async def test_a_run_sent_answers_near_the_payload_limit_can_still_be_cancelled(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """Each 1.9 MB answer passes Temporal's 2 MB limit and is refused by the run; no
        workflow task fails, so the cancellation is processed at once."""
        await runtimes.start([_asker(questions=2)])
        run = await client.start_run("asker", "go")
        await wait_for_interaction(run, "question:1:q0")
        handle = client.temporal.get_workflow_handle(run.run_id)
        answer = {"type": "question", "answer": "d" * 1_900_000}

        for i in range(3):
            await handle.signal(
                "respond_signal", {"interaction_id": f"question:1:q{i % 2}", "response": answer}
            )
        await run.cancel()

        with pytest.raises(RunCancelledError):
            await asyncio.wait_for(run.result(), 30)
        assert failed_tasks(await chain_histories(client, run.run_id)) == []

    async def test_a_large_input_reaches_the_model_once_by_reference(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        seen: list[int] = []

        def model(request: ModelRequest) -> AssistantMessage:
            seen.append(len(request.messages[0].content or ""))  # type: ignore[union-attr]
            return AssistantMessage(content="read it")

        agent = Agent(id="reader", model=FunctionModel(model, name="reader"), instructions="")
        await runtimes.start([AgentRegistration(agent, version="1")])
        run = await client.start_run("reader", "y" * 900_000)

        await asyncio.wait_for(run.result(), 30)

        assert seen == [900_000]
        assert max(await _model_inputs(client, run)) < 2_000


# -- parked and waiting runs continue as new ---------------------------------------------


async def _flood(client: DurableClient, run: RunHandle, count: int) -> None:
    """Signals that are all rejected, each different (so none is coalesced)."""
    handle = client.temporal.get_workflow_handle(run.run_id)
    for i in range(count):
        await handle.signal("respond_signal", {"interaction_id": f"junk-{i}", "response": {}})


async def _continued(client: DurableClient, run: RunHandle, runs: int) -> list[Any]:
    async with asyncio.timeout(30):
        while True:
            histories = await chain_histories(client, run.run_id)
            if len(histories) >= runs:
                return histories
            await asyncio.sleep(0.1)


def _filer(ran: list[str]) -> Agent:
    """An agent whose one call (`tool:1:c1`, manual) is interrupted: the service hangs up."""

    @tool
    async def file_ticket(args: Payment, ctx: ToolContext) -> Paid:
        """File it (the service hangs up)."""
        ran.append(ctx.operation_id)
        raise ConnectionResetError("hung up")

    return _one_call("filer", file_ticket)


class TestParkedRunsContinueAsNew:
    async def test_a_waiting_run_flooded_with_signals_continues_as_new_and_keeps_its_audit(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """Before, a waiting run only ever continued as new at the top of a turn: junk
        signals grew its history until Temporal terminated it, and pushed who approved
        what out of the snapshot's 50 events."""
        ledger = Ledger()
        calls = (
            ToolCall(id="a", name="pay", arguments={"to": "bob", "cents": 5}),
            ToolCall(id="b", name="pay", arguments={"to": "carol", "cents": 7}),
        )
        await runtimes.start([ledger.registration(*calls, continue_as_new_events=60)])
        run = await client.start_run("payer", "pay two")
        await wait_for_interaction(run, "approval:1:a")
        await run.respond("approval:1:a", APPROVE, responder="alice")
        before = await wait_for_interaction(run, "approval:1:b")

        await _flood(client, run, 70)
        histories = await _continued(client, run, 2)

        after = await wait_for_interaction(run, "approval:1:b")
        assert after.interaction == before.interaction
        approved = [e for e in after.events if e.type == "approved"]
        assert [e.operation for e in approved] == ["approval:1:a"]
        assert "by alice" in (approved[0].detail or "")
        await run.respond("approval:1:b", APPROVE, responder="alice")
        result = await asyncio.wait_for(run.result(), 30)
        assert json.loads(result.output or "") == [
            [False, '{"payment_id":"P-1"}'],
            [False, '{"payment_id":"P-2"}'],
        ]
        assert [(to, cents) for to, cents, _ in ledger.paid] == [("bob", 5), ("carol", 7)]
        histories = await chain_histories(client, run.run_id)
        assert len(histories) >= 2
        assert failed_tasks(histories) == []
        await record_history(
            client, run.run_id, "continued_as_new_while_waiting", histories[0].run_id
        )
        await record_history(client, run.run_id, "completed_after_continuing_while_waiting")

    async def test_a_blocked_run_flooded_with_signals_continues_as_new_and_can_be_resolved(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        ran: list[str] = []
        agent = _filer(ran)
        await runtimes.start([AgentRegistration(agent, version="1", continue_as_new_events=60)])
        run = await client.start_run("filer", "file it")
        blocked = await wait_for_status(run, RunStatus.NEEDS_ATTENTION)

        await _flood(client, run, 70)
        await _continued(client, run, 2)

        snap = await wait_for_status(run, RunStatus.NEEDS_ATTENTION)
        assert (snap.blocked_operation, snap.attention) == (
            blocked.blocked_operation,
            blocked.attention,
        )
        assert "was interrupted" in (snap.current or "")
        await run.resolve_tool("tool:1:c1", {"type": "json", "value": {"payment_id": "P-9"}})
        result = await asyncio.wait_for(run.result(), 30)
        assert json.loads(result.output or "") == [[False, '{"payment_id":"P-9"}']]
        assert len(ran) == 1  # the manual call never ran again
        histories = await chain_histories(client, run.run_id)
        assert failed_tasks(histories) == []
        await record_history(client, run.run_id, "resolved_after_continuing_while_blocked")

    async def test_an_approved_call_blocked_after_an_interruption_never_runs_again(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """An approved manual call that was interrupted parks the run; continuing as new
        while parked must resume the park, not ask again or run the call again."""
        ran: list[str] = []

        @tool(requires_approval=True)
        async def pay(args: Payment, ctx: ToolContext) -> Paid:
            """Send money (the bank hangs up mid-request)."""
            ran.append(ctx.operation_id)
            raise ConnectionResetError("bank hung up")

        agent = _one_call("payer", pay, to="bob", cents=5)
        await runtimes.start([AgentRegistration(agent, version="1", continue_as_new_events=60)])
        run = await client.start_run("payer", "pay bob")
        await wait_for_interaction(run, "approval:1:c1")
        await run.respond("approval:1:c1", APPROVE, responder="alice")
        await wait_for_status(run, RunStatus.NEEDS_ATTENTION)

        await _flood(client, run, 70)
        await _continued(client, run, 2)

        snap = await wait_for_status(run, RunStatus.NEEDS_ATTENTION)
        assert isinstance(snap.attention, ToolInterrupted)
        assert snap.attention.args == {"to": "bob", "cents": 5}
        await run.resolve_tool("tool:1:c1", {"type": "error", "message": "not paid"})
        result = await asyncio.wait_for(run.result(), 30)
        assert json.loads(result.output or "") == [[True, "not paid"]]
        assert len(ran) == 1

    async def test_a_transcript_that_cannot_be_restored_ends_the_run_without_rerunning_a_call(
        self, client: DurableClient, runtimes: Runtimes, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Parking the restore over the carried state lost what the run was blocked on, and
        `retry()` then ran the interrupted manual call again."""
        import durably._transcript.rebuild as rebuild

        async def gone(workflow_id: str, temporal_run_id: str | None = None) -> Any:
            raise ApplicationError(
                "the previous run is gone", type="DurablyTranscriptLost", non_retryable=True
            )

        monkeypatch.setattr(rebuild, "_fetch_transcript", gone)
        ran: list[str] = []
        registration = AgentRegistration(_filer(ran), version="1", continue_as_new_events=60)
        await runtimes.start([registration], cache=TranscriptCache(0))
        run = await client.start_run("filer", "file it")
        await wait_for_status(run, RunStatus.NEEDS_ATTENTION)

        await _flood(client, run, 70)
        snap = await wait_for_status(run, RunStatus.FAILED)

        assert "could not be restored" in (snap.error or "")
        with pytest.raises(DurableConflictError, match="retrying cannot fix"):
            await run.retry()
        assert len(ran) == 1

    async def test_a_waiting_call_with_large_arguments_is_not_carried_twice(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """Its arguments were in the interaction and the outcome: continuing as new with
        1.1 MB arguments carried 2.2 MB, past the payload limit, and every task failed."""
        ledger = Ledger()
        big = ToolCall(id="c1", name="pay", arguments={"to": "b" * 1_100_000, "cents": 5})
        await runtimes.start([ledger.registration(big, continue_as_new_events=60)])
        run = await client.start_run("payer", "pay")
        await wait_for_interaction(run, "approval:1:c1")

        await _flood(client, run, 70)
        histories = await _continued(client, run, 2)

        async def restored() -> bool:
            """The snapshot shows them again once restored (read in one snapshot: a run
            still taking the flood may continue as new again, and restore them again)."""
            interaction = (await run.snapshot()).interaction
            return interaction is not None and interaction.args.get("to") == "b" * 1_100_000

        await eventually(restored)
        snap = await wait_for_interaction(run, "approval:1:c1")
        assert snap.interaction is not None
        continued = histories[0].events[-1].workflow_execution_continued_as_new_event_attributes
        assert continued.input.ByteSize() < 200_000
        await run.respond("approval:1:c1", APPROVE)
        await asyncio.wait_for(run.result(), 30)
        assert len(ledger.paid) == 1
        assert failed_tasks(await chain_histories(client, run.run_id)) == []

    async def test_a_run_parked_before_its_pin_carries_its_input_once(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """A run of an agent no worker hosts yet waits at its pin; flooded, it continues as
        new with its 1 MB input carried once (twice was past the payload limit), and
        once the agent is registered, `retry()` finishes it with the whole input."""
        seen: list[int] = []

        def model(request: ModelRequest) -> AssistantMessage:
            seen.append(len(request.messages[0].content or ""))  # type: ignore[union-attr]
            return AssistantMessage(content="read it")

        runtime = await runtimes.start([])
        run = await client.start_run("late", "y" * 1_000_000)
        await wait_for_status(run, RunStatus.NEEDS_ATTENTION)
        handle = client.temporal.get_workflow_handle(run.run_id)

        junk = {"interaction_id": "nope", "response": {"junk": "j" * 1_900_000}}
        for _ in range(6):  # past the default 10 MiB
            await handle.signal("respond_signal", junk)
        histories = await _continued(client, run, 2)

        continued = histories[0].events[-1].workflow_execution_continued_as_new_event_attributes
        assert continued.input.ByteSize() < 1_300_000
        agent = Agent(id="late", model=FunctionModel(model, name="late"), instructions="")
        runtime.register_agents([AgentRegistration(agent, version="1")])
        await wait_for_status(run, RunStatus.NEEDS_ATTENTION)
        await run.retry()
        await asyncio.wait_for(run.result(), 30)
        assert seen == [1_000_000]
        assert failed_tasks(await chain_histories(client, run.run_id)) == []


# -- operation ids, signals, queries ---------------------------------------------------


class TestOperationIds:
    async def test_a_reused_run_id_never_repeats_an_operation_id(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """A raw client can reuse a closed run's id (Temporal's default reuse policy):
        the new run's calls must not send the old run's idempotency keys."""
        ledger = Ledger()
        call = ToolCall(id="c1", name="pay", arguments={"to": "bob", "cents": 5})
        await runtimes.start([ledger.registration(call)])
        run_id = f"reused-{uuid.uuid4().hex[:8]}"
        for _ in range(2):
            await client.temporal.start_workflow(
                "AgentRunWorkflow",
                RunInput(agent_id="payer", input="pay"),
                id=run_id,
                task_queue=client.task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            )
            run = RunHandle(client.temporal, run_id)
            await wait_for_interaction(run, "approval:1:c1")
            await run.respond("approval:1:c1", APPROVE)
            await asyncio.wait_for(run.result(), 30)

        first, second = (op for _, _, op in ledger.paid)
        assert first != second
        assert first.startswith(f"{run_id}/") and first.endswith("/tool:1:c1")

    async def test_a_model_call_id_with_a_slash_cannot_forge_another_operation_id(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        ran: list[str] = []

        @tool
        async def note(args: Payment, ctx: ToolContext) -> str:
            """Note it."""
            ran.append(ctx.operation_id)
            return "ok"

        agent = _one_call("noter", note, call_id="x/../tool:9:y\n")
        await runtimes.start(
            [AgentRegistration(agent, version="1", tool_recovery={"note": "safe"})]
        )
        run = await client.start_run("noter", "note")
        await asyncio.wait_for(run.result(), 30)

        [op] = ran
        assert op.endswith("/tool:1:x%2F..%2Ftool:9:y")
        assert op.count("/") == 2  # {run id}/{chain}/{key}


class TestUnknownFields:
    """History keeps every byte of an accepted update, fields the run never reads too."""

    async def test_an_update_with_large_unknown_fields_is_refused_before_history(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        await runtimes.start([_asker()])
        run = await client.start_run("asker", "go")
        waiting = await wait_for_interaction(run, "question:1:q0")
        assert waiting.interaction is not None
        raw = client.temporal.get_workflow_handle(run.run_id)
        before = len((await raw.fetch_history()).events)
        answer = {"type": "question", "answer": "order 7"}

        for padded in (
            {"interaction_id": "question:1:q0", "response": answer, "junk": "j" * 1_900_000},
            {"interaction_id": "question:1:q0", "response": {**answer, "junk": "j" * 1_900_000}},
        ):
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await raw.execute_update("respond", padded)
            assert "fields a RespondRequest does not have" in str(refused.value.cause)
        for typed in ({"tool_calls": "5"}, {"tool_calls": True}):
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await raw.execute_update("raise_limits", {"limits": typed})
            assert "a number, not a string or a boolean" in str(refused.value.cause)

        assert len((await raw.fetch_history()).events) == before
        # A few unknown fields (a newer client's) are still taken.
        accepted = await raw.execute_update(
            "respond", {"interaction_id": "question:1:q0", "response": answer, "sent_by": "v2"}
        )
        assert accepted["interaction_id"] == "question:1:q0"
        assert len((await run.result()).output or "") > 0


class TestSignalsAndQueries:
    async def test_signals_the_sdk_cannot_decode_or_does_not_know_are_recorded_as_rejected(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """Before, an undecodable payload was dropped with only a worker log line and a
        misnamed signal was buffered forever: the operator who sent it saw nothing."""
        await runtimes.start([Ledger().registration()])
        run = await client.start_run("payer", "pay")
        await wait_for_interaction(run, "approval:1:c1")
        handle = client.temporal.get_workflow_handle(run.run_id)

        garbled = RawValue(Payload(metadata={"encoding": b"json/plain"}, data=b"{not json"))
        await handle.signal("respond_signal", garbled)
        await handle.signal("respond", {"interaction_id": "approval:1:c1", "response": APPROVE})

        async with asyncio.timeout(10):
            while True:
                events = {e.type: e.detail or "" for e in (await run.snapshot()).events}
                if "signal_rejected" in events and "response_rejected" in events:
                    break
                await asyncio.sleep(0.05)
        assert "could not be decoded" in events["response_rejected"]
        assert "unknown signal 'respond'" in events["signal_rejected"]
        assert (await run.snapshot()).status == RunStatus.WAITING  # nothing was approved
        await run.respond("approval:1:c1", APPROVE)
        await asyncio.wait_for(run.result(), 30)

    async def test_a_transcript_query_with_a_bad_offset_says_what_it_takes(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        await runtimes.start([Ledger().registration()])
        run = await client.start_run("payer", "pay")
        await wait_for_interaction(run, "approval:1:c1")
        handle = client.temporal.get_workflow_handle(run.run_id)

        for offset in (-5, 10**6):
            with pytest.raises(Exception, match="offset must be a whole number from 0 to 2"):
                await ask(handle, "transcript", offset, result_type=object)


class TestResolutions:
    async def test_a_large_resolution_is_bounded_and_reaches_the_model_by_reference(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """A resolution is the call's result: over the bound it is refused; under it, it
        reaches the next model request by reference (two 1.1 MB ones made that request
        too large to schedule)."""
        seen: list[int] = []

        @tool
        async def export(args: Payment, ctx: ToolContext) -> str:
            """Export (the service hangs up)."""
            raise ConnectionResetError("hung up")

        def model(request: ModelRequest) -> AssistantMessage:
            results = last_tool_results(request)
            if not results:
                return AssistantMessage(
                    tool_calls=(
                        ToolCall(id="c1", name="export", arguments={"to": "a", "cents": 1}),
                    )
                )
            seen.append(len(results[0].content))
            return AssistantMessage(content="done")

        agent = Agent(
            id="exporter",
            model=FunctionModel(model, name="exporter"),
            instructions="",
            tools=[export],
        )
        await runtimes.start([AgentRegistration(agent, version="1")])
        run = await client.start_run("exporter", "export")
        await wait_for_status(run, RunStatus.NEEDS_ATTENTION)

        with pytest.raises(InvalidResponseError, match="a resolution may be at most 524,288"):
            await run.resolve_tool("tool:1:c1", {"type": "json", "value": "z" * 600_000})
        with pytest.raises(InvalidResponseError, match="may be at most 4,000"):
            await run.resolve_tool("tool:1:c1", {"type": "error", "message": "e" * 5_000})
        await run.resolve_tool("tool:1:c1", {"type": "json", "value": "z" * 400_000})

        await asyncio.wait_for(run.result(), 30)
        assert seen == [400_000]
        assert max(await _model_inputs(client, run)) < 4_000


def test_the_policy_check_leaves_out_timeouts_and_thresholds_but_not_retries() -> None:
    """Tuning timeouts or continue-as-new under a version must not park its runs; a
    change of what a run may do (here: how often a tool is repeated) must."""
    safe = {"pay": "safe"}
    base = Ledger().registration(tool_recovery=safe)
    agent = base.agent
    tuned = AgentRegistration(
        agent,
        version="1",
        tool_recovery=safe,
        tool_timeout=timedelta(minutes=3),
        continue_as_new_events=500,
    )
    retried = AgentRegistration(
        agent, version="1", tool_recovery=safe, tool_retry=ToolRetry(max_attempts=9)
    )

    assert tuned.pin_digest == base.pin_digest
    assert retried.pin_digest != base.pin_digest
    assert retried.fingerprint == base.fingerprint  # the copyable name does not tell


class TestActivityResults:
    async def test_an_oversized_tool_result_names_the_limit_and_what_to_do(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """Before, Temporal refused the result with a bare `[TMPRL1103]`."""

        @tool
        async def export(args: Payment, ctx: ToolContext) -> str:
            """Export everything."""
            return "z" * 2_500_000

        await runtimes.start([AgentRegistration(_one_call("exporter", export), version="1")])
        run = await client.start_run("exporter", "export")

        snap = await wait_for_status(run, RunStatus.NEEDS_ATTENTION)

        assert isinstance(snap.attention, ToolInterrupted)
        error = snap.attention.last_error or ""
        assert "2,500,0" in error and "Temporal's 2 MiB payload limit" in error
        assert "make the tool return less" in error

    async def test_a_tools_stack_trace_stays_on_the_worker(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        @tool
        async def crash(args: Payment, ctx: ToolContext) -> str:
            """Crash with a secret in a local variable's frame."""
            raise RuntimeError("database is down")

        await runtimes.start([AgentRegistration(_one_call("crasher", crash), version="1")])
        run = await client.start_run("crasher", "crash")
        await wait_for_status(run, RunStatus.NEEDS_ATTENTION)

        history = await client.temporal.get_workflow_handle(run.run_id).fetch_history()
        [failed] = [
            e.activity_task_failed_event_attributes.failure
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED
        ]
        assert "database is down" in failed.message
        assert __file__ not in failed.stack_trace and not failed.HasField("cause")
