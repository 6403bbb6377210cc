"""`DurablyPlugin`: adopt durably in an existing Temporal client and worker.

To use, pass it to your client; every worker built on that client then
hosts durably too (give it to the worker instead if the client is shared)::

    registry = AgentRegistry([AgentRegistration(support_agent, version="1")])
    client = await Client.connect("localhost:7233", plugins=[DurablyPlugin(registry)])
    worker = Worker(client, task_queue="durably")

It adds `AgentRunWorkflow` and the model/tool activities bound to
`registry`, and makes payloads pydantic's while keeping the client's payload
codec, failure converter and external storage (see `durably._converter`);
given to a worker alone, it does that to the worker's client.
`encryption=EncryptionCodec.from_env()` (`durably.codec`) encrypts payloads.
Pass `transcript_cache=TranscriptCache(...)` (from `durably.activities`) to
size the worker's transcript cache (256 MiB by default; `TranscriptCache(0)`
turns it off), and `approval_keys=` the keys that check signed approvals (by
default from `DURABLY_APPROVAL_KEYS`, see `durably.approvals`). `tracing=True` (or
a `TracerProvider`) traces runs with OpenTelemetry (`durably.telemetry`, the
`otel` extra).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from temporalio.plugin import SimplePlugin
from temporalio.worker import UnsandboxedWorkflowRunner, WorkerConfig

from durably._converter import durable_converter, with_durable_converter
from durably._query_guard import QueryGuardRunner
from durably.activities import AgentActivities, TranscriptCache
from durably.agents import AgentRegistration
from durably.approvals import ApprovalKeys
from durably.codec import EncryptionCodec
from durably.errors import RegistrationError
from durably.registry import AgentRegistry
from durably.workflows import AgentRunWorkflow, AgentSessionWorkflow

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

__all__ = ["DurablyPlugin"]


class DurablyPlugin(SimplePlugin):
    """A Temporal plugin hosting durably's workflow and activities.

    Args:
        registry: The agents the activities serve (a registry, or registrations).
        transcript_cache: The worker-side cache model requests rebuild
            transcripts from; by default a new `TranscriptCache()` (256 MiB).
        approval_keys: The keys signed approvals are checked with; by default
            `ApprovalKeys.from_env()`. Registrations that name `approvers`
            are refused without keys.
        encryption: The codec that encrypts payloads, if any; by default the
            client's own converter decides.
        tracing: Trace runs with OpenTelemetry: True for the global tracer
            provider, or a `TracerProvider` (`durably.telemetry`). Given to a
            client, its workers trace too; a client that already holds
            durably's tracing interceptor needs none here.

    .. versionchanged:: Unreleased
       The `transcript_cache`, `approval_keys` and `encryption` keywords; the
       client's data converter is kept, not replaced.

    .. versionchanged:: Unreleased
       The `tracing` keyword.
    """

    def __init__(
        self,
        registry: AgentRegistry | Iterable[AgentRegistration],
        *,
        transcript_cache: TranscriptCache | None = None,
        approval_keys: ApprovalKeys | None = None,
        encryption: EncryptionCodec | None = None,
        tracing: bool | TracerProvider = False,
    ) -> None:
        self.encryption = encryption
        self.registry = registry if isinstance(registry, AgentRegistry) else AgentRegistry(registry)
        keys = approval_keys if approval_keys is not None else ApprovalKeys.from_env()
        self.check_approval_keys(self.registry.all(), keys)
        self.agent_activities = AgentActivities(
            self.registry, cache=transcript_cache, approval_keys=keys
        )
        interceptors: list[Any] = []
        if tracing is not False:
            from durably.telemetry import tracing_interceptor

            interceptors.append(tracing_interceptor(None if tracing is True else tracing))
        super().__init__(
            "durably.DurablyPlugin",
            data_converter=lambda existing: durable_converter(existing, encryption),
            workflows=[AgentRunWorkflow, AgentSessionWorkflow],
            activities=self.agent_activities.methods(),
            interceptors=interceptors or None,
        )

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        """Also give the worker's client durably's converter (a plugin handed to a
        worker alone never sees that client's configuration), and guard the runner of
        durably's workflows against queries that overtake a workflow task
        (`durably._query_guard`)."""
        config["client"] = with_durable_converter(config["client"], self.encryption, worker=True)
        runner = config.get("unsandboxed_workflow_runner") or UnsandboxedWorkflowRunner()
        if not isinstance(runner, QueryGuardRunner):
            config["unsandboxed_workflow_runner"] = QueryGuardRunner(runner)
        return super().configure_worker(config)

    @staticmethod
    def check_approval_keys(
        registrations: Iterable[AgentRegistration], keys: ApprovalKeys | None
    ) -> None:
        """Refuse registrations whose signed approvals this worker could never check."""
        if keys is not None:
            return
        for r in registrations:
            if isinstance(r, AgentRegistration) and r.approvers:
                raise RegistrationError(
                    f"agent {r.agent_id!r} version {r.version!r} names approvers for "
                    f"{sorted(r.approvers)}, but this worker holds no approval keys to check "
                    "their signed decisions: set DURABLY_APPROVAL_KEYS (or "
                    "DURABLY_APPROVAL_KEYS_FILE), or pass approval_keys=ApprovalKeys(...)"
                )
