"""`DurablyPlugin`: adopt durably in an existing Temporal client and worker.

To use, pass it to your client; every worker built on that client then
hosts durably too (give it to the worker instead if the client is shared)::

    registry = AgentRegistry([AgentRegistration(support_agent, version="1")])
    client = await Client.connect("localhost:7233", plugins=[DurablyPlugin(registry)])
    worker = Worker(client, task_queue="durably")

It adds `AgentRunWorkflow`, the model/tool activities bound to `registry`,
and the pydantic data converter.
"""

from __future__ import annotations

from collections.abc import Iterable

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.plugin import SimplePlugin

from durably.activities import AgentActivities
from durably.agents import AgentRegistration
from durably.registry import AgentRegistry
from durably.workflows import AgentRunWorkflow

__all__ = ["DurablyPlugin"]


class DurablyPlugin(SimplePlugin):
    """A Temporal plugin hosting durably's workflow and activities."""

    def __init__(self, registry: AgentRegistry | Iterable[AgentRegistration]) -> None:
        self.registry = registry if isinstance(registry, AgentRegistry) else AgentRegistry(registry)
        self.agent_activities = AgentActivities(self.registry)
        super().__init__(
            "durably.DurablyPlugin",
            data_converter=pydantic_data_converter,
            workflows=[AgentRunWorkflow],
            activities=self.agent_activities.methods(),
        )
