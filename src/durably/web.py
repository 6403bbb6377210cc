"""Live events over HTTP (SPEC section 15): Server-Sent Events for browsers and apps.

`live_app(client)` is an ASGI app (Starlette; mount it in FastAPI or
Starlette, or run it with `durably serve`):

    GET  /runs/{run_id}/events         Server-Sent Events of a run (`RunHandle.events`)
    GET  /sessions/{session_id}/events the same for a session and each of its runs
    GET  /runs/{run_id}/watch          a small page that shows a run live
    POST /runs/{run_id}/respond        {"interaction_id", "response"} or
                                       {"responses": {id: response, ...}} (all or none)
    POST /agents/{agent_id}/agui       AG-UI: a RunAgentInput in, its events out
                                       (`durably.agui`; the `agui` extra)

Each committed event is an SSE message whose `id` is its offset and whose
`event` is its type, with the event as JSON in `data`; the model's text
pieces come as `text_delta` messages without an `id`. A browser's
`EventSource` reconnects with `Last-Event-ID` and misses and repeats no
committed event (`?after=OFFSET` does the same by hand).

However many browsers watch a run, the app follows it once: one follower
per run or session, shared by every connection, kept a minute after the
last one leaves. Followers read by query, so watching records nothing in
the run's history.

Who may call it: it shows what runs say and answers approvals, so it
needs named bearer tokens (`tokens={"alice": "..."}`; `Authorization:
Bearer ...`, or `?token=` for `EventSource`, which cannot set headers) and
records the token's name as the responder of every response made through
it. Without tokens it serves only requests addressed to this machine
(loopback), as the person at it ("local").
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from collections.abc import AsyncIterator, Mapping
from functools import partial
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from durably._http import (
    AsgiServer,
    BodyTooLarge,
    from_loopback,
    is_loopback,
    read_body,
    tokenless,
)
from durably.client import DurableClient
from durably.contract import LiveItem, SessionLiveEvent
from durably.errors import DurablyError, RunNotFoundError

__all__ = ["TOKENS_ENV", "LiveServer", "live_app", "parse_tokens"]

TOKENS_ENV = "DURABLY_WEB_TOKENS"
"""`name=token,name=token`: who may call `durably serve`, and the name each response
made with that token records."""

_KEEP_ALIVE_S = 15.0
# A follower no connection watches is kept this long (a reload reconnects to it).
_LINGER_S = 60.0
# Items a shared follower keeps for connections that resume; older resumes read anew.
_KEPT = 5_000
_MAX_BODY = 2**20
_log = logging.getLogger("durably.web")


def parse_tokens(text: str) -> dict[str, str]:
    """`name=token,name=token` as a mapping, or a `DurablyError` saying what is wrong."""
    tokens: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, token = part.partition("=")
        if not sep or not name.strip() or len(token.strip()) < 16:
            raise DurablyError(
                f"{TOKENS_ENV} holds name=token pairs separated by commas, each token at "
                "least 16 characters (a long random secret); one entry is not"
            )
        tokens[name.strip()] = token.strip()
    return tokens


class _Feed:
    """One follower of one run or session, shared by every connection watching it."""

    def __init__(self, source: AsyncIterator[LiveItem], kind: str, after: int | None) -> None:
        # What it follows, and from where: a feed started after an offset has nothing
        # before it for a connection that wants more.
        self.kind = kind
        self.after = after
        self.shared = True
        self.items: list[LiveItem] = []
        self.dropped = 0  # items let go from the front (past `_KEPT`)
        self.done = False
        self.error: str | None = None
        self.watchers = 0
        self.idle_since: float | None = None
        self._changed = asyncio.Condition()
        self._task = asyncio.create_task(self._pump(source))

    async def _pump(self, source: AsyncIterator[LiveItem]) -> None:
        try:
            async for item in source:
                async with self._changed:
                    self.items.append(item)
                    if len(self.items) > _KEPT:
                        self.dropped += len(self.items) - _KEPT
                        del self.items[: len(self.items) - _KEPT]
                    self._changed.notify_all()
        except DurablyError as err:
            self.error = str(err)
        except Exception as err:
            _log.warning("a live follower stopped: %s", err)
            self.error = f"{type(err).__name__}: {err}"
        finally:
            async with self._changed:
                self.done = True
                self._changed.notify_all()

    def covers(self, after: int | None) -> bool:
        """Whether a connection resuming after `after` finds everything it needs here."""
        if self.after is not None and (after is None or after < self.after):
            return False  # it started later than this connection wants
        if self.dropped == 0:
            return True
        first = next((i for i in self.items if self._resumable(i)), None)
        return after is not None and first is not None and first.offset <= after + 1

    def _resumable(self, item: LiveItem) -> bool:
        """Whether `item`'s offset is the one `Last-Event-ID` counts: a run's events, or a
        session's own (its runs' events carry their run's offsets)."""
        if self.kind == "session":
            return isinstance(item.event, SessionLiveEvent)
        return item.event.type != "text_delta"

    async def read(self, after: int | None) -> AsyncIterator[LiveItem]:
        """The items after offset `after`, then each new one, until the follower ends. In
        a session's feed, everything after the first session event past `after`."""
        seen = self.dropped  # items seen, counted from the feed's first
        past = after is None
        while True:
            async with self._changed:
                await self._changed.wait_for(partial(self._past, seen))
                new = self.items[max(seen - self.dropped, 0) :]
                seen = self.dropped + len(self.items)
                done = self.done
            for item in new:
                if not past and self._resumable(item) and after is not None:
                    past = item.offset > after
                if past and (self.kind == "session" or after is None or item.offset > after):
                    yield item
            if done and seen >= self.dropped + len(self.items):
                return

    def _past(self, seen: int) -> bool:
        return self.dropped + len(self.items) > seen or self.done

    def stop(self) -> None:
        self._task.cancel()


class _Hub:
    """The shared followers, by what they follow; counts how many it ever started."""

    def __init__(self, client: DurableClient) -> None:
        self.client = client
        self.feeds: dict[str, _Feed] = {}
        self.started = 0

    async def feed(self, kind: str, ident: str, after: int | None) -> _Feed:
        key = f"{kind}/{ident}"
        existing = self.feeds.get(key)
        if existing is not None and not existing.error and existing.covers(after):
            return existing
        if kind == "session":
            source = (await self.client.get_session(ident)).events(after=after)
        else:
            source = (await self.client.get_run(ident)).events(after=after)
        feed = _Feed(source, kind, after)
        self.started += 1
        if existing is None or existing.error:
            self.feeds[key] = feed
        else:  # this connection's alone: it stops when the connection ends
            feed.shared = False
        return feed

    def sweep(self, now: float) -> None:
        for key, feed in list(self.feeds.items()):
            idle = feed.watchers == 0 and feed.idle_since is not None
            if idle and now - feed.idle_since > _LINGER_S:  # type: ignore[operator]
                feed.stop()
                del self.feeds[key]


def live_app(
    client: DurableClient,
    *,
    tokens: Mapping[str, str] | None = None,
    loopback_only: bool = False,
) -> Starlette:
    """The ASGI app serving live events and responses (see the module docstring).

    Args:
        client: The durably client it reads runs and answers them with.
        tokens: Bearer tokens by name.
        loopback_only: Without tokens, required: serve requests from this machine
            only (peer and `Host` both loopback), answering as "local". Unsafe
            behind a proxy on the same machine, whose every request is loopback's.

    .. versionchanged:: Unreleased
       Without tokens it needs `loopback_only=True`; it checked only the `Host`
       header, which a caller on the network sets as it likes.
    """
    if not tokens:
        tokenless("live_app", loopback_only)
    handlers = _Handlers(client, tokens or {})
    app = Starlette(
        routes=[
            Route("/runs/{ident:path}/events", handlers.events),
            Route("/sessions/{ident:path}/events", handlers.events),
            Route("/runs/{ident:path}/respond", handlers.respond, methods=["POST"]),
            Route("/runs/{ident:path}/watch", handlers.watch),
            Route("/agents/{ident}/agui", handlers.agui, methods=["POST"]),
        ]
    )
    app.state.hub = handlers.hub
    return app


class _Handlers:
    def __init__(self, client: DurableClient, tokens: Mapping[str, str]) -> None:
        self.client = client
        self.expected = {name: token.encode() for name, token in tokens.items()}
        self.hub = _Hub(client)

    def identity(self, request: Request) -> str | Response:
        """Who calls (a token's name, or "local"), or the response refusing the call.

        A page on another site must not act through a browser that can reach this
        server (a tokenless one on loopback, above all): requests a browser marks
        cross-site are refused, and a POST must be JSON, which a page can only send
        to another origin after a CORS preflight this server never grants."""
        if request.headers.get("sec-fetch-site") == "cross-site":
            return _error(403, "cross-site requests are refused")
        if request.method == "POST":
            kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind != "application/json":
                return _error(415, "send the body as JSON (Content-Type: application/json)")
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        given = given or request.query_params.get("token", "")
        if not self.expected:
            if from_loopback(request):
                return "local"
            return _error(403, "this server has no tokens, so it serves requests to localhost only")
        for name, token in self.expected.items():
            if given and hmac.compare_digest(given.encode(), token):
                return name
        return _error(
            401,
            "missing or wrong token: send `Authorization: Bearer TOKEN` (or ?token=TOKEN)",
            headers={"WWW-Authenticate": "Bearer"},
        )

    async def events(self, request: Request) -> Response:
        who = self.identity(request)
        if isinstance(who, Response):
            return who
        kind = "session" if request.url.path.startswith("/sessions/") else "run"
        after = _after(request)
        if isinstance(after, Response):
            return after
        try:
            feed = await self.hub.feed(kind, request.path_params["ident"], after)
        except RunNotFoundError as err:
            return _error(404, str(err))
        except DurablyError as err:
            return _error(422, str(err))
        return StreamingResponse(
            _sse(feed, after, self.hub, kind),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def respond(self, request: Request) -> Response:
        """A response (or several, all or none) recorded as the caller's."""
        who = self.identity(request)
        if isinstance(who, Response):
            return who
        data = await _json_body(request)
        if isinstance(data, Response):
            return data
        try:
            run = await self.client.get_run(request.path_params["ident"])
            if isinstance(data.get("responses"), dict):
                accepted = await run.respond_many(data["responses"], responder=who)
                return JSONResponse([a.model_dump(mode="json") for a in accepted])
            one = await run.respond(
                str(data.get("interaction_id", "")), data.get("response") or {}, responder=who
            )
            return JSONResponse(one.model_dump(mode="json"))
        except RunNotFoundError as err:
            return _error(404, str(err))
        except (DurablyError, ValidationError) as err:
            return _error(409 if "Conflict" in type(err).__name__ else 422, str(err))

    async def agui(self, request: Request) -> Response:
        """AG-UI: a `RunAgentInput` in, its event stream out (see `durably.agui`)."""
        who = self.identity(request)
        if isinstance(who, Response):
            return who
        try:
            from ag_ui.encoder import EventEncoder

            from durably.agui import agui_events
        except ImportError:
            return _error(501, "AG-UI needs the `agui` extra: pip install 'durably[agui]'")
        data = await _json_body(request)
        if isinstance(data, Response):
            return data
        encoder = EventEncoder()
        try:
            events = agui_events(self.client, request.path_params["ident"], data, who)
            first = await anext(events)  # a RunAgentInput that does not parse: 422
        except ValidationError as err:
            return _error(422, f"the body is not an AG-UI RunAgentInput: {err}")

        async def stream() -> AsyncIterator[str]:
            yield encoder.encode(first)
            async for event in events:
                yield encoder.encode(event)

        return StreamingResponse(
            stream(),
            media_type=encoder.get_content_type(),
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def watch(self, request: Request) -> Response:
        who = self.identity(request)
        return who if isinstance(who, Response) else HTMLResponse(_WATCH_PAGE)


async def _json_body(request: Request) -> dict[str, Any] | Response:
    try:
        body = await read_body(request, _MAX_BODY)
    except BodyTooLarge:
        return _error(413, f"the body is over {_MAX_BODY} bytes")
    except ClientDisconnect:
        return _error(400, "the client disconnected before sending the whole body")
    try:
        data = json.loads(body)
    except RecursionError:  # nested deeper than the JSON decoder goes: no answer reads so
        return _error(400, "the body is JSON nested too deeply; send a flat object")
    except ValueError:
        return _error(400, "the body is not JSON")
    if not isinstance(data, dict):
        return _error(400, 'send {"interaction_id", "response"} or {"responses": {...}}')
    return data


def _after(request: Request) -> int | Response | None:
    raw = request.headers.get("last-event-id") or request.query_params.get("after")
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        return _error(400, f"Last-Event-ID / after must be an offset (a number), got {raw[:40]!r}")


async def _sse(feed: _Feed, after: int | None, hub: _Hub, kind: str) -> AsyncIterator[bytes]:
    """The feed as Server-Sent Events, with a comment line while nothing happens. An event
    has an `id` (its offset) when `Last-Event-ID` can resume from it: a run's committed
    events, or a session's own (its runs' events are replayed from a session offset)."""
    feed.watchers += 1
    items = feed.read(after).__aiter__()
    pending: asyncio.Task[LiveItem] | None = None
    try:
        while True:
            # One task per item, waited on with a timeout but never cancelled by it:
            # cancelling the generator's `anext` would end the generator.
            pending = pending or asyncio.ensure_future(anext(items))
            done, _ = await asyncio.wait({pending}, timeout=_KEEP_ALIVE_S)
            if not done:
                yield b": keep-alive\n\n"
                continue
            task, pending = pending, None
            try:
                item = task.result()
            except StopAsyncIteration:
                if feed.error:
                    yield _message("error", {"error": feed.error}, None)
                return
            event = item.event
            if kind == "session":
                resumable = isinstance(event, SessionLiveEvent)
            else:
                resumable = event.type != "text_delta"
            data = event.model_dump(mode="json")
            yield _message(event.type, data, item.offset if resumable else None)
    finally:
        if pending is not None:
            pending.cancel()
        feed.watchers -= 1
        if feed.watchers == 0:
            feed.idle_since = asyncio.get_running_loop().time()
            if not feed.shared:
                feed.stop()
        hub.sweep(asyncio.get_running_loop().time())
        with contextlib.suppress(Exception):
            await items.aclose()  # type: ignore[attr-defined]


def _message(event: str, data: Any, offset: int | None) -> bytes:
    lines = [f"event: {event}"]
    if offset is not None:
        lines.append(f"id: {offset}")
    lines.append("data: " + json.dumps(data, ensure_ascii=True, separators=(",", ":")))
    return ("\n".join(lines) + "\n\n").encode()


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class LiveServer(AsgiServer):
    """`live_app` served by uvicorn in this event loop (`durably serve`).

    Off loopback it refuses to start without tokens: it shows runs and
    answers approvals.
    """

    def __init__(
        self,
        client: DurableClient,
        *,
        host: str = "127.0.0.1",
        port: int = 8090,
        tokens: Mapping[str, str] | None = None,
    ) -> None:
        if not tokens and not is_loopback(host):
            raise DurablyError(
                f"refusing to serve live events on {host} without tokens: anyone who can "
                f"reach it could watch every run and answer its approvals. Set {TOKENS_ENV} "
                "to name=token pairs, or listen on 127.0.0.1"
            )
        super().__init__(
            live_app(client, tokens=tokens, loopback_only=not tokens),
            host=host,
            port=port,
            what="the live events server",
        )


# A run, live, in a browser: its committed events and the model's text as it is written.
_WATCH_PAGE = """<!doctype html>
<meta charset="utf-8">
<title>durably: a run, live</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 2em; max-width: 60em; }
#text { white-space: pre-wrap; border-left: 3px solid #999; padding-left: 1em; }
#events { color: #555; font: 12px monospace; }
</style>
<h1 id="title">Connecting…</h1>
<div id="text"></div>
<ol id="events"></ol>
<script>
const parts = location.pathname.split("/");
const run = decodeURIComponent(parts[2]);
document.getElementById("title").textContent = run;
const query = new URLSearchParams(location.search);
const token = query.get("token");
const url = "events" + (token ? "?token=" + encodeURIComponent(token) : "");
const source = new EventSource(url);
const text = document.getElementById("text");
const events = document.getElementById("events");
source.addEventListener("text_delta", (m) => {
  text.textContent += JSON.parse(m.data).text;
});
for (const type of ["agent_pinned", "model_started", "model_completed", "tool_started",
    "tool_completed", "tool_error", "waiting", "approved", "denied", "needs_attention",
    "run_failed", "retry_wait", "continued_as_new", "run_completed", "run_cancelled"]) {
  source.addEventListener(type, (m) => {
    const e = JSON.parse(m.data);
    const li = document.createElement("li");
    li.textContent = `${m.lastEventId} ${e.type} ${e.operation || ""}`;
    li.className = e.type;
    events.appendChild(li);
    if (type === "model_started") text.textContent += "\\n";
    if (type === "run_completed" || type === "run_cancelled") {
      source.close();
      document.body.dataset.done = type;
    }
  });
}
</script>
"""
