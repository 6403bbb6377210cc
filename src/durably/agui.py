"""AG-UI (the Agent-User Interaction protocol) over durably's sessions and runs.

`POST /agents/{agent_id}/agui` on `durably.web` takes AG-UI's `RunAgentInput`
and answers with its event stream (Server-Sent Events). The mapping:

- **thread = session.** `threadId` names a durably session with the agent
  (started on first use); the conversation's truth is the session's, so of
  the client's `messages` only the last user message is read, as the new
  submission. Everything earlier the session already holds.
- **An AG-UI run = one submission, or one resume segment.** With no
  `resume`, the last user message is submitted to the session; the stream
  follows that durably run. With `resume`, each entry answers the durably
  interaction its `interruptId` names, all in one `respond_many` (all or
  none; `status: "cancelled"` is a denial), and the stream follows the same
  durably run from where it stopped.
- **Events.** `RUN_STARTED` first; the model's text as `TEXT_MESSAGE_*` as it
  is written (a preview: the committed answer ends each message); each tool
  call of a committed answer as `TOOL_CALL_START/ARGS/END`. A durably run
  that waits for a person ends the AG-UI run with `RUN_FINISHED` and an
  `interrupt` outcome listing every pending interaction (`id` = the
  interaction id, `toolCallId`, `reason` "tool_approval" or "question");
  `completed` ends it with `success` (the output as `result`), `cancelled`
  with `cancelled`, and `failed` or `needs_attention` with `RUN_ERROR`
  naming the run and the reason (an operator decides; the run stays open).
- **Resume payloads.** An approval: `{"approved": true|false, "reason"?: "..."}`
  (or a bare boolean); a question: `{"answer": "..."}` (or a bare string).
  Every response records the caller's token name as its responder.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from ag_ui.core import (
    EventType,
    Interrupt,
    ResumeEntry,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallStartEvent,
)
from ag_ui.core.events import (
    BaseEvent,
    RunFinishedCancelledOutcome,
    RunFinishedInterruptOutcome,
    RunFinishedSuccessOutcome,
)

from durably._query_guard import ask
from durably.client import DurableClient, RunHandle
from durably.contract import Interaction, LiveEvent, LiveItem, LiveText
from durably.errors import DurablyError, RunNotFoundError

__all__ = ["AguiError", "agui_events"]

# Between a subagent run's id and its interaction's, in an interrupt's id.
_CHILD = "#"

_OFFSET_QUERY = "__temporal_workflow_stream_offset"
_MAX_ID = 200


class AguiError(DurablyError):
    """A `RunAgentInput` durably cannot act on (said in a `RUN_ERROR`)."""


async def agui_events(
    client: DurableClient, agent_id: str, payload: Any, responder: str
) -> AsyncIterator[BaseEvent]:
    """The AG-UI events answering one `RunAgentInput` (see the module docstring)."""
    inp = RunAgentInput.model_validate(payload)
    yield RunStartedEvent(
        type=EventType.RUN_STARTED,
        thread_id=inp.thread_id,
        run_id=inp.run_id,
        timestamp=_now(),
    )
    try:
        run, after = await _segment(client, agent_id, inp, responder)
        async for event in _translate(client, run, after, inp):
            yield event
    except (DurablyError, ValueError) as err:
        yield RunErrorEvent(
            type=EventType.RUN_ERROR,
            message=str(err)[:2000],
            code=type(err).__name__,
            timestamp=_now(),
        )


async def _segment(
    client: DurableClient, agent_id: str, inp: RunAgentInput, responder: str
) -> tuple[RunHandle, int | None]:
    """The durably run this AG-UI run follows, and the offset to follow it after."""
    if len(inp.thread_id) > _MAX_ID or not inp.thread_id.strip():
        raise AguiError(f"threadId must be 1 to {_MAX_ID} characters")
    try:
        session = await client.get_session(inp.thread_id)
    except RunNotFoundError:
        if inp.resume:
            raise AguiError(f"thread {inp.thread_id!r} has no run to resume") from None
        session = await client.start_session(agent_id, session_id=inp.thread_id)
    else:  # the URL names the agent: a thread of another agent's is not this one's
        owner = (await session.snapshot()).agent_id
        if owner != agent_id:
            raise AguiError(
                f"thread {inp.thread_id!r} is a conversation with agent {owner!r}, not "
                f"{agent_id!r}: post it to /agents/{owner}/agui, or start a new thread"
            )
    if inp.resume:
        run = await _waiting_run(client, session.session_id)
        handle = client.temporal.get_workflow_handle(run.run_id)
        next_offset = await ask(handle, _OFFSET_QUERY, result_type=int)
        own = [e for e in inp.resume if _CHILD not in e.interrupt_id]
        if own:
            await run.respond_many(_responses(await run.pending(), own), responder=responder)
        await _resume_children(
            client, run, [e for e in inp.resume if _CHILD in e.interrupt_id], responder
        )
        return run, next_offset - 1
    text = _last_user_text(inp)
    return await session.submit(text), None


async def _resume_children(
    client: DurableClient, run: RunHandle, entries: list[ResumeEntry], responder: str
) -> None:
    """Answer the interrupts of `run`'s subagent runs (`{child run}#{interaction}`); only
    a child of `run` is answered, whatever an id names."""
    by_child: dict[str, list[ResumeEntry]] = {}
    for entry in entries:
        child_id, _, interaction_id = entry.interrupt_id.rpartition(_CHILD)
        by_child.setdefault(child_id, []).append(
            entry.model_copy(update={"interrupt_id": interaction_id})
        )
    children = {c.run_id for c in (await run.snapshot()).children}
    for child_id, own in by_child.items():
        if child_id not in children:
            raise AguiError(f"{child_id[:200]!r} is not a subagent run of this thread's run")
        child = await client.get_run(child_id)
        await child.respond_many(_responses(await child.pending(), own), responder=responder)


async def _waiting_run(client: DurableClient, session_id: str) -> RunHandle:
    session = await client.get_session(session_id)
    runs = (await session.snapshot()).runs
    open_runs = [r for r in runs if r.status == "open"]
    if not open_runs:
        raise AguiError(f"thread {session_id!r} waits for nothing: there is nothing to resume")
    return await client.get_run(open_runs[-1].run_id)


def _responses(pending: list[Interaction], entries: list[ResumeEntry]) -> dict[str, Any]:
    """Each resume entry as the durably response to its interaction."""
    by_id = {i.id: i for i in pending}
    responses: dict[str, Any] = {}
    for entry in entries:
        interaction = by_id.get(entry.interrupt_id)
        if interaction is None:
            now = ", ".join(by_id) or "none"
            raise AguiError(
                f"interrupt {entry.interrupt_id!r} is not pending (pending: {now}); nothing "
                "was answered"
            )
        responses[interaction.id] = _response(interaction, entry)
    return responses


def _response(interaction: Interaction, entry: ResumeEntry) -> dict[str, Any]:
    payload = entry.payload
    if interaction.type == "question":
        answer = payload.get("answer") if isinstance(payload, dict) else payload
        if entry.status == "cancelled" or not isinstance(answer, str):
            raise AguiError(
                f"interrupt {interaction.id!r} is a question: resolve it with "
                '{"answer": "..."} (a question cannot be cancelled; answer it)'
            )
        return {"type": "question", "answer": answer}
    if entry.status == "cancelled":
        return {
            "type": "tool-approval",
            "approved": False,
            "reason": "cancelled by the user",
            "args_digest": interaction.args_digest,
        }
    approved = payload.get("approved") if isinstance(payload, dict) else payload
    if not isinstance(approved, bool):
        raise AguiError(
            f"interrupt {interaction.id!r} is a tool approval: resolve it with "
            '{"approved": true|false, "reason"?: "..."}'
        )
    response: dict[str, Any] = {
        "type": "tool-approval",
        "approved": approved,
        "args_digest": interaction.args_digest,
    }
    if isinstance(payload, dict) and isinstance(payload.get("reason"), str):
        response["reason"] = payload["reason"]
    return response


def _last_user_text(inp: RunAgentInput) -> str:
    for message in reversed(inp.messages):
        if message.role != "user":
            continue
        content = message.content
        if isinstance(content, str):
            return content
        texts = [getattr(part, "text", None) for part in content or []]
        text = "".join(t for t in texts if isinstance(t, str))
        if text:
            return text
    raise AguiError("the input holds no user message to submit (and no resume entries)")


async def _translate(
    client: DurableClient, run: RunHandle, after: int | None, inp: RunAgentInput
) -> AsyncIterator[BaseEvent]:
    """The durably run's live events as AG-UI events, until it waits, ends or parks."""
    text = _TextMessages()
    async for item in run.events(after=after):
        event = item.event
        if isinstance(event, LiveText):
            for out in text.piece(event):
                yield out
        elif isinstance(event, LiveEvent) and event.type == "model_completed":
            parent = text.current
            for out in text.close():
                yield out
            for call in event.tool_calls:
                for out in _tool_call(call.call_id, call.name, call.arguments, parent):
                    yield out
        elif isinstance(event, LiveEvent):
            finished = await _finish(client, run, event, item, inp)
            if finished is not None:
                for out in [*text.close(), finished]:
                    yield out
                return


class _TextMessages:
    """The text message being written: one per model answer (and attempt)."""

    def __init__(self) -> None:
        self.current: str | None = None

    def piece(self, event: LiveText) -> list[BaseEvent]:
        message_id = f"{event.run_id}/{event.operation}/{event.attempt}"
        out: list[BaseEvent] = []
        if self.current != message_id:
            out += self.close()
            self.current = message_id
            out.append(
                TextMessageStartEvent(
                    type=EventType.TEXT_MESSAGE_START,
                    message_id=message_id,
                    role="assistant",
                    timestamp=_now(),
                )
            )
        if event.text:
            out.append(
                TextMessageContentEvent(
                    type=EventType.TEXT_MESSAGE_CONTENT,
                    message_id=message_id,
                    delta=event.text,
                    timestamp=_now(),
                )
            )
        return out

    def close(self) -> list[BaseEvent]:
        if self.current is None:
            return []
        ended = _end(self.current)
        self.current = None
        return [ended]


async def _finish(
    client: DurableClient, run: RunHandle, event: LiveEvent, item: LiveItem, inp: RunAgentInput
) -> BaseEvent | None:
    """The event ending the AG-UI run at this durably event, if it ends it."""
    if event.type == "waiting":
        interrupts = [_interrupt(i) for i in await run.pending()]
        outcome: Any = RunFinishedInterruptOutcome(type="interrupt", interrupts=interrupts)
    elif event.type == "subagent_status" and (event.detail or "").startswith("waiting "):
        # A subagent's run waits for a person: its interactions are this run's interrupts,
        # named `{child run}#{interaction}` so a resume answers them on the child.
        child_id = (event.detail or "").partition(" ")[2]
        child = await client.get_run(child_id)
        parent_call = (event.operation or "").rsplit(":", 1)[-1]
        interrupts = [
            _interrupt(i, prefix=f"{child_id}{_CHILD}", call_id=parent_call)
            for i in await child.pending()
        ]
        if not interrupts:
            return None
        outcome = RunFinishedInterruptOutcome(type="interrupt", interrupts=interrupts)
    elif event.type == "run_completed":
        outcome = RunFinishedSuccessOutcome(type="success")
    elif event.type == "run_cancelled":
        outcome = RunFinishedCancelledOutcome(type="cancelled")
    elif event.type in ("needs_attention", "run_failed"):
        return RunErrorEvent(
            type=EventType.RUN_ERROR,
            message=f"durably run {run.run_id!r} is {event.status}: {event.detail or ''}"[:2000],
            code=event.status,
            timestamp=_now(),
        )
    else:
        return None
    result = event.output if event.type == "run_completed" else None
    return RunFinishedEvent(
        type=EventType.RUN_FINISHED,
        thread_id=inp.thread_id,
        run_id=inp.run_id,
        outcome=outcome,
        result=result,
        timestamp=_now(),
    )


def _interrupt(i: Interaction, *, prefix: str = "", call_id: str | None = None) -> Interrupt:
    return Interrupt(
        id=f"{prefix}{i.id}",
        reason="question" if i.type == "question" else "tool_approval",
        message=i.question or f"approve {i.tool} with {json.dumps(i.args)[:500]}",
        tool_call_id=call_id or i.operation.rsplit(":", 1)[-1],
        expires_at=i.expires_at.isoformat() if i.expires_at else None,
    )


def _tool_call(
    call_id: str, name: str, arguments: dict[str, Any], parent: str | None
) -> list[BaseEvent]:
    return [
        ToolCallStartEvent(
            type=EventType.TOOL_CALL_START,
            tool_call_id=call_id,
            tool_call_name=name,
            parent_message_id=parent,
            timestamp=_now(),
        ),
        ToolCallArgsEvent(
            type=EventType.TOOL_CALL_ARGS,
            tool_call_id=call_id,
            delta=json.dumps(arguments, ensure_ascii=False),
            timestamp=_now(),
        ),
        ToolCallEndEvent(type=EventType.TOOL_CALL_END, tool_call_id=call_id, timestamp=_now()),
    ]


def _end(message_id: str) -> BaseEvent:
    return TextMessageEndEvent(
        type=EventType.TEXT_MESSAGE_END, message_id=message_id, timestamp=_now()
    )


def _now() -> int:
    return int(time.time() * 1000)
