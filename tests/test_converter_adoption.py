"""Adopting durably keeps the user's data converter: their codec, failure converter
and external storage, on each of the three ways in (the plugin, `DurableClient`,
`DurableRuntime`). Replacing it would send their payloads to the server in clear."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.converter import (
    DataConverter,
    DefaultFailureConverter,
    DefaultFailureConverterWithEncodedAttributes,
    ExternalStorage,
    JSONPlainPayloadConverter,
    PayloadCodec,
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
)
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    DurableRuntime,
    DurablyError,
    DurablyPlugin,
    ScriptedModel,
)
from durably.codec import EncryptionCodec, EncryptionKeys
from durably.testing import capture_logs


class ReversingCodec(PayloadCodec):
    """A user's own codec (it reverses each payload's bytes) that counts its calls."""

    ENCODING = b"binary/test-reversed"

    def __init__(self) -> None:
        self.encoded = 0
        self.decoded = 0

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        self.encoded += len(payloads)
        return [
            Payload(metadata={"encoding": self.ENCODING}, data=p.SerializeToString()[::-1])
            for p in payloads
        ]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        decoded = []
        for p in payloads:
            if p.metadata.get("encoding") == self.ENCODING:
                self.decoded += 1
                p = Payload.FromString(p.data[::-1])
            decoded.append(p)
        return decoded


class MemoryStorage(StorageDriver):
    """External storage in a dict: large payloads leave history for it."""

    def __init__(self) -> None:
        self.blobs: dict[str, Payload] = {}

    def name(self) -> str:
        return "memory"

    async def store(
        self, context: StorageDriverStoreContext, payloads: Sequence[Payload]
    ) -> list[StorageDriverClaim]:
        claims = []
        for p in payloads:
            key = uuid.uuid4().hex
            self.blobs[key] = p
            claims.append(StorageDriverClaim(claim_data={"key": key}))
        return claims

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        return [self.blobs[c.claim_data["key"]] for c in claims]


class AuditFailures(DefaultFailureConverter):
    """A user's failure converter (it keeps messages in clear)."""


def greeter() -> AgentRegistration:
    agent = Agent(id="greeter", model=ScriptedModel(["hello"]), instructions="Greet.")
    return AgentRegistration(agent, version="1")


async def connected(
    env: WorkflowEnvironment, converter: DataConverter, **options: object
) -> Client:
    target = env.client.service_client.config.target_host
    return await Client.connect(target, data_converter=converter, **options)  # type: ignore[arg-type]


async def input_encoding(client: DurableClient, run_id: str) -> bytes:
    """The `encoding` of the run's start input as the server stores it."""
    history = await client.temporal.get_workflow_handle(run_id).fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    return started.input.payloads[0].metadata["encoding"]


def queue() -> str:
    return f"adopt-{uuid.uuid4().hex[:8]}"


class TestTheUsersConverterStays:
    async def test_a_plugin_on_the_client_keeps_its_codec(self, env: WorkflowEnvironment) -> None:
        codec = ReversingCodec()
        temporal = await connected(
            env, DataConverter(payload_codec=codec), plugins=[DurablyPlugin([greeter()])]
        )
        assert temporal.data_converter.payload_codec is codec
        assert temporal.data_converter.payload_converter_class is PydanticPayloadConverter

        task_queue = queue()
        async with Worker(temporal, task_queue=task_queue):
            client = DurableClient(temporal, task_queue=task_queue)
            run = await client.start_run("greeter", "hi")
            assert (await run.result()).output == "hello"

        assert await input_encoding(client, run.run_id) == ReversingCodec.ENCODING
        assert codec.decoded > 0

    async def test_a_plugin_on_the_worker_alone_keeps_the_clients_codec(
        self, env: WorkflowEnvironment
    ) -> None:
        """The client is shared and knows nothing of durably: its converter stays the
        default one, and the worker still converts durably's payloads with pydantic."""
        codec = ReversingCodec()
        temporal = await connected(env, DataConverter(payload_codec=codec))
        task_queue = queue()
        async with Worker(temporal, task_queue=task_queue, plugins=[DurablyPlugin([greeter()])]):
            client = DurableClient(temporal, task_queue=task_queue)
            run = await client.start_run("greeter", "hi")
            assert (await run.result()).output == "hello"

        assert temporal.data_converter.payload_codec is codec
        assert await input_encoding(client, run.run_id) == ReversingCodec.ENCODING

    async def test_a_durable_client_and_runtime_keep_codec_failure_converter_and_storage(
        self, env: WorkflowEnvironment
    ) -> None:
        codec, storage = ReversingCodec(), MemoryStorage()
        converter = DataConverter(
            payload_codec=codec,
            failure_converter_class=AuditFailures,
            external_storage=ExternalStorage(drivers=[storage], payload_size_threshold=1024),
        )
        client = DurableClient(await connected(env, converter), task_queue=queue())
        kept = client.temporal.data_converter
        assert kept.payload_codec is codec
        assert kept.failure_converter_class is AuditFailures
        assert kept.external_storage is converter.external_storage

        async with await DurableRuntime.open(client=client, agents=[greeter()]) as runtime:
            await runtime.resume()
            run = await client.start_run("greeter", "hi " + "x" * 4096)
            assert (await run.result()).output == "hello"

        assert storage.blobs, "the large input went to the user's external storage"
        assert codec.decoded > 0

    def test_a_payload_converter_that_is_not_pydantics_is_refused_saying_what_to_do(
        self, env: WorkflowEnvironment
    ) -> None:
        class Mine(JSONPlainPayloadConverter):
            pass

        custom = dataclasses.replace(DataConverter.default, payload_converter_class=Mine)  # type: ignore[arg-type]
        temporal = Client(**{**env.client.config(), "data_converter": custom})
        with pytest.raises(DurablyError, match="Mine; durably's workflow and activities") as err:
            DurableClient(temporal)
        assert "PydanticPayloadConverter" in str(err.value)

    def test_encryption_beside_another_codec_is_refused(self, env: WorkflowEnvironment) -> None:
        temporal = Client(
            **{
                **env.client.config(),
                "data_converter": DataConverter(payload_codec=ReversingCodec()),
            }
        )
        codec = EncryptionCodec(EncryptionKeys({"k1": bytes(32)}))
        with pytest.raises(DurablyError, match="already encodes payloads with"):
            DurableClient(temporal, encryption=codec)

    def test_the_same_keys_read_twice_are_one_codec(self, env: WorkflowEnvironment) -> None:
        """A client and a runtime each build a codec from the environment: not two codecs."""
        first = DurableClient(
            env.client, encryption=EncryptionCodec(EncryptionKeys({"k1": bytes(32)}))
        )
        again = EncryptionCodec(EncryptionKeys({"k1": bytes(32)}))
        assert DurableClient(first.temporal, encryption=again).temporal is first.temporal
        rotated = EncryptionCodec(EncryptionKeys({"k2": bytes(32), "k1": bytes(32)}))
        with pytest.raises(DurablyError, match="already encodes payloads with"):
            DurableClient(first.temporal, encryption=rotated)


class TestFailuresUnderEncryption:
    def test_encryption_encodes_failure_messages_too(self, env: WorkflowEnvironment) -> None:
        codec = EncryptionCodec(EncryptionKeys({"k1": bytes(32)}))
        client = DurableClient(env.client, encryption=codec)
        converter = client.temporal.data_converter
        assert converter.payload_codec is codec
        assert converter.failure_converter_class is DefaultFailureConverterWithEncodedAttributes

    def test_a_failure_converter_that_keeps_messages_in_clear_is_kept_with_a_warning(
        self, env: WorkflowEnvironment
    ) -> None:
        temporal = Client(
            **{
                **env.client.config(),
                "data_converter": DataConverter(failure_converter_class=AuditFailures),
            }
        )
        codec = EncryptionCodec(EncryptionKeys({"k1": bytes(32)}))
        with capture_logs() as logs:
            client = DurableClient(temporal, encryption=codec)
        assert client.temporal.data_converter.failure_converter_class is AuditFailures
        (warning,) = [e for e in logs if "failure converter" in e["event"]]
        assert warning["failure_converter"] == "AuditFailures"
        assert "plain text" in warning["event"]
