"""AG-UI on `durably serve` (SPEC section 15): a run with a tool call, and one that waits
for an approval answered through AG-UI, each stream checked by `ag-ui-validate`."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from ag_ui_validate.pytest_plugin import assert_valid_agui
from pydantic import BaseModel

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    FunctionModel,
    ModelRequest,
    ToolContext,
    tool,
)
from durably.agents import Subagent
from durably.messages import AssistantMessage, ToolCall
from durably.models import last_tool_results
from durably.web import LiveServer

from .conftest import Runtimes


class Order(BaseModel):
    order: str


@tool
async def lookup(args: Order, ctx: ToolContext) -> str:
    """Look an order up."""
    return f"order {args.order} ships tomorrow"


@tool(requires_approval=True)
async def refund(args: Order, ctx: ToolContext) -> str:
    """Refund an order."""
    return f"refunded {args.order}"


def agent(agent_id: str, tool_name: str) -> AgentRegistration:
    """Calls `tool_name` for order A, then writes an answer from its result."""

    async def model(request: ModelRequest) -> AsyncIterator[str | AssistantMessage]:
        results = last_tool_results(request)
        if not results:
            call = ToolCall(id="c1", name=tool_name, arguments={"order": "A"})
            yield AssistantMessage(content=None, tool_calls=(call,))
            return
        for word in f"Done: {results[0].content}".split(" "):
            yield word + " "

    tools = {"lookup": lookup, "refund": refund}
    model_agent = Agent(
        id=agent_id,
        model=FunctionModel(model, name=f"agui.{agent_id}"),
        instructions="",
        tools=[tools[tool_name]],
    )
    return AgentRegistration(model_agent, version="1", tool_recovery={tool_name: "idempotent"})


def run_input(thread: str, text: str | None = None, **extra: Any) -> dict[str, Any]:
    messages = [{"id": "m1", "role": "user", "content": text}] if text else []
    return {
        "threadId": thread,
        "runId": f"agui-{uuid.uuid4().hex[:8]}",
        "messages": messages,
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {},
        **extra,
    }


async def post_agui(port: int, agent_id: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """POST a RunAgentInput; the AG-UI events of the answer's SSE stream, in order."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body).encode()
    writer.write(
        f"POST /agents/{agent_id}/agui HTTP/1.1\r\nHost: localhost:{port}\r\n"
        f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
        + data
    )
    raw = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    head, _, body_bytes = raw.partition(b"\r\n\r\n")
    assert b" 200 " in head.split(b"\r\n")[0], raw[:500]
    text = _dechunk(body_bytes).decode()
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def _dechunk(body: bytes) -> bytes:
    out = b""
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2 :]
    return out


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


async def test_a_run_with_a_tool_call_streams_valid_agui(
    client: DurableClient, runtimes: Runtimes
) -> None:
    await runtimes.start([agent("agui-looker", "lookup")])
    async with LiveServer(client, port=0) as server:
        thread = f"agui-t-{uuid.uuid4().hex[:8]}"
        events = await post_agui(server.port, "agui-looker", run_input(thread, "where is A?"))

    assert_valid_agui(events, max_warnings=0)
    assert types(events)[0] == "RUN_STARTED" and types(events)[-1] == "RUN_FINISHED"
    assert [t for t in types(events) if t.startswith("TOOL_CALL")] == [
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
    ]
    text = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "Done: order A ships tomorrow "
    assert events[-1]["outcome"] == {"type": "success"}
    session = await client.get_session(thread)  # the thread is a durably session
    assert len((await session.snapshot()).runs) == 1


async def test_an_approval_ends_the_agui_run_with_an_interrupt_and_a_resume_answers_it(
    client: DurableClient, runtimes: Runtimes
) -> None:
    await runtimes.start([agent("agui-refunder", "refund")])
    async with LiveServer(client, port=0) as server:
        thread = f"agui-t-{uuid.uuid4().hex[:8]}"
        first_input = run_input(thread, "refund A please")
        first = await post_agui(server.port, "agui-refunder", first_input)

        assert_valid_agui(first, max_warnings=0)
        outcome = first[-1]["outcome"]
        assert outcome["type"] == "interrupt"
        [interrupt] = outcome["interrupts"]
        assert interrupt["id"] == "approval:1:c1" and interrupt["toolCallId"] == "c1"

        resume = run_input(
            thread,
            parentRunId=first_input["runId"],
            resume=[
                {
                    "interruptId": interrupt["id"],
                    "status": "resolved",
                    "payload": {"approved": True},
                }
            ],
        )
        second = await post_agui(server.port, "agui-refunder", resume)

    assert_valid_agui(second, max_warnings=0)
    assert second[-1]["outcome"] == {"type": "success"}
    text = "".join(e["delta"] for e in second if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "Done: refunded A "
    session = await client.get_session(thread)
    [run] = await session.runs()
    approved = [e for e in (await run.snapshot()).events if e.type == "approved"]
    assert "by local" in (approved[0].detail or "")  # who answered through AG-UI


async def test_a_thread_of_another_agent_is_not_submitted_into(
    client: DurableClient, runtimes: Runtimes
) -> None:
    """The URL's agent was ignored: a `threadId` of another agent's session submitted
    into that conversation."""
    await runtimes.start([agent("agui-owner", "lookup"), agent("agui-other", "lookup")])
    async with LiveServer(client, port=0) as server:
        thread = f"agui-t-{uuid.uuid4().hex[:8]}"
        await post_agui(server.port, "agui-owner", run_input(thread, "where is A?"))
        events = await post_agui(server.port, "agui-other", run_input(thread, "and B?"))

    assert types(events)[-1] == "RUN_ERROR"
    assert "conversation with agent 'agui-owner'" in events[-1]["message"]
    session = await client.get_session(thread)
    assert len((await session.snapshot()).runs) == 1


async def test_a_subagents_approval_ends_the_agui_run_with_an_interrupt_and_a_resume_answers_it(
    client: DurableClient, runtimes: Runtimes
) -> None:
    """An AG-UI run whose agent delegated to a subagent that needs approval never
    emitted an interrupt or `RUN_FINISHED`: the parent runs while its child waits."""

    def manager(request: ModelRequest) -> AssistantMessage:
        results = last_tool_results(request)
        if results:
            return AssistantMessage(content=f"manager: {results[0].content}")
        call = ToolCall(id="d0", name="agui-child", arguments={"task": "refund order A"})
        return AssistantMessage(tool_calls=(call,))

    boss = Agent(
        id="agui-boss", model=FunctionModel(manager, name="agui.boss"), instructions="",
        subagents=[Subagent("agui-child")],
    )  # fmt: skip
    await runtimes.start([agent("agui-child", "refund"), AgentRegistration(boss, version="1")])
    async with LiveServer(client, port=0) as server:
        thread = f"agui-t-{uuid.uuid4().hex[:8]}"
        first_input = run_input(thread, "refund A please")
        first = await post_agui(server.port, "agui-boss", first_input)

        assert_valid_agui(first, max_warnings=0)
        outcome = first[-1]["outcome"]
        assert outcome["type"] == "interrupt"
        [interrupt] = outcome["interrupts"]
        assert interrupt["id"].endswith("#approval:1:c1") and interrupt["toolCallId"] == "d0"

        resume = run_input(
            thread,
            parentRunId=first_input["runId"],
            resume=[{"interruptId": interrupt["id"], "status": "resolved", "payload": True}],
        )
        second = await post_agui(server.port, "agui-boss", resume)

    assert_valid_agui(second, max_warnings=0)
    assert second[-1]["outcome"] == {"type": "success"}
    session = await client.get_session(thread)
    [run] = await session.runs()
    assert (await run.result()).output == "manager: Done: refunded A "
