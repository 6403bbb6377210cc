"""A run with tool turns, end to end on a real dev server."""

from __future__ import annotations

import json

from pydantic import BaseModel

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    ModelRequest,
    RunStatus,
    ScriptedModel,
    ToolContext,
    Usage,
    tool,
)
from durably.contract import SA_AGENT, SA_AGENT_VERSION, SA_FINGERPRINT, SA_STATUS
from durably.messages import AssistantMessage, ModelResponse
from durably.models import last_tool_results, tool_call

from .conftest import Runtimes, record_history


class SearchArgs(BaseModel):
    query: str


class SearchResult(BaseModel):
    hits: list[str]


SEEN_OPERATIONS: list[str] = []


@tool
async def search_kb(args: SearchArgs, ctx: ToolContext) -> SearchResult:
    """Search the knowledge base."""
    SEEN_OPERATIONS.append(ctx.operation_id)
    return SearchResult(hits=[f"article about {args.query}"])


def summarise(request: ModelRequest) -> ModelResponse:
    results = last_tool_results(request)
    hits = [json.loads(r.content)["hits"][0] for r in results]
    return ModelResponse(
        message=AssistantMessage(content=f"found: {hits[0]}"),
        usage=Usage(requests=1, input_tokens=30, output_tokens=5),
    )


def two_tool_turns() -> AgentRegistration:
    model = ScriptedModel(
        [
            ModelResponse(
                message=AssistantMessage(tool_calls=(tool_call("search_kb", query="vpn"),)),
                usage=Usage(requests=1, input_tokens=10, output_tokens=3),
            ),
            ModelResponse(
                message=AssistantMessage(
                    tool_calls=(tool_call("search_kb", call_id="c2", query="wifi"),)
                ),
                usage=Usage(requests=1, input_tokens=20, output_tokens=4),
            ),
            summarise,
        ]
    )
    agent = Agent(id="support", model=model, instructions="Help.", tools=[search_kb])
    return AgentRegistration(agent, version="1", tool_recovery={"search_kb": "safe"})


async def test_two_tool_turns_complete_with_snapshot_usage_and_search_attributes(
    client: DurableClient, runtimes: Runtimes
) -> None:
    registration = two_tool_turns()
    await runtimes.start([registration])
    run = await client.start_run("support", "my vpn and wifi are down")

    result = await run.result()

    assert result.output == "found: article about wifi"
    assert result.turns == 3
    assert result.usage == Usage(requests=3, input_tokens=60, output_tokens=12, tool_calls=2)
    snap = await run.snapshot()
    assert snap.status == RunStatus.COMPLETED
    assert (snap.output, snap.interactions) == ("found: article about wifi", [])
    assert snap.agent_version == "1"
    assert snap.usage == result.usage
    types = [(e.type, e.operation) for e in snap.events]
    assert types == [
        ("agent_pinned", None),
        ("model_completed", "model:1"),
        ("tool_completed", "tool:1:call_search_kb"),
        ("model_completed", "model:2"),
        ("tool_completed", "tool:2:c2"),
        ("model_completed", "model:3"),
        ("run_completed", None),
    ]
    desc = await client.temporal.get_workflow_handle(run.run_id).describe()
    sa = desc.typed_search_attributes
    assert (sa.get(SA_STATUS), sa.get(SA_AGENT), sa.get(SA_AGENT_VERSION)) == (
        "completed",
        "support",
        "1",
    )
    assert sa.get(SA_FINGERPRINT) == registration.pin_check
    assert await desc.static_summary() == "support: my vpn and wifi are down"
    history = await client.temporal.get_workflow_handle(run.run_id).fetch_history()
    shown = [
        (
            e.activity_task_scheduled_event_attributes.activity_id or None,
            json.loads(e.user_metadata.summary.data)
            if e.user_metadata.HasField("summary")
            else None,
        )
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
        or (e.HasField("marker_recorded_event_attributes") and e.user_metadata.HasField("summary"))
    ]
    # The pin is a local activity in the run's first workflow task (a marker); a model
    # request's activity id says what it is, a tool call's summary names the tool.
    assert shown == [
        (None, "pin agent support"),
        ("model:1", None),
        ("tool:1:call_search_kb", "tool search_kb"),
        ("model:2", None),
        ("tool:2:c2", "tool search_kb"),
        ("model:3", None),
    ]
    assert snap.current == "Completed after 3 turn(s)"
    # {run id}/{the chain's first execution run id}/{checkpoint key}
    chain = desc.run_id
    assert f"{run.run_id}/{chain}/tool:1:call_search_kb" in SEEN_OPERATIONS
    assert f"{run.run_id}/{chain}/tool:2:c2" in SEEN_OPERATIONS
    await record_history(client, run.run_id, "completed_two_tool_turns")
