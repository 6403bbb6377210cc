"""Recorded histories replay against the current workflow code.

Each file in `tests/histories/` is a run recorded by an earlier release
(`DURABLY_RECORD_HISTORIES=1 pytest`). A workflow change that would break
those runs in production fails here: guard it with `workflow.patched()`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from durably.workflows import AgentRunWorkflow

HISTORIES = {
    p.stem: p.read_text() for p in sorted((Path(__file__).parent / "histories").glob("*.json"))
}


def test_histories_are_recorded() -> None:
    """The replay test below has something to replay."""
    assert len(HISTORIES) >= 5, sorted(HISTORIES)


@pytest.mark.parametrize("name", sorted(HISTORIES))
async def test_recorded_history_replays(name: str) -> None:
    history = WorkflowHistory.from_json(name, HISTORIES[name])
    replayer = Replayer(workflows=[AgentRunWorkflow], data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)
