"""The typed operator API: what a snapshot holds, and approve / deny / answer / pending.

Server-free: the snapshot derived from a run's state, snapshots exchanged
between clients and workers of different releases, the response and
resolution types, the client's error table, and the call id's wire name in
every recorded history. Then the same API end to end on the dev server.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from pydantic_core import to_json
from temporalio.client import WorkflowHistory
from temporalio.exceptions import ApplicationError

from durably import (
    Agent,
    AgentRegistration,
    Answer,
    Approval,
    Denial,
    DurableClient,
    DurableConflictError,
    ErrorResolution,
    Interaction,
    InteractionConflictError,
    InvalidResponseError,
    InvalidRunInputError,
    JsonResolution,
    OtherAttention,
    RerunResolution,
    RunStatus,
    ScriptedModel,
    ToolCall,
    ToolContext,
    ToolInterrupted,
    ToolResultMessage,
    VersionIncompatible,
    VersionMissing,
    tool,
    tool_call,
)
from durably._transcript import EMPTY_DIGEST, SHORT_DIGEST, extend_digest, transcript_digest
from durably.approvals import ApprovalKeys
from durably.client._handle import durably_error
from durably.contract import (
    ACTIVITY_MODEL,
    ACTIVITY_RESTORE,
    ACTIVITY_TOOL,
    WORKFLOW_TYPE,
    Attention,
    ErrorType,
    LeanToolResult,
    MessageRef,
    ModelCallInput,
    ModelCallResult,
    Resolution,
    Response,
    RunInput,
    RunSnapshot,
    RunState,
    ToolCallInput,
    TranscriptArchive,
    TranscriptPage,
    TranscriptRestoreRequest,
)
from durably.errors import DurablyError
from durably.messages import AssistantMessage, Message
from durably.workflows._snapshot import build_snapshot

from .conftest import Runtimes, asker, echo, history_length, wait_for_status

# -- the snapshot, derived from state -----------------------------------------------

INTERACTION = Interaction(
    id="approval:1:c1",
    type="tool-approval",
    operation="tool:1:c1",
    tool="refund",
    args={"order": "A1"},
    args_digest="d" * 32,
)


def _state(**fields: Any) -> RunState:
    return RunState(agent_id="desk", input="hi", digest=EMPTY_DIGEST, **fields)


def _outcome(snap: RunSnapshot) -> dict[str, Any] | None:
    """The deprecated `outcome`, read without its warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return snap.outcome


class TestSnapshot:
    def test_a_waiting_run_lists_its_pending_interaction_and_the_first_is_interaction(
        self,
    ) -> None:
        snap = build_snapshot("r1", _state(status=RunStatus.WAITING, interaction=INTERACTION), None)

        assert snap.interactions == [INTERACTION]
        assert snap.interaction == INTERACTION
        assert _outcome(snap) == {
            "type": "interaction",
            "interaction": INTERACTION.model_dump(mode="json"),
        }
        assert (snap.output, snap.blocked_operations, snap.attention) == (None, [], None)

    def test_a_run_started_by_0_1_0_keeps_its_stored_outcome(self) -> None:
        """0.1.0 stored the waiting outcome in state; the snapshot shows it unchanged."""
        stored = {"type": "interaction", "interaction": INTERACTION.model_dump(mode="json")}
        state = _state(status=RunStatus.WAITING, interaction=INTERACTION, outcome=stored)

        snap = build_snapshot("r1", state, None)

        assert _outcome(snap) == stored
        assert snap.interactions == [INTERACTION]

    def test_an_answered_interaction_is_no_longer_pending(self) -> None:
        """A run that is running again holds no pending interaction, whatever its state kept."""
        snap = build_snapshot("r1", _state(status=RunStatus.RUNNING, interaction=INTERACTION), None)

        assert snap.interactions == []
        assert snap.interaction is None

    def test_a_completed_run_shows_its_output(self) -> None:
        state = _state(
            status=RunStatus.COMPLETED, outcome={"type": "completed", "output": "Refunded."}
        )

        snap = build_snapshot("r1", state, None)

        assert snap.output == "Refunded."
        assert _outcome(snap) == {"type": "completed", "output": "Refunded."}

    def test_an_interrupted_tool_is_typed_and_keeps_its_detail_for_older_readers(self) -> None:
        detail = {"tool": "refund", "args": {"order": "A1"}, "attempts": 1, "last_error": "boom"}
        state = _state(
            status=RunStatus.NEEDS_ATTENTION,
            blocked_operation="tool:1:c1",
            attention=Attention(reason="tool_interrupted", detail=detail),
        )

        snap = build_snapshot("r1", state, None)

        assert snap.blocked_operations == ["tool:1:c1"]
        assert snap.blocked_operation == "tool:1:c1"
        attention = snap.attention
        assert isinstance(attention, ToolInterrupted)
        assert (attention.tool, attention.args, attention.attempts, attention.last_error) == (
            "refund",
            {"order": "A1"},
            1,
            "boom",
        )
        with pytest.warns(DeprecationWarning, match="read the typed fields"):
            assert attention.detail == detail

    @pytest.mark.parametrize(
        ("reason", "kind"),
        [("version_missing", VersionMissing), ("version_incompatible", VersionIncompatible)],
    )
    def test_a_version_problem_is_typed_by_its_reason(self, reason: str, kind: type) -> None:
        detail = {"reason": reason, "agent_id": "desk", "version": "1", "last_error": "gone"}
        state = _state(
            status=RunStatus.NEEDS_ATTENTION,
            blocked_operation="model:2",
            attention=Attention(reason=reason, detail=detail),
        )

        attention = build_snapshot("r1", state, None).attention

        assert isinstance(attention, kind)
        assert isinstance(attention, VersionMissing | VersionIncompatible)
        assert (attention.reason, attention.agent_id, attention.version) == (reason, "desk", "1")
        assert attention.last_error == "gone"

    def test_a_reason_this_client_does_not_know_is_other_attention(self) -> None:
        """A newer worker's reason parses, with its detail, instead of failing the snapshot."""
        wire = {
            "run_id": "r1",
            "agent_id": "desk",
            "status": "needs_attention",
            "attention": {"reason": "budget_exceeded", "detail": {"limit": "tokens"}},
        }

        attention = RunSnapshot.model_validate_json(json.dumps(wire)).attention

        assert isinstance(attention, OtherAttention)
        assert (attention.reason, attention.detail) == ("budget_exceeded", {"limit": "tokens"})


class TestSnapshotSent:
    @pytest.mark.parametrize("status", ["waiting", "needs_attention", "completed"])
    def test_each_value_is_sent_once_and_a_client_reads_back_the_whole_snapshot(
        self, status: str
    ) -> None:
        """A query result must stay under 2 MB: large arguments or output are sent once,
        not once per view of them."""
        big = "x" * 100_000
        state = {
            "waiting": _state(
                status=RunStatus.WAITING,
                interaction=INTERACTION.model_copy(update={"args": {"doc": big}}),
            ),
            "needs_attention": _state(
                status=RunStatus.NEEDS_ATTENTION,
                blocked_operation="tool:1:c1",
                attention=Attention(
                    reason="tool_interrupted", detail={"tool": "t", "args": {"doc": big}}
                ),
            ),
            "completed": _state(
                status=RunStatus.COMPLETED, outcome={"type": "completed", "output": big}
            ),
        }[status]
        snap = build_snapshot("r1", state, None)

        sent = to_json(snap)  # what the payload converter sends
        read = RunSnapshot.model_validate_json(sent)

        assert sent.count(big.encode()) == 1
        assert dict(read) == dict(snap)


class TestSnapshotWire:
    """What the worker sends, for every status, reads back as the snapshot it built."""

    @pytest.mark.parametrize("status", list(RunStatus))
    def test_every_status_reads_back_whole(self, status: RunStatus) -> None:
        fields: dict[str, Any] = {"status": status}
        if status == RunStatus.WAITING:
            fields["interaction"] = INTERACTION
        elif status == RunStatus.NEEDS_ATTENTION:
            fields["blocked_operation"] = "tool:1:c1"
            fields["attention"] = Attention(
                reason="tool_interrupted", detail={"tool": "refund", "args": {"a": 1}}
            )
        elif status == RunStatus.FAILED:
            fields.update(error="boom", failed_operation="model:2")
        elif status == RunStatus.COMPLETED:
            fields["outcome"] = {"type": "completed", "output": "done"}
        snap = build_snapshot("r1", _state(**fields), "now")

        read = RunSnapshot.model_validate_json(to_json(snap))

        assert dict(read) == dict(snap)
        assert read.interaction == snap.interaction

    def test_arguments_that_are_not_equal_to_themselves_are_still_sent_once(self) -> None:
        """A model may write NaN in a call's arguments; large ones still go once."""
        big = "x" * 1_200_000
        state = _state(
            status=RunStatus.WAITING,
            interaction=INTERACTION.model_copy(update={"args": {"doc": big, "n": float("nan")}}),
        )

        sent = to_json(build_snapshot("r1", state, None))

        assert sent.count(big.encode()) == 1 and len(sent) < 2 * len(big)

    @pytest.mark.parametrize(
        "attention",
        [
            {"reason": "tool_interrupted", "detail": {"args": {}}},  # no tool
            {"reason": "version_missing", "detail": {}},  # no agent_id or version
        ],
    )
    def test_an_attention_missing_its_fields_is_shown_as_it_came(
        self, attention: dict[str, Any]
    ) -> None:
        snap = RunSnapshot.model_validate(
            {"run_id": "r1", "agent_id": "a", "status": "needs_attention", "attention": attention}
        )

        assert isinstance(snap.attention, OtherAttention)
        assert (snap.attention.reason, snap.attention.detail) == (
            attention["reason"],
            attention["detail"],
        )

    def test_an_attention_as_the_run_keeps_it_is_accepted(self) -> None:
        kept = Attention(reason="tool_interrupted", detail={"tool": "refund"})

        snap = RunSnapshot(
            run_id="r1", agent_id="a", status=RunStatus.NEEDS_ATTENTION, attention=kept
        )

        assert isinstance(snap.attention, ToolInterrupted) and snap.attention.tool == "refund"


class _OldAttention(BaseModel):
    model_config = ConfigDict(extra="ignore")
    reason: str
    detail: dict[str, Any] = Field(default_factory=dict)


class _OldSnapshot(BaseModel):
    """The snapshot as the release before the typed API read it."""

    model_config = ConfigDict(extra="ignore")
    status: RunStatus
    outcome: dict[str, Any] | None = None
    blocked_operation: str | None = None
    attention: _OldAttention | None = None


class TestSnapshotAcrossReleases:
    def test_an_older_workers_snapshot_gets_the_typed_fields(self) -> None:
        """A client upgraded before its workers reads what they send as typed fields."""
        waiting = {
            "run_id": "r1",
            "agent_id": "desk",
            "status": "waiting",
            "outcome": {"type": "interaction", "interaction": INTERACTION.model_dump(mode="json")},
        }
        blocked = {
            "run_id": "r1",
            "agent_id": "desk",
            "status": "needs_attention",
            "blocked_operation": "tool:1:c1",
            "attention": {"reason": "tool_interrupted", "detail": {"tool": "refund"}},
        }
        completed = {
            "run_id": "r1",
            "agent_id": "desk",
            "status": "completed",
            "outcome": {"type": "completed", "output": "done"},
        }

        assert RunSnapshot.model_validate(waiting).interactions == [INTERACTION]
        snap = RunSnapshot.model_validate(blocked)
        assert snap.blocked_operations == ["tool:1:c1"]
        assert isinstance(snap.attention, ToolInterrupted) and snap.attention.tool == "refund"
        assert RunSnapshot.model_validate(completed).output == "done"

    @pytest.mark.parametrize("status", ["waiting", "needs_attention", "completed"])
    def test_an_older_client_reads_a_newer_snapshot_as_before(self, status: str) -> None:
        """The typed fields are added beside what older clients read, never instead of it."""
        state = {
            "waiting": _state(status=RunStatus.WAITING, interaction=INTERACTION),
            "needs_attention": _state(
                status=RunStatus.NEEDS_ATTENTION,
                blocked_operation="tool:1:c1",
                attention=Attention(reason="tool_interrupted", detail={"tool": "refund"}),
            ),
            "completed": _state(
                status=RunStatus.COMPLETED, outcome={"type": "completed", "output": "done"}
            ),
        }[status]
        stored = state.model_copy(update={"outcome": state.outcome})
        snap = build_snapshot("r1", state, None)

        old = _OldSnapshot.model_validate_json(snap.model_dump_json())

        assert old.outcome == _outcome(snap)
        assert old.blocked_operation == stored.blocked_operation
        expected = stored.attention.model_dump() if stored.attention else None
        assert (old.attention.model_dump() if old.attention else None) == expected


# -- responses and resolutions ------------------------------------------------------


class TestResponseTypes:
    @pytest.mark.parametrize(
        ("typed", "wire"),
        [
            (Approval(), {"type": "tool-approval", "approved": True}),
            (
                Approval(args_digest="d" * 32, token="v1.k.x"),
                {
                    "type": "tool-approval",
                    "approved": True,
                    "args_digest": "d" * 32,
                    "token": "v1.k.x",
                },
            ),
            (
                Denial(reason="over the limit"),
                {"type": "tool-approval", "approved": False, "reason": "over the limit"},
            ),
            (Answer(answer="A1"), {"type": "question", "answer": "A1"}),
        ],
    )
    def test_a_response_is_the_documented_json_and_the_run_reads_it(
        self, typed: BaseModel, wire: dict[str, Any]
    ) -> None:
        assert typed.model_dump(mode="json", exclude_none=True) == wire
        parsed = TypeAdapter(Response).validate_python(wire, strict=True)
        assert parsed.model_dump(exclude_none=True) == wire

    @pytest.mark.parametrize(
        ("typed", "wire"),
        [
            (
                JsonResolution(value={"ticket_id": "T-1"}),
                {"type": "json", "value": {"ticket_id": "T-1"}},
            ),
            (ErrorResolution(message="no ticket"), {"type": "error", "message": "no ticket"}),
            (RerunResolution(), {"type": "rerun"}),
        ],
    )
    def test_a_resolution_is_the_documented_json(
        self, typed: BaseModel, wire: dict[str, Any]
    ) -> None:
        assert typed.model_dump(mode="json") == wire
        assert TypeAdapter(Resolution).validate_python(wire) == typed

    def test_a_plain_object_without_its_type_is_still_refused(self) -> None:
        """`type` defaults only when a model is built: the run never guesses it."""
        with pytest.raises(ValueError, match="tag"):
            TypeAdapter(Response).validate_python({"approved": True})


class TestErrorTable:
    @pytest.mark.parametrize(
        ("error_type", "error"),
        [
            (ErrorType.DURABLE_CONFLICT, DurableConflictError),
            (ErrorType.INTERACTION_CONFLICT, InteractionConflictError),
            (ErrorType.INVALID_RESPONSE, InvalidResponseError),
            (ErrorType.INVALID_RUN_INPUT, InvalidRunInputError),
        ],
    )
    def test_each_failure_type_becomes_its_error_with_the_runs_message(
        self, error_type: ErrorType, error: type[DurablyError]
    ) -> None:
        mapped = durably_error(ApplicationError("what went wrong", type=error_type))
        assert type(mapped) is error
        assert str(mapped) == "what went wrong"

    def test_other_failures_map_to_nothing(self) -> None:
        assert durably_error(ApplicationError("x", type=ErrorType.MODEL_ERROR)) is None
        assert durably_error(RuntimeError("x")) is None
        assert durably_error(None) is None


# -- one Python name for a call's id; the wire keeps "id" --------------------------------


class TestCallId:
    def test_a_call_is_built_with_either_name_and_read_as_call_id(self) -> None:
        by_wire_name = ToolCall(id="c1", name="refund")
        by_name = ToolCall(call_id="c1", name="refund")

        assert by_wire_name == by_name
        assert by_name.call_id == ToolResultMessage(call_id="c1", tool="r", content="").call_id
        assert by_name.model_dump() == {
            "id": "c1",
            "name": "refund",
            "arguments": {},
            "raw_arguments": None,
        }
        assert tool_call("refund", call_id="c1").call_id == "c1"

    def test_id_and_a_copy_updating_id_still_work_deprecated(self) -> None:
        call = ToolCall(id="c1", name="refund")
        with pytest.warns(DeprecationWarning, match="read ToolCall.call_id"):
            assert call.id == "c1"
        with pytest.warns(DeprecationWarning, match="update 'call_id'"):
            assert call.model_copy(update={"id": "c2"}).call_id == "c2"


_HISTORIES = Path(__file__).parent / "histories"
# Runs' histories (a session's own history holds no run input or model request).
HISTORIES = {
    f"{p.parent.name}/{p.stem}": p
    for p in sorted(_HISTORIES.glob("*/*.json"))
    if f'"name": "{WORKFLOW_TYPE}"' in p.read_text()[:4000]
}
_MESSAGE = TypeAdapter[Message](Message)
_CALL = TypeAdapter(ToolCall)
_INPUTS: dict[str, type[BaseModel]] = {
    ACTIVITY_MODEL: ModelCallInput,
    ACTIVITY_TOOL: ToolCallInput,
    ACTIVITY_RESTORE: TranscriptRestoreRequest,
}
_RESULTS: dict[str, type[BaseModel]] = {
    ACTIVITY_MODEL: ModelCallResult,
    ACTIVITY_TOOL: ToolResultMessage,
    ACTIVITY_RESTORE: TranscriptPage,
}


class _History:
    """What a recorded history proves about its run's wire format, read event by event.

    Every message and tool call it holds must serialize today to the very
    bytes the payload holds, and every transcript digest the run recorded
    (each model request's, an archive's) must come out the same when
    recomputed from the messages with today's models.
    """

    def __init__(self) -> None:
        self.length: int | None = None  # the run's transcript so far: length and digest
        self.digest = EMPTY_DIGEST
        self.outputs: dict[str, Message] = {}  # an activity's message, by activity id (its ref)
        self.scheduled: dict[int, tuple[str, str]] = {}  # event id -> activity type, id
        self.archive: TranscriptArchive | None = None
        self.pages: list[Message] = []
        self.messages = self.calls = self.digests = self.model_requests = 0

    def read(self, e: Any) -> None:
        if e.HasField("workflow_execution_started_event_attributes"):
            self._run_input(_data(e.workflow_execution_started_event_attributes.input))
        elif e.HasField("workflow_execution_continued_as_new_event_attributes"):
            self._run_input(_data(e.workflow_execution_continued_as_new_event_attributes.input))
        elif e.HasField("activity_task_scheduled_event_attributes"):
            a = e.activity_task_scheduled_event_attributes
            self.scheduled[e.event_id] = (a.activity_type.name, a.activity_id)
            if a.activity_type.name in _INPUTS:
                self._input(a.activity_type.name, _data(a.input))
        elif e.HasField("activity_task_completed_event_attributes"):
            done = e.activity_task_completed_event_attributes
            kind, activity_id = self.scheduled[done.scheduled_event_id]
            if kind in _RESULTS:
                self._result(kind, activity_id, _data(done.result))

    def _run_input(self, data: bytes) -> None:
        state = RunInput.model_validate_json(data).carried
        if state is None:
            self.length, self.digest = 0, EMPTY_DIGEST
            return
        self._same_bytes(data, list(state.transcript))
        if state.archive is not None:
            self.archive = state.archive
            if self.length is not None:  # the run that continued as new: its archive
                self._extend(state.archive.base_length, state.archive.new, state.archive.digest)
        elif state.transcript:
            self._check(transcript_digest(state.transcript), state.digest)
            self.length, self.digest = len(state.transcript), state.digest

    def _input(self, kind: str, data: bytes) -> None:
        request = _INPUTS[kind].model_validate_json(data)
        if isinstance(request, ModelCallInput):
            self.model_requests += 1
            self._same_bytes(data, [m for m in request.new if not isinstance(m, MessageRef)])
            self._extend(request.base_length, request.new, request.digest)
        elif isinstance(request, ToolCallInput):
            if not self._lean(data, request):
                self._same_bytes(data, [], [request.call])
        elif isinstance(request, TranscriptRestoreRequest):
            self.archive = request.archive

    def _result(self, kind: str, activity_id: str, data: bytes) -> None:
        result = _RESULTS[kind].model_validate_json(data)
        if isinstance(result, ModelCallResult):
            if not self._lean(data, result):
                self._same_bytes(data, [result.message])
            self.outputs[activity_id] = result.message
        elif isinstance(result, ToolResultMessage):
            if not self._lean(data, LeanToolResult.of(result)):
                self._same_bytes(data, [result])
            self.outputs[activity_id] = result
        elif isinstance(result, TranscriptPage):
            self._same_bytes(data, list(result.messages))
            self.pages = [*(self.pages if result.offset else []), *result.messages]
            if self.archive is not None and len(self.pages) == result.total:
                self._check(transcript_digest(self.pages), self.archive.digest)
                self.length, self.digest = result.total, self.archive.digest

    def _lean(self, data: bytes, wrapper: ModelCallResult | ToolCallInput | LeanToolResult) -> bool:
        """A wrapper recorded lean (without what its reader defaults, since the
        seed-fidelity patch) serializes back to its very bytes, messages and calls included."""
        if to_json(wrapper) != data:
            return False
        if isinstance(wrapper, ModelCallResult):
            self.messages += 1
            self.calls += len(wrapper.message.tool_calls)
        elif isinstance(wrapper, ToolCallInput):
            self.calls += 1
        else:
            self.messages += 1
        return True

    def _same_bytes(self, data: bytes, messages: list[Any], calls: Any = ()) -> None:
        nested = [c for m in messages if isinstance(m, AssistantMessage) for c in m.tool_calls]
        for m in messages:
            assert _MESSAGE.dump_json(m) in data, m
        for c in [*calls, *nested]:
            assert _CALL.dump_json(c) in data, c
            assert b'{"id":' + json.dumps(c.call_id).encode() + b',"name":' in data
        self.messages += len(messages)
        self.calls += len(calls) + len(nested)

    def _extend(self, base_length: int, new: list[Message | MessageRef], digest: str) -> None:
        """Recompute `digest` from the known transcript plus `new`, where both are known
        (a message sent by reference to a person's answer is not in an activity's result)."""
        resolved = [self.outputs.get(m.ref) if isinstance(m, MessageRef) else m for m in new]
        if self.length == base_length and all(m is not None for m in resolved):
            folded = self.digest
            for m in resolved:
                assert m is not None
                folded = extend_digest(folded, m)
            self._check(folded, digest)
            self.length, self.digest = base_length + len(new), folded
            return
        # A short digest cannot be extended: later ones are checked from a known point.
        known = len(digest) > SHORT_DIGEST
        self.length, self.digest = (base_length + len(new) if known else None), digest

    def _check(self, recomputed: str, recorded: str) -> None:
        """`recorded` is the whole digest, or (since the seed-fidelity patch) its first
        `SHORT_DIGEST` hex digits."""
        assert recomputed == recorded or (
            len(recorded) == SHORT_DIGEST and recomputed.startswith(recorded)
        )
        self.digests += 1


def _data(payloads: Any) -> bytes:
    [payload] = payloads.payloads
    return bytes(payload.data)


class TestWireCompatibility:
    @pytest.mark.parametrize("name", sorted(HISTORIES))
    def test_recorded_calls_and_messages_serialize_to_the_same_bytes_and_digests(
        self, name: str
    ) -> None:
        """Every message, tool call and transcript page a recorded history holds serializes
        byte for byte through today's models, and the transcript digests the run recorded
        come out unchanged: naming the attribute `call_id` changed no byte on the wire."""
        history = _History()
        events = WorkflowHistory.from_json(name, HISTORIES[name].read_text()).events
        for event in events:
            history.read(event)

        refused = events[
            -1
        ].workflow_execution_failed_event_attributes.failure.application_failure_info.type
        if refused == "DurablyInvalidRunInput":
            return  # a run refused at its start holds no message to check
        assert history.messages > 0
        if history.model_requests:
            assert history.digests > 0, "no recorded digest could be recomputed"

    def test_the_histories_hold_tool_calls_and_digests_to_check(self) -> None:
        """The check above is not vacuous: it meets many calls and digests."""
        calls = digests = 0
        for path in HISTORIES.values():
            history = _History()
            for event in WorkflowHistory.from_json(path.stem, path.read_text()).events:
                history.read(event)
            calls += history.calls
            digests += history.digests
        assert len(HISTORIES) >= 20
        assert calls >= 50 and digests >= 50, (calls, digests)


# -- end to end ----------------------------------------------------------------------


class Order(BaseModel):
    order: str


def _refunds(made: list[str], **registration: Any) -> AgentRegistration:
    @tool(requires_approval=True)
    async def refund(args: Order, ctx: ToolContext) -> str:
        """Refund an order."""
        made.append(args.order)
        return f"refunded {args.order}"

    agent = Agent(
        id="refunder",
        model=ScriptedModel([tool_call("refund", call_id="c1", order="A1"), echo]),
        instructions="",
        tools=[refund],
    )
    return AgentRegistration(agent, version="1", **registration)


async def _waiting(
    client: DurableClient, runtimes: Runtimes, made: list[str], **options: Any
) -> Any:
    await runtimes.start([_refunds(made, **options.pop("registration", {}))], **options)
    run = await client.start_run("refunder", "refund A1")
    await wait_for_status(run, RunStatus.WAITING)
    return run


class TestApproveDenyAnswer:
    async def test_approve_runs_the_pending_call_it_was_given(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        made: list[str] = []
        run = await _waiting(client, runtimes, made)

        [pending] = await run.pending()
        accepted = await run.approve(pending, responder="alice")
        again = await run.approve(pending, responder="alice")
        result = await run.result()

        assert (pending.id, pending.tool, pending.args) == (
            "approval:1:c1",
            "refund",
            {"order": "A1"},
        )
        assert (accepted.approved, accepted.responder) == (True, "alice")
        assert accepted.args_digest == pending.args_digest
        assert again == accepted
        assert made == ["A1"]
        snap = await run.snapshot()
        assert snap.output == result.output
        assert (snap.interactions, snap.interaction) == ([], None)

    async def test_reading_snapshots_adds_nothing_to_history(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        run = await _waiting(client, runtimes, [])
        before = await history_length(client, run)

        for _ in range(3):
            assert (await run.snapshot()).interaction is not None
        await run.pending()

        assert await history_length(client, run) == before
        await run.cancel()

    async def test_deny_with_a_reason_reaches_the_model_and_the_tool_never_runs(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        made: list[str] = []
        run = await _waiting(client, runtimes, made)

        accepted = await run.deny("approval:1:c1", reason="over the limit", responder="bob")

        assert accepted.approved is False
        assert json.loads((await run.result()).output or "") == [
            {"error": True, "content": "denied: over the limit"}
        ]
        assert made == []

    async def test_an_approval_bound_to_other_arguments_is_refused(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        made: list[str] = []
        run = await _waiting(client, runtimes, made)

        with pytest.raises(InvalidResponseError, match="the arguments differ"):
            await run.approve("approval:1:c1", args_digest="0" * 32)

        assert (await run.snapshot()).status == RunStatus.WAITING
        await run.cancel()

    async def test_answer_gives_the_question_tool_its_result(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        await runtimes.start([asker()])
        run = await client.start_run("asker", "help me")
        await wait_for_status(run, RunStatus.WAITING)

        [question] = await run.pending()
        await run.answer(question, "A1", responder="carol")

        assert (question.type, question.question) == ("question", "Which order?")
        assert json.loads((await run.result()).output or "") == [{"error": False, "content": "A1"}]


class TestSignedDecisions:
    KEYS = ApprovalKeys({"k1": b"k" * 32})

    async def test_approve_with_keys_signs_as_the_responder(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        made: list[str] = []
        run = await _waiting(
            client,
            runtimes,
            made,
            registration={"approvers": {"refund": ["alice"]}},
            approval_keys=self.KEYS,
        )
        [pending] = await run.pending()
        assert pending.signed

        with pytest.raises(InvalidResponseError, match="takes signed decisions only"):
            await run.approve(pending, responder="alice")  # refused before it is sent
        await run.approve(pending.id, responder="alice", keys=self.KEYS)

        await run.result()
        assert made == ["A1"]


class TestTypedAttention:
    async def test_an_interrupted_manual_tool_is_typed_and_resolved_with_a_typed_resolution(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        @tool
        async def file_ticket(args: Order, ctx: ToolContext) -> str:
            """File a ticket."""
            raise ConnectionError("the ticket service reset the connection")

        agent = Agent(
            id="filer",
            model=ScriptedModel([tool_call("file_ticket", call_id="c1", order="A1"), echo]),
            instructions="",
            tools=[file_ticket],
        )
        await runtimes.start([AgentRegistration(agent, version="1")])
        run = await client.start_run("filer", "file it")
        snap = await wait_for_status(run, RunStatus.NEEDS_ATTENTION)

        attention = snap.attention
        assert isinstance(attention, ToolInterrupted)
        assert (attention.tool, attention.args) == ("file_ticket", {"order": "A1"})
        assert "reset the connection" in (attention.last_error or "")
        assert snap.blocked_operations == ["tool:1:c1"]

        await run.resolve_tool(snap.blocked_operations[0], JsonResolution(value="T-1"))

        assert json.loads((await run.result()).output or "") == [{"error": False, "content": "T-1"}]
