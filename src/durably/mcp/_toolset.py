"""`MCPToolset`: an MCP server's tools, as durable tools of an agent.

Each tool is a `durably.Tool` built from the toolset's lock file (never
from a live listing: see `_lock`), run as a `durably.tool_call` activity
like any other tool, through the worker's one session to the server.
Every MCP tool is `manual` unless the operator trusts the server's own
annotations (`trust_annotations=True`; MCP says annotations are untrusted
unless the server is):

====================================  =============  =================
annotations                           recovery       requires approval
====================================  =============  =================
readOnlyHint                          safe           no
idempotentHint (not read-only)        idempotent     if destructive
neither                               manual         if destructive
====================================  =============  =================

`destructiveHint` defaults to true in MCP, so an unannotated tool that is
not read-only needs approval. A registration's `tool_recovery` overrides the
policy per tool, and `approval=` here overrides approval per tool.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import jsonschema
from pydantic import RootModel, model_validator

from durably._json_schema import schema_problem, validator
from durably.errors import RegistrationError
from durably.mcp._lock import LockedTool, ToolLock, drift, tool_digest
from durably.mcp._servers import POOL, HTTPServer, Server, StdioServer, refused, session_lost
from durably.tools import Tool, ToolContext, ToolDrift, ToolError

__all__ = ["MCPResultError", "MCPToolset", "locking_now", "policy_of"]

# Set while `durably mcp lock` imports the user's module: a toolset whose lock file is
# missing then has no tools (instead of refusing), so the lock can be written.
_LOCKING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "durably_mcp_locking", default=False
)
# The toolsets made while locking: the ones a module builds inside functions are found too.
CREATED_WHILE_LOCKING: list[MCPToolset] = []


def locking_now() -> bool:
    """Whether `durably mcp lock` is importing the user's module (see `_LOCKING`)."""
    return _LOCKING.get()


def policy_of(tool: LockedTool) -> tuple[str, bool]:
    """The recovery policy and approval flag a tool's own annotations ask for."""
    hints = tool.annotations
    read_only = hints.get("readOnlyHint") is True
    if read_only:
        return "safe", False
    destructive = hints.get("destructiveHint", True) is not False
    recovery = "idempotent" if hints.get("idempotentHint") is True else "manual"
    return recovery, destructive


class MCPToolset:
    """The tools one MCP server serves, as a version of an agent locked them.

    ``MCPToolset("files", StdioServer("npx", [...]), lock=HERE / "files.lock.json")``;
    give its `tools` to an `Agent` (``tools=[*files.tools, ...]``). `prefix` is
    put before each tool's name (two servers may name a tool alike);
    `include` keeps only the named tools. With `trust_annotations` each
    tool's recovery policy and approval come from its annotations (see the
    module docstring), else every tool is `manual` without approval;
    `approval` overrides approval per tool (by its name here, prefix included).
    """

    def __init__(
        self,
        name: str,
        server: Server,
        *,
        lock: str | Path,
        trust_annotations: bool = False,
        prefix: str = "",
        include: Sequence[str] | None = None,
        approval: Mapping[str, bool] | None = None,
    ) -> None:
        if not isinstance(server, StdioServer | HTTPServer):
            raise RegistrationError(
                f"MCPToolset {name!r}: server must be a StdioServer or an HTTPServer, got "
                f"{type(server).__name__}"
            )
        self.name = name
        self.server = server
        self.lock_path = Path(lock)
        self.trust_annotations = trust_annotations
        self.prefix = prefix
        self.include = tuple(include) if include is not None else None
        self.approval = dict(approval or {})
        if _LOCKING.get():
            CREATED_WHILE_LOCKING.append(self)

    def __repr__(self) -> str:
        return f"MCPToolset({self.name!r}, {self.server.describe()!r})"

    @functools.cached_property
    def lock(self) -> ToolLock | None:
        """The lock file; None while locking (it may be missing, or about to change)."""
        if _LOCKING.get():
            return None
        if not self.lock_path.exists():
            raise RegistrationError(
                f"MCPToolset {self.name!r}: its lock file {str(self.lock_path)!r} does not "
                "exist; write it with `durably mcp lock module:attr` (the server must run), "
                "review it, and commit it with the agent's code"
            )
        return ToolLock.read(self.lock_path)

    @functools.cached_property
    def locked(self) -> list[LockedTool]:
        """The tools of the lock file that `include` keeps (none while locking)."""
        if self.lock is None:
            return []
        tools = self.lock.tools
        if self.include is not None:
            missing = sorted(set(self.include) - {t.name for t in tools})
            if missing:
                raise RegistrationError(
                    f"MCPToolset {self.name!r}: include names {missing}, which its lock file "
                    "does not hold; lock again or fix the names"
                )
            tools = [t for t in tools if t.name in self.include]
        return sorted(tools, key=lambda t: t.name)

    @functools.cached_property
    def tools(self) -> tuple[Tool[Any], ...]:
        """The toolset's tools, built from its lock file."""
        tools = tuple(self._tool(t) for t in self.locked)
        unknown = sorted(set(self.approval) - {t.name for t in tools})
        if unknown and not _LOCKING.get():
            raise RegistrationError(
                f"MCPToolset {self.name!r}: approval names {unknown}, which are not its tools "
                f"(prefix included: {sorted(t.name for t in tools)[:20]})"
            )
        return tools

    def _tool(self, locked: LockedTool) -> Tool[Any]:
        name = self.prefix + locked.name
        recovery, approval = policy_of(locked) if self.trust_annotations else ("manual", False)
        approval = self.approval.get(name, approval)
        try:
            return Tool(
                name=name,
                description=locked.description or locked.title or locked.name,
                input_model=_schema_model(f"{name}_args", _Arguments, locked.input_schema),
                output_model=(
                    _schema_model(f"{name}_output", _Output, locked.output_schema)
                    if locked.output_schema
                    else None
                ),
                execute=functools.partial(_call, self, locked.name, tool_digest(locked)),
                requires_approval=approval,
                recovery=recovery if self.trust_annotations else None,
                origin=self,
            )
        except ValueError as err:
            raise RegistrationError(
                f"MCPToolset {self.name!r}, tool {locked.name!r}: {err}; give the toolset a "
                "prefix, or leave the tool out with include="
            ) from err

    async def check(self) -> tuple[list[str], str | None]:
        """How the server's live listing differs from the lock (one line per tool; none:
        it does not), and its version now and at lock time if they differ (its tools may
        have kept their listing and changed what they do)."""
        conn = await POOL.connection(self.server)
        live = list(conn.tools.values())
        if self.include is not None:
            live = [t for t in live if t.name in self.include]
        locked = self.lock.server.get("version") if self.lock else None
        running = conn.server_info.get("version")
        version = None
        if locked is not None and running is not None and locked != running:
            version = f"{conn.server_info.get('name', 'the server')} {running}, locked at {locked}"
        return drift(self.locked, live), version


async def _call(
    toolset: MCPToolset, name: str, digest: str, args: _Arguments, ctx: ToolContext
) -> Any:
    """One tool call through the worker's session to the server; the call's operation id
    goes in the request's `_meta`, for the server to deduplicate.

    What the server refused before running it (invalid arguments, an unknown
    tool, elicitation it needs) is a tool error the model reads; a lost
    streamable-HTTP session (the server restarted) is opened again and the
    call sent once more, since the server refused it unrun; anything else
    (the connection closed mid-call, a timeout, the server's own crash, a
    response the client could not read) leaves the outcome unknown, for the
    tool's recovery policy.
    """
    from mcp.shared.exceptions import MCPError

    for resend in (False, True):
        conn = await POOL.connection(toolset.server)
        live = (await conn.current_digests()).get(name)
        if live != digest:
            change = "is no longer listed" if live is None else "changed since it was locked"
            raise ToolDrift(
                f"MCP server `{toolset.server.describe()}` of toolset {toolset.name!r}: tool "
                f"{name!r} {change}. Lock the toolset again under a new agent version for "
                "new runs; restore the server's previous tools, then retry, for these"
            )
        try:
            result = await conn.call(name, args.root, ctx.operation_id)
        except MCPError as err:
            message = err.error.message
            if session_lost(message) and not resend:
                continue
            if refused(err.code, message):
                raise ToolError(f"MCP error {err.code}: {message}") from None
            raise
        except RuntimeError as err:
            if "structured content" not in str(err):
                raise
            raise MCPResultError(
                f"the server ran the call, but its result does not fit the tool's output "
                f"schema ({err}); resolve the call with the value or an error rather than "
                "rerun it"
            ) from None
        if result.is_error:
            raise ToolError(_text(result) or f"tool {name!r} failed (no message)")
        if result.structured_content is not None:
            return result.structured_content
        return _text(result)
    raise AssertionError("unreachable: the second try returns or raises")


class MCPResultError(Exception):
    """A call ran, but its result is not one the tool declared: an unknown outcome."""


def _text(result: Any) -> str:
    """The text blocks of a result, joined; other blocks named by their type."""
    parts = []
    for block in result.content:
        text = getattr(block, "text", None)
        parts.append(text if isinstance(text, str) else f"[{getattr(block, 'type', 'content')}]")
    return "\n".join(parts)


class _SchemaChecked(RootModel[Any]):
    """A value checked against a JSON schema a server gave (not a pydantic model's)."""

    schema_: ClassVar[dict[str, Any]] = {}
    validator_: ClassVar[Any] = None

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return dict(cls.schema_)

    @model_validator(mode="after")
    def _fits(self) -> _SchemaChecked:
        problem = schema_problem(self.validator_, self.root)
        if problem is not None:
            raise ValueError(problem)
        return self


class _Arguments(_SchemaChecked):
    root: dict[str, Any]


class _Output(_SchemaChecked):
    pass


def _schema_model(
    name: str, base: type[_SchemaChecked], schema: dict[str, Any]
) -> type[_SchemaChecked]:
    """A subclass of `base` that checks values against `schema` and reports it as its
    JSON schema (what the model is shown, and what the fingerprint hashes)."""
    try:
        checks = validator(schema)
    except jsonschema.SchemaError as err:
        raise ValueError(f"its schema is not a valid JSON schema: {err.message[:300]}") from None
    return type(
        name, (base,), {"schema_": dict(schema), "validator_": checks, "__module__": __name__}
    )
