"""Adopting durably in an existing Temporal setup: the plugin and standard config."""

from __future__ import annotations

import uuid

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    DurableRuntime,
    DurablyPlugin,
    ScriptedModel,
)


def greeter() -> AgentRegistration:
    agent = Agent(id="greeter", model=ScriptedModel(["hello"]), instructions="Greet.")
    return AgentRegistration(agent, version="1")


async def test_the_plugin_adds_durably_to_a_plain_client_and_worker(
    env: WorkflowEnvironment,
) -> None:
    """A Temporal worker built the usual way hosts durably runs through the plugin."""
    plugin = DurablyPlugin([greeter()])
    target = env.client.service_client.config.target_host
    temporal = await Client.connect(target, plugins=[plugin])
    task_queue = f"plugin-{uuid.uuid4().hex[:8]}"

    # A plugin given to the client also configures every worker built on it.
    async with Worker(temporal, task_queue=task_queue):
        client = DurableClient(temporal, task_queue=task_queue)
        run = await client.start_run("greeter", "hi")
        result = await run.result()

    assert result.output == "hello"


async def test_connect_reads_the_standard_temporal_environment(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TEMPORAL_ADDRESS / TEMPORAL_NAMESPACE work as for every Temporal tool."""
    monkeypatch.setenv("TEMPORAL_ADDRESS", env.client.service_client.config.target_host)
    monkeypatch.setenv("TEMPORAL_NAMESPACE", "default")

    client = await DurableClient.connect(task_queue="env-config")

    assert client.temporal.namespace == "default"
    assert await client.list_runs(agent_id=f"nobody-{uuid.uuid4().hex}") == []


async def test_a_runtime_refuses_a_task_queue_its_client_contradicts(
    env: WorkflowEnvironment,
) -> None:
    client = DurableClient(env.client, task_queue="queue-a")
    with pytest.raises(ValueError, match="differs from the given client's task queue 'queue-a'"):
        await DurableRuntime.open(client=client, task_queue="queue-b")
    runtime = await DurableRuntime.open(client=client)
    assert runtime.client.task_queue == "queue-a"
