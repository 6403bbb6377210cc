"""An MCP server for durably's tests, on the `mcp` SDK: `python tests/mcp_test_server.py`.

It serves stdio and is configured per start by environment variables (start it
through `tests.mcp_servers.python_server`, which sets them):

- `MCP_TEST_LOG`: a file that gets one JSON line per tool call,
  `{"tool", "operation_id", "key", "value", "applied"}`; the operation id is
  the request's `_meta["io.durably/operation_id"]` (null when absent).
- `MCP_TEST_STATE`: a JSON file holding the effects applied so far,
  `{"values": {key: value}, "applied_operations": [operation_id, ...]}`.
  Without it the state lives in this process only.
- `MCP_TEST_SLOW_SECONDS`: `record` sleeps this long after applying its write,
  so a test can kill the caller while the call is in flight.
- `MCP_TEST_VARIANT=changed`: `lookup` has another description and one more
  required argument (`reason`), for drift tests.

Tools:

- `record(key, value)`: a write, idempotent by annotation and in fact: it is
  applied at most once per operation id (a call without one always applies).
- `lookup(key)`: read-only; an unknown key is an `isError` result, "no such key".
- `erase(key)`: no annotations, so MCP's defaults apply (destructive, not
  idempotent); deletes the key.
- `ask_person(question)`: asks the client through elicitation; a client that
  does not support it gets an error.
- `crash()`: the server process exits at once, mid-call.

With `MCP_TEST_HTTP_PORT` it serves streamable HTTP on 127.0.0.1 instead (at
`/mcp`), and an `X-Tenant` request header is logged with the operation id.

Several processes may share one state file (a killed worker's server and its
successor's), so every read-modify-write holds an exclusive lock on
`MCP_TEST_STATE + ".lock"`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import BaseModel

OPERATION_ID_KEY = "io.durably/operation_id"

LOG = os.environ.get("MCP_TEST_LOG")
STATE = os.environ.get("MCP_TEST_STATE")
SLOW_SECONDS = float(os.environ.get("MCP_TEST_SLOW_SECONDS") or 0)
VARIANT = os.environ.get("MCP_TEST_VARIANT", "")

server = MCPServer("durably-test-server", version="1.0.0")
_memory: dict[str, Any] = {"values": {}, "applied_operations": []}


def operation_id(ctx: Context) -> str | None:
    """The operation id the client sent in the request's `_meta`, if any (and, over HTTP,
    the `X-Tenant` header it sent, as `operation_id@tenant`)."""
    meta = ctx.request_context.meta or {}
    value = meta.get(OPERATION_ID_KEY)
    tenant = ctx.headers.get("x-tenant") if ctx.headers else None
    if isinstance(value, str) and tenant:
        return f"{value}@{tenant}"
    return value if isinstance(value, str) else None


@contextlib.contextmanager
def state() -> Iterator[dict[str, Any]]:
    """The shared state, locked; what the block leaves in it is saved."""
    if STATE is None:
        yield _memory
        return
    path = Path(STATE)
    with open(f"{STATE}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        current = json.loads(path.read_text()) if path.exists() else {}
        current.setdefault("values", {})
        current.setdefault("applied_operations", [])
        yield current
        scratch = path.with_name(f".{path.name}.{os.getpid()}")
        scratch.write_text(json.dumps(current, indent=1))
        scratch.replace(path)


def log(tool: str, op: str | None, key: str, value: str | None, applied: bool) -> None:
    """Append one line to `MCP_TEST_LOG`."""
    if LOG is None:
        return
    line = {"tool": tool, "operation_id": op, "key": key, "value": value, "applied": applied}
    with open(LOG, "a") as f:
        f.write(json.dumps(line) + "\n")


def apply_record(op: str | None, key: str, value: str) -> None:
    with state() as current:
        applied = op is None or op not in current["applied_operations"]
        if applied:
            current["values"][key] = value
            if op is not None:
                current["applied_operations"].append(op)
        log("record", op, key, value, applied)


def apply_lookup(op: str | None, key: str) -> str | None:
    with state() as current:
        value: str | None = current["values"].get(key)
        log("lookup", op, key, value, False)
        return value


def apply_erase(op: str | None, key: str) -> None:
    with state() as current:
        existed = current["values"].pop(key, None) is not None
        log("erase", op, key, None, existed)


@server.tool(
    annotations=ToolAnnotations(read_only_hint=False, idempotent_hint=True, destructive_hint=False)
)
async def record(key: str, value: str, ctx: Context) -> str:
    """Store value under key, once per operation id."""
    await anyio.to_thread.run_sync(apply_record, operation_id(ctx), key, value)
    if SLOW_SECONDS:
        await anyio.sleep(SLOW_SECONDS)
    return f"recorded {key}"


if VARIANT == "changed":

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def lookup(key: str, reason: str, ctx: Context) -> str:
        """Read the value stored under key, saying why."""
        value = await anyio.to_thread.run_sync(apply_lookup, operation_id(ctx), key)
        if value is None:
            raise ToolError("no such key")
        return value

else:

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def lookup(key: str, ctx: Context) -> str:
        """Read the value stored under key."""
        value = await anyio.to_thread.run_sync(apply_lookup, operation_id(ctx), key)
        if value is None:
            raise ToolError("no such key")
        return value


@server.tool()
async def erase(key: str, ctx: Context) -> str:
    """Delete key (no annotations: MCP's defaults, destructive and not idempotent)."""
    await anyio.to_thread.run_sync(apply_erase, operation_id(ctx), key)
    return f"erased {key}"


class Answer(BaseModel):
    answer: str


@server.tool()
async def ask_person(question: str, ctx: Context) -> str:
    """Ask the person at the client (elicitation) and return their answer."""
    result = await ctx.elicit(question, Answer)
    data = getattr(result, "data", None)
    return f"{result.action}: {data.answer if data is not None else ''}"


@server.tool()
async def crash(ctx: Context) -> str:
    """End this server process at once (a server dying mid-call)."""
    os._exit(3)


if __name__ == "__main__":
    try:
        port = os.environ.get("MCP_TEST_HTTP_PORT")
        if port:  # streamable HTTP at http://127.0.0.1:PORT/mcp
            server.run("streamable-http", host="127.0.0.1", port=int(port))
        else:
            server.run()
    except* BrokenPipeError:
        pass  # the client died (a test killed it): exit without a traceback
