"""Consecutive CI soaks beside a CPU hog: can CI trust `chaos.py --small` on a loaded
2-core machine? (issue 26, item 4)

CI runs the small chaos soak (`tests/test_chaos.py`) on a shared 2-core machine,
beside whatever else is running. A soak that fails there now and then, because
the machine was slow rather than because durably lost or repeated something,
teaches everyone to re-run red builds, and then a real failure goes unread. So
this script runs `--soaks` consecutive `chaos.py --small --no-model-retry`
soaks, exactly as the test runs them, while `--hogs` processes spin on the CPU
the whole time (two on two cores: the soak gets about half the machine), and
prints, per soak, pass or fail, its wall time and its two replay lines, then a
tally. It exits 1 if any soak failed.

A failing soak keeps its temp dir (the soak prints `kept: ...`, shown here);
every soak's stdout and stderr are saved under `--out`.

Run: ``python benchmarks/soak_repeat.py [--soaks 20] [--hogs 2] [--out DIR]
[-- extra chaos.py arguments]``
"""

from __future__ import annotations

import argparse
import contextlib
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from durably.dev import die_with_parent, signal_group

HERE = Path(__file__).resolve().parent
CHAOS = HERE / "chaos.py"
# What tests/test_chaos.py runs.
SOAK_ARGS = ("--small", "--no-model-retry")
# The soak ends on a stall or at its cap (420 s), then checks and replays; the test
# gives it 600 s. Beside the hog it may take longer than in CI: this bounds a soak
# that hangs, nothing else.
SOAK_TIMEOUT_S = 1200.0
REPLAYED = re.compile(r"^histories replayed: \d+, replay failures: \d+$", re.MULTILINE)
TASK_FAILURES = re.compile(r"^workflow task failures: \d+$", re.MULTILINE)
KEPT = re.compile(r"^kept: (\S+)", re.MULTILINE)


@dataclass(frozen=True)
class Soak:
    """One soak's verdict, as its output says it."""

    number: int
    passed: bool
    wall_s: float
    replayed: str
    task_failures: str
    why: str  # empty when it passed
    kept: str | None

    def line(self, of: int) -> str:
        verdict = "pass" if self.passed else f"FAIL ({self.why})"
        kept = f"; kept {self.kept}" if self.kept else ""
        return (
            f"soak {self.number}/{of}: {verdict}, {self.wall_s:.0f} s; {self.replayed}; "
            f"{self.task_failures}{kept}"
        )


@contextlib.contextmanager
def cpu_hog(processes: int) -> Iterator[list[int]]:
    """`processes` busy loops, each in its own process group, killed on the way out (and
    by Linux if this script dies first)."""
    hogs = [
        subprocess.Popen(
            [sys.executable, "-c", "while True: pass"],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent(signal.SIGKILL),
        )
        for _ in range(processes)
    ]
    try:
        yield [h.pid for h in hogs]
    finally:
        for h in hogs:
            signal_group(h.pid, signal.SIGKILL)
            h.wait(10)


def verdict(number: int, code: int | None, out: str, wall_s: float) -> Soak:
    """Pass: the soak exited 0 and printed both replay lines with zeros."""
    replayed = REPLAYED.search(out)
    failures = TASK_FAILURES.search(out)
    replayed_line = replayed.group(0) if replayed else "histories replayed: (not printed)"
    failures_line = failures.group(0) if failures else "workflow task failures: (not printed)"
    clean = replayed_line.endswith("replay failures: 0") and failures_line.endswith("failures: 0")
    why = ""
    if code is None:
        why = f"no verdict within {SOAK_TIMEOUT_S:.0f} s"
    elif code != 0:
        violations = re.search(r"^violations: (\d+)$", out, re.MULTILINE)
        why = f"exit {code}" + (f", {violations.group(1)} violations" if violations else "")
    elif not clean:
        why = "the replay lines are not zeros"
    kept = KEPT.search(out)
    return Soak(
        number,
        not why,
        wall_s,
        replayed_line,
        failures_line,
        why,
        kept.group(1) if kept else None,
    )


def run_soak(number: int, out_dir: Path, extra: Iterable[str]) -> Soak:
    """One `chaos.py --small --no-model-retry` soak, its output saved under `out_dir`."""
    stdout_path = out_dir / f"soak-{number:02d}.out"
    stderr_path = out_dir / f"soak-{number:02d}.err"
    started = time.monotonic()
    code: int | None
    with stdout_path.open("w") as stdout, stderr_path.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(CHAOS), *SOAK_ARGS, *extra],
            cwd=HERE.parent,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            preexec_fn=die_with_parent(signal.SIGKILL),
        )
        try:
            code = proc.wait(SOAK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            signal_group(proc.pid, signal.SIGKILL)
            proc.wait(10)
            code = None
    return verdict(number, code, stdout_path.read_text(), time.monotonic() - started)


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--soaks", type=int, default=20, help="consecutive soaks (20)")
    parser.add_argument("--hogs", type=int, default=2, help="busy processes beside them (2)")
    parser.add_argument("--out", type=Path, default=None, help="where each soak's output goes")
    parser.add_argument("extra", nargs="*", help="more chaos.py arguments (after --)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    out_dir: Path = args.out or Path(tempfile.mkdtemp(prefix="durably-soaks-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    print(
        f"{args.soaks} soaks of chaos.py {' '.join([*SOAK_ARGS, *args.extra])} beside "
        f"{args.hogs} busy processes; outputs in {out_dir}",
        flush=True,
    )
    soaks: list[Soak] = []
    with cpu_hog(args.hogs):
        for number in range(1, args.soaks + 1):
            soak = run_soak(number, out_dir, args.extra)
            soaks.append(soak)
            print(soak.line(args.soaks), flush=True)
    passed = sum(s.passed for s in soaks)
    walls = [s.wall_s for s in soaks]
    print(
        f"tally: {passed}/{len(soaks)} passed, {len(soaks) - passed} failed, beside "
        f"{args.hogs} busy processes; wall time median {statistics.median(walls):.0f} s, "
        f"min {min(walls):.0f} s, max {max(walls):.0f} s, total {sum(walls) / 60:.0f} min"
    )
    return 0 if passed == len(soaks) else 1


if __name__ == "__main__":
    sys.exit(main())
