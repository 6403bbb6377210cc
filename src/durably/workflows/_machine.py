"""The decisions of one run, over `RunState`, with no Temporal in sight.

`AgentRunWorkflow` asks `RunMachine` what comes next, tells it what
happened, and carries out what it decides (activities, timers, handlers,
search attributes). Everything here is a function of the state, the inputs
and an injected clock, so every transition is unit-tested without a server
(tests/test_run_machine.py), and replay sees the same decisions.

The status transitions (SPEC section 3); each happens in one method here:

======================  ===================  ==========================================
from                    to                   when (method)
======================  ===================  ==========================================
running                 waiting              a call needs a person (`ask`)
waiting                 running              answered, denied, timed out (`take_answer`)
running                 needs_attention      a manual call's outcome is unknown, the
                                             pinned version is missing or changed (`park`)
running                 failed               an operation failed for good, no turns left
                                             (`park`), the transcript is lost
                                             (`lose_transcript`)
needs_attention/failed  running              an operator decided (`decided`)
running                 retry_wait           a model request failed and `model_retry`
                                             allows another attempt (`wait_to_retry`)
retry_wait              running              the backoff is over (`retry_due`)
running                 completed            a final answer (`complete`)
any unfinished          cancelled            the run was cancelled (`cancel`)
======================  ===================  ==========================================

A run whose start input was refused starts `failed` (`_run_input.initial_state`;
`refuse_input` records why). Under `model_retry`, a run whose model request failed
waits out the backoff in `retry_wait` (`wait_to_retry`, then `retry_due`); in runs
started before the seed-fidelity patch Temporal retried the request itself, and the
client derives `retry_wait` from the pending activity (`RunHandle.snapshot`).

A turn holds a set of operations: `next_step` hands out every call of the
latest model answer that has no result yet. Under the parallel-tools patch
(`parallel`) they run at once: several interactions may be pending and
several operations parked, each kept in a list (`RunState.interactions`,
`RunState.parked`), and the run's status and singular fields follow one
precedence, needs_attention > failed > waiting > running (`_settle`); a
call's result waits in `RunState.held` until every earlier call of its turn
has one, so results enter the transcript in the model's call order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from durably._digests import args_digest, policy_digest
from durably._transcript import SHORT_DIGEST, extend_digest
from durably.contract import (
    PIN_DIGEST_PREFIX,
    AgentPin,
    Answer,
    ApprovalResponse,
    Attention,
    ChildRun,
    ChildStatusNote,
    ErrorResolution,
    ErrorType,
    EventType,
    HeldResult,
    Interaction,
    JsonResolution,
    MessageRef,
    ModelCallInput,
    ModelCallResult,
    OperationFate,
    OperationKey,
    ParkedCall,
    RaiseLimitsAccepted,
    RaiseLimitsRequest,
    RepairPlan,
    RepairRequest,
    RerunResolution,
    ResolveToolRequest,
    RespondAccepted,
    RespondRequest,
    RunEvent,
    RunResult,
    RunState,
    RunStatus,
    ToolCallInput,
    ToolPolicy,
    TranscriptArchive,
    TranscriptPage,
    UsageLimits,
    VerifyApprovalRequest,
    operation_id,
)
from durably.messages import (
    AssistantMessage,
    Message,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from durably.tools import render_result
from durably.workflows._limits import (
    BUDGET_EXCEEDED,
    elapsed_s,
    exceeded,
    how_far,
    on_budget,
    raise_problem,
    start_limits,
    turn_budget,
)
from durably.workflows._validation import (
    check_many,
    check_name,
    check_resolution,
    check_response,
    check_retry,
    pending_interactions,
    rejection,
    retried_operations,
    short,
)

# The pin's operation: resolving the registration, once per run.
PIN = OperationKey("pin")

__all__ = [
    "PIN",
    "CallTools",
    "ContinueAsNew",
    "Decision",
    "OutOfTurns",
    "RequestModel",
    "RunMachine",
    "Step",
    "error_result",
    "pending_interactions",
]

Decision = JsonResolution | ErrorResolution | RerunResolution | Literal["retry"]

_EVENTS_KEPT = 50
_DETAIL_KEPT = 1_000
# The latest events of each of these kinds stay in the snapshot whatever
# else happens (a flood of rejected signals must not hide who approved what).
_AUDIT_KINDS: dict[str, str] = {
    EventType.APPROVED: "decision",
    EventType.DENIED: "decision",
    EventType.ANSWERED: "decision",
    EventType.TIMED_OUT: "decision",
    EventType.RESOLVED_JSON: "resolution",
    EventType.RESOLVED_ERROR: "resolution",
    EventType.RESOLVED_RERUN: "resolution",
    EventType.RETRIED: "retry",
    EventType.LIMITS_RAISED: "limits",
    EventType.RUN_CANCELLED: "cancel",
    EventType.REPAIRED: "repair",
}
# Events that repeat in a row become one entry with a count.
_COALESCED = {EventType.RESPONSE_REJECTED, EventType.SIGNAL_REJECTED}
_PARKED = (RunStatus.FAILED, RunStatus.NEEDS_ATTENTION)
# Text from outside (the run's input, an answer) larger than this reaches the
# model activity by reference, not as a second copy in its input.
INLINE_LIMIT = 8 * 2**10
# Attention reasons an activity's failure details may name.
_VERSION_REASONS = ("version_missing", "version_incompatible")
SUBAGENT_FAILED = "subagent_failed"
# Continue-as-new thresholds before the pin names the registration's.
_DEFAULT_CAN_EVENTS: int = AgentPin.model_fields["continue_as_new_events"].default
_DEFAULT_CAN_BYTES: int = AgentPin.model_fields["continue_as_new_bytes"].default


@dataclass(frozen=True)
class CallTools:
    """Run these calls of turn `turn` (those of the latest answer without a result)."""

    turn: int
    calls: list[ToolCall]


@dataclass(frozen=True)
class ContinueAsNew:
    """The history nears Temporal's limits: carry the state into a new run."""


@dataclass(frozen=True)
class OutOfTurns:
    """The agent used all its turns without a final answer: the run fails."""

    error: str


@dataclass(frozen=True)
class RequestModel:
    """Ask the model for turn `turn`."""

    turn: int
    key: OperationKey


Step = CallTools | ContinueAsNew | OutOfTurns | RequestModel


class RunMachine:
    """One run's state and every decision about it.

    `clock` gives the time events are stamped with (the workflow's clock);
    `hardened` is whether the run is under the hardening patch, which
    changes what some decisions do (see `agent_run.PATCH_HARDENED`); `lean`,
    under the seed-fidelity patch, sends model requests a 128-bit digest;
    `parallel`, under the parallel-tools patch, runs a turn's calls at once
    (see the module docstring).
    """

    def __init__(
        self,
        state: RunState,
        *,
        run_id: str,
        hardened: bool,
        clock: Callable[[], datetime],
        lean: bool = False,
        parallel: bool = False,
        on_event: Callable[[RunEvent], None] | None = None,
        limits_apply: Callable[[], bool] = lambda: False,
    ) -> None:
        self.s = state
        # Whether the run applies usage limits and its own turn budget (the limits
        # patch): asked only where one would change what the run does.
        self._limits_apply = limits_apply
        self.run_id = run_id
        self.hardened = hardened
        self.lean = lean
        self.parallel = parallel
        self._clock = clock
        # Told of each new event (not of a repeat that only counts up): live followers.
        self._on_event = on_event
        # What an operator decided for the parked operation, until the run applies it
        # (`decisions`, by operation, when several may be parked: the parallel patch).
        self.decision: Decision | None = None
        self.decisions: dict[str | None, Decision] = {}
        # A response's reason and answer, by interaction, until the run consumes
        # them (a hardened acceptance keeps only a digest of them).
        self._texts: dict[str, tuple[str | None, str | None]] = {}
        self._pin_digest: str | None = None
        # The turn whose model request is out, if one is (see `keeps`).
        self.requesting: int | None = None
        if parallel:
            self._adopt_singular()

    def _adopt_singular(self) -> None:
        """A run continued from one that ran a turn's calls one at a time (before the
        parallel patch) waits on what it carried, now kept in the lists."""
        s = self.s
        if s.interaction is not None:
            s.interactions = [s.interaction, *s.interactions]
            s.interaction = None
            s.outcome = None
        if s.status in _PARKED and not s.parked:
            s.parked = [
                ParkedCall(
                    operation=s.blocked_operation or s.failed_operation,
                    status=s.status,
                    error=s.error if s.status == RunStatus.FAILED else None,
                    attention=s.attention,
                    retryable=s.retryable,
                )
            ]

    @property
    def pin(self) -> AgentPin:
        if self.s.pin is None:
            raise RuntimeError("internal: the run has no pinned agent")
        return self.s.pin

    def pin_check(self) -> str:
        """What activities compare with their registration: the fingerprint (0.1.0), or
        a digest of the policies the run applies (not just a copyable name)."""
        if not self.hardened:
            return self.pin.fingerprint
        if self._pin_digest is None:
            self._pin_digest = PIN_DIGEST_PREFIX + policy_digest(self.pin)
        return self._pin_digest

    def continue_as_new_at(self) -> tuple[int, int]:
        """The history length and size at which the run continues as new."""
        pin = self.s.pin
        if pin is None:  # the registration's defaults until the pin names its own
            return _DEFAULT_CAN_EVENTS, _DEFAULT_CAN_BYTES
        return pin.continue_as_new_events, pin.continue_as_new_bytes

    def turn_budget(self) -> int:
        """The turns the run may take: its starter's own budget, else the agent's."""
        return turn_budget(self.pin, self.s.max_turns)

    def model_input(self, step: RequestModel) -> ModelCallInput:
        """The model request of a turn: only what the model has not seen yet."""
        return ModelCallInput(
            agent_id=self.pin.agent_id,
            version=self.pin.version,
            fingerprint=self.pin_check(),
            key=str(step.key),
            base_length=self.s.sent_length,
            new=self.unsent(),
            digest=self.s.digest[:SHORT_DIGEST] if self.lean else self.s.digest,
            prefix=self.s.session,
        )

    def tool_input(self, key: OperationKey, call: ToolCall) -> ToolCallInput:
        return ToolCallInput(
            agent_id=self.pin.agent_id,
            version=self.pin.version,
            fingerprint=self.pin_check(),
            key=str(key),
            call=call,
            chain=self.s.chain,
        )

    # -- what comes next -------------------------------------------------------------

    def unfinished_calls(self) -> list[ToolCall]:
        """The calls of the latest model answer that have no result yet, in call order."""
        for results, message in enumerate(reversed(self.s.transcript)):
            if isinstance(message, AssistantMessage):
                return list(message.tool_calls[results:])
            if not isinstance(message, ToolResultMessage):
                return []
        return []

    def next_step(self, history_nearly_full: Callable[[], bool]) -> Step:
        """What the run does next: finish the turn's calls, continue as new, or a turn."""
        calls = self.unfinished_calls()
        if calls:
            return CallTools(self.s.turns, calls)
        if history_nearly_full():
            return ContinueAsNew()
        turn = self.s.turns + 1
        limit, own = self.pin.max_turns, self.s.max_turns
        if own is not None and turn > min(own, limit) and self._limits_apply():
            limit = own
        else:
            own = None
        if turn > limit:
            if own is not None:
                return OutOfTurns(
                    f"the run used all {own} turns its starter gave it (max_turns) without "
                    "a final answer; start it again with more turns, or change the input"
                )
            return OutOfTurns(
                f"the agent used all {limit} turns (max_turns) without a "
                "final answer; raise Agent.max_turns in a new version, or change the "
                "instructions so the model finishes sooner"
            )
        return RequestModel(turn, OperationKey.model(turn))

    def call_of(self, key: OperationKey) -> ToolCall:
        """The committed tool call behind a tool key."""
        assistant = [m for m in self.s.transcript if isinstance(m, AssistantMessage)]
        calls = assistant[key.turn - 1].tool_calls if 0 < key.turn <= len(assistant) else []
        for call in calls:
            if call.call_id == key.call_id:
                return call
        raise LookupError(f"no tool call {key.call_id!r} in turn {key.turn}")

    def parked_on(self, key: OperationKey | None) -> bool:
        """The run is parked on `key` (it continued as new while parked there)."""
        s = self.s
        where = str(key) if key else None
        if self.parallel:
            return any(p.operation == where for p in s.parked)
        return s.status in _PARKED and where == (s.blocked_operation or s.failed_operation)

    def needs_person(self, key: OperationKey, call: ToolCall) -> ToolPolicy | None:
        """The call's policy, if a person must approve or answer it first (and has not:
        a run parked on the call after continuing as new had it approved already)."""
        policy = self.pin.tools[call.name]
        if (policy.requires_approval or policy.question) and not self.parked_on(key):
            return policy
        return None

    # -- the transcript ----------------------------------------------------------------

    def append(self, message: Message, *, ref: str | None = None) -> None:
        s = self.s
        if ref is not None:
            s.refs[len(s.transcript)] = ref
        s.transcript.append(message)
        s.digest = extend_digest(s.digest, message)

    def _commit(self, result: ToolResultMessage, *, ref: str | None = None) -> None:
        """A call's result enters the transcript; under the parallel patch once every
        earlier call of its turn has its result (it waits in `held` until then)."""
        if not self.parallel:
            self.append(result, ref=ref)
            return
        s = self.s
        s.held.append(HeldResult(call_id=result.call_id, message=result, ref=ref))
        held = {h.call_id: h for h in s.held}
        for call in self.unfinished_calls():
            first = held.pop(call.call_id, None)
            if first is None:
                break
            self.append(first.message, ref=first.ref)
        s.held = list(held.values())

    def is_held(self, call: ToolCall) -> bool:
        """The call has its result, waiting for an earlier call of the turn."""
        return any(h.call_id == call.call_id for h in self.s.held)

    def flush_held(self) -> None:
        """Every held result into the transcript, in call order, whatever is missing before
        it (a cancelled run: its session fills the calls left without a result)."""
        s = self.s
        held = {h.call_id: h for h in s.held}
        for call in self.unfinished_calls():
            if call.call_id in held:
                h = held.pop(call.call_id)
                self.append(h.message, ref=h.ref)
        s.held = []

    def outside_ref(self, ref: str, text: str) -> str | None:
        """Send `text` to the model activity by reference when it is large (hardened runs):
        it is in history once already, as the run's input or a person's response."""
        if self.hardened and len(text.encode("utf-8", "surrogatepass")) > INLINE_LIMIT:
            return ref
        return None

    def unsent(self) -> list[Message | MessageRef]:
        """What the model has not seen yet: activity results by reference, the rest inline."""
        s = self.s
        return [
            MessageRef(ref=s.refs[i]) if i in s.refs else m
            for i, m in enumerate(s.transcript[s.sent_length :], start=s.sent_length)
        ]

    def sent(self) -> None:
        """The model request saw the whole transcript."""
        self.s.sent_length = len(self.s.transcript)
        self.s.refs.clear()

    def next_page(self, archive: TranscriptArchive) -> OperationKey | None:
        """The restore of the next page of the previous run's transcript (None: whole)."""
        offset = len(self.s.transcript)
        return OperationKey.restore(offset) if offset < archive.length else None

    def restored_page(self, archive: TranscriptArchive, page: TranscriptPage) -> None:
        offset = len(self.s.transcript)
        self.s.transcript.extend(page.messages[: archive.length - offset])

    def restored(self, archive: TranscriptArchive) -> None:
        """The transcript is whole again: the run goes on where its predecessor stopped."""
        self.s.archive = None
        self.event(EventType.TRANSCRIPT_RESTORED, detail=f"{archive.length} messages")

    # -- transitions -----------------------------------------------------------------

    def pinned(self, pin: AgentPin) -> None:
        self.s.pin = pin
        self.event(EventType.AGENT_PINNED, detail=f"{pin.agent_id}@{pin.version}")
        self.append(UserMessage(content=self.s.input), ref=self.outside_ref("input", self.s.input))

    def model_answered(self, step: RequestModel, answer: ModelCallResult) -> bool:
        """Commit the model's answer for the turn; True if it is the final answer."""
        s = self.s
        s.turns = step.turn
        s.usage = s.usage + answer.usage
        calls = answer.message.tool_calls
        s.call_errors = dict(answer.call_errors)
        self.append(answer.message, ref=str(step.key))
        self.event(
            EventType.MODEL_COMPLETED,
            str(step.key),
            f"{len(calls)} tool call(s)" if calls else "final answer",
            usage=answer.usage,
        )
        return not calls

    def wait_to_retry(self, key: OperationKey, error: str, attempt: int, at: datetime) -> None:
        """A model request failed; attempt `attempt` starts at `at`. Until then the run is
        `retry_wait`, which an operator finds in visibility like any other status."""
        s = self.s
        s.status = RunStatus.RETRY_WAIT
        s.error = error
        s.attempt = attempt
        s.next_attempt_at = at
        self.event(
            EventType.RETRY_WAIT,
            str(key),
            f"attempt {attempt} at {at:%Y-%m-%d %H:%M:%S} UTC after: {error}",
        )

    def retry_due(self) -> None:
        """The backoff is over: the run is running its model request again."""
        s = self.s
        s.status = RunStatus.RUNNING
        s.error = None
        s.attempt = None
        s.next_attempt_at = None

    def reject_call(self, key: OperationKey, call: ToolCall) -> bool:
        """Commit the error result of a call the model answer already made invalid."""
        rejected = self.s.call_errors.get(call.call_id)
        if rejected is None:
            return False
        self._commit(error_result(call, rejected))
        self.event(EventType.TOOL_REJECTED, str(key), rejected)
        return True

    def tool_done(
        self, key: OperationKey, call: ToolCall, result: ToolResultMessage, *, resolved: bool
    ) -> None:
        """Commit a call's result: the tool's own, or one an operator resolved."""
        if resolved:
            ref = self.outside_ref(f"resolution:{key}", result.content)
            event = EventType.TOOL_RESOLVED
        else:
            ref = str(key)
            event = EventType.TOOL_ERROR if result.is_error else EventType.TOOL_COMPLETED
        self._commit(result, ref=ref)
        self.event(event, str(key), result.content[:200] if result.is_error else call.name)

    def resolved_result(
        self, call: ToolCall, resolution: JsonResolution | ErrorResolution
    ) -> ToolResultMessage:
        """The result an operator supplied for an interrupted call."""
        if isinstance(resolution, JsonResolution):
            return ToolResultMessage(
                call_id=call.call_id, tool=call.name, content=render_result(resolution.value)
            )
        return error_result(call, resolution.message)

    def ask(
        self, key: OperationKey, call: ToolCall, policy: ToolPolicy, *, now: datetime
    ) -> Interaction:
        """Wait for a person on this call: the run is waiting (again, if it continued as new
        while waiting: the arguments were left in the transcript, not carried)."""
        s = self.s
        iid = key.interaction_id(policy)
        fresh = {"args": call.arguments, "question": _question(call, policy)}
        if self.parallel:
            for i, pending in enumerate(s.interactions):
                if pending.id == iid:  # continued as new while it waited
                    s.interactions[i] = pending.model_copy(update=fresh)
                    return s.interactions[i]
        if s.interaction is not None and s.interaction.id == iid:
            s.interaction = s.interaction.model_copy(update=fresh)
            return s.interaction
        kind: Literal["tool-approval", "question"] = (
            "question" if policy.question else "tool-approval"
        )
        interaction = Interaction(
            id=iid,
            type=kind,
            operation=str(key),
            tool=call.name,
            args=call.arguments,
            args_digest=args_digest(call.arguments),
            question=_question(call, policy),
        )
        if self.hardened:
            interaction.operation_id = operation_id(self.run_id, s.chain, str(key))
            interaction.signed = policy.signed_approval and not policy.question
            if policy.approval_timeout_s:
                interaction.expires_at = now + timedelta(seconds=policy.approval_timeout_s)
        if self.parallel:
            s.interactions.append(interaction)
            self._settle()
            self.event(EventType.WAITING, str(key), f"{kind} {interaction.id}")
            return interaction
        s.status = RunStatus.WAITING
        s.interaction = interaction
        if not self.hardened:  # later runs derive it in the snapshot: one copy of the args
            s.outcome = {"type": "interaction", "interaction": interaction.model_dump(mode="json")}
        self.event(EventType.WAITING, str(key), f"{kind} {interaction.id}")
        return interaction

    def deadline(
        self, interaction: Interaction, policy: ToolPolicy, now: datetime
    ) -> datetime | None:
        """When nobody answering answers for a person (0.1.0 kept no deadline in state)."""
        if interaction.expires_at is None and policy.approval_timeout_s:
            return now + timedelta(seconds=policy.approval_timeout_s)
        return interaction.expires_at

    def answered(self, interaction: Interaction) -> bool:
        return interaction.id in self.s.answered

    def time_out(self, interaction: Interaction, policy: ToolPolicy) -> None:
        """Nobody answered in time: a denial (or an unanswered question) in the person's place."""
        what = "question" if policy.question else "approval"
        self.s.answered[interaction.id] = RespondAccepted(
            interaction_id=interaction.id,
            type=interaction.type,
            approved=False,
            reason=f"{what} timed out",
            args_digest=interaction.args_digest,
        )
        self.event(
            EventType.TIMED_OUT,
            interaction.id,
            f"no response within {policy.approval_timeout_s:g} s",
        )

    def take_answer(self, interaction: Interaction, call: ToolCall) -> ToolResultMessage | None:
        """The run is running again; None means approved (the call runs), else the call's
        result (denied, answered, timed out), already committed."""
        s = self.s
        accepted = s.answered[interaction.id]
        reason, answer = self._texts.pop(interaction.id, (accepted.reason, accepted.answer))
        if self.parallel:
            s.interactions = [i for i in s.interactions if i.id != interaction.id]
            self._settle()
        else:
            s.status = RunStatus.RUNNING
            s.interaction = None
            s.outcome = None
        if accepted.type == "question" and answer is not None:
            result = ToolResultMessage(call_id=call.call_id, tool=call.name, content=answer)
        elif accepted.approved:
            return None
        else:
            result = error_result(call, f"denied: {reason or 'no reason given'}")
        self._commit(result, ref=self.outside_ref(f"answer:{interaction.id}", result.content))
        return result

    def classify(
        self, key: OperationKey, error: str, details: dict[str, Any] | None
    ) -> tuple[RunStatus, Attention | None]:
        """Which status a failed operation leaves the run in: `details` are what the
        activity's failure carried (a version problem names its reason there)."""
        if details is not None and details.get("reason") in _VERSION_REASONS:
            return RunStatus.NEEDS_ATTENTION, Attention(
                reason=details["reason"], detail={**details, "last_error": error}
            )
        if details is not None and details.get("reason") == SUBAGENT_FAILED:
            return RunStatus.NEEDS_ATTENTION, Attention(
                reason=SUBAGENT_FAILED, detail={**details, "last_error": error}
            )
        if key.kind == "tool":
            call = self.call_of(key)
            policy = self.pin.tools[call.name]
            if policy.recovery == "manual":
                return RunStatus.NEEDS_ATTENTION, Attention(
                    reason="tool_interrupted",
                    detail={
                        "tool": call.name,
                        "args": call.arguments,
                        "attempts": policy.retry.max_attempts,
                        "last_error": error,
                    },
                )
        return RunStatus.FAILED, None

    def park(
        self,
        status: RunStatus,
        *,
        error: str,
        key: OperationKey | None = None,
        attention: Attention | None = None,
        retryable: bool = True,
    ) -> None:
        """Hold the run in `failed`/`needs_attention` until an operator decides (unless it
        is parked there already, continued as new)."""
        s = self.s
        where = str(key) if key else None
        if self.parallel:
            if self.parked_on(key):  # continued as new while parked there
                return
            self.decisions.pop(where, None)
            failed = status == RunStatus.FAILED
            s.parked.append(
                ParkedCall(
                    operation=where,
                    status=status,
                    error=error if failed else None,
                    attention=attention,
                    retryable=retryable,
                )
            )
            self._settle()
            if failed:
                self.event(EventType.RUN_FAILED, where, error)
            else:
                self.event(EventType.NEEDS_ATTENTION, where, _why(attention, error))
            return
        if self.parked_on(key) and s.status == status and s.error in (None, error):
            return
        self.decision = None
        s.status = status
        s.error = error if status == RunStatus.FAILED else None
        s.failed_operation = where if status == RunStatus.FAILED else None
        s.blocked_operation = where if status == RunStatus.NEEDS_ATTENTION else None
        s.attention = attention
        s.retryable = retryable
        if status == RunStatus.NEEDS_ATTENTION:
            self.event(EventType.NEEDS_ATTENTION, where, attention.reason if attention else error)
        else:
            self.event(EventType.RUN_FAILED, where, error)

    def show_blocked_args(self, key: OperationKey | None) -> None:
        """A blocked call's arguments, which continue-as-new does not carry, shown again."""
        s = self.s
        if self.parallel:
            where = str(key) if key else None
            for i, parked in enumerate(s.parked):
                a = parked.attention
                if (
                    parked.operation == where
                    and key is not None
                    and a is not None
                    and a.reason == "tool_interrupted"
                    and "args" not in a.detail
                ):
                    detail = {**a.detail, "args": self.call_of(key).arguments}
                    a = a.model_copy(update={"detail": detail})
                    s.parked[i] = parked.model_copy(update={"attention": a})
            self._settle()
            return
        attention = s.attention
        if (
            attention is not None
            and attention.reason == "tool_interrupted"
            and key is not None
            and "args" not in attention.detail
        ):
            args = self.call_of(key).arguments
            s.attention = attention.model_copy(
                update={"detail": {**attention.detail, "args": args}}
            )

    def decided(self, key: OperationKey | None) -> Decision:
        """Apply the operator's decision: the run is running again (under the parallel
        patch, unless other operations of the turn still wait)."""
        if self.parallel:
            where = str(key) if key else None
            taken = self.decisions.pop(where)
            if not any(p.operation == where and on_budget(p.attention) for p in self.s.parked):
                self._record_decision(taken, where)  # a raised limit has its own event
            self.s.parked = [p for p in self.s.parked if p.operation != where]
            self._settle()
            return taken
        decision = self.decision
        assert decision is not None
        self.decision = None
        self._record_decision(decision, str(key) if key else None)
        s = self.s
        s.status = RunStatus.RUNNING
        s.error = None
        s.failed_operation = None
        s.blocked_operation = None
        s.attention = None
        s.retryable = True
        return decision

    def _record_decision(self, decision: Decision, where: str | None) -> None:
        kind = decision if isinstance(decision, str) else decision.type
        self.event(EventType.RETRIED if kind == "retry" else EventType(f"resolved_{kind}"), where)

    def _settle(self) -> None:
        """The status and singular fields, from every pending interaction and parked
        operation (parallel patch): needs_attention > failed > waiting > running; each
        singular field names the first of its kind."""
        s = self.s
        blocked = [p for p in s.parked if p.status == RunStatus.NEEDS_ATTENTION]
        failed = [p for p in s.parked if p.status == RunStatus.FAILED]
        s.blocked_operation = blocked[0].operation if blocked else None
        s.attention = blocked[0].attention if blocked else None
        s.failed_operation = failed[0].operation if failed else None
        s.error = failed[0].error if failed else None
        s.retryable = failed[0].retryable if failed else True
        if blocked:
            s.status = RunStatus.NEEDS_ATTENTION
        elif failed:
            s.status = RunStatus.FAILED
        elif s.interactions:
            s.status = RunStatus.WAITING
        else:
            s.status = RunStatus.RUNNING

    # -- usage limits (SPEC section 17) --------------------------------------------

    def start_limits(self) -> str | None:
        """The limits the run applies from its pin and its starter's request (once, after
        it pins), or why the request is refused."""
        s = self.s
        limits, problem = start_limits(self.pin, s.limits, s.max_turns)
        if problem is not None and self._limits_apply():
            return problem
        s.limits = limits
        return None

    def over_budget(self, key: OperationKey, now: datetime) -> Attention | None:
        """Why the run must not start operation `key` (a limit it reached), if it must not.
        A subagent call whose child runs already is not started again: never checked; nor
        is a run's first model request, before which it used nothing."""
        s = self.s
        if s.limits is None or key.kind not in ("model", "tool") or str(key) in s.children:
            return None
        if key.kind == "model" and key.turn == 1 and s.usage == Usage():
            return None  # nothing used yet (and the pin's workflow task: see `agent_run`)
        elapsed = elapsed_s(s.started_at, now)
        hit = exceeded(s.limits, s.usage, elapsed, "model" if key.kind == "model" else "tool")
        if hit is None or not self._limits_apply():
            return None
        name, value, used = hit
        detail: dict[str, Any] = {
            "limit": name,
            "value": value,
            "used": used,
            "operation": str(key),
            "usage": s.usage.model_dump(),
        }
        if key.kind == "tool":
            detail["tool"] = self.call_of(key).name
        return Attention(reason=BUDGET_EXCEEDED, detail=detail)

    def used(self, usage: Usage) -> None:
        """Count what an operation used outside a committed answer (a tool call when it
        is scheduled; a failed model attempt)."""
        self.s.usage = self.s.usage + usage

    def check_raise(self, request: RaiseLimitsRequest, now: datetime) -> UsageLimits:
        """The limits `raise_limits` would set, or raise why it cannot."""
        s = self.s
        if s.pin is None:
            raise rejection(
                ErrorType.DURABLE_CONFLICT,
                f"run {self.run_id!r} has not pinned its agent yet, so its limits are not "
                "known; try again in a moment",
            )
        if not s.status.unfinished:
            raise rejection(
                ErrorType.DURABLE_CONFLICT,
                f"run {self.run_id!r} is {s.status.value}; its limits no longer apply",
            )
        check_name("responder", request.responder)
        problem = raise_problem(s.pin, request.limits)
        if problem is not None:
            raise rejection(ErrorType.INVALID_RESPONSE, f"cannot raise the limits: {problem}")
        limits = (s.limits or UsageLimits()).merged(request.limits)
        elapsed = elapsed_s(s.started_at, now)
        budget = [
            p for p in s.parked if on_budget(p.attention) and p.operation not in self.decisions
        ]
        still = [exceeded(limits, s.usage, elapsed, _kind(p.operation)) for p in budget]
        if budget and all(hit is not None for hit in still):
            name, value, used = next(hit for hit in still if hit is not None)
            raise rejection(
                ErrorType.INVALID_RESPONSE,
                f"run {self.run_id!r} would still be over its {name} limit ({used:g} used, "
                f"limit {value:g}); raise {name} above {used:g}",
            )
        return limits

    def raise_limits(self, request: RaiseLimitsRequest, now: datetime) -> RaiseLimitsAccepted:
        """Apply `raise_limits`: the new limits, and every operation parked on a limit goes
        on (one still over a limit parks again, saying which)."""
        s = self.s
        s.limits = self.check_raise(request, now)
        resumed = [
            p.operation
            for p in s.parked
            if on_budget(p.attention)
            and p.operation is not None
            and p.operation not in self.decisions
        ]
        for operation in resumed:
            self.decisions[operation] = "retry"
        changes = ", ".join(
            f"{name} {value:g}"
            for name, value in request.limits.model_dump(exclude_none=True).items()
        )
        who = f" by {request.responder}" if request.responder else ""
        self.event(EventType.LIMITS_RAISED, detail=f"{changes}{who}")
        return RaiseLimitsAccepted(limits=s.limits, resumed=resumed)

    # -- subagents (SPEC section 16) -----------------------------------------------

    def child_started(self, key: OperationKey, run_id: str) -> None:
        self.s.children[str(key)] = ChildRun(operation=str(key), run_id=run_id)
        self.event(EventType.SUBAGENT_STARTED, str(key), run_id)

    def child_failed(self, key: OperationKey) -> ChildRun | None:
        """The child of this call, if it said it failed (it stays open for `retry()`)."""
        child = self.s.children.get(str(key))
        return child if child is not None and child.status == RunStatus.FAILED else None

    def child_noted(self, note: ChildStatusNote) -> str | None:
        """A child said its status changed; the operation it answers (None: no child of
        this run). A failed child that runs again takes its parent's call with it."""
        for operation, child in self.s.children.items():
            if child.run_id == note.run_id:
                if note.seq and note.seq <= child.seq:
                    return operation  # an older note, arriving after a newer one
                child.seq = note.seq
                was_failed = child.status == RunStatus.FAILED
                child.status = note.status.value
                child.detail = note.detail
                if was_failed and note.status != RunStatus.FAILED:
                    self._resume_parked(operation)
                return operation
        return None

    def child_confirmed(self, note: ChildStatusNote, status: str) -> None:
        """A child's status as the server holds it (`status`, "" if none), after `note`
        said it changed; the note's detail is kept only if the status agrees with it."""
        if status not in RunStatus._value2member_map_:
            return
        child = next((c for c in self.s.children.values() if c.run_id == note.run_id), None)
        if child is None:
            return
        detail = note.detail if note.status.value == status else None
        self.child_noted(
            note.model_copy(update={"status": RunStatus(status), "detail": detail, "seq": 0})
        )

    def child_ended(self, key: OperationKey) -> None:
        """The child of a parked call closed: the call reads its end (a child that said
        it failed, then completed after all, is not waited on for another note)."""
        self._resume_parked(str(key))

    def _resume_parked(self, operation: str) -> None:
        """The call parked on its failed child goes on waiting for it (the child was
        retried), as if an operator had retried the call."""
        parked = [p for p in self.s.parked if p.operation == operation] if self.parallel else []
        if parked or (not self.parallel and self.s.blocked_operation == operation):
            if self.parallel:
                self.decisions.setdefault(operation, "retry")
            elif self.decision is None:
                self.decision = "retry"

    def child_done(self, key: OperationKey, result: RunResult) -> None:
        """The child completed: its usage counts in this run's."""
        self.s.usage = self.s.usage + result.usage
        self.s.children.pop(str(key), None)

    def lose_transcript(self, error: str, key: OperationKey) -> None:
        """The previous run's transcript can never come: the run fails for good, whatever
        it waited for (a restore parked over it would lose that)."""
        s = self.s
        s.interaction = None
        s.outcome = None
        s.blocked_operation = None
        s.attention = None
        s.interactions = []
        s.parked = []
        self.park(RunStatus.FAILED, error=error, key=key, retryable=False)

    def complete(self, output: str | None) -> RunResult:
        s = self.s
        s.status = RunStatus.COMPLETED
        s.outcome = {"type": "completed", "output": output}
        self.event(EventType.RUN_COMPLETED, detail=(output or "")[:200])
        return RunResult(
            run_id=self.run_id,
            output=output,
            turns=s.turns,
            usage=s.usage,
            agent_version=s.pin.version if s.pin is not None and s.session is not None else None,
        )

    def cancel(self) -> None:
        if self.s.status == RunStatus.RETRY_WAIT:
            self.retry_due()  # no attempt is coming: the snapshot must not say one is
        self.s.status = RunStatus.CANCELLED
        self.event(EventType.RUN_CANCELLED)

    def refuse_input(self, problem: str) -> None:
        """The start input was refused (the state was made failed from the start, or, for
        limits the registration does not allow, once the run pinned it)."""
        s = self.s
        s.status, s.error, s.retryable = RunStatus.FAILED, problem, False
        self.event(EventType.RUN_FAILED, detail=problem)

    # -- repair (SPEC section 22) -------------------------------------------------------

    def repaired(self, plan: RepairPlan, request: RepairRequest) -> None:
        """The run was reset by `durably repair`: keep the fate of each operation the reset
        discarded until the run reaches it, and say who repaired it, why, and what
        becomes of each (or why a `repair` signal changed nothing)."""
        who = f" by {request.responder}" if request.responder else ""
        if plan.refused is not None:
            self.event(EventType.SIGNAL_REJECTED, detail=f"repair{who}: {plan.refused}")
            return
        for fate in plan.fates:
            self.s.fates[fate.operation] = fate
        why = f" ({request.reason})" if request.reason else ""
        fates = "; ".join(f"{f.operation}: {f.detail}" for f in plan.fates)
        self.event(
            EventType.REPAIRED,
            detail=f"repaired{who}{why}: reset from run {plan.base_run_id} after event "
            f"{plan.kept_through}; " + (fates or "no operation was discarded"),
        )

    def take_fate(self, key: OperationKey) -> OperationFate | None:
        """What became of `key` before a repair's reset, once: the run acts on it now."""
        return self.s.fates.pop(str(key), None)

    # -- requests from outside -------------------------------------------------------

    def answer_pending(self) -> bool:
        """Whether a response arriving by signal waits for the model's answer now out.

        On replay, the signals of a workflow task are applied before its other events,
        so a response can come before the model answer that asks for it, although the
        run asked first when it ran. While a model request is out no interaction is
        pending (the turn's calls all have their results), so a response then waits
        for the answer: it is taken, or refused with the same words, in either order.
        """
        turn = self.requesting
        return turn is not None and turn > self.s.turns

    def check_response(
        self, request: RespondRequest
    ) -> tuple[RespondAccepted, bool, ApprovalResponse | Answer]:
        """See `_validation.check_response`."""
        return check_response(self.run_id, self.s, request, strict=self.hardened)

    def check_many(
        self, requests: list[RespondRequest]
    ) -> list[tuple[RespondAccepted, bool, ApprovalResponse | Answer]]:
        """See `_validation.check_many`."""
        return check_many(self.run_id, self.s, requests, strict=self.hardened)

    def needs_signature(self, accepted: RespondAccepted) -> bool:
        pending = self.pending(accepted.interaction_id)
        return (
            self.hardened
            and accepted.type == "tool-approval"
            and pending is not None
            and pending.signed
        )

    def pending(self, interaction_id: str) -> Interaction | None:
        """The pending interaction of that id, if any."""
        return next((i for i in pending_interactions(self.s) if i.id == interaction_id), None)

    def verification(
        self, request: RespondRequest, response: ApprovalResponse, interaction: Interaction
    ) -> VerifyApprovalRequest:
        """What the worker checks of a signed decision (with keys history never sees)."""
        return VerifyApprovalRequest(
            agent_id=self.pin.agent_id,
            version=self.pin.version,
            fingerprint=self.pin_check(),
            tool=interaction.tool,
            operation_id=interaction.operation_id or "",
            interaction_id=interaction.id,
            args_digest=interaction.args_digest,
            approved=response.approved,
            approver=request.responder,
            token=response.token,
            reason=response.reason,
        )

    def accept_response(
        self, accepted: RespondAccepted, response: ApprovalResponse | Answer
    ) -> None:
        self.s.answered[accepted.interaction_id] = accepted
        reason = response.reason if isinstance(response, ApprovalResponse) else None
        answer = response.answer if isinstance(response, Answer) else None
        self._texts[accepted.interaction_id] = (reason, answer)
        who = f" by {accepted.responder}" if accepted.responder else ""
        if accepted.identity:
            who += f" (client {accepted.identity}; both self-declared)"
        if accepted.type == "question":
            self.event(EventType.ANSWERED, accepted.interaction_id, f"answered{who}")
        else:
            verdict = EventType.APPROVED if accepted.approved else EventType.DENIED
            because = f": {reason}" if reason else ""
            self.event(verdict, accepted.interaction_id, f"{verdict}{who}{because}")

    def check_resolution(
        self, request: ResolveToolRequest
    ) -> JsonResolution | ErrorResolution | RerunResolution:
        """The validator's check, plus: no decision is already on its way (updates that
        arrive in one workflow task are validated before the run leaves needs_attention).
        Only the validator calls this, so replaying older histories is unaffected."""
        resolution = check_resolution(self.run_id, self.s, request, strict=self.hardened)
        on_its_way = self.decisions.get(request.operation) if self.parallel else self.decision
        if on_its_way is not None:
            decided = on_its_way if isinstance(on_its_way, str) else on_its_way.type
            raise rejection(
                ErrorType.DURABLE_CONFLICT,
                f"run {self.run_id!r} already accepted a {decided} decision for "
                f"{short(request.operation)}; it is being applied",
            )
        return resolution

    def resolve(
        self, request: ResolveToolRequest
    ) -> JsonResolution | ErrorResolution | RerunResolution:
        resolution = check_resolution(self.run_id, self.s, request, strict=self.hardened)
        if self.parallel:
            self.decisions[request.operation] = resolution
        else:
            self.decision = resolution
        return resolution

    def check_retry(self) -> None:
        check_retry(self.run_id, self.s, taken=set(self.decisions))

    def retry(self) -> str | None:
        """Accept `retry()`; the operation it runs again (the first, under the parallel
        patch, where it runs again every parked operation it applies to)."""
        if self.parallel:
            operations = retried_operations(self.run_id, self.s, taken=set(self.decisions))
            for operation in operations:
                self.decisions[operation] = "retry"
            return operations[0]
        check_retry(self.run_id, self.s)
        self.decision = "retry"
        return self.s.blocked_operation or self.s.failed_operation

    # -- events ----------------------------------------------------------------------

    def event(
        self,
        type: EventType,
        operation: str | None = None,
        detail: str | None = None,
        *,
        usage: Usage | None = None,
    ) -> None:
        """Record a run event (repeated rejections coalesce; audit kinds are kept apart)."""
        s = self.s
        if detail is not None and len(detail) > _DETAIL_KEPT:
            detail = f"{detail[:_DETAIL_KEPT]}... ({len(detail)} characters)"
        last = s.events[-1] if s.events else None
        if (
            last is not None
            and type in _COALESCED
            and (last.type, last.operation, last.detail) == (type, operation, detail)
        ):
            last.count += 1  # the same rejection again: a counter, not another entry
            return
        s.event_seq += 1
        event = RunEvent(
            seq=s.event_seq,
            at=self._clock(),
            type=type,
            operation=operation,
            detail=detail,
            usage=usage,
        )
        s.events.append(event)
        del s.events[:-_EVENTS_KEPT]
        if self._on_event is not None:
            self._on_event(event)
        kind = _AUDIT_KINDS.get(type)
        if kind is not None:
            s.audit.append(event)
            same = [e for e in s.audit if _AUDIT_KINDS.get(e.type) == kind]
            if len(same) > _EVENTS_KEPT:
                s.audit.remove(same[0])


def _why(attention: Attention | None, error: str) -> str:
    """A needs_attention event's detail: the reason (and, for a limit, which and how far)."""
    if attention is None:
        return error
    d = attention.detail
    if on_budget(attention):
        return f"{BUDGET_EXCEEDED}: {how_far(d)}"
    return attention.reason


def _kind(operation: str | None) -> Literal["model", "tool"]:
    return "model" if (operation or "").startswith("model:") else "tool"


def _question(call: ToolCall, policy: ToolPolicy) -> str | None:
    return str(call.arguments.get("question", "")) if policy.question else None


def error_result(call: ToolCall, message: str) -> ToolResultMessage:
    """An error result for `call`: what the model reads when the call did not give one."""
    return ToolResultMessage(call_id=call.call_id, tool=call.name, content=message, is_error=True)
