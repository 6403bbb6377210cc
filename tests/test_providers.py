"""The OpenAI-compatible and Anthropic adapters, through the real SDKs over a real socket.

The fakes in `fake_providers.py` speak each provider's wire format; durable
runs use the session dev server from conftest.py. Unit tests at the bottom
call the conversion functions and `classify_error` directly.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest
from pydantic import BaseModel

from durably import (
    Agent,
    AgentRegistration,
    AnthropicModel,
    DurableClient,
    ModelRequest,
    ModelRetry,
    OpenAIChatModel,
    RunFailedError,
    RunStatus,
    ScriptedModel,
    ToolContext,
    ToolError,
    Usage,
    tool,
)
from durably.messages import (
    AssistantMessage,
    ModelResponse,
    ToolCall,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
)
from durably.models import ModelErrorVerdict, ModelResponseError, classify_model_error
from durably.models._anthropic import (
    anthropic_messages,
    anthropic_tools,
    from_anthropic_message,
)
from durably.models._openai import (
    from_openai_completion,
    openai_messages,
    openai_tools,
)
from durably.models._provider import retry_after
from durably.tools import question_tool

from .conftest import Runtimes, wait_for_status
from .fake_providers import FakeAnthropic, FakeOpenAI, FakeProvider, Reply, SeenResult

# The 500 waits this long. The dev server does not retry sooner than about a
# second whatever the policy says, so a shorter delay could not be told apart.
INITIAL_DELAY_MS = 1000
MODEL_RETRY = ModelRetry(max_attempts=4, initial_delay_ms=INITIAL_DELAY_MS, max_delay_ms=1000)
PROVIDERS = {"openai": FakeOpenAI, "anthropic": FakeAnthropic}


@pytest.fixture(params=sorted(PROVIDERS))
def fake(request: pytest.FixtureRequest) -> Iterator[FakeProvider]:
    with PROVIDERS[request.param]() as server:
        yield server


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def fake_anthropic() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as server:
        yield server


class OrderArgs(BaseModel):
    order_id: str


class Order(BaseModel):
    order_id: str
    status: str


def orders_agent(
    model: Any, looked_up: list[str], *, model_retry: ModelRetry | None = MODEL_RETRY
) -> AgentRegistration:
    """An agent with one tool that records every order it looks up."""

    @tool
    async def lookup_order(args: OrderArgs, ctx: ToolContext) -> Order:
        """Look up an order by id."""
        looked_up.append(args.order_id)
        if args.order_id == "missing":
            raise ToolError("no such order")
        return Order(order_id=args.order_id, status="shipped")

    agent = Agent(
        id="orders",
        model=model,
        instructions="Answer questions about orders.",
        tools=[lookup_order],
    )
    return AgentRegistration(agent, version="1", model_retry=model_retry)


def lookup(call_id: str, order_id: str) -> tuple[str, str, dict[str, str]]:
    """A scripted `lookup_order` call."""
    return (call_id, "lookup_order", {"order_id": order_id})


def anthropic_key(headers: Mapping[str, str]) -> str | None:
    """The key an Anthropic request carried (`x-api-key`, or a bearer token in newer SDKs)."""
    bearer = headers.get("authorization", "")
    return headers.get("x-api-key") or (bearer[7:] if bearer.startswith("Bearer ") else None)


async def run_to_end(client: DurableClient, text: str = "Where is order A-1?") -> Any:
    run = await client.start_run("orders", text)
    return run, await run.result()


# -- durable runs ------------------------------------------------------------------


class TestOpenAIRuns:
    async def test_a_tool_calling_run_completes_and_sends_the_result_as_a_tool_message(
        self, client: DurableClient, runtimes: Runtimes, fake_openai: FakeOpenAI
    ) -> None:
        """The tool result goes back as `role: tool` with the call's `tool_call_id`."""
        fake_openai.script(
            fake_openai.tool_calls(
                ("call_1", "lookup_order", {"order_id": "A-1"}), usage=(100, 20)
            ),
            fake_openai.text("Order A-1 has shipped.", usage=(150, 10)),
        )
        looked_up: list[str] = []
        await runtimes.start([orders_agent(fake_openai.model(), looked_up)])

        _, result = await run_to_end(client)

        assert result.output == "Order A-1 has shipped."
        assert looked_up == ["A-1"]
        first, second = fake_openai.received
        assert first.path == second.path == "/v1/chat/completions"
        assert first.headers["authorization"] == "Bearer test-key"
        assert first.body["model"] == "gpt-4o-mini"
        assert first.body["messages"] == [
            {"role": "system", "content": "Answer questions about orders."},
            {"role": "user", "content": "Where is order A-1?"},
        ]
        assert first.body["tools"][0]["type"] == "function"
        assert first.body["tools"][0]["function"]["name"] == "lookup_order"
        assert first.body["tools"][0]["function"]["parameters"]["required"] == ["order_id"]
        assert second.body["messages"][2:] == [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "lookup_order", "arguments": '{"order_id": "A-1"}'},
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "call_1",
                "content": '{"order_id":"A-1","status":"shipped"}',
            },
        ]

    async def test_usage_is_summed_over_the_runs_requests(
        self, client: DurableClient, runtimes: Runtimes, fake_openai: FakeOpenAI
    ) -> None:
        fake_openai.script(
            fake_openai.tool_calls(
                ("call_1", "lookup_order", {"order_id": "A-1"}), usage=(100, 20)
            ),
            fake_openai.text("Shipped.", usage=(150, 10)),
        )
        await runtimes.start([orders_agent(fake_openai.model(), [])])

        run, result = await run_to_end(client)

        expected = Usage(requests=2, input_tokens=250, output_tokens=30, tool_calls=1)
        assert result.usage == expected
        assert (await run.snapshot()).usage == expected


class TestAnthropicRuns:
    async def test_a_tool_calling_run_completes_and_sends_the_result_as_a_tool_result_block(
        self, client: DurableClient, runtimes: Runtimes, fake_anthropic: FakeAnthropic
    ) -> None:
        """The tool result goes back in a user turn as `tool_result` with `tool_use_id`."""
        fake_anthropic.script(
            fake_anthropic.tool_calls(lookup("toolu_1", "A-1"), usage=(80, 30)),
            fake_anthropic.text("Order A-1 has shipped.", usage=(120, 15)),
        )
        looked_up: list[str] = []
        await runtimes.start([orders_agent(fake_anthropic.model(), looked_up)])

        run, result = await run_to_end(client)

        assert result.output == "Order A-1 has shipped."
        assert looked_up == ["A-1"]
        assert result.usage == Usage(requests=2, input_tokens=200, output_tokens=45, tool_calls=1)
        assert (await run.snapshot()).usage == result.usage
        first, second = fake_anthropic.received
        assert first.path == second.path == "/v1/messages"
        assert anthropic_key(first.headers) == "test-key"
        assert first.body["system"] == "Answer questions about orders."
        assert first.body["max_tokens"] == 4096
        assert first.body["messages"] == [
            {"role": "user", "content": [{"type": "text", "text": "Where is order A-1?"}]}
        ]
        assert first.body["tools"][0]["name"] == "lookup_order"
        assert first.body["tools"][0]["input_schema"]["required"] == ["order_id"]
        assert second.body["messages"][1:] == [
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "lookup_order",
                        "input": {"order_id": "A-1"},
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": '{"order_id":"A-1","status":"shipped"}',
                    }
                ],
            },
        ]

    async def test_a_classifier_given_to_the_model_decides_what_the_run_retries(
        self, client: DurableClient, runtimes: Runtimes, fake_anthropic: FakeAnthropic
    ) -> None:
        """Every error is retried by default; this model's own classifier stops a 400."""
        fake_anthropic.script(fake_anthropic.error(400), fake_anthropic.text("Done."))
        seen: list[BaseException] = []

        def hopeless_if_bad_request(error: BaseException) -> ModelErrorVerdict:
            seen.append(error)
            return ModelErrorVerdict(retryable=type(error).__name__ != "BadRequestError")

        model = fake_anthropic.model(classify_error=hopeless_if_bad_request)
        await runtimes.start([orders_agent(model, [])])
        run = await client.start_run("orders", "Where is order A-1?")

        with pytest.raises(RunFailedError, match="BadRequestError"):
            await run.result()

        assert len(fake_anthropic.received) == 1
        assert [type(e).__name__ for e in seen] == ["BadRequestError"]


class TestBothProviders:
    async def test_every_tool_call_in_one_response_runs_and_every_result_goes_back(
        self, client: DurableClient, runtimes: Runtimes, fake: FakeProvider
    ) -> None:
        """Results come back in call order; a ToolError is marked as an error."""
        fake.script(
            fake.tool_calls(
                ("call_a", "lookup_order", {"order_id": "A-1"}),
                ("call_b", "lookup_order", {"order_id": "missing"}),
                ("call_c", "lookup_order", {"order_id": "C-3"}),
            ),
            fake.text("A-1 and C-3 shipped; the other order does not exist."),
        )
        looked_up: list[str] = []
        await runtimes.start([orders_agent(fake.model(), looked_up)])

        _, result = await run_to_end(client)

        assert result.output == "A-1 and C-3 shipped; the other order does not exist."
        assert looked_up == ["A-1", "missing", "C-3"]
        assert len(fake.received) == 2
        assert fake.tool_results(fake.received[1].body) == [
            SeenResult("call_a", '{"order_id":"A-1","status":"shipped"}', is_error=False),
            SeenResult(
                "call_b",
                "Error: no such order" if fake.name == "openai" else "no such order",
                is_error=True,
            ),
            SeenResult("call_c", '{"order_id":"C-3","status":"shipped"}', is_error=False),
        ]

    async def test_a_500_and_a_429_with_retry_after_are_retried_by_the_run(
        self, client: DurableClient, runtimes: Runtimes, fake: FakeProvider
    ) -> None:
        """Under model_retry the run schedules each attempt and waits in a durable timer:
        the 500 waits the initial delay; the 429 waits its Retry-After, past max_delay."""
        fake.script(
            fake.error(500, "upstream hiccup"),
            fake.error(429, "slow down", {"retry-after": "2"}),
            fake.text("Done."),
        )
        await runtimes.start([orders_agent(fake.model(), [])])

        _, result = await run_to_end(client)

        assert result.output == "Done."
        assert len(fake.received) == 3  # the SDK itself never retried
        after_500, after_429 = fake.gaps()
        assert INITIAL_DELAY_MS / 1000 * 0.95 <= after_500 < 1.8
        assert after_429 >= 1.95  # the policy's backoff alone is capped at max_delay, 1 s
        # The failed attempts count as requests (the provider answered none of them).
        assert result.usage == Usage(requests=3, input_tokens=10, output_tokens=5)

    async def test_a_400_is_retried_under_model_retry_like_any_error(
        self, client: DurableClient, runtimes: Runtimes, fake: FakeProvider
    ) -> None:
        """The seed retries permanent provider errors too: model_retry decides how often."""
        fake.script(fake.error(400, "messages: unknown field"), fake.text("Done."))
        await runtimes.start([orders_agent(fake.model(), [])])

        _, result = await run_to_end(client)

        assert result.output == "Done."
        assert len(fake.received) == 2

    async def test_without_model_retry_a_400_fails_the_run_at_once(
        self, client: DurableClient, runtimes: Runtimes, fake: FakeProvider
    ) -> None:
        fake.script(fake.error(400, "messages: unknown field"))
        await runtimes.start([orders_agent(fake.model(), [], model_retry=None)])
        run = await client.start_run("orders", "Where is order A-1?")

        with pytest.raises(RunFailedError, match="BadRequestError"):
            await run.result()

        assert len(fake.received) == 1
        assert "messages: unknown field" in ((await run.snapshot()).error or "")


class TestSessionsOnTheWire:
    async def test_an_interrupted_runs_transcript_is_accepted_by_the_provider(
        self, client: DurableClient, runtimes: Runtimes, fake: FakeProvider
    ) -> None:
        """A run interrupted while its call waits leaves that call without a result; the
        session gives it one, so the next request is one the provider accepts (the fake,
        like the provider, refuses a call without a result)."""
        agent = Agent(
            id="asks",
            model=fake.model(),
            instructions="Help with orders.",
            tools=[question_tool(name="ask_user", description="Ask the customer.")],
        )
        await runtimes.start([AgentRegistration(agent, version="1")])
        fake.script(
            fake.tool_calls(("q1", "ask_user", {"question": "Which order?"})),
            fake.text("No problem."),
        )
        session = await client.start_session("asks")
        first = await session.submit("Where is my order?")
        await wait_for_status(first, RunStatus.WAITING)

        second = await session.submit("Never mind.", if_busy="interrupt")

        assert (await second.result()).output == "No problem."
        sent = fake.received[-1].body
        assert fake.unanswered_calls(sent) == []
        assert "not run: run" in json.dumps(sent)
        asked = next(i for i, m in enumerate(sent["messages"]) if m["role"] == "assistant")
        dangling = {**sent, "messages": sent["messages"][: asked + 1]}  # no result after it
        assert fake.unanswered_calls(dangling) == ["q1"]


class TestUnreadableAnswers:
    """An answer the adapter cannot read is an error of the completion attempt: retried
    under model_retry like any provider error, final without it."""

    async def test_a_tool_call_whose_arguments_are_not_json_is_asked_again_under_model_retry(
        self, client: DurableClient, runtimes: Runtimes, fake: FakeProvider
    ) -> None:
        """No call of the unreadable answer runs, not even its good one; the model is asked
        the same question again and its next answer is used."""
        fake.script(
            fake.tool_calls(lookup("call_1", "A-1"), ("call_2", "lookup_order", BROKEN_JSON)),
            fake.tool_calls(lookup("call_1", "A-1")),
            fake.text("Order A-1 has shipped."),
        )
        looked_up: list[str] = []
        await runtimes.start([orders_agent(fake.model(), looked_up)])

        run, result = await run_to_end(client)

        assert result.output == "Order A-1 has shipped."
        assert looked_up == ["A-1"]
        first, again, last = fake.received
        assert again.body == first.body
        assert "call_2" not in json.dumps(last.body)
        assert [r.call_id for r in fake.tool_results(last.body)] == ["call_1"]
        assert (await run.snapshot()).turns == 2

    async def test_an_empty_completion_is_asked_again_under_model_retry(
        self, client: DurableClient, runtimes: Runtimes, fake: FakeProvider
    ) -> None:
        """No text and no tool calls is not a final answer of nothing."""
        fake.script(empty_completion(fake), fake.text("Order A-1 has shipped."))
        await runtimes.start([orders_agent(fake.model(), [])])

        _, result = await run_to_end(client)

        assert result.output == "Order A-1 has shipped."
        first, again = fake.received
        assert again.body == first.body

    async def test_without_model_retry_unreadable_arguments_fail_the_run_saying_why(
        self, client: DurableClient, runtimes: Runtimes, fake: FakeProvider
    ) -> None:
        """The message names the call, quotes the text and says what happens next; retry()
        asks the model again."""
        fake.script(fake.tool_calls(("call_1", "lookup_order", BROKEN_JSON)))
        looked_up: list[str] = []
        await runtimes.start([orders_agent(fake.model(), looked_up, model_retry=None)])
        run = await client.start_run("orders", "Where is order A-1?")

        with pytest.raises(RunFailedError, match="ModelResponseError"):
            await run.result()

        snap = await run.snapshot()
        assert snap.status == RunStatus.FAILED
        assert len(fake.received) == 1
        assert looked_up == []
        error = snap.error or ""
        assert "tool call 'call_1' to 'lookup_order'" in error
        assert "are not valid JSON" in error
        assert repr(BROKEN_JSON) in error
        assert "without model_retry the run fails, and retry() asks again" in error

        fake.script(fake.tool_calls(lookup("call_1", "A-1")), fake.text("Shipped."))
        await run.retry()
        assert (await run.result()).output == "Shipped."
        assert looked_up == ["A-1"]

    async def test_without_model_retry_an_empty_completion_fails_the_run(
        self, client: DurableClient, runtimes: Runtimes, fake: FakeProvider
    ) -> None:
        fake.script(empty_completion(fake))
        await runtimes.start([orders_agent(fake.model(), [], model_retry=None)])
        run = await client.start_run("orders", "Where is order A-1?")

        with pytest.raises(RunFailedError, match="the model's answer is empty"):
            await run.result()

        assert len(fake.received) == 1

    async def test_a_classifier_given_to_the_model_can_stop_retrying_an_unreadable_answer(
        self, client: DurableClient, runtimes: Runtimes, fake: FakeProvider
    ) -> None:
        """The classifier sees the `ModelResponseError`, naming the call at fault."""
        fake.script(fake.tool_calls(("call_1", "lookup_order", "[1, 2]")), fake.text("Done."))
        seen: list[BaseException] = []

        def hopeless_if_unreadable(error: BaseException) -> ModelErrorVerdict:
            seen.append(error)
            return ModelErrorVerdict(retryable=not isinstance(error, ModelResponseError))

        model = fake.model(classify_error=hopeless_if_unreadable)
        await runtimes.start([orders_agent(model, [])])
        run = await client.start_run("orders", "Where is order A-1?")

        with pytest.raises(RunFailedError, match="are JSON a list, not an object"):
            await run.result()

        assert len(fake.received) == 1
        [error] = seen
        assert isinstance(error, ModelResponseError)
        assert (error.call_id, error.tool) == ("call_1", "lookup_order")


# Arguments cut off mid-object, as a completion stopped at its token limit leaves them.
BROKEN_JSON = '{"order_id": "A-1'


def empty_completion(fake: FakeProvider) -> Reply:
    """An answer with neither text nor tool calls, as each provider sends one."""
    if isinstance(fake, FakeAnthropic):
        reply = fake.text("")
        return dataclasses.replace(reply, body={**reply.body, "content": []})
    return fake.text("")


# -- message conversion ------------------------------------------------------------

TRANSCRIPT = ModelRequest(
    instructions="Be brief.",
    messages=(
        UserMessage(content="Check A-1 and B-2."),
        AssistantMessage(
            content="Looking them up.",
            tool_calls=(
                ToolCall(id="c1", name="lookup_order", arguments={"order_id": "A-1"}),
                ToolCall(id="c2", name="lookup_order", raw_arguments="{oops"),
            ),
        ),
        ToolResultMessage(call_id="c1", tool="lookup_order", content='{"status":"shipped"}'),
        ToolResultMessage(
            call_id="c2", tool="lookup_order", content="arguments are not JSON", is_error=True
        ),
        AssistantMessage(content="A-1 shipped."),
        UserMessage(content="Thanks!"),
    ),
    tools=(
        ToolSpec(
            name="lookup_order",
            description="Look up an order.",
            parameters={"type": "object", "properties": {"order_id": {"type": "string"}}},
        ),
    ),
)


def openai_completion(message: dict[str, Any], usage: dict[str, Any] | None) -> Any:
    from openai.types.chat import ChatCompletion

    return ChatCompletion.model_validate(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "gpt-4o-mini",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": usage,
        }
    )


class TestOpenAIConversion:
    def test_the_transcript_becomes_chat_messages(self) -> None:
        assert openai_messages(TRANSCRIPT) == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Check A-1 and B-2."},
            {
                "role": "assistant",
                "content": "Looking them up.",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "lookup_order", "arguments": '{"order_id": "A-1"}'},
                    },
                    {
                        "id": "c2",
                        "type": "function",
                        "function": {"name": "lookup_order", "arguments": "{}"},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": '{"status":"shipped"}'},
            {"role": "tool", "tool_call_id": "c2", "content": "Error: arguments are not JSON"},
            {"role": "assistant", "content": "A-1 shipped."},
            {"role": "user", "content": "Thanks!"},
        ]

    def test_tools_become_function_tools(self) -> None:
        assert openai_tools(TRANSCRIPT.tools) == [
            {
                "type": "function",
                "function": {
                    "name": "lookup_order",
                    "description": "Look up an order.",
                    "parameters": TRANSCRIPT.tools[0].parameters,
                },
            }
        ]

    def test_a_completion_with_text_and_several_tool_calls_becomes_one_answer(self) -> None:
        completion = openai_completion(
            {
                "role": "assistant",
                "content": "On it.",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "a", "arguments": '{"x": 1}'},
                    },
                    {"id": "c2", "type": "function", "function": {"name": "b", "arguments": ""}},
                ],
            },
            {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
        )

        assert from_openai_completion(completion) == ModelResponse(
            message=AssistantMessage(
                content="On it.",
                tool_calls=(
                    ToolCall(id="c1", name="a", arguments={"x": 1}),
                    ToolCall(id="c2", name="b", arguments={}),
                ),
            ),
            usage=Usage(requests=1, input_tokens=12, output_tokens=7),
        )

    def test_a_completion_without_usage_still_counts_one_request(self) -> None:
        completion = openai_completion({"role": "assistant", "content": "Hi."}, None)

        assert from_openai_completion(completion).usage == Usage(requests=1)

    @pytest.mark.parametrize(
        ("text", "why"),
        [
            ('{"order_id": "A-1"', "are not valid JSON (Expecting ',' delimiter: character 18)"),
            ("A-1", "are not valid JSON (Expecting value: character 0)"),
            ("[1, 2]", "are JSON a list, not an object"),
            ('"A-1"', "are JSON a string, not an object"),
            ("null", "are JSON null, not an object"),
            ("7", "are JSON a number, not an object"),
        ],
    )
    def test_arguments_that_are_not_a_json_object_make_the_answer_unreadable(
        self, text: str, why: str
    ) -> None:
        """The error names the call and quotes the text; the model is asked again."""
        completion = openai_completion(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "a", "arguments": "{}"}},
                    {"id": "c2", "type": "function", "function": {"name": "b", "arguments": text}},
                ],
            },
            None,
        )

        with pytest.raises(ModelResponseError) as caught:
            from_openai_completion(completion)

        assert str(caught.value).startswith(
            f"the model's tool call 'c2' to 'b' has arguments that {why}: {text!r}. "
            "The answer was not used: the model is asked again if the registration's "
            "model_retry allows another attempt"
        )
        assert (caught.value.call_id, caught.value.tool) == ("c2", "b")

    def test_the_error_quotes_at_most_200_characters_of_the_arguments(self) -> None:
        text = '{"note": "' + "x" * 10_000
        completion = openai_completion(
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "a", "arguments": text}}
                ],
            },
            None,
        )

        with pytest.raises(ModelResponseError) as caught:
            from_openai_completion(completion)

        assert f"{text[:200]!r}... (10,010 characters)" in str(caught.value)
        assert len(str(caught.value)) < 600

    @pytest.mark.parametrize("content", [None, "", "  \n"])
    def test_a_completion_with_no_text_and_no_tool_calls_is_unreadable(
        self, content: str | None
    ) -> None:
        completion = openai_completion({"role": "assistant", "content": content}, None)

        with pytest.raises(
            ModelResponseError,
            match=r"the model's answer is empty: the chat completion 'chatcmpl-1' "
            r"\(finish_reason 'stop'\) has no text and no tool calls\. The answer was not used",
        ):
            from_openai_completion(completion)

    def test_a_completion_without_choices_is_unreadable(self) -> None:
        from openai.types.chat import ChatCompletion

        completion = ChatCompletion.model_validate(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [],
            }
        )

        with pytest.raises(ModelResponseError, match="'chatcmpl-1' has no choices"):
            from_openai_completion(completion)

    def test_a_refusal_is_the_answer_text(self) -> None:
        completion = openai_completion(
            {"role": "assistant", "content": None, "refusal": "I can't help with that."}, None
        )

        assert from_openai_completion(completion).message.content == "I can't help with that."

    async def test_output_schema_asks_for_a_json_schema_response_format(
        self, fake_openai: FakeOpenAI
    ) -> None:
        class Verdict(BaseModel):
            approved: bool

        fake_openai.script(fake_openai.text('{"approved": true}'))
        model = fake_openai.model(output_schema=Verdict, temperature=0)

        answer = await model.request(TRANSCRIPT)

        assert answer.message.content == '{"approved": true}'
        body = fake_openai.received[0].body
        assert body["temperature"] == 0
        assert body["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "Verdict", "schema": Verdict.model_json_schema()},
        }


class TestAnthropicConversion:
    def test_the_transcript_becomes_alternating_turns_with_tool_blocks(self) -> None:
        assert anthropic_messages(TRANSCRIPT) == [
            {"role": "user", "content": [{"type": "text", "text": "Check A-1 and B-2."}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Looking them up."},
                    {
                        "type": "tool_use",
                        "id": "c1",
                        "name": "lookup_order",
                        "input": {"order_id": "A-1"},
                    },
                    {"type": "tool_use", "id": "c2", "name": "lookup_order", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "c1", "content": '{"status":"shipped"}'},
                    {
                        "type": "tool_result",
                        "tool_use_id": "c2",
                        "content": "arguments are not JSON",
                        "is_error": True,
                    },
                ],
            },
            {"role": "assistant", "content": [{"type": "text", "text": "A-1 shipped."}]},
            {"role": "user", "content": [{"type": "text", "text": "Thanks!"}]},
        ]

    def test_tools_carry_their_input_schema(self) -> None:
        assert anthropic_tools(TRANSCRIPT.tools) == [
            {
                "name": "lookup_order",
                "description": "Look up an order.",
                "input_schema": TRANSCRIPT.tools[0].parameters,
            }
        ]

    def test_a_message_with_text_and_tool_use_blocks_becomes_one_answer(self) -> None:
        from anthropic.types import Message

        message = Message.model_validate(
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "claude-haiku-4-5",
                "content": [
                    {"type": "text", "text": "Checking "},
                    {"type": "text", "text": "both."},
                    {"type": "tool_use", "id": "t1", "name": "a", "input": {"x": 1}},
                    {"type": "tool_use", "id": "t2", "name": "b", "input": {}},
                ],
                "stop_reason": "tool_use",
                "stop_sequence": None,
                "usage": {
                    "input_tokens": 10,
                    "output_tokens": 4,
                    "cache_creation_input_tokens": 3,
                    "cache_read_input_tokens": 2,
                },
            }
        )

        assert from_anthropic_message(message) == ModelResponse(
            message=AssistantMessage(
                content="Checking both.",
                tool_calls=(
                    ToolCall(id="t1", name="a", arguments={"x": 1}),
                    ToolCall(id="t2", name="b", arguments={}),
                ),
            ),
            usage=Usage(requests=1, input_tokens=15, output_tokens=4, cached_input_tokens=2),
        )

    @pytest.mark.parametrize(
        ("raw_input", "why"),
        [
            ("{oops", "are not valid JSON (Expecting property name enclosed in double quotes"),
            ([1, 2], "are JSON a list, not an object: '[1, 2]'"),
            ('"A-1"', "are JSON a string, not an object"),
            (None, "are JSON null, not an object: 'null'"),
        ],
    )
    def test_tool_input_that_is_not_an_object_makes_the_answer_unreadable(
        self, raw_input: object, why: str
    ) -> None:
        message = _anthropic_message([_tool_use_block("t1", "a", raw_input)])

        with pytest.raises(ModelResponseError) as caught:
            from_anthropic_message(message)

        assert str(caught.value).startswith(
            f"the model's tool call 't1' to 'a' has arguments that {why}"
        )
        assert (caught.value.call_id, caught.value.tool) == ("t1", "a")

    def test_tool_input_sent_as_the_text_of_a_json_object_is_read(self) -> None:
        message = _anthropic_message([_tool_use_block("t1", "a", '{"x": 1}')])

        [call] = from_anthropic_message(message).message.tool_calls

        assert call == ToolCall(id="t1", name="a", arguments={"x": 1})

    @pytest.mark.parametrize(
        ("blocks", "kinds"),
        [
            ([], "none"),
            ([{"type": "text", "text": ""}], "text"),
            ([{"type": "thinking", "thinking": "hmm", "signature": "s"}], "thinking"),
        ],
    )
    def test_a_message_with_no_text_and_no_tool_use_is_unreadable(
        self, blocks: list[dict[str, Any]], kinds: str
    ) -> None:
        from anthropic.types import Message

        message = Message.model_validate(
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "claude-haiku-4-5",
                "content": blocks,
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": 1, "output_tokens": 1},
            }
        )

        with pytest.raises(
            ModelResponseError,
            match=r"the model's answer is empty: the message 'msg_1' \(stop_reason 'end_turn'; "
            rf"content blocks: {kinds}\) has no text and no tool calls",
        ):
            from_anthropic_message(message)


def _anthropic_message(content: list[Any]) -> Any:
    from anthropic.types import Message

    return Message.model_construct(
        id="msg_1",
        type="message",
        role="assistant",
        model="claude-haiku-4-5",
        content=content,
        stop_reason="tool_use",
        stop_sequence=None,
        usage=_anthropic_usage(1, 1),
    )


def _tool_use_block(call_id: str, name: str, raw_input: object) -> Any:
    from anthropic.types import ToolUseBlock

    return ToolUseBlock.model_construct(type="tool_use", id=call_id, name=name, input=raw_input)


def _anthropic_usage(input_tokens: int, output_tokens: int) -> Any:
    from anthropic.types import Usage as AnthropicUsage

    return AnthropicUsage.model_construct(input_tokens=input_tokens, output_tokens=output_tokens)


# -- usage breakdowns --------------------------------------------------------------


class TestUsageBreakdown:
    @pytest.mark.parametrize("stream", [False, True])
    async def test_openai_cached_and_reasoning_tokens_are_read(
        self, fake_openai: FakeOpenAI, stream: bool
    ) -> None:
        """Streamed, they come from the final chunk's usage (`include_usage`)."""
        fake_openai.script(fake_openai.text("Hi.", usage=(100, 20), cached=60, reasoning=8))

        answer = await fake_openai.model(stream=stream).request(TRANSCRIPT)

        assert answer.usage == Usage(
            requests=1,
            input_tokens=100,
            output_tokens=20,
            cached_input_tokens=60,
            reasoning_tokens=8,
        )

    @pytest.mark.parametrize("stream", [False, True])
    async def test_anthropic_cache_reads_and_thinking_tokens_are_read(
        self, fake_anthropic: FakeAnthropic, stream: bool
    ) -> None:
        """Cache reads count in the input too (the API's `input_tokens` leaves them out).
        Streamed, from `message_start`'s usage and `message_delta`'s."""
        fake_anthropic.script(fake_anthropic.text("Hi.", usage=(40, 20), cached=60, reasoning=8))

        answer = await fake_anthropic.model(stream=stream).request(TRANSCRIPT)

        assert answer.usage == Usage(
            requests=1,
            input_tokens=100,
            output_tokens=20,
            cached_input_tokens=60,
            reasoning_tokens=8,
        )

    @pytest.mark.parametrize("stream", [False, True])
    async def test_a_breakdown_the_provider_leaves_out_is_zero(
        self, fake: FakeProvider, stream: bool
    ) -> None:
        fake.script(fake.text("Hi.", usage=(10, 5)))

        answer = await fake.model(stream=stream).request(TRANSCRIPT)

        assert answer.usage == Usage(requests=1, input_tokens=10, output_tokens=5)


# -- error classification ----------------------------------------------------------


async def sdk_error(fake: FakeProvider, status: int, headers: dict[str, str]) -> BaseException:
    """The exception the real SDK raises for this response."""
    fake.script(fake.error(status, headers=headers))
    with pytest.raises(Exception) as caught:
        await fake.model().request(TRANSCRIPT)
    return caught.value


class TestClassifyError:
    @pytest.mark.parametrize("status", [400, 401, 403, 404, 408, 409, 422, 429, 500, 503, 529])
    async def test_every_status_is_retryable_by_default(
        self, fake: FakeProvider, status: int
    ) -> None:
        """Permanent provider errors included (the seed): model_retry bounds the attempts."""
        error = await sdk_error(fake, status, {})

        assert fake.model().classify_error(error) == ModelErrorVerdict(retryable=True)

    @pytest.mark.parametrize(
        ("headers", "delay"),
        [
            ({"retry-after": "2"}, timedelta(seconds=2)),
            ({"retry-after": "1.5"}, timedelta(seconds=1.5)),
            ({"retry-after-ms": "1500"}, timedelta(milliseconds=1500)),
            ({"retry-after-ms": "250", "retry-after": "9"}, timedelta(milliseconds=250)),
        ],
    )
    async def test_retry_after_becomes_the_next_retry_delay(
        self, fake: FakeProvider, headers: dict[str, str], delay: timedelta
    ) -> None:
        error = await sdk_error(fake, 429, headers)

        assert fake.model().classify_error(error) == ModelErrorVerdict(True, retry_after=delay)

    async def test_retry_after_as_an_http_date_counts_from_now(self, fake: FakeProvider) -> None:
        when = datetime.now(UTC) + timedelta(seconds=30)
        error = await sdk_error(fake, 503, {"retry-after": format_datetime(when, usegmt=True)})

        verdict = fake.model().classify_error(error)

        assert verdict.retryable
        assert verdict.retry_after is not None
        assert timedelta(seconds=27) <= verdict.retry_after <= timedelta(seconds=31)

    async def test_x_should_retry_false_no_longer_stops_a_retry(self, fake: FakeProvider) -> None:
        """The server's hint was the SDK's own retry loop; durably retries as model_retry
        says, after the delay the response asks for."""
        error = await sdk_error(fake, 503, {"x-should-retry": "false", "retry-after": "5"})

        verdict = fake.model().classify_error(error)

        assert verdict == ModelErrorVerdict(True, retry_after=timedelta(seconds=5))

    async def test_connection_errors_and_timeouts_are_retryable(self, fake: FakeProvider) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            closed_port = s.getsockname()[1]
        refused = fake.model(base_url=f"http://127.0.0.1:{closed_port}")  # nothing listens
        fake.script(dataclasses.replace(fake.text("too late"), delay=1.0))

        with pytest.raises(Exception) as connection:
            await refused.request(TRANSCRIPT)
        with pytest.raises(Exception) as timeout:
            await fake.model(timeout=0.2).request(TRANSCRIPT)

        assert "Connection" in type(connection.value).__name__
        assert "Timeout" in type(timeout.value).__name__
        for error in (connection.value, timeout.value):
            assert fake.model().classify_error(error) == ModelErrorVerdict(retryable=True)

    def test_an_error_outside_the_sdk_is_retryable(self, fake: FakeProvider) -> None:
        assert fake.model().classify_error(ValueError("bad")) == ModelErrorVerdict(True)

    def test_an_unreadable_answer_is_retryable(self, fake: FakeProvider) -> None:
        """A validation error of the completion attempt, retried as the seed says."""
        error = ModelResponseError("the model's answer is empty")

        assert fake.model().classify_error(error) == ModelErrorVerdict(True)

    def test_openai_configuration_errors_are_retryable_too(
        self, fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        import openai

        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        with pytest.raises(openai.OpenAIError) as missing_key:
            openai.AsyncOpenAI(base_url=fake_openai.url)

        verdict = fake_openai.model().classify_error(missing_key.value)

        assert verdict == ModelErrorVerdict(retryable=True)  # stop it with classify_error

    def test_a_classifier_given_to_the_model_replaces_the_built_in_one(
        self, fake: FakeProvider
    ) -> None:
        never = ModelErrorVerdict(retryable=False)
        model = fake.model(classify_error=lambda error: never)

        assert model.classify_error(TimeoutError()) is never
        assert classify_model_error(model, TimeoutError()) is never
        assert type(model).default_classify_error(TimeoutError()) == ModelErrorVerdict(True)


class TestRetryAfterHeader:
    NOW = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)

    @pytest.mark.parametrize(
        ("headers", "delay"),
        [
            ({}, None),
            ({"retry-after": "3"}, timedelta(seconds=3)),
            ({"retry-after": " 0.5 "}, timedelta(seconds=0.5)),
            ({"retry-after": "0"}, None),
            ({"retry-after": "-4"}, None),
            ({"retry-after": "soon"}, None),
            ({"retry-after": "Wed, 01 Jan 2025 12:00:10 GMT"}, timedelta(seconds=10)),
            ({"retry-after": "Wed, 01 Jan 2025 11:59:00 GMT"}, None),
            ({"retry-after-ms": "20"}, timedelta(milliseconds=20)),
            ({"retry-after-ms": "x", "retry-after": "3"}, timedelta(seconds=3)),
        ],
    )
    def test_forms(self, headers: dict[str, str], delay: timedelta | None) -> None:
        assert retry_after(headers, now=self.NOW) == delay


# -- identity, configuration and extras --------------------------------------------


class TestIdentity:
    def test_names_provider_model_server_and_settings_but_never_the_key(self) -> None:
        model = OpenAIChatModel(
            "gpt-4o-mini",
            base_url="http://localhost:11434/v1/",
            api_key="sk-secret",
            temperature=0.2,
            max_tokens=300,
        )

        assert model.identity == {
            "provider": "openai",
            "model": "gpt-4o-mini",
            "base_url": "http://localhost:11434/v1",
            "temperature": 0.2,
            "max_tokens": 300,
        }
        assert "sk-secret" not in json.dumps(dict(model.identity))

    def test_anthropic_identity_includes_max_tokens_and_settings(self) -> None:
        model = AnthropicModel("claude-haiku-4-5", api_key="sk-ant-secret", temperature=0)

        assert model.identity == {
            "provider": "anthropic",
            "model": "claude-haiku-4-5",
            "max_tokens": 4096,
            "temperature": 0,
        }

    def test_a_changed_setting_changes_the_registration_fingerprint(self) -> None:
        def fingerprint(model: Any) -> str:
            agent = Agent(id="a", model=model, instructions="x")
            return AgentRegistration(agent, version="1").fingerprint

        assert fingerprint(OpenAIChatModel("m", api_key="k1")) == fingerprint(
            OpenAIChatModel("m", api_key="k2")
        )
        assert fingerprint(OpenAIChatModel("m", api_key="k")) != fingerprint(
            OpenAIChatModel("m", api_key="k", temperature=0.5)
        )
        assert fingerprint(AnthropicModel("m", api_key="k")) != fingerprint(
            AnthropicModel("m", api_key="k", max_tokens=100)
        )

    def test_the_server_from_the_environment_is_part_of_the_identity(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("OPENAI_BASE_URL", "http://vllm.internal:8000/v1")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://proxy.internal")

        assert OpenAIChatModel("m").identity["base_url"] == "http://vllm.internal:8000/v1"
        assert AnthropicModel("m").identity["base_url"] == "http://proxy.internal"


class TestEnvironment:
    async def test_openai_key_and_server_come_from_the_environment(
        self, fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("OPENAI_API_KEY", "env-key")
        monkeypatch.setenv("OPENAI_BASE_URL", f"{fake_openai.url}/v1")
        fake_openai.script(fake_openai.text("hello"))

        answer = await OpenAIChatModel("gpt-4o-mini").request(TRANSCRIPT)

        assert answer.message.content == "hello"
        assert fake_openai.received[0].headers["authorization"] == "Bearer env-key"

    async def test_anthropic_key_and_server_come_from_the_environment(
        self, fake_anthropic: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "env-key")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake_anthropic.url)
        fake_anthropic.script(fake_anthropic.text("hello"))

        answer = await AnthropicModel("claude-haiku-4-5").request(TRANSCRIPT)

        assert answer.message.content == "hello"
        assert anthropic_key(fake_anthropic.received[0].headers) == "env-key"


class TestExtras:
    @pytest.mark.parametrize(
        ("cls", "sdk"), [(OpenAIChatModel, "openai"), (AnthropicModel, "anthropic")]
    )
    def test_a_model_without_its_sdk_names_the_extra_to_install(
        self, monkeypatch: pytest.MonkeyPatch, cls: Any, sdk: str
    ) -> None:
        monkeypatch.setitem(sys.modules, sdk, None)  # makes `import <sdk>` fail

        with pytest.raises(ImportError, match=rf"pip install 'durably\[{sdk}\]'"):
            cls("some-model", api_key="k")

    def test_durably_imports_without_either_sdk(self) -> None:
        code = (
            "import sys; sys.modules['openai'] = None; sys.modules['anthropic'] = None\n"
            "import durably, durably.models\n"
            "from durably import OpenAIChatModel, AnthropicModel, Agent, ScriptedModel\n"
            "try:\n"
            "    OpenAIChatModel('gpt-4o-mini')\n"
            "except ImportError as e:\n"
            "    print(e)\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
        )

        assert "pip install 'durably[openai]'" in out.stdout

    def test_both_adapters_are_exported(self) -> None:
        import durably.models

        for name in ("OpenAIChatModel", "AnthropicModel"):
            assert name in durably.__all__
            assert name in durably.models.__all__
            assert getattr(durably, name) is getattr(durably.models, name)


class TestSupportDeskModel:
    def test_without_provider_settings_the_demo_is_scripted(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from durably.examples import support_desk

        for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
            monkeypatch.delenv(name, raising=False)

        assert isinstance(support_desk.build_model(), ScriptedModel)
        [registration] = support_desk.build_registrations()
        assert registration.version == "2"
        assert registration.model_retry is None

    def test_an_openai_compatible_server_in_the_environment_is_used(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from durably.examples import support_desk

        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        monkeypatch.setenv("OPENAI_BASE_URL", "http://localhost:11434/v1")
        monkeypatch.setenv("DURABLY_OPENAI_MODEL", "llama3.1")

        model = support_desk.build_model()

        assert isinstance(model, OpenAIChatModel)
        assert model.identity["model"] == "llama3.1"
        assert model.identity["base_url"] == "http://localhost:11434/v1"
        [registration] = support_desk.build_registrations()
        assert registration.version == "2-openai"
        assert registration.model_retry is not None


class TestStreamedAnswers:
    async def test_the_answer_reaches_a_follower_while_the_provider_still_writes_it(
        self, fake: FakeProvider, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """The provider streams its answer (SSE on the wire); the server holds the rest of it
        back until a follower of the run has shown the first piece."""
        shown = threading.Event()
        text = fake.text("Your order A-1 ships tomorrow.")
        fake.script(Reply(text.body, hold_after_first=shown))
        agent = Agent(id="streamer", model=fake.model(), instructions="Be brief.")
        await runtimes.start([AgentRegistration(agent, version="1")])
        run = await client.start_run("streamer", "where is A-1")

        pieces: list[str] = []
        async for item in run.events(poll_interval=0.05):
            if item.event.type == "text_delta":
                pieces.append(item.event.text)  # type: ignore[union-attr]
                shown.set()

        assert pieces[0] == "Your "
        assert "".join(pieces) == "Your order A-1 ships tomorrow."
        assert (await run.result()).output == "Your order A-1 ships tomorrow."
        assert fake.received[0].body["stream"] is True
