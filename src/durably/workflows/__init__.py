"""Deterministic orchestration only: no I/O, no clocks but `workflow.now()`."""

from durably.workflows.agent_run import AgentRunWorkflow
from durably.workflows.agent_session import AgentSessionWorkflow

__all__ = ["AgentRunWorkflow", "AgentSessionWorkflow"]
