"""A worker whose definitions drifted from what unfinished runs pinned says so at start."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence

import pytest
from pydantic import BaseModel
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.testing import WorkflowEnvironment

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    DurableRuntime,
    NeededVersion,
    RunHandle,
    RunStatus,
    ScriptedModel,
    ToolRetry,
    VersionDriftError,
    tool,
)
from durably.client._versions import changed_parts
from durably.contract import SA_AGENT, SA_AGENT_VERSION, SA_STATUS, WORKFLOW_TYPE
from durably.models import tool_call
from durably.testing import capture_logs

from .conftest import cli, eventually, wait_for_status


class Refund(BaseModel):
    refund_id: str


def refunder(
    doc: str = "Refund an order.", *, instructions: str = "Refund.", notes: int = 0
) -> AgentRegistration:
    """Agent `refunder` at version 1, its approval tool `refund` described by `doc`;
    with `notes`, it first takes that many notes, continuing as new on the way."""

    async def refund(order_id: str) -> str:
        return f"refunded {order_id}"

    async def note(n: int) -> str:
        """Take a note."""
        return f"note {n}"

    refund.__doc__ = doc
    steps = [tool_call("note", call_id=f"n{i}", n=i) for i in range(notes)]
    agent = Agent(
        id="refunder",
        model=ScriptedModel([*steps, tool_call("refund", call_id="c1", order_id="A1"), "done"]),
        instructions=instructions,
        tools=[tool(requires_approval=True)(refund), *([tool(note)] if notes else [])],
    )
    if not notes:
        return AgentRegistration(agent, version="1")
    return AgentRegistration(
        agent, version="1", tool_recovery={"note": "safe"}, continue_as_new_events=10
    )


ORIGINAL = refunder()
# The same version, its tool's docstring edited: the drift this file is about.
EDITED = refunder("Refund an order, in full.")


def edited() -> list[AgentRegistration]:
    """What `durably versions --agents tests.test_version_drift:edited` loads."""
    return [EDITED]


class TestFingerprintParts:
    def test_an_edited_docstring_changes_only_that_tools_description(self) -> None:
        before, after = ORIGINAL.fingerprint_parts, EDITED.fingerprint_parts
        assert ORIGINAL.fingerprint != EDITED.fingerprint
        assert {name for name in before if before[name] != after.get(name)} == {
            "tool refund description"
        }
        assert changed_parts(before, after) == ("tool refund description",)

    def test_the_parts_name_every_input_of_the_fingerprint(self) -> None:
        assert set(ORIGINAL.fingerprint_parts) == {
            "model",
            "instructions",
            "max_turns",
            "model_retry",
            "tool_recovery",
            "tools",
            "tool refund description",
            "tool refund input schema",
            "tool refund output schema",
            "tool refund approval",
        }
        assert ORIGINAL.pin().parts == dict(ORIGINAL.pinned_parts)

    def test_a_tool_retry_edit_changes_what_runs_check_though_not_the_fingerprint(
        self,
    ) -> None:
        """Activities refuse a run whose policies differ (its `pin_check`), `tool_retry`
        included: the drift check compares that, and names the part."""
        retried = AgentRegistration(
            ORIGINAL.agent, version="1", tool_retry=ToolRetry(initial_delay_ms=2000)
        )
        assert retried.fingerprint == ORIGINAL.fingerprint
        assert retried.pin_check != ORIGINAL.pin_check
        assert changed_parts(ORIGINAL.pinned_parts, retried.pinned_parts) == ("tool_retry",)

    def test_other_edits_name_their_own_part(self) -> None:
        rude = refunder(instructions="Refund rudely.")
        assert changed_parts(ORIGINAL.fingerprint_parts, rude.fingerprint_parts) == (
            "instructions",
        )

        async def lookup(order_id: str) -> str:
            """Look an order up."""
            return order_id

        bigger = AgentRegistration(
            Agent(
                id="refunder",
                model=ORIGINAL.agent.model,
                instructions="Refund.",
                tools=[*ORIGINAL.agent.tools, tool(lookup)],
            ),
            version="1",
        )
        assert changed_parts(ORIGINAL.fingerprint_parts, bigger.fingerprint_parts) == (
            "tool lookup added",
        )
        assert changed_parts(bigger.fingerprint_parts, ORIGINAL.fingerprint_parts) == (
            "tool lookup removed",
        )


async def left_waiting(
    client: DurableClient, registration: AgentRegistration = ORIGINAL
) -> RunHandle:
    """A refunder run waiting for approval, left by a worker hosting `registration` that
    then stops; returned once visibility lists the fingerprint it pinned."""
    async with await DurableRuntime.open(client=client, agents=[registration]) as rt:
        await rt.resume()
        run = await client.start_run("refunder", "refund A1")
        await wait_for_status(run, RunStatus.WAITING)

    async def published() -> bool:
        needed = await client.needed_versions()
        return [(n.fingerprint, n.runs) for n in needed] == [(registration.pin_check, 1)]

    await eventually(published)
    return run


class TestDrift:
    async def test_the_check_names_the_edited_tool_description_and_the_runs_it_parks(
        self, client: DurableClient
    ) -> None:
        run = await left_waiting(client)

        (needed,) = await client.needed_versions([EDITED])

        assert needed == NeededVersion(
            agent_id="refunder",
            version="1",
            fingerprint=ORIGINAL.pin_check,
            runs=1,
            example_run_id=run.run_id,
            check="differs",
            hosted_fingerprint=EDITED.pin_check,
            changed=("tool refund description",),
        )
        assert not needed.ok
        (matching,) = await client.needed_versions([ORIGINAL])
        assert (matching.check, matching.ok, matching.changed) == ("matches", True, None)

        async with await DurableRuntime.open(
            client=client, agents=[ORIGINAL], strict_versions=True
        ) as rt:
            await rt.resume()  # the definition the run pinned: a strict worker starts
            await run.respond("approval:1:c1", {"type": "tool-approval", "approved": True})
            assert (await run.result()).output == "done"

    async def test_the_changed_part_is_read_from_a_run_that_continued_as_new(
        self, client: DurableClient
    ) -> None:
        """A continued run's history starts from what it carried: the pin is there."""
        original = refunder(notes=2)
        run = await left_waiting(client, original)
        described = await client.temporal.get_workflow_handle(run.run_id).describe()
        info = described.raw_description.workflow_execution_info
        assert info.first_run_id != info.execution.run_id  # it did continue as new

        edited = refunder("Refund an order, in full.", notes=2)
        (needed,) = await client.needed_versions([edited])
        assert (needed.check, needed.changed) == ("differs", ("tool refund description",))

    async def test_a_drifted_worker_warns_at_start_and_a_strict_one_refuses(
        self, client: DurableClient
    ) -> None:
        run = await left_waiting(client)

        with capture_logs() as logged:
            async with await DurableRuntime.open(client=client, agents=[EDITED]) as rt:
                await rt.resume()  # the check runs beside polling: wait for what it logs

                async def warned() -> bool:
                    return any(e.get("agent") == "refunder" for e in logged)

                await eventually(warned)
        (warning,) = [e for e in logged if e.get("agent") == "refunder"]
        assert warning["log_level"] == "warning"
        assert "registration differs from what unfinished runs pinned" in warning["event"]
        assert warning["version"] == "1"
        assert warning["runs"] == 1
        assert warning["changed"] == ["tool refund description"]
        assert warning["pinned_fingerprint"] == ORIGINAL.pin_check
        assert warning["hosted_fingerprint"] == EDITED.pin_check

        strict = await DurableRuntime.open(client=client, agents=[EDITED], strict_versions=True)
        with pytest.raises(VersionDriftError, match="refusing to start") as refused:
            await strict.resume()
        message = str(refused.value)
        assert f"agent 'refunder' version '1': 1 unfinished run(s) (e.g. {run.run_id!r})" in message
        assert "changed: tool refund description" in message
        assert "Register each original definition under its version again" in message
        assert [n.check for n in refused.value.needed] == ["differs"]
        assert strict.worker.is_running is False  # it never polled

    async def test_versions_needed_and_runs_list_show_the_pinned_fingerprint(
        self, env: WorkflowEnvironment, client: DurableClient
    ) -> None:
        run = await left_waiting(client)

        checked = await durably(env, client, "versions", "--needed", "--agents", AGENTS)
        assert checked.returncode == 1, checked.stderr
        (row,) = [line for line in checked.stdout.splitlines() if line.startswith("refunder")]
        assert row.split()[:7] == [
            "refunder",
            "1",
            ORIGINAL.pin_digest,
            "1",
            run.run_id,
            "differs",
            "tool",
        ]
        assert row.endswith("tool refund description")

        runs = await durably(env, client, "runs", "list")
        assert ORIGINAL.pin_digest[:8] in runs.stdout

        hosted = await durably(env, client, "versions", "--agents", AGENTS, "--json")
        assert hosted.returncode == 0, hosted.stderr
        assert {"agent_id": "refunder", "version": "1", "fingerprint": EDITED.pin_check} in (
            json.loads(hosted.stdout)
        )


class TestWithoutFingerprint:
    async def test_runs_without_a_published_fingerprint_are_unknown_never_guessed(
        self, client: DurableClient
    ) -> None:
        """What runs pinned before durably published fingerprints look like: their
        version is known, their fingerprint is not (no worker runs them here)."""
        await started_unrun(client, "old-run", version="1")

        async def listed() -> bool:
            return len(await client.needed_versions()) == 1

        await eventually(listed)
        (needed,) = await client.needed_versions([EDITED])
        assert (needed.version, needed.fingerprint) == ("1", None)
        assert needed.check == "fingerprint_unknown"
        assert needed.ok
        (missing,) = await client.needed_versions([])
        assert missing.check == "not_hosted"

    async def test_runs_yet_to_pin_need_the_agent_at_any_version(
        self, client: DurableClient
    ) -> None:
        await client.start_run("refunder", "refund A1")

        async def listed() -> bool:
            return len(await client.needed_versions()) == 1

        await eventually(listed)
        (needed,) = await client.needed_versions([ORIGINAL])
        assert (needed.version, needed.check, needed.ok) == (None, "unpinned", True)
        (missing,) = await client.needed_versions([])
        assert (missing.check, missing.ok) == ("not_hosted", False)
        assert "this worker hosts none" in missing.describe()


AGENTS = "tests.test_version_drift:edited"


async def durably(
    env: WorkflowEnvironment, client: DurableClient, *args: str
) -> subprocess.CompletedProcess[str]:
    target = env.client.service_client.config.target_host
    return await cli(
        sys.executable,
        "-m",
        "durably",
        *args,
        "--target",
        target,
        *(["--task-queue", client.task_queue] if args[0] == "versions" else []),
    )


async def started_unrun(client: DurableClient, run_id: str, *, version: str) -> None:
    """A run listed as pinned to `version` with no fingerprint, as an older durably left it."""
    pairs: Sequence[SearchAttributePair[str]] = [
        SearchAttributePair(SA_STATUS, RunStatus.WAITING.value),
        SearchAttributePair(SA_AGENT, "refunder"),
        SearchAttributePair(SA_AGENT_VERSION, version),
    ]
    await client.temporal.start_workflow(
        WORKFLOW_TYPE,
        {"agent_id": "refunder", "input": "refund A1"},
        id=f"{run_id}-{client.task_queue}",
        task_queue=client.task_queue,
        search_attributes=TypedSearchAttributes(pairs),
    )
