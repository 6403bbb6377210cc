"""The MCP servers durably's tests run, and how to start them.

- The reference servers from npm, `server-filesystem` and `server-memory`, at
  the exact versions of `tests/mcp/package-lock.json`, installed by
  `npm ci --prefix tests/mcp` (.ci/run does it). Tests that run them carry
  `NEEDS_REFERENCE_SERVERS`, which skips them when they are not installed
  (outside CI; under CI a missing install fails loudly instead).
- `tests/mcp_test_server.py`, a server on the Python SDK whose tools record the
  operation id of each call (`python_server`).
- `tests/mcp_slow_proxy.py`, a relay that delays the results of chosen tools,
  put in front of any of them (`slow_proxy`).

Each function returns a `ServerCommand`: the command, arguments and environment
to start a server over stdio, whatever client starts it. `raw_session` opens
one with the `mcp` SDK's own client, to look at a server without durably.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

TESTS = Path(__file__).resolve().parent
NPM_BIN = TESTS / "mcp" / "node_modules" / ".bin"
FILESYSTEM_SERVER = NPM_BIN / "mcp-server-filesystem"
MEMORY_SERVER = NPM_BIN / "mcp-server-memory"
TEST_SERVER = TESTS / "mcp_test_server.py"
SLOW_PROXY = TESTS / "mcp_slow_proxy.py"

OPERATION_ID_KEY = "io.durably/operation_id"
"""The request `_meta` key durably sends its operation id under."""

INSTALL_HINT = "run `npm ci --prefix tests/mcp`; .ci/run does"


def reference_servers_installed() -> bool:
    """Whether `npm ci --prefix tests/mcp` has installed both reference servers."""
    return FILESYSTEM_SERVER.exists() and MEMORY_SERVER.exists()


NEEDS_REFERENCE_SERVERS = pytest.mark.skipif(
    not reference_servers_installed() and not os.environ.get("CI"),
    reason=f"the MCP reference servers (npm) are not installed: {INSTALL_HINT}",
)


@dataclass(frozen=True)
class ServerCommand:
    """How to start one MCP server over stdio.

    `env` holds only what the server needs on top of the client's default
    environment (the `mcp` SDK passes HOME, PATH and a few more, then `env`).
    """

    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    def stdio(self) -> StdioServerParameters:
        """The `mcp` SDK's parameters for `stdio_client`."""
        return StdioServerParameters(command=self.command, args=list(self.args), env=dict(self.env))


def _reference(path: Path) -> str:
    if not path.exists():
        raise RuntimeError(f"{path} is missing: {INSTALL_HINT}")
    return str(path)


def filesystem_server(*directories: Path) -> ServerCommand:
    """The reference filesystem server, allowed to read and write `directories` only."""
    return ServerCommand(_reference(FILESYSTEM_SERVER), tuple(str(d) for d in directories))


def memory_server(memory_file: Path) -> ServerCommand:
    """The reference knowledge-graph server, storing its graph in `memory_file` (JSONL)."""
    return ServerCommand(
        _reference(MEMORY_SERVER), env={"MEMORY_FILE_PATH": str(Path(memory_file).resolve())}
    )


def python_server(
    *,
    log: Path | None = None,
    state: Path | None = None,
    slow_seconds: float | None = None,
    variant: str | None = None,
) -> ServerCommand:
    """`tests/mcp_test_server.py` on this interpreter, configured as its docstring says.

    Args:
        log: the file each call appends its JSON line to (`read_lines` reads it).
        state: the JSON file of applied effects, shared by every server started
            with it (`read_state` reads it); without it, state dies with the process.
        slow_seconds: how long `record` sleeps after applying its write.
        variant: "changed" for the drifted `lookup`.
    """
    env = {"PYTHONUNBUFFERED": "1"}
    if log is not None:
        env["MCP_TEST_LOG"] = str(log)
    if state is not None:
        env["MCP_TEST_STATE"] = str(state)
    if slow_seconds is not None:
        env["MCP_TEST_SLOW_SECONDS"] = str(slow_seconds)
    if variant is not None:
        env["MCP_TEST_VARIANT"] = variant
    return ServerCommand(sys.executable, (str(TEST_SERVER),), env)


def slow_proxy(
    server: ServerCommand, *, slow_tools: Iterable[str], log: Path, delay: float = 3.0
) -> ServerCommand:
    """`server` behind `tests/mcp_slow_proxy.py`, which delays `slow_tools`' results by `delay`.

    Each call of a slow tool appends `{"name", "operation_id", "arguments"}` to
    `log` as it reaches the server.
    """
    env = {
        **server.env,
        "MCP_PROXY_SLOW_TOOLS": ",".join(slow_tools),
        "MCP_PROXY_LOG": str(log),
        "MCP_PROXY_DELAY": str(delay),
    }
    return ServerCommand(sys.executable, (str(SLOW_PROXY), "--", server.command, *server.args), env)


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a test server's or proxy's log; none if it was never written."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_state(path: Path) -> dict[str, Any]:
    """The test server's applied effects: `{"values": {...}, "applied_operations": [...]}`."""
    if not path.exists():
        return {"values": {}, "applied_operations": []}
    state: dict[str, Any] = json.loads(path.read_text())
    return state


@contextlib.asynccontextmanager
async def raw_session(server: ServerCommand, errlog: Path) -> AsyncIterator[ClientSession]:
    """An initialized `mcp` client session with `server`, its stderr appended to `errlog`.

    No elicitation, sampling or roots callback: the client declares none of them.
    """
    with errlog.open("a") as err:
        async with (
            stdio_client(server.stdio(), errlog=err) as (read, write),
            ClientSession(read, write, read_timeout_seconds=30) as session,
        ):
            await session.initialize()
            yield session
