"""The support-desk example: search a knowledge base, answer or open a ticket.

It shows an approval and the two retrying recovery policies side by side:

- `search_kb` is `safe`: it only reads, so an uncertain call simply runs again.
- `create_ticket` is the side effect, so it `requires_approval`: the run
  waits (`waiting`) until a person approves or denies the ticket. It is
  `idempotent`: it keys the ticket by `ctx.operation_id`, so a retry after a
  crash finds the ticket the first attempt made and returns it instead of
  opening a second one.

The model is scripted (no API key needed): it searches; when every article
it found is one the user can follow alone (`self_service`), it answers with
them and the run completes unattended; otherwise it opens a ticket, which
waits for approval, then answers with the ticket id. Each step is a function
of the request, chosen by the number of answers the model already gave, so a
restarted worker picks the run up exactly where it was. With
`OPENAI_API_KEY` or `OPENAI_BASE_URL` set, `build_model()` picks an
OpenAI-compatible model instead.

Host it with `durably dev`, or on any cluster with::

    durably worker --agents durably.examples.support_desk:registrations

Tickets live in a small SQLite file under `./.durably/tickets` (or
`$DURABLY_TICKETS_DIR`), relative to the worker's working directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import structlog
from pydantic import BaseModel, Field

from durably.agents import Agent, AgentRegistration, ModelRetry
from durably.messages import (
    AssistantMessage,
    Message,
    ModelRequest,
    ToolResultMessage,
    UserMessage,
)
from durably.models import (
    Model,
    ScriptedModel,
    last_tool_results,
    since_last_user_message,
    tool_call,
)
from durably.tools import ToolContext, tool

__all__ = [
    "AGENT_ID",
    "Article",
    "SearchArgs",
    "SearchResult",
    "Ticket",
    "TicketArgs",
    "build_model",
    "build_registrations",
    "create_ticket",
    "demo_conversation",
    "demo_input",
    "demo_input_unattended",
    "registrations",
    "search_kb",
    "tickets_dir",
]

AGENT_ID = "support-desk"

INSTRUCTIONS = (
    "You are a support-desk assistant. Search the knowledge base for the user's problem "
    "with search_kb. If every article found is self_service, answer with those articles. "
    "Otherwise open a ticket for the problem with create_ticket (a person approves each "
    "ticket first), then answer with the ticket id and the most relevant articles."
)


# -- tools -------------------------------------------------------------------------


class SearchArgs(BaseModel):
    query: str = Field(description="What the user needs help with, in a few words.")


class Article(BaseModel):
    id: str
    title: str
    snippet: str
    self_service: bool = Field(
        default=False, description="The user can fix the problem alone by following it."
    )


class SearchResult(BaseModel):
    articles: list[Article]


class TicketArgs(BaseModel):
    subject: str = Field(description="One line summing up the problem.")
    description: str = Field(description="What the user reported and what was suggested.")
    priority: Literal["low", "normal", "high"] = "normal"


class Ticket(BaseModel):
    ticket_id: str
    subject: str
    priority: Literal["low", "normal", "high"]
    status: Literal["open"] = "open"


_KB: tuple[tuple[frozenset[str], Article], ...] = (
    (
        frozenset({"vpn", "disconnect", "disconnects", "drops", "tunnel", "remote"}),
        Article(
            id="KB-102",
            title="VPN drops every few minutes",
            snippet="Update the VPN client to 5.2 or later and turn off 'Wi-Fi power saving'.",
        ),
    ),
    (
        frozenset({"wiki", "intranet", "internal", "reach", "dns"}),
        Article(
            id="KB-117",
            title="Internal sites do not load on VPN",
            snippet="Reconnect the VPN so it pushes the internal DNS servers, then flush DNS.",
        ),
    ),
    (
        frozenset({"password", "reset", "login", "locked", "account"}),
        Article(
            id="KB-031",
            title="Reset a forgotten password",
            snippet="Use the self-service portal; accounts unlock 15 minutes after a reset.",
            self_service=True,
        ),
    ),
    (
        frozenset({"printer", "print", "printing", "queue"}),
        Article(
            id="KB-210",
            title="Jobs stuck in the print queue",
            snippet="Clear the queue from the printer's web page and re-add the printer.",
            self_service=True,
        ),
    ),
    (
        frozenset({"email", "mail", "outlook", "mailbox"}),
        Article(
            id="KB-088",
            title="Mail does not sync",
            snippet="Remove and re-add the account; mailboxes over 50 GB need archiving first.",
        ),
    ),
)


@tool
async def search_kb(args: SearchArgs, ctx: ToolContext) -> SearchResult:
    """Search the support knowledge base; returns up to three matching articles."""
    words = set(re.findall(r"[a-z0-9-]+", args.query.lower()))
    scored = [(len(words & keywords), article) for keywords, article in _KB]
    best = sorted((s for s in scored if s[0] > 0), key=lambda s: -s[0])[:3]
    ctx.logger.info("searched the knowledge base", query=args.query, hits=len(best))
    return SearchResult(articles=[article for _, article in best])


def tickets_dir() -> Path:
    """Where tickets are kept: `$DURABLY_TICKETS_DIR`, else `./.durably/tickets`."""
    return Path(os.environ.get("DURABLY_TICKETS_DIR") or Path(".durably") / "tickets")


def _open_ticket(directory: Path, operation_id: str, args: TicketArgs) -> tuple[int, bool]:
    """Insert the ticket for `operation_id` unless it exists; (number, created)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tickets.sqlite"
    # closing() closes the connection; the inner `db` commits (or rolls back) the transaction.
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as db, db:
        db.execute(
            "CREATE TABLE IF NOT EXISTS tickets ("
            " number INTEGER PRIMARY KEY AUTOINCREMENT,"
            " operation_id TEXT NOT NULL UNIQUE,"
            " subject TEXT NOT NULL, description TEXT NOT NULL, priority TEXT NOT NULL,"
            " created_at TEXT NOT NULL)"
        )
        inserted = db.execute(
            "INSERT OR IGNORE INTO tickets"
            " (operation_id, subject, description, priority, created_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (
                operation_id,
                args.subject,
                args.description,
                args.priority,
                datetime.now(UTC).isoformat(),
            ),
        ).rowcount
        row = db.execute(
            "SELECT number FROM tickets WHERE operation_id = ?", (operation_id,)
        ).fetchone()
    return int(row[0]), inserted == 1


@tool(requires_approval=True)  # a person approves each ticket before it is opened
async def create_ticket(args: TicketArgs, ctx: ToolContext) -> Ticket:
    """Open a support ticket; returns its id. Safe to retry: keyed by the operation id."""
    number, created = await asyncio.to_thread(_open_ticket, tickets_dir(), ctx.operation_id, args)
    ticket_id = f"T-{1000 + number}"
    if created:
        ctx.logger.info("opened a ticket", ticket_id=ticket_id)
    else:
        ctx.logger.info("ticket already opened by an earlier attempt", ticket_id=ticket_id)
    return Ticket(ticket_id=ticket_id, subject=args.subject, priority=args.priority)


# -- the scripted model ------------------------------------------------------------


def _question(request: ModelRequest) -> str:
    """The user's latest message: in a session, the submission this run answers."""
    users = (m.content for m in reversed(request.messages) if isinstance(m, UserMessage))
    return next(users, "")


def _shorten(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _searches(messages: list[Message]) -> list[list[Article]]:
    """The articles of each successful search among `messages`, oldest first."""
    return [
        SearchResult.model_validate_json(m.content).articles
        for m in messages
        if isinstance(m, ToolResultMessage) and m.tool == "search_kb" and not m.is_error
    ]


def _articles(request: ModelRequest) -> list[Article]:
    """The articles of this run's latest successful search."""
    searches = _searches(since_last_user_message(request))
    return searches[-1] if searches else []


def _suggested_earlier(request: ModelRequest) -> list[str]:
    """The ids of the articles found for earlier messages of the conversation (a session)."""
    current = len(since_last_user_message(request))
    earlier = list(request.messages[: len(request.messages) - current])
    return list(dict.fromkeys(a.id for found in _searches(earlier) for a in found))


def search_step(request: ModelRequest) -> AssistantMessage:
    """Turn 1: search the knowledge base for the user's words."""
    return AssistantMessage(
        tool_calls=(tool_call("search_kb", query=_shorten(_question(request), 200)),)
    )


def _tips(articles: list[Article]) -> str:
    return " ".join(f"{a.title} ({a.id}): {a.snippet}" for a in articles)


def triage_step(request: ModelRequest) -> AssistantMessage:
    """Turn 2: answer from self-service articles, or open a ticket naming what was found."""
    question = _question(request)
    articles = _articles(request)
    if articles and all(a.self_service for a in articles):
        earlier = [i for i in _suggested_earlier(request) if i not in {a.id for a in articles}]
        recap = f" Earlier I suggested {', '.join(earlier)}." if earlier else ""
        return AssistantMessage(
            content=f"You can fix this yourself. {_tips(articles)}{recap} "
            "If that does not help, tell me and I will open a ticket."
        )
    found = "; ".join(f"{a.id} {a.title}" for a in articles) or "none"
    return AssistantMessage(
        content="Opening a ticket so the support team can follow up.",
        tool_calls=(
            tool_call(
                "create_ticket",
                subject=_shorten(question, 80),
                description=f"{question}\n\nSuggested articles: {found}",
                priority="normal",
            ),
        ),
    )


def answer_step(request: ModelRequest) -> AssistantMessage:
    """Turn 3: the final answer, with the ticket id from the tool result."""
    results = last_tool_results(request)
    ticket = next((r for r in results if r.tool == "create_ticket"), None)
    if ticket is None or ticket.is_error:
        reason = ticket.content if ticket else "no ticket result"
        return AssistantMessage(content=f"I did not open a ticket ({reason}).")
    ticket_id = Ticket.model_validate_json(ticket.content).ticket_id
    tips = _tips(_articles(request))
    text = f"I opened ticket {ticket_id} for you; the support team will follow up."
    return AssistantMessage(content=f"{text} Meanwhile: {tips}" if tips else text)


def build_model() -> Model:
    """The model the support desk uses, chosen from the environment.

    With `OPENAI_API_KEY` or `OPENAI_BASE_URL` set, an `OpenAIChatModel`
    (model `$DURABLY_OPENAI_MODEL`, default `gpt-4o-mini`) on OpenAI or any
    OpenAI-compatible server such as Ollama; a local server needs no key.
    Otherwise, or without the `openai` extra, the offline scripted model. A
    different model changes the registration's fingerprint, so the provider
    model is registered under its own version (see `build_registrations`).
    """
    scripted = ScriptedModel([search_step, triage_step, answer_step], name="support-desk-scripted")
    base_url = os.environ.get("OPENAI_BASE_URL") or None
    has_key = bool(os.environ.get("OPENAI_API_KEY"))
    if not (has_key or base_url):
        return scripted
    try:
        from durably.models import OpenAIChatModel

        return OpenAIChatModel(
            os.environ.get("DURABLY_OPENAI_MODEL") or "gpt-4o-mini",
            base_url=base_url,
            # Local servers ignore the key, but the SDK will not start without one.
            api_key=None if has_key else "unused",
        )
    except ImportError as exc:
        structlog.get_logger("durably").warning(
            f"OPENAI_API_KEY/OPENAI_BASE_URL is set but {exc}; the support desk uses its "
            "scripted model"
        )
        return scripted


def build_registrations() -> list[AgentRegistration]:
    """The support-desk agent, with its recovery policies.

    Version "2" with the scripted model; "2-openai" with a provider model,
    whose failed requests Temporal retries (honouring `Retry-After`). Version
    "1" opened tickets without an approval.
    """
    agent = Agent(
        id=AGENT_ID,
        model=build_model(),
        instructions=INSTRUCTIONS,
        tools=[search_kb, create_ticket],
        max_turns=6,
    )
    scripted = isinstance(agent.model, ScriptedModel)
    return [
        AgentRegistration(
            agent,
            version="2" if scripted else "2-openai",
            tool_recovery={"search_kb": "safe", "create_ticket": "idempotent"},
            model_retry=None if scripted else ModelRetry(max_attempts=5),
        )
    ]


registrations: list[AgentRegistration] = build_registrations()


def demo_input() -> str:
    """A sample request that needs a ticket: its run waits for an approval."""
    return (
        "My VPN disconnects every few minutes since this morning's update, "
        "and I can't reach the wiki. Can you help?"
    )


def demo_input_unattended() -> str:
    """A sample request the knowledge base answers: its run completes unattended."""
    return "My printer queue is stuck"


def demo_conversation() -> tuple[str, str]:
    """Two messages of one session, each answered unattended; the second answer recalls
    what the first suggested, which only a run reading the whole conversation can."""
    return demo_input_unattended(), "I also forgot my password"
