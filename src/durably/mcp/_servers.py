"""Where an MCP server runs, and one open session to it per worker.

A session is opened once per worker process and server (starting a stdio
server costs about 0.1 s, a call well under a millisecond) and shared by
every call. The SDK's transports are async context managers that must be
left in the task that entered them, so each session lives in a task of its
own (`_Connection._hold`); a session whose server died is opened again on
the next call.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from durably.errors import DurablyError
from durably.mcp._lock import LockedTool, tool_digest

__all__ = ["POOL", "HTTPServer", "MCPServerError", "StdioServer", "refused", "session_lost"]

_OPEN_TIMEOUT_S = 30.0
# The `_meta` key a tools/call request carries the call's operation id under.
OPERATION_ID_META = "io.durably/operation_id"


class MCPServerError(DurablyError):
    """An MCP server could not be started or reached (the message names it)."""


@dataclass(frozen=True)
class StdioServer:
    """A server durably starts as a child process and talks to over stdin/stdout.

    `env` is added to a minimal environment (the SDK passes on only `HOME`,
    `PATH` and a few others): name what the server needs.
    """

    command: str
    args: Sequence[str] = ()
    env: Mapping[str, str] | None = field(default=None, repr=False)  # may hold keys
    cwd: str | None = None

    def describe(self) -> str:
        return " ".join([self.command, *self.args])


@dataclass(frozen=True)
class HTTPServer:
    """A server reached over streamable HTTP at `url`, with these headers."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # may hold tokens

    def describe(self) -> str:
        return self.url


Server = StdioServer | HTTPServer


def _key(server: Server) -> tuple[Any, ...]:
    if isinstance(server, StdioServer):
        env = tuple(sorted((server.env or {}).items()))
        return ("stdio", server.command, tuple(server.args), env, server.cwd)
    return ("http", server.url, tuple(sorted(server.headers.items())))


# How long a streamable-HTTP server's tool listing is trusted before a call re-reads it:
# such a server can be upgraded in place under a live session.
_HTTP_LISTING_TTL_S = 30.0
# Answers to a request that only a server which refused it before running it gives
# (its arguments, the method, what the client supports): the call did not happen.
_REFUSED_CODES = frozenset({-32602, -32601, -32600, -32020, -32021, -32022, -32042})
# -32600 the client itself makes up about a response it could not read: not a refusal.
_MADE_UP_BY_THE_CLIENT = ("202", "Unexpected content type")
# What a streamable-HTTP server answers once it no longer knows the session (restarted,
# redeployed, reaped when idle): it refused the request before running it.
_SESSION_LOST = ("Session not found", "Session terminated")


def refused(code: int, message: str) -> bool:
    """Whether an MCP error says the server refused the request before running it (a
    definite outcome), as opposed to a failure after which the call may have run."""
    if code not in _REFUSED_CODES:
        return False
    return not (code == -32600 and any(m in message for m in _MADE_UP_BY_THE_CLIENT))


def session_lost(message: str) -> bool:
    return any(m in message for m in _SESSION_LOST)


class _Connection:
    """One open session to one server, held by its own task until closed."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.session: Any = None
        self.tools: dict[str, LockedTool] = {}
        self.digests: dict[str, str] = {}  # each tool's `tool_digest`, as listed
        self.server_info: dict[str, Any] = {}
        self.listed_at = 0.0
        self._stale = False  # the server said its tool list changed
        self._in_flight = 0
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._error: BaseException | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        """Open, listed, and its transport still up (a server that exited while idle has
        closed it: a call would fail before it is sent, so the pool opens a new one)."""
        return (
            self._task is not None
            and not self._task.done()
            and self._error is None
            and self._ready.is_set()
            and self.session is not None
            # The SDK 2.x dispatcher's own flag: set once the transport closed.
            and not getattr(getattr(self.session, "_dispatcher", None), "_closed", False)
        )

    async def open(self) -> None:
        self._task = asyncio.create_task(self._hold(), name=f"durably-mcp {self.server.describe()}")
        try:
            await asyncio.wait_for(asyncio.shield(self._ready.wait()), _OPEN_TIMEOUT_S)
        except TimeoutError:
            await self.close()
            raise MCPServerError(
                f"MCP server `{self.server.describe()}` did not answer within "
                f"{_OPEN_TIMEOUT_S:g} s of starting"
            ) from None
        except asyncio.CancelledError:
            await self.close()  # no half-open session for the next caller
            raise
        if self._error is not None:
            raise MCPServerError(
                f"MCP server `{self.server.describe()}` could not be started or reached: "
                f"{_describe(self._error)}"
            ) from None

    async def _hold(self) -> None:
        import mcp_types
        from mcp import ClientSession

        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(_transport(self.server, stack))
                # No elicitation callback: the client declares no elicitation support,
                # and the SDK answers a server that asks anyway "Elicitation not supported".
                session = await stack.enter_async_context(
                    ClientSession(
                        read,
                        write,
                        client_info=mcp_types.Implementation(name="durably", version="0"),
                        message_handler=self._notified,
                    )
                )
                init = await session.initialize()
                self.server_info = init.server_info.model_dump(mode="json", exclude_none=True)
                self.session = session
                await self._list()
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:  # a group, from anyio, when the server dies
            self._error = exc
            self._ready.set()
            if isinstance(exc, asyncio.CancelledError):
                raise

    async def _notified(self, message: Any) -> None:
        import mcp_types

        if isinstance(message, mcp_types.ToolListChangedNotification):
            self._stale = True

    async def _list(self) -> None:
        self.tools = {t.name: t for t in await list_tools(self.session)}
        self.digests = {name: tool_digest(t) for name, t in self.tools.items()}
        self.listed_at = time.monotonic()
        self._stale = False

    async def current_digests(self) -> dict[str, str]:
        """Each tool's digest as the server serves it now: listed again if it said its tools
        changed (or, over HTTP, if the listing is old)."""
        old = time.monotonic() - self.listed_at > _HTTP_LISTING_TTL_S
        if self._stale or (isinstance(self.server, HTTPServer) and old):
            await self._list()
        return self.digests

    async def call(self, name: str, arguments: dict[str, Any], operation_id: str) -> Any:
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED

        self._in_flight += 1
        try:
            return await self.session.call_tool(
                name, arguments, meta={OPERATION_ID_META: operation_id}
            )
        except MCPError as err:
            if err.code == CONNECTION_CLOSED or session_lost(err.error.message):
                self._error = self._error or err  # the next call opens a new session
            raise
        finally:
            self._in_flight -= 1
            if self._error is not None and self._in_flight == 0:
                self._stop.set()  # closed once no other call of it is in flight

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), 10)
            except asyncio.CancelledError:
                raise
            except Exception:  # its server's failure, already reported
                return


@contextlib.asynccontextmanager
async def _transport(server: Server, stack: contextlib.AsyncExitStack) -> Any:
    if isinstance(server, StdioServer):
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        params = StdioServerParameters(
            command=server.command,
            args=list(server.args),
            env=dict(server.env) if server.env is not None else None,
            cwd=server.cwd,
        )
        async with stdio_client(params, errlog=sys.stderr) as streams:
            yield streams
        return
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    http = await stack.enter_async_context(
        httpx2.AsyncClient(headers=dict(server.headers), timeout=httpx2.Timeout(30.0, read=None))
    )
    async with streamable_http_client(server.url, http_client=http) as streams:
        yield streams[0], streams[1]


async def list_tools(session: Any) -> list[LockedTool]:
    """Every tool the server lists, page by page, as the lock file holds them."""
    import mcp_types

    tools: list[LockedTool] = []
    cursor: str | None = None
    while True:
        page = await session.list_tools(params=mcp_types.PaginatedRequestParams(cursor=cursor))
        for t in page.tools:
            tools.append(
                LockedTool(
                    name=t.name,
                    title=t.title,
                    description=t.description or "",
                    input_schema=dict(t.input_schema),
                    output_schema=dict(t.output_schema) if t.output_schema else None,
                    annotations=(
                        t.annotations.model_dump(mode="json", by_alias=True, exclude_none=True)
                        if t.annotations
                        else {}
                    ),
                )
            )
        cursor = page.next_cursor
        if not cursor:
            return tools


class ServerPool:
    """The worker's open sessions, one per server (and event loop)."""

    def __init__(self) -> None:
        self._open: dict[tuple[Any, ...], _Connection] = {}
        self._locks: dict[tuple[Any, ...], asyncio.Lock] = {}

    async def connection(self, server: Server) -> _Connection:
        loop = asyncio.get_running_loop()
        key = (id(loop), *_key(server))
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            conn = self._open.get(key)
            if conn is not None and conn.alive:
                return conn
            if conn is not None:  # its server died: open it again
                await conn.close()
            conn = _Connection(server)
            self._open[key] = conn
            await conn.open()
            return conn

    async def close(self, servers: Iterable[Server] | None = None) -> None:
        """Close the sessions of this event loop (to `servers`, else all of them)."""
        loop = asyncio.get_running_loop()
        keys = None if servers is None else {(id(loop), *_key(s)) for s in servers}
        mine = [k for k, c in self._open.items() if c.loop is loop and (keys is None or k in keys)]
        closing = [self._open.pop(k) for k in mine]
        for key in mine:
            self._locks.pop(key, None)
        await asyncio.gather(*(c.close() for c in closing))


# One pool per worker process.
POOL = ServerPool()


def _describe(exc: BaseException) -> str:
    """The innermost cause of a (possibly grouped) failure, in one line."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"
