"""Writing lock files (`durably mcp lock`) and checking servers against them (a
worker's start)."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterable, Iterator

from durably.agents import AgentRegistration
from durably.errors import RegistrationError
from durably.mcp._lock import ToolLock, drift
from durably.mcp._servers import POOL
from durably.mcp._toolset import _LOCKING, CREATED_WHILE_LOCKING, MCPToolset

__all__ = ["lock_toolsets", "toolsets_in", "toolsets_of"]


def toolsets_in(spec: str) -> list[MCPToolset]:
    """The toolsets `spec` names (`module:attr` holding toolsets), else every toolset the
    module makes, at import or when `attr` (a function making registrations, as
    `--agents` takes) is called. All in lock mode: a toolset builds no tools then (its
    lock may be missing or about to change), so agents reveal none; each toolset made
    is recorded instead."""
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise RegistrationError(f"{spec!r}: expected `module` or `module:attr`")
    with _lock_mode():
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise RegistrationError(f"{spec!r}: cannot import it ({err})") from err
        value = getattr(module, attr) if attr else None
        if callable(value) and not isinstance(value, MCPToolset):
            value = value()
        made = [*CREATED_WHILE_LOCKING]
    named = value if isinstance(value, list | tuple) else [value]
    found = [t for t in named if isinstance(t, MCPToolset)] or [
        *made,
        *(v for v in vars(module).values() if isinstance(v, MCPToolset)),  # imported before
    ]
    unique = list({id(t): t for t in found}.values())
    if not unique:
        raise RegistrationError(f"{spec!r} defines no MCPToolset")
    return unique


@contextlib.contextmanager
def _lock_mode() -> Iterator[None]:
    token = _LOCKING.set(True)
    CREATED_WHILE_LOCKING.clear()
    try:
        yield
    finally:
        _LOCKING.reset(token)


def toolsets_of(registrations: Iterable[AgentRegistration]) -> list[MCPToolset]:
    """The toolsets whose tools these registrations' agents use."""
    found = [
        t.origin for r in registrations for t in r.agent.tools if isinstance(t.origin, MCPToolset)
    ]
    return list({id(t): t for t in found}.values())


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
