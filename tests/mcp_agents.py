"""Agents whose tools come from MCP servers, for tests/test_mcp.py (in process) and for
the `durably worker` processes its crash tests SIGKILL.

Their model is scripted by the run's input (`steps(...)`): each answer makes the
calls of the next step (all at once), and the last one answers with every result
it read, as JSON. So a run says what it calls, and a restarted worker replays
exactly that.

A worker process builds its registrations from the environment (`registrations`):
`MCP_TEST_DIR` holds the lock files and the files the filesystem server may touch,
and the servers' logs and state; `MCP_PROXY_SLOW` names the filesystem tools whose
results the slow relay holds back, and `MCP_TEST_SLOW_SECONDS` how long the test
server's `record` sleeps after applying.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

from durably import Agent, AgentRegistration, FunctionModel, ModelRequest
from durably.mcp import MCPToolset, StdioServer
from durably.messages import AssistantMessage, ToolCall, ToolResultMessage

from .mcp_servers import ServerCommand, filesystem_server, python_server, slow_proxy

HEARTBEAT = timedelta(seconds=3)


def scripted(request: ModelRequest) -> AssistantMessage:
    """Make the calls of the input's next step, then answer with every result read."""
    first = request.messages[0]
    steps = json.loads(str(getattr(first, "content", "")))["steps"]
    answered = sum(isinstance(m, AssistantMessage) for m in request.messages)
    if answered < len(steps):
        return AssistantMessage(
            tool_calls=tuple(
                ToolCall(id=f"s{answered}c{n}", name=name, arguments=args)
                for n, (name, args) in enumerate(steps[answered], start=1)
            )
        )
    results = [m for m in request.messages if isinstance(m, ToolResultMessage)]
    return AssistantMessage(content=json.dumps([[r.is_error, r.content] for r in results]))


def steps(*calls: list[tuple[str, dict[str, object]]]) -> str:
    """A run's input: each step's calls, made at once; one step after another."""
    return json.dumps({"steps": [[[name, args] for name, args in step] for step in calls]})


def stdio(server: ServerCommand) -> StdioServer:
    return StdioServer(server.command, server.args, env=dict(server.env))


def files_toolset(root: Path, *, slow: tuple[str, ...] = (), trust: bool = True) -> MCPToolset:
    """The reference filesystem server on `root/data`, locked in `root/files.lock.json`;
    `slow` tools' results held back by the relay (logged to `root/proxy.jsonl`)."""
    server = filesystem_server(root / "data")
    if slow:
        delay = float(os.environ.get("MCP_PROXY_DELAY_S", "30"))
        server = slow_proxy(server, slow_tools=slow, log=root / "proxy.jsonl", delay=delay)
    return MCPToolset(
        "files",
        stdio(server),
        lock=root / "files.lock.json",
        trust_annotations=trust,
        # The crash tests call destructive tools without a person in the loop.
        approval={"edit_file": False, "write_file": False},
    )


def records_toolset(
    root: Path,
    *,
    slow_seconds: float | None = None,
    variant: str | None = None,
    approval: dict[str, bool] | None = None,
) -> MCPToolset:
    """The Python test server, its calls logged to `root/server.jsonl` and its effects in
    `root/state.json`, locked in `root/records.lock.json`."""
    server = python_server(
        log=root / "server.jsonl",
        state=root / "state.json",
        slow_seconds=slow_seconds,
        variant=variant,
    )
    return MCPToolset(
        "records",
        stdio(server),
        lock=root / "records.lock.json",
        trust_annotations=True,
        approval=approval,
    )


def registration(agent_id: str, *toolsets: MCPToolset, **settings: object) -> AgentRegistration:
    agent = Agent(
        id=agent_id,
        model=FunctionModel(scripted, name="mcp-scripted"),
        instructions="Call what the input names.",
        tools=[t for toolset in toolsets for t in toolset.tools],
    )
    return AgentRegistration(agent, version="1", heartbeat_timeout=HEARTBEAT, **settings)  # type: ignore[arg-type]


def _from_env() -> list[AgentRegistration]:
    root = os.environ.get("MCP_TEST_DIR")
    if root is None:
        return []
    slow = tuple(t for t in os.environ.get("MCP_PROXY_SLOW", "").split(",") if t)
    seconds = os.environ.get("MCP_TEST_SLOW_SECONDS")
    return [
        registration("files", files_toolset(Path(root), slow=slow)),
        registration(
            "records", records_toolset(Path(root), slow_seconds=float(seconds) if seconds else None)
        ),
    ]


registrations = _from_env()
