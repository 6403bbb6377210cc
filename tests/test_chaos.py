"""The small chaos soak (`benchmarks/chaos.py --small`), run as CI runs it.

The soak starts its own dev server, ticket service and worker processes,
SIGKILLs workers, restarts the server once, and checks the tools' journals;
see the script's docstring.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOAK = ROOT / "benchmarks" / "chaos.py"


def count(output: str, name: str) -> int:
    found = re.search(rf"^{re.escape(name)}: (\d+)$", output, re.MULTILINE)
    assert found is not None, f"no {name!r} count in the soak's output:\n{output}"
    return int(found.group(1))


class TestChaosSoak:
    @pytest.mark.timeout(300)
    def test_the_small_soak_loses_nothing_and_repeats_no_effect(self) -> None:
        """Killed workers and a server restart: every run completes, no effect repeats."""
        soak = subprocess.run(
            # durably's defaults: crashed model requests get 3 attempts, no more.
            [sys.executable, str(SOAK), "--small", "--no-model-retry"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=240,
        )
        shown = f"stdout:\n{soak.stdout}\nstderr (tail):\n{soak.stderr[-5000:]}"

        assert soak.returncode == 0, shown
        out = soak.stdout
        assert count(out, "violations") == 0, shown
        assert count(out, "kills") >= 2, shown
        assert count(out, "server restarts") == 1, shown
        assert count(out, "runs completed") == count(out, "runs started") > 0, shown
        for name in (
            "runs lost",
            "duplicate idempotent effects",
            "manual calls executed twice",
            "manual duplicate effects",
            "interrupted manual calls not needs_attention",
            "denied calls executed",
            "outputs disagreeing with the journal",
            "failed runs retried",
        ):
            assert count(out, name) == 0, f"{name}\n{shown}"
