"""What outside callers send a running run (updates and signals), as the run reads it.

The failure this prevents: a rejection raised as anything but an
`ApplicationError` fails the workflow task (an update handler's, forever),
and a signal payload the SDK cannot decode is dropped with only a worker log
line. Here every refusal becomes the `ApplicationError` whose type the
client maps back to a durably error, and a signal is decoded by the run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from durably.codec import undecryptable
    from durably.contract import ErrorType, Handler
    from durably.workflows._validation import Rejected, rejection, short

__all__ = ["decode_signal", "refusals"]


@contextmanager
def refusals() -> Iterator[None]:
    """A rejection, as the `ApplicationError` the client maps back to a durably error."""
    try:
        yield
    except Rejected as err:
        raise ApplicationError(err.message, type=err.kind.value, non_retryable=True) from None


def decode_signal(raw: RawValue) -> Any:
    """A signal's payload, or a rejection saying why it could not be read (a payload
    the worker could not decrypt arrives as `durably.codec.UNDECRYPTABLE`)."""
    # Refused alike live and on replay, whatever the key id: a forged payload naming a
    # key nobody holds is refused by every worker, and a replay never waits for a key
    # that will never come. (A payload a worker with its key accepted, replayed by one
    # without, fails that replay's task until a worker with the key takes the run.)
    sealed = undecryptable(raw.payload)
    if sealed is not None:
        raise rejection(
            ErrorType.INVALID_RESPONSE,
            f"its payload could not be decrypted: {short(str(sealed), 300)}. Send it with a "
            "client that holds the workers' encryption keys",
        )
    try:
        return workflow.payload_converter().from_payload(raw.payload)
    except Exception as err:
        encoding = raw.payload.metadata.get("encoding", b"").decode(errors="replace")
        raise rejection(
            ErrorType.INVALID_RESPONSE,
            f"{Handler.RESPOND_SIGNAL.value} takes a JSON RespondRequest object; its payload "
            f"could not be decoded (encoding {short(encoding, 60)}: {short(str(err), 200)})",
        ) from None
