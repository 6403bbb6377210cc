"""Signed approvals: a decision about a tool call that a caller cannot forge.

Temporal tells workflow code nothing about who sent a signal or an update
that cannot be forged: an update's info holds only its id and name, and a
client's `identity` is a string the client chooses. So a response's
`responder` is whatever the caller typed, and anyone allowed to signal the
run can approve its calls under any name. Where that is not enough, a
registration names who may decide each tool::

    AgentRegistration(agent, version="1", approvers={"pay": ["alice@example.com"]})

and every approval or denial of `pay` must then carry a token: an
HMAC-SHA256, by a key the worker holds and history never sees, over the
call's operation id, the interaction id, the arguments' digest, the
decision, the approver and the reason (which the model reads). The worker
checks it (a local activity, before the decision is recorded) against its
keys and the allow-list; a response with a missing, wrong or foreign token
is refused like any invalid response.

Whoever holds a key can sign as any approver: give keys to the service that
authenticates people (your approval UI, behind your SSO), not to people.
Keys are named, so they can rotate: the first key signs, every key verifies.
They come from `DURABLY_APPROVAL_KEYS` (``kid:base64,kid2:base64``) or from
a file of ``kid:base64`` lines named by `DURABLY_APPROVAL_KEYS_FILE`; make
one with `ApprovalKeys.generate_key()` (or ``durably approval-key``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from durably._named_keys import (
    check_named_keys,
    generate_key,
    named_keys_from_env,
    parse_named_keys,
)
from durably.contract import Interaction
from durably.errors import DurablyError

__all__ = ["ENV_KEYS", "ENV_KEYS_FILE", "ApprovalKeys"]

ENV_KEYS = "DURABLY_APPROVAL_KEYS"
ENV_KEYS_FILE = "DURABLY_APPROVAL_KEYS_FILE"
_MIN_KEY_BYTES = 32
_VERSION = "v1"


class ApprovalKeys:
    """Named HMAC keys: the first signs, all verify."""

    def __init__(self, keys: Mapping[str, bytes]) -> None:
        self._keys = check_named_keys(
            keys, what="approval keys", min_bytes=_MIN_KEY_BYTES, make="durably approval-key"
        )
        self.signing_key_id = next(iter(self._keys))

    def __repr__(self) -> str:  # never the key material
        return f"ApprovalKeys({', '.join(self._keys)})"

    @staticmethod
    def generate_key() -> str:
        """A new random key, base64 (put `kid:<this>` in DURABLY_APPROVAL_KEYS)."""
        return generate_key(_MIN_KEY_BYTES)

    @classmethod
    def parse(cls, text: str, *, source: str = "approval keys") -> ApprovalKeys:
        """Keys from ``kid:base64`` entries, separated by commas or newlines."""
        return cls(parse_named_keys(text, source=source))

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> ApprovalKeys:
        return cls.parse(Path(path).read_text(), source=f"approval key file {path}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ApprovalKeys | None:
        """Keys from DURABLY_APPROVAL_KEYS or the file DURABLY_APPROVAL_KEYS_FILE; None if unset."""
        keys = named_keys_from_env(ENV_KEYS, ENV_KEYS_FILE, environ)
        return None if keys is None else cls(keys)

    def sign(
        self,
        interaction: Interaction | Mapping[str, Any],
        *,
        approved: bool,
        approver: str,
        reason: str | None = None,
    ) -> str:
        """A token for `approver`'s decision on the pending `interaction` (from the snapshot)."""
        i = Interaction.model_validate(interaction)
        if i.operation_id is None:
            raise DurablyError(
                f"interaction {i.id!r} has no operation_id: its run started before signed "
                "approvals existed and its approvals cannot be signed"
            )
        decision = (i.operation_id, i.id, i.args_digest, approved, approver, reason)
        return f"{_VERSION}.{self.signing_key_id}.{self._mac(self.signing_key_id, *decision)}"

    def response(
        self,
        interaction: Interaction | Mapping[str, Any],
        *,
        approved: bool,
        approver: str,
        reason: str | None = None,
    ) -> dict[str, Any]:
        """A whole signed response for `RunHandle.respond` (pass `responder=approver` too)."""
        i = Interaction.model_validate(interaction)
        response: dict[str, Any] = {
            "type": "tool-approval",
            "approved": approved,
            "args_digest": i.args_digest,
            "token": self.sign(i, approved=approved, approver=approver, reason=reason),
        }
        if reason is not None:
            response["reason"] = reason
        return response

    def problem(
        self,
        token: str | None,
        *,
        operation_id: str,
        interaction_id: str,
        args_digest: str,
        approved: bool,
        approver: str | None,
        reason: str | None = None,
    ) -> str | None:
        """Why `token` does not prove this decision, or None if it does."""
        if not token:
            return "it carries no token"
        if not approver:
            return "it names no approver (responder)"
        version, _, rest = token.partition(".")
        kid, _, mac = rest.partition(".")
        if version != _VERSION or not kid or not mac or not token.isascii():
            return "the token is not a durably approval token (v1.<key id>.<mac>)"
        if kid not in self._keys:
            return f"the token was signed with key {kid[:40]!r}, which this worker does not hold"
        decision = (operation_id, interaction_id, args_digest, approved, approver, reason)
        if not hmac.compare_digest(self._mac(kid, *decision).encode(), mac.encode()):
            return (
                "the token does not match this decision (another run, call, arguments, "
                "decision, approver or reason, or another key)"
            )
        return None

    def _mac(
        self,
        kid: str,
        operation_id: str,
        interaction_id: str,
        args_digest: str,
        approved: bool,
        approver: str,
        reason: str | None,
    ) -> str:
        message = json.dumps(
            [_VERSION, operation_id, interaction_id, args_digest, approved, approver, reason],
            ensure_ascii=False,
            separators=(",", ":"),
        ).encode("utf-8", "surrogatepass")
        digest = hmac.new(self._keys[kid], message, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
