"""What a run carries into the next run of its chain when it continues as new.

The failure this prevents: a long run's state includes its whole transcript,
and carrying it in the continue-as-new input would copy it into history
again on every continuation (and past one payload's 2 MiB, Temporal refuses
it). The transcript stays in the previous run's history instead; the new run
copies it back page by page (`TranscriptArchive`), and what the state
carries besides is bounded however long the run. Pure: no Temporal here.
"""

from __future__ import annotations

from typing import Any

from durably._transcript import encoded_size
from durably.contract import (
    Attention,
    Interaction,
    MessageRef,
    RespondAccepted,
    RunInput,
    RunState,
    TranscriptArchive,
)
from durably.tools import render_result
from durably.workflows._machine import INLINE_LIMIT, RunMachine

__all__ = ["carried"]

# A run copies its predecessor's transcript into its own history; past this
# size, that copy plus a run's own growth would near Temporal's 50 MB
# history limit (and no model reads that much at once).
MAX_CARRIED_TRANSCRIPT = 32 * 2**20
# What else continue-as-new carries, bounded: the answers a repeated response
# can still match (older repeats are rejected as unknown; the answers
# themselves stay in the transcript), and inline messages of the last turn.
_ANSWERS_CARRIED = 100
_ANSWERS_CARRIED_BYTES = 256 * 2**10
_DELTA_CARRIED = 64 * 2**10
# What continue-as-new may carry in all (one payload; Temporal refuses 2 MiB).
_MAX_CARRIED_STATE = 1536 * 2**10


def carried(m: RunMachine, current_run_id: str) -> tuple[RunInput | None, str | None]:
    """The input of the next run of the chain, or None and why the run cannot continue.

    `current_run_id` is this run's Temporal run id, where the next run reads
    the transcript back from.
    """
    s = m.s
    size = sum(encoded_size(message) for message in s.transcript)
    if size > MAX_CARRIED_TRANSCRIPT:
        return None, (
            f"the transcript has grown to {size / 2**20:.1f} MiB, more than a run can carry "
            f"past continue-as-new ({MAX_CARRIED_TRANSCRIPT // 2**20} MiB) within Temporal's "
            "history limit, and more than a model reads at once; cancel this run and start a "
            "new one from a summary of it, or have the agent's tools return less"
        )
    # The input travels once: in the transcript once the run has pinned.
    text = s.input if not m.hardened or s.pin is None else ""
    next_input = RunInput(agent_id=s.agent_id, input=text, carried=_archived(m, current_run_id))
    if m.hardened:
        size = len(next_input.model_dump_json())  # once per continue-as-new
        if size > _MAX_CARRIED_STATE:
            return None, (
                f"the state this run would carry past continue-as-new is {size:,} bytes, "
                f"more than one payload may hold ({_MAX_CARRIED_STATE:,}); this is a bug "
                "in durably, please report it, and cancel the run"
            )
    return next_input, None


def _archived(m: RunMachine, current_run_id: str) -> RunState:
    """The state to continue as new with, of a bounded size however long the run.

    The transcript stays in this run's history; the run's input travels
    once; only the latest answers are carried.
    """
    s = m.s
    # Nothing large carried twice: a waiting or blocked call's large arguments are
    # taken from the transcript again after the restore (the snapshot shows them
    # empty until then).
    unfinished = m.unfinished_calls()
    lean: dict[str, Any] = {
        "answered": _latest_answers(s.answered),
        "outcome": None,
        "call_errors": {
            c.call_id: s.call_errors[c.call_id] for c in unfinished if c.call_id in s.call_errors
        },
    }
    if s.interaction is not None:
        lean["interaction"] = _lean_interaction(s.interaction)
    lean["interactions"] = [_lean_interaction(i) for i in s.interactions]
    if s.attention is not None:
        lean["attention"] = _lean_attention(s.attention)
    # A held result goes to the model inline: its reference names this run's history.
    lean["held"] = [h.model_copy(update={"ref": None}) for h in s.held]
    lean["parked"] = [
        p.model_copy(update={"attention": _lean_attention(p.attention)}) if p.attention else p
        for p in s.parked
    ]
    if not s.transcript:  # nothing to restore (parked before the pin)
        return s.model_copy(update={**lean, "input": ""})
    base_length, new = s.sent_length, m.unsent()
    if sum(encoded_size(x) for x in new if not isinstance(x, MessageRef)) > _DELTA_CARRIED:
        # Long answers since the last request: restore by query, not from a cache.
        base_length, new = len(s.transcript), []
    archive = TranscriptArchive(
        run_id=current_run_id,
        length=len(s.transcript),
        digest=s.digest,
        base_length=base_length,
        new=new,
    )
    # The restored transcript is whole: the next request sends only what follows it.
    return s.model_copy(
        update={
            "input": "",
            "transcript": [],
            "archive": archive,
            "sent_length": len(s.transcript),
            "refs": {},
            **lean,
        }
    )


def _lean_interaction(interaction: Interaction) -> Interaction:
    if not _large(interaction.args):
        return interaction
    return interaction.model_copy(update={"args": {}, "question": None})


def _lean_attention(attention: Attention) -> Attention:
    if not _large(attention.detail.get("args")):
        return attention
    detail = {k: v for k, v in attention.detail.items() if k != "args"}
    return attention.model_copy(update={"detail": detail})


def _large(value: Any) -> bool:
    """Too large to carry past continue-as-new beside the transcript that holds it too."""
    return value is not None and len(render_result(value)) > INLINE_LIMIT


def _latest_answers(answered: dict[str, RespondAccepted]) -> dict[str, RespondAccepted]:
    """The newest accepted responses that fit what continue-as-new carries."""
    kept: list[tuple[str, RespondAccepted]] = []
    size = 0
    for iid, accepted in reversed(answered.items()):
        size += len(accepted.model_dump_json())
        if len(kept) == _ANSWERS_CARRIED or size > _ANSWERS_CARRIED_BYTES:
            break
        kept.append((iid, accepted))
    return dict(reversed(kept))
