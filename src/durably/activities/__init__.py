"""Where user code runs: model requests and tool calls, as activities."""

from durably.activities._agent_activities import AgentActivities, ErrorType
from durably.activities._transcript_cache import TranscriptCache

__all__ = ["AgentActivities", "ErrorType", "TranscriptCache"]
