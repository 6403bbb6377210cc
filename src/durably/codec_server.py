"""A codec server: Temporal's Web UI and CLI show encrypted payloads decoded.

With `durably.codec` on, the server's history holds ciphertext, so the Web
UI and ``temporal workflow show`` show nothing readable. They can ask an
HTTP service holding the keys to decode for them (Temporal's "remote codec
server" protocol): ``POST .../decode`` and ``POST .../encode``, each taking
and returning ``{"payloads": [...]}``, the protobuf JSON form of
`temporal.api.common.v1.Payloads`. This module is that service::

    durably codec-server                           # 127.0.0.1:8081, keys from the environment
    temporal workflow show --workflow-id RUN --codec-endpoint http://127.0.0.1:8081

    async with CodecServer(EncryptionCodec.from_env(), port=8081) as server:
        ...  # server.endpoint is what to give the UI and the CLI

What it guards against: whoever can reach it can read every payload (and,
through ``/encode``, write payloads the workers will trust), so it is a
key holder. Off the loopback interface it refuses to start without a bearer
token (``Authorization: Bearer TOKEN``, compared in constant time); a
request without it gets 401 (without a token, a request must be addressed
to localhost, whatever name resolved there). The Temporal CLI sends one with
``--codec-auth "Bearer TOKEN"``. The Web UI cannot send a token of your
choosing: it sends ``Authorization: Bearer <its own login token>`` only when
"Pass the user access token" is set and the endpoint is HTTPS, and sends
cookies when "Include cross-origin credentials" is set. So for the Web UI,
run a codec server on each operator's machine (loopback, no token), or put
one behind a proxy that authenticates those logins.

Browsers call it from the Web UI's page, so it answers CORS preflights for
the origins it is given (`cors_origins`: the UI's exact origin, such as
``http://localhost:8233``), allowing the headers the UI sends
(``Content-Type``, ``X-Namespace``, ``Authorization``) and credentials. Every
namespace is decoded with the one codec: ``X-Namespace`` is accepted and
ignored, as are the path's leading segments (the protocol lets an endpoint
be mounted at any depth, e.g. ``/{namespace}/decode``). Bodies over
`MAX_BODY_BYTES` are refused with 413; a payload the codec cannot decode
(`EncryptionKeyError`: its key is not held here) gets 422 with a JSON error
naming the key id, never a stack trace.
"""

from __future__ import annotations

import hmac
import logging
import urllib.parse
from collections.abc import Awaitable, Callable, Collection, Sequence

from google.protobuf import json_format
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.converter import PayloadCodec

from durably._http import (
    AsgiServer,
    BodyTooLarge,
    from_loopback,
    is_loopback,
    read_body,
    tokenless,
)
from durably.codec import ENV_KEYS, ENV_KEYS_FILE, EncryptionKeyError
from durably.errors import DurablyError

__all__ = [
    "DEFAULT_PORT",
    "MAX_BODY_BYTES",
    "TOKEN_ENV",
    "CodecServer",
    "codec_app",
    "is_loopback",
]

DEFAULT_PORT = 8081
"""The port Temporal's codec server samples use."""
MAX_BODY_BYTES = 8 * 2**20
"""The largest request body served: above Temporal's 2 MB payload limit, with room
for a page of history's payloads and their base64."""
TOKEN_ENV = "DURABLY_CODEC_SERVER_TOKEN"
"""Where `durably codec-server` reads its bearer token when `--token` is not given."""

_ALLOWED_HEADERS = ("Authorization", "Content-Type", "X-Namespace")
_log = logging.getLogger("durably.codec_server")


def codec_app(
    codec: PayloadCodec,
    *,
    token: str | None = None,
    cors_origins: Collection[str] = (),
    max_body_bytes: int = MAX_BODY_BYTES,
    loopback_only: bool = False,
) -> Starlette:
    """The ASGI app serving `codec` by Temporal's codec server protocol.

    Args:
        codec: Encodes and decodes the payloads of every namespace.
        token: The bearer token every request must carry.
        cors_origins: The browser origins allowed to call it (the Web UI's).
        max_body_bytes: Larger request bodies get 413.
        loopback_only: Without a token, required: serve requests from this
            machine only (peer and `Host` both loopback; `CodecServer` on
            127.0.0.1 does). Unsafe behind a proxy on the same machine.

    .. versionchanged:: Unreleased
       Without a token it needs `loopback_only=True`, and checks the peer too.
    """
    _check_options(token, cors_origins, max_body_bytes, loopback_only)
    expected = None if token is None else f"Bearer {token}".encode()

    def endpoint(
        apply: Callable[[Sequence[Payload]], Awaitable[list[Payload]]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def serve(request: Request) -> Response:
            refused = _refusal(request, expected)
            if refused is not None:
                return refused
            body = await _read_body(request, max_body_bytes)
            if isinstance(body, Response):
                return body
            try:
                payloads = json_format.Parse(body, Payloads(), ignore_unknown_fields=True)
            except json_format.ParseError as err:
                return _error(
                    400, f'the body is not {{"payloads": [...]}} in protobuf JSON ({err})'
                )
            try:
                result = Payloads(payloads=await apply(payloads.payloads))
            except EncryptionKeyError as err:
                return _error(422, str(err), key_id=err.key_id)
            except DurablyError as err:
                return _error(422, str(err))
            # Built by hand: protobuf's JSON leaves out an empty list, and clients index it.
            answer = {"payloads": [json_format.MessageToDict(p) for p in result.payloads]}
            return JSONResponse(answer)

        return serve

    routes = [
        Route("/{prefix:path}/decode", endpoint(codec.decode), methods=["POST"]),
        Route("/decode", endpoint(codec.decode), methods=["POST"]),
        Route("/{prefix:path}/encode", endpoint(codec.encode), methods=["POST"]),
        Route("/encode", endpoint(codec.encode), methods=["POST"]),
    ]
    cors = Middleware(
        CORSMiddleware,
        allow_origins=list(cors_origins),
        allow_methods=["POST"],
        allow_headers=list(_ALLOWED_HEADERS),
        allow_credentials=True,
        # A Web UI served from elsewhere (Temporal Cloud's) calling a codec
        # server on this machine is what Chrome's private network checks ask about.
        allow_private_network=True,
    )
    return Starlette(routes=routes, middleware=[cors])


class CodecServer(AsgiServer):
    """`codec_app` served by uvicorn in this event loop, as an async context manager.

    Entering binds the port (a `DurablyError` if it is taken, or if `host` is
    not loopback and there is no `token`) and starts serving; leaving stops.
    Signals are left to the caller: uvicorn's own Ctrl-C handling would stop
    this server alone, while the caller's worker and dev server go on.

    Args:
        codec: The codec that encodes and decodes; None is refused with the
            variable to set.
        host: The interface to listen on; anything but loopback needs `token`.
        port: The TCP port; 0 picks a free one (read `port` after entering).
        token: The bearer token requests must carry (see `codec_app`).
        cors_origins: The Web UI origins allowed to call it from a browser.
        max_body_bytes: Larger request bodies get 413.
    """

    def __init__(
        self,
        codec: PayloadCodec | None,
        *,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        token: str | None = None,
        cors_origins: Collection[str] = (),
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        if codec is None:
            raise DurablyError(
                f"the codec server needs the encryption keys: set {ENV_KEYS} (or "
                f"{ENV_KEYS_FILE}) to the keys the workers use"
            )
        if token is None and not is_loopback(host):
            raise DurablyError(
                f"refusing to serve the codec on {host} without a bearer token: anyone who "
                f"can reach it could read every payload. Set {TOKEN_ENV} (or --token) to a "
                "long random secret, or listen on 127.0.0.1"
            )
        super().__init__(
            codec_app(
                codec,
                token=token,
                cors_origins=cors_origins,
                max_body_bytes=max_body_bytes,
                loopback_only=token is None,
            ),
            host=host,
            port=port,
            what="the codec server",
        )

    @property
    def endpoint(self) -> str:
        """The URL to give the Web UI and `temporal --codec-endpoint` on this machine."""
        return self.url


def _check_options(
    token: str | None, cors_origins: Collection[str], max_body_bytes: int, loopback_only: bool
) -> None:
    """Refuse options that would serve the codec to the wrong callers, before serving."""
    if token is not None and not token.strip():
        raise DurablyError("the codec server's bearer token is empty; give a long random one")
    if token is None:
        tokenless("codec_app", loopback_only)
    if max_body_bytes < 1:
        raise DurablyError(f"max_body_bytes must be positive, got {max_body_bytes}")
    for origin in cors_origins:
        if not _is_origin(origin):
            raise DurablyError(
                f"CORS origin {origin!r} is not an origin: give the Web UI's scheme, host "
                "and port, such as http://localhost:8233 (no path, no '*': credentials "
                "are allowed, so every origin must be named)"
            )


def _refusal(request: Request, expected: bytes | None) -> Response | None:
    """The response refusing a request that may not use the codec (None: it may).

    `expected` is the whole `Authorization` value required, or None for no token.
    """
    if expected is None:
        if from_loopback(request):
            return None
        return _error(
            403,
            "this codec server has no token, so it answers requests addressed to "
            "localhost only; give it a token to serve it under another name",
        )
    if hmac.compare_digest(request.headers.get("authorization", "").encode(), expected):
        return None
    return _error(
        401,
        "missing or wrong bearer token: send `Authorization: Bearer TOKEN` "
        "(the Temporal CLI: --codec-auth 'Bearer TOKEN')",
        headers={"WWW-Authenticate": "Bearer"},
    )


async def _read_body(request: Request, limit: int) -> bytes | Response:
    """The request's body, or the response refusing it (413 past `limit` bytes)."""
    try:
        return await read_body(request, limit)
    except BodyTooLarge:
        return _too_large(limit)
    except ClientDisconnect:
        return _error(400, "the client disconnected before sending the whole body")


def _is_origin(origin: str) -> bool:
    """Whether `origin` is what a browser sends as `Origin`: scheme, host, port; no more."""
    parts = urllib.parse.urlsplit(origin)
    return (
        parts.scheme in ("http", "https")
        and bool(parts.netloc)
        and origin == f"{parts.scheme}://{parts.netloc}"
    )


def _too_large(limit: int) -> JSONResponse:
    return _error(413, f"the request body is over {limit} bytes; send fewer payloads at once")


def _error(
    status: int,
    message: str,
    *,
    key_id: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body: dict[str, str] = {"error": message}
    if key_id is not None:
        body["key_id"] = key_id
    _log.warning("codec request refused (%s): %s", status, message)
    return JSONResponse(body, status_code=status, headers=headers)
