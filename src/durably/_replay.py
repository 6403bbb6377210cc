"""Replaying histories as a worker that just started would: the check that a run can go on.

A run whose history does not replay is wedged the moment any worker has to
rebuild it (a restart, a deploy, a cache eviction, a query): every workflow task
fails with a nondeterminism error until someone repairs it. Live workers keep
runs in their cache, so a history can be unreplayable long before anything
fails. Soaks and tests therefore replay every history they wrote with a fresh
`Replayer` (no cache) and durably's converter, `durably repair` finds the
first task a wedged run cannot replay, and both read a history's
workflow-task failures by cause from here.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory
from temporalio.converter import DataConverter
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner

from durably.codec import EncryptionCodec, KeylessCodec
from durably.workflows import AgentRunWorkflow, AgentSessionWorkflow

__all__ = [
    "first_unreplayable_task",
    "replay",
    "task_failures",
]


def _replayer(data_converter: DataConverter) -> Replayer:
    """A replayer of durably's workflows, as deployed (outside the sandbox), with no cache,
    and with durably's encryption as a worker's (a forged ciphertext the run refused is
    refused again, not an error)."""
    codec = data_converter.payload_codec
    if isinstance(codec, (EncryptionCodec, KeylessCodec)) and not codec.is_worker:
        data_converter = dataclasses.replace(data_converter, payload_codec=codec.for_worker())
    return Replayer(
        workflows=[AgentRunWorkflow, AgentSessionWorkflow],
        data_converter=data_converter,
        unsandboxed_workflow_runner=UnsandboxedWorkflowRunner(),
    )


async def replay(history: WorkflowHistory, data_converter: DataConverter) -> str | None:
    """Why `history` does not replay (None if it does)."""
    result = await _replayer(data_converter).replay_workflow(history, raise_on_replay_failure=False)
    return None if result.replay_failure is None else str(result.replay_failure)


def task_failures(events: Sequence[HistoryEvent]) -> Counter[str]:
    """The workflow tasks of a history that failed, counted by cause."""
    counts: Counter[str] = Counter()
    for e in events:
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            cause = e.workflow_task_failed_event_attributes.cause
            counts[
                WorkflowTaskFailedCause.Name(cause).removeprefix("WORKFLOW_TASK_FAILED_CAUSE_")
            ] += 1
    return counts


async def first_unreplayable_task(
    history: WorkflowHistory, data_converter: DataConverter
) -> HistoryEvent | None:
    """The `WorkflowTaskCompleted` event of the first task whose commands do not replay,
    or None if the whole history replays.

    Each task is checked by replaying the history up to the next task's start (a
    prefix replays as a run still open would); the first that fails is found by
    bisection, since every prefix past it fails too.
    """
    events = list(history.events)
    completed = [
        i
        for i, e in enumerate(events)
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    ]

    async def replays_through(task: int) -> bool:
        end = next(
            (
                j
                for j in range(completed[task] + 1, len(events))
                if events[j].event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED
            ),
            len(events),
        )
        prefix = WorkflowHistory(history.workflow_id, events[:end])
        return await replay(prefix, data_converter) is None

    if not completed or await replays_through(len(completed) - 1):
        return None
    low, high = 0, len(completed) - 1  # the first failing task is in [low, high]
    while low < high:
        middle = (low + high) // 2
        if await replays_through(middle):
            low = middle + 1
        else:
            high = middle
    return events[completed[low]]
