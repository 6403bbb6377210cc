"""Named secret keys, as both signed approvals and payload encryption take them.

Keys are named so they can rotate: the first one is used for what is made
now (a signature, a payload), every one is tried on what was made before.
They are written ``kid:base64``, separated by commas or newlines (``#``
starts a comment line), in an environment variable or in a file it names;
never in code.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path

from durably.errors import DurablyError

__all__ = ["check_named_keys", "generate_key", "named_keys_from_env", "parse_named_keys"]

_KEY_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")


def generate_key(size: int = 32) -> str:
    """`size` random bytes, base64: the `base64` of a ``kid:base64`` entry."""
    return base64.b64encode(secrets.token_bytes(size)).decode()


def check_named_keys(
    keys: Mapping[str, bytes], *, what: str, min_bytes: int, exact: bool = False, make: str
) -> dict[str, bytes]:
    """`keys` as a dict, or a `DurablyError` naming the first id or key that is unfit
    (`make` is the command that makes a fit one)."""
    if not keys:
        raise DurablyError(f"{what} needs at least one key")
    for kid, key in keys.items():
        if not _KEY_ID.fullmatch(kid):
            raise DurablyError(
                f"{what}: key id {kid[:40]!r} must be 1 to 32 letters, digits, '_' or '-'"
            )
        if len(key) < min_bytes or (exact and len(key) != min_bytes):
            size = f"exactly {min_bytes}" if exact else f"at least {min_bytes}"
            raise DurablyError(
                f"{what}: key {kid!r} has {len(key)} bytes; use {size} random bytes "
                f"(`{make}` makes one)"
            )
    return dict(keys)


def parse_named_keys(text: str, *, source: str) -> dict[str, bytes]:
    """Keys from ``kid:base64`` entries; the first entry comes first."""
    keys: dict[str, bytes] = {}
    for entry in re.split(r"[,\n]", text):
        entry = entry.strip()
        if not entry or entry.startswith("#"):
            continue
        kid, sep, material = entry.partition(":")
        if not sep:
            raise DurablyError(f"{source}: each key is `kid:base64`, got {entry[:8]!r}...")
        try:
            keys[kid.strip()] = base64.b64decode(material.strip(), validate=True)
        except binascii.Error as err:
            raise DurablyError(f"{source}: key {kid.strip()!r} is not base64 ({err})") from None
    if not keys:
        raise DurablyError(f"{source} holds no key")
    return keys


def named_keys_from_env(
    env_keys: str, env_file: str, environ: Mapping[str, str] | None = None
) -> dict[str, bytes] | None:
    """Keys from the variable `env_keys`, else from the file `env_file` names; None if neither."""
    env = os.environ if environ is None else environ
    if env.get(env_keys):
        return parse_named_keys(env[env_keys], source=env_keys)
    if env.get(env_file):
        path = env[env_file]
        try:
            text = Path(path).read_text()
        except OSError as err:
            raise DurablyError(
                f"{env_file}: cannot read key file {path} ({err.strerror})"
            ) from None
        return parse_named_keys(text, source=f"key file {path} ({env_file})")
    return None
