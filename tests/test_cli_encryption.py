"""The `durably` commands on encrypted runs: each reads its keys from the environment.

An operator holding DURABLY_ENCRYPTION_KEYS starts, reads and approves an
encrypted run from the command line, against a `durably worker --encrypt`
process; one without it gets a message naming the key it lacks. `durably dev
--encrypt` is driven with test_cli_dev's harness.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import signal
import stat
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from temporalio.testing import WorkflowEnvironment

from durably import DurableClient, RunStatus
from durably.codec import ENV_KEYS, ENV_KEYS_FILE, EncryptionCodec, EncryptionKeys
from durably.dev import dev_key_file
from durably.examples import support_desk

from .conftest import cli, free_ports, wait_for_status
from .test_cli_dev import DurablyDev

KEY = f"k1:{EncryptionKeys.generate_key()}"
AGENTS = "durably.examples.support_desk:registrations"


def keyless_env() -> dict[str, str]:
    """This environment without TEMPORAL_* or DURABLY_* settings."""
    drop = ("TEMPORAL_", "DURABLY_")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


async def durably(*args: str, key: str | None = KEY) -> subprocess.CompletedProcess[str]:
    env = keyless_env() if key is None else {**keyless_env(), ENV_KEYS: key}
    return await cli(sys.executable, "-m", "durably", *args, env=env)


@contextlib.asynccontextmanager
async def encrypting_worker(*args: str) -> AsyncIterator[None]:
    """`durably worker --encrypt` with KEY, stopped (and checked to exit 0) on leaving."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "durably", "worker", "--encrypt", "--agents", AGENTS, *args,
        env={**keyless_env(), ENV_KEYS: KEY, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        yield
        proc.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, output.decode(errors="replace")
        assert b"worker started" in output and b"encrypted=True" in output
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


async def test_start_show_and_approve_an_encrypted_run_with_the_key_from_the_environment(
    env: WorkflowEnvironment, task_queue: str
) -> None:
    """What the commands send is encrypted; without the key, reading the run names it."""
    target = ("--target", env.client.service_client.config.target_host)
    run_id = f"secret-{uuid.uuid4().hex[:8]}"
    request = support_desk.demo_input()  # opens a ticket: waits for approval
    client = DurableClient(
        env.client, task_queue=task_queue, encryption=EncryptionCodec.from_env({ENV_KEYS: KEY})
    )

    async with encrypting_worker("--task-queue", task_queue, *target):
        started = await durably(
            "start", support_desk.AGENT_ID, request, "--run-id", run_id,
            "--task-queue", task_queue, *target,
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        run = await client.get_run(run_id)
        await wait_for_status(run, RunStatus.WAITING)

        shown = await durably("runs", "show", run_id, *target)
        assert shown.returncode == 0, shown.stderr
        assert "waiting" in shown.stdout and "create_ticket" in shown.stdout

        keyless = await durably("runs", "show", run_id, *target, key=None)
        assert keyless.returncode == 1
        assert (
            "error: this run's payloads are encrypted with key 'k1', and no encryption key "
            "is set here: set DURABLY_ENCRYPTION_KEYS"
        ) in keyless.stderr
        assert "Traceback" not in keyless.stderr

        approved = await durably("approve", run_id, "--as", "alice", *target)
        assert approved.returncode == 0, approved.stderr
        assert "approved by alice" in approved.stdout
        assert "opened ticket" in (await run.result()).output

    history = await env.client.get_workflow_handle(run_id).fetch_history()
    (started_input,) = history.events[0].workflow_execution_started_event_attributes.input.payloads
    assert started_input.metadata["encoding"] == b"binary/encrypted"
    stored = b"".join(
        base64.b64decode(d) for d in re.findall(r'"data": ?"([^"]*)"', history.to_json())
    )
    assert b"VPN disconnects" not in stored and b"alice" not in stored


async def test_a_worker_told_to_encrypt_without_a_key_refuses_to_start() -> None:
    refused = await durably("worker", "--encrypt", "--agents", AGENTS, key=None)
    assert refused.returncode == 1
    assert "--encrypt: no encryption key is set. Set DURABLY_ENCRYPTION_KEYS" in refused.stderr
    assert "durably encryption-key" in refused.stderr


async def test_encryption_key_prints_a_named_key_the_codec_accepts() -> None:
    made = await durably("encryption-key", "--id", "2026-12", key=None)
    assert made.returncode == 0, made.stderr
    line = made.stdout.strip()
    codec = EncryptionCodec.from_env({ENV_KEYS: line})
    assert codec is not None and codec.keys.key_ids == ("2026-12",)

    bad = await durably("encryption-key", "--id", "no spaces", key=None)
    assert bad.returncode == 2
    assert "key id 'no spaces' must be 1 to 32 letters" in bad.stderr


def test_the_dev_key_file_is_private_and_reused(tmp_path: Path) -> None:
    """A second `durably dev --encrypt` finds the key the database's runs need."""
    made = dev_key_file(tmp_path / "state")
    assert made is not None and stat.S_IMODE(made.stat().st_mode) == 0o600
    assert dev_key_file(tmp_path / "state") == made
    assert EncryptionCodec.from_env({ENV_KEYS_FILE: str(made)}) is not None
    assert dev_key_file(tmp_path / "elsewhere", create=False) is None


async def test_dev_encrypt_serves_the_web_ui_a_codec_and_says_where_the_key_is(
    tmp_path: Path,
) -> None:
    port, ui_port, codec_port = free_ports(3)
    dev = await DurablyDev.start(
        tmp_path / "t.db", port, ui_port, "--encrypt", "--codec-port", str(codec_port)
    )
    try:
        await dev.line_starting("Serving.")
        key_file = (tmp_path / "encryption-keys").resolve()
        assert f"export {ENV_KEYS_FILE}={key_file}" in dev.line_with("Encryption")
        endpoint = f"http://localhost:{codec_port}"
        assert endpoint in dev.line_with("Codec server")

        def ui_settings() -> Any:
            url = f"http://127.0.0.1:{ui_port}/api/v1/settings"
            with urllib.request.urlopen(url, timeout=10) as response:
                return json.load(response)

        assert (await asyncio.to_thread(ui_settings))["Codec"]["Endpoint"] == endpoint

        target = ("--target", f"127.0.0.1:{port}")
        started = await cli(
            sys.executable, "-m", "durably", "start", support_desk.AGENT_ID,
            support_desk.demo_input_unattended(), "--wait", *target,
            env={**keyless_env(), ENV_KEYS_FILE: str(key_file)},
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        assert "KB-210" in started.stdout

        assert await dev.ctrl_c() == 0, dev.output
        dev.assert_nothing_left()
    finally:
        await dev.kill()
