"""A toolset's lock file: the tools an MCP server listed, as a version of the agent uses
them.

A server's tools change when the server is upgraded, and during a rollout two
workers can see two listings. What a run may call must not depend on which
worker it meets, so a version's tools come from a file committed with the
agent's code (`durably mcp lock`): the fingerprint is computed from it, and
a live listing is only ever compared with it (`drift`), never used in its
place.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["LockedTool", "ToolLock", "drift", "tool_digest"]

LOCK_FORMAT = 1


class LockedTool(BaseModel):
    """One tool as the server listed it (the MCP `Tool` fields durably relies on)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    title: str | None = None
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    output_schema: dict[str, Any] | None = None
    # The MCP annotations as the server sent them (camelCase keys, e.g. readOnlyHint).
    annotations: dict[str, Any] = Field(default_factory=dict)


class ToolLock(BaseModel):
    """What `durably mcp lock` writes: the server's name and version as it reported them
    (for people; not compared) and its tools, sorted by name."""

    model_config = ConfigDict(extra="ignore")

    format: int = LOCK_FORMAT
    toolset: str
    server: dict[str, Any] = Field(default_factory=dict)
    tools: list[LockedTool]

    @classmethod
    def read(cls, path: Path) -> ToolLock:
        return cls.model_validate_json(path.read_text(encoding="utf-8"))

    def write(self, path: Path) -> None:
        """Stable JSON (sorted keys, two-space indent) so a review shows what changed."""
        data = self.model_dump(mode="json", exclude_none=True)
        data["tools"] = sorted(data["tools"], key=lambda t: t["name"])
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False)
        path.write_text(text + "\n", encoding="utf-8")


def tool_digest(tool: LockedTool) -> str:
    """What must stay the same for a call to mean what the version meant: the name,
    description, schemas and annotations (not the title, shown to people only)."""
    data = tool.model_dump(mode="json", exclude={"title"})
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def drift(locked: list[LockedTool], live: list[LockedTool]) -> list[str]:
    """How a live listing differs from the lock, one line per tool (empty: it does not).
    A tool the server added is drift too: the lock no longer says what it serves."""
    old = {t.name: t for t in locked}
    new = {t.name: t for t in live}
    lines = [f"{name}: no longer listed" for name in sorted(old.keys() - new.keys())]
    lines += [f"{name}: listed, but not in the lock" for name in sorted(new.keys() - old.keys())]
    for name in sorted(old.keys() & new.keys()):
        a, b = old[name], new[name]
        changed = [
            what
            for what in ("description", "input_schema", "output_schema", "annotations")
            if getattr(a, what) != getattr(b, what)
        ]
        if changed:
            lines.append(f"{name}: {', '.join(changed)} changed")
    return lines
