"""Agents and their registrations.

An `Agent` is what the model is told and may call. An `AgentRegistration`
adds what durability needs: a version, a recovery policy per tool, model
retry settings and timeouts. Registrations are validated when they are
made, never inside workflow code, so a mistake fails at startup with a
message rather than stalling a workflow task later.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any, get_args

from durably._digests import policy_digest
from durably.contract import (
    CONTROL_CHARACTERS,
    MAX_NAME_CHARS,
    PIN_DIGEST_PREFIX,
    AgentPin,
    Recovery,
    RetrySpec,
    SubagentTarget,
    ToolPolicy,
    UsageLimits,
)
from durably.errors import RegistrationError
from durably.messages import Message, ToolSpec
from durably.models import Model
from durably.pricing import Price
from durably.tools import Tool, tool_identity

__all__ = ["Agent", "AgentRegistration", "ModelRetry", "ToolRetry"]

_RECOVERIES: tuple[str, ...] = get_args(Recovery)
# Which part of `fingerprint_parts` each field of `tool_identity` belongs to;
# a field not named here is a part of its own.
_TOOL_PARTS = {
    "description": "description",
    "input_schema": "input schema",
    "output_schema": "output schema",
    "requires_approval": "approval",
    "is_question": "approval",
    "approval_timeout_s": "approval",
}


_TOOL_NAME = re.compile(r"[^A-Za-z0-9_-]")


def _locking_mcp() -> bool:
    """`durably mcp lock` is importing the module: MCP tools are not built yet, so a
    `tool_recovery` naming them is not (yet) a mistake."""
    from durably.mcp._toolset import locking_now

    return locking_now()


@dataclass(frozen=True)
class Subagent:
    """An agent another agent delegates to: the model sees it as a tool taking a task.

    A call starts the subagent's run as a child of the calling run, with every
    guarantee of a run of its own; its final output is the call's result, and
    its usage counts in the parent's. `version` None runs the newest registered
    version; `tool_name` defaults to the agent id (characters a tool name may
    not hold replaced by `_`).

    .. versionadded:: Unreleased
    """

    agent_id: str
    version: str | None = None
    tool_name: str | None = None
    description: str | None = None

    @property
    def name(self) -> str:
        return self.tool_name or _TOOL_NAME.sub("_", self.agent_id)[:64]

    @property
    def spec(self) -> ToolSpec:
        about = self.description or f"Delegate a task to the {self.agent_id} agent."
        return ToolSpec(
            name=self.name,
            description=f"{about} It works on it and answers with its result.",
            parameters={
                "type": "object",
                "properties": {
                    "task": {"type": "string", "description": "What it should do, in full."}
                },
                "required": ["task"],
                "additionalProperties": False,
            },
        )


@dataclass(frozen=True)
class Agent:
    """An agent: a model, its instructions and the tools it may call.

    `max_turns` bounds the number of model requests in one run; a run that
    reaches it without a final answer fails (and can be retried).

    `context_window`, if given, chooses what the model reads of the
    transcript (a session's whole conversation included) on each request:
    a function of the messages, returning those to send, run inside the
    model activity when the request is built. It never rewrites history:
    the run and its session keep every message. It is part of the
    registration's fingerprint by its qualified name (a renamed function is
    a new version); it must be deterministic and keep each tool call with
    its result.

    `max_parallel_tools` bounds how many tool calls of one model answer run
    at once (default: all of them). Calls waiting for a person take no
    slot. A throughput setting, like a timeout: not part of the fingerprint.

    .. versionchanged:: Unreleased
       The `context_window` and `max_parallel_tools` keywords.
    """

    id: str
    model: Model
    instructions: str
    tools: Sequence[Tool[Any]] = ()
    max_turns: int = 20
    context_window: Callable[[Sequence[Message]], Sequence[Message]] | None = None
    max_parallel_tools: int | None = None
    subagents: Sequence[Subagent | str] = ()
    tasks: Sequence[Tool[Any]] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id.strip():
            raise RegistrationError("Agent id must be a non-empty string")
        if len(self.id) > MAX_NAME_CHARS or CONTROL_CHARACTERS.search(self.id):
            raise RegistrationError(
                f"Agent id {self.id[:60]!r} must be at most {MAX_NAME_CHARS} characters with no "
                "control characters (runs are started by it and it appears in their listing)"
            )
        if self.max_turns < 1:
            raise RegistrationError(f"agent {self.id!r}: max_turns must be at least 1")
        if self.max_parallel_tools is not None and (
            isinstance(self.max_parallel_tools, bool)
            or not isinstance(self.max_parallel_tools, int)
            or self.max_parallel_tools < 1
        ):
            raise RegistrationError(
                f"agent {self.id!r}: max_parallel_tools must be a whole number of at least 1, "
                f"or None for all the calls of a model answer; got {self.max_parallel_tools!r}"
            )
        if self.context_window is not None and not callable(self.context_window):
            raise RegistrationError(
                f"agent {self.id!r}: context_window must be a function of the messages, "
                f"got {type(self.context_window).__name__}"
            )
        if not isinstance(self.model, Model):
            raise RegistrationError(
                f"agent {self.id!r}: model {self.model!r} does not implement durably.Model "
                "(an `identity` property and `async def request(ModelRequest)`)"
            )
        subagents = tuple(s if isinstance(s, Subagent) else Subagent(s) for s in self.subagents)
        if any(s.agent_id == self.id for s in subagents):
            raise RegistrationError(
                f"agent {self.id!r} names itself as a subagent: each call would start another "
                "run of it, without end; delegate to another agent"
            )
        object.__setattr__(self, "subagents", subagents)
        object.__setattr__(self, "tasks", tuple(self.tasks))
        names = [t.name for t in self.tools] + [s.name for s in subagents]
        names += [t.name for t in self.tasks]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise RegistrationError(
                f"agent {self.id!r} has several tools named {dupes}; rename them"
            )
        object.__setattr__(self, "tools", tuple(self.tools))

    def tool(self, name: str) -> Tool[Any] | None:
        return self._tools_by_name.get(name)

    @functools.cached_property
    def _tools_by_name(self) -> dict[str, Tool[Any]]:
        return {t.name: t for t in self.tools}

    @functools.cached_property
    def tool_specs(self) -> tuple[ToolSpec, ...]:
        own = tuple(
            ToolSpec(name=t.name, description=t.description, parameters=t.input_schema)
            for t in self.tools
        )
        owned = tuple(
            ToolSpec(name=t.name, description=t.description, parameters=t.input_schema)
            for t in self.tasks
        )
        return own + tuple(s.spec for s in self._subagents) + owned

    @property
    def _subagents(self) -> tuple[Subagent, ...]:
        return tuple(s for s in self.subagents if isinstance(s, Subagent))


@dataclass(frozen=True)
class ModelRetry:
    """Persisted backoff for model requests (the model activity's retry policy)."""

    max_attempts: int
    initial_delay_ms: int = 1000
    max_delay_ms: int = 30_000

    def __post_init__(self) -> None:
        _check_retry("ModelRetry", self.max_attempts, self.initial_delay_ms, self.max_delay_ms)

    def spec(self) -> RetrySpec:
        return RetrySpec(
            max_attempts=self.max_attempts,
            initial_delay_ms=self.initial_delay_ms,
            max_delay_ms=self.max_delay_ms,
        )


@dataclass(frozen=True)
class ToolRetry:
    """Bounded attempts with backoff for `safe` and `idempotent` tools."""

    max_attempts: int = 5
    initial_delay_ms: int = 1000
    max_delay_ms: int = 30_000

    def __post_init__(self) -> None:
        _check_retry("ToolRetry", self.max_attempts, self.initial_delay_ms, self.max_delay_ms)


def _check_retry(what: str, attempts: int, initial: int, maximum: int) -> None:
    if attempts < 1:
        raise RegistrationError(f"{what}.max_attempts must be at least 1, got {attempts}")
    if initial < 1 or maximum < initial:
        raise RegistrationError(
            f"{what}: need 1 <= initial_delay_ms <= max_delay_ms, got {initial} and {maximum}"
        )


@dataclass(frozen=True)
class AgentRegistration:
    """An agent at a version, with its durability settings.

    Tools not named in `tool_recovery` are `manual`, unless the tool declares its own
    policy (an MCP tool trusted for its annotations, `durably.mcp`). `heartbeat_timeout` is
    how fast a dead worker is noticed while a tool or model request runs; a
    tool's own `heartbeat_timeout` overrides it. A run continues as new (same
    run id, same snapshot) once its history reaches `continue_as_new_events`
    events or `continue_as_new_bytes` bytes, well before Temporal's limits
    (51,200 events, 50 MB); these and the timeouts can change under a
    version. `tool_retry` is not in the fingerprint either, but a run checks
    it with the rest of its policies: changing it needs a new version.

    `approvers` names, per tool that requires approval, who may approve or
    deny its calls: each decision must then carry a token signed by a key
    the worker holds (see `durably.approvals`). Without it, anyone who may
    signal the run decides under any name it declares.

    `limits` are what each run may use (tokens, requests, tool calls, cost,
    wall-clock) before it parks in `needs_attention` (`budget_exceeded`).
    A run's starter may tighten them, and the starter or an operator
    (`raise_limits`) may raise them up to `limit_cap` (per field; a field the
    cap leaves out can go up to `limits`' own value, and one neither sets is
    unbounded); `max_turns_cap` likewise bounds a run's own `max_turns`.
    `prices` (model name, or "*", to `Price`) give requests their cost.
    None of these is in the fingerprint: a run pins the limits it started
    with, and prices apply when a request completes.
    """

    agent: Agent
    version: str
    tool_recovery: Mapping[str, Recovery] = field(default_factory=dict)
    model_retry: ModelRetry | None = None
    tool_retry: ToolRetry = field(default_factory=ToolRetry)
    heartbeat_timeout: timedelta = timedelta(seconds=10)
    tool_timeout: timedelta = timedelta(minutes=10)
    model_timeout: timedelta = timedelta(minutes=5)
    continue_as_new_events: int = 10_000
    continue_as_new_bytes: int = 10 * 2**20
    approvers: Mapping[str, Sequence[str]] = field(default_factory=dict)
    limits: UsageLimits | None = None
    limit_cap: UsageLimits | None = None
    max_turns_cap: int | None = None
    prices: Mapping[str, Price] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"registration of agent {self.agent.id!r} version {self.version!r}"
        if not isinstance(self.version, str) or not self.version.strip():
            raise RegistrationError(f"agent {self.agent.id!r}: version must be a non-empty string")
        if len(self.version) > MAX_NAME_CHARS or CONTROL_CHARACTERS.search(self.version):
            raise RegistrationError(
                f"agent {self.agent.id!r}: version {self.version[:60]!r} must be at most "
                f"{MAX_NAME_CHARS} characters with no control characters"
            )
        unknown = sorted(set(self.tool_recovery) - {t.name for t in self.agent.tools})
        if unknown and not _locking_mcp():
            raise RegistrationError(
                f"{where}: tool_recovery names {unknown}, which the agent does not have "
                f"(its tools: {sorted(t.name for t in self.agent.tools)}); "
                "fix the name or add the tool"
            )
        bad = {n: p for n, p in self.tool_recovery.items() if p not in _RECOVERIES}
        if bad:
            raise RegistrationError(
                f"{where}: unknown recovery policy {bad}; use one of {list(_RECOVERIES)}"
            )
        for what, value in (
            ("heartbeat_timeout", self.heartbeat_timeout),
            ("tool_timeout", self.tool_timeout),
            ("model_timeout", self.model_timeout),
        ):
            if value <= timedelta(0):
                raise RegistrationError(f"{where}: {what} must be positive")
        if not 10 <= self.continue_as_new_events <= 50_000:
            raise RegistrationError(
                f"{where}: continue_as_new_events must be between 10 and 50,000 "
                "(Temporal ends a run at 51,200 events)"
            )
        if not 2**16 <= self.continue_as_new_bytes <= 40 * 2**20:
            raise RegistrationError(
                f"{where}: continue_as_new_bytes must be between 64 KiB and 40 MiB "
                "(Temporal ends a run at 50 MB of history)"
            )
        object.__setattr__(self, "tool_recovery", dict(self.tool_recovery))
        self._check_approvers(where)
        self._check_limits(where)
        try:
            self.fingerprint  # noqa: B018 - computed now, so a bad identity fails here
        except TypeError as err:
            raise RegistrationError(
                f"{where}: the model's identity must be plain JSON (strings, numbers, "
                f"booleans, lists and dicts), since every worker must compute the same "
                f"fingerprint from it: {err}"
            ) from err

    def _check_limits(self, where: str) -> None:
        for name in ("limits", "limit_cap"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, UsageLimits):
                raise RegistrationError(
                    f"{where}: {name} must be a durably.UsageLimits, got {type(value).__name__}"
                )
        if self.limits is not None and self.limit_cap is not None:
            low = [
                name
                for name, top in self.limit_cap.model_dump(exclude_none=True).items()
                if (own := getattr(self.limits, name)) is not None and top < own
            ]
            if low:
                raise RegistrationError(
                    f"{where}: limit_cap is below limits for {low}; a cap says how far a run's "
                    "limits may be raised, so it must be at least the limit itself"
                )
        cap = self.max_turns_cap
        if cap is not None and (
            isinstance(cap, bool) or not isinstance(cap, int) or cap < self.agent.max_turns
        ):
            raise RegistrationError(
                f"{where}: max_turns_cap must be a whole number at least the agent's "
                f"max_turns ({self.agent.max_turns}), got {cap!r}"
            )
        for model, price in self.prices.items():
            if not isinstance(model, str) or not isinstance(price, Price):
                raise RegistrationError(
                    f"{where}: prices maps a model name (or '*') to a durably.Price, "
                    f"got {model!r}: {price!r}"
                )
        object.__setattr__(self, "prices", dict(self.prices))

    def _check_approvers(self, where: str) -> None:
        approvers: dict[str, tuple[str, ...]] = {}
        for name, people in self.approvers.items():
            t = self.agent.tool(name)
            if t is None or not t.requires_approval:
                raise RegistrationError(
                    f"{where}: approvers names tool {name!r}, which "
                    + ("the agent does not have" if t is None else "does not require approval")
                    + "; approvers apply to tools declared with requires_approval=True"
                )
            if (
                isinstance(people, str)
                or not people
                or not all(isinstance(p, str) and p.strip() for p in people)
            ):
                raise RegistrationError(
                    f"{where}: approvers[{name!r}] must be a non-empty list of names, "
                    f"e.g. ['alice@example.com'], got {people!r}"
                )
            approvers[name] = tuple(sorted(set(people)))
        object.__setattr__(self, "approvers", approvers)

    @property
    def agent_id(self) -> str:
        return self.agent.id

    def recovery(self, tool_name: str) -> Recovery:
        """`tool_recovery`'s policy for the tool, else the tool's own (an MCP tool's,
        from its annotations), else `manual`."""
        own = self.tool_recovery.get(tool_name)
        if own is not None:
            return own
        t = self.agent.tool(tool_name)
        declared = t.recovery if t is not None else None
        return declared if declared in _RECOVERIES else "manual"  # type: ignore[return-value]

    def pin(self) -> AgentPin:
        """What a run pins at start, fingerprint included."""
        return AgentPin(
            agent_id=self.agent.id,
            version=self.version,
            fingerprint=self.fingerprint,
            max_turns=self.agent.max_turns,
            model_retry=self.model_retry.spec() if self.model_retry else None,
            model_heartbeat_timeout_s=self.heartbeat_timeout.total_seconds(),
            model_start_to_close_s=self.model_timeout.total_seconds(),
            tools={
                **{t.name: self._tool_policy(t) for t in self.agent.tools},
                **{s.name: self._subagent_policy(s) for s in self.agent._subagents},
                **{t.name: self._task_policy(t) for t in self.agent.tasks},
            },
            continue_as_new_events=self.continue_as_new_events,
            continue_as_new_bytes=self.continue_as_new_bytes,
            parts=dict(self.pinned_parts),
            max_parallel_tools=self.agent.max_parallel_tools,
            limits=self.limits,
            limit_cap=self.limit_cap,
            max_turns_cap=self.max_turns_cap,
        )

    def _tool_policy(self, t: Tool[Any]) -> ToolPolicy:
        recovery = self.recovery(t.name)
        retry = self.tool_retry
        return ToolPolicy(
            recovery=recovery,
            retry=RetrySpec(
                max_attempts=1 if recovery == "manual" else retry.max_attempts,
                initial_delay_ms=retry.initial_delay_ms,
                max_delay_ms=retry.max_delay_ms,
            ),
            requires_approval=t.requires_approval,
            question=t.is_question,
            signed_approval=t.name in self.approvers,
            approval_timeout_s=t.approval_timeout.total_seconds() if t.approval_timeout else None,
            heartbeat_timeout_s=(t.heartbeat_timeout or self.heartbeat_timeout).total_seconds(),
            start_to_close_s=(t.start_to_close_timeout or self.tool_timeout).total_seconds(),
            output_schema=t.output_schema,
        )

    def _subagent_policy(self, s: Subagent) -> ToolPolicy:
        """A delegated call: no activity of its own (its child run has its tools')."""
        return ToolPolicy(
            recovery="manual",
            retry=RetrySpec(max_attempts=1),
            heartbeat_timeout_s=self.heartbeat_timeout.total_seconds(),
            start_to_close_s=self.tool_timeout.total_seconds(),
            subagent=SubagentTarget(agent_id=s.agent_id, version=s.version),
        )

    def _task_policy(self, t: Tool[Any]) -> ToolPolicy:
        """An owned task: a child run of the task's registration, given the call's arguments."""
        return self._subagent_policy(Subagent(t.name)).model_copy(
            update={"subagent": SubagentTarget(agent_id=t.name, typed=True)}
        )

    @functools.cached_property
    def _identity(self) -> dict[str, Any]:
        """Everything this registration builds, as plain JSON: what `fingerprint` hashes."""
        data: dict[str, Any] = {
            "agent_id": self.agent.id,
            "model": dict(self.agent.model.identity),
            "instructions": self.agent.instructions,
            "max_turns": self.agent.max_turns,
            "tools": [tool_identity(t) for t in self.agent.tools],
            "tool_recovery": dict(sorted(self.tool_recovery.items())),
            "model_retry": self.model_retry.spec().model_dump() if self.model_retry else None,
        }
        if self.approvers:  # absent before approvers existed: earlier fingerprints hold
            data["approvers"] = {name: list(people) for name, people in self.approvers.items()}
        if self.agent._subagents:  # likewise absent unless set
            data["subagents"] = [
                {
                    "name": s.name,
                    "agent_id": s.agent_id,
                    "version": s.version,
                    "about": s.spec.description,
                }
                for s in self.agent._subagents
            ]
        if self.agent.tasks:  # likewise absent unless set
            data["tasks"] = [tool_identity(t) for t in self.agent.tasks]
        window = self.agent.context_window
        if window is not None:  # likewise absent unless set
            data["context_window"] = (
                f"{getattr(window, '__module__', '?')}.{getattr(window, '__qualname__', '?')}"
            )
        return data

    @functools.cached_property
    def fingerprint(self) -> str:
        """A hash of the canonical JSON of everything this registration builds.

        Computed once: every activity checks it, and a registration never changes.
        """
        return _digest(self._identity, 32)

    @functools.cached_property
    def fingerprint_parts(self) -> Mapping[str, str]:
        """A short digest of each part of what `fingerprint` hashes, by part name.

        `model`, `instructions`, `max_turns`, `tool_recovery`, `model_retry`,
        `approvers` (only when set), `tools` (the tools' names, in order),
        and per tool `tool NAME description`, `tool NAME input schema`, `tool
        NAME output schema` and `tool NAME approval` (requires_approval,
        question, approval timeout). Built from the very data the fingerprint
        hashes, so two registrations of one agent with different fingerprints
        differ in at least one part. A run pins them (`AgentPin.parts`), so a
        worker whose definition changed under the same version can say what
        changed.

        .. versionadded:: Unreleased
        """
        data = self._identity
        parts: dict[str, list[Any]] = {}
        for key, value in data.items():
            if key == "tools":
                parts["tools"] = [[t["name"] for t in value]]
            elif key != "agent_id":  # the same agent has the same id
                parts[key] = [value]
        for t in data["tools"]:
            for key, value in t.items():
                if key != "name":
                    part = f"tool {t['name']} {_TOOL_PARTS.get(key, key)}"
                    parts.setdefault(part, []).append([key, value])
        return {name: _digest(values, 8) for name, values in sorted(parts.items())}

    @functools.cached_property
    def pinned_parts(self) -> Mapping[str, str]:
        """`fingerprint_parts`, and `tool_retry`: a run checks it (in `pin_check`) but the
        fingerprint leaves it out. A run pins these, so a worker can say what changed.

        .. versionadded:: Unreleased
        """
        return {**self.fingerprint_parts, "tool_retry": _digest(asdict(self.tool_retry), 8)}

    @property
    def pin_check(self) -> str:
        """What every operation of a run of this registration carries and the worker
        compares with its own, and what the run publishes as `DurablyFingerprint`: a
        digest of the policies it applies (`pin_digest`), not the copyable fingerprint.

        .. versionadded:: Unreleased
        """
        return PIN_DIGEST_PREFIX + self.pin_digest

    @functools.cached_property
    def pin_digest(self) -> str:
        """A hash of the policies a run of this registration applies (`policy_digest`).

        Runs send it with every operation (`PIN_DIGEST_PREFIX` + digest) and
        the worker compares it with its own: a run can only apply the
        approval flags, recovery, retries and schemas this registration sets,
        whatever state it was handed. The fingerprint alone is a copyable
        string.
        """
        return policy_digest(self.pin())


def _digest(data: Any, length: int) -> str:
    """The first `length` hex digits of the SHA-256 of `data`'s canonical JSON."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:length]
