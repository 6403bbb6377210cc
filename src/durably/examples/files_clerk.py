"""The files-clerk example: an agent whose tools are an MCP server's.

Its tools are the official MCP filesystem server's (`@modelcontextprotocol/
server-filesystem`, started with `npx`, or the executable `$DURABLY_MCP_FILESYSTEM`
names), allowed one directory: `./.durably/files` (or `$DURABLY_FILES_DIR`). They
are locked in `files_clerk.lock.json` beside this module, and trusted for their
annotations, so reading is `safe`, `write_file` is `idempotent` and, being
destructive, needs approval; `edit_file` and `move_file` are `manual`.

The model is scripted: it lists the directory, writes `notes.txt` (the run waits
for approval), reads it back and answers with what it read. Host it with
`durably dev --mcp-example`, or::

    durably worker --agents durably.examples.files_clerk:registrations
"""

from __future__ import annotations

import os
from pathlib import Path

from durably.agents import Agent, AgentRegistration
from durably.mcp import MCPToolset, StdioServer
from durably.messages import AssistantMessage, ModelRequest
from durably.models import ScriptedModel, final, last_tool_results, tool_call

__all__ = ["AGENT_ID", "SERVER_PACKAGE", "build_registrations", "files_dir", "registrations"]

AGENT_ID = "files-clerk"
# The server version the lock file was written from.
SERVER_PACKAGE = "@modelcontextprotocol/server-filesystem@2026.8.31"
LOCK = Path(__file__).with_name("files_clerk.lock.json")
NOTE = "Files clerk was here: this note was written through an MCP server, once."


def files_dir() -> Path:
    """The one directory the server may touch."""
    return Path(os.environ.get("DURABLY_FILES_DIR", ".durably/files")).resolve()


def server(directory: Path) -> StdioServer:
    own = os.environ.get("DURABLY_MCP_FILESYSTEM")
    if own:
        return StdioServer(own, [str(directory)])
    return StdioServer("npx", ["-y", SERVER_PACKAGE, str(directory)])


def build_registrations(directory: Path | None = None) -> list[AgentRegistration]:
    """The example's registration, its server allowed `directory` (made if missing)."""
    directory = directory or files_dir()
    directory.mkdir(parents=True, exist_ok=True)
    toolset = MCPToolset("files", server(directory), lock=LOCK, trust_annotations=True)
    note = str(directory / "notes.txt")

    def list_step(request: ModelRequest) -> AssistantMessage:
        return AssistantMessage(tool_calls=(tool_call("list_directory", path=str(directory)),))

    def write_step(request: ModelRequest) -> AssistantMessage:
        return AssistantMessage(tool_calls=(tool_call("write_file", path=note, content=NOTE),))

    def read_step(request: ModelRequest) -> AssistantMessage:
        return AssistantMessage(tool_calls=(tool_call("read_text_file", path=note),))

    def answer_step(request: ModelRequest) -> AssistantMessage:
        (read,) = last_tool_results(request)
        return final(f"notes.txt now reads: {read.content}")

    agent = Agent(
        id=AGENT_ID,
        model=ScriptedModel([list_step, write_step, read_step, answer_step], name="files-clerk"),
        instructions="Keep notes in the files directory.",
        tools=list(toolset.tools),
    )
    return [AgentRegistration(agent, version="1")]


def demo_input() -> str:
    return "Leave a note in the files directory, then read it back."


# For `--agents durably.examples.files_clerk:registrations` (called when loaded, so that
# importing this module creates no directory).
registrations = build_registrations
