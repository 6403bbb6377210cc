"""The codec server lets Temporal's own tools read encrypted runs, and nobody else.

One encrypted run on the session's dev server and one codec server (with a
bearer token) serve the whole module; `temporal workflow show` reads the
run through it, as an operator would.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import os
import secrets
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.testing import WorkflowEnvironment

from durably import Agent, AgentRegistration, DurableClient, DurableRuntime, ScriptedModel
from durably.codec import ENV_KEYS, EncryptionCodec, EncryptionKeys
from durably.codec_server import CodecServer

from .conftest import binary, cli

KEY = f"k1:{EncryptionKeys.generate_key()}"
TOKEN = secrets.token_urlsafe(24)
MARKER = "plaintext-marker-5be1"  # in the run's input and its output
UI_ORIGIN = "http://localhost:8233"


def codec() -> EncryptionCodec:
    made = EncryptionCodec.from_env({ENV_KEYS: KEY})
    assert made is not None
    return made


@pytest.fixture(scope="module")
async def run_id(env: WorkflowEnvironment) -> str:
    """A completed run, encrypted with KEY, whose input and output hold MARKER."""
    agent = Agent(id="secretive", model=ScriptedModel([f"answer {MARKER}"]), instructions="")
    encryption = codec()
    client = DurableClient(
        env.client, task_queue=f"durably-test-{uuid.uuid4().hex[:10]}", encryption=encryption
    )
    async with await DurableRuntime.open(
        client=client, agents=[AgentRegistration(agent, version="1")], encryption=encryption
    ) as runtime:
        await runtime.resume()
        run = await client.start_run("secretive", f"question {MARKER}")
        assert (await run.result()).output == f"answer {MARKER}"
    return run.run_id


@pytest.fixture(scope="module")
async def server() -> AsyncIterator[CodecServer]:
    async with CodecServer(codec(), port=0, token=TOKEN, cors_origins=[UI_ORIGIN]) as served:
        yield served


def endpoint(server: CodecServer) -> str:
    return f"http://127.0.0.1:{server.port}"


async def show(env: WorkflowEnvironment, run_id: str, *codec_flags: str) -> Any:
    """`temporal workflow show --output json` of the run, parsed."""
    shown = await cli(
        binary("temporal"), "workflow", "show", "--workflow-id", run_id, "--output", "json",
        "--address", env.client.service_client.config.target_host, *codec_flags,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


def payloads(node: Any) -> Iterator[tuple[bytes, bytes]]:
    """Every payload in a history's JSON, as (encoding, data) bytes."""
    if isinstance(node, dict):
        if "metadata" in node and "data" in node:
            encoding = node["metadata"].get("encoding", "")
            yield base64.b64decode(encoding), base64.b64decode(node["data"])
        for value in node.values():
            yield from payloads(value)
    elif isinstance(node, list):
        for value in node:
            yield from payloads(value)


async def post(
    url: str, body: bytes, headers: dict[str, str], method: str = "POST"
) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (lower-cased) and body of one HTTP request."""

    def send() -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(url, data=body, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, _lower(response.headers), response.read()
        except urllib.error.HTTPError as err:
            return err.code, _lower(err.headers), err.read()

    return await asyncio.to_thread(send)


def _lower(headers: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def payloads_json(*items: Payload) -> bytes:
    return json_format.MessageToJson(Payloads(payloads=items)).encode()


async def test_temporal_shows_an_encrypted_run_decoded_only_through_the_codec_server(
    env: WorkflowEnvironment, run_id: str, server: CodecServer
) -> None:
    """With the endpoint and the token, the input and output read in clear; without
    them, every payload of the history is ciphertext."""
    codec_flags = ("--codec-endpoint", endpoint(server), "--codec-auth", f"Bearer {TOKEN}")
    decoded = list(payloads(await show(env, run_id, *codec_flags)))
    assert any(MARKER.encode() in data for _, data in decoded)
    assert all(encoding != b"binary/encrypted" for encoding, _ in decoded)

    stored = list(payloads(await show(env, run_id)))
    assert not any(MARKER.encode() in data for _, data in stored)
    assert b"binary/encrypted" in {encoding for encoding, _ in stored}


async def test_a_wrong_token_is_refused_and_temporal_cannot_decode_with_it(
    env: WorkflowEnvironment, run_id: str, server: CodecServer
) -> None:
    for auth in ({}, {"Authorization": "Bearer not-the-token"}, {"Authorization": TOKEN}):
        status, headers, body = await post(
            f"{endpoint(server)}/decode", payloads_json(), {**auth, "X-Namespace": "default"}
        )
        assert status == 401, auth
        assert headers["www-authenticate"] == "Bearer"
        assert "missing or wrong bearer token" in json.loads(body)["error"]

    shown = await cli(
        binary("temporal"), "workflow", "show", "--workflow-id", run_id, "--output", "json",
        "--address", env.client.service_client.config.target_host,
        "--codec-endpoint", endpoint(server), "--codec-auth", "Bearer not-the-token",
        "--command-timeout", "2s",
    )  # fmt: skip
    # The CLI retries a refused decode until its deadline, then fails without a word
    # on why: hence the short --command-timeout.
    assert shown.returncode == 1
    assert MARKER not in shown.stdout + shown.stderr


async def test_the_web_uis_preflight_is_answered_for_its_origin_only(
    server: CodecServer,
) -> None:
    """The UI sends Content-Type and X-Namespace, Authorization when it passes its
    token, and cookies with "include cross-origin credentials"."""
    preflight = {
        "Origin": UI_ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type,x-namespace",
    }
    status, headers, _ = await post(f"{endpoint(server)}/decode", b"", preflight, "OPTIONS")
    assert status == 200
    assert headers["access-control-allow-origin"] == UI_ORIGIN
    assert headers["access-control-allow-credentials"] == "true"
    allowed = {h.strip().lower() for h in headers["access-control-allow-headers"].split(",")}
    assert {"authorization", "content-type", "x-namespace"} <= allowed
    assert "POST" in headers["access-control-allow-methods"]

    elsewhere = {**preflight, "Origin": "https://evil.example"}
    status, headers, _ = await post(f"{endpoint(server)}/decode", b"", elsewhere, "OPTIONS")
    assert status == 400
    assert "access-control-allow-origin" not in headers

    # The answer itself carries the origin, or the browser hides it from the UI.
    status, headers, _ = await post(
        f"{endpoint(server)}/decode",
        payloads_json(),
        {"Origin": UI_ORIGIN, "Authorization": f"Bearer {TOKEN}", "X-Namespace": "default"},
    )
    assert status == 200
    assert headers["access-control-allow-origin"] == UI_ORIGIN


async def test_a_payload_of_a_key_not_held_gets_an_error_naming_the_key(
    server: CodecServer,
) -> None:
    other = EncryptionCodec(EncryptionKeys({"k-old": os.urandom(32)}))
    (sealed,) = await other.encode([Payload(metadata={"encoding": b"json/plain"}, data=b"1")])
    status, _, body = await post(
        f"{endpoint(server)}/default/decode",
        payloads_json(sealed),
        {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    assert status == 422
    error = json.loads(body)
    assert error["key_id"] == "k-old"
    assert "encrypted with key 'k-old', which this process does not hold" in error["error"]


async def test_encode_then_decode_round_trips_and_an_oversized_body_gets_413(
    server: CodecServer,
) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    plain = Payload(metadata={"encoding": b"json/plain"}, data=json.dumps(MARKER).encode())
    status, _, sealed = await post(f"{endpoint(server)}/encode", payloads_json(plain), auth)
    assert status == 200 and MARKER.encode() not in sealed
    status, _, opened = await post(f"{endpoint(server)}/decode", sealed, auth)
    assert status == 200
    assert json_format.Parse(opened, Payloads()).payloads[0] == plain

    def oversized() -> int:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        try:
            conn.putrequest("POST", "/decode")
            for name, value in {**auth, "Content-Length": str(9 * 2**20)}.items():
                conn.putheader(name, value)
            conn.endheaders()  # the body is never sent: the declared length is refused
            return conn.getresponse().status
        finally:
            conn.close()

    assert await asyncio.to_thread(oversized) == 413


async def test_serving_off_loopback_without_a_token_is_refused() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURABLY_")}
    durably = (sys.executable, "-m", "durably", "codec-server", "--port", "0")

    exposed = await cli(*durably, "--host", "0.0.0.0", env={**env, ENV_KEYS: KEY})
    assert exposed.returncode == 1
    assert "refusing to serve the codec on 0.0.0.0 without a bearer token" in exposed.stderr
    assert "DURABLY_CODEC_SERVER_TOKEN" in exposed.stderr
    assert "Traceback" not in exposed.stderr

    keyless = await cli(*durably, env=env)
    assert keyless.returncode == 1
    assert "the codec server needs the encryption keys: set DURABLY_ENCRYPTION_KEYS" in (
        keyless.stderr
    )


async def test_without_a_token_only_requests_addressed_to_localhost_are_served() -> None:
    """A page whose own name was made to resolve to 127.0.0.1 gets nothing decoded."""
    async with CodecServer(codec(), port=0) as tokenless:
        url = f"{endpoint(tokenless)}/decode"
        status, _, _ = await post(url, payloads_json(), {"Host": f"localhost:{tokenless.port}"})
        assert status == 200
        status, _, body = await post(url, payloads_json(), {"Host": "rebound.example"})
        assert status == 403
        assert "answers requests addressed to localhost only" in json.loads(body)["error"]
