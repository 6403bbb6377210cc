"""`SessionMachine`: what a session decides, with no Temporal in it.

A session is one conversation with one agent: submissions, each a run, one
after another. The machine keeps the conversation (every closed run's own
messages, once, in order, with the running digest its next run proves what
it read with), the runs in submission order, and which submission runs next.
`agent_session.py` carries its decisions out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from durably._transcript import EMPTY_DIGEST, SHORT_DIGEST, extend_digest
from durably.contract import (
    CONTROL_CHARACTERS,
    MAX_NAME_CHARS,
    MAX_RUN_INPUT_BYTES,
    SNAPSHOT_INPUT_CHARS,
    ConversationRef,
    ErrorType,
    RunStatus,
    SessionCarried,
    SessionInput,
    SessionRun,
    SessionSnapshot,
    SubmitAccepted,
    SubmitRequest,
    TranscriptArchive,
)
from durably.messages import AssistantMessage, Message, ToolResultMessage
from durably.workflows._validation import rejection, short

__all__ = [
    "CONTINUE_AS_NEW_BYTES",
    "CONTINUE_AS_NEW_EVENTS",
    "HISTORY_ROOM",
    "MAX_QUEUED",
    "MAX_QUEUED_BYTES",
    "SessionMachine",
    "answered_every_call",
    "read_session_input",
]

# Submissions waiting behind the open run: a session is a conversation, not a job queue.
MAX_QUEUED = 100
# A session's history length at which it continues as new (between runs), by default.
CONTINUE_AS_NEW_EVENTS = 10_000
# And its history's size (what it spent restoring its conversation not counted): each
# large submission adds about three times its size (the update, the run's start, the
# run's transcript), and Temporal terminates a workflow at 50 MB.
CONTINUE_AS_NEW_BYTES = 10 * 2**20
# The queued submissions' text, which continue-as-new carries in one payload (Temporal
# refuses one over 2 MiB, and a session that cannot continue as new would loop): room
# for one submission of the largest size, or many small ones.
MAX_QUEUED_BYTES = 1536 * 2**10
# What a session's history may hold before it refuses submissions while a run is open
# (it continues as new only between runs): well under Temporal's 50 MB termination.
HISTORY_ROOM = 40 * 2**20
_SESSION_EXPECTED = '{"agent_id": "...", "version": null}'
_CLOSED = ("completed", "failed", "cancelled")
# What a run that failed reports when it runs again (retried, resolved, repaired).
_RUNS_AGAIN = (
    RunStatus.RUNNING,
    RunStatus.WAITING,
    RunStatus.RETRY_WAIT,
    RunStatus.NEEDS_ATTENTION,
)


def read_session_input(
    payload: tuple[object, ...], *, continued: bool
) -> tuple[SessionInput | None, str | None]:
    """The session's input, or None and what is wrong with it (`continued`: Temporal
    says this run continues the session, the only time `carried` is honoured)."""
    if len(payload) != 1 or not isinstance(payload[0], dict):
        return None, f"a session takes one input, a JSON object {_SESSION_EXPECTED}"
    if payload[0].get("carried") is not None and not continued:
        return None, (
            "the input sets `carried`, which only the session's own continue-as-new may "
            f"set; start a session with {_SESSION_EXPECTED}"
        )
    try:
        value = SessionInput.model_validate(payload[0])
    except ValueError as err:
        return None, f"the input must be a JSON object {_SESSION_EXPECTED} ({short(str(err))})"
    for what, text in (("agent_id", value.agent_id), ("version", value.version)):
        if text is None:
            continue
        if not text.strip() or len(text) > MAX_NAME_CHARS or CONTROL_CHARACTERS.search(text):
            return None, (
                f"{what} must be 1 to {MAX_NAME_CHARS} characters with no control "
                f"characters, got {short(text)}"
            )
    return value, None


def answered_every_call(messages: Sequence[Message], why: str) -> list[Message]:
    """`messages`, with an error result for each tool call of the last model answer that
    has none (a cancelled or failed run stopped there): OpenAI and Anthropic refuse a
    transcript in which a call has no result."""
    out = list(messages)
    results = 0
    for message in reversed(out):
        if isinstance(message, ToolResultMessage):
            results += 1
            continue
        if isinstance(message, AssistantMessage):
            answered = {
                m.call_id for m in out[len(out) - results :] if isinstance(m, ToolResultMessage)
            }
            for call in message.tool_calls:
                if call.call_id not in answered:
                    out.append(
                        ToolResultMessage(
                            call_id=call.call_id, tool=call.name, content=why, is_error=True
                        )
                    )
        break
    return out


class SessionMachine:
    """A session's state and every decision about it."""

    def __init__(
        self, session_id: str, start: SessionInput, problem: str | None, new_id: Callable[[], str]
    ) -> None:
        self.session_id = session_id
        self.agent_id = start.agent_id
        self.version = start.version
        self.error = problem
        self.runs: list[SessionRun] = []
        self.conversation: list[Message] = []
        self.digest = EMPTY_DIGEST
        self.closing = False
        self.continue_as_new_events = start.continue_as_new_events or CONTINUE_AS_NEW_EVENTS
        self.continue_as_new_bytes = start.continue_as_new_bytes or CONTINUE_AS_NEW_BYTES
        # The conversation a continued session has yet to copy in from its previous run.
        self.archive: TranscriptArchive | None = None
        self._new_id = new_id
        # Runs that have closed and whose messages the session is reading: they keep no
        # submission waiting (never carried: the session continues as new only after).
        self._ending: set[str] = set()
        if start.carried is not None:
            self.version = start.carried.version
            self.runs = start.carried.runs
            self.closing = start.carried.closing
            self.archive = start.carried.archive

    def refuse(self, problem: str) -> None:
        """The session's start was refused after all: failed, holding nothing it carried."""
        self.error = problem
        self.runs, self.archive, self.closing = [], None, False

    # -- continue-as-new (between runs only) ------------------------------------------

    def carry(self, temporal_run_id: str) -> SessionInput:
        """The next run's input: the conversation stays here, by reference."""
        runs = [
            r if r.status == "queued" else r.model_copy(update={"input": ""}) for r in self.runs
        ]
        archive = TranscriptArchive(
            run_id=temporal_run_id,
            length=len(self.conversation),
            digest=self.digest,
            # A worker whose cache holds the conversation under the session's id
            # (the last run's final answer left it there) restores without a query.
            base_length=len(self.conversation),
            new=[],
        )
        return SessionInput(
            agent_id=self.agent_id,
            continue_as_new_events=self.continue_as_new_events,
            continue_as_new_bytes=self.continue_as_new_bytes,
            carried=SessionCarried(
                version=self.version, runs=runs, archive=archive, closing=self.closing
            ),
        )

    def restored(self, page: Sequence[Message]) -> None:
        """A page of the conversation copied in from the previous run."""
        for message in page:
            self.conversation.append(message)
            self.digest = extend_digest(self.digest, message)

    def restore_done(self) -> None:
        archive = self.archive
        assert archive is not None
        if len(self.conversation) != archive.length or self.digest != archive.digest:
            raise RuntimeError(  # fails the task (it retries), never the session
                f"the conversation restored from run {archive.run_id!r} does not match what "
                "it left; this is a bug in durably, please report it"
            )
        self.archive = None

    # -- submissions ----------------------------------------------------------------

    def check_submit(self, request: SubmitRequest) -> None:
        """Raise why the session refuses `request` now (validators call this)."""
        if self.error is not None:
            raise rejection(
                ErrorType.DURABLE_CONFLICT, f"session {self.session_id!r} failed: {self.error}"
            )
        if self.closing:
            raise rejection(
                ErrorType.DURABLE_CONFLICT,
                f"session {self.session_id!r} is closing; start a new session to go on",
            )
        size = len(request.input.encode("utf-8", "surrogatepass"))
        if not request.input.strip() or size > MAX_RUN_INPUT_BYTES:
            raise rejection(
                ErrorType.INVALID_RUN_INPUT,
                f"a submission's input must be 1 to {MAX_RUN_INPUT_BYTES:,} bytes of text, "
                f"got {size:,}",
            )
        busy = self.busy()
        if busy is not None and request.if_busy == "reject":
            raise rejection(
                ErrorType.DURABLE_CONFLICT,
                f"session {self.session_id!r} is busy: run {busy.run_id!r} is still "
                f"{'queued' if busy.status == 'queued' else 'open'} (its snapshot says whether "
                "it runs, waits for a person or needs attention). Submit with "
                "if_busy='enqueue' (`durably send --if-busy enqueue`) to run after it, "
                "'interrupt' to cancel it, or wait",
            )
        if sum(r.status == "queued" for r in self.runs) >= MAX_QUEUED:
            raise rejection(
                ErrorType.DURABLE_CONFLICT,
                f"session {self.session_id!r} already has {MAX_QUEUED} submissions queued; "
                "wait for some to run",
            )

    def check_room(self, request: SubmitRequest, history_bytes: int) -> None:
        """Raise if accepting `request` now could take the session where it cannot go on:
        its queue past what continue-as-new carries, or its history, while a run is
        open, toward Temporal's limit. Only validators call this: a submission accepted
        before these bounds existed must still be taken when replayed."""
        size = len(request.input.encode("utf-8", "surrogatepass"))
        busy = self.busy()
        if busy is None:
            return
        queued = sum(len(r.input.encode("utf-8", "surrogatepass")) for r in self._queued())
        if queued + size > MAX_QUEUED_BYTES:
            raise rejection(
                ErrorType.DURABLE_CONFLICT,
                f"session {self.session_id!r} already holds {queued:,} bytes of queued "
                f"submissions; with this one ({size:,} bytes) that is more than the "
                f"{MAX_QUEUED_BYTES:,} a session carries while run {busy.run_id!r} is not "
                "done. Wait for the queue to run, or submit less (put a large document where "
                "the agent's tools can read it, and submit where it is)",
            )
        if history_bytes + 3 * size > HISTORY_ROOM:
            raise rejection(
                ErrorType.DURABLE_CONFLICT,
                f"session {self.session_id!r} has a history of {history_bytes / 2**20:.1f} MiB "
                f"while run {busy.run_id!r} is not done, and continues as new only between "
                "runs: this submission could take it to Temporal's history limit. Submit "
                "again once that run has closed",
            )

    def _queued(self) -> list[SessionRun]:
        return [r for r in self.runs if r.status == "queued"]

    def submit(self, request: SubmitRequest) -> SubmitAccepted:
        """Queue a submission (checked already); its run starts when it is first in line.
        `interrupt` marks the open run for cancelling."""
        self.check_submit(request)
        busy = self.busy()
        if request.if_busy == "interrupt" and busy is not None and busy.status == "open":
            busy.interrupt = True  # it ends now: the new run waits only for runs queued
            busy = next((r for r in self.runs if r.status == "queued"), None)
        # Queued: behind a run that may take long (a person's answer, say); otherwise the
        # run starts as soon as the runs ending now (failed, interrupted) have closed.
        queued = busy is not None
        run = SessionRun(
            run_id=f"{self.session_id}-{len(self.runs) + 1}-{self._new_id()}",
            status="queued",
            input=request.input,
            upgrade=request.upgrade,
        )
        self.runs.append(run)
        return SubmitAccepted(run_id=run.run_id, queued=queued)

    def busy(self) -> SessionRun | None:
        """The run a new submission would wait for: the first not yet closed (open or
        queued), unless it is an open run that failed (a failed run does not block) or
        that has closed and is being read."""
        run = self._first_unclosed()
        passing = (
            run is not None
            and run.status == "open"
            and (run.reported == RunStatus.FAILED or run.run_id in self._ending)
        )
        if passing:
            return next((r for r in self.runs if r.status == "queued"), None)
        return run

    def next_run(self) -> SessionRun | None:
        """The queued run to start now: the first not closed, if it is still queued."""
        run = self._first_unclosed()
        return run if run is not None and run.status == "queued" else None

    def must_end(self, run: SessionRun) -> bool:
        """Whether the open `run` must end now: a submission asked to interrupt it, or it
        failed and a later submission is waiting (that submission advances the session,
        and the failed run can no longer be retried)."""
        if run.status != "open":
            return False
        later = any(r.status == "queued" for r in self.runs)
        return run.interrupt or (run.reported == RunStatus.FAILED and later)

    def reported(self, run_id: str, status: RunStatus) -> SessionRun | None:
        """A run of this session said how it is (`run_status`); None if it is not ours."""
        run = next((r for r in self.runs if r.run_id == run_id and r.status == "open"), None)
        if run is not None:
            run.reported = status
        return run

    def waits_behind(self, run_id: str) -> bool:
        """Whether queued run `run_id` now waits behind another run: one it passed because
        it had failed, which runs again (not one that is ending, cancelled or interrupted)."""
        busy = self.busy()
        return (
            busy is not None
            and busy.run_id != run_id
            and busy.status == "open"
            and busy.reported in _RUNS_AGAIN  # said it failed, then that it runs again
            and not busy.interrupt
        )

    def is_open(self, run_id: str) -> bool:
        """Whether `run_id` is a run of this session that is open."""
        return any(r.run_id == run_id and r.status == "open" for r in self.runs)

    def _first_unclosed(self) -> SessionRun | None:
        return next((r for r in self.runs if r.status not in _CLOSED), None)

    def finished(self) -> bool:
        """Closed, or refused at the start, with nothing left to run."""
        return (self.closing or self.error is not None) and self.busy() is None

    # -- a run's life ---------------------------------------------------------------

    def prefix(self) -> ConversationRef:
        """What the next run reads before its own messages (nothing, for the first)."""
        return ConversationRef(
            session_id=self.session_id,
            length=len(self.conversation),
            digest=self.digest[:SHORT_DIGEST],
        )

    def started(self, run: SessionRun) -> None:
        run.status = "open"
        run.offset = len(self.conversation)

    def ending(self, run: SessionRun) -> None:
        """The run has closed; its messages are being read (and a submission need not
        wait for that: it starts right after)."""
        self._ending.add(run.run_id)

    def closed(
        self, run: SessionRun, status: str, messages: Sequence[Message], version: str | None
    ) -> None:
        """A run closed: its committed messages join the conversation, once (a call it
        left without a result gets one saying so, as every provider requires)."""
        assert status in _CLOSED
        self._ending.discard(run.run_id)
        run.status = status  # type: ignore[assignment]
        messages = answered_every_call(messages, f"not run: run {run.run_id} was {status}")
        run.length = len(messages)
        for message in messages:
            self.conversation.append(message)
            self.digest = extend_digest(self.digest, message)
        if version is not None and (self.version is None or run.upgrade):
            self.version = version  # the session keeps what its first (or an upgrading) run pinned

    def version_for(self, run: SessionRun) -> str | None:
        """The version `run` starts with: the session's, or the newest when it upgrades."""
        return None if run.upgrade else self.version

    def close(self) -> SessionSnapshot:
        if self.error is not None:
            raise rejection(
                ErrorType.DURABLE_CONFLICT, f"session {self.session_id!r} failed: {self.error}"
            )
        self.closing = True
        return self.snapshot()

    def _failed(self) -> Exception:
        return rejection(
            ErrorType.DURABLE_CONFLICT, f"session {self.session_id!r} failed: {self.error}"
        )

    def snapshot(self) -> SessionSnapshot:
        return SessionSnapshot(
            session_id=self.session_id,
            agent_id=self.agent_id,
            version=self.version,
            runs=[_shown(r) for r in self.runs],
            messages=len(self.conversation),
            closing=self.closing,
            error=self.error,
        )


def _shown(run: SessionRun) -> SessionRun:
    """`run` as a snapshot shows it: a long input cut to its start, with its whole size
    (a session's snapshot of 1 MB submissions passed Temporal's 2 MB and every read of it
    failed with a raw gRPC error)."""
    if len(run.input) <= SNAPSHOT_INPUT_CHARS:
        return run.model_copy()
    size = len(run.input.encode("utf-8", "surrogatepass"))
    return run.model_copy(update={"input": run.input[:SNAPSHOT_INPUT_CHARS], "input_bytes": size})
