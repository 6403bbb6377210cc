"""Rebuilding a run's whole transcript from the delta a request carries.

A model request (`ModelCallInput`) and a continued-as-new run's archive
(`TranscriptArchive`) name a transcript by `base_length` (what the previous
request saw), `new` (what was added since, inline or as a `MessageRef` to
an activity's result) and `digest` (of the whole transcript after `new`).
The worker's `TranscriptCache` usually holds the rest; on a miss the
workflow's `transcript` query pages it in, which costs no history.

The digest decides what is used: a transcript that does not match it is
never handed to a model. A mismatch is either a stale attempt (the run
moved on while it waited: `STALE_ATTEMPT`, not retried, as Temporal already
discards its result) or a bug (`TRANSCRIPT_MISMATCH`, retried). A previous
run gone past the namespace's retention cannot be read at all
(`TRANSCRIPT_LOST`, not retried).

Call these only from inside an activity: the query goes through the
activity's client.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from functools import partial
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from durably._query_guard import ask
from durably._transcript.cache import TranscriptCache
from durably._transcript.digest import extend_digest, proves, transcript_digest
from durably.contract import (
    ConversationRef,
    ErrorType,
    Handler,
    MessageRef,
    ModelCallInput,
    OperationKey,
    TranscriptPage,
    TranscriptRestoreRequest,
)
from durably.messages import Message

__all__ = ["conversation", "model_transcript", "rebuild_transcript", "restored_transcript"]

# A model request's worker that misses its cache reads the run by query, heartbeating:
# it asks again when no worker answered in time (one was restarting) rather than
# spending one of the request's attempts.
_PATIENT: dict[str, Any] = {"patient": True, "within": timedelta(minutes=2)}
# A cache miss for a few referenced messages asks for those alone.
_FETCH_ONE_BY_ONE = 4


async def model_transcript(
    cache: TranscriptCache, run_id: str, call: ModelCallInput
) -> list[Message]:
    """The whole transcript a model request is for, as the model will read it."""
    return await rebuild_transcript(
        cache,
        run_id,
        call.key,
        call.base_length,
        call.new,
        call.digest,
        partial(_fetch_transcript, run_id),
        partial(_fetch_message, run_id),
    )


async def conversation(cache: TranscriptCache, ref: ConversationRef) -> tuple[list[Message], str]:
    """The conversation before a session's run and its full digest: from the cache
    (under the session's id), else by the session workflow's `transcript` query,
    proved by `ref.digest`.

    The session appends a run's messages only once that run has closed, so
    while a run asks, the session's conversation is exactly `ref.length` long.
    """
    cached = cache.transcript(ref.session_id, ref.length)
    if cached is not None and proves(cached[1], ref.digest):
        return cached
    messages = (await _fetch_transcript(ref.session_id))[: ref.length]
    digest = transcript_digest(messages)
    if len(messages) != ref.length or not proves(digest, ref.digest):
        raise ApplicationError(
            f"the conversation of session {ref.session_id!r} does not match the digest its "
            "run holds; this is a bug in durably, please report it",
            type=ErrorType.TRANSCRIPT_MISMATCH,
        )
    cache.store(ref.session_id, messages, digest)
    return messages, digest


async def restored_transcript(
    cache: TranscriptCache, run_id: str, request: TranscriptRestoreRequest
) -> list[Message]:
    """The whole transcript a continued-as-new run left in its previous run."""
    archive = request.archive
    return await rebuild_transcript(
        cache,
        run_id,
        str(OperationKey.restore(request.offset)),
        archive.base_length,
        archive.new,
        archive.digest,
        partial(_fetch_transcript, run_id, archive.run_id),
    )


async def rebuild_transcript(
    cache: TranscriptCache,
    run_id: str,
    key: str,
    base_length: int,
    new: list[Message | MessageRef],
    expected_digest: str,
    fetch: Callable[[], Awaitable[list[Message]]],
    fetch_at: Callable[[int], Awaitable[Message]] | None = None,
) -> list[Message]:
    """The full transcript from the cache, or from the workflow (`fetch`) on a miss.

    On a hit only the new messages are hashed onto the cached digest, so a
    turn costs the same at turn 500 as at turn 5. A cache already holding
    the whole transcript (a retried attempt; a restore after the last
    turn ran here) is used as it is. A few referenced messages the cache
    lacks (a person's long answer never passed through this worker) are
    fetched one by one (`fetch_at`); more, or no cached base, fetch all.
    """
    whole = cache.transcript(run_id, base_length + len(new))
    if whole is not None and proves(whole[1], expected_digest):
        return whole[0]
    cached = cache.transcript(run_id, base_length)
    if cached is not None:
        found = [
            cache.output(run_id, item.ref) if isinstance(item, MessageRef) else item for item in new
        ]
        missing = [i for i, m in enumerate(found) if m is None]
        if fetch_at is not None and len(missing) <= _FETCH_ONE_BY_ONE:
            for i in missing:
                found[i] = await fetch_at(base_length + i)
            missing = []
        if not missing:
            messages, digest = cached
            for m in found:
                assert m is not None
                messages.append(m)
                digest = extend_digest(digest, m)
            if proves(digest, expected_digest):
                cache.store(run_id, messages, digest)
                return messages
    messages = await fetch()
    digest = transcript_digest(messages)
    if not proves(digest, expected_digest):
        expected = base_length + len(new)
        if len(messages) > expected and proves(
            transcript_digest(messages[:expected]), expected_digest
        ):
            # The run moved on while this attempt waited: Temporal already
            # discards its result, so say so rather than retry.
            raise ApplicationError(
                f"this attempt of {key} of run {run_id!r} is stale: the run has "
                "moved on since it was scheduled",
                type=ErrorType.STALE_ATTEMPT,
                non_retryable=True,
            )
        raise ApplicationError(
            f"the transcript of run {run_id!r} does not match the digest the workflow "
            "sent; this is a bug in durably, please report it",
            type=ErrorType.TRANSCRIPT_MISMATCH,
        )
    cache.store(run_id, messages, digest)
    return messages


async def _fetch_message(workflow_id: str, position: int) -> Message:
    """One message of the run's transcript, by query."""
    handle = activity.client().get_workflow_handle(workflow_id)
    page = await ask(
        handle, Handler.TRANSCRIPT, position, 1, result_type=TranscriptPage, **_PATIENT
    )
    if not page.messages:
        raise ApplicationError(
            f"run {workflow_id!r} has no message {position} yet; this is a bug in durably, "
            "please report it",
            type=ErrorType.TRANSCRIPT_MISMATCH,
        )
    return page.messages[0]


async def _fetch_transcript(workflow_id: str, temporal_run_id: str | None = None) -> list[Message]:
    """The whole transcript of the run (or of one closed run of its chain), by query."""
    handle = activity.client().get_workflow_handle(workflow_id, run_id=temporal_run_id)
    messages: list[Message] = []
    while True:
        try:
            page = await ask(
                handle, Handler.TRANSCRIPT, len(messages), result_type=TranscriptPage, **_PATIENT
            )
        except RPCError as exc:
            if temporal_run_id is None or exc.status != RPCStatusCode.NOT_FOUND:
                raise
            raise ApplicationError(
                f"run {workflow_id!r} continued as new, but its previous run "
                f"{temporal_run_id!r} is gone (its history outlived the namespace's retention "
                "before this run copied its transcript), so the transcript cannot be restored. "
                "Cancel this run and start a new one.",
                type=ErrorType.TRANSCRIPT_LOST,
                non_retryable=True,
            ) from exc
        messages.extend(page.messages)
        if len(messages) >= page.total or not page.messages:
            return messages
