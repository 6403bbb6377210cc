"""Owned subagents (SPEC section 16): a call starts the subagent's run as a child, exactly
as safe as a top-level run and visible from its parent."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest
from pydantic import BaseModel

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    DurableConflictError,
    FunctionModel,
    ModelRequest,
    RunStatus,
    ToolContext,
    ToolRetry,
    tool,
)
from durably.agents import Subagent
from durably.contract import Handler
from durably.messages import AssistantMessage, ModelResponse, ToolCall, Usage
from durably.models import last_tool_results
from durably.web import LiveServer

from .conftest import (
    Runtimes,
    binary,
    chain_histories,
    cli,
    confirmed_status,
    eventually,
    failed_tasks,
    record_history,
    wait_for_status,
)


class Order(BaseModel):
    order: str


def answer_with(text: str, tokens: int) -> ModelResponse:
    return ModelResponse(
        message=AssistantMessage(content=text),
        usage=Usage(requests=1, input_tokens=tokens, output_tokens=tokens),
    )


def calling(*calls: ToolCall, tokens: int) -> ModelResponse:
    return ModelResponse(
        message=AssistantMessage(tool_calls=calls),
        usage=Usage(requests=1, input_tokens=tokens, output_tokens=tokens),
    )


class Shop:
    """The agents: `researcher` answers at once; `refunder` refunds after an approval;
    `breaker` calls a tool that fails until `fixed`; `manager` delegates to them."""

    def __init__(self) -> None:
        self.refunded: list[str] = []
        self.fixed = False
        self.manager_saw: list[list[str]] = []

    def registrations(self, *delegates: str) -> list[AgentRegistration]:
        shop = self

        @tool(requires_approval=True)
        async def refund(args: Order, ctx: ToolContext) -> str:
            """Refund an order."""
            shop.refunded.append(args.order)
            return f"refunded {args.order}"

        @tool
        async def flaky(args: Order, ctx: ToolContext) -> str:
            """A lookup that fails until fixed."""
            if not shop.fixed:
                raise RuntimeError("the order database is down")
            return f"order {args.order} found"

        def researcher(request: ModelRequest) -> ModelResponse:
            return answer_with("order A shipped on Monday", 3)

        def refunder(request: ModelRequest) -> ModelResponse:
            results = last_tool_results(request)
            if results:
                return answer_with(f"done: {results[0].content}", 5)
            call = ToolCall(id="r", name="refund", arguments={"order": "A"})
            return calling(call, tokens=5)

        def breaker(request: ModelRequest) -> ModelResponse:
            results = last_tool_results(request)
            if results:
                return answer_with(results[0].content, 2)
            return calling(ToolCall(id="f", name="flaky", arguments={"order": "A"}), tokens=2)

        def manager(request: ModelRequest) -> ModelResponse:
            results = last_tool_results(request)
            if results:
                shop.manager_saw.append([r.content for r in results])
                return answer_with(" | ".join(r.content for r in results), 7)
            calls = tuple(
                ToolCall(id=f"d{i}", name=name, arguments={"task": f"handle order A ({name})"})
                for i, name in enumerate(delegates)
            )
            return calling(*calls, tokens=7)

        def agent(agent_id: str, fn: Any, **extra: Any) -> Agent:
            return Agent(
                id=agent_id, model=FunctionModel(fn, name=f"sub.{agent_id}"), instructions="",
                **extra,
            )  # fmt: skip

        retry = ToolRetry(max_attempts=2, initial_delay_ms=10, max_delay_ms=10)
        return [
            AgentRegistration(agent("researcher", researcher), version="1"),
            AgentRegistration(
                agent("refunder", refunder, tools=[refund]),
                version="1",
                tool_recovery={"refund": "idempotent"},
            ),
            AgentRegistration(
                agent("breaker", breaker, tools=[flaky]),
                version="1",
                tool_recovery={"flaky": "safe"},
                tool_retry=retry,
            ),
            AgentRegistration(
                agent("manager", manager, subagents=[Subagent(d) for d in delegates]),
                version="1",
            ),
        ]


async def child_of(client: DurableClient, parent_id: str, operation: str) -> str:
    snap = await client.temporal.get_workflow_handle(parent_id).describe()
    first = snap.raw_description.workflow_execution_info.first_run_id
    return f"{parent_id}/{first}/{operation}"


class TestDelegation:
    async def test_two_subagents_one_approved_by_temporal_signal_on_the_child(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        shop = Shop()
        await runtimes.start(shop.registrations("researcher", "refunder"))
        parent = await client.start_run("manager", "sort out order A")
        refunder_id = await child_of(client, parent.run_id, "tool:1:d1")

        async def child_waits() -> bool:
            snap = await parent.snapshot()
            return any(c.run_id == refunder_id and c.status == "waiting" for c in snap.children)

        await eventually(child_waits)
        snap = await parent.snapshot()
        assert snap.status == RunStatus.RUNNING  # the parent runs: its child waits
        assert refunder_id in (snap.current or "") and "approval:1:r" in (snap.current or "")
        inbox = [
            i for i in await client.inbox(task_queue=client.task_queue) if i.run_id == refunder_id
        ]
        assert [(i.kind, i.parent_run_id) for i in inbox] == [("approval", parent.run_id)]
        listed = [r for r in await client.list_runs(agent_id="refunder") if r.run_id == refunder_id]
        assert [r.parent_run_id for r in listed] == [parent.run_id]
        target = client.temporal.service_client.config.target_host
        shown = await cli(
            sys.executable, "-m", "durably", "runs", "show", parent.run_id, "--target", target
        )
        assert shown.returncode == 0, shown.stderr
        assert f"└── {refunder_id} waiting" in shown.stdout  # the run tree, its child below

        child = await client.get_run(refunder_id)
        [interaction] = await child.pending()
        signal = {
            "interaction_id": interaction.id,
            "response": {
                "type": "tool-approval",
                "approved": True,
                "args_digest": interaction.args_digest,
            },
            "responder": "alice",
        }
        sent = await cli(
            binary("temporal"), "workflow", "signal", "--address", target,
            "--workflow-id", refunder_id, "--name", Handler.RESPOND_SIGNAL.value,
            "--input", json.dumps(signal),
        )  # fmt: skip
        assert sent.returncode == 0, sent.stderr
        result = await asyncio.wait_for(parent.result(), 30)

        assert result.output == "order A shipped on Monday | done: refunded A"
        assert shop.refunded == ["A"]
        own = Usage(requests=2, input_tokens=14, output_tokens=14, tool_calls=2)  # delegations
        children = Usage(requests=1, input_tokens=3, output_tokens=3) + Usage(
            requests=2, input_tokens=10, output_tokens=10, tool_calls=1
        )
        assert result.usage == own + children
        assert (await child.snapshot()).parent_run_id == parent.run_id
        await record_history(client, parent.run_id, "subagents_one_approved_on_the_child")
        await record_history(client, refunder_id, "subagent_run_approved_and_reported")

    async def test_a_failed_child_parks_the_parent_until_the_child_is_retried(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        shop = Shop()
        await runtimes.start(shop.registrations("breaker"))
        parent = await client.start_run("manager", "look order A up")
        breaker_id = await child_of(client, parent.run_id, "tool:1:d0")

        snap = await wait_for_status(parent, RunStatus.NEEDS_ATTENTION)
        assert snap.attention is not None and snap.attention.reason == "subagent_failed"
        assert snap.blocked_operation == "tool:1:d0"
        assert breaker_id in (snap.current or "")
        with pytest.raises(DurableConflictError, match=r"retry\(\) th(at|ose) run"):
            await parent.retry()

        shop.fixed = True
        child = await client.get_run(breaker_id)
        await child.retry()
        result = await asyncio.wait_for(parent.result(), 30)
        assert result.output == "order A found"
        await record_history(client, parent.run_id, "subagent_failed_then_child_retried")

    async def test_resolving_the_parents_call_lets_its_model_handle_the_error(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        shop = Shop()
        await runtimes.start(shop.registrations("breaker"))
        parent = await client.start_run("manager", "look order A up")
        breaker_id = await child_of(client, parent.run_id, "tool:1:d0")
        await wait_for_status(parent, RunStatus.NEEDS_ATTENTION)

        with pytest.raises(DurableConflictError, match="still open"):
            await parent.resolve_tool("tool:1:d0", {"type": "rerun"})
        await parent.resolve_tool("tool:1:d0", {"type": "error", "message": "gave up on it"})
        result = await asyncio.wait_for(parent.result(), 30)

        assert result.output == "gave up on it"
        child = await client.get_run(breaker_id)
        await wait_for_status(child, RunStatus.CANCELLED)  # nobody reads it any more

    async def test_cancelling_the_parent_cancels_its_child_whose_tool_sees_the_abort(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        started, aborted = asyncio.Event(), asyncio.Event()

        @tool
        async def slow_lookup(args: Order, ctx: ToolContext) -> str:
            """A lookup that takes until it is told to stop."""
            started.set()
            await ctx.abort_signal.wait()
            aborted.set()
            return "stopped"

        def worker_model(request: ModelRequest) -> ModelResponse:
            if last_tool_results(request):
                return answer_with("done", 1)
            return calling(ToolCall(id="s", name="slow_lookup", arguments={"order": "A"}), tokens=1)

        def boss(request: ModelRequest) -> ModelResponse:
            if last_tool_results(request):
                return answer_with("done", 1)
            return calling(ToolCall(id="w", name="looker", arguments={"task": "look"}), tokens=1)

        looker = Agent(
            id="looker", model=FunctionModel(worker_model, name="sub.looker"), instructions="",
            tools=[slow_lookup],
        )  # fmt: skip
        top = Agent(
            id="looker-boss", model=FunctionModel(boss, name="sub.looker-boss"),
            instructions="", subagents=["looker"],
        )  # fmt: skip
        await runtimes.start(
            [
                AgentRegistration(looker, version="1", tool_recovery={"slow_lookup": "safe"}),
                AgentRegistration(top, version="1"),
            ]
        )
        parent = await client.start_run("looker-boss", "look it up")
        child_id = await child_of(client, parent.run_id, "tool:1:w")
        await asyncio.wait_for(started.wait(), 30)

        await parent.cancel()
        await asyncio.wait_for(aborted.wait(), 30)  # the child's running tool was told
        await wait_for_status(parent, RunStatus.CANCELLED)
        await wait_for_status(await client.get_run(child_id), RunStatus.CANCELLED)

    async def test_a_run_started_with_a_forged_parent_is_refused(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        shop = Shop()
        await runtimes.start(shop.registrations("researcher"))
        handle = await client.temporal.start_workflow(
            "AgentRunWorkflow",
            {
                "agent_id": "researcher",
                "input": "hi",
                "parent": {"run_id": "x", "operation": "tool:1:a"},
            },
            id="forged-child",
            task_queue=client.task_queue,
        )
        run = await client.get_run(handle.id)
        snap = await wait_for_status(run, RunStatus.FAILED)
        assert "only the run whose subagent call starts this run" in (snap.error or "")


class TestNesting:
    async def test_three_levels_of_subagents(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        def boss(request: ModelRequest) -> ModelResponse:
            results = last_tool_results(request)
            if results:
                return answer_with(f"boss: {results[0].content}", 1)
            return calling(ToolCall(id="m", name="manager", arguments={"task": "go"}), tokens=1)

        shop = Shop()
        registrations = shop.registrations("researcher")
        top = Agent(
            id="boss", model=FunctionModel(boss, name="sub.boss"), instructions="",
            subagents=["manager"],
        )  # fmt: skip
        await runtimes.start([*registrations, AgentRegistration(top, version="1")])
        run = await client.start_run("boss", "what happened to order A")

        result = await asyncio.wait_for(run.result(), 30)
        assert result.output == "boss: order A shipped on Monday"
        assert result.usage.requests == 2 + 2 + 1


class TestContinueAsNewAroundAChild:
    async def test_a_full_parent_never_continues_as_new_while_its_child_is_open(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """Junk signals fill the parent's history while its child waits for a person: the
        parent keeps the child (one child workflow, never abandoned), and continues as new
        only once the child answered."""
        shop = Shop()
        registrations = shop.registrations("refunder")
        manager = registrations[-1]
        small = AgentRegistration(manager.agent, version="1", continue_as_new_events=40)
        await runtimes.start([*registrations[:-1], small])
        parent = await client.start_run("manager", "refund A")
        child_id = await child_of(client, parent.run_id, "tool:1:d0")

        async def child_waits() -> bool:
            return any(c.status == "waiting" for c in (await parent.snapshot()).children)

        await eventually(child_waits)
        handle = client.temporal.get_workflow_handle(parent.run_id)
        for i in range(50):
            await handle.signal(Handler.RESPOND_SIGNAL, {"interaction_id": f"junk-{i}"})
        assert len(await chain_histories(client, parent.run_id)) == 1  # it kept its child

        child = await client.get_run(child_id)
        [interaction] = await child.pending()
        await child.approve(interaction, responder="alice")
        result = await asyncio.wait_for(parent.result(), 30)

        assert result.output == "done: refunded A"
        histories = await chain_histories(client, parent.run_id)
        assert len(histories) >= 2 and failed_tasks(histories) == []
        children = [
            w.id async for w in client.temporal.list_workflows(f'WorkflowId = "{child_id}"')
        ]
        assert children == [child_id]
        assert shop.refunded == ["A"]


class TestTakenChildIds:
    async def test_a_child_id_taken_beforehand_parks_the_call_instead_of_failing_the_parent(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """Someone starts a workflow under the id a call's child will have: the parent
        never adopts it; the call parks, saying so, and a resolution lets the run go on."""
        gate = asyncio.Event()

        async def slow_boss(request: ModelRequest) -> ModelResponse:
            if last_tool_results(request):
                return answer_with(last_tool_results(request)[0].content, 1)
            await asyncio.wait_for(gate.wait(), 20)
            return calling(ToolCall(id="x", name="researcher", arguments={"task": "go"}), tokens=1)

        shop = Shop()
        boss = Agent(
            id="slow-boss", model=FunctionModel(slow_boss, name="sub.slow-boss"),
            instructions="", subagents=["researcher"],
        )  # fmt: skip
        await runtimes.start([*shop.registrations(), AgentRegistration(boss, version="1")])
        parent = await client.start_run("slow-boss", "research")
        child_id = await child_of(client, parent.run_id, "tool:1:x")
        squatter = await client.start_run("researcher", "not the parent's", run_id=child_id)
        await squatter.result()
        gate.set()

        snap = await wait_for_status(parent, RunStatus.NEEDS_ATTENTION)
        assert snap.attention is not None and snap.attention.reason == "subagent_failed"
        assert "taken by a workflow this run did not start" in str(snap.attention.detail)
        await parent.resolve_tool("tool:1:x", {"type": "error", "message": "no research"})
        assert (await asyncio.wait_for(parent.result(), 30)).output == "no research"


class TestForgedNotes:
    """A child's status note is a signal, which anyone may send: the parent reads the
    child's status from the server instead of taking the note's word."""

    async def test_a_forged_failure_note_changes_nothing(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """A forged "failed" note parked the parent's call on a child that was waiting."""
        shop = Shop()
        await runtimes.start(shop.registrations("refunder"))
        parent = await client.start_run("manager", "refund A")
        child_id = await child_of(client, parent.run_id, "tool:1:d0")

        async def child_waits() -> bool:
            return any(c.status == "waiting" for c in (await parent.snapshot()).children)

        await eventually(child_waits)
        forged = {"run_id": child_id, "status": "failed", "detail": "x" * 2000, "seq": 10**9}
        handle = client.temporal.get_workflow_handle(parent.run_id)
        await handle.signal(Handler.CHILD_STATUS, forged)  # detail too long: refused
        await handle.signal(Handler.CHILD_STATUS, {**forged, "detail": "forged"})

        async def read_the_childs_status() -> bool:  # a local activity's marker, after it
            events = (await handle.fetch_history()).events
            signal = "workflow_execution_signaled_event_attributes"
            signalled = max(i for i, e in enumerate(events) if e.HasField(signal))
            return any(confirmed_status(e) for e in events[signalled:])

        await eventually(read_the_childs_status)
        snap = await parent.snapshot()
        assert snap.status == RunStatus.RUNNING and snap.attention is None
        assert [c.status for c in snap.children] == ["waiting"]
        child = await client.get_run(child_id)
        [interaction] = await child.pending()
        await child.approve(interaction, responder="alice")
        result = await asyncio.wait_for(parent.result(), 30)

        assert result.output == "done: refunded A"
        snap = await parent.snapshot()
        assert snap.attention is None and snap.status == RunStatus.COMPLETED
        assert not any("forged" in (e.detail or "") for e in snap.events)
        rejected = [e for e in snap.events if e.type == "signal_rejected"]
        assert len(rejected) == 1 and "1000" in (rejected[0].detail or "")
        assert failed_tasks(await chain_histories(client, parent.run_id)) == []
        await record_history(client, parent.run_id, "parent_read_its_childs_status_for_a_note")

    async def test_a_forged_note_from_the_future_cannot_hide_the_childs_real_notes(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """A forged note with `seq = 10**18` made the parent ignore every real note of
        its child after it: here, that the child now needs attention."""

        @tool(requires_approval=True)
        async def wire(args: Order, ctx: ToolContext) -> str:
            """Wire money: the bank is down."""
            raise RuntimeError("the bank is down")

        def wirer(request: ModelRequest) -> ModelResponse:
            return calling(ToolCall(id="w", name="wire", arguments={"order": "A"}), tokens=1)

        def boss(request: ModelRequest) -> ModelResponse:
            call = ToolCall(id="d0", name="wirer", arguments={"task": "wire for order A"})
            return calling(call, tokens=1)

        def agent(agent_id: str, fn: Any, **extra: Any) -> Agent:
            model = FunctionModel(fn, name=f"forged.{agent_id}")
            return Agent(id=agent_id, model=model, instructions="", **extra)

        await runtimes.start(
            [
                AgentRegistration(agent("wirer", wirer, tools=[wire]), version="1"),
                AgentRegistration(agent("boss", boss, subagents=[Subagent("wirer")]), version="1"),
            ]
        )
        parent = await client.start_run("boss", "wire for order A")
        child_id = await child_of(client, parent.run_id, "tool:1:d0")

        def child_is(status: str) -> Any:
            async def check() -> bool:
                return any(c.status == status for c in (await parent.snapshot()).children)

            return check

        await eventually(child_is("waiting"))
        forged = {"run_id": child_id, "status": "waiting", "detail": "forged", "seq": 10**18}
        await client.temporal.get_workflow_handle(parent.run_id).signal(
            Handler.CHILD_STATUS, forged
        )
        child = await client.get_run(child_id)
        [interaction] = await child.pending()
        await child.approve(interaction, responder="alice")

        await eventually(child_is("needs_attention"))
        assert failed_tasks(await chain_histories(client, parent.run_id)) == []
        await parent.cancel()


def test_an_agent_that_names_itself_as_a_subagent_is_refused() -> None:
    from durably import RegistrationError

    with pytest.raises(RegistrationError, match="names itself as a subagent"):
        Agent(
            id="loop", model=FunctionModel(lambda r: AssistantMessage(content="x"), name="l"),
            instructions="", subagents=["loop"],
        )  # fmt: skip


class TestThroughDurablyServe:
    @pytest.mark.parametrize("encoded", [False, True], ids=["slashes", "percent-encoded"])
    async def test_a_subagent_run_is_followed_and_answered_through_durably_serve(
        self, client: DurableClient, runtimes: Runtimes, encoded: bool
    ) -> None:
        """A subagent's run id holds `/` (`{parent}/{first run}/{call}`): `durably serve`
        answered it 404, raw or `%2F`-encoded."""
        shop = Shop()
        await runtimes.start(shop.registrations("refunder"))
        parent = await client.start_run("manager", "sort out order A")
        refunder_id = await child_of(client, parent.run_id, "tool:1:d0")

        async def child_waits() -> bool:
            snap = await parent.snapshot()
            return any(c.run_id == refunder_id and c.status == "waiting" for c in snap.children)

        await eventually(child_waits)
        [interaction] = await (await client.get_run(refunder_id)).pending()
        ident = refunder_id.replace("/", "%2F") if encoded else refunder_id
        body = json.dumps(
            {
                "interaction_id": interaction.id,
                "response": {"type": "tool-approval", "approved": True},
            }
        ).encode()

        async with LiveServer(client, port=0) as server:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(
                f"POST /runs/{ident}/respond HTTP/1.1\r\nHost: localhost:{server.port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode()
                + body
            )
            raw = await reader.read()
            writer.close()

        assert int(raw.split()[1]) == 200, raw[:300]
        result = await asyncio.wait_for(parent.result(), 30)
        assert result.output == "done: refunded A" and shop.refunded == ["A"]
