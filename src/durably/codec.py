"""Encrypted payloads: tool arguments, results, answers and model text are customer data.

`EncryptionCodec` is a Temporal payload codec: every payload a client or
worker sends (a run's input, activity inputs and results, signals, updates,
queries' answers, current details and summaries) leaves the process
encrypted with AES-256-GCM, so the server, its database and anyone reading
them see ciphertext. Turn it on with keys, never in code::

    DURABLY_ENCRYPTION_KEYS="k2:<base64>,k1:<base64>"   # or DURABLY_ENCRYPTION_KEYS_FILE

    codec = EncryptionCodec.from_env()
    client = await DurableClient.connect(encryption=codec)
    runtime = await DurableRuntime.open(agents=..., encryption=codec)

(the `durably` commands read the same variables). Keys are named, so they
rotate: the first key encrypts what is sent now, every key decrypts, and a
payload names its key in its metadata. Keep a key for as long as any
history holds payloads encrypted with it: a payload whose key a process does
not hold fails with `EncryptionKeyError` naming the key id, never decodes
to garbage. Make a key with ``durably encryption-key``.

What is never encrypted, by Temporal's design: search attributes, workflow
and run ids, activity types, task queues and timer durations. durably puts
no user data in them; put none in the run ids you choose.

Payloads that are not encrypted decode as they are, so runs started before
encryption was turned on go on.

A worker reads what anyone may send a run: a signal, an update or a start
input whose metadata claims ``binary/encrypted`` with a key id copied from
any history and random bytes. The SDK decodes a whole workflow activation
before any handler runs, so a codec error there failed every workflow task
of the run, and not even a cancellation was applied. The worker's codec
(`for_worker`) therefore turns a payload of a workflow's own that it cannot
decrypt into an `UNDECRYPTABLE` marker, which durably's handlers refuse like
any payload they cannot read, and which the run's start decides on
(`undecryptable`). What a worker's own activities and workflows encrypted
still fails the task until its key is back: a missing key is an operator's
error, and the run waits for it. `compress=True` compresses with zlib before
encrypting; it is off by default, because the length of compressed
ciphertext says something about its text when part of that text comes from
someone else (a model's or a tool's output beside a secret).
"""

from __future__ import annotations

import asyncio
import os
import zlib
from collections.abc import Mapping, Sequence
from typing import Self

import structlog
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio import activity
from temporalio.api.common.v1 import Payload
from temporalio.converter import (
    PayloadCodec,
    SerializationContext,
    WithSerializationContext,
    WorkflowSerializationContext,
)

from durably._named_keys import check_named_keys, generate_key, named_keys_from_env
from durably.errors import DurablyError

__all__ = [
    "ENCODING",
    "ENV_KEYS",
    "ENV_KEYS_FILE",
    "KEY_ID_METADATA",
    "UNDECRYPTABLE",
    "EncryptionCodec",
    "EncryptionKeyError",
    "EncryptionKeys",
    "KeylessCodec",
    "undecryptable",
]

_log = structlog.get_logger("durably.codec")
ENV_KEYS = "DURABLY_ENCRYPTION_KEYS"
ENV_KEYS_FILE = "DURABLY_ENCRYPTION_KEYS_FILE"
ENCODING = b"binary/encrypted"
"""The `encoding` metadata of an encrypted payload (the name Temporal's samples use)."""

KEY_ID_METADATA = "encryption-key-id"
"""The metadata key naming an encrypted payload's key (stored in clear)."""
UNDECRYPTABLE = b"binary/durably-undecryptable"
"""The `encoding` of the marker a worker's codec puts where a workflow's payload could not
be decrypted; its data is why (`undecryptable`)."""
_KEY_MISSING = "durably-key-missing"
_MAX_REASON_BYTES = 1_000
_CIPHER = "durably-cipher"
_AES = b"aes256gcm"
_AES_ZLIB = b"aes256gcm+zlib"
_KEY_BYTES = 32
_NONCE_BYTES = 12
_TAG_BYTES = 16
# Encoding many small payloads costs less inline than a thread hop each.
_INLINE_BYTES = 64 * 1024


class EncryptionKeyError(DurablyError):
    """A payload cannot be decrypted: its key is not held here, or it does not match it.

    In a worker, the workflow task or activity that needed the payload fails
    and is retried until the key is back: the run waits, nothing is lost.
    """

    def __init__(self, message: str, key_id: str, *, key_missing: bool = False) -> None:
        super().__init__(message)
        self.key_id = key_id
        # The payload names a key this process does not hold (else it names no known
        # cipher, or does not match its key: altered or forged).
        self.key_missing = key_missing


class EncryptionKeys:
    """Named AES-256 keys: the first encrypts, all decrypt.

    Each key is 32 random bytes. Its id is stored, in clear, with every
    payload it encrypts: make it a name (``2026-11``), never a secret.
    """

    def __init__(self, keys: Mapping[str, bytes]) -> None:
        self._keys = check_named_keys(
            keys,
            what="encryption keys",
            min_bytes=_KEY_BYTES,
            exact=True,
            make="durably encryption-key",
        )
        self.active_key_id = next(iter(self._keys))
        self._ciphers = {kid: AESGCM(key) for kid, key in self._keys.items()}

    def __repr__(self) -> str:  # never the key material
        return f"EncryptionKeys({', '.join(self._keys)})"

    def __eq__(self, other: object) -> bool:
        """The same keys in the same order (the same active key): codecs built from the
        environment twice, by a client and a worker, are one codec."""
        if not isinstance(other, EncryptionKeys):
            return NotImplemented
        return list(self._keys.items()) == list(other._keys.items())

    __hash__ = None  # type: ignore[assignment]

    @property
    def key_ids(self) -> tuple[str, ...]:
        """Every key's id, the active one first."""
        return tuple(self._keys)

    @staticmethod
    def generate_key() -> str:
        """A new random key, base64 (put `kid:<this>` first in DURABLY_ENCRYPTION_KEYS)."""
        return generate_key(_KEY_BYTES)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> EncryptionKeys | None:
        """Keys from DURABLY_ENCRYPTION_KEYS, else the file DURABLY_ENCRYPTION_KEYS_FILE
        names (``kid:base64`` entries, by commas or lines); None if neither is set."""
        keys = named_keys_from_env(ENV_KEYS, ENV_KEYS_FILE, environ)
        return None if keys is None else cls(keys)

    def cipher(self, key_id: str) -> AESGCM:
        """The cipher of key `key_id`; `EncryptionKeyError` if it is not held here."""
        try:
            return self._ciphers[key_id]
        except KeyError:
            raise EncryptionKeyError(
                f"a payload was encrypted with key {key_id[:40]!r}, which this process does "
                f"not hold (it holds {', '.join(map(repr, self._keys))}). Add that key back "
                f"to {ENV_KEYS} after the active one: keep every key as long as any run's "
                "history holds payloads encrypted with it",
                key_id,
                key_missing=True,
            ) from None


class _WorkerCodec(PayloadCodec, WithSerializationContext):
    """What a worker's codec does with a workflow's payload it cannot open: a marker
    (`UNDECRYPTABLE`) instead of failing the whole workflow task (see the module
    docstring). Subclasses open payloads in `_decrypt`, raising `EncryptionKeyError`."""

    _worker = False  # a worker's codec (`for_worker`)
    _marking = False  # now decoding a workflow's payloads

    def for_worker(self) -> Self:
        """This codec as a worker's: a workflow's payload it cannot decrypt becomes an
        `UNDECRYPTABLE` marker instead of failing the whole workflow task."""
        return self._copy(worker=True, marking=False)

    @property
    def is_worker(self) -> bool:
        """Whether this is a worker's codec (`for_worker`)."""
        return self._worker

    def with_context(self, context: SerializationContext) -> Self:
        """The SDK's hook: a worker's codec marks only in a workflow's activation (a
        workflow's own payloads, a child's), never for an activity's (a result or an
        input this worker's own code encrypted: those wait for their key)."""
        marking = self._worker and isinstance(context, WorkflowSerializationContext)
        return self if marking == self._marking else self._copy(self._worker, marking)

    def _copy(self, worker: bool, marking: bool) -> Self:
        twin = type(self).__new__(type(self))
        twin.__dict__.update(self.__dict__)
        twin._worker, twin._marking = worker, marking
        return twin

    def _decrypt(self, payload: Payload) -> Payload:
        raise NotImplementedError

    def _open(self, payload: Payload) -> Payload:
        # An activity's own client calls (a query's answer) are a client's: they raise.
        if not self._marking or activity.in_activity():
            return self._decrypt(payload)
        try:
            return self._decrypt(payload)
        except EncryptionKeyError as err:
            _log.warning(
                "a payload sent to a workflow could not be decrypted; the run refuses it, or "
                "waits for its key if it accepted it before",
                key_id=err.key_id[:40],
                reason=str(err)[:300],
            )
            metadata = {"encoding": UNDECRYPTABLE, KEY_ID_METADATA: err.key_id.encode()[:100]}
            if err.key_missing:
                metadata[_KEY_MISSING] = b"1"
            return Payload(metadata=metadata, data=str(err).encode()[:_MAX_REASON_BYTES])


class KeylessCodec(_WorkerCodec):
    """The codec of a process without keys: payloads pass as they are, and an encrypted
    one it reads is an `EncryptionKeyError` naming its key (a `durably` command, a
    worker started without keys), or, in a worker's workflow, a marker the run refuses:
    a forged "encrypted" signal wedged even a worker that encrypts nothing."""

    def __repr__(self) -> str:
        return "KeylessCodec()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KeylessCodec)

    __hash__ = None  # type: ignore[assignment]

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self._open(p) for p in payloads]

    def _decrypt(self, payload: Payload) -> Payload:
        if payload.metadata.get("encoding") != ENCODING:
            return payload
        kid = payload.metadata.get(KEY_ID_METADATA, b"").decode(errors="replace")[:40]
        raise EncryptionKeyError(
            f"this run's payloads are encrypted with key {kid!r}, and no encryption key is "
            f"set here: set {ENV_KEYS} (or {ENV_KEYS_FILE}) to the keys its workers use",
            kid,
            key_missing=True,
        )


class EncryptionCodec(_WorkerCodec):
    """AES-256-GCM over each whole payload (its metadata too), keyed by `keys`.

    Args:
        keys: The keys; the first encrypts.
        compress: zlib before encrypting (see the module's note on when not to).
    """

    def __init__(self, keys: EncryptionKeys, *, compress: bool = False) -> None:
        self.keys = keys
        self.compress = compress

    def __repr__(self) -> str:
        return f"EncryptionCodec({self.keys!r}, compress={self.compress})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EncryptionCodec):
            return NotImplemented
        return self.keys == other.keys and self.compress == other.compress

    __hash__ = None  # type: ignore[assignment]

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, compress: bool = False
    ) -> EncryptionCodec | None:
        """A codec with `EncryptionKeys.from_env()`; None when no key is set."""
        keys = EncryptionKeys.from_env(environ)
        return None if keys is None else cls(keys, compress=compress)

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        if sum(len(p.data) for p in payloads) > _INLINE_BYTES:
            return await asyncio.to_thread(lambda: [self._encrypt(p) for p in payloads])
        return [self._encrypt(p) for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        if sum(len(p.data) for p in payloads) > _INLINE_BYTES:
            return await asyncio.to_thread(lambda: [self._open(p) for p in payloads])
        return [self._open(p) for p in payloads]

    def _encrypt(self, payload: Payload) -> Payload:
        kid = self.keys.active_key_id
        cipher = _AES_ZLIB if self.compress else _AES
        plain = payload.SerializeToString()
        if self.compress:
            plain = zlib.compress(plain)
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self.keys.cipher(kid).encrypt(nonce, plain, _associated(kid, cipher))
        return Payload(
            metadata={"encoding": ENCODING, KEY_ID_METADATA: kid.encode(), _CIPHER: cipher},
            data=nonce + sealed,
        )

    def _decrypt(self, payload: Payload) -> Payload:
        if payload.metadata.get("encoding") != ENCODING:
            return payload  # sent before encryption was on, or by a process without it
        kid = payload.metadata.get(KEY_ID_METADATA, b"").decode(errors="replace")
        cipher = payload.metadata.get(_CIPHER, _AES)
        if cipher not in (_AES, _AES_ZLIB):
            raise EncryptionKeyError(
                f"a payload encrypted with key {kid[:40]!r} names cipher "
                f"{cipher[:40].decode(errors='replace')!r}, which durably does not know: "
                "it was made by another codec, or a newer durably",
                kid,
            )
        aes = self.keys.cipher(kid)
        if len(payload.data) < _NONCE_BYTES + _TAG_BYTES:  # AESGCM raises a bare ValueError
            raise EncryptionKeyError(
                f"a payload said to be encrypted with key {kid[:40]!r} holds "
                f"{len(payload.data)} bytes, fewer than any ciphertext: it was altered or "
                "forged",
                kid,
            )
        nonce, sealed = payload.data[:_NONCE_BYTES], payload.data[_NONCE_BYTES:]
        try:
            plain = aes.decrypt(nonce, sealed, _associated(kid, cipher))
        except InvalidTag:
            raise EncryptionKeyError(
                f"a payload encrypted with key {kid[:40]!r} does not decrypt with the key "
                "of that id held here: the key under that id was replaced (key ids must "
                "never be reused for new material), or the payload was altered",
                kid,
            ) from None
        if cipher == _AES_ZLIB:
            plain = zlib.decompress(plain)
        return Payload.FromString(plain)


def undecryptable(payload: Payload) -> EncryptionKeyError | None:
    """Why a worker could not decrypt `payload`, if it is a marker its codec put there."""
    if payload.metadata.get("encoding") != UNDECRYPTABLE:
        return None
    return EncryptionKeyError(
        payload.data.decode(errors="replace"),
        payload.metadata.get(KEY_ID_METADATA, b"").decode(errors="replace"),
        key_missing=_KEY_MISSING in payload.metadata,
    )


def _associated(kid: str, cipher: bytes) -> bytes:
    """What the tag also covers: the metadata stored in clear, so none can be swapped."""
    return b"durably-codec-v1\x00" + kid.encode() + b"\x00" + cipher
