"""Writing lock files (`durably mcp lock`) and checking servers against them (a
worker's start)."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

from durably.agents import Agent, AgentRegistration
from durably.errors import RegistrationError
from durably.mcp._lock import ToolLock, drift
from durably.mcp._servers import POOL
from durably.mcp._toolset import _LOCKING, CREATED_WHILE_LOCKING, MCPToolset

__all__ = ["lock_toolsets", "toolsets_in", "toolsets_of"]


def toolsets_in(spec: str) -> list[MCPToolset]:
    """Every `MCPToolset` the module `spec` makes (`module`), or the ones an attribute
    names (`module:attr`: toolsets, or registrations and agents using their tools). The
    module is imported in lock mode: a toolset without its lock file yet has no tools."""
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise RegistrationError(f"{spec!r}: expected `module` or `module:attr`")
    token = _LOCKING.set(True)
    CREATED_WHILE_LOCKING.clear()
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise RegistrationError(f"{spec!r}: cannot import it ({err})") from err
    finally:
        _LOCKING.reset(token)
    if attr:
        value = getattr(module, attr)
        if callable(value) and not isinstance(value, MCPToolset):
            token = _LOCKING.set(True)
            try:
                value = value()  # a function making the registrations, as --agents takes
            finally:
                _LOCKING.reset(token)
        # Agents built while locking have no MCP tools yet: their toolsets were recorded.
        found = [*_collect(value if isinstance(value, list | tuple) else [value])]
        found += [t for t in CREATED_WHILE_LOCKING if t not in found]
    else:
        found = [*_collect(vars(module).values()), *CREATED_WHILE_LOCKING]
    unique = list({id(t): t for t in found}.values())
    if not unique:
        raise RegistrationError(f"{spec!r} defines no MCPToolset")
    return unique


def _collect(values: Iterable[Any]) -> list[MCPToolset]:
    found: list[MCPToolset] = []
    for value in values:
        if isinstance(value, MCPToolset):
            found.append(value)
        elif isinstance(value, list | tuple):
            found += _collect(value)
        elif isinstance(value, AgentRegistration | Agent):
            agent = value.agent if isinstance(value, AgentRegistration) else value
            found += [t.origin for t in agent.tools if isinstance(t.origin, MCPToolset)]
    return found


def toolsets_of(registrations: Iterable[Any]) -> list[MCPToolset]:
    """The toolsets whose tools these registrations' agents use."""
    return list({id(t): t for t in _collect(list(registrations))}.values())


async def lock_toolsets(
    toolsets: Iterable[MCPToolset], *, update: bool = True
) -> list[tuple[MCPToolset, ToolLock, list[str]]]:
    """List each toolset's server and write its lock file; each with how the listing
    differs from the lock it replaces. With `update=False` a lock that would change is
    left as it is (its differences are returned): a changed lock changes the
    fingerprint of the versions built from it."""
    toolsets = list(toolsets)
    written = []
    try:
        for toolset in toolsets:
            conn = await POOL.connection(toolset.server)
            lock = ToolLock(
                toolset=toolset.name,
                server=conn.server_info,
                tools=sorted(conn.tools.values(), key=lambda t: t.name),
            )
            changes: list[str] = []
            if toolset.lock_path.exists():
                old = ToolLock.read(toolset.lock_path)
                changes = drift(old.tools, lock.tools)
            if update or not toolset.lock_path.exists() or not changes:
                lock.write(toolset.lock_path)
            written.append((toolset, lock, changes))
    finally:
        await POOL.close([t.server for t in toolsets])
    return written
