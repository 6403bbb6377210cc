"""A workflow runner that never answers a query ahead of the workflow task it would overtake.

The failure it prevents (the "query race", `docs/design.md`): a query sent while
a run is idle reaches the server's matching service as a *legacy query task*. If
a worker that does not hold the run in its cache (it just started, or evicted the
run) takes that query after new events were written (a tool's heartbeat timed out,
a timer fired), Temporal's Core SDK rebuilds the run from the full history and
applies those new events, the start of a workflow task that has not started yet,
in an activation of their own, answers the query, and keeps the activation's
commands for the task. That task then arrives with only what came after (an
update, a signal), which workflow code handles in an activation of its own. On
replay the whole task is one activation, where updates and signals run first
(updates without their validator): an update accepted that way becomes the
task's first command, a signal sees the run before the events it came after,
and the history no longer replays. The run fails every workflow task from then
on (`TMPRL1100`), for good.

The guard notices the early activation and refuses the legacy query that
follows it. Core stamps an activation with the start of the workflow task it
belongs to, so one applied for a query on a run the worker holds has a
timestamp that did not move. On a run the worker rebuilt for the query, the
history may end with a workflow task another worker started (and that later
times out): Core stamps the early activation with that task's start, which
does move. Nothing in an activation tells it from one of a task this worker
holds, so an instance refuses its first legacy query whenever it has applied
live events before answering any: each instance a workflow task built (a new
run, a run the worker did not hold) costs one refused query and one rebuild
once it is queried; the instance the query itself rebuilds from an idle run's
history applies nothing live and answers from then on. A closed run can hold
events no task will take, which every rebuild applies live: a query that finds
a run at the history length it was refused at is answered (`_Refusals`).

A refused legacy query makes Core evict the run with the early activation's
commands unsent, so the next workflow task replays
the whole history and applies its events together, exactly as any later replay
will. The query fails once with `REFUSED` in its message; durably's client asks
again. Only the activation's bookkeeping is read; what runs inside it is the
wrapped runner's.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import structlog
from temporalio import workflow
from temporalio.api.errordetails.v1 import QueryFailedFailure
from temporalio.bridge.proto.workflow_activation import (
    WorkflowActivation,
    WorkflowActivationJob,
)
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.client import WorkflowHandle, WorkflowQueryFailedError
from temporalio.converter import SerializationContext, StorageDriverStoreContext
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails, WorkflowRunner

from durably.errors import DurablyError

if TYPE_CHECKING:
    from temporalio.worker._command_aware_visitor import CommandInfo

__all__ = ["REFUSED", "QueryGuardRunner", "ask"]

_log = structlog.get_logger("durably.worker")

T = TypeVar("T")
# What a refused query's failure message starts with (durably's client asks again).
REFUSED = "durably refused this query for a moment"
# Its failure's type, which a payload codec leaves readable when it encodes the message.
_REFUSED_TYPE = "DurablyQueryRefused"
# How a query fails when no worker answered it in time (asked again if patient).
_UNANSWERED = (
    RPCStatusCode.CANCELLED,
    RPCStatusCode.DEADLINE_EXCEEDED,
    RPCStatusCode.UNAVAILABLE,
    # "Unable to query workflow due to Workflow Task in failed state": the run's workflow
    # task is on a second attempt (its worker died holding it, or it timed out), and
    # the server answers no query until a worker completes it.
    RPCStatusCode.FAILED_PRECONDITION,
)
# The id Temporal gives a query delivered as a task of its own.
_LEGACY_QUERY_ID = "legacy_query"
_MESSAGE = (
    f"{REFUSED}: this worker had to apply events of the run's next workflow task before "
    "that task started, which Temporal replays differently (see durably's design notes, "
    "'The query race'); it has let go of the run. Ask again: the answer comes once the "
    "task has run."
)


class QueryGuardRunner(WorkflowRunner):
    """Wraps a runner so that its instances refuse queries that would overtake a task."""

    def __init__(self, inner: WorkflowRunner) -> None:
        self.inner = inner
        self.refusals = _Refusals()

    def prepare_workflow(self, defn: workflow._Definition) -> None:
        self.inner.prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _GuardedInstance(self.inner.create_instance(det), self.refusals)

    def set_worker_level_failure_exception_types(
        self, types: Sequence[type[BaseException]]
    ) -> None:
        self.inner.set_worker_level_failure_exception_types(types)


class _Refusals:
    """Which history length each run was last refused at, on this worker.

    A legacy query that finds a run at the length it was refused at comes after no
    workflow task: an open run with events no task has taken has one pending, and
    the server then holds its queries for that task. So the run is closed (say,
    terminated with a timeout no task took), nothing can overtake, and the query
    is answered: refusing it would refuse every query of that run for good.
    """

    _MOST = 4096  # runs remembered; the oldest are forgotten first

    def __init__(self) -> None:
        self._lengths: dict[str, int] = {}
        self._lock = threading.Lock()

    def again(self, run_id: str, length: int) -> bool:
        """Whether the run was refused at this length (forgotten then); else remember it."""
        with self._lock:
            if self._lengths.pop(run_id, None) == length:
                return True
            self._lengths[run_id] = length
            if len(self._lengths) > self._MOST:
                del self._lengths[next(iter(self._lengths))]
            return False


class _GuardedInstance(WorkflowInstance):
    def __init__(self, inner: WorkflowInstance, refusals: _Refusals) -> None:
        self.inner = inner
        self._refusals = refusals
        self._stamp: int | None = None  # the previous activation's timestamp
        self._early = False  # that activation applied events outside a task of their own
        self._live = False  # some activation applied events live (not replaying)
        self._answered = False  # a legacy query was answered

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        kinds = [job.WhichOneof("variant") for job in act.jobs]
        if kinds and all(kind == "query_workflow" for kind in kinds):
            legacy = any(job.query_workflow.query_id == _LEGACY_QUERY_ID for job in act.jobs)
            early = self._early or (self._live and not self._answered)
            if legacy and early and not self._refusals.again(act.run_id, act.history_length):
                info = self.inner.get_info()
                _log.info(
                    "query refused: it came ahead of the run's next workflow task",
                    run_id=info.workflow_id,
                    temporal_run_id=info.run_id,
                )
                return _refused(act)
            self._answered = self._answered or legacy
            return self.inner.activate(act)
        if "remove_from_cache" not in kinds:
            stamp = act.timestamp.ToNanoseconds()
            # A local activity resolves within its own task, under its task's timestamp.
            if any(not _local_resolution(job) for job in act.jobs) and not act.is_replaying:
                self._early = stamp == self._stamp
                self._live = True
            elif stamp != self._stamp:
                self._early = False
            self._stamp = stamp
        return self.inner.activate(act)

    def get_serialization_context(
        self, command_info: CommandInfo | None
    ) -> SerializationContext | None:
        return self.inner.get_serialization_context(command_info)

    def get_external_store_context(
        self, command_info: CommandInfo | None
    ) -> StorageDriverStoreContext:
        return self.inner.get_external_store_context(command_info)

    def get_info(self) -> workflow.Info:
        return self.inner.get_info()

    def get_thread_id(self) -> int | None:
        return self.inner.get_thread_id()


def _local_resolution(job: WorkflowActivationJob) -> bool:
    return job.WhichOneof("variant") == "resolve_activity" and job.resolve_activity.is_local


def _refused(act: WorkflowActivation) -> WorkflowActivationCompletion:
    """A failed completion: Core fails the legacy query and evicts the run."""
    completion = WorkflowActivationCompletion(run_id=act.run_id)
    completion.failed.failure.message = _MESSAGE
    completion.failed.failure.application_failure_info.type = _REFUSED_TYPE
    return completion


async def ask(
    handle: WorkflowHandle[Any, Any],
    query: str,
    *args: Any,
    result_type: type[T],
    rpc_timeout: timedelta | None = None,
    within: timedelta = timedelta(seconds=30),
    patient: bool = False,
) -> T:
    """A query of durably's, asked again while a worker's guard refuses it.

    A refusal lasts until the run's next workflow task has run: the dead worker's
    sticky queue lets go of it within `durably.worker.STICKY_TIMEOUT`. A `patient`
    caller (an activity that needs the answer, and heartbeats meanwhile) also asks
    again when no worker answered in time (the run's worker died, or the machine is
    too loaded to answer within the RPC's deadline) or the run's workflow task is
    being retried, up to `within`.
    """
    delay = 0.05
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within.total_seconds()
    while True:
        try:
            answer: T = await handle.query(
                query, args=args, result_type=result_type, rpc_timeout=rpc_timeout
            )
            return answer
        except WorkflowQueryFailedError as err:
            if not refused(err) or loop.time() >= deadline:
                raise
        except RPCError as err:
            if not (patient and err.status in _UNANSWERED) or loop.time() >= deadline:
                raise
        except KeyError as err:  # the converter meets a payload it has no codec for
            if "binary/encrypted" not in str(err):
                raise
            raise DurablyError(
                f"run {handle.id!r} answers with encrypted payloads, and this client has no "
                "key to read them: connect with the workers' keys "
                "(`DurableClient.connect(encryption=EncryptionCodec.from_env())`, or "
                "DURABLY_ENCRYPTION_KEYS for the `durably` commands)"
            ) from None
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)


def refused(err: WorkflowQueryFailedError) -> bool:
    """Whether a worker's guard refused the query (ask again), encrypted or not."""
    if REFUSED in err.message:
        return True
    cause = err.__context__
    details = getattr(getattr(cause, "grpc_status", None), "details", ())
    for detail in details:
        failed = QueryFailedFailure()
        if detail.Unpack(failed) and failed.HasField("failure"):
            return failed.failure.application_failure_info.type == _REFUSED_TYPE
    return False
