"""What operators call: start runs, find them, read and steer them."""

from durably.client._client import DurableClient
from durably.client._connect import connect_temporal
from durably.client._handle import RunHandle
from durably.client._session import SessionHandle
from durably.client._versions import NeededVersion

__all__ = ["DurableClient", "NeededVersion", "RunHandle", "SessionHandle", "connect_temporal"]
