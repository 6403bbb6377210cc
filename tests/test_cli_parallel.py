"""Several tool calls of one model answer wait for approval at once: `durably inbox`
shows each, and `durably approve --all` / `deny --all` decide them in one go."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from typing import Any

from pydantic import BaseModel
from temporalio.testing import WorkflowEnvironment

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    FunctionModel,
    RunHandle,
    RunSnapshot,
    ToolContext,
    tool,
)
from durably.approvals import ENV_KEYS, ApprovalKeys
from durably.client._client import _inbox_items
from durably.messages import AssistantMessage, ModelRequest
from durably.models import last_tool_results, tool_call
from durably.tools import question_tool

from .conftest import Runtimes, cli, echo, eventually

ORDERS = ("A1", "B2", "C3")
CALLS = [f"approval:1:r{n}" for n in range(1, 4)]


class Order(BaseModel):
    order: str


def refunds(made: list[str], *, ask: bool = False, **options: Any) -> AgentRegistration:
    """An agent whose first answer refunds three orders at once (each needs approval;
    with `ask`, a question beside them), and whose second echoes the results it read."""

    @tool(requires_approval=True)
    async def refund(args: Order, ctx: ToolContext) -> str:
        """Refund an order (needs a person's approval)."""
        made.append(args.order)
        return f"refunded {args.order}"

    def model(request: ModelRequest) -> AssistantMessage:
        if last_tool_results(request):
            return echo(request)
        calls = [tool_call("refund", call_id=f"r{n}", order=o) for n, o in enumerate(ORDERS, 1)]
        if ask:
            calls.append(tool_call("ask", call_id="q1", question="Which order next?"))
        return AssistantMessage(tool_calls=tuple(calls))

    agent = Agent(
        id="refunder",
        model=FunctionModel(model),
        instructions="",
        tools=[refund, question_tool(name="ask", description="Ask.")],
    )
    return AgentRegistration(agent, version="1", **options)


async def durably(
    env: WorkflowEnvironment, *args: str, environ: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    target = env.client.service_client.config.target_host
    return await cli(sys.executable, "-m", "durably", *args, "--target", target, env=environ)


async def pending(run: RunHandle, count: int) -> None:
    """Wait until the run waits on `count` interactions."""

    async def all_there() -> bool:
        return len(await run.pending()) == count

    await eventually(all_there)


async def test_inbox_shows_each_call_and_approve_all_approves_all_three(
    env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes
) -> None:
    """One line per pending call in the inbox; one command approves them all, and a
    second one, with nothing left pending, exits 1 saying so."""
    made: list[str] = []
    await runtimes.start([refunds(made)])
    run = await client.start_run("refunder", "refund all three")
    await pending(run, 3)

    async def in_inbox() -> bool:
        inbox = await client.inbox(task_queue=client.task_queue)
        return sum(i.run_id == run.run_id for i in inbox) == 3

    await eventually(in_inbox)
    inbox = await durably(env, "inbox", "--task-queue", client.task_queue)
    assert inbox.returncode == 0, inbox.stderr
    lines = [line for line in inbox.stdout.splitlines() if run.run_id in line]
    assert len(lines) == 3
    assert [next(c for c in CALLS if c in line) for line in lines] == CALLS

    approved = await durably(env, "approve", run.run_id, "--all", "--as", "alice")
    assert approved.returncode == 0, approved.stderr
    assert "Approving 3 tool call(s)" in approved.stdout
    for call, order in zip(CALLS, ORDERS, strict=True):
        assert f'{call}: tool refund, arguments {{"order":"{order}"}}' in approved.stdout
    assert "All 3 approved by alice." in approved.stdout

    result = await run.result()
    assert sorted(made) == sorted(ORDERS)
    assert [r["content"] for r in json.loads(result.output or "")] == [
        f"refunded {o}" for o in ORDERS
    ]
    events = [e for e in (await run.snapshot()).events if e.type == "approved"]
    assert len(events) == 3
    assert all((e.detail or "").startswith("approved by alice") for e in events)

    again = await durably(env, "approve", run.run_id, "--all", "--as", "alice")
    assert again.returncode == 1
    assert "waits for no tool approval, so nothing was approved" in again.stderr


async def test_deny_all_denies_every_call_and_leaves_the_question_pending(
    env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes
) -> None:
    """The model reads `denied: no` for each call; the question beside them is named
    as not answered and stays pending."""
    made: list[str] = []
    await runtimes.start([refunds(made, ask=True)])
    run = await client.start_run("refunder", "refund all three")
    await pending(run, 4)

    denied = await durably(env, "deny", run.run_id, "--all", "--reason", "no", "--as", "bob")
    assert denied.returncode == 0, denied.stderr
    assert "Denying 3 tool call(s)" in denied.stdout
    assert "Not answered by --all: question(s) question:1:q1" in denied.stdout
    assert "All 3 denied by bob." in denied.stdout
    assert [i.id for i in await run.pending()] == ["question:1:q1"]

    only_question = await durably(env, "deny", run.run_id, "--all", "--as", "bob")
    assert only_question.returncode == 1
    assert "only for question(s) question:1:q1, so nothing was denied" in only_question.stderr

    await run.answer("question:1:q1", "none", responder="carol")
    results = json.loads((await run.result()).output or "")
    assert results == [*[{"error": True, "content": "denied: no"}] * 3, results[3]]
    assert made == []


async def test_all_and_an_interaction_id_are_refused_together(env: WorkflowEnvironment) -> None:
    """`--all` decides every pending call, so naming one as well is a usage error."""
    both = await durably(
        env, "approve", "some-run", "--all", "--interaction", CALLS[0], "--as", "alice"
    )
    assert both.returncode == 2
    assert "--all decides every pending tool call, so it takes no --interaction" in both.stderr


async def test_approve_all_signs_each_call_with_the_key_in_its_environment(
    env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes
) -> None:
    """Calls of a tool that names its approvers take signed decisions: `--all` signs
    each one with the key the command holds, and without a key nothing is approved."""
    made: list[str] = []
    keys = ApprovalKeys({"k1": b"k" * 32})
    await runtimes.start([refunds(made, approvers={"refund": ["alice"]})], approval_keys=keys)
    run = await client.start_run("refunder", "refund all three")
    await pending(run, 3)
    without_key = {k: v for k, v in os.environ.items() if not k.startswith("DURABLY_APPROVAL")}
    approve = ("approve", run.run_id, "--all", "--as", "alice")

    refused = await durably(env, *approve, environ=without_key)
    assert refused.returncode == 1 and "takes only signed decisions" in refused.stderr

    key = base64.b64encode(b"k" * 32).decode()
    done = await durably(env, *approve, environ={**without_key, ENV_KEYS: f"k1:{key}"})
    assert done.returncode == 0, done.stderr
    await run.result()
    assert sorted(made) == sorted(ORDERS)


def test_the_inbox_lists_every_blocked_failed_and_pending_item_of_one_run() -> None:
    """A turn can park calls beside pending approvals; the run's status names only the
    most urgent (needs_attention), yet the inbox shows each of them."""
    snap = RunSnapshot.model_validate(
        {
            "run_id": "r",
            "agent_id": "a",
            "status": "needs_attention",
            "blocked_operation": "tool:1:c1",
            "blocked_operations": ["tool:1:c1", "tool:1:c2"],
            "attention": {"reason": "tool_interrupted", "detail": {"tool": "crash", "args": {}}},
            "failed_operations": ["tool:1:c3"],
            "error": "RuntimeError: boom",
            "interactions": [
                {
                    "id": "approval:1:c4",
                    "type": "tool-approval",
                    "operation": "tool:1:c4",
                    "tool": "refund",
                    "args": {"order": "A1"},
                    "args_digest": "d",
                }
            ],
        }
    )
    shown = [(i.kind, i.interaction_id or i.operation, i.waiting_for) for i in _inbox_items(snap)]
    assert shown == [
        ("blocked", "tool:1:c1", "verify crash in the external system, then resolve it"),
        ("blocked", "tool:1:c2", "verify this call in the external system, then resolve it"),
        ("failed", "tool:1:c3", "retry after fixing: RuntimeError: boom"),
        ("approval", "approval:1:c4", 'approve refund({"order": "A1"})'),
    ]
