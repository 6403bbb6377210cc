"""`durably follow RUN|SESSION`: the events an operator watches live (SPEC section 15)."""

from __future__ import annotations

import json
import subprocess
import sys

from temporalio.testing import WorkflowEnvironment

from durably import Agent, AgentRegistration, DurableClient, FunctionModel, ModelRequest
from durably.messages import UserMessage

from .conftest import Runtimes, cli


def parrot() -> AgentRegistration:
    """Writes back the last user message, a word at a time."""

    async def answer(request: ModelRequest):  # type: ignore[no-untyped-def]
        last = [m.content for m in request.messages if isinstance(m, UserMessage)][-1]
        for word in f"you said: {last}".split(" "):
            yield word + " "

    agent = Agent(id="parrot", model=FunctionModel(answer, name="follow.parrot"), instructions="")
    return AgentRegistration(agent, version="1")


async def durably(env: WorkflowEnvironment, *args: str) -> subprocess.CompletedProcess[str]:
    target = env.client.service_client.config.target_host
    return await cli(sys.executable, "-m", "durably", *args, "--target", target)


def lines(done: subprocess.CompletedProcess[str]) -> list[dict[str, object]]:
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


async def test_follow_prints_a_runs_events_and_its_text(
    env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes
) -> None:
    await runtimes.start([parrot()])
    run = await client.start_run("parrot", "hello there")
    result = await run.result()

    items = lines(await durably(env, "follow", run.run_id, "--json"))
    events = [i["event"] for i in items]  # type: ignore[index]
    types = [e["type"] for e in events]  # type: ignore[index]
    assert types[0] == "agent_pinned" and types[-1] == "run_completed"
    text = "".join(e["text"] for e in events if e["type"] == "text_delta")  # type: ignore[index]
    assert text == result.output == "you said: hello there "

    shown = await durably(env, "follow", run.run_id)
    assert shown.returncode == 0, shown.stderr
    assert "you said: hello there" in shown.stdout
    assert "run_completed" in shown.stdout.splitlines()[-1]

    missing = await durably(env, "follow", "no-such-run")
    assert missing.returncode == 1 and "no run or session 'no-such-run'" in missing.stderr


async def test_follow_a_session_prints_each_run_in_turn(
    env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes
) -> None:
    await runtimes.start([parrot()])
    session = await client.start_session("parrot")
    for text in ("one", "two"):
        await (await session.submit(text)).result()
    await session.close()

    items = lines(await durably(env, "follow", session.session_id, "--json"))
    session_events = [i["event"]["type"] for i in items if i["event"]["kind"] == "session"]  # type: ignore[index]
    # A submission may be taken while the session still reads the previous run's messages.
    assert session_events.count("submitted") == 2
    assert [e for e in session_events if e != "submitted"] == [
        "run_started", "run_closed", "run_started", "run_closed", "closed",
    ]  # fmt: skip
    outputs = [i["event"]["output"] for i in items if i["event"]["type"] == "run_completed"]  # type: ignore[index]
    assert outputs == ["you said: one ", "you said: two "]
