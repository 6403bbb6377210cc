"""One workflow task's jobs, split into activations every way: the same commands.

Temporal hands workflow code a task's jobs in one activation on replay, signals
first; live, a worker that answered a query first may have applied the task's
other jobs (an activity's result, a timeout) in an activation of their own
(`docs/design.md`, "The query race"). Whatever the split, the run must issue
the same commands, or its history does not replay.

This drives `RunMachine` the way `AgentRunWorkflow` does, with a small model of
temporalio 1.35's scheduling (`Run.activation`): in each activation, the signal
handlers and the waits they free run first, until nothing moves; then the other
jobs are applied, and their continuations and the waits they free run. The
commands are what the workflow would send Temporal (a status upsert, a scheduled
tool call). For the tasks Hypothesis picks, every split must give the same
commands, decisions and events (in the snapshot's order or not: see
`Run.outcome`); `TestSplitsThatDoNotCommute` states the splits that do not, which
only the query guard (or a worker without a cache) keeps from being written.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from durably._transcript import EMPTY_DIGEST
from durably.contract import (
    AgentPin,
    EventType,
    Interaction,
    ModelCallResult,
    OperationKey,
    RespondRequest,
    RunState,
)
from durably.messages import AssistantMessage, ToolCall, ToolResultMessage, Usage
from durably.workflows._machine import RequestModel, RunMachine
from durably.workflows._validation import Rejected

from .test_run_machine import _policy

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


PIN = AgentPin(
    agent_id="desk",
    version="1",
    fingerprint="f",
    max_turns=5,
    model_heartbeat_timeout_s=30,
    model_start_to_close_s=60,
    tools={
        "pay": _policy("manual", requires_approval=True),
        "lookup": _policy("safe"),
        "file": _policy("manual"),
    },
)


@dataclass(frozen=True)
class Answer:
    """The model request out for the turn resolves with these calls."""

    calls: tuple[str, ...]


@dataclass(frozen=True)
class ToolDone:
    """A running tool call's activity resolves: a result, or an uncertain outcome."""

    call_id: str
    ok: bool


@dataclass(frozen=True)
class Respond:
    """A `respond_signal`: approve or deny an interaction (which may not exist)."""

    interaction_id: str
    approved: bool


Job = Answer | ToolDone | Respond


@dataclass
class Waiter:
    """A `workflow.wait_condition` and what runs once it holds."""

    holds: Callable[[], bool]
    then: Callable[[], None]


@dataclass
class Run:
    """The machine plus what the workflow would hold around it, and what it sent."""

    commute: bool
    m: RunMachine = field(init=False)
    commands: list[str] = field(default_factory=list)
    waiters: list[Waiter] = field(default_factory=list)  # in the order they began
    running: dict[str, tuple[OperationKey, ToolCall]] = field(default_factory=dict)
    step: RequestModel | None = None
    published: str | None = None

    def __post_init__(self) -> None:
        state = RunState(agent_id="desk", input="refund", digest=EMPTY_DIGEST, chain="c")
        self.m = RunMachine(
            state, run_id="run", hardened=True, lean=True, parallel=True, clock=lambda: NOW
        )
        self.m.pinned(PIN)
        self.publish()

    # -- what the workflow does -------------------------------------------------------

    def publish(self) -> None:
        """`_publish`: an upsert when the status changed (a command)."""
        status = self.m.s.status.value
        if status != self.published:
            self.commands.append(f"upsert {status}")
            self.published = status

    def request_model(self) -> None:
        step = self.m.next_step(lambda: False)
        assert isinstance(step, RequestModel)
        self.step = step
        self.m.requesting = step.turn
        self.commands.append(f"schedule {step.key}")

    def on_answer(self, job: Answer) -> None:
        assert self.step is not None
        self.m.requesting = None
        calls = tuple(
            ToolCall(id=f"c{i}", name=name, arguments={"n": i}) for i, name in enumerate(job.calls)
        )
        message = AssistantMessage(tool_calls=calls)
        self.m.model_answered(self.step, ModelCallResult(message=message, usage=Usage()))
        for call in calls:  # `_call_turn`: each call's first step, in the model's order
            key = OperationKey.tool(self.step.turn, call.call_id)
            policy = self.m.needs_person(key, call)
            if policy is None:
                self.start_tool(key, call)
                continue
            interaction = self.m.ask(key, call, policy, now=NOW)
            self.publish()
            self.wait(
                lambda i=interaction: self.m.answered(i),
                lambda k=key, c=call, i=interaction: self.answered(k, c, i),
            )

    def answered(self, key: OperationKey, call: ToolCall, interaction: Interaction) -> None:
        """`_interact` after its wait: the call runs, or its answer is its result."""
        if self.m.take_answer(interaction, call) is None:
            self.publish()
            self.start_tool(key, call)
        else:
            self.publish()

    def start_tool(self, key: OperationKey, call: ToolCall) -> None:
        self.running[call.call_id] = (key, call)
        self.publish()
        self.commands.append(f"schedule {key}")

    def on_tool(self, job: ToolDone) -> None:
        key, call = self.running.pop(job.call_id)
        if job.ok:
            result = ToolResultMessage(call_id=call.call_id, tool=call.name, content="done")
            self.m.tool_done(key, call, result, resolved=False)
        else:
            status, attention = self.m.classify(key, "activity timed out", None)
            self.m.park(status, error="activity timed out", key=key, attention=attention)
        self.publish()

    def on_signal(self, job: Respond) -> None:
        """`_signal`: under the patch, after the activation's other jobs, and a response
        that comes while the model request is out waits for its answer."""
        request = RespondRequest(
            interaction_id=job.interaction_id,
            response={"type": "tool-approval", "approved": job.approved},
            responder="ana",
        )
        if not self.commute:
            self.take(request)
            return

        def handle() -> None:
            if self.m.answer_pending():  # `_until_answered`
                self.wait(lambda: not self.m.answer_pending(), lambda: self.take(request))
            else:
                self.take(request)

        self.wait(lambda: True, handle)

    def take(self, request: RespondRequest) -> None:
        """`_take`, or the rejection the signal handler records."""
        try:
            accepted, new, response = self.m.check_response(request)
        except Rejected as err:
            self.m.event(EventType.RESPONSE_REJECTED, detail=f"{err.kind}: {err.message}")
            return
        if new:
            self.m.accept_response(accepted, response)

    def wait(self, holds: Callable[[], bool], then: Callable[[], None]) -> None:
        self.waiters.append(Waiter(holds, then))

    def activation(self, jobs: Sequence[Job]) -> None:
        """One activation as temporalio 1.35 runs it (its default, "legacy" order: the
        flag that would apply every job as one batch is off): the signals first, each
        handler and every wait whose condition then holds run until nothing moves; then
        the other jobs, and again until nothing moves. So a signal is handled before the
        other jobs of its activation are even applied, unless what it waits for holds
        it back."""
        signals = [job for job in jobs if isinstance(job, Respond)]
        for job in signals:
            self.on_signal(job)
        if signals:
            self.settle()
        others = [job for job in jobs if not isinstance(job, Respond)]
        for job in others:
            if isinstance(job, Answer):
                self.on_answer(job)
            elif isinstance(job, ToolDone):
                self.on_tool(job)
        if others:
            self.settle()

    def settle(self) -> None:
        """Condition passes: each checks every wait in the order they began, then runs
        those that held, until none holds."""
        while ready := [w for w in self.waiters if w.holds()]:
            for waiter in ready:
                self.waiters.remove(waiter)
                waiter.then()

    def outcome(self) -> tuple[Any, ...]:
        """What must not depend on the split: the commands, in order; the decisions; and
        the events, as a whole. A refused signal's event is recorded where the signal is
        applied, before or after the task's other events, and its words name what was
        pending then: the snapshot's wording and order, not a command."""
        s = self.m.s
        return (
            self.commands,
            sorted(
                (e.type, e.operation or "", _words(e.type, e.detail))
                for e in s.events
                for _ in range(e.count)
            ),
            s.status,
            sorted(s.answered),
            [p.operation for p in s.parked],
            [i.id for i in s.interactions],
            len(s.transcript),
        )


def _words(kind: str, detail: str | None) -> str:
    if kind in (EventType.RESPONSE_REJECTED, EventType.SIGNAL_REJECTED):
        return (detail or "").split(" (pending", 1)[0].split(" (none is pending", 1)[0]
    return detail or ""


def splits(jobs: Sequence[Job]) -> Iterator[list[list[Job]]]:
    """Every way to cut the task's jobs, in history order, into consecutive activations."""
    for cuts in itertools.product((False, True), repeat=max(0, len(jobs) - 1)):
        parts: list[list[Job]] = [[jobs[0]]]
        for cut, job in zip(cuts, jobs[1:], strict=True):
            if cut:
                parts.append([job])
            else:
                parts[-1].append(job)
        yield parts


def outcomes(before: Sequence[Sequence[Job]], task: Sequence[Job], *, commute: bool) -> set[str]:
    """The outcome of every split of `task`, after the earlier tasks `before`."""
    seen = set()
    for split in splits(task):
        run = Run(commute=commute)
        run.request_model()
        for earlier in before:
            run.activation(earlier)
        for part in split:
            run.activation(part)
        seen.add(repr(run.outcome()))
    return seen


_CALLS = st.lists(st.sampled_from(["pay", "lookup", "file"]), min_size=1, max_size=3)
_IDS = st.sampled_from(
    ["approval:1:c0", "approval:1:c1", "approval:1:c2", "approval:1:zz", "approval:2:c0"]
)
_RESPONSES = st.lists(st.builds(Respond, _IDS, st.booleans()), max_size=3)


def _asked(calls: Sequence[str]) -> set[str]:
    """The interactions an answer with these calls asks (one approval per `pay`)."""
    return {f"approval:1:c{i}" for i, name in enumerate(calls) if name == "pay"}


class TestSplitsOfOneTask:
    @settings(max_examples=60, deadline=None)
    @given(calls=_CALLS, responses=_RESPONSES, cut=st.integers(min_value=0, max_value=3))
    def test_responses_in_the_task_of_the_answer_asking_for_them(
        self, calls: list[str], responses: list[Respond], cut: int
    ) -> None:
        """The model's answer and responses in one task, the responses answering at most
        one of the interactions it asks (and any number of nothing, or of another
        turn): every split gives the same commands, events and state. A response that
        comes while the model request is out waits for its answer, so it is taken after
        the answer whether the worker applied them apart or together."""
        assume(len({r.interaction_id for r in responses} & _asked(calls)) <= 1)
        cut = min(cut, len(responses))
        task: list[Job] = [*responses[:cut], Answer(tuple(calls)), *responses[cut:]]

        assert len(outcomes([], task, commute=True)) == 1

    @settings(max_examples=60, deadline=None)
    @given(
        calls=_CALLS,
        responses=_RESPONSES,
        finished=st.lists(st.booleans(), min_size=3, max_size=3),
        order=st.permutations(range(3)),
    )
    def test_refused_responses_beside_tool_results_and_timeouts(
        self, calls: list[str], responses: list[Respond], finished: list[bool], order: list[int]
    ) -> None:
        """Calls asked and started in an earlier task; this task brings their results or
        timeouts (a manual call parks), then responses to nothing pending (forged, late,
        of another turn): every split gives the same commands, and the same refusals."""
        assume(not {r.interaction_id for r in responses} & _asked(calls))
        answer = Answer(tuple(calls))
        tools = [
            ToolDone(f"c{i}", ok)
            for i, (name, ok) in enumerate(zip(calls, finished, strict=False))
            if name != "pay"
        ]
        task: list[Job] = [*(tools[i] for i in order if i < len(tools)), *responses]
        if not task:
            return

        assert len(outcomes([[answer]], task, commute=True)) == 1

    def test_before_the_patch_a_response_with_its_answer_could_split_two_ways(self) -> None:
        """The check above can fail: without the signals-commute patch, a response that
        came right after the answer asking for it is taken live (the answer applied
        early) and refused on replay (signals first)."""
        task: list[Job] = [Answer(("pay",)), Respond("approval:1:c0", approved=True)]

        assert len(outcomes([], task, commute=False)) == 2
        assert len(outcomes([], task, commute=True)) == 1

    def test_a_response_before_an_unrelated_timeout_commutes(self) -> None:
        """A denial that came *before* an unrelated call's timeout: signals come first on
        replay, and first live whether or not the worker applied the timeout apart."""
        task: list[Job] = [Respond("approval:1:c0", approved=False), ToolDone("c1", ok=False)]

        assert len(outcomes([[Answer(("pay", "lookup"))]], task, commute=True)) == 1


class TestSplitsThatDoNotCommute:
    """What no handler can make commute (docs/design.md, "The query race"): only a worker
    that never applies a task's events early (the query guard, or no cache) keeps these
    replayable. Each states the split that differs, so a change that makes one commute
    shows here."""

    def test_a_response_after_an_unrelated_timeout(self) -> None:
        """A denial that came *after* an unrelated call's timeout, split from it: live, the
        call parks first (the run fails its turn: an upsert) and the denial comes after;
        on replay the denial comes first (signals first) and the run is running a moment."""
        task: list[Job] = [ToolDone("c1", ok=False), Respond("approval:1:c0", approved=False)]

        assert len(outcomes([[Answer(("pay", "lookup"))]], task, commute=True)) == 2

    def test_two_answers_in_the_task_of_the_answer_asking_for_them_split_between_them(
        self,
    ) -> None:
        """Two approvals asked by one answer, both answered in its task, the first applied
        with the answer and the second alone: live, the first call is scheduled while
        the second still waits; on replay both answers are in before either call goes
        on, and the denial taken first makes the run running before the schedule."""
        task: list[Job] = [
            Answer(("pay", "pay")),
            Respond("approval:1:c1", approved=True),
            Respond("approval:1:c0", approved=False),
        ]

        assert len(outcomes([], task, commute=True)) == 2


def test_every_split_is_tried() -> None:
    """Three jobs cut four ways, in order."""
    jobs: list[Job] = [Answer(("pay",)), Respond("a", approved=True), ToolDone("c0", ok=True)]
    assert [[len(p) for p in s] for s in splits(jobs)] == [[3], [2, 1], [1, 2], [1, 1, 1]]
