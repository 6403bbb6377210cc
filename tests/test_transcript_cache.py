"""The worker's transcript cache is bounded by bytes, and runs outgrowing it still complete."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable

import pytest
from pydantic import BaseModel

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    DurableRuntime,
    DurablyPlugin,
    FunctionModel,
    ModelRequest,
    RunStatus,
    ToolContext,
    tool,
)
from durably._transcript import EMPTY_DIGEST, encoded_size
from durably._transcript import cache as cache_module
from durably.activities import TranscriptCache
from durably.messages import AssistantMessage, Message, ToolCall, ToolResultMessage, UserMessage


def text(n: int, size: int = 100) -> UserMessage:
    """A message whose content is `size` characters, told apart by `n`."""
    return UserMessage(content=f"{n}:".ljust(size, "x"))


def result(n: int, size: int = 100) -> ToolResultMessage:
    return ToolResultMessage(call_id=f"c{n}", tool="t", content="r".ljust(size, "r"))


def total(messages: list[Message]) -> int:
    return sum(encoded_size(m) for m in messages)


def is_cached(cache: TranscriptCache, run_id: str, messages: list[Message]) -> bool:
    found = cache.transcript(run_id, len(messages))
    return found is not None and found[0] == messages


class TestByteAccounting:
    def test_size_is_the_encoded_size_of_every_message_and_output(self) -> None:
        """Transcripts and outputs both count, at the JSON size the digest reads."""
        cache = TranscriptCache()
        messages: list[Message] = [text(0), AssistantMessage(content="hi"), result(1, 5000)]
        cache.store("a", messages, "d")
        cache.put_output("a", "tool:1:c1", result(2, 300))
        cache.store("b", [text(3)], "d")

        assert cache.size_bytes == total([*messages, result(2, 300), text(3)])

    def test_storing_an_outputs_message_moves_its_bytes_rather_than_doubling_them(self) -> None:
        """Once the transcript holds an output, only the transcript counts it."""
        cache = TranscriptCache()
        cache.store("a", [text(0)], "d0")
        output = result(1, 2000)
        cache.put_output("a", "tool:1:c1", output)
        messages, _ = cache.transcript("a", 1) or ([], "")
        found = cache.output("a", "tool:1:c1")
        assert found is not None
        cache.store("a", [*messages, found], "d1")

        assert cache.size_bytes == total([text(0), output])
        assert cache.output("a", "tool:1:c1") is None

    def test_replacing_an_output_counts_only_the_newest(self) -> None:
        """A retried activity's output replaces the earlier one under the same key."""
        cache = TranscriptCache()
        cache.put_output("a", "model:1", AssistantMessage(content="x" * 900))
        cache.put_output("a", "model:1", AssistantMessage(content="short"))

        assert cache.size_bytes == encoded_size(AssistantMessage(content="short"))

    def test_a_shorter_or_different_transcript_is_measured_again(self) -> None:
        """A stale attempt stores a prefix; a reset run stores a transcript that diverges."""
        cache = TranscriptCache()
        long: list[Message] = [text(n) for n in range(10)]
        cache.store("a", long, "d10")
        cache.store("a", long[:4], "d4")
        assert cache.size_bytes == total(long[:4])
        diverged: list[Message] = [*long[:4], text(99, 3000), text(98)]
        cache.store("a", diverged, "d6")
        assert cache.size_bytes == total(diverged)
        fetched: list[Message] = [m.model_copy() for m in diverged]  # equal, not the same
        cache.store("a", fetched, "d6")
        assert cache.size_bytes == total(fetched)

    def test_extending_a_transcript_measures_only_the_new_messages(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A store at turn 500 encodes as much as one at turn 5: the new messages only.

        Messages that came back from `put_output` were measured then and are
        not encoded again; the rest of the transcript is never re-encoded.
        """
        measured: list[Message] = []

        def counting(message: Message) -> int:
            measured.append(message)
            return encoded_size(message)

        monkeypatch.setattr(cache_module, "encoded_size", counting)
        cache = TranscriptCache()
        cache.store("a", [text(n) for n in range(1000)], "d")
        for turn in range(5):
            measured.clear()
            reply = AssistantMessage(content=f"turn {turn}")
            cache.put_output("a", f"model:{turn}", reply)
            cached = cache.transcript("a", 1000 + 2 * turn)
            assert cached is not None
            answer = text(turn)
            cache.store("a", [*cached[0], reply, answer], f"d{turn}")

            assert measured == [reply, answer]
        assert cache.size_bytes == total(
            [
                *(text(n) for n in range(1000)),
                *(m for t in range(5) for m in (AssistantMessage(content=f"turn {t}"), text(t))),
            ]
        )

    def test_the_count_stays_exact_through_any_sequence_of_calls(self) -> None:
        """Random stores, outputs, forgets and evictions: the count matches what is held."""
        rng = random.Random(7)
        cache = TranscriptCache(20_000, max_runs=4)
        held: dict[str, list[Message]] = {}  # the transcript each run was last given
        for step in range(3000):
            run = f"r{rng.randrange(6)}"
            op = rng.random()
            if op < 0.4:
                cached = cache.transcript(run, len(held.get(run, [])))
                base = cached[0] if cached is not None and run in held else []
                grown = [*base, *(text(step, rng.randrange(10, 3000)) for _ in range(2))]
                cache.store(run, grown, str(step))
                held[run] = grown
            elif op < 0.7:
                cache.put_output(run, f"k{rng.randrange(3)}", result(step, rng.randrange(10, 3000)))
            elif op < 0.8 and held.get(run):
                cache.store(run, held[run][: rng.randrange(len(held[run]))], str(step))
                held.pop(run)
            elif op < 0.85:
                cache.forget(run)
                held.pop(run, None)

            entries = cache._runs  # what the cache really holds
            for run_id, e in entries.items():
                assert e.sizes == [encoded_size(m) for m in e.messages]
                assert run_id not in held or e.messages in ([], held[run_id])
            assert cache.size_bytes == sum(
                total(e.messages) + total([m for m, _ in e.outputs.values()])
                for e in entries.values()
            )
            assert cache.size_bytes <= 20_000
            assert len(entries) <= 4


class TestEviction:
    def test_least_recently_used_runs_go_first_until_the_total_fits(self) -> None:
        """Reading a run's transcript counts as using it."""
        one = total([text(0, 1000)])
        cache = TranscriptCache(3 * one)
        runs = {r: [text(n, 1000)] for n, r in enumerate("abc")}
        for run, messages in runs.items():
            cache.store(run, messages, "d")
        assert cache.transcript("a", 1) is not None  # "b" is now the least recently used
        cache.store("d", [text(9, 1000)], "d")

        assert not is_cached(cache, "b", runs["b"])
        assert all(is_cached(cache, r, runs[r]) for r in "ac")
        assert cache.size_bytes == 3 * one

    def test_a_run_larger_than_the_whole_bound_is_not_kept_and_evicts_nothing(self) -> None:
        """Its requests fall back to the workflow; the runs that fit stay cached."""
        cache = TranscriptCache(10_000)
        small: list[Message] = [text(0, 1000)]
        cache.store("small", small, "d")
        huge: list[Message] = [text(1, 20_000)]
        cache.store("huge", huge, "d")

        assert cache.transcript("huge", 1) is None
        assert is_cached(cache, "small", small)
        assert cache.size_bytes == total(small)

    def test_a_run_that_outgrows_the_bound_is_dropped_with_its_outputs(self) -> None:
        cache = TranscriptCache(10_000)
        messages: list[Message] = [text(n, 3000) for n in range(3)]
        cache.store("a", messages, "d")
        cache.put_output("a", "tool:1:c", result(1, 3000))

        assert cache.output("a", "tool:1:c") is None
        assert cache.transcript("a", 3) is None
        assert cache.size_bytes == 0

    def test_max_runs_bounds_the_number_of_runs_too(self) -> None:
        cache = TranscriptCache(max_runs=2)
        for run in "abc":
            cache.store(run, [text(0)], "d")

        assert cache.transcript("a", 1) is None
        assert cache.transcript("c", 1) is not None
        assert cache.size_bytes == 2 * total([text(0)])

    def test_forget_releases_a_runs_bytes(self) -> None:
        cache = TranscriptCache()
        cache.store("a", [text(0, 5000)], "d")
        cache.put_output("a", "model:1", AssistantMessage(content="x"))
        cache.store("b", [text(1)], "d")
        cache.forget("a")
        cache.forget("never-cached")

        assert cache.size_bytes == total([text(1)])
        assert cache.output("a", "model:1") is None

    @pytest.mark.parametrize(
        "make",
        [lambda: TranscriptCache(0), lambda: TranscriptCache(max_runs=0)],
        ids=["bytes", "runs"],
    )
    def test_a_zero_bound_disables_caching(self, make: Callable[[], TranscriptCache]) -> None:
        """Nothing is kept; every run's empty transcript is still known."""
        cache = make()
        cache.store("a", [text(0)], "d")
        cache.put_output("a", "model:1", AssistantMessage(content="x"))

        assert cache.transcript("a", 1) is None
        assert cache.output("a", "model:1") is None
        assert cache.transcript("a", 0) == ([], EMPTY_DIGEST)
        assert cache.size_bytes == 0

    def test_a_negative_bound_is_refused(self) -> None:
        with pytest.raises(ValueError, match=r"max_bytes=-1\): the bound must be 0"):
            TranscriptCache(-1)
        with pytest.raises(ValueError, match=r"max_runs=-2\): the bound must be None"):
            TranscriptCache(max_runs=-2)

    def test_threads_sharing_the_cache_keep_the_count_and_the_bound(self) -> None:
        cache = TranscriptCache(50_000)

        def work(worker: int) -> None:
            for turn in range(300):
                run = f"r{worker}-{turn % 7}"
                cached = cache.transcript(run, 2 * (turn // 7))
                base = cached[0] if cached is not None else []
                cache.put_output(run, "model", AssistantMessage(content="y" * 200))
                cache.store(run, [*base, text(turn, 400), text(turn, 300)], "d")

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

        held = cache._runs
        assert cache.size_bytes == sum(
            total(e.messages) + total([m for m, _ in e.outputs.values()]) for e in held.values()
        )
        assert 0 < cache.size_bytes <= 50_000


class TestConfiguration:
    def test_the_plugin_uses_the_cache_it_is_given(self) -> None:
        cache = TranscriptCache(1000)
        assert DurablyPlugin([], transcript_cache=cache).agent_activities.cache is cache
        assert DurablyPlugin([]).agent_activities.cache.max_bytes == 256 * 2**20

    async def test_open_refuses_a_negative_size_before_connecting(self) -> None:
        """Nothing listens at the target: the bound is checked first."""
        with pytest.raises(ValueError, match="the bound must be 0"):
            await DurableRuntime.open("127.0.0.1:1", transcript_cache_bytes=-1)


class Page(BaseModel):
    n: int


TURNS = 6
PAGE = 4000  # six of these are 24 KB: three times the cache below


async def test_a_run_whose_transcript_outgrows_the_cache_still_completes(
    client: DurableClient,
) -> None:
    """`DurableRuntime.open(transcript_cache_bytes=...)` sizes the activities' cache.

    The run fits at first, then its transcript grows past the bound: it is
    dropped from the cache and each later model request rebuilds the whole
    transcript from the workflow, so the model still sees every message.
    """
    seen: list[list[str]] = []

    def model(request: ModelRequest) -> AssistantMessage:
        pages = [m.content for m in request.messages if isinstance(m, ToolResultMessage)]
        assert all(len(p) == PAGE for p in pages)
        seen.append([p[:8] for p in pages])
        if len(pages) < TURNS:
            return AssistantMessage(
                tool_calls=(
                    ToolCall(id=f"c{len(pages)}", name="read", arguments={"n": len(pages)}),
                )
            )
        return AssistantMessage(content=f"read {len(pages)} pages")

    @tool
    async def read(args: Page, ctx: ToolContext) -> str:
        """Read a page."""
        return f"page {args.n:03d}".ljust(PAGE, ".")

    agent = Agent(id="pager", model=FunctionModel(model), instructions="", tools=[read])
    registration = AgentRegistration(agent, version="1", tool_recovery={"read": "safe"})
    bound = 8_000
    async with await DurableRuntime.open(
        client=client, agents=[registration], transcript_cache_bytes=bound
    ) as runtime:
        cache = runtime.plugin.agent_activities.cache
        assert cache.max_bytes == bound
        await runtime.resume()
        run = await client.start_run("pager", "read the pages")
        async with asyncio.timeout(60):
            outcome = await run.result()
        snap = await run.snapshot()

        assert outcome.output == f"read {TURNS} pages"
        assert seen == [[f"page {n:03d}" for n in range(t)] for t in range(TURNS + 1)]
        assert (snap.status, snap.turns) == (RunStatus.COMPLETED, TURNS + 1)
        assert cache.transcript(run.run_id, 1 + 2 * TURNS) is None  # too big to keep
        assert cache.size_bytes <= bound
