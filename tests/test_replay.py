"""Recorded histories replay against the current workflow code.

Each file in `tests/histories/*/` is a run recorded by an earlier release
(`DURABLY_RECORD_HISTORIES=1 pytest`). A workflow change that would break
those runs in production fails here: guard it with `workflow.patched()`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from durably.contract import SA_SESSION
from durably.workflows import AgentRunWorkflow, AgentSessionWorkflow

_ROOT = Path(__file__).parent / "histories"
# By folder: `0.1.0/` was recorded by that release, `<patch id>/` by the code
# that introduced the patch.
HISTORIES = {f"{p.parent.name}/{p.stem}": p.read_text() for p in sorted(_ROOT.glob("*/*.json"))}


def recorded_id(name: str) -> str:
    """The workflow id a history ran under, where the workflow's commands depend on it (a
    session names its runs after itself, and publishes its id as `DurablySession`; a
    parent names its subagent runs `{its id}/{first run}/{call}`); else the history's
    name."""
    history = WorkflowHistory.from_json(name, HISTORIES[name])
    for event in history.events:
        if event.HasField("start_child_workflow_execution_initiated_event_attributes"):
            child = event.start_child_workflow_execution_initiated_event_attributes.workflow_id
            if child.count("/") >= 2:  # a subagent run, named after its parent
                return child.rsplit("/", 2)[0]
    started = history.events[0].workflow_execution_started_event_attributes
    session = started.search_attributes.indexed_fields.get(SA_SESSION.name)
    if session is None:
        return name
    value = json.loads(session.data)
    return str(value[0] if isinstance(value, list) else value)


def test_histories_are_recorded() -> None:
    """The replay test below has something to replay."""
    assert len(HISTORIES) >= 5, sorted(HISTORIES)


@pytest.mark.parametrize("sandboxed", [False, True], ids=["as-deployed", "in-sandbox"])
@pytest.mark.parametrize("name", sorted(HISTORIES))
async def test_recorded_history_replays(name: str, sandboxed: bool) -> None:
    """Each history replays as workers run it (unsandboxed), and inside Temporal's sandbox.

    The sandbox pass is what catches workflow code that reaches for a clock,
    randomness or I/O: the workflow skips the sandbox in production only
    because re-importing it for every run cost a quarter of each workflow task.
    """
    history = WorkflowHistory.from_json(recorded_id(name), HISTORIES[name])
    runner = SandboxedWorkflowRunner() if sandboxed else UnsandboxedWorkflowRunner()
    replayer = Replayer(
        workflows=[AgentRunWorkflow, AgentSessionWorkflow],
        data_converter=pydantic_data_converter,
        unsandboxed_workflow_runner=runner,
    )
    await replayer.replay_workflow(history)


async def test_a_clock_read_in_the_workflow_fails_the_sandboxed_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sandbox pass above can fail: a wall-clock read in the workflow module is caught."""
    leaky_module = _leaky_workflow_module(tmp_path, monkeypatch)
    name = "0.1.0/completed_two_tool_turns"
    history = WorkflowHistory.from_json(recorded_id(name), HISTORIES[name])

    unsandboxed = Replayer(
        workflows=[leaky_module.AgentRunWorkflow], data_converter=pydantic_data_converter
    )
    await unsandboxed.replay_workflow(history)  # nothing stops it here
    sandboxed = Replayer(
        workflows=[leaky_module.AgentRunWorkflow],
        data_converter=pydantic_data_converter,
        unsandboxed_workflow_runner=SandboxedWorkflowRunner(),
    )
    with pytest.raises(Exception, match="datetime"):
        await sandboxed.replay_workflow(history)


def _leaky_workflow_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A copy of the workflow module that reads the wall clock in its first task."""
    import importlib

    import durably.workflows.agent_run as module

    source = Path(module.__file__).read_text()
    clean = "    return workflow.info().typed_search_attributes.get(key)\n"
    assert clean in source
    leaky = "    datetime.now()\n" + clean
    (tmp_path / "leaky_agent_run.py").write_text(source.replace(clean, leaky))
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module("leaky_agent_run")
