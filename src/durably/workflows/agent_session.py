"""`AgentSessionWorkflow`: one conversation with one agent, each submission a run.

Handlers:
    update ``submit(SubmitRequest)`` -> SubmitAccepted: the next user message; its
        run starts (as this workflow's child) once the runs before it closed.
        `if_busy="reject"` (the default) refuses it while a run is open.
    update ``close(CloseRequest)`` -> SessionSnapshot: end once the runs are done.
    query ``snapshot`` -> SessionSnapshot.
    query ``transcript(offset, limit=None)`` -> TranscriptPage: the conversation,
        for the model activity of the session's next run when its cache misses.

Where the conversation lives (SPEC section 13): here, once. When a run
closes, this workflow reads that run's own messages (an activity querying
the closed run, paged under the payload limit) and keeps them; the next
run gets a `ConversationRef` (length and digest), never a copy, and only
its model activity reads the messages (the worker's cache, else this
workflow's `transcript` query). So a submission adds its own messages to
history twice (in its run, and once here) however long the conversation
is, and the conversation outlives its runs' histories (namespace
retention deletes closed runs; this workflow is open).

Each run is a child with parent-close policy REQUEST_CANCEL: ending the
session cancels its open run. A run honours the session's reference only
because Temporal says this workflow is its parent.
"""

from __future__ import annotations

import asyncio
from typing import Any, NoReturn

from temporalio import workflow
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, ChildWorkflowError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from durably._text import md_code, md_text
    from durably._transcript import transcript_page
    from durably.contract import (
        SA_AGENT,
        SA_SESSION,
        SA_STATUS,
        SESSION_WORKFLOW_TYPE,
        WORKFLOW_TYPE,
        CloseRequest,
        ErrorType,
        Handler,
        RunInput,
        RunResult,
        RunStatus,
        RunStatusNote,
        RunTranscriptRequest,
        SessionEventType,
        SessionHandler,
        SessionInput,
        SessionLiveEvent,
        SessionRun,
        SessionSnapshot,
        SubmitAccepted,
        SubmitRequest,
        TranscriptPage,
    )
    from durably.messages import Message
    from durably.workflows._activities import (
        confirm_status,
        restore_page,
        run_transcript,
        verify_origin,
    )
    from durably.workflows._handler_input import refusals
    from durably.workflows._live import LiveEvents
    from durably.workflows._run_input import (
        decode_arguments,
        missing_key,
        one_raw_argument,
        sender_check,
        waits_for_key,
    )
    from durably.workflows._session_machine import SessionMachine, read_session_input
    from durably.workflows._validation import Rejected, admit_request, parse_request

__all__ = ["AgentSessionWorkflow"]


# What changed since sessions began (issue 27): a session continues as new (between runs)
# when its history reaches `continue_as_new_bytes` (10 MiB), not only on events. Checked when
# the size alone would continue it, or before a status note's local activity.
PATCH_SESSION_SIZE = "durably-session-continues-on-size"
# Next: a continued session has its worker confirm that the run it continues is a durably
# session on its task queue before it honours what that run carried (a caller's own
# workflow could continue as new into `AgentSessionWorkflow` with a forged conversation).
# Checked only in continued sessions.
PATCH_SESSION_ORIGIN = "durably-session-origin-confirmed"
# Next: a submission accepted past a failed run answers `queued` once that run runs again
# (its retry raced the submission) instead of waiting for it to end. Checked in such a submit.
PATCH_SUBMIT_REQUEUED = "durably-session-submit-requeued"
# Next: a run's status note is a prompt to read the run's status from the server, not a
# claim (anyone may signal). Checked when a note about the open run arrives.
PATCH_SESSION_NOTES = "durably-session-notes-confirmed"


@workflow.defn(name=SESSION_WORKFLOW_TYPE, sandboxed=False)
class AgentSessionWorkflow:
    """One conversation (see the module docstring for handlers)."""

    @workflow.init
    @one_raw_argument
    def __init__(self, *payload: Any) -> None:
        info = workflow.info()
        # Carried state a worker cannot decrypt for want of a key: once its origin is
        # confirmed, every task fails until the key is back (SPEC section 18), rather
        # than the session losing its runs.
        sealed = missing_key(payload)
        self._missing_key = sealed if sealed is not None and waits_for_key(info) else None
        values, problem = decode_arguments(payload)
        if problem is None:
            start, problem = read_session_input(values, continued=bool(info.continued_run_id))
        else:
            start = None
        if start is None:
            start = SessionInput(agent_id="")
        self._m = SessionMachine(
            info.workflow_id, start, problem, new_id=lambda: workflow.uuid4().hex[:8]
        )
        self._continuing = False
        # The history's size once the conversation was restored: not counted toward
        # continuing as new (else a long conversation would continue after every run).
        self._base_bytes = 0
        # Runs whose status the worker is reading (`run_status`): whether another note
        # came meanwhile.
        self._confirming: dict[str, bool] = {}
        self._sized: bool | None = None  # see `_size_patch`
        # Followers read these by query; nothing here is recorded (see `_live`).
        self._live = LiveEvents(start.carried.stream_offset if start.carried else 0)

    @workflow.run
    @one_raw_argument
    async def run(self, *payload: Any) -> SessionSnapshot:
        m = self._m
        await self._confirm_origin()
        if m.error is not None:
            raise ApplicationError(
                f"durably refused this session's input: {m.error}",
                type=ErrorType.INVALID_RUN_INPUT.value,
                non_retryable=True,
            )
        if m.archive is not None:
            await self._restore()
        self._base_bytes = workflow.info().get_current_history_size()
        while True:
            self._details()
            await workflow.wait_condition(lambda: m.next_run() is not None or m.finished())
            run = m.next_run()
            if run is None:
                await workflow.wait_condition(workflow.all_handlers_finished)
                self._event("closed")
                self._live.detach()
                return m.snapshot()
            await self._run(run)
            if self._history_full():
                await self._continue_as_new()

    async def _confirm_origin(self) -> None:
        """A continued session honours what it carried (its runs, its conversation) only
        once its worker has confirmed the run it continues is a durably session on this
        task queue (`durably.activities._origin`), and waits for a missing key only then."""
        info = workflow.info()
        if self._missing_key is not None and workflow.unsafe.is_replaying():
            raise self._missing_key
        if not info.continued_run_id or not workflow.patched(PATCH_SESSION_ORIGIN):
            if self._missing_key is not None:
                raise self._missing_key
            return
        check = sender_check(info)
        assert check is not None
        problem = await verify_origin(check)
        if problem:
            self._m.refuse(problem)
        elif self._missing_key is not None:
            raise self._missing_key

    def _history_full(self) -> bool:
        """Time to continue as new (between runs): by events, or by bytes since the
        conversation was restored (`PATCH_SESSION_SIZE`: sessions recorded before it
        continued on events alone, and must replay so)."""
        info = workflow.info()
        if info.get_current_history_length() >= self._m.continue_as_new_events:
            return True
        full = info.get_current_history_size() - self._base_bytes >= self._m.continue_as_new_bytes
        return full and self._size_patch()

    def _size_patch(self) -> bool:
        """`PATCH_SESSION_SIZE`, decided once: before a status note's local activity too
        (a patch marker after a local activity's, in the same workflow task, does not
        replay)."""
        if self._sized is None:
            self._sized = workflow.patched(PATCH_SESSION_SIZE)
        return self._sized

    async def _continue_as_new(self) -> NoReturn:
        """Continue as new between runs (never while a run is open: Temporal would apply
        its parent-close policy, and the new session run would not own it)."""
        self._continuing = True  # a submit waiting for its run to start returns `queued`
        await workflow.wait_condition(workflow.all_handlers_finished)
        self._event("continued_as_new")
        self._live.detach()
        carried = self._m.carry(workflow.info().run_id)
        if carried.carried is not None:
            carried.carried.stream_offset = self._live.next_offset
        workflow.continue_as_new(carried.model_dump(mode="json", exclude_none=True))

    async def _restore(self) -> None:
        """Copy the conversation the previous run of the session kept, page by page."""
        m = self._m
        archive = m.archive
        assert archive is not None
        workflow.set_current_details(
            f"Restoring the conversation ({archive.length} messages) from the previous run "
            f"{md_code(archive.run_id)}"
        )
        while len(m.conversation) < archive.length:
            page = await restore_page(archive, len(m.conversation), hardened=True)
            m.restored(page.messages)
        m.restore_done()

    async def _run(self, run: SessionRun) -> None:
        """Start one submission's run, wait for it to close, keep its messages."""
        m = self._m
        info = workflow.info()
        handle = await workflow.start_child_workflow(
            WORKFLOW_TYPE,
            RunInput(
                agent_id=m.agent_id,
                input=run.input,
                version=m.version_for(run),
                session=m.prefix(),
            ).model_dump(mode="json", exclude_none=True),
            id=run.run_id,
            task_queue=info.task_queue,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            parent_close_policy=workflow.ParentClosePolicy.REQUEST_CANCEL,
            search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(SA_STATUS, RunStatus.RUNNING.value),
                    SearchAttributePair(SA_AGENT, m.agent_id),
                    SearchAttributePair(SA_SESSION, m.session_id),
                ]
            ),
            static_summary=f"{m.agent_id}: {md_text(run.input[:120])}",
        )
        m.started(run)
        self._event("run_started", run.run_id)
        self._details()
        await workflow.wait_condition(lambda: handle.done() or m.must_end(run))
        if not handle.done():
            if run.interrupt:
                handle.cancel()  # the run's running tool sees its abort signal
            else:  # failed, and a later submission waits: it will not be retried
                await handle.signal(Handler.SESSION_ADVANCED)
        version: str | None = None
        try:
            raw = await handle
            version = RunResult.model_validate(raw).agent_version
            status = "completed"
        except ChildWorkflowError as err:
            status = "cancelled" if is_cancelled_exception(err) else "failed"
        except asyncio.CancelledError:
            if not run.interrupt:
                raise  # the session itself is cancelled
            status = "cancelled"
        m.ending(run)
        m.closed(run, status, await self._messages_of(run.run_id), version)
        self._event("run_closed", run.run_id, status)

    async def _messages_of(self, run_id: str) -> list[Message]:
        """The closed run's own transcript, page by page."""
        messages: list[Message] = []
        while True:
            page = await run_transcript(RunTranscriptRequest(run_id=run_id, offset=len(messages)))
            messages.extend(page.messages)
            if len(messages) >= page.total or not page.messages:
                return messages

    def _details(self) -> None:
        m = self._m
        open_run = m.busy()
        if open_run is not None and open_run.status == "open":
            text = f"Running {md_code(open_run.run_id)} (submission {len(m.runs)})"
        else:
            text = (
                f"Waiting for the next submission ({len(m.runs)} so far, "
                f"{len(m.conversation)} messages)"
            )
        workflow.set_current_details(text)

    # -- handlers ------------------------------------------------------------------

    @workflow.update(name=SessionHandler.SUBMIT)
    async def submit(self, *payload: Any) -> SubmitAccepted:
        with refusals():
            accepted = self._m.submit(parse_request(SubmitRequest, payload, SessionHandler.SUBMIT))
        self._event("submitted", accepted.run_id, "queued" if accepted.queued else None)
        if not accepted.queued:  # answer once its run exists, so a handle on it works at once
            # Or once it waits behind a run after all: the failed run it passed was retried
            # (the retry raced this submission) and runs again.
            requeue = workflow.patched(PATCH_SUBMIT_REQUEUED)
            await workflow.wait_condition(
                lambda: (
                    self._is_started(accepted.run_id)
                    or self._continuing
                    or (requeue and self._m.waits_behind(accepted.run_id))
                )
            )
            if not self._is_started(accepted.run_id):  # the next session run starts it
                return accepted.model_copy(update={"queued": True})
        return accepted

    @submit.validator
    def _validate_submit(self, *payload: Any) -> None:
        with refusals():
            request = admit_request(SubmitRequest, payload, SessionHandler.SUBMIT)
            self._m.check_submit(request)
            self._m.check_room(request, workflow.info().get_current_history_size())

    @workflow.update(name=SessionHandler.CLOSE)
    def close(self, *payload: Any) -> SessionSnapshot:
        with refusals():
            parse_request(CloseRequest, payload, SessionHandler.CLOSE)
            return self._m.close()

    @close.validator
    def _validate_close(self, *payload: Any) -> None:
        with refusals():
            admit_request(CloseRequest, payload, SessionHandler.CLOSE)

    @workflow.signal(name=SessionHandler.RUN_STATUS)
    async def run_status(self, *payload: Any) -> None:
        """A run of this session says it failed (or runs again): a failed run does not
        keep later submissions waiting. A note about a run that is not this session's
        open run changes nothing; one about it is a prompt to read the run's status from
        the server (`PATCH_SESSION_NOTES`), since anyone may send a signal: a forged
        "failed" made `submit(if_busy="reject")` queue behind a healthy run."""
        try:
            note = parse_request(RunStatusNote, payload, SessionHandler.RUN_STATUS)
        except Rejected:
            return
        if not self._m.is_open(note.run_id):
            return
        if not workflow.patched(PATCH_SESSION_NOTES):
            self._m.reported(note.run_id, note.status)
            return
        if note.run_id in self._confirming:
            self._confirming[note.run_id] = True  # read again once the read in flight is back
            return
        self._confirming[note.run_id] = False
        self._size_patch()
        try:
            while True:
                status = await confirm_status(note.run_id)
                if status in RunStatus._value2member_map_:
                    self._m.reported(note.run_id, RunStatus(status))
                if not self._confirming[note.run_id]:
                    return
                self._confirming[note.run_id] = False
        finally:
            del self._confirming[note.run_id]

    @workflow.query(name=SessionHandler.SNAPSHOT)
    def snapshot(self) -> SessionSnapshot:
        return self._m.snapshot()

    @workflow.query(name=SessionHandler.TRANSCRIPT)
    def transcript(self, offset: int, limit: int | None = None) -> TranscriptPage:
        return transcript_page(self._m.conversation, offset, limit)

    def _event(
        self, type: SessionEventType, run_id: str | None = None, status: str | None = None
    ) -> None:
        self._live.publish(
            SessionLiveEvent(
                session_id=self._m.session_id,
                at=workflow.now(),
                type=type,
                run_id=run_id,
                status=status,
            )
        )

    def _is_started(self, run_id: str) -> bool:
        return any(r.run_id == run_id and r.status != "queued" for r in self._m.runs)
