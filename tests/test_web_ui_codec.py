"""The Web UI shows an encrypted run decoded through `durably codec-server`, and
encoded without it (SPEC §18), in headless Chromium.

Chromium is Debian's `chromium` (.ci/run installs it), driven over the
DevTools protocol on a pipe (`--remote-debugging-pipe`, see `Chromium`): no
browser download, no Python dependency. The screenshots are the test's
artifacts, kept in tests/artifacts/web_ui_codec/ (git-ignored), beside the
logs of the browser and the codec server.

What the UI needs: the dev server's `--ui-codec-endpoint URL` (what
`durably dev --encrypt` passes) makes every page call `POST URL/decode` from
the page's origin, `http://localhost:<ui port>`, with a CORS preflight for
its `Content-Type` and `X-Namespace` headers; a browser cannot take that
setting back (its own Codec Server setting only overrides it), so the page
without a codec server comes from the same dev server restarted without it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    DurableRuntime,
    RunStatus,
    ScriptedModel,
)
from durably.codec import ENCODING, ENV_KEYS, EncryptionCodec, EncryptionKeys
from durably.dev import DevServer, signal_group
from durably.models import tool_call
from durably.tools import question_tool

from .browser import NEEDS_CHROMIUM, chromium
from .conftest import binary, echo, free_ports, wait_for_status

ARTIFACTS = Path(__file__).parent / "artifacts" / "web_ui_codec"

pytestmark = NEEDS_CHROMIUM


def customer(details_marker: str) -> AgentRegistration:
    """An agent that asks a question holding `details_marker` and waits for the answer:
    the run's current details then name that question."""
    agent = Agent(
        id="customer",
        model=ScriptedModel(
            [tool_call("ask_user", question=f"Which order, {details_marker}?"), echo]
        ),
        instructions="",
        tools=[question_tool(name="ask_user", description="Ask the customer.")],
    )
    return AgentRegistration(agent, version="1")


class TestWebUiWithTheCodecServer:
    async def test_shows_the_input_and_current_details_decoded_and_without_it_encoded(
        self, tmp_path: Path
    ) -> None:
        """An encrypted run's Input and current details read in clear in a UI pointed at
        `durably codec-server`; a UI pointed at none shows neither (the payloads encoded)."""
        secret_input, secret_details = f"IN{uuid.uuid4().hex}", f"DET{uuid.uuid4().hex}"
        key = EncryptionKeys.generate_key()
        codec = EncryptionCodec(EncryptionKeys({"k1": base64.b64decode(key)}))
        agents = [customer(secret_details)]
        port, ui_port, codec_port = free_ports(3)
        server = DevServer(
            db=tmp_path / "t.db",
            port=port,
            ui_port=ui_port,
            ui_codec_endpoint=f"http://127.0.0.1:{codec_port}",
        )
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        print(f"screenshots in {ARTIFACTS}")

        async with (
            codec_server(
                codec_port, server.ui_url, {ENV_KEYS: f"k1:{key}"}, ARTIFACTS / "codec-server.log"
            ),
            chromium(tmp_path / "profile", ARTIFACTS / "chromium.log") as browser,
        ):
            async with serving(server, agents, codec) as client:
                run = await client.start_run("customer", f"where is my order {secret_input}?")
                await wait_for_status(run, RunStatus.WAITING)
                decoded = await browser.open(server.workflow_url(run.run_id))
                await decoded.wait_for_text("Input", secret_input)
                await decoded.screenshot(ARTIFACTS / "decoded-input.png")
                await decoded.click('a[href$="/user-metadata"]')
                await decoded.wait_for_text("Waiting for an answer", secret_details)
                await decoded.screenshot(ARTIFACTS / "decoded-current-details.png")

            server.ui_codec_endpoint = None  # the same run, the UI pointed at no codec server
            async with serving(server, agents, codec) as client:
                ciphertext = await input_ciphertext(client, run.run_id)
                encoded = await browser.open(server.workflow_url(run.run_id))
                shown = await encoded.wait_for_text("Input", ciphertext[:40])
                await encoded.screenshot(ARTIFACTS / "encoded-input.png")
                assert secret_input not in shown
                await encoded.click('a[href$="/user-metadata"]')
                # What the UI makes of a query's answer it cannot decode.
                shown = await encoded.wait_for_text("Current Details", "No Current Details")
                await encoded.screenshot(ARTIFACTS / "encoded-current-details.png")
                assert secret_details not in shown
                assert secret_input not in shown


async def input_ciphertext(client: DurableClient, run_id: str) -> str:
    """The run's input as the server holds it: the encrypted payload's data, base64
    (how the UI shows a payload it cannot decode)."""
    history = await client.temporal.get_workflow_handle(run_id).fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    (payload,) = started.input.payloads
    assert payload.metadata["encoding"] == ENCODING
    return base64.b64encode(payload.data).decode()


@contextlib.asynccontextmanager
async def serving(
    server: DevServer, agents: Sequence[AgentRegistration], codec: EncryptionCodec
) -> AsyncIterator[DurableClient]:
    """`server` started, with an encrypting worker hosting `agents` (it answers the
    UI's query for the current details); both stopped on leaving."""
    await server.start()
    try:
        client = DurableClient(server.client, task_queue="web-ui", encryption=codec)
        async with await DurableRuntime.open(client=client, agents=agents) as runtime:
            await runtime.resume()
            yield client
    finally:
        await server.stop()


@contextlib.asynccontextmanager
async def codec_server(
    port: int, cors_origin: str, keys: dict[str, str], log: Path
) -> AsyncIterator[None]:
    """`durably codec-server` on loopback `port` (so no token), with `keys` in its
    environment, answering `cors_origin`; stopped on leaving."""
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            binary("durably"),
            "codec-server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--cors-origin",
            cors_origin,
            env={**os.environ, **keys},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        async with asyncio.timeout(30):
            while True:
                if await _accepts("127.0.0.1", port):
                    break
                if proc.returncode is not None:
                    output = await asyncio.to_thread(log.read_text, errors="replace")
                    raise AssertionError(
                        f"`durably codec-server` exited with code {proc.returncode}: "
                        f"{output[-2000:]}"
                    )
                await asyncio.sleep(0.05)
        yield
    finally:
        signal_group(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            signal_group(proc.pid, signal.SIGKILL)
            await proc.wait()


async def _accepts(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection(host, port)
    except OSError:
        return False
    writer.close()
    return True
