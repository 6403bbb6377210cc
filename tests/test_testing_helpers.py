"""`durably.testing` lets users test their own agents the way durably tests itself."""

from __future__ import annotations

from pydantic import BaseModel
from temporalio.testing import WorkflowEnvironment

from durably import Agent, AgentRegistration, ToolContext, tool
from durably.testing import ScriptedModel, capture_logs, local_runtime, tool_call


class Order(BaseModel):
    order: str


@tool
async def look_up(args: Order, ctx: ToolContext) -> str:
    """Look up an order."""
    ctx.logger.info("looked up", order=args.order)
    return f"{args.order}: shipped"


async def test_local_runtime_runs_an_agent_and_captures_tool_logs(env: WorkflowEnvironment) -> None:
    agent = Agent(
        id="orders",
        model=ScriptedModel([tool_call("look_up", order="A-1"), "it shipped"]),
        instructions="",
        tools=[look_up],
    )
    with capture_logs() as logs:
        async with local_runtime([AgentRegistration(agent, version="1")], env=env) as runtime:
            run = await runtime.client.start_run("orders", "where is A-1?")
            result = await run.result()

    assert result.output == "it shipped"
    entry = next(e for e in logs if e["event"] == "looked up")
    assert entry["order"] == "A-1"
    first_run = (await env.client.get_workflow_handle(run.run_id).describe()).run_id
    assert entry["operation_id"] == f"{run.run_id}/{first_run}/tool:1:call_look_up"
