"""Encrypted payloads (`durably.codec`): the server never holds customer data in clear,
and keys rotate without a run losing anything."""

from __future__ import annotations

import base64
import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from google.protobuf.message import Message
from pydantic import BaseModel
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.common import RawValue
from temporalio.testing import WorkflowEnvironment

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    DurableRuntime,
    ModelRequest,
    RunCancelledError,
    RunHandle,
    RunSnapshot,
    RunStatus,
    ScriptedModel,
    ToolContext,
    ToolRetry,
    tool,
)
from durably._replay import replay
from durably.codec import (
    ENCODING,
    ENV_KEYS,
    EncryptionCodec,
    EncryptionKeyError,
    EncryptionKeys,
)
from durably.contract import RESPOND_SIGNAL, RespondRequest
from durably.dev import DevServer
from durably.errors import DurablyError
from durably.messages import AssistantMessage
from durably.models import last_tool_results, tool_call
from durably.tools import question_tool

from .conftest import BIN, asker, cli, eventually, wait_for_status

KEY_A, KEY_B = os.urandom(32), os.urandom(32)


def codec(*keys: tuple[str, bytes]) -> EncryptionCodec:
    return EncryptionCodec(EncryptionKeys(dict(keys)))


class Order(BaseModel):
    order: str


def leaky(marker: str) -> AgentRegistration:
    """An agent whose every kind of data carries `marker`: the tool's arguments, a first
    attempt's exception, its result, the customer's answer and the model's text."""
    attempts: list[str] = []

    @tool
    async def lookup(args: Order, ctx: ToolContext) -> str:
        """Look an order up."""
        attempts.append(args.order)
        if len(attempts) == 1:
            raise RuntimeError(f"{marker}-exception: the order system hiccuped")
        return f"{marker}-result for {args.order}"

    def done(request: ModelRequest) -> AssistantMessage:
        seen = " / ".join(r.content for r in last_tool_results(request))
        return AssistantMessage(content=f"{marker}-model text, after {seen}")

    agent = Agent(
        id="leaky",
        model=ScriptedModel(
            [
                tool_call("lookup", order=f"{marker}-args"),
                tool_call("ask", question="Which address?"),
                done,
            ]
        ),
        instructions="",
        tools=[lookup, question_tool(name="ask", description="Ask the customer.")],
    )
    return AgentRegistration(
        agent,
        version="1",
        tool_recovery={"lookup": "safe"},
        tool_retry=ToolRetry(max_attempts=3, initial_delay_ms=1, max_delay_ms=1),
    )


def database_holds(db: Path, text: str) -> bool:
    """Whether the server's SQLite files (the database and its journal) hold `text`."""
    needle = text.encode()
    return any(needle in f.read_bytes() for f in db.parent.glob(db.name + "*") if f.is_file())


class TestNothingInClear:
    async def test_no_customer_data_reaches_the_servers_database(
        self, dev_server: DevServer
    ) -> None:
        secret, clear = f"SECRET{uuid.uuid4().hex}", f"CLEAR{uuid.uuid4().hex}"
        await dev_server.start()
        try:
            encrypted = DurableClient(
                dev_server.client, task_queue="encrypted", encryption=codec(("a", KEY_A))
            )
            plain = DurableClient(dev_server.client, task_queue="plain")
            async with (
                await DurableRuntime.open(client=encrypted, agents=[leaky(secret)]) as one,
                await DurableRuntime.open(client=plain, agents=[leaky(clear)]) as two,
            ):
                await one.resume()
                await two.resume()
                runs = [
                    await c.start_run("leaky", f"{m}-input: where is my order?")
                    for c, m in ((encrypted, secret), (plain, clear))
                ]
                for run, marker in zip(runs, (secret, clear), strict=True):
                    snapshot = await wait_for_status(run, RunStatus.WAITING)
                    assert snapshot.interaction is not None
                    await run.answer(snapshot.interaction.id, f"{marker}-answer: 1 Main St")
                results = [await run.result() for run in runs]
                snapshot = await runs[0].snapshot()
                keys = f"a:{base64.b64encode(KEY_A).decode()}"
                shown = await cli(
                    str(BIN / "durably"), "runs", "show", runs[0].run_id,
                    "--target", dev_server.address,
                    env={**os.environ, ENV_KEYS: keys},
                )  # fmt: skip
        finally:
            await dev_server.stop()

        # The worker and the client read everything decoded...
        assert results[0].output == (f"{secret}-model text, after {secret}-answer: 1 Main St")
        assert shown.returncode == 0, shown.stderr
        assert f"{secret}-model text" in shown.stdout
        assert f"{secret}-answer" in snapshot.model_dump_json()
        assert f"{secret}-model" in (snapshot.output or "")
        # ...the server holds none of it; the same run unencrypted shows the check can see.
        for kind in ("input", "args", "exception", "result", "answer", "model"):
            assert database_holds(dev_server.db, f"{clear}-{kind}"), kind
        assert not database_holds(dev_server.db, secret)


class TestKeyRotation:
    async def test_runs_go_on_across_a_rotation_and_wait_for_a_removed_key(
        self, env: WorkflowEnvironment, task_queue: str
    ) -> None:
        under_a = DurableClient(env.client, task_queue=task_queue, encryption=codec(("a", KEY_A)))
        rotated = codec(("b", KEY_B), ("a", KEY_A))
        operator = DurableClient(env.client, task_queue=task_queue, encryption=rotated)

        # Two runs start under key A and wait for an answer.
        async with await DurableRuntime.open(client=under_a, agents=[asker()]) as runtime:
            await runtime.resume()
            first, second = [await under_a.start_run("asker", "where?") for _ in range(2)]
            for run in (first, second):
                asked = await wait_for_status(run, RunStatus.WAITING)
        assert asked.interaction is not None

        # B becomes the active key, A is kept: the first run completes, under B from now.
        async with await DurableRuntime.open(client=operator, agents=[asker()]) as runtime:
            await runtime.resume()
            handle = await operator.get_run(first.run_id)
            waiting = await wait_for_status(handle, RunStatus.WAITING)
            assert waiting.interaction is not None
            await handle.answer(waiting.interaction.id, "order 7")
            assert "order 7" in ((await handle.result()).output or "")
        keys = await key_ids(operator, first.run_id)
        assert keys[0] == "a" and keys[-1] == "b"

        # A is removed: the second run's workflow task fails naming it, and retries.
        only_b = DurableClient(env.client, task_queue=task_queue, encryption=codec(("b", KEY_B)))
        async with await DurableRuntime.open(client=only_b, agents=[asker()]) as runtime:
            await runtime.resume()
            with pytest.raises(DurablyError, match="key 'a', which this process does not hold"):
                await (await operator.get_run(second.run_id)).snapshot()
            await answer_by_signal(operator, second.run_id, asked.interaction.id, "order 8")

            async def refused() -> bool:
                return bool(await task_failures(operator, second.run_id))

            await eventually(refused)
        (failure,) = await task_failures(operator, second.run_id)
        assert "key 'a', which this process does not hold" in failure
        assert ENV_KEYS in failure

        # A is back: the same run goes on, with its answer, nothing lost.
        async with await DurableRuntime.open(client=operator, agents=[asker()]) as runtime:
            await runtime.resume()
            result = await (await operator.get_run(second.run_id)).result()
        assert "order 8" in (result.output or "")


def forged(key_id: bytes = b"a", cipher: bytes = b"aes256gcm", size: int = 64) -> RawValue:
    """What a caller with no key can send: metadata claiming encryption, a key id read from
    any history (or one nobody holds), and random bytes."""
    return RawValue(
        Payload(
            metadata={"encoding": ENCODING, "encryption-key-id": key_id, "durably-cipher": cipher},
            data=os.urandom(size),
        )
    )


FORGERIES = {
    "a-held-key-id": forged(b"a"),
    "an-unknown-key-id": forged(b"k-nobody-holds"),
    "an-unknown-cipher": forged(b"a", b"rot13"),
    "a-short-ciphertext": forged(b"a", size=5),
}


@contextlib.asynccontextmanager
async def encrypted_asker(
    env: WorkflowEnvironment, task_queue: str
) -> AsyncIterator[tuple[DurableClient, RunHandle, RunSnapshot]]:
    """A worker holding key A, and a run of `asker` waiting for its answer."""
    client = DurableClient(env.client, task_queue=task_queue, encryption=codec(("a", KEY_A)))
    async with await DurableRuntime.open(client=client, agents=[asker()]) as runtime:
        await runtime.resume()
        run = await client.start_run("asker", "where?")
        yield client, run, await wait_for_status(run, RunStatus.WAITING)


class TestForgedCiphertext:
    """A signal, an update or a start input that claims to be encrypted and is not: the
    SDK decodes a whole activation before any handler runs, so one of them failed every
    workflow task of an encrypted run, and not even a cancellation was applied."""

    @pytest.mark.parametrize("kind", sorted(FORGERIES))
    async def test_a_forged_signal_is_recorded_as_rejected_and_cancel_still_works(
        self, env: WorkflowEnvironment, task_queue: str, kind: str
    ) -> None:
        async with encrypted_asker(env, task_queue) as (client, run, _):
            raw = env.client.get_workflow_handle(run.run_id)  # no codec, no key

            await raw.signal(RESPOND_SIGNAL, FORGERIES[kind])

            async def rejected() -> bool:
                snap = await run.snapshot()
                return any("could not be decrypted" in (e.detail or "") for e in snap.events)

            await eventually(rejected)
            await run.cancel()
            with pytest.raises(RunCancelledError):
                await run.result()
        assert await task_failures(client, run.run_id) == []
        # A worker that rebuilds the run refuses it again, whatever the key id: no replay
        # waits for a key that will never come.
        history = await client.temporal.get_workflow_handle(run.run_id).fetch_history()
        assert await replay(history, client.temporal.data_converter) is None

    @pytest.mark.parametrize("kind", sorted(FORGERIES))
    async def test_a_forged_update_is_refused_before_history(
        self, env: WorkflowEnvironment, task_queue: str, kind: str
    ) -> None:
        """The SDK refuses an update whose argument it cannot decode before its validator
        runs: nothing reaches history, and the run goes on."""
        async with encrypted_asker(env, task_queue) as (client, run, waiting):
            assert waiting.interaction is not None
            raw = env.client.get_workflow_handle(run.run_id)
            before = len((await raw.fetch_history()).events)

            with pytest.raises(WorkflowUpdateFailedError):
                await raw.execute_update("respond", FORGERIES[kind])

            assert len((await raw.fetch_history()).events) == before
            await run.answer(waiting.interaction.id, "order 9")
            assert "order 9" in ((await run.result()).output or "")
        assert await task_failures(client, run.run_id) == []

    @pytest.mark.parametrize("kind", sorted(FORGERIES))
    async def test_a_forged_start_input_fails_the_run_where_operators_see_it(
        self, env: WorkflowEnvironment, task_queue: str, kind: str
    ) -> None:
        client = DurableClient(env.client, task_queue=task_queue, encryption=codec(("a", KEY_A)))
        run_id = f"forged-start-{uuid.uuid4().hex[:8]}"
        async with await DurableRuntime.open(client=client, agents=[asker()]) as runtime:
            await runtime.resume()

            await env.client.start_workflow(
                "AgentRunWorkflow", FORGERIES[kind], id=run_id, task_queue=task_queue
            )

            with pytest.raises(WorkflowFailureError) as failed:
                await client.temporal.get_workflow_handle(run_id).result()
            assert "could not be decrypted" in str(failed.value.cause)

            async def listed() -> bool:  # the visibility store follows a moment later
                runs = await client.list_runs(status=RunStatus.FAILED, limit=100)
                return run_id in [r.run_id for r in runs]

            await eventually(listed)
        assert await task_failures(client, run_id) == []


async def test_a_client_without_the_key_is_told_what_to_connect_with(
    env: WorkflowEnvironment, task_queue: str
) -> None:
    """It got a raw `KeyError: Unknown payload encoding binary/encrypted`."""
    async with encrypted_asker(env, task_queue) as (_, run, _):
        keyless = DurableClient(env.client, task_queue=task_queue)

        with pytest.raises(DurablyError, match=r"encrypted payloads.*encryption=Encryption"):
            await (await keyless.get_run(run.run_id)).snapshot()
        await run.cancel()


async def key_ids(client: DurableClient, run_id: str) -> list[str]:
    """The key id of each encrypted payload in the run's history, in order."""
    history = await client.temporal.get_workflow_handle(run_id).fetch_history()
    return [
        p.metadata["encryption-key-id"].decode()
        for event in history.events
        for p in encrypted_payloads(event)
    ]


def encrypted_payloads(message: Message) -> list[Payload]:
    """Every encrypted payload anywhere inside `message`."""
    if isinstance(message, Payload):
        return [message] if message.metadata.get("encoding") == ENCODING else []
    found: list[Payload] = []
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            items = list(value.values())
        elif isinstance(value, Message):
            items = [value]
        else:
            items = list(value)
        for item in items:
            if isinstance(item, Message):
                found += encrypted_payloads(item)
    return found


async def answer_by_signal(
    client: DurableClient, run_id: str, interaction_id: str, text: str
) -> None:
    """Answer through the signal: an update would wait on a worker that cannot decode."""
    request = RespondRequest(
        interaction_id=interaction_id, response={"type": "question", "answer": text}
    )
    await client.temporal.get_workflow_handle(run_id).signal(RESPOND_SIGNAL, request)


async def task_failures(client: DurableClient, run_id: str) -> list[str]:
    """Why the run's workflow tasks failed, decoded (the message is encrypted too)."""
    history = await client.temporal.get_workflow_handle(run_id).fetch_history()
    converter = client.temporal.data_converter
    return [
        str(await converter.decode_failure(e.workflow_task_failed_event_attributes.failure))
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
    ]


class TestCodec:
    async def test_a_payload_round_trips_and_names_its_key(self) -> None:
        original = Payload(metadata={"encoding": b"json/plain"}, data=b'"hello"')
        for compress in (False, True):
            c = EncryptionCodec(EncryptionKeys({"k1": KEY_A}), compress=compress)
            (sealed,) = await c.encode([original])
            assert sealed.metadata["encoding"] == ENCODING
            assert sealed.metadata["encryption-key-id"] == b"k1"
            assert b"hello" not in sealed.data
            assert await c.decode([sealed]) == [original]

    async def test_an_unknown_key_or_a_replaced_one_is_an_error_never_garbage(self) -> None:
        (sealed,) = await codec(("old", KEY_A)).encode([Payload(data=b"x")])
        with pytest.raises(
            EncryptionKeyError, match="key 'old', which this process does not hold"
        ) as err:
            await codec(("new", KEY_B)).decode([sealed])
        assert err.value.key_id == "old"
        with pytest.raises(EncryptionKeyError, match="does not decrypt with the key of that id"):
            await codec(("old", KEY_B)).decode([sealed])

    async def test_a_payload_not_encrypted_decodes_as_it_is(self) -> None:
        plain = Payload(metadata={"encoding": b"json/plain"}, data=b"1")
        assert await codec(("a", KEY_A)).decode([plain]) == [plain]

    def test_keys_come_from_the_environment_or_a_file_never_code(self, tmp_path: Path) -> None:
        line = f"k2:{base64.b64encode(KEY_B).decode()},k1:{base64.b64encode(KEY_A).decode()}"
        keys = EncryptionKeys.from_env({ENV_KEYS: line})
        assert keys is not None and keys.key_ids == ("k2", "k1")
        assert "KEY" not in repr(keys) and base64.b64encode(KEY_B).decode() not in repr(keys)
        path = tmp_path / "keys"
        path.write_text(f"# rotated 2026-12\n{line.replace(',', chr(10))}\n")
        from_file = EncryptionKeys.from_env({"DURABLY_ENCRYPTION_KEYS_FILE": str(path)})
        assert from_file is not None and from_file.active_key_id == "k2"
        assert EncryptionKeys.from_env({}) is None
        with pytest.raises(DurablyError, match="has 16 bytes; use exactly 32"):
            EncryptionKeys({"short": os.urandom(16)})
