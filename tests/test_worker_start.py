"""A worker's start never waits on its version check unless it is strict.

The check lists every unfinished run on the task queue; with many waiting runs
that is many pages of visibility, and every worker of a rolling restart would
wait on them before polling. Only `strict_versions`, which must refuse to
start, waits for it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    DurableRuntime,
    NeededVersion,
    RunStatus,
    ScriptedModel,
)
from durably.testing import capture_logs

from .conftest import eventually, wait_for_status


def greeter() -> AgentRegistration:
    """An agent that answers at once: its run completes only if a worker polls."""
    return AgentRegistration(
        Agent(id="greeter", model=ScriptedModel(["hello"]), instructions=""), version="1"
    )


class TestBackgroundCheck:
    async def test_a_worker_polls_while_its_version_check_is_still_listing(
        self, client: DurableClient, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A check that never ends delays nothing; closing the runtime cancels it."""
        listing = asyncio.Event()
        cancelled = asyncio.Event()

        async def never_done(*args: Any) -> list[NeededVersion]:
            listing.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise
            raise AssertionError("unreachable")

        monkeypatch.setattr(client, "needed_versions", never_done)
        async with await DurableRuntime.open(client=client, agents=[greeter()]) as rt:
            await asyncio.wait_for(rt.resume(), 10)
            run = await client.start_run("greeter", "hi")
            assert (await asyncio.wait_for(run.result(), 30)).output == "hello"
            assert listing.is_set() and not cancelled.is_set()

        assert cancelled.is_set()

    async def test_a_check_that_breaks_is_logged_and_the_worker_goes_on(
        self, client: DurableClient, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        async def broken(*args: Any) -> list[NeededVersion]:
            raise RuntimeError("visibility fell over")

        monkeypatch.setattr(client, "needed_versions", broken)
        with capture_logs() as logged:
            async with await DurableRuntime.open(client=client, agents=[greeter()]) as rt:
                await rt.resume()

                async def warned() -> bool:
                    return any("could not check" in e["event"] for e in logged)

                await eventually(warned)
                run = await client.start_run("greeter", "hi")
                assert (await asyncio.wait_for(run.result(), 30)).output == "hello"

        (warning,) = [e for e in logged if "could not check" in e["event"]]
        assert warning["log_level"] == "warning"
        assert warning["error"] == "RuntimeError: visibility fell over"


class TestStrictCheck:
    async def test_a_run_with_a_mistyped_agent_id_never_keeps_a_strict_worker_down(
        self, client: DurableClient
    ) -> None:
        """A run not pinned yet names an agent id only: it is logged, and the worker starts."""
        typo = await client.start_run("greetr", "hi")

        async def listed() -> bool:
            return len(await client.needed_versions()) == 1

        await eventually(listed)
        with capture_logs() as logged:
            async with await DurableRuntime.open(
                client=client, agents=[greeter()], strict_versions=True
            ) as rt:
                await rt.resume()  # a strict worker checks before polling: logged by now
                run = await client.start_run("greeter", "hi")
                assert (await asyncio.wait_for(run.result(), 30)).output == "hello"
                snap = await wait_for_status(typo, RunStatus.NEEDS_ATTENTION)
                assert snap.attention is not None
                assert snap.attention.reason == "version_missing"
                await typo.cancel()

        (warning,) = [e for e in logged if e.get("agent") == "greetr" and "run_id" not in e]
        assert warning["log_level"] == "warning"
        assert "a mistyped agent id?" in warning["event"]
        assert (warning["version"], warning["runs"], warning["example_run"]) == (
            None,
            1,
            typo.run_id,
        )
