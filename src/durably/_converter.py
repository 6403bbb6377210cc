"""durably's needs of a data converter, added to the user's rather than replacing it.

durably's workflow and activities exchange pydantic models, so payloads must
be converted by pydantic (`temporalio.contrib.pydantic`). That is all it
needs. A client's payload codec (encryption), failure converter and
external storage are the user's and stay: replacing the converter would send
their payloads to the server in plain text without a word.

With durably's `EncryptionCodec`, error messages and stack traces are moved
into the failure's encoded attributes (`DefaultFailureConverterWithEncodedAttributes`),
since a tool's exception text is customer data too; a failure converter the
user brought that keeps them in clear is kept, with a warning saying so.
"""

from __future__ import annotations

import dataclasses

import structlog
from temporalio.api.failure.v1 import Failure
from temporalio.client import Client
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.converter import (
    DataConverter,
    DefaultFailureConverter,
    DefaultFailureConverterWithEncodedAttributes,
    DefaultPayloadConverter,
)

from durably.codec import EncryptionCodec, KeylessCodec
from durably.errors import DurablyError

__all__ = ["durable_converter", "with_durable_converter"]

_log = structlog.get_logger("durably.converter")
_PROBE = "durably: is this message encoded?"


def durable_converter(
    converter: DataConverter | None, encryption: EncryptionCodec | None = None
) -> DataConverter:
    """`converter` with what durably needs; the same object when it has it already.

    Raises `DurablyError` for a custom payload converter that is not pydantic's,
    or for `encryption` on a converter that has another payload codec.
    """
    base = converter if converter is not None else DataConverter.default
    changes: dict[str, object] = {}
    payload = base.payload_converter_class
    if payload is DefaultPayloadConverter:
        changes["payload_converter_class"] = PydanticPayloadConverter
    elif not issubclass(payload, PydanticPayloadConverter):
        raise DurablyError(
            f"the client's data converter converts payloads with {payload.__qualname__}; "
            "durably's workflow and activities exchange pydantic models and need "
            "temporalio.contrib.pydantic.PydanticPayloadConverter. Derive your payload "
            "converter from it (or leave the default, which durably replaces)"
        )
    codec = base.payload_codec
    if encryption is not None and codec != encryption:
        if codec is not None:
            raise DurablyError(
                f"the client already encodes payloads with {codec!r}; durably will not put "
                f"its encryption {encryption!r} beside another codec. Pass one of them: "
                "leave encryption out, or connect without your codec"
            )
        changes["payload_codec"] = codec = encryption
    if isinstance(codec, EncryptionCodec):
        if base.failure_converter_class is DefaultFailureConverter:
            changes["failure_converter_class"] = DefaultFailureConverterWithEncodedAttributes
        elif _keeps_messages_in_clear(base):
            _log.warning(
                "payloads are encrypted, but this failure converter keeps error messages "
                "and stack traces in plain text in the server's history; base it on "
                "DefaultFailureConverterWithEncodedAttributes to encrypt them too",
                failure_converter=base.failure_converter_class.__qualname__,
            )
    return dataclasses.replace(base, **changes) if changes else base  # type: ignore[arg-type]


def with_durable_converter(
    client: Client, encryption: EncryptionCodec | None = None, *, worker: bool = False
) -> Client:
    """`client`, or the same connection with `durable_converter` of its converter; for a
    `worker`, with durably's encryption as a worker's (`EncryptionCodec.for_worker`)."""
    converter = durable_converter(client.data_converter, encryption)
    codec = converter.payload_codec
    if worker and isinstance(codec, (EncryptionCodec, KeylessCodec)) and not codec.is_worker:
        converter = dataclasses.replace(converter, payload_codec=codec.for_worker())
    if converter is client.data_converter:
        return client
    config = client.config()
    config["data_converter"] = converter
    return Client(**config)


def _keeps_messages_in_clear(converter: DataConverter) -> bool:
    """Whether `converter`'s failure converter leaves an exception's message in the failure."""
    failure = Failure()
    converter.failure_converter.to_failure(Exception(_PROBE), converter.payload_converter, failure)
    return _PROBE in failure.message
