"""Sessions survive what runs survive (SPEC section 13): a worker SIGKILLed in the
middle of a session's run, a dev-server restart between submissions, and
retention deleting a closed run's history. Each time the next run still reads the
whole conversation, each message once, in order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import (
    DeleteWorkflowExecutionRequest,
    ResetStickyTaskQueueRequest,
)
from temporalio.service import RPCError, RPCStatusCode

from durably import DurableClient, DurableRuntime
from durably.dev import DevServer

from . import test_crash_recovery
from .conftest import eventually, free_ports, operation_id, serving
from .test_crash_recovery import Crashes
from .test_sessions import clerk, holds

CONVERSATION = [
    "user: where is A-7",
    "assistant: call lookup",
    "tool: A-7 ships tomorrow",
    "assistant: It ships tomorrow.",
    "user: where is B-8",
    "assistant: call lookup",
    "tool: B-8 ships tomorrow",
    "assistant: It ships tomorrow.",
    "user: thanks",
]


# The worker processes to kill, shared with the crash tests.
crashes = test_crash_recovery.crashes


class TestWorkerCrash:
    async def test_a_run_killed_mid_tool_completes_and_the_session_goes_on_losing_nothing(
        self, crashes: Crashes, client: DurableClient
    ) -> None:
        """The worker hosting the session and its second run dies inside a `safe` tool
        call; a new worker finishes the run, and the third run reads each message once."""
        first = crashes.worker()
        session = await client.start_session("session-clerk")
        one = await session.submit("where is A-7")
        assert (await asyncio.wait_for(one.result(), 30)).output == "It ships tomorrow."
        two = await session.submit("where is B-8")
        await crashes.until_journal(kind="tool", order="B-8", attempt=1)

        first.kill()
        crashes.worker()
        assert (await asyncio.wait_for(two.result(), 60)).output == "It ships tomorrow."
        three = await session.submit("thanks")
        assert (await asyncio.wait_for(three.result(), 30)).output == "noted: thanks"
        await eventually(holds(session, 10))

        assert crashes.journal(kind="model", run=three.run_id) == [
            {"kind": "model", "run": three.run_id, "attempt": 1, "said": CONVERSATION}
        ]
        # No model request ran twice: the one that chose the tool had committed.
        models = [(e["run"], e["attempt"]) for e in crashes.journal(kind="model")]
        assert models == [(one.run_id, 1)] * 2 + [(two.run_id, 1)] * 2 + [(three.run_id, 1)]
        op_one = await operation_id(client, one, "tool:1:c1")
        op_two = await operation_id(client, two, "tool:1:c1")
        calls = [(e["op"], e["attempt"]) for e in crashes.journal(kind="tool")]
        assert calls == [(op_one, 1), (op_two, 1), (op_two, 2)]
        assert [e["op"] for e in crashes.journal(kind="effect")] == [op_one, op_two]


class TestServerRestart:
    async def test_a_run_after_a_dev_server_restart_reads_the_earlier_messages(
        self, dev_server: DevServer, task_queue: str
    ) -> None:
        """The restarted server and a new worker (no cache) still hold the conversation."""
        seen: list[list[str]] = []
        agents = [clerk(seen)]

        async with serving(dev_server, agents, task_queue) as client:
            session = await client.start_session("clerk")
            await (await session.submit("hello, I am Ada")).result()
            await eventually(holds(session, 2))
        async with serving(dev_server, agents, task_queue) as client:
            session = await client.get_session(session.session_id)
            result = await (await session.submit("who am I?")).result()

        assert result.output == "noted: who am I?"
        assert seen[-1] == [
            "user: hello, I am Ada",
            "assistant: noted: hello, I am Ada",
            "user: who am I?",
        ]


class PromptDeletes(DevServer):
    """A dev server that deletes a closed workflow at once. By default Temporal first
    waits for visibility to acknowledge the close, about 30 s on a dev server."""

    def command(self, binary: str) -> list[str]:
        flag = "history.transferProcessorEnsureCloseBeforeDelete=false"
        return [*super().command(binary), "--dynamic-config-value", flag]


@pytest.fixture
async def prompt_deletes(tmp_path: Path, task_queue: str) -> AsyncIterator[DurableClient]:
    port, ui_port = free_ports(2)
    server = PromptDeletes(db=tmp_path / "t.db", port=port, ui_port=ui_port)
    await server.start()
    try:
        yield DurableClient(server.client, task_queue=task_queue)
    finally:
        await server.stop()


class TestRetention:
    async def test_a_deleted_runs_messages_still_reach_a_fresh_worker(
        self, prompt_deletes: DurableClient
    ) -> None:
        """Retention deletes closed runs' histories; the session holds their messages."""
        client = prompt_deletes
        seen: list[list[str]] = []
        async with await DurableRuntime.open(client=client, agents=[clerk(seen)]) as first:
            await first.resume()
            session = await client.start_session("clerk")
            one = await session.submit("where is A-7")
            await one.result()
            await (await session.submit("where is B-8")).result()
            await eventually(holds(session, 8))
        # The stopped worker no longer holds the session: hand it to the next one now,
        # not after the sticky queue's timeout.
        await client.temporal.workflow_service.reset_sticky_task_queue(
            ResetStickyTaskQueueRequest(
                namespace=client.temporal.namespace,
                execution=WorkflowExecution(workflow_id=session.session_id),
            )
        )

        await client.temporal.workflow_service.delete_workflow_execution(
            DeleteWorkflowExecutionRequest(
                namespace=client.temporal.namespace,
                workflow_execution=WorkflowExecution(workflow_id=one.run_id),
            )
        )

        async def deleted() -> bool:
            try:
                await client.temporal.get_workflow_handle(one.run_id).describe()
            except RPCError as err:
                return err.status == RPCStatusCode.NOT_FOUND
            return False

        await eventually(deleted)
        # A new runtime, so a new transcript cache: the conversation comes from the session.
        async with await DurableRuntime.open(client=client, agents=[clerk(seen)]) as fresh:
            await fresh.resume()
            result = await (await session.submit("thanks")).result()
            await eventually(holds(session, 10))

        assert result.output == "noted: thanks"
        assert seen[-1] == CONVERSATION
