"""The data that crosses the workflow, activity and client boundaries.

Everything here is stored in workflow histories (activity inputs and
results, queries, the run's own input), so a field is only ever added with
a default; renaming or removing one breaks the replay of existing runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SerializerFunctionWrapHandler,
    Tag,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)
from temporalio.common import SearchAttributeKey

from durably.messages import (
    USAGE_ADDED,
    AssistantMessage,
    Message,
    ToolCall,
    ToolResultMessage,
    Usage,
)

__all__ = [
    "ACTIVITY_CONFIRM_ADVANCED",
    "ACTIVITY_CONFIRM_STATUS",
    "ACTIVITY_MODEL",
    "ACTIVITY_PIN",
    "ACTIVITY_RESTORE",
    "ACTIVITY_RUN_TRANSCRIPT",
    "ACTIVITY_TOOL",
    "ACTIVITY_VERIFY_APPROVAL",
    "ACTIVITY_VERIFY_ORIGIN",
    "ACTIVITY_VERIFY_REPAIR",
    "CONTROL_CHARACTERS",
    "DEFAULT_TASK_QUEUE",
    "EVENTS_RETAINED",
    "EVENTS_TOPIC",
    "INVALID_RUN_INPUT",
    "MAX_ANSWER_BYTES",
    "MAX_BATCH_ANSWER_BYTES",
    "MAX_BATCH_RESPONSES",
    "MAX_NAME_CHARS",
    "MAX_REASON_CHARS",
    "MAX_RUN_INPUT_BYTES",
    "MAX_TOKEN_CHARS",
    "PIN_DIGEST_PREFIX",
    "RESPOND_SIGNAL",
    "SA_AGENT",
    "SA_AGENT_VERSION",
    "SA_SESSION",
    "SA_STATUS",
    "SEARCH_ATTRIBUTES",
    "SESSION_WORKFLOW_TYPE",
    "SNAPSHOT_INPUT_CHARS",
    "WORKFLOW_TYPE",
    "AdvanceCheck",
    "AgentPin",
    "Answer",
    "Approval",
    "ApprovalResponse",
    "Attention",
    "BudgetExceeded",
    "CloseRequest",
    "ConversationRef",
    "Denial",
    "ErrorResolution",
    "ErrorType",
    "EventType",
    "Handler",
    "HeldResult",
    "IfBusy",
    "InboxItem",
    "Interaction",
    "JsonResolution",
    "LiveEvent",
    "LiveItem",
    "LiveText",
    "MessageRef",
    "ModelCallInput",
    "ModelCallResult",
    "OperationFate",
    "OperationKey",
    "OriginCheck",
    "OtherAttention",
    "ParkedCall",
    "PinRequest",
    "QuestionResponse",
    "RaiseLimitsAccepted",
    "RaiseLimitsRequest",
    "Recovery",
    "RepairCheck",
    "RepairPlan",
    "RepairReport",
    "RepairRequest",
    "RerunResolution",
    "Resolution",
    "ResolveToolAccepted",
    "ResolveToolRequest",
    "RespondAccepted",
    "RespondManyAccepted",
    "RespondManyRequest",
    "RespondRequest",
    "Response",
    "RetryAccepted",
    "RetryRequest",
    "RetrySpec",
    "RunAttention",
    "RunEvent",
    "RunInput",
    "RunResult",
    "RunSnapshot",
    "RunState",
    "RunStatus",
    "RunStatusNote",
    "RunSummary",
    "RunTranscriptRequest",
    "SessionCarried",
    "SessionEventType",
    "SessionHandler",
    "SessionInput",
    "SessionLiveEvent",
    "SessionRun",
    "SessionSnapshot",
    "SessionSummary",
    "StatusCheck",
    "SubmitAccepted",
    "SubmitRequest",
    "TextPreview",
    "ToolCallInput",
    "ToolInterrupted",
    "ToolPolicy",
    "TranscriptArchive",
    "TranscriptPage",
    "TranscriptRestoreRequest",
    "UsageLimits",
    "VerifyApprovalRequest",
    "VersionIncompatible",
    "VersionMissing",
    "operation_id",
]

WORKFLOW_TYPE = "AgentRunWorkflow"
SESSION_WORKFLOW_TYPE = "AgentSessionWorkflow"
DEFAULT_TASK_QUEUE = "durably"
# The activity names are fixed: they dispatch through the worker's registry,
# so renaming a user's function or adding an agent never changes a history.
ACTIVITY_PIN = "durably.pin_agent"
ACTIVITY_MODEL = "durably.model_request"
ACTIVITY_TOOL = "durably.tool_call"
ACTIVITY_RESTORE = "durably.restore_transcript"
ACTIVITY_VERIFY_APPROVAL = "durably.verify_approval"
ACTIVITY_RUN_TRANSCRIPT = "durably.run_transcript"
ACTIVITY_VERIFY_REPAIR = "durably.verify_repair"
ACTIVITY_VERIFY_ORIGIN = "durably.verify_origin"
ACTIVITY_CONFIRM_STATUS = "durably.confirm_status"
ACTIVITY_CONFIRM_ADVANCED = "durably.confirm_advanced"


class SessionHandler(StrEnum):
    """The session workflow's queries and updates, by the names Temporal knows them."""

    SNAPSHOT = "snapshot"  # query -> SessionSnapshot
    TRANSCRIPT = "transcript"  # query (offset, limit) -> TranscriptPage: the conversation
    SUBMIT = "submit"  # update SubmitRequest -> SubmitAccepted
    CLOSE = "close"  # update CloseRequest -> SessionSnapshot
    # signal RunStatusNote, from the session's own runs: one is failed (or not, again).
    RUN_STATUS = "run_status"


class Handler(StrEnum):
    """The run's queries, updates and signal, by the names Temporal knows them."""

    SNAPSHOT = "snapshot"  # query -> RunSnapshot
    TRANSCRIPT = "transcript"  # query (offset, limit) -> TranscriptPage
    RESPOND = "respond"  # update RespondRequest -> RespondAccepted
    # update RespondManyRequest -> RespondManyAccepted: several at once, all or none.
    RESPOND_MANY = "respond_many"
    # From a subagent's run to its parent: its status changed (ChildStatusNote).
    CHILD_STATUS = "child_status"
    RESOLVE_TOOL = "resolve_tool"  # update ResolveToolRequest -> ResolveToolAccepted
    # update RaiseLimitsRequest -> RaiseLimitsAccepted: a run parked on a limit goes on.
    RAISE_LIMITS = "raise_limits"
    RETRY = "retry"  # update RetryRequest -> RetryAccepted
    # The signal a person answers with when updates are out of reach (CLI, Web UI).
    RESPOND_SIGNAL = "respond_signal"
    # From a run's session: a later submission went ahead of this failed run, which ends.
    SESSION_ADVANCED = "session_advanced"
    # From `durably repair` (RepairRequest): the run was reset past a workflow task that
    # does not replay; it learns what became of the operations the reset discarded.
    REPAIR = "repair"


RESPOND_SIGNAL = Handler.RESPOND_SIGNAL.value  # 0.1.0's name for it; prefer `Handler`


class ErrorType(StrEnum):
    """`ApplicationError.type` of every failure durably raises on purpose.

    The first group are the workflow's rejections of a request, which the
    client maps back to its exceptions (`durably.client` keeps that table);
    the rest are activity failures the workflow classifies.
    """

    DURABLE_CONFLICT = "DurableConflictError"
    INTERACTION_CONFLICT = "InteractionConflictError"
    INVALID_RESPONSE = "InvalidResponseError"
    # How a run whose start input was refused fails.
    INVALID_RUN_INPUT = "DurablyInvalidRunInput"
    VERSION_MISSING = "DurablyVersionMissing"
    VERSION_INCOMPATIBLE = "DurablyVersionIncompatible"
    MODEL_ERROR = "DurablyModelError"
    POST_PROCESSING = "DurablyPostProcessingError"
    TOOL_CRASHED = "DurablyToolCrashed"
    TRANSCRIPT_MISMATCH = "DurablyTranscriptMismatch"
    TRANSCRIPT_LOST = "DurablyTranscriptLost"
    STALE_ATTEMPT = "DurablyStaleAttempt"
    RESULT_TOO_LARGE = "DurablyResultTooLarge"
    # A subagent call's child run failed (it stays open) or ended without an answer.
    SUBAGENT_FAILED = "DurablySubagentFailed"
    # A model or tool activity scheduled by a workflow that is not a durably run.
    FOREIGN_CALLER = "DurablyForeignCaller"


INVALID_RUN_INPUT = ErrorType.INVALID_RUN_INPUT.value  # 0.1.0's name; prefer `ErrorType`


class EventType(StrEnum):
    """What a `RunEvent` records (its `type`). Kept as plain strings in events, so a
    client older than the worker still reads a run whose events it does not know."""

    AGENT_PINNED = "agent_pinned"
    MODEL_COMPLETED = "model_completed"
    WAITING = "waiting"
    APPROVED = "approved"
    DENIED = "denied"
    ANSWERED = "answered"
    TIMED_OUT = "timed_out"
    TOOL_COMPLETED = "tool_completed"
    TOOL_ERROR = "tool_error"
    TOOL_RESOLVED = "tool_resolved"
    TOOL_REJECTED = "tool_rejected"
    NEEDS_ATTENTION = "needs_attention"
    RUN_FAILED = "run_failed"
    RETRIED = "retried"
    # An operator raised the run's usage limits (`raise_limits`).
    LIMITS_RAISED = "limits_raised"
    # A model request failed and will be tried again (`model_retry`): the run is
    # in `retry_wait` until then.
    RETRY_WAIT = "retry_wait"
    RESOLVED_JSON = "resolved_json"
    RESOLVED_ERROR = "resolved_error"
    RESOLVED_RERUN = "resolved_rerun"
    TRANSCRIPT_RESTORED = "transcript_restored"
    CONTINUE_AS_NEW_REFUSED = "continue_as_new_refused"
    RESPONSE_REJECTED = "response_rejected"
    SIGNAL_REJECTED = "signal_rejected"
    RUN_COMPLETED = "run_completed"
    RUN_CANCELLED = "run_cancelled"
    # `durably repair` reset the run; the detail names who, why, and each operation's fate.
    REPAIRED = "repaired"
    # Live events only (`RunHandle.events`), never kept in the snapshot: an operation
    # began, or the run continued as new (the stream goes on in the next run).
    # A subagent call started its child run (detail: the child's run id).
    SUBAGENT_STARTED = "subagent_started"
    # A session's run that ran again learned its session went ahead of it (no more retries).
    SESSION_WENT_AHEAD = "session_went_ahead"
    # Live only: a subagent's run changed status (its `detail` names the child run).
    SUBAGENT_STATUS = "subagent_status"
    MODEL_STARTED = "model_started"
    TOOL_STARTED = "tool_started"
    CONTINUED_AS_NEW = "continued_as_new"


# Activity inputs' `fingerprint` starting with this hold a digest of the run's
# whole pin (see `AgentRegistration.pin_digest`), not the fingerprint alone.
PIN_DIGEST_PREFIX = "p1:"

# What an outside caller may send (SPEC section 20). Each value is stored in
# history once, where Temporal puts it; durably never copies it again, and
# these bounds keep one workflow task's completion far below gRPC's 4 MB.
MAX_RUN_INPUT_BYTES = 2**20  # the run's input text, UTF-8
MAX_ANSWER_BYTES = 512 * 2**10  # a question's answer, UTF-8: a person's text, not a file
MAX_REASON_CHARS = 4_000  # a denial's reason, read by the model
MAX_NAME_CHARS = 200  # a responder or client identity; an agent id
MAX_TOKEN_CHARS = 200  # a signed approval token
MAX_BATCH_RESPONSES = 100  # responses in one `respond_many` (or one signal's list)
MAX_BATCH_ANSWER_BYTES = 2**20  # the answers of one batch together, UTF-8
# C0 and C1 controls and DEL: never part of a name, an id or an identity.
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f]")

# Custom search attributes (Keyword) every run keeps current; the dev server
# and any cluster running durably must have them registered.
SA_STATUS = SearchAttributeKey.for_keyword("DurablyStatus")
SA_AGENT = SearchAttributeKey.for_keyword("DurablyAgent")
SA_AGENT_VERSION = SearchAttributeKey.for_keyword("DurablyAgentVersion")
# The pinned registration's fingerprint, short (see `short_fingerprint`): a
# starting worker compares it with what it hosts without querying any run.
SA_FINGERPRINT = SearchAttributeKey.for_keyword("DurablyFingerprint")
# The session a run belongs to, on the session workflow and on each of its runs.
SA_SESSION = SearchAttributeKey.for_keyword("DurablySession")
SEARCH_ATTRIBUTES = (SA_STATUS, SA_AGENT, SA_AGENT_VERSION, SA_FINGERPRINT, SA_SESSION)

Recovery = Literal["manual", "safe", "idempotent"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


def _without_nones(data: dict[str, Any], *keys: str) -> dict[str, Any]:
    """`data` without those of `keys` that are None: a reader defaults them, and an
    activity's input and result are stored in history every turn."""
    for key in keys:
        if key in data and data[key] is None:
            del data[key]
    return data


def operation_id(run_id: str, chain: str | None, key: str) -> str:
    """An operation's full external key, as tools and signed approvals see it.

    `chain` is the first execution run id of the run's chain (runs started by
    0.1.0 have none): a run id reused through a raw client never repeats an
    operation id. Keys and chains hold no "/", so the id splits from the right.
    """
    return f"{run_id}/{chain}/{key}" if chain else f"{run_id}/{key}"


@dataclass(frozen=True)
class OperationKey:
    """An operation's checkpoint key: the activity id, and part of its operation id.

    The run protocol writes it as `pin`, `model:{turn}`, `tool:{turn}:{call_id}`
    or `restore:{offset}` (in activity ids, operation ids and state).
    """

    kind: Literal["pin", "model", "tool", "restore"]
    turn: int = 0
    call_id: str = ""
    offset: int = 0

    @classmethod
    def model(cls, turn: int) -> OperationKey:
        return cls("model", turn=turn)

    @classmethod
    def tool(cls, turn: int, call_id: str) -> OperationKey:
        return cls("tool", turn=turn, call_id=call_id)

    @classmethod
    def restore(cls, offset: int) -> OperationKey:
        return cls("restore", offset=offset)

    def interaction_id(self, policy: ToolPolicy) -> str:
        """The id of the interaction a person answers for this tool call."""
        return f"{'question' if policy.question else 'approval'}:{self.turn}:{self.call_id}"

    def __str__(self) -> str:
        if self.kind == "model":
            return f"model:{self.turn}"
        if self.kind == "tool":
            return f"tool:{self.turn}:{self.call_id}"
        if self.kind == "restore":
            return f"restore:{self.offset}"
        return "pin"


class RunStatus(StrEnum):
    RUNNING = "running"
    WAITING = "waiting"
    RETRY_WAIT = "retry_wait"
    NEEDS_ATTENTION = "needs_attention"
    FAILED = "failed"
    COMPLETED = "completed"
    CANCELLED = "cancelled"

    @property
    def unfinished(self) -> bool:
        return self not in (RunStatus.COMPLETED, RunStatus.CANCELLED)


class ConversationRef(_Model):
    """The conversation before a session's run, by reference: never a copy.

    The session workflow holds the conversation (every earlier run's
    messages, once) and serves it by its `transcript` query; a run holds
    this reference and sends it with each model request, and only the
    model activity reads the messages (its worker's cache, else the
    query). `digest` proves what it read: the whole transcript digest of
    the first `length` messages. A run honours one only when Temporal
    says the session is its parent.
    """

    session_id: str
    length: int
    digest: str


class UsageLimits(_Model):
    """What one run may use before it parks in `needs_attention` (`budget_exceeded`).

    Each limit is checked before each model request and each tool call as
    "usage so far >= limit" (a request's tokens are unknown until it is
    answered, so one request may overshoot by its own size); never in the
    middle of an operation. None is no limit. `wall_clock_s` counts from
    the start of the run's chain (continue-as-new does not reset it).
    Requests and cost count every attempt the run saw, failed ones too.
    """

    model_config = ConfigDict(extra="forbid")

    input_tokens: int | None = Field(default=None, ge=1, le=10**15)
    output_tokens: int | None = Field(default=None, ge=1, le=10**15)
    total_tokens: int | None = Field(default=None, ge=1, le=10**15)
    requests: int | None = Field(default=None, ge=1, le=10**9)
    # 0: the run may call no tools.
    tool_calls: int | None = Field(default=None, ge=0, le=10**9)
    cost_usd: float | None = Field(default=None, gt=0, le=10**9, allow_inf_nan=False)
    wall_clock_s: float | None = Field(default=None, gt=0, le=10**10, allow_inf_nan=False)

    def merged(self, other: UsageLimits) -> UsageLimits:
        """These limits with each limit `other` sets in its place."""
        return self.model_copy(update=other.model_dump(exclude_none=True))


class RunInput(_Model):
    """The workflow's input; plain JSON so any Temporal client can start a run.

    `version` None means the newest version registered on the worker that
    picks the run up. `carried` is set only by durably's own continue-as-new:
    a run honours it only when Temporal says the run continues another
    (`workflow.info().continued_run_id`), never from a starter.
    """

    agent_id: str
    input: str
    version: str | None = None
    carried: RunState | None = None
    # Set by the session workflow that starts the run as its child (SPEC section 13).
    session: ConversationRef | None = None
    # Set by the parent run whose call started this one (SPEC section 16).
    parent: ParentCall | None = None
    # The caller's limits for this run (SPEC section 17): they may tighten the
    # registration's, or raise them up to the registration's `limit_cap`.
    limits: UsageLimits | None = None
    # The caller's turn budget for this run: at most the agent's `max_turns`, or the
    # registration's `max_turns_cap`.
    max_turns: int | None = Field(default=None, ge=1, le=10_000)


class RetrySpec(_Model):
    """An activity retry policy in plain numbers (history-friendly)."""

    max_attempts: int
    initial_delay_ms: int = 1000
    max_delay_ms: int = 30_000


class ToolPolicy(_Model):
    """How the workflow schedules one tool: pinned at run start."""

    recovery: Recovery = "manual"
    retry: RetrySpec
    requires_approval: bool = False
    question: bool = False
    approval_timeout_s: float | None = None
    # Approvals must carry a token signed by a key the worker holds, from an
    # approver on the registration's allow-list (`AgentRegistration.approvers`).
    signed_approval: bool = False
    heartbeat_timeout_s: float
    start_to_close_s: float
    output_schema: dict[str, Any] = Field(default_factory=dict)
    # The call is delegated: it starts this agent's run as a child (SPEC section 16).
    subagent: SubagentTarget | None = None


class SubagentTarget(_Model):
    """The agent (and version: None is the newest) a subagent tool's calls run. `typed`:
    a custom task owned by the agent, whose run takes the call's arguments as JSON."""

    agent_id: str
    version: str | None = None
    typed: bool = False


class ParentCall(_Model):
    """What a parent run passes the child run it starts for one of its calls: honoured
    only when Temporal says that run is the child's parent."""

    run_id: str
    operation: str


class ChildRun(_Model):
    """A subagent's run, as its parent keeps it: its status as the child last said, and
    what it waits for."""

    operation: str
    run_id: str
    status: str = "running"
    detail: str | None = None
    # The `seq` of the child's latest note taken: an older one arriving late is ignored.
    seq: int = 0


class ChildStatusNote(_Model):
    """A child run tells its parent its status changed (`child_status` signal). `seq`
    orders a child's notes (its run event count when it sent it); `detail` is bounded."""

    run_id: str = Field(max_length=1000)
    status: RunStatus
    detail: str | None = Field(default=None, max_length=1000)
    seq: int = 0


class AgentPin(_Model):
    """What a run pins at start: the exact registration and its settings."""

    agent_id: str
    version: str
    fingerprint: str
    max_turns: int
    model_retry: RetrySpec | None = None
    model_heartbeat_timeout_s: float
    model_start_to_close_s: float
    tools: dict[str, ToolPolicy]
    # A run continues as new once its history holds this many events or bytes.
    continue_as_new_events: int = 10_000
    continue_as_new_bytes: int = 10 * 2**20
    # A short digest of each part of the fingerprint (`AgentRegistration.
    # fingerprint_parts`), so a worker whose definition differs can say which
    # part changed. None in runs pinned before durably recorded them.
    parts: dict[str, str] | None = None
    # How many calls of one model answer run at once (None: all of them); only runs
    # under the parallel-tools patch read it.
    max_parallel_tools: int | None = None
    # The registration's usage limits, and how far a caller may raise them (per field;
    # None: up to the limits themselves) and the turn budget (SPEC section 17). Not part
    # of the fingerprint, nor of what activities check: tuning them needs no new version.
    limits: UsageLimits | None = None
    limit_cap: UsageLimits | None = None
    max_turns_cap: int | None = None


class PinRequest(_Model):
    agent_id: str
    version: str | None = None


class MessageRef(_Model):
    """A message the run received as an activity result, named by its key.

    The model activity rebuilds it from the worker's cache instead of
    receiving it again as input: that is what keeps history linear.
    """

    ref: str


class ModelCallInput(_Model):
    """One model request, sent as a delta against the worker's transcript cache.

    `base_length` is the length of the transcript the previous request saw;
    `new` holds what was added since, inline or by reference; `digest` is the
    digest of the whole transcript after `new`, which proves a rebuilt
    transcript is the run's own. The run id is the activity's workflow id.
    Every byte here is stored in history once per turn, so it stays lean.
    """

    agent_id: str
    version: str
    fingerprint: str
    key: str
    base_length: int
    new: list[Message | MessageRef]
    # The first 32 hex digits of it (128 bits) in runs under the seed-fidelity patch.
    digest: str
    # The attempt, from the second on, when the run retries the request itself
    # (`model_retry`): each attempt is an activity of its own, always Temporal's attempt 1.
    attempt: int | None = None
    # A session's run: the conversation the model reads before the run's own messages.
    prefix: ConversationRef | None = None

    @model_serializer(mode="wrap")
    def _lean(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_nones(handler(self), "attempt", "prefix")


class ModelCallResult(_Model):
    """The model's answer, plus the tool calls that must not run.

    `call_errors` maps a call id to why it cannot run (unknown tool,
    arguments that fail the input model); the workflow hands that error to
    the model as the call's result without scheduling anything.
    """

    message: AssistantMessage
    usage: Usage
    call_errors: dict[str, str] = Field(default_factory=dict)

    @model_serializer(mode="wrap")
    def _lean(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Once per turn in history: leave out what every reader defaults (an empty
        `call_errors`, no `content`, no `raw_arguments`). Only this wrapper is lean; a
        message's own encoding, which transcript digests hash, is unchanged."""
        data: dict[str, Any] = handler(self)
        if not data.get("call_errors"):
            data.pop("call_errors", None)
        message = data.get("message")
        if isinstance(message, dict):
            _without_nones(message, "content")
            for call in message.get("tool_calls") or ():
                _without_nones(call, "raw_arguments")
        return data


class ToolCallInput(_Model):
    """One tool call; the run id is the activity's workflow id.

    `chain` is the first execution run id of the run's chain (stable across
    continue-as-new and `retry()`), part of `operation_id` for runs started
    since it was added, so a reused run id never repeats an operation id.
    """

    agent_id: str
    version: str
    fingerprint: str
    key: str
    call: ToolCall
    chain: str | None = None

    @model_serializer(mode="wrap")
    def _lean(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = _without_nones(handler(self), "chain")
        if isinstance(data.get("call"), dict):
            _without_nones(data["call"], "raw_arguments")
        return data


class LeanToolResult(ToolResultMessage):
    """A tool call's result as the tool activity returns it: once per turn in history,
    without what the workflow's `ToolResultMessage` defaults (`role`, `is_error`
    false). The message's own encoding, which transcript digests hash, is unchanged."""

    @classmethod
    def of(cls, result: ToolResultMessage) -> LeanToolResult:
        return cls.model_construct(**dict(result))

    @model_serializer(mode="wrap")
    def _lean(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        data.pop("role", None)
        if data.get("is_error") is False:
            del data["is_error"]
        return data


class VerifyApprovalRequest(_Model):
    """Check a signed approval worker-side, with keys history never sees."""

    agent_id: str
    version: str
    fingerprint: str
    tool: str
    operation_id: str
    interaction_id: str
    args_digest: str
    approved: bool
    approver: str | None
    token: str | None
    reason: str | None = None


class TranscriptPage(_Model):
    """A page of a run's transcript, for workers whose cache missed."""

    offset: int
    messages: list[Message]
    total: int


class TranscriptArchive(_Model):
    """Where a continued-as-new run finds the transcript it did not carry.

    Continue-as-new input is one payload, limited to 2 MB, and a long run's
    transcript outgrows that. So the transcript stays in the run that
    continued as new (`run_id`, a Temporal run id of the same workflow),
    and the new run copies it into its own history page by page before
    its next turn: it never depends on an old run outliving the
    namespace's retention. `length` and `digest` name exactly what was
    left; `base_length` and `new` are the last model request's view plus
    what came after (as in `ModelCallInput`), so a worker whose cache holds
    the run restores without asking the old run at all.
    """

    run_id: str
    length: int
    digest: str
    base_length: int
    new: list[Message | MessageRef]


class TranscriptRestoreRequest(_Model):
    """One page of an archived transcript, from `offset`."""

    archive: TranscriptArchive
    offset: int


# Resolutions and responses: an operator builds one (`JsonResolution(value=...)`,
# `Denial(reason=...)`) or sends the same JSON; `type` is what tells them apart on
# the wire, so it defaults here and stays required in a plain object.


class JsonResolution(_Model):
    """The call's real result, read from the external system; checked against its output schema."""

    type: Literal["json"] = "json"
    value: Any


class ErrorResolution(_Model):
    """The call is known to have failed; the model reads `message` as its error."""

    type: Literal["error"] = "error"
    message: str = Field(min_length=1)


class RerunResolution(_Model):
    """The operator verified the effect did not happen: run the call once more."""

    type: Literal["rerun"] = "rerun"


Resolution = Annotated[
    JsonResolution | ErrorResolution | RerunResolution, Field(discriminator="type")
]


class ResolveToolRequest(_Model):
    """`resolve_tool` update input.

    `resolution` stays a plain object here so the workflow's validator, not
    the payload converter, rejects a bad one, with a message that says why.
    """

    operation: str
    resolution: dict[str, Any]


class ResolveToolAccepted(_Model):
    operation: str
    type: str


class RaiseLimitsRequest(_Model):
    """`raise_limits` update input: new values for some of the run's limits (the others
    stay), each at most what the registration's `limit_cap` allows."""

    limits: UsageLimits
    responder: str | None = Field(default=None, max_length=MAX_NAME_CHARS)


class RaiseLimitsAccepted(_Model):
    """The limits the run applies now, and the operations it goes on with."""

    limits: UsageLimits
    resumed: list[str] = Field(default_factory=list)


class RetryRequest(_Model):
    """`retry` update input (empty today; a model so fields can be added)."""


class RetryAccepted(_Model):
    operation: str | None
    previous_status: RunStatus


class RepairRequest(_Model):
    """`repair` signal input: who repairs the run and why (self-declared, for the audit)."""

    responder: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    reason: str | None = Field(default=None, max_length=MAX_REASON_CHARS)


class AdvanceCheck(_Model):
    """Whether session `session_id` took a submission after run `run_id`
    (`confirm_advanced`): what a `session_advanced` signal, which anyone may send, says."""

    session_id: str
    run_id: str


class StatusCheck(_Model):
    """A run whose status a note claimed, for the worker to read from the server
    (`confirm_status`): a note is a signal, which anyone may send."""

    workflow_id: str


class OriginCheck(_Model):
    """The workflows Temporal says a run came from, for its worker to confirm are
    durably's own on the run's task queue (`verify_origin`) before the run honours
    what they passed it."""

    workflow_id: str
    task_queue: str
    # `workflow.info().continued_run_id`: the run that continued as new into this one,
    # which must be of this run's own type.
    predecessor_run_id: str | None = None
    predecessor_type: str = WORKFLOW_TYPE
    # `workflow.info().parent`: the session or run that started this one as its child;
    # `parent_type` None: either.
    parent_workflow_id: str | None = None
    parent_run_id: str | None = None
    parent_type: str | None = None


class RepairCheck(_Model):
    """What the worker reads to learn what a reset discarded (`verify_repair`)."""

    workflow_id: str
    run_id: str


class OperationFate(_Model):
    """What became of an operation a reset discarded from the run's history.

    `completed`: its activity returned `result` (a tool's `ToolResultMessage`, a
    model's `ModelCallResult`), which the repaired run commits instead of running it
    again. `uncertain`: it started and its outcome is unknown (it timed out, failed
    or was still running), so a manual call parks as after a crash, and any other
    operation runs again under its unchanged operation id. `not_started`: it was
    scheduled and never began; it runs.
    """

    operation: str
    activity: str
    outcome: Literal["completed", "uncertain", "not_started"]
    result: dict[str, Any] | None = None
    detail: str = ""


class RepairPlan(_Model):
    """The worker's account of a reset (`verify_repair`), read from the server: the run
    this one was reset from, the last event it kept, and the fate of each operation
    scheduled after it. `refused` says why there is nothing to apply."""

    base_run_id: str | None = None
    kept_through: int = 0
    reason: str = ""
    fates: list[OperationFate] = Field(default_factory=list)
    refused: str | None = None


class RepairReport(_Model):
    """What `RunHandle.repair` did: the first task that did not replay, the new run the
    reset made, and what the repaired run will do with each discarded operation."""

    run_id: str
    previous_run_id: str
    new_run_id: str
    reset_to_event: int
    replay_failure: str
    fates: list[OperationFate] = Field(default_factory=list)


class Interaction(_Model):
    """What a waiting run asks a person: approve a tool call, or answer a question.

    `args_digest` is a hash of the call's canonical arguments; an approval
    that echoes it is accepted only for exactly the call the person saw.
    `operation_id` is the call's full external key, what a signed approval
    token signs; `expires_at` is when `approval_timeout` answers for a person.
    """

    id: str
    type: Literal["tool-approval", "question"]
    operation: str
    tool: str
    args: dict[str, Any]
    args_digest: str
    question: str | None = None
    operation_id: str | None = None
    signed: bool = False
    expires_at: datetime | None = None


class ApprovalResponse(_Model):
    """A decision on a tool approval, as it travels: `Approval` or `Denial` build one.

    `args_digest` (the interaction's) binds the decision to the call the
    person saw; `token` is a signed approval (`durably.approvals`).
    """

    type: Literal["tool-approval"] = "tool-approval"
    approved: bool
    reason: str | None = None
    args_digest: str | None = None
    token: str | None = None


class Approval(ApprovalResponse):
    """Approve the call: it runs. `reason` is recorded, not read by the model."""

    approved: Literal[True] = True


class Denial(ApprovalResponse):
    """Deny the call: it never runs, and the model reads `denied: <reason>`."""

    approved: Literal[False] = False


class Answer(_Model):
    """A question's answer: the model reads `answer` as the question tool's result."""

    type: Literal["question"] = "question"
    answer: str


QuestionResponse = Answer  # 0.1.0's name for it, kept for one release

Response = Annotated[ApprovalResponse | Answer, Field(discriminator="type")]


class RespondRequest(_Model):
    """`respond` update / `respond_signal` input.

    `response` stays a plain object so the workflow, not the payload
    converter, rejects a bad one with a message that says why. `responder`
    is who answered and `identity` the Temporal client's identity, both
    declared by the caller and recorded in the run's events as such.
    """

    interaction_id: str
    response: dict[str, Any]
    responder: str | None = None
    identity: str | None = None


class RespondManyRequest(_Model):
    """`respond_many` update input: several responses of one run, accepted all or none.

    Each entry follows `respond`'s rules (idempotence, conflicts, args
    digests); one entry refused refuses the whole batch and records nothing.
    """

    responses: list[RespondRequest]


class RespondAccepted(_Model):
    """The acceptance of a response; the same response again returns the same one.

    It does not echo the answer or reason (runs started before
    `response_digest` did): a repeat is recognised by that digest of them.
    """

    interaction_id: str
    type: Literal["tool-approval", "question"]
    approved: bool | None = None
    reason: str | None = None
    answer: str | None = None
    responder: str | None = None
    args_digest: str | None = None
    identity: str | None = None
    response_digest: str | None = None


class RespondManyAccepted(_Model):
    """The acceptance of each response of a batch, in the order sent."""

    accepted: list[RespondAccepted]


class HeldResult(_Model):
    """A call's committed result waiting for the calls before it: results enter the
    transcript in the model's call order, whatever order they finish in."""

    call_id: str
    message: ToolResultMessage
    ref: str | None = None


class RunEvent(_Model):
    """One committed step of a run, as operators read it.

    `count` > 1: the same event happened that many times in a row (repeated
    rejections are coalesced); `at` is the first time.
    """

    seq: int
    at: datetime
    type: str
    operation: str | None = None
    detail: str | None = None
    count: int = 1
    # What the operation used (a model request's tokens and cost), if it used anything.
    usage: Usage | None = None

    @model_serializer(mode="wrap")
    def _lean(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_nones(handler(self), "usage")


class Attention(_Model):
    """Why a run needs an operator, as the run keeps it (operators read `RunAttention`)."""

    reason: str
    detail: dict[str, Any] = Field(default_factory=dict)


class ParkedCall(_Model):
    """One operation a run holds for an operator (runs under the parallel-tools patch,
    whose turns may park several calls at once): blocked or failed, and why."""

    operation: str | None
    status: RunStatus
    error: str | None = None
    attention: Attention | None = None
    retryable: bool = True


_DETAIL_DEPRECATED = (
    "read the typed fields instead (`tool`, `args`, `agent_id`, ...); `detail` is kept "
    "for one release"
)


class _AttentionView(_Model):
    """What every attention reason shows: `reason`, then its typed fields.

    A snapshot's JSON holds `reason` and `detail` (see `RunSnapshot`); the
    typed fields are read from `detail`.
    """

    reason: str

    @model_validator(mode="before")
    @classmethod
    def _from_detail(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("detail"), dict):
            return {**data["detail"], **data}
        return data


class _KnownAttention(_AttentionView):
    detail: dict[str, Any] = Field(default_factory=dict, deprecated=_DETAIL_DEPRECATED)


class ToolInterrupted(_KnownAttention):
    """A manual tool's outcome is uncertain: check the external system, then `resolve_tool`.

    `args` is empty for a moment after a run continued as new (until its
    transcript is restored); `attempts` is how many the policy allowed.
    """

    reason: Literal["tool_interrupted"] = "tool_interrupted"
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    attempts: int | None = None
    last_error: str | None = None


class BudgetExceeded(_KnownAttention):
    """The run reached one of its usage limits before `operation` (the operation it runs
    next): raise the limit (`raise_limits`), or cancel the run."""

    reason: Literal["budget_exceeded"] = "budget_exceeded"
    limit: str
    value: float
    used: float
    operation: str | None = None
    tool: str | None = None


class _VersionAttention(_KnownAttention):
    """`version` is None for a run that asked for the newest version of its agent."""

    agent_id: str
    version: str | None = None
    last_error: str | None = None


class VersionMissing(_VersionAttention):
    """No worker hosts the run's agent version: register it again, then `retry()`."""

    reason: Literal["version_missing"] = "version_missing"


class VersionIncompatible(_VersionAttention):
    """The worker's registration of the run's version differs from the one it pinned:
    register the original definition under that version, then `retry()`."""

    reason: Literal["version_incompatible"] = "version_incompatible"


class OtherAttention(_AttentionView):
    """A reason this client does not know (a newer worker's): `reason` and `detail` say it."""

    detail: dict[str, Any] = Field(default_factory=dict)


def _attention_tag(value: Any) -> str:
    reason = value.get("reason") if isinstance(value, dict) else getattr(value, "reason", None)
    return reason if reason in _ATTENTION_REASONS else "other"


_ATTENTION_REASONS = frozenset(
    {"tool_interrupted", "version_missing", "version_incompatible", "budget_exceeded"}
)

RunAttention = Annotated[
    Annotated[ToolInterrupted, Tag("tool_interrupted")]
    | Annotated[VersionMissing, Tag("version_missing")]
    | Annotated[VersionIncompatible, Tag("version_incompatible")]
    | Annotated[BudgetExceeded, Tag("budget_exceeded")]
    | Annotated[OtherAttention, Tag("other")],
    Discriminator(_attention_tag),
]
"""Why a run needs an operator, one type per `reason`; `OtherAttention` for a reason
this client does not know yet."""

_OUTCOME_DEPRECATED = (
    "read `interactions` (or `interaction`) and `output` instead; `outcome` is kept, "
    "filled as before, for one release"
)


class RunSnapshot(_Model):
    """A run as an operator sees it (the `snapshot` query).

    What the run waits for: `interactions` (pending approvals and questions,
    oldest first; `interaction` is the first), `blocked_operations` (the
    checkpoint keys of the calls an operator must resolve;
    `blocked_operation` is the first) with `attention` saying why, typed by
    reason. `output` is the final answer once the run completed.

    The query's JSON holds each value once, in the shape the previous
    release reads (`outcome`, `blocked_operation`, attention's `reason` and
    `detail`; a query result must stay under Temporal's 2 MB); parsing
    derives the typed fields from it, or takes them as a worker sends them.

    .. deprecated:: Unreleased
       `outcome` (`{"type": "interaction", "interaction": {...}}` or
       `{"type": "completed", "output": ...}`): read `interactions` and
       `output`. Attention's `detail`: read its typed fields.
    """

    run_id: str
    agent_id: str
    agent_version: str | None = None
    status: RunStatus
    interactions: list[Interaction] = Field(default_factory=list)
    blocked_operations: list[str] = Field(default_factory=list)
    blocked_operation: str | None = None
    # The operations that failed for good and wait for `retry()` (several calls of one
    # turn may); `error` names the first one's error.
    failed_operations: list[str] = Field(default_factory=list)
    # A parent's open subagent runs, and a subagent run's parent (SPEC section 16).
    children: list[ChildRun] = Field(default_factory=list)
    parent_run_id: str | None = None
    attention: RunAttention | None = None
    output: str | None = None
    outcome: dict[str, Any] | None = Field(default=None, deprecated=_OUTCOME_DEPRECATED)
    next_attempt_at: datetime | None = None
    attempt: int | None = None
    turns: int = 0
    usage: Usage = Field(default_factory=Usage)
    # The limits the run applies now, and its turn budget (None: not pinned yet).
    limits: UsageLimits | None = None
    max_turns: int | None = None
    events: list[RunEvent] = Field(default_factory=list)
    error: str | None = None
    current: str | None = None
    # The run's OpenTelemetry trace id (32 hex digits) when its worker traces runs
    # (`durably.telemetry`), else None.
    trace_id: str | None = None

    @property
    def interaction(self) -> Interaction | None:
        """The first pending interaction (the oldest), or None. A property, not a field:
        it is neither set by a constructor nor part of the snapshot's JSON."""
        return self.interactions[0] if self.interactions else None

    @field_validator("attention", mode="wrap")
    @classmethod
    def _any_attention(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """An attention whose fields do not fit its reason (another release's) is shown
        as it came, as `OtherAttention`, rather than making the snapshot unreadable."""
        if isinstance(value, Attention):
            value = value.model_dump()
        try:
            return handler(value)
        except ValidationError:
            data = value if isinstance(value, dict) else {}
            detail = data.get("detail")
            return OtherAttention(
                reason=str(data.get("reason") or "unknown"),
                detail=detail if isinstance(detail, dict) else {},
            )

    @model_validator(mode="before")
    @classmethod
    def _typed_views(cls, data: Any) -> Any:
        """Derive the typed fields a snapshot's JSON leaves out from the fields it holds."""
        if not isinstance(data, dict):
            return data
        raw = data.get("outcome")
        outcome: dict[str, Any] = raw if isinstance(raw, dict) else {}
        data = dict(data)
        if "interactions" not in data:
            pending = outcome.get("interaction") if outcome.get("type") == "interaction" else None
            data["interactions"] = [pending] if pending is not None else []
        if "output" not in data and outcome.get("type") == "completed":
            data["output"] = outcome.get("output")
        if "blocked_operations" not in data and data.get("blocked_operation"):
            data["blocked_operations"] = [data["blocked_operation"]]
        return data


class InboxItem(_Model):
    """One thing, in one run, that waits for a person (`client.inbox()`)."""

    run_id: str
    agent_id: str | None
    status: RunStatus
    kind: Literal["approval", "question", "blocked", "failed", "retry_wait"]
    waiting_for: str
    interaction_id: str | None = None
    operation: str | None = None
    since: datetime | None = None
    next_attempt_at: datetime | None = None
    # The session the run belongs to (its `DurablySession` search attribute), if any.
    session_id: str | None = None
    # The run whose subagent call started this one, if any.
    parent_run_id: str | None = None
    # What the run used so far (tokens, requests, tool calls, cost).
    usage: Usage | None = None


class RunResult(_Model):
    """What a completed run returns (`agent_version`: what it pinned; its session keeps it)."""

    run_id: str
    output: str | None
    turns: int
    usage: Usage
    agent_version: str | None = None


class RunSummary(_Model):
    """A run as listed by `list_runs` (from Temporal visibility)."""

    run_id: str
    agent_id: str | None
    agent_version: str | None
    status: RunStatus | None
    started_at: datetime | None
    closed_at: datetime | None
    # The pinned registration's fingerprint (the `DurablyFingerprint` search
    # attribute); None before the run pins, and for runs pinned by a durably
    # that did not publish it.
    fingerprint: str | None = None
    # The session the run belongs to (its `DurablySession` search attribute), if any.
    session_id: str | None = None
    # The run whose subagent call started this one, if any.
    parent_run_id: str | None = None


class RunState(_Model):
    """A run's whole state: what the workflow holds and continue-as-new carries.

    `sent_length` is the length of the transcript the last model request
    saw; `refs` maps transcript positions not yet sent to the
    operation whose activity produced them (see `MessageRef`). `archive` is
    set while a continued-as-new run has yet to copy the transcript in.
    `call_errors` are the current turn's calls that must not run (see
    `ModelCallResult`), kept so a run that continues as new in the middle of
    a turn finishes it. `audit` keeps the latest events of each audit kind
    (decisions of people and operators), which a flood of other events must
    not push out of the snapshot. `chain` is the chain's first execution run
    id, part of operation ids (see `ToolCallInput`).
    """

    agent_id: str
    input: str
    requested_version: str | None = None
    pin: AgentPin | None = None
    status: RunStatus = RunStatus.RUNNING
    transcript: list[Message] = Field(default_factory=list)
    digest: str
    sent_length: int = 0
    refs: dict[int, str] = Field(default_factory=dict)
    archive: TranscriptArchive | None = None
    turns: int = 0
    usage: Usage = Field(default_factory=Usage)
    outcome: dict[str, Any] | None = None
    error: str | None = None
    blocked_operation: str | None = None
    failed_operation: str | None = None
    retryable: bool = True
    attention: Attention | None = None
    interaction: Interaction | None = None
    answered: dict[str, RespondAccepted] = Field(default_factory=dict)
    events: list[RunEvent] = Field(default_factory=list)
    event_seq: int = 0
    call_errors: dict[str, str] = Field(default_factory=dict)
    audit: list[RunEvent] = Field(default_factory=list)
    chain: str | None = None
    # While in `retry_wait`: when the model request's next attempt starts, and its number.
    next_attempt_at: datetime | None = None
    attempt: int | None = None
    # A session's run: the conversation before it (see `ConversationRef`).
    session: ConversationRef | None = None
    # The offset of the run's next live event (`RunHandle.events`): offsets go on
    # across continue-as-new.
    stream_offset: int = 0
    # A session's run that ran again after failing, whose session confirmed it took a
    # later submission: never retried again, and ends when it next fails.
    session_went_ahead: bool = False
    # Runs under the parallel-tools patch: every pending interaction (`interaction`
    # stays None), every parked operation (the singular fields name the first of
    # each kind), and results waiting for earlier calls of their turn.
    interactions: list[Interaction] = Field(default_factory=list)
    parked: list[ParkedCall] = Field(default_factory=list)
    held: list[HeldResult] = Field(default_factory=list)
    # A subagent's run: the call of its parent it answers (SPEC section 16).
    parent: ParentCall | None = None
    # A parent's subagent runs, by the operation of the call that started each.
    children: dict[str, ChildRun] = Field(default_factory=dict)
    # The caller's limits until the run pins, then the limits it applies (SPEC section
    # 17); the caller's turn budget; when the chain started (for `wall_clock_s`).
    limits: UsageLimits | None = None
    max_turns: int | None = None
    started_at: datetime | None = None
    # After `durably repair`: what became of the operations the reset discarded, by
    # operation, until the run reaches each (SPEC section 22).
    fates: dict[str, OperationFate] = Field(default_factory=dict)

    @model_serializer(mode="wrap")
    def _old_usage(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """`usage` as a release before its new fields reads it (`Usage` forbids extra
        fields there): a worker of that release taking the next run of the chain in a
        rolling deploy must not refuse it. The new fields travel in `usage_more`."""
        data: dict[str, Any] = handler(self)
        usage = data.get("usage")
        if isinstance(usage, dict):
            more = {k: usage.pop(k) for k in USAGE_ADDED if k in usage}
            if more:
                data["usage_more"] = more
        return data

    @model_validator(mode="before")
    @classmethod
    def _whole_usage(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("usage_more"), dict):
            data = dict(data)
            more = data.pop("usage_more")
            usage = data.get("usage")
            base = usage.model_dump() if isinstance(usage, Usage) else dict(usage or {})
            data["usage"] = {**base, **{k: v for k, v in more.items() if k in USAGE_ADDED}}
        return data


RunInput.model_rebuild()


# -- sessions (SPEC section 13) ---------------------------------------------------------

IfBusy = Literal["reject", "enqueue", "interrupt"]


class SubmitRequest(_Model):
    """`submit` update input: the next user message of a session's conversation.

    `if_busy` says what to do while the session's latest run is still open:
    `reject` (refused with `DurableConflictError`, nothing recorded),
    `enqueue` (it runs after the open run and those queued before it) or
    `interrupt` (the open run is cancelled; its committed messages stay in
    the conversation). A failed run never makes the session busy.
    """

    input: str
    if_busy: IfBusy = "reject"
    # Run on the newest registered version, and keep it for the session's later runs.
    upgrade: bool = False


class SubmitAccepted(_Model):
    """A submission taken: its run's id (the run starts now, or `queued` after others)."""

    run_id: str
    queued: bool = False


class CloseRequest(_Model):
    """`close` update input: end the session once its open and queued runs are done."""


class SessionRun(_Model):
    """One submission's run as its session knows it.

    `status` is the session's view: `queued`, `open` (started, not yet
    closed: see the run's own snapshot for waiting or failed), then how it
    closed. `offset` is the conversation's length before it and `length`
    the messages it added, once closed.
    """

    run_id: str
    status: Literal["queued", "open", "completed", "failed", "cancelled"]
    input: str
    offset: int | None = None
    length: int | None = None
    # What the open run last reported: `failed` while it is parked failed.
    reported: RunStatus | None = None
    # A later submission asked to interrupt it: the session cancels it.
    interrupt: bool = False
    # Submitted with `upgrade`: it pins the newest version, which the session then keeps.
    upgrade: bool = False
    # In a snapshot, an input longer than `SNAPSHOT_INPUT_CHARS` is cut to its start, and
    # this is its whole size in bytes (a snapshot holds every run; one payload must too).
    input_bytes: int | None = None


SNAPSHOT_INPUT_CHARS = 1_000


class SessionCarried(_Model):
    """What a session carries into its next run when it continues as new (between runs).

    The conversation is not carried (continue-as-new input is one payload,
    at most 2 MB): it stays in the run that continued (`archive`), and the
    new run copies it in page by page before it starts another run. Closed
    runs are carried without their input text.
    """

    version: str | None
    runs: list[SessionRun]
    archive: TranscriptArchive
    closing: bool = False
    # Where the session's live events go on (`SessionHandle.events`).
    stream_offset: int = 0


class SessionInput(_Model):
    """The session workflow's input; plain JSON so any Temporal client can start one.

    `continue_as_new_events` and `continue_as_new_bytes` are when the session
    continues as new (between runs): 10,000 events or 10 MiB by default.
    `carried` is set only by the session's own continue-as-new and honoured
    only then.
    """

    agent_id: str
    version: str | None = None
    continue_as_new_events: int | None = Field(default=None, ge=20, le=50_000)
    continue_as_new_bytes: int | None = Field(default=None, ge=2**16, le=40 * 2**20)
    carried: SessionCarried | None = None


class SessionSnapshot(_Model):
    """A session as an operator sees it: its runs, in order, and its conversation's size."""

    session_id: str
    agent_id: str
    version: str | None
    runs: list[SessionRun]
    messages: int
    closing: bool = False
    error: str | None = None


class RunStatusNote(_Model):
    """`run_status` signal input: a session's run says it is failed, or running again."""

    run_id: str
    status: RunStatus


class RunTranscriptRequest(_Model):
    """A page of a closed run's own transcript, from `offset`, for its session."""

    run_id: str
    offset: int


class SessionSummary(_Model):
    """A session as listed by `list_sessions` (from Temporal visibility).

    `open` is False once the session workflow has closed (after `close()`,
    or when Temporal ended it); `closed_at` says when.

    .. versionadded:: Unreleased
    """

    session_id: str
    agent_id: str | None
    open: bool
    started_at: datetime | None
    closed_at: datetime | None = None


# -- live events (SPEC section 15) ----------------------------------------------------

# The topic of a run's and a session's committed events on their workflow stream.
EVENTS_TOPIC = "durably.events"
# How many live events a run or session keeps for followers (older ones are dropped;
# the snapshot and history keep what matters).
EVENTS_RETAINED = 1_000


class LiveEvent(_Model):
    """One committed event of a run, as its followers read it (`RunHandle.events`).

    `seq` is the event's number in the run's snapshot events (0 for the live-only
    kinds: `model_started`, `tool_started`, `continued_as_new`); `status` is the
    run's status once the event happened. A `waiting` event names what waits
    (`interaction`, its arguments left out when large: the snapshot has them), a
    `needs_attention` or `run_failed` its operation, a `retry_wait` the next
    attempt, a `run_completed` the output.
    """

    kind: Literal["run"] = "run"
    run_id: str
    seq: int = 0
    at: datetime
    type: str
    operation: str | None = None
    detail: str | None = None
    status: RunStatus
    interaction: Interaction | None = None
    next_attempt_at: datetime | None = None
    output: str | None = None
    # `model_completed`: the answer's text (its first 64 KiB), which followers finish
    # their preview with, and the calls it makes (large arguments left out).
    text: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)


SessionEventType = Literal["submitted", "run_started", "run_closed", "continued_as_new", "closed"]


class SessionLiveEvent(_Model):
    """One event of a session (`SessionHandle.events`): a submission taken, its run
    started or closed, the session continued as new or closed."""

    kind: Literal["session"] = "session"
    session_id: str
    at: datetime
    type: SessionEventType
    run_id: str | None = None
    status: str | None = None


class TextPreview(_Model):
    """What a model activity shows of the answer it is receiving (its heartbeat details):
    the answer's `length` so far in characters and its last characters (`tail`)."""

    operation: str
    attempt: int
    length: int
    tail: str


class LiveText(_Model):
    """A piece of the model's answer as it is written (a preview, not a committed event):
    `text` follows what this follower was shown before for the same `operation` and
    `attempt`; a new attempt starts over. `gap` is set when pieces were skipped."""

    kind: Literal["text"] = "text"
    type: Literal["text_delta"] = "text_delta"
    run_id: str
    operation: str
    attempt: int
    text: str
    gap: bool = False


class LiveItem(_Model):
    """What a follower reads: the event and its offset in its run's (or session's) stream,
    from which `events(after=offset)` resumes (a `LiveText` has the offset of the event
    before it)."""

    offset: int
    event: Annotated[LiveEvent | SessionLiveEvent | LiveText, Field(discriminator="kind")]
