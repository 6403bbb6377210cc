"""Digests the workflow and its callers must compute identically.

- The arguments digest names exactly the tool call a person approves.
- The response digest recognises a repeated response without keeping a
  second copy of its answer.
- The policy digest proves a run applies the policies its worker registered.

The transcript digest lives with the rest of the transcript machinery, in
`durably._transcript.digest`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from durably.contract import AgentPin

__all__ = ["args_digest", "policy_digest", "response_digest"]


def args_digest(arguments: dict[str, Any]) -> str:
    """A hash of a tool call's canonical JSON arguments (sorted keys, no spaces)."""
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def response_digest(
    kind: str, approved: bool | None, reason: str | None, answer: str | None
) -> str:
    """A hash of a person's decision: the same response again has the same digest."""
    canonical = json.dumps([kind, approved, reason, answer], ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def policy_digest(pin: AgentPin) -> str:
    """A hash of what a pinned registration decides about what a run may do.

    The fingerprint, and what the workflow itself applies from the pin:
    turns, model retries, and per tool its recovery, retries, approval,
    question and signed-approval flags and output schema. Timeouts and
    continue-as-new thresholds are left out (tuning them needs no new
    version), and the fields are named here, so a field later added to the
    pin changes no digest of a run in flight.
    """
    data = {
        "fingerprint": pin.fingerprint,
        "max_turns": pin.max_turns,
        "model_retry": pin.model_retry.model_dump() if pin.model_retry else None,
        "tools": {
            name: {
                "recovery": t.recovery,
                "retry": t.retry.model_dump(),
                "requires_approval": t.requires_approval,
                "question": t.question,
                "signed_approval": t.signed_approval,
                "output_schema": t.output_schema,
                # Named only when set, so pins from before subagents keep their digest.
                **(
                    {"subagent": t.subagent.model_dump(exclude_defaults=True)} if t.subagent else {}
                ),
            }
            for name, t in pin.tools.items()
        },
    }
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:32]
