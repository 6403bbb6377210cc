"""The live registry of agent registrations a worker hosts.

The activities dispatch through it by agent id and version, so agents can
be added while the worker runs. A batch is checked whole before anything is
stored: half a batch registered would leave the worker in a state nobody
asked for.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable

from durably.agents import AgentRegistration
from durably.errors import RegistrationError

__all__ = ["AgentRegistry"]


def _version_key(version: str) -> tuple[tuple[int, int | str], ...]:
    """Natural order: "2" < "10", "1.9" < "1.10"; digits sort before words."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part)
        for part in re.findall(r"\d+|[^\d.\-_]+", version)
    )


class AgentRegistry:
    """Agent registrations by `(agent id, version)`; never replaces one."""

    def __init__(self, registrations: Iterable[AgentRegistration] = ()) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[tuple[str, str], AgentRegistration] = {}
        self.register(registrations)

    def register(self, registrations: Iterable[AgentRegistration]) -> None:
        """Register a batch: all of it, or (on any error) none of it."""
        batch = list(registrations)
        for r in batch:
            if not isinstance(r, AgentRegistration):
                raise RegistrationError(
                    f"expected AgentRegistration, got {type(r).__name__}: wrap agents as "
                    "AgentRegistration(agent, version='1')"
                )
        with self._lock:
            seen: set[tuple[str, str]] = set()
            for r in batch:
                key = (r.agent_id, r.version)
                if key in seen:
                    raise RegistrationError(
                        f"agent {r.agent_id!r} version {r.version!r} appears twice in this batch; "
                        "nothing was registered"
                    )
                seen.add(key)
                existing = self._by_key.get(key)
                if existing is not None and existing.fingerprint != r.fingerprint:
                    raise RegistrationError(
                        f"agent {r.agent_id!r} version {r.version!r} is already registered with "
                        "different settings; registrations are never replaced. Bump the version "
                        "for the new definition. Nothing in this batch was registered."
                    )
            for r in batch:
                self._by_key.setdefault((r.agent_id, r.version), r)

    def unregister(self, agent_id: str, version: str | None = None) -> list[AgentRegistration]:
        """Remove one version (or every version) of an agent; returns what was removed."""
        with self._lock:
            keys = [
                k for k in self._by_key if k[0] == agent_id and (version is None or k[1] == version)
            ]
            return [self._by_key.pop(k) for k in keys]

    def get(self, agent_id: str, version: str | None = None) -> AgentRegistration | None:
        """The registration at `version`, or the newest version when None."""
        with self._lock:
            if version is not None:
                return self._by_key.get((agent_id, version))
            versions = [k[1] for k in self._by_key if k[0] == agent_id]
            if not versions:
                return None
            return self._by_key[(agent_id, max(versions, key=_version_key))]

    def versions(self, agent_id: str) -> list[str]:
        with self._lock:
            return sorted((k[1] for k in self._by_key if k[0] == agent_id), key=_version_key)

    def all(self) -> list[AgentRegistration]:
        with self._lock:
            return list(self._by_key.values())

    def describe(self) -> str:
        """A short list for error messages: `support-desk@1, triage@2`."""
        with self._lock:
            keys = sorted(self._by_key)
        return ", ".join(f"{a}@{v}" for a, v in keys) or "no agents"
