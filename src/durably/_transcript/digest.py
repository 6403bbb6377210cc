"""The transcript digest: proof that a rebuilt transcript is the run's own.

`digest(n+1) = sha256(digest(n) + json(message n))`, starting from
`EMPTY_DIGEST`. The workflow and the model activity compute it with these
functions, and it travels in history (`ModelCallInput.digest`,
`TranscriptArchive.digest`), so a change to the encoding here breaks every
run in flight: the JSON is written by alias explicitly (a call's id is
`"id"` on the wire), whatever a model's configuration says. `encoded_size`
reads the same JSON: it is what a message
costs in a payload, in the cache and in a page.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from pydantic import TypeAdapter

from durably.messages import Message

__all__ = [
    "EMPTY_DIGEST",
    "SHORT_DIGEST",
    "encoded_size",
    "extend_digest",
    "proves",
    "transcript_digest",
]

EMPTY_DIGEST = hashlib.sha256(b"durably-transcript-v1").hexdigest()
_MESSAGE = TypeAdapter[Message](Message)
# Hex digits of the digest a model request carries (128 bits), in runs under the
# seed-fidelity patch; earlier runs send all 64.
SHORT_DIGEST = 32


def extend_digest(digest: str, message: Message) -> str:
    """The digest of a transcript after appending `message`."""
    h = hashlib.sha256(digest.encode())
    h.update(_MESSAGE.dump_json(message, by_alias=True))
    return h.hexdigest()


def transcript_digest(messages: Sequence[Message]) -> str:
    """The digest of the whole of `messages`, from `EMPTY_DIGEST`."""
    digest = EMPTY_DIGEST
    for m in messages:
        digest = extend_digest(digest, m)
    return digest


def encoded_size(message: Message) -> int:
    """The bytes `message` takes in a payload (its JSON, as the digest reads it)."""
    return len(_MESSAGE.dump_json(message, by_alias=True))


def proves(digest: str, sent: str) -> bool:
    """Whether the workflow's `sent` digest (whole, or its first `SHORT_DIGEST` hex
    digits) is that of the transcript whose full digest is `digest`."""
    return len(sent) >= SHORT_DIGEST and digest[: len(sent)] == sent
