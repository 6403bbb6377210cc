"""Fuzzing the doors the second hardening pass closed, with hypothesis, on the dev server.

Forged ciphertexts (any key id, cipher and length, up to Temporal's payload
limit) sent to an encrypted run as signals and updates; updates padded with
fields the run does not read, at any depth and near the limits; session
submissions of sizes near the bounds while a run is open. Each must be refused
or recorded as rejected, never fail a workflow task, never end the run, and
never lose what was accepted. The harness is `test_fuzz`'s (`check`).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from hypothesis import strategies as st
from temporalio.api.common.v1 import Payload
from temporalio.client import WorkflowUpdateFailedError
from temporalio.common import RawValue
from temporalio.testing import WorkflowEnvironment

from durably import DurableClient, DurableConflictError, DurableRuntime, RunStatus
from durably.codec import ENCODING, EncryptionCodec, EncryptionKeys
from durably.workflows._session_machine import MAX_QUEUED_BYTES

from .conftest import Runtimes, asker, eventually, failed_tasks, wait_for_status
from .test_fuzz import check

KEY = os.urandom(32)
MAX_PAYLOAD = 2 * 2**20 - 64 * 2**10  # under Temporal's 2 MiB, with room for the metadata


def forged_payloads() -> st.SearchStrategy[RawValue]:
    """What a caller without the key can send: `binary/encrypted` with any key id (held,
    unknown, empty, odd bytes), any cipher name, and any bytes of any length."""
    key_ids = st.one_of(st.just(b"a"), st.binary(max_size=60))
    ciphers = st.one_of(st.sampled_from([b"aes256gcm", b"aes256gcm+zlib"]), st.binary(max_size=30))
    sizes = st.one_of(
        st.integers(0, 64), st.integers(64, 4096), st.integers(MAX_PAYLOAD - 100, MAX_PAYLOAD)
    )
    return st.builds(
        lambda kid, cipher, size: RawValue(
            Payload(
                metadata={"encoding": ENCODING, "encryption-key-id": kid, "durably-cipher": cipher},
                data=os.urandom(size),
            )
        ),
        key_ids,
        ciphers,
        sizes,
    )


async def test_forged_ciphertexts_are_refused_and_never_fail_a_task(
    env: WorkflowEnvironment, task_queue: str
) -> None:
    client = DurableClient(
        env.client, task_queue=task_queue, encryption=EncryptionCodec(EncryptionKeys({"a": KEY}))
    )
    async with await DurableRuntime.open(client=client, agents=[asker()]) as runtime:
        await runtime.resume()
        run = await client.start_run("asker", "where?")
        waiting = await wait_for_status(run, RunStatus.WAITING)
        raw = env.client.get_workflow_handle(run.run_id)  # no codec, no key

        async def prop(payload: RawValue, as_update: bool) -> None:
            if as_update:
                with pytest.raises(WorkflowUpdateFailedError):
                    await asyncio.wait_for(raw.execute_update("respond", payload), 20)
            else:
                await raw.signal("respond_signal", payload)
            snap = await run.snapshot()
            assert snap.status == RunStatus.WAITING
            assert snap.interaction == waiting.interaction

        await check(prop, forged_payloads(), st.booleans(), max_examples=25, shrink=False)
        histories = [await client.temporal.get_workflow_handle(run.run_id).fetch_history()]
        assert failed_tasks(histories) == []
        assert waiting.interaction is not None
        await run.answer(waiting.interaction.id, "order 7")  # the run goes on
        assert "order 7" in ((await run.result()).output or "")


def paddings() -> st.SearchStrategy[tuple[str, str, bool]]:
    """An unknown field's name, text past what an update may carry beyond its own, and
    whether it goes inside the request's nested object (a response, the limits)."""
    names = st.text(st.characters(categories=["Ll"]), min_size=1, max_size=12).filter(
        lambda n: n not in ("type", "answer", "approved", "reason", "args_digest", "tool_calls")
    )
    junk = st.integers(4 * 2**10 + 200, 1_500_000).map(lambda n: "j" * n)
    return st.tuples(names, junk, st.booleans())


def padded(update: str, interaction_id: str, padding: tuple[str, str, bool]) -> dict[str, Any]:
    """A valid `update` request with `padding` at its top or inside its nested object."""
    name, text, inside = padding
    request: dict[str, Any]
    if update == "respond":
        request = {
            "interaction_id": interaction_id,
            "response": {"type": "question", "answer": "7"},
        }
        nested = "response"
    else:
        request, nested = {"limits": {"tool_calls": 5}}, "limits"
    if inside:
        return {**request, nested: {**request[nested], name: text}}
    return {**request, name: text}


async def test_updates_padded_with_unknown_fields_are_refused_before_history(
    client: DurableClient, runtimes: Runtimes
) -> None:
    await runtimes.start([asker()])
    run = await client.start_run("asker", "where?")
    waiting = await wait_for_status(run, RunStatus.WAITING)
    assert waiting.interaction is not None
    raw = client.temporal.get_workflow_handle(run.run_id)

    async def prop(padding: tuple[str, str, bool], update: str) -> None:
        assert waiting.interaction is not None
        request = padded(update, waiting.interaction.id, padding)
        before = len((await raw.fetch_history()).events)
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await asyncio.wait_for(raw.execute_update(update, request), 20)
        why = str(refused.value.cause)  # limits forbid unknown fields of their own
        assert "does not have" in why or "Extra inputs are not permitted" in why, why[:300]
        assert len((await raw.fetch_history()).events) == before

    updates = st.sampled_from(["respond", "raise_limits"])
    await check(prop, paddings(), updates, max_examples=15, shrink=False)
    assert (await run.snapshot()).status == RunStatus.WAITING
    await run.answer(waiting.interaction.id, "order 7")
    assert "order 7" in ((await run.result()).output or "")


async def test_session_submissions_near_the_bounds_lose_nothing_accepted(
    client: DurableClient, runtimes: Runtimes
) -> None:
    """Submissions of sizes near a run's input limit, queued behind a waiting run: those
    a session takes run, in order; those past what it carries are refused, recording
    nothing; no workflow task fails."""
    await runtimes.start([asker()])
    session = await client.start_session("asker")
    first = await session.submit("where is my order?")
    waiting = await wait_for_status(first, RunStatus.WAITING)
    accepted: list[int] = []

    async def prop(size: int) -> None:
        queued = sum(accepted)
        try:
            await session.submit("q" * size, if_busy="enqueue")
        except DurableConflictError as err:
            assert queued + size > MAX_QUEUED_BYTES, str(err)
            assert "queued submissions" in str(err)
            return
        assert queued + size <= MAX_QUEUED_BYTES
        accepted.append(size)

    sizes = st.one_of(st.integers(1, 2_000), st.integers(400_000, 2**20))
    await check(prop, sizes, max_examples=12, shrink=False)
    runs = (await session.snapshot()).runs
    assert [r.status for r in runs] == ["open"] + ["queued"] * len(accepted)
    assert waiting.interaction is not None
    await first.answer(waiting.interaction.id, "order 7")
    for i, run in enumerate(runs[1:], start=1):

        async def started(i: int = i) -> bool:
            return (await session.snapshot()).runs[i].status != "queued"

        await eventually(started)
        handle = await client.get_run(run.run_id)
        asked = await wait_for_status(handle, RunStatus.WAITING)
        assert asked.interaction is not None
        await handle.answer(asked.interaction.id, f"answer {i}")
        await handle.result()
    histories = [await client.temporal.get_workflow_handle(session.session_id).fetch_history()]
    assert failed_tasks(histories) == []
