"""What a model, a tool or a caller wrote reaches operators as text, never as commands.

Escape sequences and bidi controls are shown as visible escapes in the
terminal; Markdown punctuation cannot build links or blocks in the Web UI;
`durably approve` approves exactly the call it printed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid

from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    RunNotFoundError,
    RunStatus,
    ScriptedModel,
    ToolContext,
    tool,
)
from durably._text import md_code, md_text, printable
from durably.models import tool_call
from durably.tools import question_tool

from .conftest import Runtimes, cli, eventually, wait_for_status

EVIL = "\x1b[2J\x1b]0;pwned\x07\u202e"
SHOWN = "\\x1b[2J\\x1b]0;pwned\\x07\\u202e"
RAW = ("\x1b", "\x07", "\u202e", "\x9b")


class TestPrintable:
    def test_escape_sequences_bidi_and_c1_controls_become_visible_escapes(self) -> None:
        assert printable(f"ok{EVIL}\x9b\x7f\u2066\u061c") == f"ok{SHOWN}\\x9b\\x7f\\u2066\\u061c"

    def test_newlines_and_tabs_are_escaped_unless_kept(self) -> None:
        assert printable("a\nb\tc\rd") == "a\\nb\\tc\\rd"
        assert printable("a\nb\tc\r\nd\re", keep_newlines=True) == "a\nb\tc\nd\\re"

    def test_clean_text_comes_back_unchanged(self) -> None:
        text = "Refunded $15.00 on order A-1001 ✓ — 日本語"
        assert printable(text) is text

    def test_a_lone_surrogate_is_escaped_instead_of_crashing_the_terminal(self) -> None:
        assert printable("a\ud800b") == "a\\ud800b"

    def test_a_megabyte_of_controls_is_escaped_whole(self) -> None:
        """No pattern here backtracks: a megabyte of hostile text is escaped in one pass
        (a quadratic escape would hit the test's timeout, not a clock read here)."""
        text = ("é\x1b[31m\u202e" * 150_000)[: 2**20]
        shown = printable(text)
        assert not any(c in shown for c in RAW)
        assert shown.count("\\x1b") == text.count("\x1b")


class TestMarkdown:
    def test_md_text_escapes_every_markdown_construct_and_control(self) -> None:
        text = "[x](http://e.vil) ![i](y) *b* _i_ <img src=x> # h | t | ~s~ `c`"
        escaped = md_text(text + "\n- item\x1b")
        assert escaped == (
            r"\[x\]\(http\:\/\/e\.vil\) \!\[i\]\(y\) \*b\* \_i\_ \<img src\=x\> \# h \| t \| "
            r"\~s\~ \`c\`\\n\- item\\x1b"
        )
        assert "\n" not in escaped

    def test_md_text_leaves_plain_words_alone(self) -> None:
        assert md_text("Which order was it") == "Which order was it"

    def test_md_code_fences_longer_than_any_backtick_run_inside(self) -> None:
        assert md_code("refund") == "`refund`"
        assert md_code("a``b") == "```a``b```"
        assert md_code("`x`") == "`` `x` ``"
        assert md_code(" x ") == "`  x  `"
        assert md_code("") == "` `"

    def test_md_code_shows_newlines_and_controls_as_escapes(self) -> None:
        assert md_code(f"a\nb{EVIL}") == f"`a\\nb{SHOWN}`"

    def test_a_megabyte_of_markdown_is_escaped_whole(self) -> None:
        """As above, for the Web UI's Markdown."""
        text = ("[a](b) *c*\n\x1b" * 100_000)[: 2**20]
        assert "\n" not in md_text(text)
        assert md_code(text).count("\x1b") == 0


async def durably(env: WorkflowEnvironment, *args: str) -> tuple[str, str]:
    """stdout and stderr of a `durably` command that succeeded."""
    target = env.client.service_client.config.target_host
    done = await cli(sys.executable, "-m", "durably", *args, "--target", target)
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr


def assert_shown_safely(output: str, *expected: str) -> None:
    assert not [c for c in RAW if c in output], output
    for text in expected:
        assert text in output, output


async def test_hostile_text_shows_as_escapes_in_start_inbox_answer_and_runs_show(
    env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes
) -> None:
    """Model output and a question holding a clear-screen, a window-title sequence,
    a bell and a right-to-left override; a responder name with the override (runs
    refuse names with control characters)."""
    agent = Agent(
        id="hostile",
        model=ScriptedModel([tool_call("ask", question=f"{EVIL}which?"), f"done {EVIL}"]),
        instructions="",
        tools=[question_tool(name="ask", description="Ask.")],
    )
    await runtimes.start([AgentRegistration(agent, version="1")])
    run_id = f"hostile-{uuid.uuid4().hex[:8]}"
    started = asyncio.create_task(
        durably(env, "start", "hostile", "hi", "--run-id", run_id, "--wait",
                "--task-queue", client.task_queue)
    )  # fmt: skip

    async def exists() -> bool:
        try:
            await client.get_run(run_id)
        except RunNotFoundError:
            return False
        return True

    await eventually(exists)
    run = await client.get_run(run_id)
    await wait_for_status(run, RunStatus.WAITING)

    async def in_inbox() -> bool:
        return run_id in {i.run_id for i in await client.inbox(task_queue=client.task_queue)}

    await eventually(in_inbox)
    inbox, _ = await durably(env, "inbox", "--task-queue", client.task_queue)
    assert_shown_safely(inbox, f"{SHOWN}which?")  # the cell may wrap after "answer:"
    answered, _ = await durably(env, "answer", run_id, "A1", "--as", "eve\u202e")
    assert_shown_safely(answered, "answered by eve\\u202e")
    out, _ = await started
    assert_shown_safely(out, f"done {SHOWN}")
    shown, _ = await durably(env, "runs", "show", run_id)
    assert_shown_safely(shown, f"done {SHOWN}", "by eve\\u202e")


class Refund(BaseModel):
    order: str
    amount: int


class Receipt(BaseModel):
    refund_id: str


async def test_approve_sends_the_digest_it_printed_and_a_stale_digest_runs_nothing(
    env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes
) -> None:
    made: list[str] = []

    @tool(requires_approval=True)
    async def refund(args: Refund, ctx: ToolContext) -> Receipt:
        """Refund an order."""
        made.append(args.order)
        return Receipt(refund_id=f"R-{args.order}")

    agent = Agent(
        id="refunder",
        model=ScriptedModel([tool_call("refund", call_id="c1", order="A1", amount=30), "ok"]),
        instructions="",
        tools=[refund],
    )
    await runtimes.start([AgentRegistration(agent, version="1")])
    run = await client.start_run("refunder", "refund A1")
    snap = await wait_for_status(run, RunStatus.WAITING)
    assert snap.interaction is not None
    digest = snap.interaction.args_digest
    target = env.client.service_client.config.target_host

    async def approve(*args: str) -> tuple[int, str, str]:
        done = await cli(
            sys.executable, "-m", "durably", "approve", run.run_id, "--as", "alice", *args,
            "--target", target,
        )  # fmt: skip
        return done.returncode, done.stdout, done.stderr

    code, _, err = await approve("--digest", "0" * 32)
    assert code == 1
    assert "the arguments differ from what you reviewed" in err
    code, _, err = await approve("--interaction", "approval:1:other")
    assert code == 1
    assert "approval:1:other is not a call run" in err
    assert "it waits on approval:1:c1" in err
    assert "nothing was approved" in err
    code, out, err = await approve()
    assert code == 0, err
    assert "approval:1:c1 of run" in out and "approved by alice" in out
    assert 'tool refund, arguments {"order":"A1","amount":30}' in out

    assert (await run.result()).output == "ok"
    assert made == ["A1"]
    history = await client.temporal.get_workflow_handle(run.run_id).fetch_history()
    [accepted] = [
        e.workflow_execution_update_accepted_event_attributes.accepted_request.input
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
    ]
    sent = json.loads(accepted.args.payloads[0].data)
    assert sent["response"]["args_digest"] == digest
