"""Operators hold a conversation from the `durably` command line (SPEC section 13):
`session start`, `send`, `session show`, `session list`, `session close`."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid

from temporalio.testing import WorkflowEnvironment

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    FunctionModel,
    ModelRequest,
    RunStatus,
)
from durably.messages import AssistantMessage, ToolCall, ToolResultMessage, UserMessage
from durably.tools import question_tool

from .conftest import Runtimes, cli, eventually, wait_for_status


def chat() -> AgentRegistration:
    """Repeats every user message it was sent, in order; asks a question on `ask: ...`."""

    def answer(request: ModelRequest) -> AssistantMessage:
        last = request.messages[-1]
        if isinstance(last, ToolResultMessage):
            return AssistantMessage(content=f"you answered {last.content}")
        if isinstance(last, UserMessage) and last.content.startswith("ask: "):
            question = last.content.removeprefix("ask: ")
            call = ToolCall(call_id="q", name="ask_user", arguments={"question": question})
            return AssistantMessage(tool_calls=(call,))
        heard = [m.content for m in request.messages if isinstance(m, UserMessage)]
        return AssistantMessage(content="heard: " + " | ".join(heard))

    agent = Agent(
        id="cli-chat",
        model=FunctionModel(answer),
        instructions="",
        tools=[question_tool(name="ask_user", description="Ask the customer.")],
    )
    return AgentRegistration(agent, version="1")


async def durably(env: WorkflowEnvironment, *args: str) -> subprocess.CompletedProcess[str]:
    target = env.client.service_client.config.target_host
    return await cli(sys.executable, "-m", "durably", *args, "--target", target)


def rows(done: subprocess.CompletedProcess[str]) -> list[list[str]]:
    """The command's output, each line split into its cells."""
    return [line.split() for line in done.stdout.splitlines()]


async def test_a_two_message_session_from_the_cli_reads_the_first_message(
    env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes
) -> None:
    """`send --wait` prints each run's output; the second run heard the first message."""
    await runtimes.start([chat()])
    session_id = f"cli-s-{uuid.uuid4().hex[:8]}"
    started = await durably(
        env, "session", "start", "cli-chat", "--session-id", session_id,
        "--task-queue", client.task_queue,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    assert f"Started session {session_id}" in started.stdout

    first = await durably(env, "send", session_id, "I am Ada", "--wait")
    assert first.returncode == 0, first.stderr
    assert "Started run " in first.stdout and "Completed after 1 turn(s)" in first.stdout
    assert "heard: I am Ada" in first.stdout
    second = await durably(env, "send", session_id, "who am I?", "--wait")
    assert second.returncode == 0, second.stderr
    assert "heard: I am Ada | who am I?" in second.stdout

    session = await client.get_session(session_id)

    async def caught_up() -> bool:  # the session takes a closed run's messages next
        return (await session.snapshot()).messages == 4

    await eventually(caught_up)
    runs = [r.run_id for r in (await session.snapshot()).runs]
    shown = await durably(env, "session", "show", session_id)
    assert shown.returncode == 0, shown.stderr
    assert "4 in the conversation" in shown.stdout
    assert [row[:5] for row in rows(shown) if row[1:2] in ([runs[0]], [runs[1]])] == [
        ["1", runs[0], "completed", "0", "2"],
        ["2", runs[1], "completed", "2", "2"],
    ]
    as_json = await durably(env, "session", "show", session_id, "--json")
    assert [r["input"] for r in json.loads(as_json.stdout)["runs"]] == ["I am Ada", "who am I?"]

    listed = await durably(env, "session", "list", "--agent", "cli-chat", "--open")
    assert listed.returncode == 0, listed.stderr
    assert [session_id, "cli-chat", "open"] in [row[:3] for row in rows(listed)]
    in_runs = await durably(env, "runs", "list", "--agent", "cli-chat")
    assert [runs[1], session_id] in [row[:2] for row in rows(in_runs)]

    closed = await durably(env, "session", "close", session_id)
    assert closed.returncode == 0, closed.stderr
    assert f"Session {session_id} is closed" in closed.stdout


async def test_inbox_shows_the_session_and_a_busy_session_rejects_a_message(
    env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes
) -> None:
    """A waiting run shows its session; `send` refuses, or with enqueue waits its turn."""
    await runtimes.start([chat()])
    session = await client.start_session("cli-chat")
    run = await session.submit("ask: which order?")
    waiting = await wait_for_status(run, RunStatus.WAITING)

    async def in_inbox() -> bool:
        return run.run_id in {i.run_id for i in await client.inbox(task_queue=client.task_queue)}

    await eventually(in_inbox)
    inbox = await durably(env, "inbox", "--task-queue", client.task_queue)
    assert inbox.returncode == 0, inbox.stderr
    (row,) = [row for row in rows(inbox) if run.run_id in row]
    assert row[:4] == [run.run_id, session.session_id, "cli-chat", "question"]

    refused = await durably(env, "send", session.session_id, "hello?")
    assert refused.returncode == 1
    assert f"run {run.run_id!r} is still open" in refused.stderr
    assert "Traceback" not in refused.stderr
    not_a_session = await durably(env, "session", "show", run.run_id)
    assert not_a_session.returncode == 1
    assert f"{run.run_id!r} is not a session but a run" in not_a_session.stderr
    queued = asyncio.create_task(
        durably(env, "send", session.session_id, "thanks", "--if-busy", "enqueue", "--wait")
    )

    async def enqueued() -> bool:
        return len((await session.snapshot()).runs) == 2

    await eventually(enqueued)
    assert waiting.interaction is not None
    await run.answer(waiting.interaction.id, "A-7")  # the queued run starts after this one
    done = await queued
    assert done.returncode == 0, done.stderr
    assert "Queued run " in done.stdout
    assert "heard: ask: which order? | thanks" in done.stdout
    await session.close()
