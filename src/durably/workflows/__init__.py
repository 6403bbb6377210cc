"""Deterministic orchestration only: no I/O, no clocks but `workflow.now()`."""

from durably.workflows.agent_run import AgentRunWorkflow

__all__ = ["AgentRunWorkflow"]
