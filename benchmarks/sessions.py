"""A conversation of N submissions: durably's sessions against a raw-Temporal floor and peers.

Workload (issue 15): one conversation of N submissions. Submission k is the
user message ``fetch page k``; the model answers it with one tool call, the
tool returns the same 2,000 bytes as in ``compare.py`` (``page(k)``), and the
model then gives a short final answer. Each submission adds four messages,
and every model request of submission k must be sent the whole conversation
before it (the script checks the count: +4 messages per submission). The
model has zero latency, so a submission is pure orchestration.

Systems, each on its own task queue and worker in this process, against one
dev server started as ``compare.py`` starts it:

- **floor**: a plain Temporal workflow (unsandboxed, as durably's) taking each
  message by update and calling the floor's "model", "tool" and "final"
  activities (``_common.py``): every message is stored once, and the model is
  sent only the turn number (it never reads the conversation);
- **durably**: ``DurableClient.start_session`` and ``SessionHandle.submit``, each
  run awaited with ``run.result()``; an ``Agent`` with a ``FunctionModel`` and
  the ``safe`` tool of ``_impl_durably.py``;
- **openai-agents**: Temporal's OpenAI Agents integration, a workflow taking
  each message by update and calling ``Runner.run(agent, text, session=...)``
  with an in-memory ``agents`` ``Session`` kept in the workflow (the
  integration refuses ``SQLiteSession``; a workflow may do no I/O), the fake
  model and tool activity of ``_impl_openai_agents.py``'s kind;
- **pydantic-ai**: pydantic-ai's ``TemporalDurability``, a ``PydanticAIWorkflow``
  taking each message by update and calling
  ``agent.run(text, message_history=...)`` with the messages of the previous
  result (``all_messages()``), with a ``FunctionModel``.

The peers' workflows run unsandboxed too (``compare.py`` runs them in the
sandbox, which costs them time, not history).

Measured:

1. history added per submission k: the bytes (serialized ``History``) and
   events submission k adds across every workflow of the system (for
   durably: the session's history growth, read once the session has taken
   the run's messages, plus the run's own history); k=10 against k=N
   (durably's target: <= 1.1x);
2. latency per submission, from the submit to the answer, warm (one worker
   throughout) and cold (a fresh worker, i.e. a fresh ``DurableRuntime`` with
   an empty transcript cache, for each submission; the model activity then
   reads the conversation by the session's ``transcript`` query), and durably
   on one worker with its transcript cache emptied before each submission
   (that query without the new worker's replay): first, 10th,
   last and last/first (durably's target, warm: <= 1.2x);
3. total history against two floors: the raw-Temporal floor's history, and the
   sum of the JSON sizes of the conversation's messages, each once (aim <= 2x).

Submissions alternate between systems (submission k of each, then k+1);
each is sent once the previous one is settled (durably's session has taken
its run's messages), as after a user's pause. A peer whose workflow the
server terminates (the 50 MB history limit) or that stops answering is
reported as such at that submission.

Run ``python benchmarks/sessions.py`` (N=20), ``--submissions 50``, or
``--submissions 200`` for the full size.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from _common import (
    FLOOR_ACTIVITIES,
    INSTRUCTIONS,
    TOOL_NAME,
    activity_of,
    dev_server,
    event_type,
    fetch_chain,
    floor_final,
    floor_model,
    floor_tool,
    history_bytes,
    page,
    payload_bytes,
    print_footer,
    run_main,
)
from _impl_durably import fetch_page as durably_fetch_page
from compare import (
    DURABLY,
    FLOOR,
    OPENAI,
    PYDANTIC,
    _entry_size,
    _require,
    fmt_bytes,
    fmt_ratio,
    text_table,
)
from temporalio import workflow
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import ResetStickyTaskQueueRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from durably import (
    Agent,
    AgentRegistration,
    AssistantMessage,
    DurableClient,
    DurableRuntime,
    FunctionModel,
    ModelRequest,
    SessionHandle,
    ToolCall,
)
from durably._query_guard import ask
from durably._transcript.cache import TranscriptCache
from durably.contract import SEARCH_ATTRIBUTES, SessionHandler, TranscriptPage
from durably.messages import ToolResultMessage, UserMessage

SYSTEMS = (FLOOR, DURABLY, OPENAI, PYDANTIC)
LABELS = {
    FLOOR: "raw Temporal (floor)",
    DURABLY: "durably session",
    OPENAI: "OpenAI Agents + Session",
    PYDANTIC: "pydantic-ai + message_history",
}
MESSAGES_PER_SUBMISSION = 4
TARGET_GROWTH = 1.1  # bytes added by submission N against submission 10
TARGET_WARM = 1.2  # warm latency, last submission against the first
TARGET_FLOOR = 2.0  # total history against the floor (aim)
CACHE_EMPTIED = "durably, cache emptied"
AT = 10  # the early submission growth and latency are judged against


def user_text(k: int) -> str:
    return f"fetch page {k}"


def turn_of(text: str) -> int:
    return int(text.rsplit(" ", 1)[1])


def final_text(k: int) -> str:
    return f"page {k} fetched"


def sticky_reset(client: Client, workflow_id: str) -> Any:
    """Forget the sticky queue of a stopped worker, so a new worker takes the next task now."""
    return client.workflow_service.reset_sticky_task_queue(
        ResetStickyTaskQueueRequest(
            namespace=client.namespace, execution=WorkflowExecution(workflow_id=workflow_id)
        )
    )


async def chain_size(client: Client, workflow_id: str) -> tuple[int, int]:
    """(events, bytes) of every run of `workflow_id`'s continue-as-new chain."""
    chain = await fetch_chain(client, workflow_id)
    return sum(len(r) for r in chain), sum(history_bytes(r) for r in chain)


# -- the systems ---------------------------------------------------------------------


class System:
    """One conversation on one implementation: a worker, submissions, history sizes."""

    key: str

    def __init__(self, env: WorkflowEnvironment) -> None:
        self.env = env
        self.task_queue = f"sessions-{self.key}-{uuid.uuid4().hex[:6]}"
        # Messages in each final model request, in order (+4 per submission expected).
        self.seen: list[int] = []
        # Events in the main workflow's history once submission k settled.
        self.marks: dict[int, int] = {}

    async def open_worker(self) -> None:
        raise NotImplementedError

    async def close_worker(self) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        """Start the conversation (one workflow, or durably's session)."""
        raise NotImplementedError

    async def submit(self, k: int) -> str:
        """Submission k, up to its final answer."""
        raise NotImplementedError

    def expected(self, k: int) -> str:
        """Submission k's final answer."""
        return final_text(k)

    async def settle(self, k: int) -> None:
        """Wait until submission k has left all it will in history."""

    async def history(self, k: int) -> tuple[int, int]:
        """(events, bytes) of the conversation once submission k settled, over all its
        workflows; notes where submission k's events end in the main workflow's history."""
        raise NotImplementedError

    async def main_events(self) -> list[HistoryEvent]:
        """The events of the workflow holding the conversation (every run of its chain)."""
        return [e for run in await fetch_chain(self.env.client, self.sticky_ids()[0]) for e in run]

    async def own_events(self, k: int) -> list[tuple[str, list[HistoryEvent]]]:
        """Submission k's events, by workflow (k and k-1 must have been sampled)."""
        events = await self.main_events()
        return [("the conversation's workflow", events[self.marks[k - 1] : self.marks[k]])]

    async def end(self) -> None:
        raise NotImplementedError

    def sticky_ids(self) -> list[str]:
        raise NotImplementedError

    async def fresh_worker(self) -> None:
        """Stop the worker, make the server forget it, and start a new one."""
        await self.close_worker()
        for workflow_id in self.sticky_ids():
            await sticky_reset(self.env.client, workflow_id)
        await self.open_worker()


class UpdateSystem(System):
    """A plain workflow holding the conversation, each message an update."""

    workflow: Any

    def client(self) -> Client:
        return self.env.client

    def worker(self, client: Client) -> Worker:
        raise NotImplementedError

    async def open_worker(self) -> None:
        self._worker = self.worker(self.client())
        self._task = asyncio.create_task(self._worker.run())

    async def close_worker(self) -> None:
        await self._worker.shutdown()
        await self._task

    async def start(self) -> None:
        self.workflow_id = f"sessions-{self.key}-{uuid.uuid4().hex[:10]}"
        self.handle = await self._worker.client.start_workflow(
            self.workflow.run, id=self.workflow_id, task_queue=self.task_queue
        )

    async def submit(self, k: int) -> str:
        return str(await self.handle.execute_update(self.workflow.submit, user_text(k)))

    async def history(self, k: int) -> tuple[int, int]:
        size = await chain_size(self.env.client, self.workflow_id)
        self.marks[k] = size[0]
        return size

    async def end(self) -> None:
        with contextlib.suppress(Exception):
            await self.handle.signal(self.workflow.close)

    def sticky_ids(self) -> list[str]:
        return [self.workflow_id]


@workflow.defn(name="SessionsFloor", sandboxed=False)
class FloorSession:
    """The floor: each message stored once (the update's input, the activities' results)."""

    def __init__(self) -> None:
        self.closed = False

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: self.closed and workflow.all_handlers_finished())

    @workflow.update
    async def submit(self, text: str) -> str:
        turn = turn_of(text)
        call: dict[str, Any] = await workflow.execute_activity(
            floor_model, turn, start_to_close_timeout=timedelta(minutes=5)
        )
        await workflow.execute_activity(
            floor_tool, call, start_to_close_timeout=timedelta(minutes=10)
        )
        answer: dict[str, Any] = await workflow.execute_activity(
            floor_final, turn + 1, start_to_close_timeout=timedelta(minutes=5)
        )
        return str(answer["content"])

    @workflow.signal
    def close(self) -> None:
        self.closed = True


class FloorSystem(UpdateSystem):
    key = FLOOR
    workflow = FloorSession

    def expected(self, k: int) -> str:
        return f"done after {k} tool turns"  # `floor_final`'s answer

    def worker(self, client: Client) -> Worker:
        return Worker(
            client,
            task_queue=self.task_queue,
            workflows=[FloorSession],
            activities=FLOOR_ACTIVITIES,
        )


class DurablySystem(System):
    key = DURABLY

    def registration(self) -> AgentRegistration:
        seen = self.seen

        def respond(request: ModelRequest) -> AssistantMessage:
            last = request.messages[-1]
            if isinstance(last, ToolResultMessage):
                seen.append(len(request.messages))
                k = next(
                    turn_of(m.content)
                    for m in reversed(request.messages)
                    if isinstance(m, UserMessage)
                )
                return AssistantMessage(content=final_text(k))
            assert isinstance(last, UserMessage), last
            k = turn_of(last.content)
            call = ToolCall(id=f"call_{k}", name=TOOL_NAME, arguments={"turn": k})
            return AssistantMessage(tool_calls=(call,))

        agent = Agent(
            id="sessions-bench",
            model=FunctionModel(respond, name="sessions-bench"),
            instructions=INSTRUCTIONS,
            tools=[durably_fetch_page],
        )
        return AgentRegistration(agent, version="1", tool_recovery={TOOL_NAME: "safe"})

    async def open_worker(self) -> None:
        self.durable = DurableClient(self.env.client, task_queue=self.task_queue)
        self.runtime = await DurableRuntime.open(client=self.durable, agents=[self.registration()])
        await self.runtime.resume()

    async def close_worker(self) -> None:
        await self.runtime.close()

    def empty_cache(self) -> None:
        """A new, empty transcript cache on the running worker."""
        self.runtime.plugin.agent_activities.cache = TranscriptCache()

    async def start(self) -> None:
        self.session: SessionHandle = await self.durable.start_session("sessions-bench")
        self.run_sizes: list[tuple[int, int]] = []
        self.run_ids: list[str] = []

    async def submit(self, k: int) -> str:
        run = await self.session.submit(user_text(k))
        result = await run.result()
        self._last_run = run.run_id
        return result.output or ""

    async def settle(self, k: int) -> None:
        """The session has taken run k's messages; run k's history is read once."""
        deadline = time.monotonic() + 60
        while (await self.session.snapshot()).messages < MESSAGES_PER_SUBMISSION * k:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the session did not take submission {k}'s messages")
            await asyncio.sleep(0.02)
        self.run_sizes.append(await chain_size(self.env.client, self._last_run))
        self.run_ids.append(self._last_run)

    async def own_events(self, k: int) -> list[tuple[str, list[HistoryEvent]]]:
        (session,) = await super().own_events(k)
        run = [e for r in await fetch_chain(self.env.client, self.run_ids[k - 1]) for e in r]
        return [("the session", session[1]), (f"run {k}", run)]

    async def history(self, k: int) -> tuple[int, int]:
        events, size = await chain_size(self.env.client, self.session.session_id)
        self.marks[k] = events
        return (
            events + sum(e for e, _ in self.run_sizes),
            size + sum(b for _, b in self.run_sizes),
        )

    async def end(self) -> None:
        with contextlib.suppress(Exception):
            await self.session.close()

    def sticky_ids(self) -> list[str]:
        return [self.session.session_id]

    async def conversation_bytes(self) -> tuple[int, int]:
        """(messages, the sum of each message's JSON size), read from the session."""
        handle = self.env.client.get_workflow_handle(self.session.session_id)
        sizes: list[int] = []
        while True:
            page_ = await ask(
                handle, SessionHandler.TRANSCRIPT, len(sizes), None, result_type=TranscriptPage
            )
            sizes += [len(m.model_dump_json().encode()) for m in page_.messages]
            if len(sizes) >= page_.total or not page_.messages:
                return len(sizes), sum(sizes)


# The peers' workflows must be module-level classes; their packages are optional
# (the `bench` extra), so each is defined only when its packages import.
OPENAI_SEEN: list[int] = []
PYDANTIC_SEEN: list[int] = []

try:
    import json

    import _impl_openai_agents as oai
    from agents import Agent as OAgent
    from agents import Model, ModelProvider, ModelResponse, RunConfig, Runner, Usage
    from agents.memory import SessionABC
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )
    from temporalio.openai_agents import ModelActivityParameters, OpenAIAgentsPlugin
    from temporalio.openai_agents.workflow import activity_as_tool

    HAVE_OPENAI = True
except ImportError:
    HAVE_OPENAI = False

if HAVE_OPENAI:

    class FakeModel(Model):
        """Zero latency: a tool call for the last user message, then an answer."""

        async def get_response(
            self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
        ) -> ModelResponse:
            items: list[Any] = (
                [{"role": "user", "content": input}] if isinstance(input, str) else input
            )
            last = items[-1]
            output: Any
            if oai._field(last, "type") == "function_call_output":
                OPENAI_SEEN.append(len(items))
                k = next(
                    turn_of(str(oai._field(i, "content")))
                    for i in reversed(items)
                    if oai._field(i, "role") == "user"
                )
                text = ResponseOutputText(text=final_text(k), annotations=[], type="output_text")
                output = ResponseOutputMessage(
                    id=f"msg_{k}",
                    content=[text],
                    role="assistant",
                    status="completed",
                    type="message",
                )
            else:
                k = turn_of(str(oai._field(last, "content")))
                output = ResponseFunctionToolCall(
                    arguments=json.dumps({"turn": k}),
                    call_id=f"call_{k}",
                    name=TOOL_NAME,
                    type="function_call",
                    id=f"fc_{k}",
                    status="completed",
                )
            return ModelResponse(output=[output], usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("the benchmark does not stream")

    class FakeProvider(ModelProvider):
        def get_model(self, model_name: str | None) -> Model:
            return FakeModel()

    class MemorySession(SessionABC):
        """The conversation's items, kept in the workflow (a workflow may do no I/O)."""

        def __init__(self, session_id: str) -> None:
            self.session_id = session_id
            self.items: list[Any] = []

        async def get_items(self, limit: int | None = None) -> list[Any]:
            return list(self.items if limit is None else self.items[-limit:])

        async def add_items(self, items: list[Any]) -> None:
            self.items.extend(items)

        async def pop_item(self) -> Any:
            return self.items.pop() if self.items else None

        async def clear_session(self) -> None:
            self.items.clear()

    @workflow.defn(name="SessionsOpenAIAgents", sandboxed=False)
    class OpenAISession:
        """Each message an update: `Runner.run(agent, text, session=...)`."""

        def __init__(self) -> None:
            self.closed = False
            self.session = MemorySession(workflow.info().workflow_id)

        @workflow.run
        async def run(self) -> None:
            await workflow.wait_condition(lambda: self.closed and workflow.all_handlers_finished())

        @workflow.update
        async def submit(self, text: str) -> str:
            agent: OAgent[None] = OAgent(
                name="benchmark",
                instructions=INSTRUCTIONS,
                model=oai.MODEL_NAME,
                tools=[
                    activity_as_tool(oai.fetch_page, start_to_close_timeout=timedelta(minutes=10))
                ],
            )
            result = await Runner.run(
                agent, text, session=self.session, run_config=RunConfig(tracing_disabled=True)
            )
            return str(result.final_output)

        @workflow.signal
        def close(self) -> None:
            self.closed = True


class OpenAISystem(UpdateSystem):
    """Temporal's OpenAI Agents integration, the conversation in an in-workflow `Session`."""

    key = OPENAI

    def __init__(self, env: WorkflowEnvironment) -> None:
        super().__init__(env)
        self.workflow = OpenAISession
        self.seen = OPENAI_SEEN

    def client(self) -> Client:
        plugin = OpenAIAgentsPlugin(
            model_params=ModelActivityParameters(start_to_close_timeout=timedelta(minutes=5)),
            model_provider=FakeProvider(),
        )
        return Client(**{**self.env.client.config(), "plugins": [plugin]})

    def worker(self, client: Client) -> Worker:
        return Worker(
            client,
            task_queue=self.task_queue,
            workflows=[OpenAISession],
            activities=[oai.fetch_page],
        )


try:
    from pydantic_ai import Agent as PAgent
    from pydantic_ai.durable_exec.temporal import (
        PydanticAIPlugin,
        PydanticAIWorkflow,
        TemporalDurability,
    )
    from pydantic_ai.messages import (
        ModelMessage,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_ai.messages import ModelRequest as PRequest
    from pydantic_ai.messages import ModelResponse as PResponse
    from pydantic_ai.models.function import AgentInfo
    from pydantic_ai.models.function import FunctionModel as PFunctionModel
    from pydantic_ai.usage import UsageLimits
    from temporalio.workflow import ActivityConfig

    HAVE_PYDANTIC = True
except ImportError:
    HAVE_PYDANTIC = False

if HAVE_PYDANTIC:

    async def respond(messages: list[ModelMessage], info: AgentInfo) -> PResponse:
        """Zero latency: a tool call for the last user message, then an answer."""
        last = messages[-1]
        assert isinstance(last, PRequest)
        if any(isinstance(p, ToolReturnPart) for p in last.parts):
            PYDANTIC_SEEN.append(len(messages))
            k = next(
                turn_of(str(p.content))
                for m in reversed(messages)
                if isinstance(m, PRequest)
                for p in m.parts
                if isinstance(p, UserPromptPart)
            )
            return PResponse(parts=[TextPart(final_text(k))])
        k = next(turn_of(str(p.content)) for p in last.parts if isinstance(p, UserPromptPart))
        call = ToolCallPart(tool_name=TOOL_NAME, args={"turn": k}, tool_call_id=f"call_{k}")
        return PResponse(parts=[call])

    pagent: PAgent[None, str] = PAgent(
        PFunctionModel(respond, model_name="sessions-function"),
        name="sessions_benchmark",
        instructions=INSTRUCTIONS,
        capabilities=[
            TemporalDurability(
                activity_config=ActivityConfig(start_to_close_timeout=timedelta(minutes=10)),
                model_activity_config=ActivityConfig(start_to_close_timeout=timedelta(minutes=5)),
            )
        ],
    )

    @pagent.tool_plain(name=TOOL_NAME)
    async def pydantic_fetch_page(turn: int) -> str:
        """Fetch the page for a turn (2,000 bytes)."""
        return page(turn)

    @workflow.defn(name="SessionsPydanticAI", sandboxed=False)
    class PydanticSession(PydanticAIWorkflow):
        """Each message an update: `agent.run(text, message_history=...)`."""

        __pydantic_ai_agents__ = (pagent,)

        def __init__(self) -> None:
            self.closed = False
            self.messages: list[ModelMessage] = []

        @workflow.run
        async def run(self) -> None:
            await workflow.wait_condition(lambda: self.closed and workflow.all_handlers_finished())

        @workflow.update
        async def submit(self, text: str) -> str:
            result = await pagent.run(
                text,
                message_history=self.messages,
                usage_limits=UsageLimits(request_limit=None),
            )
            self.messages = result.all_messages()
            return result.output

        @workflow.signal
        def close(self) -> None:
            self.closed = True


class PydanticSystem(UpdateSystem):
    """pydantic-ai's Temporal durability, each run given the previous run's messages."""

    key = PYDANTIC

    def __init__(self, env: WorkflowEnvironment) -> None:
        super().__init__(env)
        self.workflow = PydanticSession
        self.seen = PYDANTIC_SEEN

    def client(self) -> Client:
        return Client(**{**self.env.client.config(), "plugins": [PydanticAIPlugin()]})

    def worker(self, client: Client) -> Worker:
        return Worker(client, task_queue=self.task_queue, workflows=[PydanticSession])


def make_system(key: str, env: WorkflowEnvironment) -> System:
    if key == FLOOR:
        return FloorSystem(env)
    if key == DURABLY:
        return DurablySystem(env)
    if key == OPENAI:
        return OpenAISystem(env)
    return PydanticSystem(env)


# -- the measurement ---------------------------------------------------------------------


@dataclass
class Conversation:
    """One system's conversation: latencies, history samples, how it ended."""

    key: str
    mode: str  # warm | cold
    seconds: dict[int, float] = field(default_factory=dict)
    # (events, bytes) of the conversation's history once submission k settled (0: started).
    sizes: dict[int, tuple[int, int]] = field(default_factory=dict)
    status: str = "ok"
    seen: list[int] = field(default_factory=list)
    message_floor: tuple[int, int] | None = None  # (messages, bytes), durably only
    end_size: tuple[int, int] | None = None  # (events, bytes) when it failed

    @property
    def done(self) -> int:
        return max(self.seconds, default=0)

    def added(self, k: int) -> tuple[int, int] | None:
        if k in self.sizes and k - 1 in self.sizes:
            (e1, b1), (e0, b0) = self.sizes[k], self.sizes[k - 1]
            return e1 - e0, b1 - b0
        return None

    def seen_ok(self) -> bool:
        seen = self.seen[: self.done]  # not a failed submission's request
        steps = [b - a for a, b in itertools.pairwise(seen)]
        return len(seen) == self.done and all(s == MESSAGES_PER_SUBMISSION for s in steps)


def sample_points(n: int) -> set[int]:
    """Submissions after which the histories are read: around 1, 10, every 25th and N."""
    points = {0, 1, 2, AT - 1, AT, n - 1, n}
    points |= {m + d for m in range(25, n + 1, 25) for d in (-1, 0)}
    return {p for p in points if 0 <= p <= n}


async def one_submission(
    system: System, conv: Conversation, k: int, limit_s: float, sample: bool
) -> bool:
    """Submission k, timed; then settled and (if `sample`) the history read. False: it failed."""
    started = time.perf_counter()
    try:
        answer = await asyncio.wait_for(system.submit(k), limit_s)
    except TimeoutError:
        conv.status = f"no answer within {limit_s:.0f} s at submission {k}"
        return False
    except Exception as err:  # a peer's workflow terminated by the server, say
        conv.status = f"failed at submission {k}: {await describe_end(system, err)}"
        return False
    conv.seconds[k] = time.perf_counter() - started
    if answer != system.expected(k):
        conv.status = f"unexpected answer at submission {k}: {answer!r}"
        return False
    await system.settle(k)
    if sample:
        conv.sizes[k] = await system.history(k)
    return True


async def describe_end(system: System, err: BaseException) -> str:
    with contextlib.suppress(Exception):
        for workflow_id in system.sticky_ids():
            handle = system.env.client.get_workflow_handle(workflow_id)
            if (await handle.describe()).status == WorkflowExecutionStatus.TERMINATED:
                last = (await fetch_chain(system.env.client, workflow_id))[-1][-1]
                reason = last.workflow_execution_terminated_event_attributes.reason
                return f"the server terminated the workflow ({reason!r})"
    return f"{type(err).__name__}: {str(err)[:160]}"


async def warm(
    systems: Sequence[System], n: int, limit_s: float, log: Callable[[str], None]
) -> dict[str, Conversation]:
    """One conversation per system, submissions alternating, one worker each throughout."""
    convs = {s.key: Conversation(s.key, "warm") for s in systems}
    points = sample_points(n)
    for system in systems:
        await system.start()
        convs[system.key].sizes[0] = await system.history(0)
    live = list(systems)
    for k in range(1, n + 1):
        for system in [*live[k % len(live) :], *live[: k % len(live)]] if live else []:
            conv = convs[system.key]
            if not await one_submission(system, conv, k, limit_s, k in points):
                log(f"  {system.key}: {conv.status}")
                live.remove(system)
                with contextlib.suppress(Exception):
                    conv.end_size = await system.history(k)
        if k in points and live:
            parts = [
                f"{s.key} {convs[s.key].seconds[k] * 1000:.0f} ms"
                + (
                    f" +{fmt_bytes(added[1])}"
                    if (added := convs[s.key].added(k)) is not None
                    else ""
                )
                for s in live
            ]
            log(f"  warm {k:>4}: " + ", ".join(parts))
    for system in systems:
        convs[system.key].seen = list(system.seen)
        if isinstance(system, DurablySystem) and system in live:
            convs[system.key].message_floor = await system.conversation_bytes()
        await system.end()
    return convs


async def cold(
    system: System, n: int, limit_s: float, log: Callable[[str], None], *, cache_only: bool = False
) -> Conversation:
    """One conversation, each submission on a fresh worker (nothing cached); `cache_only`:
    on the same worker, with durably's transcript cache emptied before each submission."""
    mode = "cache emptied" if cache_only else "cold"
    conv = Conversation(system.key, mode)
    system.seen.clear()
    await system.start()
    for k in range(1, n + 1):
        if cache_only:
            assert isinstance(system, DurablySystem)
            system.empty_cache()
        elif k > 1:
            await system.fresh_worker()
        if not await one_submission(system, conv, k, limit_s, sample=False):
            log(f"  {system.key} {mode}: {conv.status}")
            break
        if k in sample_points(n):
            log(f"  {mode} {system.key} {k:>4}: {conv.seconds[k] * 1000:.0f} ms")
    conv.seen = list(system.seen)
    await system.end()
    return conv


async def warm_up(system: System) -> None:
    """Two submissions of a throwaway conversation: imports, connections, first tasks."""
    await system.start()
    for k in (1, 2):
        await asyncio.wait_for(system.submit(k), 120)
        await system.settle(k)
    await system.end()
    system.seen.clear()


# -- the report --------------------------------------------------------------------------


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


def growth_rows(convs: Sequence[Conversation], n: int) -> tuple[list[str], list[list[str]]]:
    sampled = sample_points(n)
    points = sorted(p for p in sampled if p >= 1 and p - 1 in sampled)
    header = ["system", *(f"k={p}" for p in points), f"k={n} / k={AT}", "ended"]
    rows = []
    for c in convs:
        cells = []
        for p in points:
            added = c.added(p)
            cells.append("-" if added is None else f"{fmt_bytes(added[1])} ({added[0]} ev)")
        last, early = c.added(n), c.added(AT)
        ratio = fmt_ratio(last[1] / early[1]) if last and early else "-"
        rows.append([LABELS[c.key], *cells, ratio, c.status])
    return header, rows


def median_of(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def latency_rows(convs: Sequence[Conversation], n: int) -> tuple[list[str], list[list[str]]]:
    w = max(5, n // 10)
    header = [
        "system",
        "mode",
        "first",
        f"{AT}th",
        "last",
        "last/first",
        f"median 2-{w + 1}",
        f"median last {w}",
        "ratio of medians",
        "median all",
    ]
    rows = []
    for c in convs:
        s = c.seconds
        first, tenth, last = s.get(1), s.get(AT), s.get(c.done)
        ks = sorted(s)
        early = median_of([s[k] for k in ks if 2 <= k <= w + 1])
        late = median_of([s[k] for k in ks[-w:]]) if len(ks) > w + 1 else None
        rows.append(
            [
                LABELS[c.key],
                c.mode + ("" if c.done == n else f" (to {c.done})"),
                ms(first),
                ms(tenth),
                ms(last),
                fmt_ratio(last / first if last and first else None),
                ms(early),
                ms(late),
                fmt_ratio(late / early if late and early else None),
                ms(median_of(list(s.values()))),
            ]
        )
    return header, rows


def total_rows(
    convs: dict[str, Conversation], n: int
) -> tuple[list[str], list[list[str]], list[str]]:
    floor = convs.get(FLOOR)
    floor_size = floor.sizes.get(n) if floor else None
    durably = convs.get(DURABLY)
    messages = durably.message_floor if durably else None
    header = ["system", "events", "bytes", "x raw-Temporal floor", "x messages once"]
    rows = []
    for c in convs.values():
        whole = c.done == n
        size = c.sizes.get(n) if whole else c.end_size
        if size is None:
            continue
        rows.append(
            [
                LABELS[c.key] + ("" if whole else f" (when it ended, at submission {c.done + 1})"),
                str(size[0]),
                fmt_bytes(size[1]),
                fmt_ratio(size[1] / floor_size[1]) if floor_size and whole else "-",
                fmt_ratio(size[1] / messages[1]) if messages and whole else "-",
            ]
        )
    notes = []
    if messages:
        notes.append(
            f"messages once: {messages[0]} messages, {fmt_bytes(messages[1])} "
            f"({messages[1]} B, each message's JSON as the session holds it)"
        )
        once = messages[1] / n
        for c in (floor, durably):
            added = c.added(n) if c is not None else None
            if c is None or added is None:
                continue
            copies = 1 if c.key == FLOOR else 2
            notes.append(
                f"{LABELS[c.key]}, submission {n}: {added[1]} B = its messages x{copies} "
                f"({copies * once:.0f} B) + {added[1] - copies * once:.0f} B besides"
            )
    return header, rows, notes


def target_lines(warm_: dict[str, Conversation], cold_: dict[str, Conversation], n: int) -> list:
    lines = []
    d = warm_.get(DURABLY)
    if d is None:
        return lines
    last, early = d.added(n), d.added(AT)
    if last and early:
        r = last[1] / early[1]
        lines.append(
            f"durably: bytes added by submission {n} / submission {AT}: {r:.3f}x "
            f"({last[1]} B / {early[1]} B) -> {'met' if r <= TARGET_GROWTH else 'MISSED'} "
            f"(target <= {TARGET_GROWTH}x)"
        )
    first, final = d.seconds.get(1), d.seconds.get(n)
    if first and final:
        r = final / first
        lines.append(
            f"durably warm latency, submission {n} / submission 1: {r:.2f}x "
            f"({ms(final)} / {ms(first)}) -> {'met' if r <= TARGET_WARM else 'MISSED'} "
            f"(target <= {TARGET_WARM}x)"
        )
    c = cold_.get(DURABLY)
    if c and c.seconds.get(1) and c.seconds.get(n):
        lines.append(
            f"durably cold latency, submission {n} / submission 1: "
            f"{c.seconds[n] / c.seconds[1]:.2f}x ({ms(c.seconds[n])} / {ms(c.seconds[1])})"
        )
    e = cold_.get(CACHE_EMPTIED)
    if e and e.seconds.get(1) and e.seconds.get(n):
        lines.append(
            f"durably, transcript cache emptied (same worker), submission {n} / submission 1: "
            f"{e.seconds[n] / e.seconds[1]:.2f}x ({ms(e.seconds[n])} / {ms(e.seconds[1])})"
        )
    total = d.sizes.get(n)
    floor = warm_.get(FLOOR)
    if total and floor and floor.sizes.get(n):
        r = total[1] / floor.sizes[n][1]
        lines.append(
            f"durably total history / raw-Temporal floor: {r:.2f}x -> "
            f"{'met' if r <= TARGET_FLOOR else 'MISSED'} (aim <= {TARGET_FLOOR}x)"
        )
    if total and d.message_floor:
        r = total[1] / d.message_floor[1]
        lines.append(
            f"durably total history / the messages once: {r:.2f}x -> "
            f"{'met' if r <= TARGET_FLOOR else 'MISSED'} (aim <= {TARGET_FLOOR}x)"
        )
    for conv in [*warm_.values(), *cold_.values()]:
        if conv.key != FLOOR and conv.done and not conv.seen_ok():
            lines.append(
                f"CHECK FAILED: {conv.key} {conv.mode}: the model was not sent +4 messages per "
                f"submission ({conv.seen[:3]} ... {conv.seen[-3:]})"
            )
    checked = [
        f"{c.key} {c.mode}"
        for c in [*warm_.values(), *cold_.values()]
        if c.key != FLOOR and c.seen_ok()
    ]
    lines.append(
        "the model's last request of each submission held the whole conversation "
        f"(+4 messages per submission): {', '.join(checked) or 'none'} (the floor's model "
        "is sent only the turn number)"
    )
    return lines


async def breakdown(system: System, k: int) -> list[str]:
    """Submission k's history by workflow, event type and activity: count, bytes, payloads."""
    lines = []
    for where, events in await system.own_events(k):
        scheduled: dict[int, str] = {}  # a submission's activities are scheduled within it
        rows: dict[str, list[int]] = {}
        for e in events:
            name = activity_of(e, scheduled)
            row = rows.setdefault(event_type(e) + (f" [{name}]" if name else ""), [0, 0, 0])
            row[0] += 1
            row[1] += _entry_size(e)
            row[2] += payload_bytes(e)
        total = sum(r[1] for r in rows.values())
        lines.append(
            f"{LABELS[system.key]}, submission {k}, {where}: {len(events)} events, {total} B"
        )
        table = [
            [name, str(c), str(b), str(p)]
            for name, (c, b, p) in sorted(rows.items(), key=lambda x: -x[1][1])
        ]
        lines.append(text_table(["  event [activity]", "events", "bytes", "payload bytes"], table))
    return lines


# -- main --------------------------------------------------------------------------------


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--submissions", type=int, default=20, help="N, submissions per conversation (20)"
    )
    parser.add_argument(
        "--only", nargs="+", choices=SYSTEMS, help="these systems only (default: all four)"
    )
    parser.add_argument(
        "--cold",
        nargs="*",
        choices=SYSTEMS,
        help="systems also measured cold, a fresh worker per submission (default: floor durably)",
    )
    parser.add_argument(
        "--cache-emptied",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also durably on one worker with its transcript cache emptied per submission",
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="print submission N's history of the floor and durably by event type",
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per submission (120)")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    n = args.submissions
    if n < AT:
        parser.error(f"--submissions must be at least {AT}")
    keys = [k for k in SYSTEMS if k in (args.only or SYSTEMS)]
    cold_keys = [k for k in (args.cold if args.cold is not None else [FLOOR, DURABLY]) if k in keys]
    if OPENAI in keys:
        _require("temporalio.openai_agents", "temporalio-openai-agents openai-agents")
    if PYDANTIC in keys:
        _require("pydantic_ai", "'pydantic-ai-slim[temporal]'")

    def log(line: str) -> None:
        print(line, flush=True)

    load = [("start", os.getloadavg())]
    log(f"load average at start: {' '.join(f'{x:.2f}' for x in load[0][1])}; N={n}")
    began = time.perf_counter()
    async with dev_server(SEARCH_ATTRIBUTES) as env:
        systems = [make_system(k, env) for k in keys]
        opened: list[System] = []
        try:
            for s in systems:
                await s.open_worker()
                opened.append(s)
            for s in systems:
                await warm_up(s)
            log("warm: one worker per system throughout")
            warm_ = await warm(systems, n, args.timeout, log)
            details: list[str] = []
            for s in systems:
                if args.breakdown and s.key in (FLOOR, DURABLY) and warm_[s.key].done == n:
                    details += await breakdown(s, n)
            cold_: dict[str, Conversation] = {}
            for s in systems:
                if s.key in cold_keys:
                    log(f"cold: {s.key}, a fresh worker per submission")
                    cold_[s.key] = await cold(s, n, args.timeout, log)
                if s.key == DURABLY and args.cache_emptied:
                    log("durably: one worker, its transcript cache emptied before each submission")
                    cold_[CACHE_EMPTIED] = await cold(s, n, args.timeout, log, cache_only=True)
        finally:
            for s in opened:
                await s.close_worker()
    load.append(("end", os.getloadavg()))
    elapsed = time.perf_counter() - began

    if details:
        print()
        print("\n".join(details))
    print(f"\nhistory added per submission k (bytes, events), N={n}")
    print(text_table(*growth_rows(list(warm_.values()), n)))
    print(f"\nlatency per submission (submit to answer), N={n}")
    print(text_table(*latency_rows([*warm_.values(), *cold_.values()], n)))
    header, rows, notes = total_rows(warm_, n)
    print(f"\ntotal history of the conversation, N={n}")
    print(text_table(header, rows))
    for line in notes:
        print(line)
    print()
    for line in target_lines(warm_, cold_, n):
        print(line)
    print_footer(load, elapsed, "sessions.py", argv)


if __name__ == "__main__":
    run_main(main())
