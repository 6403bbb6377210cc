"""`DurablyPlugin`: adopt durably in an existing Temporal client and worker.

To use, pass it to your client; every worker built on that client then
hosts durably too (give it to the worker instead if the client is shared)::

    registry = AgentRegistry([AgentRegistration(support_agent, version="1")])
    client = await Client.connect("localhost:7233", plugins=[DurablyPlugin(registry)])
    worker = Worker(client, task_queue="durably")

It adds `AgentRunWorkflow`, the model/tool activities bound to `registry`,
and the pydantic data converter. Pass `transcript_cache=TranscriptCache(...)`
(from `durably.activities`) to size the worker's transcript cache (256 MiB by
default; `TranscriptCache(0)` turns it off).
"""

from __future__ import annotations

from collections.abc import Iterable

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.plugin import SimplePlugin

from durably.activities import AgentActivities, TranscriptCache
from durably.agents import AgentRegistration
from durably.registry import AgentRegistry
from durably.workflows import AgentRunWorkflow

__all__ = ["DurablyPlugin"]


class DurablyPlugin(SimplePlugin):
    """A Temporal plugin hosting durably's workflow and activities.

    Args:
        registry: The agents the activities serve (a registry, or registrations).
        transcript_cache: The worker-side cache model requests rebuild
            transcripts from; by default a new `TranscriptCache()` (256 MiB).

    .. versionchanged:: Unreleased
       The `transcript_cache` keyword.
    """

    def __init__(
        self,
        registry: AgentRegistry | Iterable[AgentRegistration],
        *,
        transcript_cache: TranscriptCache | None = None,
    ) -> None:
        self.registry = registry if isinstance(registry, AgentRegistry) else AgentRegistry(registry)
        self.agent_activities = AgentActivities(self.registry, cache=transcript_cache)
        super().__init__(
            "durably.DurablyPlugin",
            data_converter=pydantic_data_converter,
            workflows=[AgentRunWorkflow],
            activities=self.agent_activities.methods(),
        )
