"""The run's decisions, without a server: every status transition of SPEC section 3.

`RunMachine` holds what `AgentRunWorkflow` decides; these tests drive it the
way the workflow does (what happened -> what the state becomes) and check
what an operator would read: the status, the events, what is pending.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from durably._transcript import EMPTY_DIGEST
from durably.contract import (
    AgentPin,
    Attention,
    ErrorType,
    ModelCallResult,
    OperationKey,
    RaiseLimitsRequest,
    ResolveToolRequest,
    RespondAccepted,
    RespondRequest,
    RetrySpec,
    RunState,
    RunStatus,
    ToolPolicy,
    TranscriptArchive,
    TranscriptPage,
    UsageLimits,
)
from durably.messages import AssistantMessage, ToolCall, ToolResultMessage, Usage
from durably.workflows._continuation import _latest_answers, carried
from durably.workflows._machine import (
    CallTools,
    ContinueAsNew,
    OutOfTurns,
    RequestModel,
    RunMachine,
)
from durably.workflows._validation import Rejected

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _policy(recovery: str = "safe", **extra: Any) -> ToolPolicy:
    return ToolPolicy(
        recovery=recovery,
        retry=RetrySpec(max_attempts=1 if recovery == "manual" else 3),
        heartbeat_timeout_s=30,
        start_to_close_s=60,
        **extra,
    )


PIN = AgentPin(
    agent_id="desk",
    version="1",
    fingerprint="f",
    max_turns=3,
    model_heartbeat_timeout_s=30,
    model_start_to_close_s=60,
    tools={
        "lookup": _policy("safe"),
        "pay": _policy("manual", requires_approval=True, approval_timeout_s=60),
        "ask": _policy("safe", question=True),
        "file": _policy("manual"),
    },
)


def machine(*, hardened: bool = True) -> RunMachine:
    state = RunState(agent_id="desk", input="refund order 7", digest=EMPTY_DIGEST, chain="c1")
    m = RunMachine(state, run_id="run-1", hardened=hardened, clock=lambda: NOW)
    m.pinned(PIN)
    return m


def answer(m: RunMachine, *calls: tuple[str, dict[str, Any]], text: str = "") -> RequestModel:
    """The model answers the next turn with these calls (or a final `text`)."""
    step = m.next_step(lambda: False)
    assert isinstance(step, RequestModel)
    message = AssistantMessage(
        content=text or None,
        tool_calls=[
            ToolCall(id=f"call_{i}", name=n, arguments=a) for i, (n, a) in enumerate(calls)
        ],
    )
    m.model_answered(step, ModelCallResult(message=message, usage=Usage(requests=1)))
    return step


def events(m: RunMachine) -> list[str]:
    return [e.type for e in m.s.events]


def respond(m: RunMachine, iid: str, response: dict[str, Any], who: str = "ana") -> RespondAccepted:
    accepted, new, parsed = m.check_response(
        RespondRequest(interaction_id=iid, response=response, responder=who)
    )
    if new:
        m.accept_response(accepted, parsed)
    return accepted


class TestOperationKey:
    def test_keys_are_written_as_the_run_protocol_writes_them(self) -> None:
        assert [str(k) for k in (OperationKey("pin"), OperationKey.model(3))] == ["pin", "model:3"]
        assert str(OperationKey.tool(2, "call:x")) == "tool:2:call:x"
        assert str(OperationKey.restore(40)) == "restore:40"

    def test_a_tool_key_names_its_interaction(self) -> None:
        key = OperationKey.tool(2, "call:x")
        assert key.interaction_id(PIN.tools["pay"]) == "approval:2:call:x"
        assert key.interaction_id(PIN.tools["ask"]) == "question:2:call:x"


class TestNextStep:
    def test_a_turn_hands_out_every_call_without_a_result(self) -> None:
        m = machine()
        answer(m, ("lookup", {"q": 1}), ("lookup", {"q": 2}))
        step = m.next_step(lambda: False)
        assert isinstance(step, CallTools)
        assert (step.turn, [c.call_id for c in step.calls]) == (1, ["call_0", "call_1"])
        first = step.calls[0]
        m.tool_done(OperationKey.tool(1, "call_0"), first, _result(first), resolved=False)
        step = m.next_step(lambda: False)
        assert isinstance(step, CallTools) and [c.call_id for c in step.calls] == ["call_1"]

    def test_a_full_history_continues_as_new_between_turns_only(self) -> None:
        m = machine()
        answer(m, ("lookup", {}))
        assert isinstance(m.next_step(lambda: True), CallTools)
        call = m.unfinished_calls()[0]
        m.tool_done(OperationKey.tool(1, call.call_id), call, _result(call), resolved=False)
        assert isinstance(m.next_step(lambda: True), ContinueAsNew)

    def test_the_turn_after_max_turns_fails_the_run_saying_what_to_raise(self) -> None:
        m = machine()
        for _ in range(PIN.max_turns):
            answer(m, ("lookup", {}))
            call = m.unfinished_calls()[0]
            m.tool_done(
                OperationKey.tool(m.s.turns, call.call_id), call, _result(call), resolved=False
            )
        step = m.next_step(lambda: False)
        assert isinstance(step, OutOfTurns) and "max_turns" in step.error
        m.park(RunStatus.FAILED, error=step.error, retryable=False)
        assert m.s.status == RunStatus.FAILED
        with pytest.raises(Rejected, match="retrying cannot fix"):
            m.check_retry()


class TestRunningToCompleted:
    def test_a_final_answer_completes_the_run_with_its_output(self) -> None:
        m = machine()
        step = answer(m, text="refunded")
        assert step.turn == 1 and m.s.turns == 1 and m.s.usage.requests == 1
        result = m.complete("refunded")
        assert (result.output, result.turns, result.run_id) == ("refunded", 1, "run-1")
        assert m.s.status == RunStatus.COMPLETED
        assert m.s.outcome == {"type": "completed", "output": "refunded"}
        assert events(m) == ["agent_pinned", "model_completed", "run_completed"]


class TestWaiting:
    def test_an_approval_makes_the_run_wait_then_run_the_call(self) -> None:
        m = machine()
        answer(m, ("pay", {"amount": 5}))
        key, call = OperationKey.tool(1, "call_0"), m.unfinished_calls()[0]
        policy = m.needs_person(key, call)
        assert policy is not None
        interaction = m.ask(key, call, policy, now=NOW)
        assert m.s.status == RunStatus.WAITING
        assert interaction.id == "approval:1:call_0"
        assert interaction.operation_id == "run-1/c1/tool:1:call_0"
        assert m.deadline(interaction, policy, NOW) == NOW + timedelta(seconds=60)
        respond(m, interaction.id, {"type": "tool-approval", "approved": True})
        assert m.answered(interaction)
        assert m.take_answer(interaction, call) is None  # approved: the call runs
        assert m.s.status == RunStatus.RUNNING and m.s.interaction is None
        assert events(m)[-2:] == ["waiting", "approved"]

    def test_a_denial_is_the_calls_result_with_the_reason(self) -> None:
        m = machine()
        answer(m, ("pay", {"amount": 5}))
        key, call = OperationKey.tool(1, "call_0"), m.unfinished_calls()[0]
        interaction = m.ask(key, call, PIN.tools["pay"], now=NOW)
        respond(m, interaction.id, {"type": "tool-approval", "approved": False, "reason": "no"})
        result = m.take_answer(interaction, call)
        assert result is not None and result.is_error and result.content == "denied: no"
        assert m.s.transcript[-1] == result and m.unfinished_calls() == []

    def test_an_answer_is_the_calls_result(self) -> None:
        m = machine()
        answer(m, ("ask", {"question": "which order?"}))
        key, call = OperationKey.tool(1, "call_0"), m.unfinished_calls()[0]
        interaction = m.ask(key, call, PIN.tools["ask"], now=NOW)
        assert interaction.type == "question" and interaction.question == "which order?"
        respond(m, interaction.id, {"type": "question", "answer": "seven"})
        result = m.take_answer(interaction, call)
        assert result is not None and result.content == "seven" and not result.is_error

    def test_no_answer_in_time_denies_in_the_persons_place(self) -> None:
        m = machine()
        answer(m, ("pay", {}))
        key, call = OperationKey.tool(1, "call_0"), m.unfinished_calls()[0]
        interaction = m.ask(key, call, PIN.tools["pay"], now=NOW)
        m.time_out(interaction, PIN.tools["pay"])
        result = m.take_answer(interaction, call)
        assert result is not None and result.content == "denied: approval timed out"
        assert "timed_out" in [e.type for e in m.s.audit]

    def test_a_different_second_answer_is_a_conflict_and_the_same_one_is_harmless(self) -> None:
        m = machine()
        answer(m, ("pay", {}))
        key, call = OperationKey.tool(1, "call_0"), m.unfinished_calls()[0]
        interaction = m.ask(key, call, PIN.tools["pay"], now=NOW)
        first = respond(m, interaction.id, {"type": "tool-approval", "approved": True})
        assert respond(m, interaction.id, {"type": "tool-approval", "approved": True}) == first
        with pytest.raises(Rejected) as refused:
            respond(m, interaction.id, {"type": "tool-approval", "approved": False})
        assert refused.value.kind == ErrorType.INTERACTION_CONFLICT

    def test_a_response_to_nothing_pending_is_refused_naming_what_is(self) -> None:
        m = machine()
        with pytest.raises(Rejected, match="none is pending") as refused:
            respond(m, "approval:9:x", {"type": "tool-approval", "approved": True})
        assert refused.value.kind == ErrorType.INVALID_RESPONSE


class TestParking:
    def test_an_interrupted_manual_call_needs_attention_and_takes_a_resolution(self) -> None:
        m = machine()
        answer(m, ("file", {"title": "t"}))
        key, call = OperationKey.tool(1, "call_0"), m.unfinished_calls()[0]
        status, attention = m.classify(key, "worker lost", None)
        assert status == RunStatus.NEEDS_ATTENTION and attention is not None
        assert attention.reason == "tool_interrupted" and attention.detail["tool"] == "file"
        m.park(status, error="worker lost", key=key, attention=attention)
        assert (m.s.status, m.s.blocked_operation) == (RunStatus.NEEDS_ATTENTION, str(key))
        with pytest.raises(Rejected, match="never repeats a manual call"):
            m.check_retry()
        request = ResolveToolRequest(
            operation=str(key), resolution={"type": "json", "value": {"id": 3}}
        )
        m.check_resolution(request)
        resolution = m.resolve(request)
        with pytest.raises(Rejected, match="already accepted a json decision"):
            m.check_resolution(request)
        assert m.decided(key) == resolution
        assert m.s.status == RunStatus.RUNNING and m.s.blocked_operation is None
        assert resolution.type == "json"
        result = m.resolved_result(call, resolution)
        assert result.content == '{"id":3}' and not result.is_error
        m.tool_done(key, call, result, resolved=True)
        assert events(m)[-3:] == ["needs_attention", "resolved_json", "tool_resolved"]

    def test_a_missing_version_needs_attention_until_retried(self) -> None:
        m = machine()
        key = OperationKey.model(1)
        status, attention = m.classify(key, "gone", {"reason": "version_missing", "version": "1"})
        assert status == RunStatus.NEEDS_ATTENTION
        assert attention == Attention(
            reason="version_missing",
            detail={"reason": "version_missing", "version": "1", "last_error": "gone"},
        )
        m.park(status, error="gone", key=key, attention=attention)
        with pytest.raises(Rejected, match="not an interrupted tool"):
            m.check_resolution(ResolveToolRequest(operation=str(key), resolution={"type": "rerun"}))
        assert m.retry() == "model:1"
        assert m.decided(key) == "retry" and m.s.status == RunStatus.RUNNING

    def test_a_safe_call_out_of_retries_fails_the_run_and_retry_runs_it_again(self) -> None:
        m = machine()
        answer(m, ("lookup", {}))
        key = OperationKey.tool(1, "call_0")
        status, attention = m.classify(key, "boom", None)
        assert (status, attention) == (RunStatus.FAILED, None)
        m.park(status, error="boom", key=key)
        assert (m.s.status, m.s.error, m.s.failed_operation) == (RunStatus.FAILED, "boom", str(key))
        assert m.parked_on(key) and not m.parked_on(OperationKey.model(1))
        with pytest.raises(Rejected, match="needs_attention runs"):
            machine().check_retry()  # a running run has nothing to retry
        assert m.retry() == str(key)
        m.decided(key)
        assert (m.s.status, m.s.error, m.s.failed_operation) == (RunStatus.RUNNING, None, None)

    def test_parking_again_where_it_is_parked_records_nothing_new(self) -> None:
        m = machine()
        key = OperationKey.model(1)
        m.park(RunStatus.FAILED, error="boom", key=key)
        m.park(RunStatus.FAILED, error="boom", key=key)  # resumed after continue-as-new
        assert events(m).count("run_failed") == 1


class TestEnds:
    def test_cancelling_is_recorded_for_the_audit(self) -> None:
        m = machine()
        m.cancel()
        assert m.s.status == RunStatus.CANCELLED
        assert [e.type for e in m.s.audit] == ["run_cancelled"]

    def test_repeated_rejections_coalesce_into_one_event_with_a_count(self) -> None:
        m = machine()
        for _ in range(3):
            m.event("signal_rejected", detail="unknown signal 'x'")
        assert m.s.events[-1].count == 3 and events(m).count("signal_rejected") == 1


class TestCancelAndLoss:
    def test_cancelling_a_waiting_run_ends_it_cancelled(self) -> None:
        m = machine()
        answer(m, ("pay", {}))
        m.ask(OperationKey.tool(1, "call_0"), m.unfinished_calls()[0], PIN.tools["pay"], now=NOW)
        m.cancel()
        assert m.s.status == RunStatus.CANCELLED and not m.s.status.unfinished

    def test_cancelling_a_parked_run_ends_it_cancelled(self) -> None:
        m = machine()
        m.park(RunStatus.FAILED, error="boom", key=OperationKey.model(1))
        m.cancel()
        assert m.s.status == RunStatus.CANCELLED
        assert events(m)[-2:] == ["run_failed", "run_cancelled"]

    def test_a_lost_transcript_fails_the_run_for_good_whatever_it_waited_for(self) -> None:
        m = machine()
        answer(m, ("pay", {}))
        m.ask(OperationKey.tool(1, "call_0"), m.unfinished_calls()[0], PIN.tools["pay"], now=NOW)
        m.lose_transcript("the previous run is gone", OperationKey.restore(0))
        s = m.s
        assert (s.status, s.retryable, s.failed_operation) == (RunStatus.FAILED, False, "restore:0")
        assert s.interaction is None and s.outcome is None
        with pytest.raises(Rejected, match="retrying cannot fix"):
            m.check_retry()

    def test_a_restored_transcript_comes_page_by_page_to_its_length(self) -> None:
        source = machine()
        answer(source, text="done")
        archive = TranscriptArchive(
            run_id="prev", length=2, digest=source.s.digest, base_length=2, new=[]
        )
        m = RunMachine(
            RunState(agent_id="desk", input="", digest=source.s.digest, archive=archive),
            run_id="run-1",
            hardened=True,
            clock=lambda: NOW,
        )
        first = m.next_page(archive)
        assert first is not None and str(first) == "restore:0"
        m.restored_page(
            archive, TranscriptPage(offset=0, messages=source.s.transcript[:1], total=2)
        )
        second = m.next_page(archive)
        assert second is not None and str(second) == "restore:1"
        m.restored_page(
            archive, TranscriptPage(offset=1, messages=source.s.transcript[1:] * 3, total=2)
        )
        assert m.next_page(archive) is None and m.s.transcript == source.s.transcript
        m.restored(archive)
        assert m.s.archive is None and events(m) == ["transcript_restored"]


class TestContinuation:
    def test_a_waiting_run_carries_its_interaction_and_not_its_transcript(self) -> None:
        m = machine()
        answer(m, ("pay", {"amount": 5}))
        key, call = OperationKey.tool(1, "call_0"), m.unfinished_calls()[0]
        m.ask(key, call, PIN.tools["pay"], now=NOW)
        next_input, problem = carried(m, "temporal-run-2")
        assert problem is None and next_input is not None and next_input.carried is not None
        state = next_input.carried
        assert state.transcript == [] and state.archive is not None
        assert (state.archive.run_id, state.archive.length) == ("temporal-run-2", 2)
        assert state.status == RunStatus.WAITING and state.interaction is not None
        assert next_input.input == ""  # it travels once, in the transcript

    def test_continue_as_new_carries_the_newest_answers_within_bounds(self) -> None:
        """The newest 100 answers, in order, and never more than 256 KiB of them."""

        def answers(count: int, size: int) -> dict[str, RespondAccepted]:
            return {
                f"question:{n}:q": RespondAccepted(
                    interaction_id=f"question:{n}:q", type="question", answer="x" * size
                )
                for n in range(count)
            }

        short = _latest_answers(answers(150, 10))
        assert list(short) == [f"question:{n}:q" for n in range(50, 150)]
        long = _latest_answers(answers(10, 100_000))
        assert list(long) == ["question:8:q", "question:9:q"]
        assert _latest_answers(answers(3, 300_000)) == {}


def _result(call: ToolCall) -> ToolResultMessage:
    return ToolResultMessage(call_id=call.call_id, tool=call.name, content="ok")


def parallel_machine() -> RunMachine:
    state = RunState(agent_id="desk", input="refund order 7", digest=EMPTY_DIGEST, chain="c1")
    m = RunMachine(state, run_id="run-1", hardened=True, parallel=True, clock=lambda: NOW)
    m.pinned(PIN)
    return m


def result(call_id: str, content: str) -> ToolResultMessage:
    return ToolResultMessage(call_id=call_id, tool="lookup", content=content)


class TestSeveralCallsOfOneTurn:
    """The parallel-tools patch: several calls of a turn at once (SPEC section 14)."""

    def test_results_enter_the_transcript_in_call_order_whatever_order_they_finish(
        self,
    ) -> None:
        m = parallel_machine()
        answer(m, ("lookup", {"q": "a"}), ("lookup", {"q": "b"}), ("lookup", {"q": "c"}))
        keys = [OperationKey.tool(1, f"call_{i}") for i in range(3)]

        def finish(i: int) -> list[str]:
            m.tool_done(keys[i], m.call_of(keys[i]), result(f"call_{i}", "x"), resolved=False)
            return [r.call_id for r in m.s.transcript if isinstance(r, ToolResultMessage)]

        assert finish(2) == []
        assert finish(1) == []
        assert m.is_held(m.call_of(keys[1])) and m.is_held(m.call_of(keys[2]))
        assert finish(0) == ["call_0", "call_1", "call_2"]
        assert m.s.held == []
        assert isinstance(m.next_step(lambda: False), RequestModel)

    def test_the_status_follows_needs_attention_failed_waiting_running(self) -> None:
        m = parallel_machine()
        answer(m, ("pay", {"n": 1}), ("file", {"n": 2}), ("lookup", {"n": 3}))
        pay, file, lookup = (OperationKey.tool(1, f"call_{i}") for i in range(3))
        m.ask(pay, m.call_of(pay), PIN.tools["pay"], now=NOW)
        assert m.s.status == RunStatus.WAITING
        m.park(RunStatus.FAILED, error="db down", key=lookup)
        assert (m.s.status, m.s.failed_operation, m.s.error) == (
            RunStatus.FAILED,
            str(lookup),
            "db down",
        )
        attention = Attention(reason="tool_interrupted", detail={"tool": "file"})
        m.park(RunStatus.NEEDS_ATTENTION, error="lost", key=file, attention=attention)
        assert (m.s.status, m.s.blocked_operation) == (RunStatus.NEEDS_ATTENTION, str(file))
        assert m.s.failed_operation == str(lookup)

        with pytest.raises(Rejected, match="is blocked on 'tool:1:call_1'"):
            m.check_resolution(ResolveToolRequest(operation=str(pay), resolution={"type": "rerun"}))
        m.resolve(ResolveToolRequest(operation=str(file), resolution={"type": "rerun"}))
        m.decided(file)
        assert m.s.status == RunStatus.FAILED
        assert m.retry() == str(lookup)
        m.decided(lookup)
        assert m.s.status == RunStatus.WAITING
        assert [i.id for i in m.s.interactions] == ["approval:1:call_0"]

    def test_retry_never_repeats_an_interrupted_manual_call_beside_a_failed_one(self) -> None:
        m = parallel_machine()
        answer(m, ("file", {"n": 1}), ("lookup", {"n": 2}))
        file, lookup = (OperationKey.tool(1, f"call_{i}") for i in range(2))
        attention = Attention(reason="tool_interrupted", detail={"tool": "file"})
        m.park(RunStatus.NEEDS_ATTENTION, error="lost", key=file, attention=attention)
        m.park(RunStatus.FAILED, error="db down", key=lookup)
        assert m.retry() == str(lookup)
        assert m.decisions == {str(lookup): "retry"}
        with pytest.raises(Rejected, match="interrupted manual tool call"):
            m.check_retry()

    def test_a_batch_with_one_bad_response_is_refused_whole_naming_it(self) -> None:
        m = parallel_machine()
        answer(m, ("pay", {"n": 1}), ("pay", {"n": 2}))
        for i in range(2):
            key = OperationKey.tool(1, f"call_{i}")
            m.ask(key, m.call_of(key), PIN.tools["pay"], now=NOW)
        good = RespondRequest(interaction_id="approval:1:call_0", response=APPROVE_RESPONSE)
        bad = RespondRequest(interaction_id="approval:1:call_9", response=APPROVE_RESPONSE)
        with pytest.raises(Rejected, match=r"response 2 of 2: .*no interaction"):
            m.check_many([good, bad])
        with pytest.raises(Rejected, match="answers 'approval:1:call_0' again"):
            m.check_many([good, good])
        assert m.s.answered == {}
        assert len(m.check_many([good])) == 1

    def test_a_run_continued_from_one_call_at_a_time_keeps_its_wait(self) -> None:
        """A sequential run's singular wait is taken into the lists (nothing repeated)."""
        m = machine()
        answer(m, ("file", {"n": 1}))
        file = OperationKey.tool(1, "call_0")
        attention = Attention(reason="tool_interrupted", detail={"tool": "file"})
        m.park(RunStatus.NEEDS_ATTENTION, error="lost", key=file, attention=attention)
        continued = RunMachine(
            m.s.model_copy(deep=True),
            run_id="run-1",
            hardened=True,
            parallel=True,
            clock=lambda: NOW,
        )
        assert continued.parked_on(file)
        assert continued.s.blocked_operation == str(file)
        assert [p.operation for p in continued.s.parked] == [str(file)]


APPROVE_RESPONSE = {"type": "tool-approval", "approved": True}


class TestUsageLimits:
    """SPEC section 17: which limit stops which operation, what a raise may set."""

    @staticmethod
    def limited(
        limits: UsageLimits | None,
        *,
        cap: UsageLimits | None = None,
        asked: UsageLimits | None = None,
        max_turns: int | None = None,
    ) -> tuple[RunMachine, str | None]:
        state = RunState(
            agent_id="desk",
            input="refund order 7",
            digest=EMPTY_DIGEST,
            limits=asked,
            max_turns=max_turns,
            started_at=NOW - timedelta(seconds=30),
        )
        m = RunMachine(
            state, run_id="run-1", hardened=True, parallel=True, clock=lambda: NOW,
            limits_apply=lambda: True,
        )  # fmt: skip
        m.pinned(PIN.model_copy(update={"limits": limits, "limit_cap": cap, "max_turns_cap": 5}))
        return m, m.start_limits()

    def test_each_limit_stops_the_operations_it_applies_to(self) -> None:
        m, _ = self.limited(UsageLimits(requests=1, tool_calls=1, wall_clock_s=60))
        model2, tool = OperationKey.model(2), OperationKey.tool(1, "call_0")
        assert m.over_budget(OperationKey.model(1), NOW) is None  # nothing used yet
        answer(m, ("lookup", {}))
        m.used(Usage(tool_calls=1))
        requests = m.over_budget(model2, NOW)
        assert requests is not None and requests.detail["limit"] == "requests"
        calls = m.over_budget(tool, NOW)
        assert calls is not None and calls.detail["limit"] == "tool_calls"
        assert calls.detail["tool"] == "lookup"
        m.s.limits = UsageLimits(wall_clock_s=20)  # started 30 s ago
        assert m.over_budget(tool, NOW) is not None and m.over_budget(model2, NOW) is not None

    def test_a_caller_may_tighten_or_raise_up_to_the_cap_and_no_further(self) -> None:
        m, problem = self.limited(
            UsageLimits(total_tokens=1000, cost_usd=1.0),
            cap=UsageLimits(total_tokens=5000),
            asked=UsageLimits(total_tokens=4000, cost_usd=0.5),
        )
        assert problem is None
        assert m.s.limits == UsageLimits(total_tokens=4000, cost_usd=0.5)
        _, problem = self.limited(UsageLimits(cost_usd=1.0), asked=UsageLimits(cost_usd=2.0))
        assert problem is not None and "cost_usd 2 is above" in problem
        _, problem = self.limited(None, asked=UsageLimits(cost_usd=2.0), max_turns=6)
        assert problem is not None and "max_turns 6" in problem

    def test_a_raise_that_leaves_the_parked_operation_over_its_limit_is_refused(
        self,
    ) -> None:
        m, _ = self.limited(UsageLimits(total_tokens=10), cap=UsageLimits(total_tokens=100))
        step = m.next_step(lambda: False)
        assert isinstance(step, RequestModel)
        message = AssistantMessage(tool_calls=[ToolCall(id="c", name="lookup", arguments={})])
        m.model_answered(step, ModelCallResult(message=message, usage=Usage(input_tokens=40)))
        key = OperationKey.tool(1, "c")
        over = m.over_budget(key, NOW)
        assert over is not None
        m.park(RunStatus.NEEDS_ATTENTION, error="", key=key, attention=over)
        assert m.s.status == RunStatus.NEEDS_ATTENTION
        with pytest.raises(Rejected, match="still be over its total_tokens"):
            m.check_raise(RaiseLimitsRequest(limits=UsageLimits(total_tokens=40)), NOW)
        with pytest.raises(Rejected, match="above what agent"):
            m.check_raise(RaiseLimitsRequest(limits=UsageLimits(total_tokens=101)), NOW)
        with pytest.raises(Rejected, match="raise_limits"):
            m.check_retry()
        accepted = m.raise_limits(RaiseLimitsRequest(limits=UsageLimits(total_tokens=41)), NOW)
        assert accepted.resumed == [str(key)]
        assert m.decided(key) == "retry"
        assert m.s.status == RunStatus.RUNNING
        assert events(m)[-2:] == ["needs_attention", "limits_raised"]  # no "retried"

    def test_the_runs_own_turn_budget_ends_it_as_a_turn_budget_failure(self) -> None:
        m, _ = self.limited(None, max_turns=1)
        answer(m, ("lookup", {}))
        m.tool_done(
            OperationKey.tool(1, "call_0"),
            ToolCall(id="call_0", name="lookup", arguments={}),
            ToolResultMessage(call_id="call_0", tool="lookup", content="ok"),
            resolved=False,
        )
        step = m.next_step(lambda: False)
        assert isinstance(step, OutOfTurns) and "1 turns its starter gave it" in step.error

    def test_a_runs_own_turn_budget_above_the_agents_is_the_one_it_runs_out_of(self) -> None:
        m, problem = self.limited(None, max_turns=5)  # the agent's is 3, its cap 5
        assert problem is None
        for turn in range(1, 6):
            answer(m, ("lookup", {}))
            key = OperationKey.tool(turn, "call_0")
            m.tool_done(
                key,
                ToolCall(id="call_0", name="lookup", arguments={}),
                ToolResultMessage(call_id="call_0", tool="lookup", content="ok"),
                resolved=False,
            )
        step = m.next_step(lambda: False)
        assert isinstance(step, OutOfTurns) and "all 5 turns its starter gave it" in step.error

    def test_carried_usage_reads_as_the_previous_release_reads_it(self) -> None:
        """A worker of the release before the new usage fields may take the next run of a
        chain in a rolling deploy: its `Usage` forbids unknown fields, so the carried
        state keeps them apart, and this release reads them back whole."""

        class OldUsage(BaseModel):
            model_config = ConfigDict(extra="forbid")
            requests: int = 0
            input_tokens: int = 0
            output_tokens: int = 0

        usage = Usage(requests=2, input_tokens=9, tool_calls=3, cost_usd=0.25)
        state = RunState(agent_id="desk", input="x", digest=EMPTY_DIGEST, usage=usage)
        sent = json.loads(state.model_dump_json())
        OldUsage.model_validate(sent["usage"])
        assert RunState.model_validate(sent).usage == usage
