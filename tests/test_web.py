"""`durably serve` / `durably.web` (SPEC section 15): Server-Sent Events of runs, resumed
with Last-Event-ID, one follower per run however many watch, tokens off loopback, and a
page that shows a run's text as it is written in headless Chromium."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.routing import Mount

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    DurablyError,
    FunctionModel,
    ModelRequest,
    RunStatus,
    ToolContext,
    tool,
)
from durably._http import AsgiServer
from durably.codec import EncryptionCodec, EncryptionKeys
from durably.codec_server import codec_app
from durably.messages import AssistantMessage, ToolCall
from durably.models import last_tool_results
from durably.web import LiveServer, live_app

from .browser import NEEDS_CHROMIUM, chromium
from .conftest import Runtimes, wait_for_status

ARTIFACTS = Path(__file__).parent / "artifacts" / "web"


@dataclass
class Message:
    event: str
    data: dict[str, Any]
    id: str | None = None


@dataclass
class Stream:
    """One HTTP response, read as Server-Sent Events."""

    status: int
    body: bytes = b""
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    _buffer: str = field(default="")

    async def messages(self) -> AsyncIterator[Message]:
        assert self.reader is not None
        while True:
            while "\n\n" not in self._buffer:
                size = int((await self.reader.readline()).strip() or b"0", 16)
                if size == 0:
                    return
                self._buffer += (await self.reader.readexactly(size)).decode()
                await self.reader.readline()
            block, self._buffer = self._buffer.split("\n\n", 1)
            fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
            if "data" in fields:
                yield Message(fields.get("event", ""), json.loads(fields["data"]), fields.get("id"))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def get(
    port: int, path: str, headers: dict[str, str] | None = None, host: str = "localhost"
) -> Stream:
    """A GET to the live server on 127.0.0.1:`port`, `Host: host`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n{extra}\r\n".encode())
    status = int((await reader.readline()).split()[1])
    response_headers: dict[str, str] = {}
    while (line := (await reader.readline()).decode().strip()) != "":
        name, _, value = line.partition(":")
        response_headers[name.lower()] = value.strip()
    if status != 200:
        body = await reader.readexactly(int(response_headers.get("content-length", "0")))
        writer.close()
        return Stream(status, body)
    return Stream(status, reader=reader, writer=writer)


async def post(
    port: int,
    path: str,
    body: Any,
    token: str,
    content_type: str = "application/json",
    extra: str = "",
) -> tuple[int, Any]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body).encode()
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: localhost:{port}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: {len(data)}\r\n{extra}"
        "Connection: close\r\n\r\n".encode()
        + data
    )
    raw = await reader.read()
    writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload)


async def read_all(stream: Stream, until: str = "run_completed") -> list[Message]:
    seen: list[Message] = []
    async for message in stream.messages():
        seen.append(message)
        if message.event == until:
            break
    stream.close()
    return seen


class Order(BaseModel):
    order: str


@tool(requires_approval=True)
async def refund(args: Order, ctx: ToolContext) -> str:
    """Refund an order."""
    return "refunded"


def writer(gate: asyncio.Event | None = None) -> AgentRegistration:
    """Writes its answer in pieces; with `gate`, waits for it after the first piece."""

    async def model(request: ModelRequest) -> AsyncIterator[str]:
        yield "Your order "
        if gate is not None:
            await asyncio.wait_for(gate.wait(), 20)
        yield "ships "
        yield "tomorrow."

    agent = Agent(id="writer", model=FunctionModel(model, name="web.writer"), instructions="")
    return AgentRegistration(agent, version="1")


TOKENS = {"alice": "a" * 32, "bob": "b" * 32}


class TestServerSentEvents:
    async def test_a_run_streams_its_events_and_text_and_resumes_by_last_event_id(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        await runtimes.start([writer()])
        async with LiveServer(client, port=0) as server:
            run = await client.start_run("writer", "where is my order")
            whole = await asyncio.wait_for(
                read_all(await get(server.port, f"/runs/{run.run_id}/events")), 30
            )

            ids = [int(m.id) for m in whole if m.id is not None]
            assert ids == list(range(len(ids)))
            text = "".join(m.data["text"] for m in whole if m.event == "text_delta")
            assert text == "Your order ships tomorrow."
            assert whole[-1].event == "run_completed"

            resumed = await get(
                server.port, f"/runs/{run.run_id}/events", {"Last-Event-ID": str(ids[2])}
            )
            rest = await asyncio.wait_for(read_all(resumed), 30)
            assert [int(m.id) for m in rest if m.id is not None] == ids[3:]

    async def test_ten_browsers_of_one_run_share_one_follower(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        gate = asyncio.Event()
        await runtimes.start([writer(gate)])
        async with LiveServer(client, port=0) as server:
            run = await client.start_run("writer", "where is my order")
            streams = [await get(server.port, f"/runs/{run.run_id}/events") for _ in range(10)]
            readers = [asyncio.create_task(read_all(s)) for s in streams]
            await asyncio.sleep(0)
            gate.set()
            seen = await asyncio.wait_for(asyncio.gather(*readers), 30)

            assert all([m.id for m in s] == [m.id for m in seen[0]] for s in seen)
            assert server.app.state.hub.started == 1

    async def test_tokens_off_loopback_and_responses_recorded_as_the_tokens_name(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        with pytest.raises(DurablyError, match="without tokens"):
            LiveServer(client, host="0.0.0.0", port=0)

        await runtimes.start([_refunder("web.refunder")])
        run = await client.start_run("refunder", "refund A")
        snap = await wait_for_status(run, RunStatus.WAITING)
        assert snap.interaction is not None
        async with LiveServer(client, host="0.0.0.0", port=0, tokens=TOKENS) as server:
            port = server.port
            refused = await get(port, f"/runs/{run.run_id}/events", host="example.com")
            assert refused.status == 401
            wrong = await get(port, f"/runs/{run.run_id}/events?token={'x' * 32}")
            assert wrong.status == 401
            allowed = await get(port, f"/runs/{run.run_id}/events?token={TOKENS['bob']}")
            assert allowed.status == 200
            allowed.close()

            status, accepted = await post(
                port,
                f"/runs/{run.run_id}/respond",
                {
                    "interaction_id": snap.interaction.id,
                    "response": {"type": "tool-approval", "approved": True},
                },
                TOKENS["bob"],
            )
            assert status == 200 and accepted["responder"] == "bob"
            # What a page on another site could send through a browser: refused.
            body = {"interaction_id": snap.interaction.id, "response": {}}
            path = f"/runs/{run.run_id}/respond"
            plain = await post(port, path, body, TOKENS["bob"], content_type="text/plain")
            assert plain[0] == 415
            crossed = await post(
                port, path, body, TOKENS["bob"], extra="Sec-Fetch-Site: cross-site\r\n"
            )
            assert crossed[0] == 403
        await run.result()
        approved = [e for e in (await run.snapshot()).events if e.type == "approved"]
        assert "by bob" in (approved[0].detail or "")

    async def test_without_tokens_only_requests_to_localhost_are_served(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        await runtimes.start([writer()])
        run = await client.start_run("writer", "hello")
        await run.result()
        async with LiveServer(client, port=0) as server:
            rebound = await get(server.port, f"/runs/{run.run_id}/events", host="evil.example")
            assert rebound.status == 403
            missing = await get(server.port, "/runs/no-such-run/events")
            assert missing.status == 404


@NEEDS_CHROMIUM
class TestInABrowser:
    async def test_the_watch_page_shows_the_text_as_it_is_written(
        self, client: DurableClient, runtimes: Runtimes, tmp_path: Path
    ) -> None:
        """EventSource in headless Chromium: the first piece shows while the model still
        waits to write the rest."""
        gate = asyncio.Event()
        await runtimes.start([writer(gate)])
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        async with LiveServer(client, port=0) as server:
            run = await client.start_run("writer", "where is my order")
            async with chromium(tmp_path / "profile", ARTIFACTS / "chromium.log") as browser:
                page = await browser.open(f"{server.url}/runs/{run.run_id}/watch")
                await page.wait_for_text("Your order")
                assert "tomorrow" not in await page.text()
                gate.set()
                await page.wait_for_text("Your order ships tomorrow.", "run_completed")
                await page.screenshot(ARTIFACTS / "watch.png")


class TestSessions:
    async def test_a_sessions_events_stream_with_each_of_its_runs(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        await runtimes.start([writer()])
        session = await client.start_session("writer")
        for text in ("one", "two"):
            await (await session.submit(text)).result()
        await session.close()
        async with LiveServer(client, port=0) as server:
            stream = await get(server.port, f"/sessions/{session.session_id}/events")
            seen = await asyncio.wait_for(read_all(stream, until="closed"), 30)

        kinds = [m.event for m in seen]
        assert kinds.count("run_started") == 2 and kinds.count("run_completed") == 2
        # Only the session's own events carry an id: Last-Event-ID resumes the session.
        ids = [int(m.id) for m in seen if m.id is not None]
        assert len(ids) == sum(1 for m in seen if m.data.get("kind") == "session")
        assert ids == list(range(len(ids)))
        assert kinds[-1] == "closed"
        text = "".join(m.data["text"] for m in seen if m.event == "text_delta")
        assert text == "Your order ships tomorrow." * 2


class TestQuietStreams:
    async def test_a_quiet_stream_stays_open_through_keep_alives(
        self, client: DurableClient, runtimes: Runtimes, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A run that waits for a person sends nothing for a while: the stream sends
        keep-alive comments and goes on, to the events after the answer."""
        import durably.web

        monkeypatch.setattr(durably.web, "_KEEP_ALIVE_S", 0.1)

        def model(request: ModelRequest) -> AssistantMessage:
            if last_tool_results(request):
                return AssistantMessage(content="done")
            call = ToolCall(id="r", name="refund", arguments={"order": "A"})
            return AssistantMessage(tool_calls=(call,))

        agent = Agent(
            id="refunder", model=FunctionModel(model, name="web.quiet"), instructions="",
            tools=[refund],
        )  # fmt: skip
        await runtimes.start([AgentRegistration(agent, version="1")])
        run = await client.start_run("refunder", "refund A")
        async with LiveServer(client, port=0) as server:
            stream = await get(server.port, f"/runs/{run.run_id}/events")
            reader = asyncio.create_task(read_all(stream))
            snap = await wait_for_status(run, RunStatus.WAITING)
            await asyncio.sleep(0.5)  # several keep-alive intervals of silence, on purpose
            assert snap.interaction is not None
            await run.approve(snap.interaction, responder="alice")
            seen = await asyncio.wait_for(reader, 30)

        assert [m.event for m in seen][-1] == "run_completed"


def _refunder(model_name: str) -> AgentRegistration:
    """Refunds order A once its approval is given, then answers "done"."""

    def model(request: ModelRequest) -> AssistantMessage:
        if last_tool_results(request):
            return AssistantMessage(content="done")
        call = ToolCall(id="r", name="refund", arguments={"order": "A"})
        return AssistantMessage(tool_calls=(call,))

    agent = Agent(
        id="refunder", model=FunctionModel(model, name=model_name), instructions="",
        tools=[refund],
    )  # fmt: skip
    return AgentRegistration(agent, version="1")


async def _asgi_post(app: Any, path: str, body: Any, *, peer: str) -> int:
    """A tokenless JSON POST naming `Host: localhost`, handed to `app` as from `peer` (for a
    machine with no network address of its own to send it from)."""
    data = json.dumps(body).encode()
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "client": (peer, 40000), "server": ("192.0.2.10", 80),
        "headers": [
            (b"host", b"localhost"), (b"content-type", b"application/json"),
            (b"content-length", str(len(data)).encode()),
        ],
    }  # fmt: skip
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": data, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return int(next(m["status"] for m in sent if m["type"] == "http.response.start"))


def _lan_address() -> str:
    """This machine's address on its network (not loopback), as a peer there reaches it."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the route
        address: str = probe.getsockname()[0]
    finally:
        probe.close()
    return address


async def _raw_post(address: str, port: int, path: str, body: Any, host: str) -> int:
    """A tokenless JSON POST from this machine's `address`, naming `host`."""
    reader, writer = await asyncio.open_connection(address, port)
    data = json.dumps(body).encode()
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
        + data
    )
    raw = await reader.read()
    writer.close()
    return int(raw.split()[1])


class TestMountedApps:
    """durably's ASGI apps mounted in an app of the user's: a tokenless one trusted the
    `Host` header, which any caller sets, and `pay` ran for a request from the network."""

    def test_a_tokenless_app_must_say_it_serves_loopback_only(self, client: DurableClient) -> None:
        with pytest.raises(DurablyError, match="loopback_only=True"):
            live_app(client)
        with pytest.raises(DurablyError, match="loopback_only=True"):
            codec_app(EncryptionCodec(EncryptionKeys({"a": bytes(32)})))

    async def test_a_request_from_the_network_naming_localhost_is_refused(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        await runtimes.start([_refunder("web.mounted")])
        run = await client.start_run("refunder", "refund A")
        snap = await wait_for_status(run, RunStatus.WAITING)
        assert snap.interaction is not None
        approve = {
            "interaction_id": snap.interaction.id,
            "response": {"type": "tool-approval", "approved": True},
        }
        app = Starlette(routes=[Mount("/durably", live_app(client, loopback_only=True))])
        path = f"/durably/runs/{run.run_id}/respond"

        async with AsgiServer(app, host="0.0.0.0", port=0, what="a user's app") as server:
            lan = _lan_address()
            if ipaddress.ip_address(lan).is_loopback:  # no network here: the peer it names
                refused = await _asgi_post(app, path, approve, peer="198.51.100.7")
            else:
                refused = await _raw_post(lan, server.port, path, approve, host="localhost")
            assert refused == 403
            assert (await run.snapshot()).status == RunStatus.WAITING
            local = await _raw_post("127.0.0.1", server.port, path, approve, host="localhost")
            assert local == 200
        assert (await run.result()).output == "done"


class TestRequestBodies:
    """`durably serve` reads what any client sends it."""

    async def test_a_huge_body_is_refused_before_it_is_read_whole(
        self, client: DurableClient
    ) -> None:
        """A 300 MiB POST took the server from 85 MB to 691 MB before its 1 MiB check."""
        async with LiveServer(client, port=0) as server:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(
                f"POST /runs/r/respond HTTP/1.1\r\nHost: localhost:{server.port}\r\n"
                "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
            )
            chunk = b"%x\r\n%s\r\n" % (2**16, b"x" * 2**16)
            sent = 0

            async def send() -> None:
                nonlocal sent
                while sent < 300 * 2**20:
                    writer.write(chunk)
                    await writer.drain()
                    sent += 2**16

            sending = asyncio.create_task(send())
            status = int((await reader.readline()).split()[1])
            sending.cancel()
            writer.close()

        assert status == 413
        assert sent < 16 * 2**20  # it stopped reading at its limit

    async def test_json_nested_past_the_decoder_gets_a_400_not_a_500(
        self, client: DurableClient
    ) -> None:
        async with LiveServer(client, port=0) as server:
            status, answer = await _post_raw_body(
                server.port, "/runs/r/respond", b"[" * 100_000 + b"]" * 100_000
            )
        assert status == 400 and "nested too deeply" in answer["error"]


async def _post_raw_body(port: int, path: str, data: bytes) -> tuple[int, Any]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: localhost:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
        + data
    )
    raw = await reader.read()
    writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload)
