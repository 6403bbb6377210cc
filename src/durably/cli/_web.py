"""`durably serve`: live events over HTTP (Server-Sent Events) and responses, for
browsers and apps (see `durably.web`)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from durably.cli._connection import Connection, command
from durably.cli._serve import _stop_on_signals
from durably.cli._terminal import console
from durably.web import TOKENS_ENV, LiveServer, parse_tokens


@command
async def serve(
    host: Annotated[
        str,
        typer.Option("--host", help="Interface to listen on; anything but loopback needs tokens."),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port.")] = 8090,
    tokens: Annotated[
        str | None,
        typer.Option(
            "--tokens",
            envvar=TOKENS_ENV,
            help="name=token pairs, comma-separated: who may call it, recorded as the "
            "responder of what they answer (prefer the variable: a flag shows in the "
            "process list). Required off loopback.",
            show_default=False,
        ),
    ] = None,
    *,
    conn: Connection,
) -> None:
    """Serve runs' and sessions' live events (SSE) and approvals over HTTP."""
    named = parse_tokens(tokens or "")
    stop = _stop_on_signals()
    async with LiveServer(await conn.client(), host=host, port=port, tokens=named) as server:
        auth = f"tokens for {', '.join(named)}" if named else "no tokens: loopback only"
        console.print(Text(f"Live events on {server.url} ({auth})"))
        console.print(Text(f"  {server.url}/runs/RUN/events      Server-Sent Events of a run"))
        console.print(Text(f"  {server.url}/sessions/ID/events   of a session and its runs"))
        console.print(Text(f"  {server.url}/runs/RUN/watch       a page showing a run live"))
        console.print("Serving. Press Ctrl-C to stop.")
        await stop.wait()
    console.print("Live events server stopped.")
