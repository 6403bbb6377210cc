"""Custom tasks (SPEC section 16): plain durable code, no model, with a run's guarantees.

A task is a typed async function, written as a tool is (`@task` is `@tool`:
one pydantic model argument, or plain parameters, and a `ToolContext`).
`TaskRegistration` registers it as something to run: `client.start_task(id,
input)` starts a run of it, with everything a run has (a run id, snapshot
and statuses, the `operation_id` it sends outward, an approval before it
runs, `needs_attention` and `resolve_tool` when a `manual` task is
interrupted, `retry()`, the inbox, the Web UI, live events), and an agent
owns it as a subagent (`Agent(subagents=["its id"])`) or calls it as a tool.

How it runs (SPEC §10 and §16): a task run is an `AgentRunWorkflow` whose
registration has one tool, the task, and a built-in script for a model: the
first request calls the task with the run's input (JSON of its argument),
the second answers with the task's result. So the one activity with an
effect is the task's tool-call activity (`tool:1:task`), under the task's
recovery policy; the two model requests are the worker's own bookkeeping
(no provider, microseconds), the price of giving a task every guarantee of
a run with no new workflow code.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from durably.agents import Agent, AgentRegistration, ToolRetry
from durably.contract import Recovery
from durably.messages import AssistantMessage, ModelRequest, ModelResponse, ToolCall, Usage
from durably.models import last_tool_results, since_last_user_message
from durably.tools import Tool, tool

__all__ = ["TASK_CALL_ID", "TaskRegistration", "task", "task_input"]

task = tool
"""`@task`: the same decorator as `@tool` (a typed async function with `ToolContext`)."""

# The call id of a task run's one call: its operation is `tool:1:task`.
TASK_CALL_ID = "task"


class _TaskScript:
    """The model of a task run: call the task with the run's input, then answer with its
    result. No provider: what it decides is a function of the request alone."""

    # Its answers are durably's own, not a model's: they count as no request (see
    # `AgentActivities._priced`).
    asks_no_model = True

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def identity(self) -> Mapping[str, Any]:
        return {"kind": "task", "name": self._name}

    async def request(self, request: ModelRequest) -> ModelResponse:
        free = Usage()  # no model was asked: a task run's usage is its own
        if not since_last_user_message(request):
            text = request.messages[-1].content if request.messages else ""
            try:
                arguments = json.loads(str(text or "{}"))
            except ValueError:
                arguments = None
            call = (
                ToolCall(call_id=TASK_CALL_ID, name=self._name, arguments=arguments)
                if isinstance(arguments, dict)
                else ToolCall(
                    call_id=TASK_CALL_ID, name=self._name, arguments={}, raw_arguments=str(text)
                )
            )
            return ModelResponse(message=AssistantMessage(tool_calls=(call,)), usage=free)
        results = last_tool_results(request)
        content = results[-1].content if results else ""
        if results and results[-1].is_error:
            content = f"error: {content}"
        return ModelResponse(message=AssistantMessage(content=content), usage=free)


def TaskRegistration(
    task: Tool[Any],
    *,
    version: str,
    recovery: Recovery = "manual",
    retry: ToolRetry | None = None,
    approvers: Sequence[str] = (),
) -> AgentRegistration:
    """Register `task` to run on its own (`client.start_task(task.name, input)`) and as a
    subagent of agents that name it. Its id is the task's name; `recovery` is its policy
    (`manual` by default, like any tool); `requires_approval` comes from `@task`.

    .. versionadded:: Unreleased
    """
    agent = Agent(
        id=task.name, model=_TaskScript(task.name), instructions="", tools=[task], max_turns=2
    )
    return AgentRegistration(
        agent,
        version=version,
        tool_recovery={task.name: recovery},
        tool_retry=retry or ToolRetry(),
        approvers={task.name: list(approvers)} if approvers else {},
    )


def task_input(value: BaseModel | Mapping[str, Any]) -> str:
    """A task's argument as the run's input text (JSON)."""
    data = value.model_dump(mode="json") if isinstance(value, BaseModel) else dict(value)
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))
