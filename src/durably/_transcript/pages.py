"""Paging a transcript into payloads that stay under Temporal's 2 MB limit.

Query results and activity results are single payloads: the server
rejects one over 2 MB and logs a warning for one over 512 KiB. A page
holds at least one message (every message already fit in a payload once)
and otherwise stops before `PAGE_BYTES`, under the warning.
"""

from __future__ import annotations

from collections.abc import Sequence

from durably._transcript.digest import encoded_size
from durably.contract import TranscriptPage
from durably.messages import Message

__all__ = ["PAGE_BYTES", "transcript_page"]

PAGE_BYTES = 480 * 2**10


def transcript_page(
    messages: Sequence[Message], offset: int, limit: int | None = None
) -> TranscriptPage:
    """The messages from `offset` that fit in one page (at most `limit` of them)."""
    if not isinstance(offset, int) or not 0 <= offset <= len(messages):
        raise ValueError(
            f"offset must be a whole number from 0 to {len(messages)} (the transcript's "
            f"length), got {offset!r}"
        )
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a whole number of at least 1, got {limit!r}")
    stop = len(messages) if limit is None else min(len(messages), offset + limit)
    end = offset
    size = 0
    while end < stop:
        size += encoded_size(messages[end])
        if size > PAGE_BYTES and end > offset:
            break
        end += 1
    return TranscriptPage(offset=offset, messages=list(messages[offset:end]), total=len(messages))
