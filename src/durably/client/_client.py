"""`DurableClient`: start, find and list runs. Needs no registry and no worker."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ValidationError
from temporalio.client import Client, WorkflowExecution, WorkflowExecutionStatus
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.runtime import Runtime
from temporalio.service import RPCError, RPCStatusCode

from durably._converter import with_durable_converter
from durably._search_attributes import setup_command
from durably._text import md_text, printable
from durably.agents import AgentRegistration
from durably.client._connect import connect_temporal
from durably.client._handle import RunHandle, temporal_error, too_large
from durably.client._session import SessionHandle
from durably.client._versions import NeededVersion, needed_versions
from durably.codec import EncryptionCodec
from durably.contract import (
    DEFAULT_TASK_QUEUE,
    MAX_NAME_CHARS,
    MAX_RUN_INPUT_BYTES,
    SA_AGENT,
    SA_AGENT_VERSION,
    SA_FINGERPRINT,
    SA_SESSION,
    SA_STATUS,
    SESSION_WORKFLOW_TYPE,
    WORKFLOW_TYPE,
    BudgetExceeded,
    EventType,
    InboxItem,
    RunInput,
    RunSnapshot,
    RunStatus,
    RunSummary,
    SessionInput,
    SessionSummary,
    ToolInterrupted,
    UsageLimits,
)
from durably.errors import (
    DurableConflictError,
    DurablyError,
    InvalidRunInputError,
    RunNotFoundError,
    SearchAttributesMissingError,
)
from durably.registry import AgentRegistry

__all__ = ["DurableClient"]

MAX_RUN_ID_CHARS = 1_000  # Temporal's limit on a workflow id

_UNFINISHED = [s.value for s in RunStatus if s.unfinished]
_FINISHED = [s.value for s in RunStatus if not s.unfinished]
# The search-attribute statuses the inbox lists (found through visibility
# alone), and the inbox kind a run in them shows as when its snapshot cannot be
# read. `retry_wait` is among them: a run waits out its model backoff in a
# durable timer and publishes that status (one started before the
# `durably-seed-fidelity` patch stays `running` then, and is not listed).
_INBOX: dict[RunStatus, Literal["approval", "blocked", "failed", "retry_wait"]] = {
    RunStatus.WAITING: "approval",
    RunStatus.NEEDS_ATTENTION: "blocked",
    RunStatus.FAILED: "failed",
    RunStatus.RETRY_WAIT: "retry_wait",
}


class DurableClient:
    """Operators' entry point. Reach for `DurableClient.connect` first.

    Wrapping a `Client` keeps its data converter (payload codec, failure
    converter, external storage) and only makes payloads pydantic's; a
    converter that cannot be is refused (`DurablyError`). `encryption`
    (`durably.codec`) encrypts payloads.

    .. versionchanged:: Unreleased
       The client's converter is kept; the `encryption` keyword.
    """

    def __init__(
        self,
        client: Client,
        *,
        task_queue: str = DEFAULT_TASK_QUEUE,
        encryption: EncryptionCodec | None = None,
    ) -> None:
        self.temporal = with_durable_converter(client, encryption)
        self.task_queue = task_queue

    @classmethod
    async def connect(
        cls,
        target: str | None = None,
        namespace: str | None = None,
        task_queue: str = DEFAULT_TASK_QUEUE,
        *,
        profile: str | None = None,
        encryption: EncryptionCodec | None = None,
        runtime: Runtime | None = None,
    ) -> DurableClient:
        """Connect from arguments, else `TEMPORAL_ADDRESS`/`TEMPORAL_NAMESPACE`/config file;
        with `encryption`, every payload is encrypted (`durably.codec`). `runtime`
        is Temporal's runtime to connect with (e.g. one serving metrics,
        `durably.telemetry.metrics_runtime`)."""
        temporal = await connect_temporal(
            target, namespace, profile=profile, encryption=encryption, runtime=runtime
        )
        return cls(temporal, task_queue=task_queue)

    async def start_run(
        self,
        agent_id: str,
        input: str,
        *,
        version: str | None = None,
        run_id: str | None = None,
        limits: UsageLimits | Mapping[str, Any] | None = None,
        max_turns: int | None = None,
    ) -> RunHandle:
        """Start a run of `agent_id` (newest registered version unless `version`).

        `limits` (`UsageLimits`, or the same as a mapping) and `max_turns` are
        this run's own: they may tighten the registration's, or raise them up
        to its `limit_cap` / `max_turns_cap`. A run asking for more than the
        registration allows ends `failed` once it pins, saying so.

        Raises `InvalidRunInputError`, with nothing started, for an empty or
        overlong agent id or run id, one holding control characters, an
        input that is not a string of at most `MAX_RUN_INPUT_BYTES` (UTF-8),
        or limits that are not limits.
        """
        _check_start(agent_id, input, version, run_id)
        run_input = _run_input(agent_id, input, version, limits, max_turns)
        run_id = run_id if run_id is not None else f"{agent_id}-{uuid.uuid4().hex[:12]}"
        await self._start(
            WORKFLOW_TYPE,
            # What a person reads as the run's Input in the Web UI: no internal fields.
            run_input.model_dump(mode="json", exclude_none=True),
            workflow_id=run_id,
            what="run",
            search_attributes=[
                SearchAttributePair(SA_STATUS, RunStatus.RUNNING.value),
                SearchAttributePair(SA_AGENT, agent_id),
            ],
            # The Web UI renders the summary as Markdown; the input is anyone's text.
            summary=f"{agent_id}: {md_text(_shorten(input, 120))}",
        )
        return RunHandle(self.temporal, run_id)

    async def start_task(
        self,
        task_id: str,
        input: BaseModel | Mapping[str, Any],
        *,
        version: str | None = None,
        run_id: str | None = None,
        limits: UsageLimits | Mapping[str, Any] | None = None,
        max_turns: int | None = None,
    ) -> RunHandle:
        """Start a run of the custom task `task_id` (`durably.tasks`) with its argument.

        The run is a run like any other (snapshot, statuses, approvals,
        `resolve_tool`, `retry()`, inbox); its output is the task's result,
        as JSON text (a string result as it is). `input` is the task's
        argument: its pydantic model, or the same as a mapping.

        `limits` and `max_turns` are the run's own, as for `start_run`.

        .. versionadded:: Unreleased
        """
        from durably.tasks import task_input

        if not isinstance(input, BaseModel | Mapping):
            raise InvalidRunInputError(
                f"a task's input is its argument, a pydantic model or a mapping; got "
                f"{type(input).__name__}"
            )
        return await self.start_run(
            task_id,
            task_input(input),
            version=version,
            run_id=run_id,
            limits=limits,
            max_turns=max_turns,
        )

    async def _start(
        self,
        workflow_type: str,
        arg: dict[str, Any],
        *,
        workflow_id: str,
        what: Literal["run", "session"],
        search_attributes: list[SearchAttributePair[str]],
        summary: str,
    ) -> None:
        """Start a run or a session under an id never used before, or say why not."""
        try:
            await self.temporal.start_workflow(
                workflow_type,
                arg,
                id=workflow_id,
                task_queue=self.task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                search_attributes=TypedSearchAttributes(search_attributes),
                static_summary=summary,
            )
        except WorkflowAlreadyStartedError as err:
            raise DurableConflictError(
                f"{what} id {workflow_id!r} was already used; {what} ids are never reused. "
                f"Pick a new {what}_id, or omit it to get a generated one."
            ) from err
        except RPCError as err:
            raise self._start_error(err, workflow_id, what) from err

    def _start_error(self, err: RPCError, workflow_id: str, what: str) -> DurablyError:
        """What a refused start means: missing search attributes, an input too large, …"""
        message = err.message.lower()
        if err.status == RPCStatusCode.INVALID_ARGUMENT and "search attribute" in message:
            return SearchAttributesMissingError(
                f"namespace {self.temporal.namespace!r} lacks durably's search attributes; "
                f"nothing was started. Register them with `{setup_command(self.temporal)}` "
                "(connecting as this client does, e.g. with the same --profile; on Temporal "
                f"Cloud it prints the tcld or Cloud UI steps). Server said: {err.message}"
            )
        if too_large(err):
            return InvalidRunInputError(
                f"Temporal refused to start {what} {workflow_id!r}: its input is too large once "
                f"encoded ({err.message}; control characters take 6 bytes each in JSON, and "
                "Temporal refuses payloads over 2 MB). Nothing was started: pass a shorter "
                "input, or store the data elsewhere and pass a reference to it."
            )
        return temporal_error(err, self.temporal, f"the start of {what} {workflow_id!r}")

    async def start_session(
        self, agent_id: str, *, session_id: str | None = None, version: str | None = None
    ) -> SessionHandle:
        """Start a conversation with `agent_id` (newest version unless `version`): each
        `submit` to it is a run that reads every earlier message of the session.

        .. versionadded:: Unreleased
        """
        _check_start(agent_id, "", version, session_id)
        session_id = (
            session_id if session_id is not None else f"{agent_id}-s-{uuid.uuid4().hex[:12]}"
        )
        await self._start(
            SESSION_WORKFLOW_TYPE,
            SessionInput(agent_id=agent_id, version=version).model_dump(exclude_none=True),
            workflow_id=session_id,
            what="session",
            search_attributes=[
                SearchAttributePair(SA_AGENT, agent_id),
                SearchAttributePair(SA_SESSION, session_id),
            ],
            summary=f"session with {agent_id}",
        )
        return SessionHandle(self.temporal, session_id)

    async def get_session(self, session_id: str) -> SessionHandle:
        """A handle on an existing session; `RunNotFoundError` if there is none.

        .. versionadded:: Unreleased
        """
        handle = self.temporal.get_workflow_handle(session_id)
        try:
            described = await handle.describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise RunNotFoundError(
                    f"no session {session_id!r} in namespace {self.temporal.namespace!r}"
                ) from err
            raise temporal_error(
                err, self.temporal, f"the lookup of session {session_id!r}"
            ) from err
        kind = described.workflow_type
        if kind != SESSION_WORKFLOW_TYPE:
            what = f"a run (`durably runs show {session_id}`)" if kind == WORKFLOW_TYPE else kind
            raise DurablyError(
                f"{session_id!r} is not a session but {what}; find sessions with "
                "`durably session list` (or list_sessions())"
            )
        return SessionHandle(self.temporal, session_id)

    async def get_run(self, run_id: str) -> RunHandle:
        """A handle on an existing run; `RunNotFoundError` if there is none."""
        handle = self.temporal.get_workflow_handle(run_id)
        try:
            await handle.describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise RunNotFoundError(
                    f"no run {run_id!r} in namespace {self.temporal.namespace!r}; "
                    "check the id (`durably runs list`)"
                ) from err
            raise temporal_error(err, self.temporal, f"the lookup of run {run_id!r}") from err
        return RunHandle(self.temporal, run_id)

    async def inbox(self, *, limit: int = 200, task_queue: str | None = None) -> list[InboxItem]:
        """Everything that waits for a person, across all runs, oldest first.

        Pending approvals and questions, blocked operations, failed runs and
        retry waits: found through visibility (`DurablyStatus`) alone, described
        by each run's snapshot. `task_queue` keeps to the runs of one deployment.
        (A run started before durably published `retry_wait` waits out its
        model backoff as `running`: it is not listed.)
        """
        # Only open workflows: a run Temporal closed (terminated, timed out)
        # keeps its last status attribute but waits for no one.
        runs = await self._list(
            _query(status=list(_INBOX), task_queue=task_queue, open_only=True), limit
        )
        gate = asyncio.Semaphore(16)

        async def describe(run: RunSummary) -> list[InboxItem]:
            async with gate:
                try:
                    snap = await RunHandle(self.temporal, run.run_id).snapshot()
                except (RPCError, DurablyError) as err:
                    return _unreadable(run, err)
            return [i.model_copy(update={"session_id": run.session_id}) for i in _inbox_items(snap)]

        items = [i for found in await asyncio.gather(*map(describe, runs)) for i in found]
        return sorted(items, key=lambda i: (i.since is None, i.since))

    async def list_runs(
        self,
        *,
        status: RunStatus | str | Sequence[RunStatus | str] | None = None,
        agent_id: str | None = None,
        unfinished: bool | None = None,
        task_queue: str | None = None,
        limit: int | None = 1000,
    ) -> list[RunSummary]:
        """Runs from Temporal visibility, newest first (all task queues unless one is named).

        Visibility trails a run's state by a moment: a run that just changed
        status may still be listed under the old one.
        """
        query = _query(
            status=status, agent_id=agent_id, unfinished=unfinished, task_queue=task_queue
        )
        return await self._list(query, limit)

    async def list_sessions(
        self, *, agent_id: str | None = None, open_only: bool = False, limit: int | None = 1000
    ) -> list[SessionSummary]:
        """Sessions from Temporal visibility, newest first (`open_only`: not yet closed).

        .. versionadded:: Unreleased
        """
        query = _query(agent_id=agent_id, open_only=open_only, workflow_type=SESSION_WORKFLOW_TYPE)
        try:
            return [
                _session_summary(e) async for e in self.temporal.list_workflows(query, limit=limit)
            ]
        except RPCError as err:
            raise temporal_error(err, self.temporal, "the list of sessions") from err

    async def run_stats(
        self, *, agent_id: str | None = None, task_queue: str | None = None
    ) -> dict[RunStatus, int]:
        """How many runs are in each status, from visibility (every status, zeros too).

        A run counts once, in its chain's newest run. Unfinished statuses count
        open runs only: a run Temporal terminated keeps the status it had, and
        is over. Asks the server to group by `DurablyStatus`; one that groups
        only by `ExecutionStatus` (the dev server does) is asked once per status.

        .. versionadded:: Unreleased
        """
        base = _query(agent_id=agent_id, task_queue=task_queue)
        scopes = {
            s: f"{base} AND ExecutionStatus = 'Running'" if s.unfinished else base
            for s in RunStatus
        }
        try:
            try:
                return await self._grouped_stats(scopes)
            except RPCError as err:
                if err.status != RPCStatusCode.INVALID_ARGUMENT:
                    raise
            counts = await asyncio.gather(
                *(
                    self.temporal.count_workflows(f"{q} AND {SA_STATUS.name} = {_quote(s.value)}")
                    for s, q in scopes.items()
                )
            )
        except RPCError as err:
            raise temporal_error(err, self.temporal, "the count of runs") from err
        return {s: c.count for s, c in zip(scopes, counts, strict=True)}

    async def _grouped_stats(self, scopes: Mapping[RunStatus, str]) -> dict[RunStatus, int]:
        """`run_stats` in one grouped count per distinct scope."""
        stats = dict.fromkeys(scopes, 0)
        for query in dict.fromkeys(scopes.values()):
            counted = await self.temporal.count_workflows(f"{query} GROUP BY {SA_STATUS.name}")
            for group in counted.groups:
                value = group.group_values[0] if group.group_values else None
                status = next((s for s in RunStatus if s.value == value), None)
                if status is not None and scopes[status] == query:
                    stats[status] = group.count
        return stats

    async def needed_versions(
        self, registrations: AgentRegistry | Iterable[AgentRegistration] | None = None
    ) -> list[NeededVersion]:
        """The `(agent, version, fingerprint)` triples this task queue's unfinished runs
        pinned, with how many runs and one run id each; checked against `registrations`
        (this worker's) when given.

        Read from visibility (the `DurablyFingerprint` search attribute), never by
        querying a run, so it answers with no worker running; which parts of a
        differing definition changed comes from one run's history per triple.
        Runs pinned by a durably that did not publish the fingerprint are
        `fingerprint_unknown`. `DurableRuntime` runs this check when it starts.

        .. versionadded:: Unreleased
        """
        query = _query(task_queue=self.task_queue, open_only=True)
        return await needed_versions(self.temporal, query, registrations)

    async def _list(self, query: str, limit: int | None) -> list[RunSummary]:
        try:
            return [_summary(e) async for e in self.temporal.list_workflows(query, limit=limit)]
        except RPCError as err:
            raise temporal_error(err, self.temporal, "the list of runs") from err


def _query(
    *,
    status: RunStatus | str | Sequence[RunStatus | str] | None = None,
    agent_id: str | None = None,
    unfinished: bool | None = None,
    task_queue: str | None = None,
    open_only: bool = False,
    workflow_type: str = WORKFLOW_TYPE,
) -> str:
    """The visibility query for durably's runs (or, by `workflow_type`, sessions) that
    match every argument given.

    A run that continued as new keeps its last `DurablyStatus`, but its chain goes
    on in the newest run, which is the one listed; unfinished runs are open ones
    (a run Temporal terminated keeps its status too, and is over). A session
    continues as new between runs: its newest run is the one listed too.
    """
    clauses = [f"WorkflowType = {_quote(workflow_type)}"]
    if open_only or unfinished is True:
        clauses.append("ExecutionStatus = 'Running'")
    else:
        clauses.append("ExecutionStatus != 'ContinuedAsNew'")
    if task_queue is not None:
        clauses.append(f"TaskQueue = {_quote(task_queue)}")
    if isinstance(status, str):
        clauses.append(f"{SA_STATUS.name} = {_quote(RunStatus(status).value)}")
    elif status is not None:
        wanted = ", ".join(_quote(RunStatus(v).value) for v in status)
        clauses.append(f"{SA_STATUS.name} IN ({wanted})")
    if agent_id is not None:
        clauses.append(f"{SA_AGENT.name} = {_quote(agent_id)}")
    if unfinished is True:
        clauses.append(f"{SA_STATUS.name} IN ({', '.join(map(_quote, _UNFINISHED))})")
    elif unfinished is False:
        clauses.append(f"{SA_STATUS.name} IN ({', '.join(map(_quote, _FINISHED))})")
    return " AND ".join(clauses)


def _run_input(
    agent_id: str,
    input: str,
    version: str | None,
    limits: UsageLimits | Mapping[str, Any] | None,
    max_turns: int | None,
) -> RunInput:
    """The start input, or `InvalidRunInputError` naming the limit that does not fit."""
    try:
        return RunInput(
            agent_id=agent_id,
            input=input,
            version=version,
            limits=None if limits is None else UsageLimits.model_validate(_plain(limits)),
            max_turns=max_turns,
        )
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "limits"
        raise InvalidRunInputError(
            f"{where[:100]}: {first['msg'][:200]}. Nothing was started: limits are "
            f"{', '.join(UsageLimits.model_fields)} (tokens and requests whole numbers from 1, "
            "tool_calls from 0, cost_usd and wall_clock_s above 0), and max_turns a whole "
            "number from 1."
        ) from None


def _plain(limits: UsageLimits | Mapping[str, Any]) -> Any:
    return dict(limits) if isinstance(limits, Mapping) else limits


def _check_start(agent_id: str, input: str, version: str | None, run_id: str | None) -> None:
    """Raise `InvalidRunInputError` unless a run can start with these arguments."""
    _check_id("agent_id", agent_id, MAX_NAME_CHARS, "the `id` of a registered Agent")
    if version is not None:
        _check_id("version", version, MAX_NAME_CHARS, "a registered version, or None")
    if run_id is not None:
        _check_id("run_id", run_id, MAX_RUN_ID_CHARS, "or None for a generated one")
    if not isinstance(input, str):
        raise InvalidRunInputError(
            f"input must be a str (the user's request); got {type(input).__name__}. "
            "Nothing was started: pass the text, e.g. json.dumps(data) for structured data."
        )
    # Each character is at least one byte: only a short enough string needs encoding.
    size = len(input) if len(input) > MAX_RUN_INPUT_BYTES else _utf8_size(input)
    if size > MAX_RUN_INPUT_BYTES:
        raise InvalidRunInputError(
            f"input is {size:,} bytes (UTF-8); a run's input holds at most "
            f"{MAX_RUN_INPUT_BYTES:,} bytes (1 MiB). Nothing was started: pass a shorter input, "
            "or store the data elsewhere and pass a reference to it."
        )


def _check_id(field: str, value: object, limit: int, hint: str) -> None:
    if not isinstance(value, str):
        raise InvalidRunInputError(
            f"{field} must be a str ({hint}); got {type(value).__name__}. Nothing was started."
        )
    problem = None
    if not value.strip():
        problem = "is empty" if not value else "is only whitespace"
    elif len(value) > limit:
        problem = f"is {len(value):,} characters long, more than {limit:,}"
    elif printable(value) != value:
        problem = f"holds control characters ({printable(value)[:200]})"
    if problem is not None:
        raise InvalidRunInputError(
            f"{field} {problem}; it must be 1 to {limit:,} printable characters ({hint}). "
            "Nothing was started."
        )


def _utf8_size(text: str) -> int:
    try:
        return len(text.encode())
    except UnicodeEncodeError as err:
        raise InvalidRunInputError(
            f"input is not valid Unicode text ({err.reason} at position {err.start}). "
            "Nothing was started: pass text without lone surrogates."
        ) from err


def _inbox_items(snap: RunSnapshot) -> list[InboxItem]:
    """What a parked run waits for, in words: one item per blocked operation, per failed
    operation and per pending interaction.

    Under the parallel-tools patch one turn can hold all three at once, and the run's
    status names only the most urgent (needs_attention > failed > waiting): listing by
    status alone would hide an approval pending beside a blocked call.
    """
    since = snap.events[-1].at if snap.events else None
    base = {
        "run_id": snap.run_id,
        "agent_id": snap.agent_id,
        "status": snap.status,
        "since": since,
        "parent_run_id": snap.parent_run_id,
        "usage": snap.usage,
    }
    blocked: list[str | None] = [*snap.blocked_operations]
    if not blocked and snap.status == RunStatus.NEEDS_ATTENTION:
        blocked = [None]  # a run parked before operations were named
    failed: list[str | None] = [*snap.failed_operations]
    if not failed and snap.status == RunStatus.FAILED:
        failed = [None]
    items = [
        *(
            InboxItem(**base, kind="blocked", waiting_for=_blocked_text(snap, op), operation=op)
            for op in blocked
        ),
        *(
            InboxItem(**base, kind="failed", waiting_for=_failed_text(snap, op), operation=op)
            for op in failed
        ),
        *(
            InboxItem(
                **base,
                kind="question" if i.type == "question" else "approval",
                waiting_for=(
                    f"answer: {i.question}"
                    if i.type == "question"
                    else f"approve {i.tool}({_shorten(json.dumps(i.args), 80)})"
                ),
                interaction_id=i.id,
                operation=i.operation,
            )
            for i in snap.interactions
        ),
    ]
    if snap.status == RunStatus.RETRY_WAIT:
        items.append(
            InboxItem(
                **base,
                kind="retry_wait",
                waiting_for=f"attempt {snap.attempt} of a model request",
                next_attempt_at=snap.next_attempt_at,
            )
        )
    return items


def _blocked_text(snap: RunSnapshot, operation: str | None) -> str:
    """What to do about one blocked operation. The snapshot's `attention` is the first
    blocked operation's; another one's reason is read from its latest event."""
    first = operation is None or operation == snap.blocked_operation
    attention = snap.attention if first else None
    if isinstance(attention, ToolInterrupted):
        return f"verify {attention.tool} in the external system, then resolve it"
    if isinstance(attention, BudgetExceeded):
        return (
            f"its {attention.limit} limit ({attention.used:g} of {attention.value:g}) is "
            "reached: raise it (raise_limits) or cancel the run"
        )
    if attention is not None and attention.reason == "subagent_failed":
        child = attention.detail.get("child_run_id")
        return f"its subagent run {child} failed: retry that run, or resolve this call"
    if attention is not None:
        return f"{attention.reason}: fix it, then retry"
    reason = _latest_detail(snap, EventType.NEEDS_ATTENTION, operation)
    if (operation or "").startswith("tool:") and reason in (None, "tool_interrupted"):
        return "verify this call in the external system, then resolve it"
    return f"{reason or 'unknown'}: fix it, then retry"


def _failed_text(snap: RunSnapshot, operation: str | None) -> str:
    """What to do about one failed operation. The snapshot's `error` is the first failed
    operation's; another one's error is read from its latest event."""
    first = operation is None or operation == snap.failed_operations[0]
    error = snap.error if first else _latest_detail(snap, EventType.RUN_FAILED, operation)
    shown = _shorten(error, 120) if error else f"see `durably runs show {snap.run_id}`"
    return f"retry after fixing: {shown}"


def _latest_detail(snap: RunSnapshot, event_type: EventType, operation: str | None) -> str | None:
    """The detail of the run's latest `event_type` event on `operation`, if still shown."""
    for event in reversed(snap.events):
        if event.type == event_type and event.operation == operation:
            return event.detail
    return None


def _unreadable(run: RunSummary, err: Exception) -> list[InboxItem]:
    if run.status not in _INBOX:
        return []
    return [
        InboxItem(
            run_id=run.run_id,
            agent_id=run.agent_id,
            status=run.status,
            session_id=run.session_id,
            kind=_INBOX[run.status],
            waiting_for=f"(snapshot unavailable: {err}; is a worker running?)",
        )
    ]


def _summary(e: WorkflowExecution) -> RunSummary:
    sa = e.typed_search_attributes
    status = sa.get(SA_STATUS)
    session = sa.get(SA_SESSION)
    return RunSummary(
        run_id=e.id,
        agent_id=sa.get(SA_AGENT),
        agent_version=sa.get(SA_AGENT_VERSION),
        status=RunStatus(status) if status in set(RunStatus) else None,
        started_at=e.start_time,
        closed_at=e.close_time if isinstance(e.close_time, datetime) else None,
        fingerprint=sa.get(SA_FINGERPRINT),
        session_id=session,
        # A session's runs are its children too; a subagent's run is a run's.
        parent_run_id=e.parent_id if e.parent_id and e.parent_id != session else None,
    )


def _session_summary(e: WorkflowExecution) -> SessionSummary:
    return SessionSummary(
        session_id=e.id,
        agent_id=e.typed_search_attributes.get(SA_AGENT),
        open=e.status == WorkflowExecutionStatus.RUNNING,
        started_at=e.start_time,
        closed_at=e.close_time if isinstance(e.close_time, datetime) else None,
    )


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _shorten(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
