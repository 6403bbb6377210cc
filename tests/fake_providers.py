"""Fake OpenAI and Anthropic servers: real HTTP on a real socket, scripted replies.

Each fake is a stdlib `ThreadingHTTPServer` in a daemon thread. Every POST
is recorded (path, headers, JSON body, arrival time) and answered with the
next scripted `Reply`; when the script runs out the server answers a 400
naming that, so a test that under-scripts fails with a message (after its
`model_retry` attempts) instead of hanging. Reply bodies are shaped like the providers' own
(`chat.completion` objects, Anthropic `message` objects, their error
envelopes), so the real SDK clients parse them as they would in production. A
request asking for a stream (`"stream": true`) gets the same reply as the
provider streams it: Server-Sent Events (`chat.completion.chunk`s ending in
`[DONE]`; Anthropic's `message_start` ... `message_stop`), the text cut into
word-sized pieces. Usage is reported as each provider reports it; the breakdowns
(prompt-cache reads, reasoning tokens) only when a scripted reply asks for them.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

from durably.models import AnthropicModel, OpenAIChatModel

__all__ = [
    "FakeAnthropic",
    "FakeOpenAI",
    "FakeProvider",
    "Received",
    "Reply",
    "SeenResult",
]

_ids = itertools.count(1)


@dataclass(frozen=True)
class Reply:
    """One scripted HTTP answer."""

    body: Any
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0
    # Streamed (a request with `"stream": true`): seconds between pieces, and an event
    # the server waits for after the first piece of text (a test holds the rest back).
    piece_delay: float = 0.0
    hold_after_first: threading.Event | None = None


@dataclass(frozen=True)
class Received:
    """One request the server got."""

    path: str
    headers: Mapping[str, str]  # names in lower case
    body: dict[str, Any]
    at: float  # time.monotonic() on arrival


@dataclass(frozen=True)
class SeenResult:
    """A tool result as the provider received it, in provider-neutral terms."""

    call_id: str
    content: str
    is_error: bool


class FakeProvider:
    """An HTTP server answering POSTs with scripted replies, in order."""

    name: ClassVar[str]

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._replies: deque[Reply] = deque()
        self._received: list[Received] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.02},  # how fast shutdown() is noticed
            name=f"fake-{self.name}",
            daemon=True,
        )

    def __enter__(self) -> FakeProvider:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self._replies.extend(replies)

    @property
    def received(self) -> list[Received]:
        with self._lock:
            return list(self._received)

    def gaps(self) -> list[float]:
        """Seconds between consecutive requests."""
        times = [r.at for r in self.received]
        return [b - a for a, b in itertools.pairwise(times)]

    # -- provider-specific, filled in by subclasses ------------------------------------

    def model(self, **kwargs: Any) -> Any:
        raise NotImplementedError

    def tool_calls(
        self,
        *calls: tuple[str, str, Any],
        usage: tuple[int, int] = (10, 5),
        cached: int | None = None,
        reasoning: int | None = None,
    ) -> Reply:
        """A reply calling tools: `(call id, tool name, arguments dict or raw text)`."""
        raise NotImplementedError

    def text(
        self,
        text: str,
        *,
        usage: tuple[int, int] = (10, 5),
        cached: int | None = None,
        reasoning: int | None = None,
    ) -> Reply:
        """A reply answering `text`. `usage` is the provider's own (input, output) counts;
        `cached` (prompt-cache reads) and `reasoning` go in its usage breakdown, which is
        left out when None, as by a server that does not report it."""
        raise NotImplementedError

    def error(
        self, status: int, message: str = "scripted failure", headers: Mapping[str, str] = {}
    ) -> Reply:
        raise NotImplementedError

    def tool_results(self, body: Mapping[str, Any]) -> list[SeenResult]:
        """The tool results at the end of a request body."""
        raise NotImplementedError

    def unanswered_calls(self, body: Mapping[str, Any]) -> list[str]:
        """The ids of tool calls in a request's transcript that have no result right after
        them: the provider refuses such a request with a 400, and so does the fake."""
        raise NotImplementedError

    def stream_events(
        self, body: Mapping[str, Any], request: Mapping[str, Any]
    ) -> list[tuple[str, bool]]:
        """A reply body as the provider streams it: its Server-Sent Events, in order, each
        with whether it carries a piece of the answer's text."""
        raise NotImplementedError

    # Pieces of text a streamed answer is cut into (the providers send a few words each).
    @staticmethod
    def pieces(text: str) -> list[str]:
        words = text.split(" ")
        return [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)]

    # -- the server ---------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                with fake._lock:
                    fake._received.append(
                        Received(
                            path=self.path,
                            headers={k.lower(): v for k, v in self.headers.items()},
                            body=json.loads(raw or b"{}"),
                            at=time.monotonic(),
                        )
                    )
                    unanswered = fake.unanswered_calls(fake._received[-1].body)
                    reply = None
                    if not unanswered:
                        reply = fake._replies.popleft() if fake._replies else None
                if unanswered:
                    reply = fake.error(
                        400,
                        f"fake server: tool calls {unanswered} have no result after them",
                        {"x-should-retry": "false"},
                    )
                if reply is None:
                    reply = fake.error(
                        400, "fake server: no reply scripted", {"x-should-retry": "false"}
                    )
                if reply.delay:
                    time.sleep(reply.delay)
                request = fake._received[-1].body
                if reply.status == 200 and request.get("stream"):
                    _stream(self, reply, fake.stream_events(reply.body, request))
                    return
                data = json.dumps(reply.body).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


def _stream(handler: BaseHTTPRequestHandler, reply: Reply, events: list[tuple[str, bool]]) -> None:
    """Server-Sent Events, one write each; the connection closes at the end (HTTP/1.0)."""
    try:
        handler.send_response(200)
        handler.send_header("content-type", "text/event-stream")
        handler.send_header("cache-control", "no-cache")
        handler.end_headers()
        held = False
        for event, text in events:
            handler.wfile.write(event.encode())
            handler.wfile.flush()
            if reply.hold_after_first is not None and not held and text:
                held = reply.hold_after_first.wait(20)
            if reply.piece_delay:
                time.sleep(reply.piece_delay)
    except (BrokenPipeError, ConnectionResetError):
        pass


def _sse(data: Any, event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data) if not isinstance(data, str) else data}\n\n"


def _arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


class FakeOpenAI(FakeProvider):
    """Speaks Chat Completions under `/v1/chat/completions`."""

    name = "openai"

    def model(self, **kwargs: Any) -> OpenAIChatModel:
        kwargs.setdefault("api_key", "test-key")
        kwargs.setdefault("base_url", f"{self.url}/v1")
        return OpenAIChatModel("gpt-4o-mini", **kwargs)

    def tool_calls(
        self,
        *calls: tuple[str, str, Any],
        usage: tuple[int, int] = (10, 5),
        cached: int | None = None,
        reasoning: int | None = None,
    ) -> Reply:
        return Reply(
            _completion(
                {
                    "role": "assistant",
                    "content": None,
                    "refusal": None,
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": name, "arguments": _arguments_text(args)},
                        }
                        for call_id, name, args in calls
                    ],
                },
                "tool_calls",
                _openai_usage(usage, cached, reasoning),
            )
        )

    def text(
        self,
        text: str,
        *,
        usage: tuple[int, int] = (10, 5),
        cached: int | None = None,
        reasoning: int | None = None,
    ) -> Reply:
        message = {"role": "assistant", "content": text, "refusal": None}
        return Reply(_completion(message, "stop", _openai_usage(usage, cached, reasoning)))

    def error(
        self, status: int, message: str = "scripted failure", headers: Mapping[str, str] = {}
    ) -> Reply:
        kind = "rate_limit_error" if status == 429 else "invalid_request_error"
        return Reply(
            {"error": {"message": message, "type": kind, "param": None, "code": None}},
            status=status,
            headers=headers,
        )

    def unanswered_calls(self, body: Mapping[str, Any]) -> list[str]:
        return _openai_unanswered(list(body.get("messages", [])))

    def stream_events(
        self, body: Mapping[str, Any], request: Mapping[str, Any]
    ) -> list[tuple[str, bool]]:
        return _openai_stream(body, request, self.pieces)

    def tool_results(self, body: Mapping[str, Any]) -> list[SeenResult]:
        tail = list(itertools.takewhile(lambda m: m["role"] == "tool", reversed(body["messages"])))
        return [
            SeenResult(
                call_id=m["tool_call_id"],
                content=m["content"],
                is_error=m["content"].startswith("Error: "),
            )
            for m in reversed(tail)
        ]


def _openai_stream(
    completion: Mapping[str, Any], request: Mapping[str, Any], pieces: Any
) -> list[tuple[str, bool]]:
    """A `chat.completion` as `chat.completion.chunk` events, usage last when asked."""
    choice = completion["choices"][0]
    message = choice["message"]
    base = {k: completion[k] for k in ("id", "created", "model", "system_fingerprint")}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        return _sse(
            {
                **base,
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
        )

    text = message.get("content")
    events = [chunk({"role": "assistant", "content": "" if text else None})]
    written = [chunk({"content": piece}) for piece in (pieces(text) if text else [])]
    events += written
    for i, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        events.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "id": call["id"],
                            "type": "function",
                            "function": {"name": function["name"], "arguments": ""},
                        }
                    ]
                }
            )
        )
        events.append(
            chunk({"tool_calls": [{"index": i, "function": {"arguments": function["arguments"]}}]})
        )
    events.append(chunk({}, choice["finish_reason"]))
    if (request.get("stream_options") or {}).get("include_usage"):
        events.append(
            _sse(
                {
                    **base,
                    "object": "chat.completion.chunk",
                    "choices": [],
                    "usage": completion["usage"],
                }
            )
        )
    events.append(_sse("[DONE]"))
    return [(e, e in written) for e in events]


def _openai_unanswered(messages: list[Mapping[str, Any]]) -> list[str]:
    """As OpenAI checks: an assistant message's tool calls are each answered by the `tool`
    messages that follow it."""
    missing: list[str] = []
    for i, m in enumerate(messages):
        if m.get("role") != "assistant" or not m.get("tool_calls"):
            continue
        after = itertools.takewhile(lambda n: n.get("role") == "tool", messages[i + 1 :])
        answered = {n.get("tool_call_id") for n in after}
        missing += [c["id"] for c in m["tool_calls"] if c["id"] not in answered]
    return missing


def _anthropic_unanswered(messages: list[Mapping[str, Any]]) -> list[str]:
    """As Anthropic checks: each `tool_use` block is answered by a `tool_result` block in
    the very next (user) message."""
    missing: list[str] = []
    for i, m in enumerate(messages):
        if m.get("role") != "assistant" or not isinstance(m.get("content"), list):
            continue
        uses = [b["id"] for b in m["content"] if b.get("type") == "tool_use"]
        following = messages[i + 1]["content"] if i + 1 < len(messages) else []
        answered = {
            b.get("tool_use_id")
            for b in (following if isinstance(following, list) else [])
            if b.get("type") == "tool_result"
        }
        missing += [u for u in uses if u not in answered]
    return missing


def _openai_usage(
    usage: tuple[int, int], cached: int | None, reasoning: int | None
) -> dict[str, Any]:
    """Chat Completions usage: the cached and reasoning tokens are counted in the totals."""
    prompt, completion = usage
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached, "audio_tokens": 0}
    if reasoning is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning, "audio_tokens": 0}
    return out


def _completion(message: dict[str, Any], finish: str, usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-fake{next(_ids)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "gpt-4o-mini-2024-07-18",
        "system_fingerprint": "fp_fake",
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": usage,
    }


class FakeAnthropic(FakeProvider):
    """Speaks the Messages API under `/v1/messages`."""

    name = "anthropic"

    def model(self, **kwargs: Any) -> AnthropicModel:
        kwargs.setdefault("api_key", "test-key")
        kwargs.setdefault("base_url", self.url)
        return AnthropicModel("claude-haiku-4-5", **kwargs)

    def tool_calls(
        self,
        *calls: tuple[str, str, Any],
        usage: tuple[int, int] = (10, 5),
        cached: int | None = None,
        reasoning: int | None = None,
    ) -> Reply:
        blocks = [
            {"type": "tool_use", "id": call_id, "name": name, "input": args}
            for call_id, name, args in calls
        ]
        return Reply(_message(blocks, "tool_use", _anthropic_usage(usage, cached, reasoning)))

    def text(
        self,
        text: str,
        *,
        usage: tuple[int, int] = (10, 5),
        cached: int | None = None,
        reasoning: int | None = None,
    ) -> Reply:
        blocks = [{"type": "text", "text": text}]
        return Reply(_message(blocks, "end_turn", _anthropic_usage(usage, cached, reasoning)))

    def error(
        self, status: int, message: str = "scripted failure", headers: Mapping[str, str] = {}
    ) -> Reply:
        kind = {
            429: "rate_limit_error",
            500: "api_error",
            529: "overloaded_error",
        }.get(status, "invalid_request_error")
        return Reply(
            {"type": "error", "error": {"type": kind, "message": message}},
            status=status,
            headers=headers,
        )

    def unanswered_calls(self, body: Mapping[str, Any]) -> list[str]:
        return _anthropic_unanswered(list(body.get("messages", [])))

    def stream_events(
        self, body: Mapping[str, Any], request: Mapping[str, Any]
    ) -> list[tuple[str, bool]]:
        return _anthropic_stream(body, self.pieces)

    def tool_results(self, body: Mapping[str, Any]) -> list[SeenResult]:
        last = body["messages"][-1]
        assert last["role"] == "user"
        return [
            SeenResult(
                call_id=b["tool_use_id"],
                content=b["content"],
                is_error=bool(b.get("is_error", False)),
            )
            for b in last["content"]
            if b["type"] == "tool_result"
        ]


def _anthropic_stream(message: Mapping[str, Any], pieces: Any) -> list[tuple[str, bool]]:
    """A `message` as the Messages API streams it: start, each block's deltas, stop.

    `message_start` carries the input counts; `message_delta` all the final counts, as
    cumulative totals."""
    usage = message["usage"]
    start_usage = {k: v for k, v in usage.items() if k != "output_tokens_details"}
    start_usage["output_tokens"] = 1
    start = {**message, "content": [], "stop_reason": None, "usage": start_usage}
    events = [_sse({"type": "message_start", "message": start}, "message_start")]
    texts: list[str] = []
    for i, block in enumerate(message["content"]):
        if block["type"] == "text":
            opened = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in pieces(block["text"])]
        else:
            opened = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block["input"])}]
        events.append(
            _sse(
                {"type": "content_block_start", "index": i, "content_block": opened},
                "content_block_start",
            )
        )
        written = [
            _sse({"type": "content_block_delta", "index": i, "delta": d}, "content_block_delta")
            for d in deltas
        ]
        texts += written if block["type"] == "text" else []
        events += written
        events.append(_sse({"type": "content_block_stop", "index": i}, "content_block_stop"))
    events.append(
        _sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": usage,
            },
            "message_delta",
        )
    )
    events.append(_sse({"type": "message_stop"}, "message_stop"))
    return [(e, e in texts) for e in events]


def _anthropic_usage(
    usage: tuple[int, int], cached: int | None, reasoning: int | None
) -> dict[str, Any]:
    """Messages API usage: `input_tokens` leaves out the cache's tokens (here `cached`, the
    reads); thinking is counted in `output_tokens`."""
    input_tokens, output_tokens = usage
    out: dict[str, Any] = {"input_tokens": input_tokens, "output_tokens": output_tokens}
    if cached is not None:
        out |= {"cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}
    if reasoning is not None:
        out["output_tokens_details"] = {"thinking_tokens": reasoning}
    return out


def _message(blocks: list[dict[str, Any]], stop: str, usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"msg_fake{next(_ids)}",
        "type": "message",
        "role": "assistant",
        "model": "claude-haiku-4-5-20251001",
        "content": blocks,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage,
    }
