"""The chained digest that lets a worker prove its cached transcript is the run's.

The workflow and the model activity compute the same chain: `digest(n+1) =
sha256(digest(n) + json(message n))`. Both sides must use this one function.
"""

from __future__ import annotations

import hashlib

from pydantic import TypeAdapter

from durably.messages import Message

__all__ = ["EMPTY_DIGEST", "extend_digest"]

EMPTY_DIGEST = hashlib.sha256(b"durably-transcript-v1").hexdigest()
_MESSAGE = TypeAdapter[Message](Message)


def extend_digest(digest: str, message: Message) -> str:
    """The digest of a transcript after appending `message`."""
    h = hashlib.sha256(digest.encode())
    h.update(_MESSAGE.dump_json(message))
    return h.hexdigest()
