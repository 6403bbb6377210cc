"""A namespace made ready for durably: `durably setup`, the worker's check, config profiles.

Each test makes its own namespace on the session dev server (a new namespace
has none of durably's search attributes), runs the commands as an operator
types them, and awaits what they should cause (a worker polling its task
queue) rather than sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from durably import DurableClient, DurableRuntime
from durably._search_attributes import survey_by_visibility
from durably.contract import SEARCH_ATTRIBUTES
from durably.errors import SearchAttributesMissingError

from .conftest import binary, cli, eventually

AGENTS = "durably.examples.support_desk:registrations"
ALL = ", ".join(k.name for k in SEARCH_ATTRIBUTES)


def target_of(env: WorkflowEnvironment) -> str:
    return env.client.service_client.config.target_host


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without the developer's TEMPORAL_* settings, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


async def durably(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return await cli(sys.executable, "-m", "durably", *args, env=env or clean_env())


async def new_namespace(env: WorkflowEnvironment, *keyword_attributes: str) -> str:
    """A namespace of its own on the dev server, holding only `keyword_attributes`."""
    namespace = f"setup-{uuid.uuid4().hex[:10]}"
    temporal = binary("temporal")
    address = ["--address", target_of(env), "--namespace", namespace]
    made = await cli(temporal, "operator", "namespace", "create", *address)
    assert made.returncode == 0, made.stderr
    for name in keyword_attributes:
        added = await cli(
            temporal, "operator", "search-attribute", "create", *address,
            "--name", name, "--type", "Keyword",
        )  # fmt: skip
        assert added.returncode == 0, added.stderr
    return namespace


@contextlib.asynccontextmanager
async def worker_process(*args: str, env: dict[str, str]) -> AsyncIterator[list[str]]:
    """`durably worker` running with `args`; its output lines (stopped with SIGTERM after)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "durably", "worker", "--agents", AGENTS, *args,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    lines: list[str] = []

    async def pump() -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            lines.append(line.decode(errors="replace").rstrip("\n"))

    reading = asyncio.create_task(pump())
    try:
        yield lines
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0, "\n".join(lines)
        await reading
        assert "Worker stopped." in lines, "\n".join(lines)
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


async def polled(client: Client, namespace: str, task_queue: str, lines: list[str]) -> None:
    """Wait until a worker polls `task_queue` in `namespace` (fails if none does in 30 s)."""

    async def polling() -> bool:
        described = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=namespace,
                task_queue=TaskQueue(name=task_queue),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
            )
        )
        return len(described.pollers) > 0

    try:
        await eventually(polling)
    except TimeoutError:
        raise AssertionError("no worker polled; its output:\n" + "\n".join(lines)) from None


async def test_a_worker_stops_on_a_namespace_without_the_attributes_until_setup_registers_them(
    env: WorkflowEnvironment,
) -> None:
    """The worker names what is missing and `durably setup`; setup registers exactly
    those, a second time changes nothing, and the worker then starts."""
    target = target_of(env)
    # A namespace from before DurablyAgentVersion, DurablyFingerprint and DurablySession existed.
    namespace = await new_namespace(env, "DurablyStatus", "DurablyAgent")
    where = ("--target", target, "--namespace", namespace)

    stopped = await durably("worker", "--agents", AGENTS, *where)
    assert stopped.returncode == 1, stopped.stdout
    assert (
        f"error: namespace '{namespace}' lacks durably's search attributes "
        "DurablyAgentVersion, DurablyFingerprint, DurablySession"
    ) in stopped.stderr
    assert f"Run `durably setup --target {target} --namespace {namespace}`" in stopped.stderr
    assert "worker started" not in stopped.stdout
    # Where the operator service is closed (Temporal Cloud), visibility finds the same.
    ns_client = await Client.connect(target, namespace=namespace)
    found = await survey_by_visibility(ns_client)
    assert found is not None
    assert found.missing == ("DurablyAgentVersion", "DurablyFingerprint", "DurablySession")

    first = await durably("setup", *where)
    assert first.returncode == 0, first.stderr
    assert (
        "Registered DurablyAgentVersion, DurablyFingerprint, DurablySession (Keyword) on "
        f"namespace '{namespace}'"
    ) in first.stdout
    assert f"Already registered on namespace '{namespace}': DurablyStatus, DurablyAgent." in (
        first.stdout
    )

    again = await durably("setup", *where)
    assert again.returncode == 0, again.stderr
    assert "Registered" not in again.stdout
    assert f"Already registered on namespace '{namespace}': {ALL}." in again.stdout

    found = await survey_by_visibility(ns_client)
    assert found is not None and found.complete

    task_queue = f"setup-{uuid.uuid4().hex[:8]}"
    async with worker_process(*where, "--task-queue", task_queue, env=clean_env()) as lines:
        await polled(env.client, namespace, task_queue, lines)


async def test_setup_refuses_an_attribute_of_another_type(env: WorkflowEnvironment) -> None:
    """A `DurablyStatus` registered as Text cannot hold durably's statuses: setup and
    the worker both say so, and setup still registers the others."""
    namespace = await new_namespace(env)
    temporal_args = ("--address", target_of(env), "--namespace", namespace)
    added = await cli(
        binary("temporal"), "operator", "search-attribute", "create", *temporal_args,
        "--name", "DurablyStatus", "--type", "Text",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    where = ("--target", target_of(env), "--namespace", namespace)

    done = await durably("setup", *where)
    assert done.returncode == 1
    assert (
        "Registered DurablyAgent, DurablyAgentVersion, DurablyFingerprint, DurablySession"
        in done.stdout
    )
    assert f"on namespace '{namespace}', DurablyStatus is Text, where durably needs Keyword" in (
        done.stderr
    )
    stopped = await durably("worker", "--agents", AGENTS, *where)
    assert stopped.returncode == 1
    assert "has DurablyStatus registered as Text, where durably needs Keyword" in stopped.stderr


@pytest.fixture(scope="module")
async def time_skipping() -> AsyncIterator[WorkflowEnvironment]:
    """Temporal's time-skipping test server: it has neither the operator service nor
    visibility queries, so it refuses both as Temporal Cloud refuses the first."""
    async with await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=binary("temporal-test-server")
    ) as env:
        yield env


async def test_where_the_server_refuses_setup_prints_the_cloud_steps(
    time_skipping: WorkflowEnvironment,
) -> None:
    done = await durably("setup", "--target", target_of(time_skipping))
    assert done.returncode == 1
    assert "The server refused to register search attributes with these credentials" in (
        done.stdout
    )
    sas = " ".join(f'--sa "{k.name}=Keyword"' for k in SEARCH_ATTRIBUTES)
    assert f"tcld namespace search-attributes add --namespace default {sas}" in done.stdout
    assert "Cloud UI: Namespaces > default > Edit > Custom Search Attributes" in done.stdout
    assert "follow the steps above, then run `durably setup` again to check" in done.stderr


async def test_a_worker_that_cannot_check_the_attributes_starts_with_a_warning(
    time_skipping: WorkflowEnvironment,
) -> None:
    client = DurableClient(time_skipping.client, task_queue=f"setup-{uuid.uuid4().hex[:8]}")
    with capture_logs() as logs:
        async with await DurableRuntime.open(client=client) as runtime:
            await runtime.resume()
            assert runtime._task is not None and not runtime._task.done()
    warnings = [e["event"] for e in logs if e["log_level"] == "warning"]
    assert any(w.startswith("could not check durably's search attributes") for w in warnings)


async def test_worker_setup_and_client_connect_with_a_temporal_config_profile(
    env: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--profile NAME` and `DurableClient.connect(profile=NAME)` take the address and
    namespace from the Temporal config file, nothing else naming them."""
    namespace = await new_namespace(env)
    config = tmp_path / "temporal.toml"
    config.write_text(
        f'[profile.ci]\naddress = "{target_of(env)}"\nnamespace = "{namespace}"\n'
        '[profile.default]\naddress = "127.0.0.1:1"\n'  # unreachable: only --profile works
    )
    profiled = clean_env(TEMPORAL_CONFIG_FILE=str(config))
    for name in [n for n in os.environ if n.startswith("TEMPORAL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(config))

    client = await DurableClient.connect(profile="ci")
    assert client.temporal.namespace == namespace
    assert client.temporal.service_client.config.target_host == target_of(env)
    with pytest.raises(SearchAttributesMissingError) as refused:
        await client.start_run("support-desk", "hello")
    assert f"Register them with `durably setup --target {target_of(env)} --namespace " in str(
        refused.value
    )

    done = await durably("setup", "--profile", "ci", env=profiled)
    assert done.returncode == 0, done.stderr
    assert f"on namespace '{namespace}'" in done.stdout
    assert await client.list_runs() == []

    task_queue = f"setup-{uuid.uuid4().hex[:8]}"
    async with worker_process("--profile", "ci", "--task-queue", task_queue, env=profiled) as out:
        await polled(env.client, namespace, task_queue, out)

    unknown = await durably("worker", "--agents", AGENTS, "--profile", "nope", env=profiled)
    assert unknown.returncode == 1
    assert "error: cannot read the Temporal config (Profile 'nope' not found)" in unknown.stderr
