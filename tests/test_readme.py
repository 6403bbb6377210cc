"""The README's examples run as written, against a real Temporal server.

Python blocks marked `<!-- test -->` run in order in one namespace, with
top-level `await` (as `python -m asyncio` runs them): they define the
refunds agent, start the README's own worker, start a run and approve its
refund. Every other Python block is compiled, so it stays valid Python.
`TEMPORAL_ADDRESS` points the README's `DurableClient.connect()` and
`DurableRuntime.open()` at the test server; `payments`, the reader's own
payment client, is a stub.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

README = Path(__file__).parents[1] / "README.md"
_BLOCK = re.compile(r"(<!-- test -->\n)?```python\n(.*?)```", re.S)


@dataclass
class Block:
    line: int
    code: str
    runs: bool

    def compiled(self) -> Any:
        return compile(
            self.code, f"README.md:{self.line}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        )


def _blocks() -> list[Block]:
    text = README.read_text()
    return [
        Block(text.count("\n", 0, m.start(2)) + 1, m.group(2), bool(m.group(1)))
        for m in _BLOCK.finditer(text)
    ]


@dataclass
class _Refunded:
    id: str


class _Payments:
    """The README's `payments` client: records each refund and its idempotency key."""

    def __init__(self) -> None:
        self.refunds: list[tuple[str, int, str]] = []

    async def refund(self, order_id: str, amount_cents: int, *, idempotency_key: str) -> _Refunded:
        self.refunds.append((order_id, amount_cents, idempotency_key))
        return _Refunded(id=f"R-{len(self.refunds)}")


@pytest.mark.parametrize("block", _blocks(), ids=lambda b: f"line {b.line}")
def test_every_python_block_is_valid_python(block: Block) -> None:
    block.compiled()


async def test_the_marked_examples_run_against_a_server(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Define, register, serve, start, approve: the README's walk-through completes a run."""
    monkeypatch.setenv("TEMPORAL_ADDRESS", env.client.service_client.config.target_host)
    monkeypatch.setenv("TEMPORAL_NAMESPACE", "default")
    payments = _Payments()
    namespace: dict[str, Any] = {"__name__": "readme", "payments": payments}
    marked = [b for b in _blocks() if b.runs]
    assert len(marked) >= 5
    try:
        for block in marked:
            done = eval(block.compiled(), namespace)  # the README's own code
            if inspect.iscoroutine(done):
                await asyncio.wait_for(done, 60)
    finally:
        if "runtime" in namespace:
            await namespace["runtime"].close()

    interaction = namespace["interaction"]
    assert interaction.id == "approval:1:call_refund_order"  # as the README prints them
    assert interaction.args == {"order_id": "A-1001", "amount_cents": 1500}
    assert namespace["result"].output == "Refunded $15.00 on order A-1001."
    [(order, cents, key)] = payments.refunds
    assert (order, cents) == ("A-1001", 1500)
    assert key.startswith(namespace["run"].run_id + "/")
