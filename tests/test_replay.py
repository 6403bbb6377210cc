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

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def test_histories_are_recorded() -> None:
    """The replay test below has something to replay."""
    assert len(HISTORIES) >= 5, [p.name for p in HISTORIES]


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_recorded_history_replays(path: Path) -> None:
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    replayer = Replayer(workflows=[AgentRunWorkflow], data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)
