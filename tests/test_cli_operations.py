"""Operators reconcile and retry runs from the `durably` command line."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
from pydantic import BaseModel
from temporalio.testing import WorkflowEnvironment

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    RunCancelledError,
    RunStatus,
    ScriptedModel,
    ToolContext,
    tool,
)
from durably.models import tool_call
from durably.tools import question_tool

from .conftest import Runtimes, cli, free_ports, wait_for_interaction, wait_for_status


class Ticket(BaseModel):
    title: str


class TicketId(BaseModel):
    ticket_id: str


@tool
async def create_ticket(args: Ticket, ctx: ToolContext) -> TicketId:
    """Create a ticket; the service always drops the connection."""
    raise ConnectionAbortedError("ticket service dropped the connection")


def registration() -> AgentRegistration:
    agent = Agent(
        id="desk",
        model=ScriptedModel([tool_call("create_ticket", call_id="c1", title="vpn"), "filed"]),
        instructions="",
        tools=[create_ticket],
    )
    return AgentRegistration(agent, version="1")


async def durably(env: WorkflowEnvironment, *args: str) -> subprocess.CompletedProcess[str]:
    target = env.client.service_client.config.target_host
    return await cli(sys.executable, "-m", "durably", *args, "--target", target)


async def test_runs_show_then_resolve_from_the_cli_completes_the_run(
    env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes
) -> None:
    await runtimes.start([registration()])
    run = await client.start_run("desk", "file it")
    await wait_for_status(run, RunStatus.NEEDS_ATTENTION)

    shown = await durably(env, "runs", "show", run.run_id, "--json")
    assert shown.returncode == 0, shown.stderr
    snap = json.loads(shown.stdout)
    assert (snap["status"], snap["blocked_operation"]) == ("needs_attention", "tool:1:c1")

    bad = await durably(env, "resolve", run.run_id, "tool:1:c1", "--json", '{"id": 1}')
    assert bad.returncode == 1
    assert "does not fit the output schema of tool 'create_ticket'" in bad.stderr
    assert "Traceback" not in bad.stderr

    blocked = await durably(env, "retry", run.run_id)
    assert blocked.returncode == 1
    assert "never repeats a manual call" in blocked.stderr

    ok = await durably(env, "resolve", run.run_id, "tool:1:c1", "--json", '{"ticket_id": "T-9"}')
    assert ok.returncode == 0, ok.stderr
    assert "Resolved tool:1:c1" in ok.stdout
    assert (await run.result()).output == "filed"


async def test_resolve_needs_exactly_one_outcome(env: WorkflowEnvironment) -> None:
    both = await durably(env, "resolve", "some-run", "tool:1:c1", "--rerun", "--error", "x")
    assert both.returncode == 2
    assert "give exactly one of --json VALUE, --error MESSAGE or --rerun" in both.stderr


async def test_a_worker_that_fails_for_good_exits_saying_why(env: WorkflowEnvironment) -> None:
    """`durably worker` on a namespace that does not exist stops with an error, not idling."""
    done = await durably(
        env,
        "worker",
        "--agents",
        "durably.examples.support_desk:registrations",
        "--namespace",
        "no-such-namespace",
    )
    assert done.returncode == 1, done.stdout
    assert "error: the worker stopped" in done.stderr
    assert "no-such-namespace" in done.stderr
    assert "Check the namespace, address and credentials" in done.stderr


async def test_a_command_with_no_server_to_reach_says_where_it_looked() -> None:
    (port,) = free_ports(1)
    done = await cli(
        sys.executable, "-m", "durably", "runs", "list", "--target", f"127.0.0.1:{port}"
    )
    assert done.returncode == 1
    assert f"error: cannot connect to Temporal at 127.0.0.1:{port}" in done.stderr
    assert "Start a local server with `durably dev`" in done.stderr


async def test_start_waits_for_the_output_and_cancel_ends_a_waiting_run(
    env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes
) -> None:
    greeter = Agent(id="greeter", model=ScriptedModel(["hello from the cli"]), instructions="")
    asker = Agent(
        id="asker",
        model=ScriptedModel([tool_call("ask", question="which?"), "done"]),
        instructions="",
        tools=[question_tool(name="ask", description="Ask.")],
    )
    await runtimes.start(
        [AgentRegistration(greeter, version="1"), AgentRegistration(asker, version="1")]
    )

    run_id = f"cli-{uuid.uuid4().hex[:8]}"
    started = await durably(
        env, "start", "greeter", "hi", "--run-id", run_id, "--wait",
        "--task-queue", client.task_queue,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    assert f"Started run {run_id}" in started.stdout
    assert "Completed after 1 turn(s)" in started.stdout
    assert "hello from the cli" in started.stdout

    run = await client.start_run("asker", "go")
    await wait_for_status(run, RunStatus.WAITING)
    cancelled = await durably(env, "cancel", run.run_id)
    assert cancelled.returncode == 0, cancelled.stderr
    with pytest.raises(RunCancelledError):
        await run.result()
    assert (await run.snapshot()).status == RunStatus.CANCELLED


def decider(made: list[str]) -> AgentRegistration:
    """Two refunds, each approved or denied from the CLI, then a question answered there."""

    @tool(requires_approval=True)
    async def refund(args: Ticket, ctx: ToolContext) -> TicketId:
        """Refund an order (needs a person's approval)."""
        made.append(args.title)
        return TicketId(ticket_id=f"R-{args.title}")

    agent = Agent(
        id="decider",
        model=ScriptedModel(
            [
                tool_call("refund", call_id="r1", title="A1"),
                tool_call("refund", call_id="r2", title="B2"),
                tool_call("ask", call_id="q1", question="Which order next?"),
                "done",
            ]
        ),
        instructions="",
        tools=[refund, question_tool(name="ask", description="Ask.")],
    )
    return AgentRegistration(agent, version="1")


async def test_approve_deny_and_answer_from_the_cli_decide_the_pending_call(
    env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes
) -> None:
    """Each command decides the call it prints, and the model reads the decision."""
    made: list[str] = []
    await runtimes.start([decider(made)])
    run = await client.start_run("decider", "refund both")

    await wait_for_interaction(run, "approval:1:r1")
    approved = await durably(env, "approve", run.run_id, "--as", "alice")
    assert approved.returncode == 0, approved.stderr
    assert "approval:1:r1 of run" in approved.stdout and "approved by alice" in approved.stdout
    assert '"title":"A1"' in approved.stdout  # the call it decided on

    await wait_for_interaction(run, "approval:2:r2")
    denied = await durably(env, "deny", run.run_id, "--reason", "over limit", "--as", "bob")
    assert denied.returncode == 0, denied.stderr
    assert "approval:2:r2 of run" in denied.stdout and "denied by bob" in denied.stdout

    await wait_for_interaction(run, "question:3:q1")
    answered = await durably(env, "answer", run.run_id, "C3", "--as", "carol")
    assert answered.returncode == 0, answered.stderr
    assert "question:3:q1 of run" in answered.stdout and "answered by carol" in answered.stdout

    assert (await run.result()).output == "done"
    assert made == ["A1"]  # the denied refund never ran
    events = {e.type: e.detail or "" for e in (await run.snapshot()).events}
    assert events["denied"].startswith("denied by bob") and events["denied"].endswith("over limit")
    assert events["answered"].startswith("answered by carol")
