"""Commands for encrypted payloads: `codec-server` (Temporal's Web UI and CLI
decode through it) and `encryption-key` (a new key for DURABLY_ENCRYPTION_KEYS).

The codec server holds the keys, so it is as secret as they are: off
loopback it needs a bearer token (see `durably.codec_server`).
"""

from __future__ import annotations

import shlex
from typing import Annotated

import typer
from rich.text import Text

from durably._named_keys import parse_named_keys
from durably.cli._connection import command
from durably.cli._serve import _stop_on_signals
from durably.cli._terminal import console, err_console, safe
from durably.codec import EncryptionCodec, EncryptionKeys
from durably.codec_server import DEFAULT_PORT, TOKEN_ENV, CodecServer, is_loopback
from durably.errors import DurablyError

# The local dev server's Web UI, as a browser may name it: the default origins.
_DEV_UI_ORIGINS = ("http://localhost:8233", "http://127.0.0.1:8233")


@command
async def codec_server(
    host: Annotated[
        str,
        typer.Option("--host", help="Interface to listen on; anything but loopback needs a token."),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port.")] = DEFAULT_PORT,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar=TOKEN_ENV,
            help="Bearer token every request must carry (prefer the variable: a flag "
            "shows in the process list). Required off loopback.",
            show_default=False,
        ),
    ] = None,
    cors_origins: Annotated[
        list[str] | None,
        typer.Option(
            "--cors-origin",
            help="Origin of a Web UI allowed to call it, such as https://temporal.example.com "
            "(repeatable). Default: the local dev server's, http://localhost:8233 and "
            "http://127.0.0.1:8233.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve Temporal's codec server protocol with the keys in $DURABLY_ENCRYPTION_KEYS,
    so the Web UI and `temporal --codec-endpoint` show encrypted runs decoded."""
    origins = cors_origins or list(_DEV_UI_ORIGINS)
    codec = EncryptionCodec.from_env()
    stop = _stop_on_signals()
    async with CodecServer(
        codec, host=host, port=port, token=token, cors_origins=origins
    ) as server:
        keys = ", ".join(codec.keys.key_ids) if codec is not None else ""
        auth = "bearer token required" if token is not None else "no token: loopback only"
        console.print(Text(f"Codec server on {host}:{server.port} (keys {keys}; {auth})"))
        console.print(Text(f"  Web UI origins allowed: {', '.join(origins)}"))
        codec_auth = f' --codec-auth "Bearer ${TOKEN_ENV}"' if token is not None else ""
        console.print(
            Text(
                "  temporal workflow show --workflow-id RUN --codec-endpoint "
                f"{shlex.quote(server.endpoint)}{codec_auth}"
            )
        )
        if token is not None and not is_loopback(host):
            console.print(
                Text(
                    "  Serve it over HTTPS (behind a TLS proxy) off this machine: the token "
                    "and the decoded payloads cross the network.",
                    style="yellow",
                )
            )
        console.print("Serving. Press Ctrl-C to stop.")
        await stop.wait()
    console.print("Codec server stopped.")


def encryption_key(
    key_id: Annotated[
        str,
        typer.Option("--id", help="The key's name (rotate by putting a new name first)."),
    ] = "k1",
) -> None:
    """Print a new random encryption key as ID:BASE64, for DURABLY_ENCRYPTION_KEYS.

    Every worker, client and codec server of the cluster needs it; keep it
    for as long as any run's history holds payloads encrypted with it.
    """
    line = f"{key_id}:{EncryptionKeys.generate_key()}"
    try:
        EncryptionKeys(parse_named_keys(line, source="--id"))  # checks the id
    except DurablyError as err:
        err_console.print(safe(f"error: {err}", style="red"))
        raise typer.Exit(2) from err
    print(line)
