"""Commands that change runs: `start`, `cancel`, `resolve`, `retry`, `raise-limits`,
`repair`, `approve`, `deny` and `answer`.

An approval or denial is bound to the call it was read with: it carries that
call's `args_digest` (or the `--digest` the operator reviewed), so a run id
reused by another run, or a call whose arguments changed since the snapshot
was read, never gets the decision meant for other arguments.

`approve --all` / `deny --all` decide every tool call of one snapshot at once,
all or none: the calls printed are exactly the calls sent, so a call that
became pending after the snapshot was read is never decided unseen.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import typer
from rich.text import Text
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import CancelledError, TerminatedError
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

from durably._text import printable
from durably.approvals import ENV_KEYS, ENV_KEYS_FILE, ApprovalKeys
from durably.cli._connection import Connection, RunId, TaskQueue, command
from durably.cli._terminal import clip, console, err_console, safe
from durably.client import DurableClient, RunHandle
from durably.contract import DEFAULT_TASK_QUEUE, Interaction
from durably.errors import DurablyError, InvalidResponseError, InvalidRunInputError

Responder = Annotated[
    str,
    typer.Option(
        "--as", help="Who is answering (recorded in the run's events).", show_default=False
    ),
]
InteractionId = Annotated[
    str | None,
    typer.Option(
        "--interaction",
        help="The interaction to answer (default: the one pending now).",
        show_default=False,
    ),
]
Digest = Annotated[
    str | None,
    typer.Option(
        "--digest",
        help="The args_digest you reviewed; refused if the call's arguments differ.",
        show_default=False,
    ),
]
Limits = Annotated[
    list[str] | None,
    typer.Option(
        "--limit",
        help="A usage limit as NAME=VALUE (repeatable): input_tokens, output_tokens, "
        "total_tokens, requests, tool_calls, cost_usd, wall_clock_s.",
        show_default=False,
    ),
]
Every = Annotated[
    bool,
    typer.Option(
        "--all",
        help="Decide every tool call the run waits on, as printed, all or none "
        "(pending questions stay pending).",
    ),
]


@command
async def start(
    agent_id: Annotated[str, typer.Argument(help="The agent to run.")],
    input: Annotated[str, typer.Argument(help="The user's request.")],
    version: Annotated[
        str | None,
        typer.Option(
            "--version", help="Agent version (default: newest registered).", show_default=False
        ),
    ] = None,
    run_id: Annotated[
        str | None,
        typer.Option(
            "--run-id", help="Run id (default: generated; never reused).", show_default=False
        ),
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait for the run and print its output.")
    ] = False,
    as_task: Annotated[
        bool,
        typer.Option(
            "--task", help="AGENT_ID is a custom task; INPUT is its argument as a JSON object."
        ),
    ] = False,
    limit: Limits = None,
    max_turns: Annotated[
        int | None,
        typer.Option("--max-turns", help="This run's turn budget.", show_default=False),
    ] = None,
    *,
    conn: Connection,
    task_queue: TaskQueue = DEFAULT_TASK_QUEUE,
) -> None:
    """Start a run of AGENT_ID with INPUT (of a custom task with --task)."""
    limits = limit_values(limit or [], InvalidRunInputError)
    client = await conn.client(task_queue)
    if as_task:
        try:
            argument = json.loads(input)
        except ValueError as err:
            raise InvalidRunInputError(f"--task takes INPUT as a JSON object: {err}") from None
        if not isinstance(argument, dict):
            raise InvalidRunInputError(
                '--task takes INPUT as a JSON object, such as \'{"order": "A"}\''
            )
        run = await client.start_task(
            agent_id, argument, version=version, run_id=run_id, limits=limits, max_turns=max_turns
        )
    else:
        run = await client.start_run(
            agent_id, input, version=version, run_id=run_id, limits=limits, max_turns=max_turns
        )
    console.print(safe(f"Started run {run.run_id}"))
    if wait:
        await print_result(run)


async def print_result(run: RunHandle) -> None:
    """Wait until the run completes and print its output (`start --wait`, `send --wait`).

    A run that fails or is cancelled raises (`DurablyError`): a red line, exit 1.
    """
    result = await run.result()
    console.print(Text(f"Completed after {result.turns} turn(s)", style="green"))
    console.print(safe(result.output or "", keep_newlines=True))


@command
async def cancel(
    run_id: RunId,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait/--no-wait", help="Wait until the run has closed and say how it ended."
        ),
    ] = True,
    within: Annotated[
        float, typer.Option("--timeout", help="How long to wait, in seconds.", min=0)
    ] = 30.0,
    *,
    conn: Connection,
) -> None:
    """Cancel a run: a running tool sees its abort signal, then the run ends cancelled.

    Exits with status 1 if the run has not closed within --timeout seconds.
    """
    client = await conn.client()
    run = await client.get_run(run_id)
    await run.cancel()
    if not wait:
        console.print(
            safe(
                f"Cancellation of run {run_id} requested; it closes once its running tool or "
                f"model request has stopped (`durably runs show {run_id}`)."
            )
        )
        return
    try:
        async with asyncio.timeout(within):
            ended = await _how_it_closed(client, run_id)
    except TimeoutError:
        await _not_closed(run, within)
        raise typer.Exit(1) from None
    console.print(safe(f"Run {run_id} {ended}."))


async def _how_it_closed(client: DurableClient, run_id: str) -> str:
    """Wait until the run's workflow closes; how it ended, in words."""
    handle = client.temporal.get_workflow_handle(run_id)
    try:
        await handle.result()
    except WorkflowFailureError as err:
        if isinstance(err.cause, CancelledError):
            return "was cancelled"
        if isinstance(err.cause, TerminatedError):
            return "was terminated"
        if isinstance(err.cause, TemporalTimeoutError):
            return "timed out"
        return f"failed: {err.cause or err}"
    return "completed before the cancellation took effect; its output stays readable"


async def _not_closed(run: RunHandle, waited: float) -> None:
    """Say that the run is still open, what it is doing, and the last resort."""
    try:
        snap = await run.snapshot()
        now = f"it is {snap.status.value}: {snap.current or 'no details'}"
    except DurablyError as err:
        now = f"its snapshot cannot be read ({err})"
    err_console.print(
        safe(
            f"Run {run.run_id} has not closed {waited:g} s after its cancellation was "
            f"requested; {clip(printable(now, keep_newlines=True), 300)}",
            style="red",
        )
    )
    err_console.print(
        safe(
            "It closes once its running tool or model request stops (a tool sees "
            f"ctx.abort_signal). Wait longer (`durably cancel {run.run_id} --timeout 300`) "
            f"or check with `durably runs show {run.run_id}`. Only as a last resort: "
            f"`temporal workflow terminate --workflow-id {run.run_id}` ends it at once, but "
            "terminate skips the run's cleanup: no cancellation is recorded, its "
            "DurablyStatus stays as it is, and a running tool is not waited for."
        )
    )


@command
async def resolve(
    run_id: RunId,
    operation: Annotated[
        str,
        typer.Argument(
            metavar="OPERATION",
            help="The blocked operation, e.g. tool:2:call_1 (see `runs show`).",
        ),
    ],
    json_value: Annotated[
        str | None,
        typer.Option(
            "--json",
            help="The call's real result, as JSON (checked against the tool's output schema).",
            show_default=False,
        ),
    ] = None,
    error: Annotated[
        str | None,
        typer.Option(
            "--error",
            help="The call is known to have failed: this message goes to the model.",
            show_default=False,
        ),
    ] = None,
    rerun: Annotated[
        bool,
        typer.Option(
            "--rerun",
            help="You verified the effect did not happen: run the call "
            "once more with the same operation_id.",
        ),
    ] = False,
    *,
    conn: Connection,
) -> None:
    """Resolve an interrupted tool call with its real outcome; the run continues.

    Check the external system first. If the outcome is still unknown, leave
    the run blocked: never make up a result.
    """
    resolution = _resolution(json_value, error, rerun)
    await (await conn.get_run(run_id)).resolve_tool(operation, resolution)
    console.print(
        safe(f"Resolved {operation} of run {run_id} ({resolution['type']}); the run continues.")
    )


def _resolution(json_value: str | None, error: str | None, rerun: bool) -> dict[str, Any]:
    """The one outcome `resolve` was given; status 2 unless exactly one is valid."""
    chosen = [
        name
        for name, on in (
            ("--json", json_value is not None),
            ("--error", error is not None),
            ("--rerun", rerun),
        )
        if on
    ]
    if len(chosen) != 1:
        err_console.print(
            Text(
                "error: give exactly one of --json VALUE, --error MESSAGE or --rerun"
                + (f" (got {', '.join(chosen)})" if chosen else ""),
                style="red",
            )
        )
        raise typer.Exit(2)
    if json_value is not None:
        try:
            return {"type": "json", "value": json.loads(json_value)}
        except json.JSONDecodeError as err:
            err_console.print(Text(f"error: --json is not valid JSON: {err}", style="red"))
            raise typer.Exit(2) from err
    if error is not None:
        return {"type": "error", "message": error}
    return {"type": "rerun"}


@command
async def retry(run_id: RunId, *, conn: Connection) -> None:
    """Run a failed run's failed operation again (committed results are kept)."""
    accepted = await (await conn.get_run(run_id)).retry()
    what = accepted.operation or "the run"
    console.print(safe(f"Retrying {what} of run {run_id} (was {accepted.previous_status.value})."))


@command
async def repair(
    run_id: RunId,
    responder: Annotated[
        str | None, typer.Option("--as", help="Who repairs it (recorded in the run's events).")
    ] = None,
    reason: Annotated[
        str | None, typer.Option("--reason", help="Why (recorded with the reset).")
    ] = None,
    *,
    conn: Connection,
) -> None:
    """Bring back a run whose history no longer replays (its workflow tasks fail, TMPRL1100).

    Resets it to the first workflow task that does not replay; before the new run
    schedules anything it learns what became of each operation the reset discarded
    (kept, parked as after a crash, or run again under the same operation id).
    """
    report = await (await conn.get_run(run_id)).repair(responder=responder, reason=reason)
    console.print(
        safe(
            f"Repaired run {run_id}: reset to the workflow task at event {report.reset_to_event} "
            f"(the first that does not replay); it goes on as Temporal run {report.new_run_id}."
        )
    )
    console.print(safe(f"  replay failure: {clip(report.replay_failure, 300)}"))
    for fate in report.fates:
        then = {
            "completed": "its result is kept",
            "not_started": "it runs",
            "uncertain": "a manual call parks in needs_attention; any other runs again",
        }[fate.outcome]
        console.print(safe(f"  {fate.operation}: {fate.detail}; {then}"))
    if not report.fates:
        console.print("  No operation was scheduled after that point.")


@command
async def raise_limits(
    run_id: RunId,
    limits: Annotated[
        list[str],
        typer.Argument(
            help="NAME=VALUE for each limit to set, e.g. total_tokens=20000 cost_usd=2.5.",
            show_default=False,
        ),
    ],
    responder: Annotated[
        str | None, typer.Option("--as", help="Who raises them (recorded in the run's events).")
    ] = None,
    *,
    conn: Connection,
) -> None:
    """Set a run's usage limits; a run parked on one (budget_exceeded) goes on."""
    run = await conn.get_run(run_id)
    accepted = await run.raise_limits(limit_values(limits), responder=responder)
    now = ", ".join(f"{k} {v:g}" for k, v in accepted.limits.model_dump(exclude_none=True).items())
    console.print(safe(f"Run {run_id} limits: {now or 'none'}."))
    if accepted.resumed:
        console.print(safe(f"Going on with {', '.join(accepted.resumed)}."))


def limit_values(
    pairs: list[str], error: type[DurablyError] = InvalidResponseError
) -> dict[str, float]:
    """`NAME=VALUE` arguments as limits (checked by `UsageLimits` when sent); `error` is
    what a malformed one raises."""
    values: dict[str, float] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = None
        if not sep or number is None:
            raise error(
                f"a limit is NAME=VALUE with a number, such as total_tokens=20000; got {pair!r}"
            )
        values[name.strip()] = int(number) if number.is_integer() else number
    return values


@command
async def approve(
    run_id: RunId,
    responder: Responder,
    reason: Annotated[
        str | None,
        typer.Option("--reason", help="Why; recorded in the run's events.", show_default=False),
    ] = None,
    interaction: InteractionId = None,
    digest: Digest = None,
    every: Every = False,
    *,
    conn: Connection,
) -> None:
    """Approve the tool call a run is waiting on (--all: every one); the tool then runs.

    The approval carries the args_digest of the call it was read with (or
    --digest), so it never approves other arguments than the ones printed.
    """
    if every:
        _alone(interaction, digest)
        await _decide_all(await conn.get_run(run_id), responder, approved=True, reason=reason)
        return
    run = await conn.get_run(run_id)
    await _decide(run, interaction, responder, approved=True, digest=digest, reason=reason)


@command
async def deny(
    run_id: RunId,
    responder: Responder,
    reason: Annotated[
        str | None,
        typer.Option(
            "--reason", help="Why; the model reads `denied: <reason>`.", show_default=False
        ),
    ] = None,
    interaction: InteractionId = None,
    digest: Digest = None,
    every: Every = False,
    *,
    conn: Connection,
) -> None:
    """Deny the tool call a run is waiting on (--all: every one); the tool never runs."""
    if every:
        _alone(interaction, digest)
        await _decide_all(await conn.get_run(run_id), responder, approved=False, reason=reason)
        return
    run = await conn.get_run(run_id)
    await _decide(run, interaction, responder, approved=False, digest=digest, reason=reason)


@command
async def answer(
    run_id: RunId,
    text: Annotated[str, typer.Argument(help="The answer the model will read.")],
    responder: Responder,
    interaction: InteractionId = None,
    *,
    conn: Connection,
) -> None:
    """Answer the question a run is waiting on."""
    run = await conn.get_run(run_id)
    if interaction is None:
        waiting, status = await _pending(run)
        if not waiting:
            raise _nothing_pending(run.run_id, status)
        interaction = waiting[0].id
    accepted = await run.answer(interaction, text, responder=responder)
    console.print(safe(f"{interaction} of run {run_id}: answered by {accepted.responder}."))


async def _pending(run: RunHandle) -> tuple[list[Interaction], str]:
    """The interactions the run waits on, oldest first, and the run's status."""
    snap = await run.snapshot()
    return snap.interactions, snap.status.value


def _nothing_pending(run_id: str, status: str) -> DurablyError:
    return DurablyError(
        f"run {run_id} is {status} and waits for no approval or answer; see `durably inbox`"
    )


async def _decide(
    run: RunHandle,
    interaction_id: str | None,
    responder: str,
    *,
    approved: bool,
    digest: str | None,
    reason: str | None = None,
) -> None:
    """Approve or deny the call the operator read, and say which call it was.

    The decision carries the args_digest of the pending call (or --digest):
    without it, a run id reused by another run, or a call that changed since
    the snapshot was read, would get the same decision for other arguments.
    """
    waiting, status = await _pending(run)
    if not waiting and interaction_id is None:
        raise _nothing_pending(run.run_id, status)
    verdict = "approved" if approved else "denied"
    named = [i for i in waiting if interaction_id in (None, i.id)]
    pending = named[0] if named else None
    if pending is not None:
        target: Interaction | str = pending
    elif digest is not None:  # the operator names the call by its digest
        target = str(interaction_id)
    else:
        ids = ", ".join(i.id for i in waiting) or "none"
        raise DurablyError(
            f"{interaction_id} is not a call run {run.run_id} waits for approval on (it waits "
            f"on {ids}), so nothing was {verdict}. Omit --interaction to decide on the oldest "
            "pending call, or pass the --digest you reviewed"
        )
    keys = _keys(pending) if pending is not None and pending.signed else None
    decide = run.approve if approved else run.deny
    accepted = await decide(
        target, responder=responder, reason=reason, args_digest=digest, keys=keys
    )
    console.print(
        safe(f"{accepted.interaction_id} of run {run.run_id}: {verdict} by {accepted.responder}.")
    )
    if pending is not None:
        console.print(safe(f"  {_call_text(pending)}"))


def _call_text(call: Interaction) -> str:
    """A tool call as the operator reviews it: the tool and its arguments (clipped)."""
    args = json.dumps(call.args, ensure_ascii=False, separators=(",", ":"))
    return f"tool {call.tool}, arguments {clip(args, 300)}"


def _alone(interaction_id: str | None, digest: str | None) -> None:
    """`--all` decides every pending call; naming one as well is a contradiction: status 2."""
    named = [
        name
        for name, value in (("--interaction", interaction_id), ("--digest", digest))
        if value is not None
    ]
    if named:
        given = " and ".join(named)
        err_console.print(
            Text(
                f"error: --all decides every pending tool call, so it takes no {given}. "
                f"Drop --all to decide one call, or drop {given} to decide them all",
                style="red",
            )
        )
        raise typer.Exit(2)


async def _decide_all(
    run: RunHandle, responder: str, *, approved: bool, reason: str | None
) -> None:
    """Approve or deny every tool call of one snapshot, all or none, and print them first.

    The calls sent are the calls printed (each with its args_digest), never a
    fresh read: a call that became pending after the snapshot is not decided
    unseen, and one whose arguments changed is refused with the whole batch.
    """
    snap = await run.snapshot()
    calls = [i for i in snap.interactions if i.type == "tool-approval"]
    questions = [i.id for i in snap.interactions if i.type == "question"]
    verdict = "approved" if approved else "denied"
    if not calls:
        raise _no_calls(run.run_id, snap.status.value, questions, verdict)
    doing = "Approving" if approved else "Denying"
    console.print(safe(f"{doing} {len(calls)} tool call(s) of run {run.run_id}, all or none:"))
    for call in calls:
        console.print(safe(f"  {call.id}: {_call_text(call)}"))
    if questions:
        console.print(safe(_questions_left(run.run_id, questions)))
    signed = [c for c in calls if c.signed]
    keys = _keys(signed[0]) if signed else None
    decide = run.approve_all if approved else run.deny_all
    accepted = await decide(calls, responder=responder, reason=reason, keys=keys)
    who = accepted[0].responder if accepted else responder
    console.print(safe(f"All {len(accepted)} {verdict} by {who}."))


def _questions_left(run_id: str, questions: list[str]) -> str:
    """Why --all leaves questions pending: an answer is a person's text, never a batch's."""
    return f"Not answered by --all: question(s) {', '.join(questions)}; {_answer_each(run_id)}."


def _answer_each(run_id: str) -> str:
    return f"answer each with `durably answer {run_id} TEXT --interaction ID --as NAME`"


def _no_calls(run_id: str, status: str, questions: list[str], verdict: str) -> DurablyError:
    """Nothing to decide: say so, and what the run waits on instead."""
    if questions:
        return DurablyError(
            f"run {run_id} waits for no tool approval, only for question(s) "
            f"{', '.join(questions)}, so nothing was {verdict}; {_answer_each(run_id)}"
        )
    return DurablyError(
        f"run {run_id} is {status} and waits for no tool approval, so nothing was {verdict}; "
        "see `durably inbox`"
    )


def _keys(call: Interaction) -> ApprovalKeys:
    """The key that signs a decision on a tool whose registration names approvers."""
    keys = ApprovalKeys.from_env()
    if keys is None:
        raise DurablyError(
            f"tool {call.tool} takes only signed decisions, and no approval key is set "
            f"here: set {ENV_KEYS} (or {ENV_KEYS_FILE}) to a key the workers hold, or decide "
            "through the service that signs approvals for you"
        )
    return keys
