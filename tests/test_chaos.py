"""The small chaos soak (`benchmarks/chaos.py --small`), run as CI runs it, and the check
every soak ends with: each execution replayed as a freshly started worker would.

The soak starts its own dev server, ticket service, MCP server and worker
processes, runs every agent kind (single runs, sessions, parallel calls,
subagents and tasks, limits that park, an MCP tool), SIGKILLs workers,
restarts the server once, and checks the tools' journals; see the script's
docstring. Its replay check is tested apart, on the histories of runs the
query race wedged (`tests/wedged/`, issue 26), with no server: a soak whose
histories all replayed proves nothing about a check that never fails. So are
the session agent's scripts: a soak that reads an earlier submission the model
never saw proves nothing either.
"""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.history.v1 import WorkflowTaskFailedEventAttributes
from temporalio.client import WorkflowHistory

from durably._converter import durable_converter
from durably._repair import fates_after
from durably._replay import first_unreplayable_task, replay
from durably.codec import EncryptionKeyError, EncryptionKeys
from durably.messages import Message, ModelRequest, ToolResultMessage, UserMessage

ROOT = Path(__file__).resolve().parent.parent
SOAK = ROOT / "benchmarks" / "chaos.py"
# Runs the query race wedged (six from soaks before the query guard, one by the path of a
# task a starved worker lost, which the guard refuses since, `docs/design.md`): none replays.
WEDGED = sorted((Path(__file__).resolve().parent / "wedged").glob("*.json"))
# A run recorded by durably 0.1.0 that completed: it replays.
REPLAYS = Path(__file__).resolve().parent / "histories/0.1.0/completed_after_model_retry_wait.json"


def count(output: str, name: str) -> int:
    found = re.search(rf"^{re.escape(name)}: (\d+)$", output, re.MULTILINE)
    assert found is not None, f"no {name!r} count in the soak's output:\n{output}"
    return int(found.group(1))


def soak_module() -> ModuleType:
    """`benchmarks/chaos.py`, imported (it finds its agents module beside itself)."""
    if str(SOAK.parent) not in sys.path:
        sys.path.insert(0, str(SOAK.parent))
    return importlib.import_module("chaos")


def agents_module() -> ModuleType:
    """`benchmarks/chaos_agents.py`, the soak's agents."""
    soak_module()
    return importlib.import_module("chaos_agents")


def execution(path: Path) -> tuple[str, str, WorkflowHistory]:
    """A recorded execution's (workflow id, run id, history); the file is named after the
    workflow id it ran under."""
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    started = history.events[0].workflow_execution_started_event_attributes
    return path.stem, started.original_execution_run_id, history


def failed_tasks(history: WorkflowHistory) -> list[WorkflowTaskFailedEventAttributes]:
    """The history's WorkflowTaskFailed events' attributes (a test changes them in place)."""
    return [
        e.workflow_task_failed_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
    ]


class TestReplayCheck:
    async def test_fails_on_the_histories_the_query_race_wedged(self) -> None:
        """Every wedged history fails to replay; its nondeterminism error is named."""
        chaos = soak_module()
        assert len(WEDGED) == 7, WEDGED

        check = await chaos.check_histories(map(execution, WEDGED), durable_converter(None))
        lines = check.lines()

        assert lines[0] == "histories replayed: 7, replay failures: 7", lines
        assert re.fullmatch(r"workflow task failures: [1-9]\d*", lines[1]), lines
        assert "  by cause: NON_DETERMINISTIC_ERROR" in lines[2], lines
        first = next(line for line in lines if line.startswith("first nondeterminism error"))
        assert "[TMPRL1100] Nondeterminism error" in first, lines
        assert re.search(r"chaos-\d{4}-\w+ \(run [0-9a-f-]{36}\)", first), lines
        assert check.failures > 6

    async def test_passes_on_a_history_that_replays(self) -> None:
        """A recorded history of a run that completed reads zero on both lines."""
        chaos = soak_module()

        check = await chaos.check_histories([execution(REPLAYS)], durable_converter(None))

        assert check.lines()[:2] == [
            "histories replayed: 1, replay failures: 0",
            "workflow task failures: 0",
        ]

    async def test_server_handovers_and_a_missing_key_are_named_not_counted(self) -> None:
        """Tasks the server closed to hand over a signal, and tasks failed for want of an
        encryption key (SPEC section 18, the one excepted failure), each get a line of
        their own and count as no workflow task failure."""
        chaos = soak_module()
        handed_over, keyless = [w for w in map(execution, WEDGED) if failed_tasks(w[2])][:2]
        for task in failed_tasks(handed_over[2]):
            task.cause = WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND
        with pytest.raises(EncryptionKeyError) as missing:
            EncryptionKeys({"a": bytes(32)}).cipher("gone")
        for task in failed_tasks(keyless[2]):
            task.failure.message = str(missing.value)

        check = await chaos.check_histories([handed_over, keyless], durable_converter(None))
        lines = check.lines()

        assert lines[1] == "workflow task failures: 0", lines
        handovers = len(failed_tasks(handed_over[2]))
        assert f"server handovers (not failures): UNHANDLED_COMMAND {handovers}" in lines
        assert len(check.missing_key) == len(failed_tasks(keyless[2])) > 0
        assert any(line.startswith("missing encryption key") for line in lines), lines
        # Their replays still fail: a handover or a key does not excuse nondeterminism.
        assert lines[0] == "histories replayed: 2, replay failures: 2", lines


class TestWedgedRunsAreRepairable:
    """SPEC section 22: a run the query race wedged replays no more (no code can change
    that, the issue says), so it must be repairable. `durably repair` resets it to the
    first workflow task that does not replay and tells it the fate of every operation
    after that point; its run against the dev server is `test_query_race.TestRepair`.
    Here, with no server, every wedged history of `tests/wedged/` (the six of
    `../shared/regressions/` and the soak's seventh) is shown to have that point."""

    @pytest.mark.parametrize("path", WEDGED, ids=lambda p: p.stem)
    async def test_repair_finds_where_to_reset_and_what_it_keeps_replays(self, path: Path) -> None:
        _, _, history = execution(path)
        converter = durable_converter(None)

        bad = await first_unreplayable_task(history, converter)

        assert bad is not None, "the history replays: it is not wedged"
        kept_through = bad.workflow_task_completed_event_attributes.started_event_id
        kept = WorkflowHistory(
            history.workflow_id, [e for e in history.events if e.event_id <= kept_through]
        )
        assert await replay(kept, converter) is None  # what the reset keeps replays
        fates = await fates_after(history.events, kept_through, converter)
        after = {
            e.activity_task_scheduled_event_attributes.activity_id
            for e in history.events
            if e.event_id > kept_through
            and e.HasField("activity_task_scheduled_event_attributes")
            and e.activity_task_scheduled_event_attributes.activity_type.name
            in ("durably.tool_call", "durably.model_request")
        }
        assert {f.operation for f in fates} == after  # each gets a fate, none is run blind


class TestSessionScripts:
    async def test_a_later_submission_numbers_its_calls_apart_and_reads_the_earlier_ones(
        self,
    ) -> None:
        """The second run of a session plays its script from its own message on, with call
        ids of its own, and its answer lists the earlier submission and its answer."""
        agents = agents_module()
        model = agents.scripted(agents.SESSION_AGENT)
        first: list[Message] = [UserMessage(content="message 1")]
        for turn in agents.SCRIPTS[agents.SESSION_AGENT]:
            answer = await model.request(ModelRequest(instructions="", messages=tuple(first)))
            calls = answer.message.tool_calls
            assert [c.name for c in calls] == [name for name, _ in turn]
            first += [answer.message]
            first += [
                ToolResultMessage(call_id=c.call_id, tool=c.name, content="ok") for c in calls
            ]
        done = await model.request(ModelRequest(instructions="", messages=tuple(first)))
        first += [done.message]

        second = (*first, UserMessage(content="message 2"))
        answer = await model.request(ModelRequest(instructions="", messages=second))

        assert [c.call_id for c in answer.message.tool_calls] == ["m2t1-1", "m2t1-2"]
        results = tuple(
            ToolResultMessage(call_id=c.call_id, tool=c.name, content="ok")
            for c in answer.message.tool_calls
        )
        later = (*second, answer.message, *results)
        turn2 = await model.request(ModelRequest(instructions="", messages=later))
        assert [c.call_id for c in turn2.message.tool_calls] == ["m2t2-1"]
        results = (ToolResultMessage(call_id="m2t2-1", tool="create_ticket", content="ok"),)
        final = await model.request(
            ModelRequest(instructions="", messages=(*later, turn2.message, *results))
        )
        said = json.loads(final.message.content or "")
        assert said["earlier"] == ["message 1"] and said["earlier_answers"] == 1
        assert sorted(said["results"]) == ["tool:1:m2t1-1", "tool:1:m2t1-2", "tool:2:m2t2-1"]
        assert said["problems"] == []


class TestChaosSoak:
    @pytest.mark.timeout(660)
    def test_the_small_soak_loses_nothing_and_repeats_no_effect(self) -> None:
        """Killed workers and a server restart: every run completes, no effect repeats,
        every history replays and no workflow task failed."""
        soak = subprocess.run(
            # durably's defaults: crashed model requests get 3 attempts, no more.
            [sys.executable, str(SOAK), "--small", "--no-model-retry"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            # The soak ends on a stall or at its cap (420 s), then checks and replays.
            timeout=600,
        )
        shown = f"stdout:\n{soak.stdout}\nstderr (tail):\n{soak.stderr[-5000:]}"

        assert soak.returncode == 0, shown
        out = soak.stdout
        assert count(out, "violations") == 0, shown
        assert count(out, "kills") >= 2, shown
        assert count(out, "server restarts") == 1, shown
        assert count(out, "runs completed") == count(out, "runs started") > 0, shown
        for name in (
            "runs lost",
            "runs never started",
            "duplicate idempotent effects",
            "manual calls executed twice",
            "manual duplicate effects",
            "interrupted manual calls not needs_attention",
            "denied calls executed",
            "outputs disagreeing with the journal",
            "failed runs retried",
            "sessions whose runs are not their submissions, in order, completed",
            "sessions with a submission accepted twice or not at all",
            "session runs that did not read every earlier message",
            "tool calls started before the raise they needed",
            "MCP writes applied twice (several operation ids for one call)",
            "MCP writes of completed runs not applied once under their call",
        ):
            assert count(out, name) == 0, f"{name}\n{shown}"
        # Every kind ran: sessions (closed), limits that parked, tasks, an MCP tool.
        assert count(out, "sessions closed") == count(out, "sessions") > 0, shown
        assert (
            count(out, "metered runs parked on their limit and raised before each later call")
            == count(out, "metered runs")
            > 0
        ), shown
        assert count(out, "task runs started with start_task") > 0, shown
        assert count(out, "task runs owned by an agent (child runs)") > 0, shown
        assert count(out, "MCP writes applied") > 0, shown
        replayed = re.search(
            r"^histories replayed: (\d+), replay failures: (\d+)$", out, re.MULTILINE
        )
        assert replayed is not None, shown
        # Every run and child run, at least: visibility's listing and the chains walked.
        assert int(replayed.group(1)) >= count(out, "runs started"), shown
        assert int(replayed.group(2)) == 0, shown
        assert count(out, "workflow task failures") == 0, shown
