"""Where user code runs: model requests and tool calls, as activities."""

from durably._transcript import TranscriptCache
from durably.activities._agent_activities import AgentActivities, ErrorType

__all__ = ["AgentActivities", "ErrorType", "TranscriptCache"]
