"""Which registrations unfinished runs need, and whether a worker hosts them as pinned.

The failure this prevents: a tool's docstring is its description and part of
the fingerprint, and renaming a `FunctionModel`'s function changes the model
identity, so an innocent edit shipped under the same version parks every
in-flight run as `version_incompatible`, one at a time, as each reaches its
next operation, and nothing said so when the worker started.

Each run publishes what its operations check (`AgentRegistration.pin_check`: a
digest of its registration's policies, `tool_retry` included, which the
fingerprint leaves out) as the `DurablyFingerprint` search attribute, so the
check reads visibility alone: it never queries a run
(at the only worker's start nothing polls yet, and a query would hang). Runs
pinned by a durably that did not publish it are reported as
`fingerprint_unknown`, never guessed. Which parts of a definition changed is
read from the history of one run per differing fingerprint (`fetch_history`
needs no worker either): the pin it recorded holds a short digest of each
part (`AgentPin.parts`, from `AgentRegistration.pinned_parts`).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict
from temporalio.api.common.v1 import Payloads
from temporalio.client import Client
from temporalio.converter import DataConverter
from temporalio.service import RPCError

from durably.agents import AgentRegistration
from durably.client._handle import temporal_error
from durably.contract import (
    ACTIVITY_PIN,
    SA_AGENT,
    SA_AGENT_VERSION,
    SA_FINGERPRINT,
    AgentPin,
    RunInput,
)
from durably.registry import AgentRegistry, _version_key

__all__ = ["NeededVersion", "changed_parts", "needed_versions"]

Check = Literal["matches", "differs", "not_hosted", "fingerprint_unknown", "unpinned"]

# Each page of the listing, and the one history read per differing
# fingerprint, gets this long: a worker's start never hangs on visibility.
_RPC_TIMEOUT = timedelta(seconds=10)
# The core SDK's marker for a local activity's result (the pin is one).
_LOCAL_ACTIVITY_MARKER = "core_local_activity"
_TOOL_PART = re.compile(r"tool (\S+) ")

M = TypeVar("M", bound=BaseModel)


class NeededVersion(BaseModel):
    """Unfinished runs that pinned one `(agent_id, version, fingerprint)`, and how a
    worker's registrations compare with it.

    `check` is None when no registrations were given, else:

    - `matches`: the worker hosts this version with this fingerprint.
    - `differs`: it hosts this version with another fingerprint; these runs
      park as `version_incompatible` at their next operation. `changed` names
      the parts that differ (None when the run pinned no parts, or its
      history could not be read).
    - `not_hosted`: it does not host this version (or, for `unpinned` runs,
      the agent at all); these runs park as `version_missing`.
    - `fingerprint_unknown`: it hosts this version, but the runs pinned
      before durably published fingerprints, so they cannot be compared.
    - `unpinned`: the runs have not pinned a version yet; they pin one the
      worker hosts.

    .. versionadded:: Unreleased
    """

    model_config = ConfigDict(frozen=True)

    agent_id: str | None
    version: str | None
    fingerprint: str | None
    runs: int
    example_run_id: str
    check: Check | None = None
    hosted_fingerprint: str | None = None
    changed: tuple[str, ...] | None = None

    @property
    def ok(self) -> bool:
        """Whether these runs can go on on the worker checked (True when unchecked)."""
        return self.check not in ("differs", "not_hosted")

    def describe(self) -> str:
        """One line for a log or an error message."""
        runs = f"{self.runs} unfinished run(s) (e.g. {self.example_run_id!r})"
        what = f"agent {self.agent_id!r} version {self.version!r}"
        if self.check == "differs":
            changed = (
                ", ".join(self.changed)
                if self.changed is not None
                else "unknown (the run recorded no parts, or its history was unreadable)"
            )
            return (
                f"{what}: {runs} pinned fingerprint {self.fingerprint}, this worker's is "
                f"{self.hosted_fingerprint}; changed: {changed}"
            )
        if self.check == "not_hosted":
            if self.version is None:
                return f"agent {self.agent_id!r}: {runs} will pin it, and this worker hosts none"
            return f"{what}: {runs} pinned it, and this worker does not host it"
        return f"{what}: {runs}, fingerprint {self.fingerprint or 'unknown'}"


async def needed_versions(
    client: Client,
    query: str,
    registrations: AgentRegistry | Iterable[AgentRegistration] | None = None,
) -> list[NeededVersion]:
    """The triples the open runs `query` finds have pinned, checked against `registrations`.

    Raises `DurablyError` (`TemporalUnavailableError` when unanswered) if
    visibility refuses the listing.
    """
    groups: dict[tuple[str | None, str | None, str | None], list[str]] = {}
    try:
        async for e in client.list_workflows(query, rpc_timeout=_RPC_TIMEOUT):
            sa = e.typed_search_attributes
            key = (sa.get(SA_AGENT), sa.get(SA_AGENT_VERSION), sa.get(SA_FINGERPRINT))
            groups.setdefault(key, []).append(e.id)
    except RPCError as err:
        raise temporal_error(err, client, "the list of unfinished runs") from err
    needed = [
        NeededVersion(
            agent_id=agent,
            version=version,
            fingerprint=fingerprint,
            runs=len(ids),
            example_run_id=min(ids),
        )
        for (agent, version, fingerprint), ids in groups.items()
    ]
    needed.sort(key=_order)
    if registrations is None:
        return needed
    registry = (
        registrations if isinstance(registrations, AgentRegistry) else AgentRegistry(registrations)
    )
    checked = [_check(n, registry) for n in needed]
    gate = asyncio.Semaphore(8)

    async def explain(n: NeededVersion) -> NeededVersion:
        if n.check != "differs":
            return n
        hosted = registry.get(n.agent_id or "", n.version)
        assert hosted is not None  # `differs` means it is hosted
        async with gate:
            pin = await _pinned(client, n.example_run_id)
        if pin is None or pin.parts is None:
            return n
        return n.model_copy(update={"changed": changed_parts(pin.parts, hosted.pinned_parts)})

    return list(await asyncio.gather(*map(explain, checked)))


def changed_parts(pinned: Mapping[str, str], hosted: Mapping[str, str]) -> tuple[str, ...]:
    """The names of the parts (`AgentRegistration.pinned_parts`) that differ.

    A tool only one side has is one entry, `tool NAME added` or `tool NAME
    removed`, rather than each of its parts; `tools` (their names, in order)
    is left out then, and shown only when the same tools were reordered.
    """
    before, after = _tools(pinned), _tools(hosted)
    added, removed = after - before, before - after
    changed = []
    for name in sorted(set(pinned) | set(hosted)):
        if pinned.get(name) == hosted.get(name):
            continue
        found = _TOOL_PART.match(name)
        if (found and found[1] in added | removed) or (name == "tools" and (added or removed)):
            continue
        changed.append(name)
    changed += [f"tool {t} removed" for t in sorted(removed)]
    changed += [f"tool {t} added" for t in sorted(added)]
    return tuple(changed)


def _tools(parts: Mapping[str, str]) -> set[str]:
    return {found[1] for name in parts if (found := _TOOL_PART.match(name))}


def _order(n: NeededVersion) -> tuple[str, tuple[tuple[int, int | str], ...], str]:
    return (n.agent_id or "", _version_key(n.version or ""), n.fingerprint or "")


def _check(n: NeededVersion, registry: AgentRegistry) -> NeededVersion:
    """`n` with `check` and `hosted_fingerprint` set from `registry`."""
    if n.agent_id is None or n.version is None:
        hosted = registry.get(n.agent_id) if n.agent_id is not None else None
        check: Check = "unpinned" if hosted is not None or n.agent_id is None else "not_hosted"
        return n.model_copy(update={"check": check})
    hosted = registry.get(n.agent_id, n.version)
    if hosted is None:
        check = "not_hosted"
    elif n.fingerprint is None:
        check = "fingerprint_unknown"
    elif _same(n.fingerprint, hosted.pin_check):
        check = "matches"
    else:
        check = "differs"
    return n.model_copy(
        update={"check": check, "hosted_fingerprint": hosted.pin_check if hosted else None}
    )


def _same(published: str, fingerprint: str) -> bool:
    """Whether a published fingerprint is `fingerprint` (whole, or its first 8+ digits)."""
    return len(published) >= 8 and fingerprint.startswith(published)


async def _pinned(client: Client, run_id: str) -> AgentPin | None:
    """The pin recorded in the current run of `run_id`'s chain, or None.

    The first run of a chain records it as the pin local activity's result;
    a run that continued as new carries it in its start input.
    """
    converter = client.data_converter
    try:
        events = client.get_workflow_handle(run_id).fetch_history_events(rpc_timeout=_RPC_TIMEOUT)
        async for event in events:
            if event.HasField("workflow_execution_started_event_attributes"):
                started = event.workflow_execution_started_event_attributes
                start = await _decode(converter, started.input, RunInput)
                if start is not None and start.carried is not None and start.carried.pin:
                    return start.carried.pin
            elif event.HasField("marker_recorded_event_attributes"):
                marker = event.marker_recorded_event_attributes
                if marker.marker_name != _LOCAL_ACTIVITY_MARKER or "result" not in marker.details:
                    continue
                if not _is_pin(marker.details):
                    continue
                pin = await _decode(converter, marker.details["result"], AgentPin)
                if pin is not None:
                    return pin
    except RPCError:
        return None  # which parts changed stays unknown; the rest of the check holds
    return None


def _is_pin(details: Mapping[str, Payloads]) -> bool:
    """Whether a local activity marker's data names the pin activity (True if unreadable)."""
    try:
        data = details["data"].payloads[0].data
        return bool(json.loads(data)["activity_type"] == ACTIVITY_PIN)
    except (IndexError, KeyError, TypeError, ValueError):
        return True


async def _decode(converter: DataConverter, payloads: Payloads, cls: type[M]) -> M | None:
    """`payloads` as one `cls` (through the client's codec too), or None if it is not one."""
    try:
        (value,) = await converter.decode(list(payloads.payloads), [cls])
    except Exception:  # a start input or result of another shape: not the pin
        return None
    return value if isinstance(value, cls) else None
