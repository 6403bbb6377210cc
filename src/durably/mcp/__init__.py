"""MCP tool servers as durable tools (SPEC section 21).

Needs the `mcp` extra (`pip install 'durably[mcp]'`): the official MCP
Python SDK. See `MCPToolset`, and the README's "MCP tools".
"""

from durably.mcp._lock import LockedTool, ToolLock
from durably.mcp._servers import OPERATION_ID_META, HTTPServer, MCPServerError, StdioServer
from durably.mcp._toolset import MCPToolset, policy_of

__all__ = [
    "OPERATION_ID_META",
    "HTTPServer",
    "LockedTool",
    "MCPServerError",
    "MCPToolset",
    "StdioServer",
    "ToolLock",
    "policy_of",
]
