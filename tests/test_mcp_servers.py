"""The MCP test servers behave as durably's MCP tests rely on (through the raw `mcp` client).

Nothing here uses durably: these tests check the infrastructure, so that an MCP
test failing points at durably's code rather than at its servers.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import mcp_types as types
import pytest
from mcp import MCPError

from .conftest import eventually
from .mcp_servers import (
    NEEDS_REFERENCE_SERVERS,
    OPERATION_ID_KEY,
    SLOW_PROXY,
    filesystem_server,
    memory_server,
    python_server,
    raw_session,
    read_lines,
    read_state,
    slow_proxy,
)


def hints(tool: types.Tool) -> dict[str, bool]:
    """The annotations exactly as the server sent them."""
    if tool.annotations is None:
        return {}
    return tool.annotations.model_dump(by_alias=True, exclude_unset=True)


def text(result: types.CallToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, types.TextContent))


@NEEDS_REFERENCE_SERVERS
class TestReferenceServers:
    async def test_filesystem_tools_carry_their_annotations(self, tmp_path: Path) -> None:
        """write_file is an idempotent destructive write, edit_file a non-idempotent one."""
        async with raw_session(filesystem_server(tmp_path), tmp_path / "err.log") as session:
            tools = {t.name: t for t in (await session.list_tools()).tools}
        assert hints(tools["read_text_file"]) == {"readOnlyHint": True, "openWorldHint": False}
        assert hints(tools["write_file"])["idempotentHint"] is True
        assert hints(tools["write_file"])["destructiveHint"] is True
        assert hints(tools["edit_file"])["idempotentHint"] is False

    async def test_memory_tools_carry_their_annotations(self, tmp_path: Path) -> None:
        """create_entities is a non-idempotent write; read_graph is read-only."""
        server = memory_server(tmp_path / "memory.jsonl")
        async with raw_session(server, tmp_path / "err.log") as session:
            tools = {t.name: t for t in (await session.list_tools()).tools}
        assert hints(tools["create_entities"])["idempotentHint"] is False
        assert hints(tools["read_graph"])["readOnlyHint"] is True


class TestPythonServer:
    async def test_record_applies_once_per_operation_id(self, tmp_path: Path) -> None:
        """A repeated operation id is logged but not applied again; erase and lookup log too."""
        log, state = tmp_path / "calls.jsonl", tmp_path / "state.json"
        async with raw_session(python_server(log=log, state=state), tmp_path / "err.log") as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            for value, op in (("a", "run/1/tool:1:c"), ("b", "run/1/tool:1:c"), ("c", "run/1/x")):
                result = await s.call_tool(
                    "record", {"key": "k", "value": value}, meta={OPERATION_ID_KEY: op}
                )
                assert text(result) == "recorded k"
            looked_up = await s.call_tool("lookup", {"key": "k"})
            await s.call_tool("erase", {"key": "k"}, meta={OPERATION_ID_KEY: "run/1/e"})
            missing = await s.call_tool("lookup", {"key": "k"})

        assert hints(tools["record"]) == {
            "readOnlyHint": False,
            "idempotentHint": True,
            "destructiveHint": False,
        }
        assert hints(tools["lookup"]) == {"readOnlyHint": True}
        assert tools["erase"].annotations is None
        assert text(looked_up) == "c"
        assert missing.is_error and "no such key" in text(missing)
        assert [
            (c["tool"], c["operation_id"], c["value"], c["applied"]) for c in read_lines(log)
        ] == [
            ("record", "run/1/tool:1:c", "a", True),
            ("record", "run/1/tool:1:c", "b", False),
            ("record", "run/1/x", "c", True),
            ("lookup", None, "c", False),
            ("erase", "run/1/e", None, True),
            ("lookup", None, None, False),
        ]
        assert read_state(state) == {
            "values": {},
            "applied_operations": ["run/1/tool:1:c", "run/1/x"],
        }

    async def test_changed_variant_drifts_lookup(self, tmp_path: Path) -> None:
        """MCP_TEST_VARIANT=changed gives lookup another description and a required reason."""
        schemas = {}
        for variant in (None, "changed"):
            server = python_server(variant=variant)
            async with raw_session(server, tmp_path / "err.log") as session:
                tools = {t.name: t for t in (await session.list_tools()).tools}
            schemas[variant] = tools["lookup"]
        assert schemas[None].input_schema["required"] == ["key"]
        assert schemas["changed"].input_schema["required"] == ["key", "reason"]
        assert schemas[None].description != schemas["changed"].description

    async def test_ask_person_fails_for_a_client_without_elicitation(self, tmp_path: Path) -> None:
        """A client that declares no elicitation support gets an error, not a hang."""
        async with raw_session(python_server(), tmp_path / "err.log") as session:
            with pytest.raises(MCPError, match="Elicitation not supported"):
                await session.call_tool("ask_person", {"question": "Which order?"})


class TestSlowProxy:
    @NEEDS_REFERENCE_SERVERS
    async def test_holds_back_a_slow_tool_result_after_the_write(self, tmp_path: Path) -> None:
        """The write is on disk and logged while its result is still held back."""
        root, proxy_log = tmp_path / "root", tmp_path / "proxy.jsonl"
        root.mkdir()
        target = root / "out.txt"
        server = slow_proxy(
            filesystem_server(root), slow_tools=["write_file"], log=proxy_log, delay=1.0
        )
        async with raw_session(server, tmp_path / "err.log") as session:
            await session.list_tools()
            await session.call_tool("list_allowed_directories", {})
            assert read_lines(proxy_log) == []  # not a slow tool: neither logged nor held

            call = asyncio.ensure_future(
                session.call_tool(
                    "write_file",
                    {"path": str(target), "content": "hello"},
                    meta={OPERATION_ID_KEY: "run/1/tool:1:w"},
                )
            )

            async def written() -> bool:
                return target.exists() and bool(read_lines(proxy_log))

            await eventually(written, within=5)
            assert not call.done()  # on disk and logged, its result still held back
            result = await call

        assert not result.is_error
        assert read_lines(proxy_log) == [
            {
                "name": "write_file",
                "operation_id": "run/1/tool:1:w",
                "arguments": {"path": str(target), "content": "hello"},
            }
        ]

    def test_exits_and_kills_its_server_when_stdin_closes(self, tmp_path: Path) -> None:
        """The client going away takes the relay and the server down with it."""
        stubborn = [
            sys.executable,
            "-c",
            "import os, time; print(os.getpid(), flush=True); time.sleep(60)",
        ]
        proxy = subprocess.Popen(
            [sys.executable, str(SLOW_PROXY), "--", *stubborn],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert proxy.stdout is not None and proxy.stdin is not None
        child_pid = int(proxy.stdout.readline())
        proxy.stdin.close()
        assert proxy.wait(timeout=5) == 0
        with pytest.raises(ProcessLookupError):
            os.kill(child_pid, 0)
