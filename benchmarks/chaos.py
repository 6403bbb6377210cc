"""Chaos soak: runs against SIGKILLed workers and a restarted server, checked by journals.

What it does:

- starts its own Temporal dev server (`durably.dev.DevServer`, SQLite file in
  a temp dir, free ports), its own deduplicating ticket service (HTTP), an
  MCP server (`tests/mcp_test_server.py` over streamable HTTP, its lock file
  written with `durably mcp lock`) and N `durably worker` processes hosting
  `chaos_agents:registrations`;
- starts `--runs` runs of every agent kind (`chaos_agents.KINDS`, in a fixed
  rotation; at most `--in-flight` unfinished at once): single runs of scripted
  agents mixing safe, idempotent and manual tools and a manual tool that
  needs approval; `parallel` runs answering several calls at once, two or
  three of them manual, which durably runs concurrently (one kill can leave
  several manual calls of a run blocked); `delegate` runs handing a task to
  the subagent `payout` beside a manual call of their own (a child workflow,
  journaled like any run; every other one's child finds the payee register
  down, fails, and parks its parent, `subagent_failed`); sessions
  (`client.start_session`, then `session.submit` three times: the second
  while the first run is still open, with `if_busy="enqueue"`, the third once
  the second completed; then `close()`); `metered` runs, registered with one
  tool call allowed, which park `budget_exceeded` before each later call; a
  custom task started with `client.start_task` (manual, approval first); a
  `clerk` agent owning a task as its child run; and an `archivist` agent
  calling the MCP server's tools (an idempotent write, then a read-back);
- a killer SIGKILLs a worker every 3-8 s (1.5-3 s with `--small`), one that
  connected while another did too (a kill of a worker still starting tests
  nothing) and that is not running a model request's last attempt (durably
  fails a run whose request crashed that often, as SPEC section 8 says),
  every other time one that is inside a manual call if there is one (one
  inside several manual calls of one run first), and starts a new one; a
  supervisor restarts any worker that exits by itself (and reports it);
  once about a third of the runs completed, the dev server is stopped and
  started again on the same database and port (the workers are left
  running: the report says whether they kept running);
- a hostile client beside the killer sends, every 0.2-0.6 s, to a random
  unfinished run or session: a `respond_signal` whose payload claims to be
  encrypted (`binary/encrypted`, a made-up key id, random bytes); a `respond`
  or `raise_limits` update padded with up to 200 kB of unknown fields, or
  with a number as a string; a forged `child_status` (status `failed`,
  `seq` 10**18) or `run_status` note. Every one must be refused or recorded
  as rejected and change nothing the checks below look at;
- an operator answers approvals through the `respond_signal` signal (about
  one in seven is denied; several pending at once go as one list, all or
  none), whatever else the run waits for, raises the limit of a run parked
  `budget_exceeded` by one tool call (`raise_limits`), and reconciles each
  of the snapshot's `blocked_operations` (`needs_attention`, reason
  `tool_interrupted`) against the journal, one at a time: an `effect` line
  -> `resolve_tool` with the journaled result; no effect, and the process
  that ran the call (the worker identity in the run's history) is dead or
  wrote `aborted` -> `{"type": "rerun"}`; anything else -> leave it blocked
  and look again later. A run that fails is retried, and counted as a
  violation: killed workers must never fail a run. Child runs (subagents'
  and tasks') are runs of their own: the operator finds them in the run list
  (by their agent id) and from their parent's snapshot (`children`, and the
  `subagent_failed` attention's `child_run_id`), and handles them by their
  own run id, as any run; a child that failed because the payee register is
  down (on purpose) gets the register fixed and `retry()`, and its parent
  goes on by itself. Runs of a session are found in the run list like any.

The soak ends when every run completed, or, its unfinished runs lost, once no
run made progress for a while (a wedged run looks like that, on any machine)
or after a generous cap. Workers keep their workflow cache (the default) and
the operator polls snapshots by query: together they produced the query race
(issue 26), which wedged runs for good while every outcome looked right.

Afterwards it checks, against the tools' journals, the ticket service, the
MCP server's log and the runs' histories and outputs: no run lost, no
duplicate effect of an idempotent tool (tickets, the MCP write), no manual
call executed twice (beyond the reruns the operator asked for after proving
no effect: read from every execution's history, plus those whose
confirmation never reached the operator, which may still have been applied),
every interrupted manual call was resolved while its run was
`needs_attention`, no denied call ran, every output agrees with the journal,
holds a result for every call of its agent's script and was built from a
transcript with each call's result, once, in the model's call order, and
every run completed; for each delegating run (a subagent or a task owned):
exactly one child workflow per call (listed by id prefix `{run}/`),
completed, its output the call's result in the parent's output, and its
usage in the parent's; for each session: closed, its runs exactly its
submissions in order (each accepted once, the second queued behind the
first), each run having read every earlier message; for each `metered` run:
parked on its limit and raised, no tool call started before the raise it
needed; for each task run: its output the journaled result. Then it replays
every execution the namespace holds (visibility's list, and every run of the
chain of each workflow id the soak started or found), each in a fresh
replayer with the client's data converter, and counts the workflow tasks
that failed, by cause:

    histories replayed: N, replay failures: 0
    workflow task failures: 0

It prints the counts and exits 1 on any violation, printing the first
nondeterminism error and the temp directory it kept.

Run: ``python benchmarks/chaos.py [--runs 300] [--workers 3] [--small] [--keep]``
(``--small``: 60 runs of every kind, at most 20 in flight, for CI;
``--no-model-retry`` registers the agents without `model_retry`, durably's default).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import itertools
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType, PendingActivityState, WorkflowTaskFailedCause
from temporalio.api.failure.v1 import Failure
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowExecutionStatus, WorkflowHistory, WorkflowUpdateFailedError
from temporalio.common import RawValue
from temporalio.converter import DataConverter
from temporalio.exceptions import TemporalError
from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.service import RPCError, RPCStatusCode

from durably import DurableClient, RunHandle, RunStatus, SessionHandle
from durably._replay import replay, task_failures
from durably.contract import (
    BudgetExceeded,
    IfBusy,
    RespondRequest,
    RunResult,
    RunSnapshot,
    SessionSnapshot,
)
from durably.dev import DevServer, die_with_parent, signal_group
from durably.errors import DurableConflictError, DurablyError, InvalidResponseError

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# The MCP server the `archivist` agent calls: the tests' own (records each call's
# operation id, applies a write once per operation id).
MCP_TEST_SERVER = HERE.parent / "tests" / "mcp_test_server.py"

import chaos_agents  # noqa: E402

TASK_QUEUE = "chaos"
OPERATOR = "chaos-operator"
RPC_ERRORS = (RPCError, DurablyError, RuntimeError, TimeoutError, OSError)


@dataclass(frozen=True)
class Size:
    runs: int
    workers: int
    in_flight: int
    kill_every: tuple[float, float]
    restart_after: float  # fraction of runs completed before the server restart
    # The soak ends, its unfinished runs lost, once no run made progress for `stall_s`
    # (nothing completed, no tool call journaled, no decision taken), or after `cap_s`
    # in any case. A fixed deadline failed soaks that were only slow (a loaded 2-core
    # machine runs the small one in twice its usual time); a stall is what a wedged run
    # looks like, whatever the machine's speed.
    stall_s: float
    cap_s: float


def size_from(args: argparse.Namespace) -> Size:
    if args.small:
        runs = args.runs or 60
        return Size(runs, args.workers, args.in_flight or 20, (1.5, 3.0), 0.3, 90.0, 420.0)
    runs = args.runs or 300
    cap = max(600.0, runs * 3.0)
    return Size(runs, args.workers, args.in_flight or 60, (3.0, 8.0), 0.3, 120.0, cap)


def log(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


# -- the deduplicating ticket service ----------------------------------------------------


class TicketService:
    """Opens at most one ticket per operation_id; remembers every request.

    `natural` (run id + ticket title) names the logical call, so a ticket
    opened twice for one call under different operation_ids shows up too.

    It is also the payee register a `payout` run checks when its task says the
    register is down (`/payees`): down for that run until the operator `fix`es it.
    """

    def __init__(self) -> None:
        self.tickets: dict[str, str] = {}
        self.requests: Counter[str] = Counter()
        self.natural: defaultdict[str, set[str]] = defaultdict(set)
        self.fixed: set[str] = set()  # runs whose payee register the operator fixed
        self.down: Counter[str] = Counter()  # run -> payee checks refused
        self.lock = threading.Lock()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                answer: dict[str, Any]
                with service.lock:
                    if self.path == "/payees":
                        answer = {"fixed": body["run"] in service.fixed}
                        service.down[body["run"]] += not answer["fixed"]
                    else:
                        service.requests[body["key"]] += 1
                        service.natural[body["natural"]].add(body["key"])
                        ticket = service.tickets.setdefault(
                            body["key"], f"T-{len(service.tickets) + 1}"
                        )
                        answer = {"ticket_id": ticket}
                payload = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def fix(self, run_id: str) -> None:
        with self.lock:
            self.fixed.add(run_id)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- the MCP server --------------------------------------------------------------------


class McpServer:
    """`tests/mcp_test_server.py` over streamable HTTP, one process for every worker.

    Over HTTP the server outlives the workers the killer SIGKILLs (a stdio server
    would be each worker's child, started again with every worker), so its log is
    the journal of every call: one line per call with its operation id, and whether
    the write was applied (once per operation id). Its lock file is written with
    `durably mcp lock`, as a user would, before any worker starts.
    """

    def __init__(self, tmp: Path) -> None:
        self.directory = tmp / "mcp"
        self.directory.mkdir()
        self.port = free_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.log = self.directory / "server.jsonl"
        self.lock = self.directory / "records.lock.json"
        self.proc: subprocess.Popen[bytes] | None = None
        self.offset = 0
        self.lines: list[dict[str, Any]] = []

    def spawn(self) -> None:
        """The server's process, in a process group of its own."""
        with (self.directory / "server.out").open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(MCP_TEST_SERVER)],
                env={
                    **os.environ,
                    "PYTHONUNBUFFERED": "1",
                    "MCP_TEST_HTTP_PORT": str(self.port),
                    "MCP_TEST_LOG": str(self.log),
                    "MCP_TEST_STATE": str(self.directory / "state.json"),
                },
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent(signal.SIGKILL),
            )

    async def start(self, env: dict[str, str]) -> None:
        """Start the server, wait until it accepts connections, and lock its tools."""
        self.spawn()
        assert self.proc is not None
        deadline = time.monotonic() + 60
        while True:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the MCP test server did not start; see {self.directory / 'server.out'}"
                    ) from None
                await asyncio.sleep(0.1)  # nothing to await: the port opens when it opens
                continue
            writer.close()
            break
        locking = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "durably",
            "mcp",
            "lock",
            "chaos_agents:registrations",
            cwd=HERE,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        said, _ = await locking.communicate()
        if locking.returncode != 0 or not self.lock.exists():
            raise RuntimeError(f"durably mcp lock failed: {said.decode(errors='replace')}")

    def refresh(self) -> list[dict[str, Any]]:
        """The server's log, read incrementally (complete lines only)."""
        if self.log.exists():
            with self.log.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
            end = data.rfind(b"\n") + 1
            self.offset += end
            self.lines += [json.loads(line) for line in data[:end].splitlines() if line.strip()]
        return self.lines

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            signal_group(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


# -- the journal -----------------------------------------------------------------------


class Journal:
    """The workers' journal files, read incrementally (complete lines only)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.offsets: dict[Path, int] = {}
        self.entries: list[dict[str, Any]] = []
        self.by_op: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)

    def refresh(self) -> None:
        for path in sorted(self.directory.glob("*.jsonl")):
            with path.open("rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            end = data.rfind(b"\n") + 1
            self.offsets[path] = self.offsets.get(path, 0) + end
            for line in data[:end].splitlines():
                entry = json.loads(line)
                entry["op"] = _run_op(entry["op"])
                self.entries.append(entry)
                self.by_op[entry["op"]].append(entry)

    def of(self, op: str, event: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.by_op.get(op, []) if event is None or e["ev"] == event]


def _run_op(operation_id: str) -> str:
    """`{run_id}/{checkpoint key}` of an operation id `{run_id}/{first run id}/{key}`. A
    child run's id is its parent's call's operation id, so it holds "/" itself: the
    chain's first run id and the key hold none, so the id splits from the right."""
    run_id, _first, key = operation_id.rsplit("/", 2)
    return f"{run_id}/{key}"


def _op_run(op: str) -> str:
    """The run id of a `{run_id}/{checkpoint key}`."""
    return op.rsplit("/", 1)[0]


# -- worker processes ------------------------------------------------------------------


@dataclass
class Slot:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: int = 0
    log: Path | None = None
    # The killer is killing its worker (in a thread) and will start the next: the
    # supervisor leaves the slot alone meanwhile (else it counts the kill as an exit of
    # its own and starts a second worker for the slot).
    killing: bool = False

    def connected(self) -> bool:
        """Whether the current worker connected (durably logs `worker started` then)."""
        return self.log is not None and b"worker started" in self.log.read_bytes()


class Workers:
    """N `durably worker` processes, each in its own process group."""

    def __init__(self, n: int, target: str, tmp: Path, env: dict[str, str]) -> None:
        self.slots = [Slot(i) for i in range(n)]
        self.target = target
        self.logs = tmp / "workers"
        self.logs.mkdir()
        self.env = env
        self.dead: set[int] = set()  # pids of worker processes known to be gone
        # Exits we did not cause: (pid, exit code, whether it had connected).
        self.exits: list[tuple[int, int | None, bool]] = []

    def start(self, slot: Slot) -> None:
        slot.killing = False
        slot.started += 1
        slot.log = self.logs / f"w{slot.index}-{slot.started}.log"
        out = slot.log.open("wb")
        try:
            slot.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "durably",
                    "worker",
                    "--agents",
                    "chaos_agents:registrations",
                    "--target",
                    self.target,
                    "--task-queue",
                    TASK_QUEUE,
                ],
                cwd=HERE,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent(signal.SIGKILL),
            )
        finally:
            out.close()

    def start_all(self) -> None:
        for slot in self.slots:
            self.start(slot)

    def alive(self) -> list[Slot]:
        return [s for s in self.slots if s.proc is not None and s.proc.poll() is None]

    def kill(self, slot: Slot) -> int:
        assert slot.proc is not None
        pid = slot.proc.pid
        signal_group(pid, signal.SIGKILL)
        slot.proc.wait(10)
        self.dead.add(pid)
        slot.proc = None
        return pid

    def reap_exited(self) -> list[Slot]:
        """Slots whose worker exited without being killed (recorded in `exits`)."""
        gone = []
        for slot in self.slots:
            if slot.killing:
                continue
            if slot.proc is not None and slot.proc.poll() is not None:
                self.dead.add(slot.proc.pid)
                self.exits.append((slot.proc.pid, slot.proc.returncode, slot.connected()))
                slot.proc = None
                gone.append(slot)
        return gone

    def stop_all(self) -> None:
        """SIGINT (durably drains), then SIGKILL whatever is left."""
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    slot.proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 20
        for slot in self.slots:
            if slot.proc is None:
                continue
            try:
                slot.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                signal_group(slot.proc.pid, signal.SIGKILL)
                slot.proc.wait(10)
            signal_group(slot.proc.pid, signal.SIGKILL)  # anything the worker left behind
            slot.proc = None


# -- the replay check ------------------------------------------------------------------

# Workflow-task failures that are the server's way of handing a worker new input, not
# anybody's error (`tests/conftest.py`'s `failed_tasks` leaves them out too): it refuses
# a task's completion because a signal arrived while the task ran (UNHANDLED_COMMAND:
# the operator's approvals land at any moment), or closes a task in flight when the
# signals buffered meanwhile pass its buffer (FORCE_CLOSE_COMMAND). The refused task's
# commands never reach history, so replay does not see them, and the next task holds the
# new input: the run goes on. They get a line of their own and do not count: a soak
# whose operator signals runs at random moments has some, and it lost nothing by them.
HANDOVERS = frozenset({"UNHANDLED_COMMAND", "FORCE_CLOSE_COMMAND"})
# The one failure SPEC section 18 excepts: a payload encrypted with a key the worker does
# not hold fails the task until the key is back (an operator's error, not an input). The
# soak does not encrypt; a failure saying so (`durably.codec`'s `EncryptionKeyError`
# text) is counted apart and named, should one appear.
MISSING_KEY = "which this process does not hold"
# A nondeterminism error's own words inside the SDK's wrapping (`Failure { message: ...`).
NONDETERMINISM = re.compile(r"\[TMPRL1100\][^\"]*|[Nn]ondeterminism error[^\"]*")


@dataclass(frozen=True)
class Failed:
    """One execution's failure: a replay that failed, or a workflow task that did."""

    workflow_id: str
    run_id: str
    message: str
    at: float = math.inf  # when (a task failure's event time); a replay's: never

    def __str__(self) -> str:
        return f"{self.workflow_id} (run {self.run_id}): {self.message[:600]}"


@dataclass
class HistoryCheck:
    """What replaying every execution with a fresh replayer (as a worker that just started
    would) and reading its workflow-task failures found. A soak that checks outcomes only
    misses a run whose history no longer replays: a live worker holds it in its cache and
    finishes it, and it wedges the first time any worker must rebuild it (issue 26)."""

    replayed: int = 0
    replay_failures: list[Failed] = field(default_factory=list)
    task_failures: Counter[str] = field(default_factory=Counter)  # by cause; each counts
    handovers: Counter[str] = field(default_factory=Counter)  # by cause; none counts
    missing_key: list[Failed] = field(default_factory=list)  # replays and tasks, excepted
    nondeterminism: list[Failed] = field(default_factory=list)  # replays and tasks

    @property
    def failures(self) -> int:
        """What fails the soak: handovers and a missing key are not among them."""
        return len(self.replay_failures) + self.task_failures.total()

    def first_nondeterminism(self) -> Failed | None:
        """The first that happened live (by event time), else the first replay's."""
        return min(self.nondeterminism, key=lambda f: f.at, default=None)

    def lines(self) -> list[str]:
        """The two lines every soak prints, zeros when all is well; then what explains
        anything else."""

        def by_cause(counts: Counter[str]) -> str:
            return ", ".join(f"{cause} {n}" for cause, n in counts.most_common()) or "0"

        lines = [
            f"histories replayed: {self.replayed}, replay failures: {len(self.replay_failures)}",
            f"workflow task failures: {self.task_failures.total()}",
        ]
        if self.task_failures:
            lines.append(f"  by cause: {by_cause(self.task_failures)}")
        lines.append(f"server handovers (not failures): {by_cause(self.handovers)}")
        if self.missing_key:
            lines.append(
                f"missing encryption key (SPEC section 18, not counted): "
                f"{len(self.missing_key)}, first: {self.missing_key[0]}"
            )
        first = self.first_nondeterminism()
        if first is not None:
            lines.append(f"first nondeterminism error: {first}")
        lines.extend(f"  replay failure: {f}" for f in self.replay_failures[:10])
        return lines


async def check_histories(
    executions: Iterable[tuple[str, str, WorkflowHistory]], data_converter: DataConverter
) -> HistoryCheck:
    """Replay each (workflow id, run id, history) on its own and count its workflow-task
    failures by cause. It takes histories, not a server, so a test can hand it the
    histories of runs the query race wedged (`tests/wedged/`) and see it fail."""
    check = HistoryCheck()
    for workflow_id, run_id, history in executions:
        check.replayed += 1
        why = await replay(history, data_converter)
        if why is not None:
            failed = Failed(workflow_id, run_id, _nondeterminism(why) or why)
            if MISSING_KEY in why:
                check.missing_key.append(failed)
            else:
                check.replay_failures.append(failed)
                if _nondeterminism(why):
                    check.nondeterminism.append(failed)
        causes = task_failures(history.events)
        for event in history.events:
            if event.event_type != EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                continue
            attributes = event.workflow_task_failed_event_attributes
            message = await _failure_text(attributes.failure, data_converter)
            failed = Failed(workflow_id, run_id, message, event.event_time.ToNanoseconds() / 1e9)
            if MISSING_KEY in message:
                causes.subtract(task_failures([event]))
                check.missing_key.append(failed)
            elif attributes.cause == _NON_DETERMINISTIC:
                check.nondeterminism.append(
                    Failed(workflow_id, run_id, _nondeterminism(message) or message, failed.at)
                )
        for cause, n in (+causes).items():
            (check.handovers if cause in HANDOVERS else check.task_failures)[cause] += n
    return check


_NON_DETERMINISTIC = WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_NON_DETERMINISTIC_ERROR


def _nondeterminism(message: str) -> str | None:
    """A nondeterminism error's own words, if `message` holds one."""
    found = NONDETERMINISM.search(message)
    return found.group(0) if found else None


async def _failure_text(failure: Failure, data_converter: DataConverter) -> str:
    """A workflow task's failure message, decoded (a codec may encode messages)."""
    copy = Failure()
    copy.CopyFrom(failure)
    try:
        return str(await data_converter.decode_failure(copy))
    except Exception as err:  # undecodable: a missing key says so in `err`
        return f"{failure.message} (undecodable: {type(err).__name__}: {err})"


def next_run(history: WorkflowHistory) -> str | None:
    """The run an execution handed over to when it closed (continue-as-new, a retry or a
    cron schedule's next run), if it did."""
    if not history.events:
        return None
    last = history.events[-1]
    for name in (
        "workflow_execution_continued_as_new_event_attributes",
        "workflow_execution_completed_event_attributes",
        "workflow_execution_failed_event_attributes",
        "workflow_execution_timed_out_event_attributes",
    ):
        if last.HasField(name):
            return str(getattr(last, name).new_execution_run_id) or None
    return None


def decisions_in(workflow_id: str, events: Iterable[HistoryEvent]) -> dict[str, tuple[str, str]]:
    """The operator's `resolve_tool` decisions an execution accepted: update id ->
    (`{run}/{key}`, resolution type). Keyed by update id, since a reset run copies the
    events it was reset from."""
    found: dict[str, tuple[str, str]] = {}
    for event in events:
        if not event.HasField("workflow_execution_update_accepted_event_attributes"):
            continue
        request = event.workflow_execution_update_accepted_event_attributes.accepted_request
        if request.input.name != "resolve_tool":
            continue
        body = json.loads(request.input.args.payloads[0].data)
        op = f"{workflow_id}/{body['operation']}"
        found[request.meta.update_id] = (op, body["resolution"]["type"])
    return found


def submissions_in(events: Iterable[HistoryEvent]) -> dict[str, tuple[str, bool | None]]:
    """A session execution's accepted `submit` updates: update id -> (the submitted text,
    whether the session queued it behind an open run; None until it answered)."""
    found: dict[str, tuple[str, bool | None]] = {}
    for event in events:
        if event.HasField("workflow_execution_update_accepted_event_attributes"):
            request = event.workflow_execution_update_accepted_event_attributes.accepted_request
            if request.input.name == "submit":
                body = json.loads(request.input.args.payloads[0].data)
                found[request.meta.update_id] = (str(body["input"]), None)
        elif event.HasField("workflow_execution_update_completed_event_attributes"):
            completed = event.workflow_execution_update_completed_event_attributes
            update_id = completed.meta.update_id
            if update_id in found and completed.outcome.HasField("success"):
                answer = json.loads(completed.outcome.success.payloads[0].data)
                found[update_id] = (found[update_id][0], bool(answer.get("queued")))
    return found


# -- the soak ---------------------------------------------------------------------------


@dataclass
class Tally:
    kills: int = 0
    kills_mid_manual: int = 0
    kills_mid_several: int = 0  # inside several manual calls of one run
    kills_put_off: int = 0  # fewer than two workers had connected
    kills_spared: int = 0  # kills that spared (or put off for) a model request's last attempt
    server_restarts: int = 0
    server_restart_at: float | None = None
    server_downtime_s: float = 0.0
    workers_alive_after_restart: str = "-"
    restart_phase: str = "-"
    signals_sent: int = 0
    approved: dict[str, bool] = field(default_factory=dict)  # op -> approved
    attention: dict[tuple[str, str], float] = field(default_factory=dict)  # (run, key) -> t
    other_attention: dict[str, str] = field(default_factory=dict)  # run -> reason
    resolved_json: int = 0
    resolved_rerun: int = 0
    # The operator's resolve_tool decisions, op -> resolution types: those the run
    # confirmed, and those whose confirmation timed out or was cut off ("it may still be
    # applied"): the checker allows a rerun either way, since it was asked for.
    decided: defaultdict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    unconfirmed: defaultdict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    failed_retried: Counter[str] = field(default_factory=Counter)  # run -> times
    failed_errors: list[str] = field(default_factory=list)
    unresolved_waits: int = 0  # checks that could not prove anything yet
    killed_at: dict[int, float] = field(default_factory=dict)  # pid -> soak time of the kill
    killed_wall: dict[int, float] = field(default_factory=dict)  # pid -> time.time() then
    most_blocked: Counter[str] = field(default_factory=Counter)  # run -> most blocked at once
    most_pending: Counter[str] = field(default_factory=Counter)  # run -> most pending at once
    batch_signals: int = 0  # signals that answered several interactions at once
    resolve_conflicts: int = 0  # resolve_tool refused (the run moved on): look again later
    hostile: Counter[str] = field(default_factory=Counter)  # the flooder's inputs, by kind
    hostile_accepted: Counter[str] = field(default_factory=Counter)  # of those, accepted
    # Subagents: child run -> parent, as the operator found it, and how.
    child_parent: dict[str, str] = field(default_factory=dict)
    children_from_list: set[str] = field(default_factory=set)  # listed (by agent id)
    listed_without_parent: set[str] = field(default_factory=set)  # RunSummary.parent_run_id
    children_from_parent: set[str] = field(default_factory=set)  # parent's children
    parents_parked: set[str] = field(default_factory=set)  # seen with subagent_failed
    children_fixed: Counter[str] = field(default_factory=Counter)  # child -> register fixes
    # Retries after a fix whose answer never came back (the server restarting): they may
    # still have been applied, and the child then runs again with no confirmed retry.
    children_retry_unconfirmed: Counter[str] = field(default_factory=Counter)
    # Limits: runs seen parked `budget_exceeded`, raises the run confirmed, raises it
    # refused (the run had moved on), raises whose answer never came back.
    parked_on_limit: Counter[str] = field(default_factory=Counter)  # run -> times seen
    raised: Counter[str] = field(default_factory=Counter)  # run -> raises confirmed
    raise_refused: int = 0
    raise_unconfirmed: int = 0
    # Sessions: submissions retried after an answer that never came (found applied, or
    # sent again), and refusals as busy the driver waited out.
    submit_retries: int = 0
    submit_found_applied: int = 0
    submit_busy_waits: int = 0


class Soak:
    def __init__(self, size: Size, tmp: Path) -> None:
        self.size = size
        self.tmp = tmp
        self.journal_dir = tmp / "journal"
        self.journal_dir.mkdir()
        self.journal = Journal(self.journal_dir)
        self.tickets = TicketService()
        self.mcp = McpServer(tmp)
        ports = free_ports(2)
        self.server = DevServer(
            db=tmp / "temporal.db", port=ports[0], ui_port=ports[1], log_path=tmp / "server.log"
        )
        env = {
            **os.environ,
            "CHAOS_JOURNAL_DIR": str(self.journal_dir),
            "CHAOS_DEDUP_URL": self.tickets.url,
            "CHAOS_MCP_URL": self.mcp.url,
            "CHAOS_MCP_LOCK": str(self.mcp.lock),
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p
            ),
        }
        self.env = env
        self.workers = Workers(size.workers, self.server.address, tmp, env)
        self.client: DurableClient | None = None
        self.run_ids: list[str] = []
        self.agent_of: dict[str, str] = {}  # run id -> agent id (children too, in verify)
        self.kind_of: dict[str, str] = {}  # run id -> the kind of work it belongs to
        # Sessions: session id -> its submissions' inputs and run ids, in order; each
        # session run -> (session id, submission number, from 1).
        self.sessions: dict[str, list[tuple[str, str]]] = {}
        self.session_of: dict[str, tuple[str, int]] = {}
        self.sessions_closed: set[str] = set()
        self.promised = 0  # submissions of started sessions not made yet
        self.session_tasks: set[asyncio.Task[None]] = set()
        self.flaky: set[str] = set()  # delegating runs whose child finds the register down
        self.completed: set[str] = set()
        # What the killer's look-ups found: runs closed, child runs started.
        self.closed: set[str] = set()
        self.children: set[str] = set()
        self.tally = Tally()
        self.chaos = asyncio.Lock()  # held by the server restart: no kills meanwhile
        self.soak_over = asyncio.Event()
        self.tick = asyncio.Event()  # set (and replaced) each time `completed` is refreshed
        self.started_at = 0.0
        self.rng = random.Random()
        self.signalled: dict[str, float] = {}  # interaction key -> when signalled
        self.busy: set[str] = set()  # runs the operator is handling right now
        self.spawn: Callable[[str], None] = lambda run_id: None  # the operator: attend a run
        self.delegation_stats: Counter[str] = Counter()
        self.driver_errors: list[str] = []
        self.server_down = False
        self.last_progress = 0.0  # soak time of the latest progress (see `Size.stall_s`)
        self.ended = "the soak's driver crashed"  # why the soak ended

    @property
    def temporal(self) -> Any:
        assert self.client is not None
        return self.client.temporal

    def elapsed(self) -> float:
        return time.monotonic() - self.started_at

    # -- lifecycle --------------------------------------------------------------------

    async def run(self) -> int:
        log(
            f"{self.size.runs} runs, {self.size.workers} workers, in flight <= "
            f"{self.size.in_flight}, kill every {self.size.kill_every[0]}-"
            f"{self.size.kill_every[1]} s; temp dir {self.tmp}"
        )
        try:
            self.client = DurableClient(await self.server.start(), task_queue=TASK_QUEUE)
            await self.mcp.start(self.env)
            self.workers.start_all()
            self.started_at = time.monotonic()
            tasks = [
                asyncio.create_task(self.guarded(coro))
                for coro in (
                    self.starter(),
                    self.watcher(),
                    self.operator(),
                    self.killer(),
                    self.flooder(),
                    self.supervisor(),
                    self.server_restarter(),
                    self.progress(),
                )
            ]
            # The watcher ends the soak (every run completed, a stall, the cap); the
            # margin covers a watcher stuck in a call to a server that does not answer.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.soak_over.wait(), self.size.cap_s + 60)
            soak_s = self.elapsed()
            log(f"the soak ended after {soak_s:.0f} s: {self.ended}")
            self.soak_over.set()
            tasks += self.session_tasks
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if self.tally.server_restarts == 0:
                # Every run completed first: restart anyway, so the database is reopened.
                await self.restart_server(phase="after the soak")
            return await self.verify(soak_s)
        finally:
            self.workers.stop_all()
            await self.server.stop()
            self.tickets.close()
            self.mcp.stop()

    async def guarded(self, work: Awaitable[None]) -> None:
        """Run one of the soak's tasks; a crash in the driver ends the soak as a violation."""
        try:
            await work
        except asyncio.CancelledError:
            raise
        except BaseException as err:
            self.driver_errors.append(f"{type(err).__name__}: {err}")
            log(f"driver task crashed: {type(err).__name__}: {err}")
            self.soak_over.set()

    async def retrying(self, what: str, call: Callable[[], Awaitable[Any]]) -> Any:
        """Call until it works (the server may be restarting), bounded by the deadline."""
        while True:
            try:
                return await call()
            except DurableConflictError:
                raise
            except RPC_ERRORS as err:
                gone = isinstance(err, RPCError) and err.status == RPCStatusCode.NOT_FOUND
                if gone or self.elapsed() > self.size.cap_s + 60:
                    raise
                log(f"{what}: {type(err).__name__}: {err}; trying again")
                await asyncio.sleep(0.5)

    # -- drivers ------------------------------------------------------------------------

    def in_flight(self) -> int:
        """Runs started and not completed, and submissions sessions will still make."""
        return len(self.run_ids) + self.promised - len(self.completed)

    async def starter(self) -> None:
        """Start the work of `plan(runs)`, one piece at a time, keeping at most `in_flight`
        runs unfinished (a session counts its submissions from its start)."""
        delegating = 0
        for i, kind in enumerate(plan(self.size.runs)):
            size = chaos_agents.SESSION_SUBMISSIONS if kind == "session" else 1
            while self.in_flight() + size > max(self.size.in_flight, size):
                await self.tick.wait()
            name = f"chaos-{i:04d}-{kind}"
            if kind == "session":
                self.promised += size
                task = asyncio.create_task(self.guarded(self.converse(name)))
                self.session_tasks.add(task)
                task.add_done_callback(self.session_tasks.discard)
                continue
            text = f"chaos run {name}"
            if chaos_agents.SUBAGENTS.get(kind):
                delegating += 1
                if delegating % 2 == 0:  # every other one: its child fails until fixed
                    text += f" {chaos_agents.FLAKY_PAYEE}"
                    self.flaky.add(name)

            async def start(kind: str = kind, run_id: str = name, text: str = text) -> None:
                assert self.client is not None
                # A conflict: an earlier try started it, and its answer was lost.
                with contextlib.suppress(DurableConflictError):
                    if kind in chaos_agents.TASKS:
                        invoice = {"invoice": f"INV-{run_id}", "amount_cents": 1200}
                        await self.client.start_task(kind, invoice, run_id=run_id)
                    else:
                        await self.client.start_run(kind, text, run_id=run_id)

            await self.retrying(f"start {name}", start)
            self.run_ids.append(name)
            self.agent_of[name] = kind
            self.kind_of[name] = kind

    # -- sessions ---------------------------------------------------------------------

    async def converse(self, session_id: str) -> None:
        """One session: start it, submit its first message, the second at once (the first
        run still open: `if_busy="enqueue"`), the third once the second completed (the
        session is free then: a plain submission), then close it once that completed."""
        agent = chaos_agents.SESSION_AGENT
        texts = [
            f"chaos session {session_id}, message {n}"
            for n in range(1, chaos_agents.SESSION_SUBMISSIONS + 1)
        ]
        self.sessions[session_id] = []

        async def start() -> None:
            assert self.client is not None
            with contextlib.suppress(DurableConflictError):  # an earlier try started it
                await self.client.start_session(agent, session_id=session_id)

        await self.retrying(f"start session {session_id}", start)
        run_id = ""
        for n, text in enumerate(texts, start=1):
            if n > 2:
                await self.until_completed(run_id)
            run_id = await self.submit(session_id, text, "enqueue" if n == 2 else "reject")
            self.sessions[session_id].append((text, run_id))
            self.session_of[run_id] = (session_id, n)
            self.agent_of[run_id] = agent
            self.kind_of[run_id] = "session"
            self.run_ids.append(run_id)
            self.promised -= 1
        await self.until_completed(run_id)

        async def close() -> None:
            assert self.client is not None
            session = await self.client.get_session(session_id)
            with contextlib.suppress(DurableConflictError):  # an earlier try closed it
                await session.close()

        await self.retrying(f"close session {session_id}", close)

        async def ended() -> None:
            """The session's workflow closes once it took its last run's messages."""
            await self.temporal.get_workflow_handle(session_id).result()

        await self.retrying(f"the end of session {session_id}", ended)
        self.sessions_closed.add(session_id)

    async def until_completed(self, run_id: str) -> None:
        while run_id not in self.completed:
            await self.tick.wait()

    async def submit(self, session_id: str, text: str, if_busy: IfBusy) -> str:
        """Submit `text` once: an answer that never came back (the server restarting) may
        hide an accepted submission, so the session is asked first before trying again.
        A refusal as busy (the session has not yet taken the closed run's messages, or the
        previous run is not done) is waited out."""
        client = self.client
        assert client is not None
        session: SessionHandle = await self.retrying(
            f"session {session_id}", lambda: client.get_session(session_id)
        )
        asked = False
        while True:
            if asked:
                snap: SessionSnapshot = await self.retrying(
                    f"snapshot {session_id}", session.snapshot
                )
                found = next((r.run_id for r in snap.runs if r.input == text), None)
                if found is not None:
                    self.tally.submit_found_applied += 1
                    return found
                self.tally.submit_retries += 1
            asked = True
            try:
                run = await session.submit(text, if_busy=if_busy)
                return run.run_id
            except DurableConflictError as err:
                if "is closed" in str(err):
                    raise
                self.tally.submit_busy_waits += 1
                await self.tick.wait()
            except RPC_ERRORS as err:
                if self.elapsed() > self.size.cap_s + 60:
                    raise
                log(f"submit to {session_id}: {type(err).__name__}: {err}; looking again")
                await asyncio.sleep(0.5)

    async def watcher(self) -> None:
        """Notice completed runs (visibility) and progress; end the soak when every run
        completed, when no run made progress for `stall_s`, or at `cap_s`."""
        seen: tuple[int, ...] = ()
        while True:
            try:
                assert self.client is not None
                done = await self.client.list_runs(status=RunStatus.COMPLETED, limit=None)
                self.completed = {r.run_id for r in done} & set(self.run_ids)
            except RPC_ERRORS:
                pass
            self.tick.set()
            self.tick = asyncio.Event()
            if (marker := self.progress_marker()) != seen:
                seen, self.last_progress = marker, self.elapsed()
            stalled = self.elapsed() - self.last_progress
            started_all = len(self.run_ids) == self.size.runs and not self.promised
            closed_all = len(self.sessions_closed) == len(self.sessions)
            if started_all and len(self.completed) == self.size.runs and closed_all:
                self.ended = "every run completed, every session closed"
            elif stalled > self.size.stall_s:
                self.ended = f"no run made progress for {stalled:.0f} s, runs unfinished"
            elif self.elapsed() > self.size.cap_s:
                self.ended = f"the cap of {self.size.cap_s:.0f} s passed, runs unfinished"
            else:
                await asyncio.sleep(0.5)
                continue
            self.soak_over.set()
            return

    def progress_marker(self) -> tuple[int, ...]:
        """What changes when any run moves forward: runs started and completed, tool calls
        journaled (ours and the MCP server's), interrupted calls resolved, approvals
        answered, limits raised, children mended, sessions closed. Not the operator's
        looks or repeated signals: a wedged run gets those forever."""
        self.journal.refresh()
        t = self.tally
        return (
            len(self.run_ids),
            len(self.completed),
            len(self.journal.entries),
            len(self.mcp.refresh()),
            sum(len(kinds) for kinds in t.decided.values()),
            len(t.approved),
            sum(t.raised.values()),
            sum(t.children_fixed.values()),
            len(self.sessions_closed),
        )

    async def progress(self) -> None:
        while True:
            await asyncio.sleep(5)
            t = self.tally
            log(
                f"t={self.elapsed():.0f}s started={len(self.run_ids)} "
                f"completed={len(self.completed)} kills={t.kills} "
                f"restarts={t.server_restarts} attention={len(t.attention)} "
                f"approvals={len(t.approved)} raises={sum(t.raised.values())} "
                f"sessions closed={len(self.sessions_closed)}/{len(self.sessions)} "
                f"failed_retries={sum(t.failed_retried.values())}"
            )

    async def flooder(self) -> None:
        """A hostile client: forged and padded inputs to random unfinished runs (see the
        module docstring). Accepted ones are counted: each is a violation."""
        while True:
            await asyncio.sleep(self.rng.uniform(0.2, 0.6))
            open_runs = [r for r in self.run_ids if r not in self.completed]
            sessions = [s for s in self.sessions if s not in self.sessions_closed]
            if not open_runs:
                continue
            kind = self.rng.choice(["ciphertext", "padded", "typed", "child_note", "run_note"])
            target = self.rng.choice(sessions if kind == "run_note" and sessions else open_runs)
            handle = self.temporal.get_workflow_handle(target)
            self.tally.hostile[kind] += 1
            try:
                await self._hostile(kind, handle, target)
            except WorkflowUpdateFailedError:
                continue  # refused, as it must be
            except (RPCError, TemporalError, TimeoutError):
                continue  # the server restarting, or the run closed meanwhile

    async def _hostile(self, kind: str, handle: Any, target: str) -> None:
        if kind == "ciphertext":
            forged = Payload(
                metadata={
                    "encoding": b"binary/encrypted",
                    "encryption-key-id": f"k{self.rng.randrange(10**6)}".encode(),
                    "durably-cipher": b"aes256gcm",
                },
                data=os.urandom(self.rng.randrange(0, 64 * 2**10)),
            )
            await handle.signal("respond_signal", RawValue(forged))
        elif kind in ("padded", "typed"):
            if kind == "padded":
                junk = "j" * self.rng.randrange(5 * 2**10, 200 * 2**10)
                request: dict[str, Any] = {
                    "interaction_id": "approval:1:x",
                    "response": {"type": "tool-approval", "approved": True, "junk": junk},
                }
                update = "respond"
            else:
                request, update = {"limits": {"tool_calls": "1000"}}, "raise_limits"
            await asyncio.wait_for(handle.execute_update(update, request), 20)
            self.tally.hostile_accepted[kind] += 1
        elif kind == "child_note":
            note = {"run_id": self.rng.choice(self.run_ids), "status": "failed", "seq": 10**18}
            await handle.signal("child_status", note)
        else:
            runs = self.sessions.get(target) or [("", target)]
            note = {"run_id": self.rng.choice(runs)[1], "status": "failed"}
            await handle.signal("run_status", note)

    async def killer(self) -> None:
        while True:
            await asyncio.sleep(self.rng.uniform(*self.size.kill_every))
            async with self.chaos:
                # Only a worker that connected, and not the last one: a worker takes seconds
                # to start on a loaded machine, and a killer that struck booting workers
                # (half its kills, on a quiet machine) left none serving for long stretches,
                # so the soak measured the machine's load rather than durably.
                ready = [s for s in self.workers.alive() if s.connected()]
                if not ready or len(ready) < min(2, len(self.workers.slots)):
                    self.tally.kills_put_off += 1
                    continue
                spared, coming = await self.last_model_attempts()
                if coming or any(s.proc and s.proc.pid in spared for s in ready):
                    self.tally.kills_spared += 1
                    ready = [s for s in ready if s.proc and s.proc.pid not in spared]
                    if coming or not ready:
                        continue
                # Every other kill aims at a worker inside a manual call, when there is one:
                # inside several of one run (concurrent calls of one answer) if there is one.
                mid_manual, mid_several = self.mid_manual_call(ready)
                aimed = bool(mid_manual) and self.rng.random() < 0.5
                slot = self.rng.choice((mid_several or mid_manual) if aimed else ready)
                slot.killing = True
                pid = await asyncio.to_thread(self.workers.kill, slot)
                self.tally.kills += 1
                self.tally.kills_mid_manual += slot in mid_manual
                self.tally.killed_at[pid] = self.elapsed()
                self.tally.killed_wall[pid] = time.time()
                what = "inside a manual call" if slot in mid_manual else "at random"
                if slot in mid_several:
                    what = "inside several manual calls of one run"
                    self.tally.kills_mid_several += 1
                log(f"killed worker {slot.index} (pid {pid}) {what}; kill {self.tally.kills}")
                self.workers.start(slot)

    async def last_model_attempts(self) -> tuple[set[int], bool]:
        """The workers running a model request's last attempt, and whether a last attempt
        is about to start on a worker nobody can tell yet (it waits for a worker, or the
        attempt before it died with its worker). A kill there fails the run, as durably
        promises (crashed attempts count, three without `model_retry`: SPEC section 8),
        so the killer spares those workers, and puts its kill off in the second case.
        Such attempts are long: a worker without the run's transcript asks the run for
        it, whose own worker just died. Without this, three kills in a row on one
        request were common, and the soak failed runs by its own hand."""
        dead = self.workers.dead
        started = PendingActivityState.PENDING_ACTIVITY_STATE_STARTED

        async def pending(workflow_id: str) -> tuple[set[int], bool]:
            try:
                desc = await self.temporal.get_workflow_handle(workflow_id).describe()
            except RPC_ERRORS:
                return set(), False
            if desc.status != WorkflowExecutionStatus.RUNNING:
                self.closed.add(workflow_id)
            # Child runs: looked at from the next kill on (the operator may not know them).
            self.children.update(c.workflow_id for c in desc.raw_description.pending_children)
            pids: set[int] = set()
            coming = False
            for activity in desc.raw_description.pending_activities:
                if not activity.activity_id.startswith("model:") or not activity.maximum_attempts:
                    continue
                left = activity.maximum_attempts - activity.attempt  # attempts after this one
                pid = -1
                with contextlib.suppress(ValueError):
                    pid = int(activity.last_worker_identity.split("@", 1)[0])
                if left <= 0 and activity.state == started:
                    pids.add(pid)
                elif left <= 0 or (left == 1 and activity.state == started and pid in dead):
                    coming = True
            return pids, coming

        t = self.tally
        known = {*self.run_ids, *self.children, *t.child_parent, *t.children_from_list}
        found = await asyncio.gather(*(pending(w) for w in known - self.closed))
        return set().union(*(pids for pids, _ in found)), any(coming for _, coming in found)

    def mid_manual_call(self, alive: list[Slot]) -> tuple[list[Slot], list[Slot]]:
        """Workers whose journal shows a manual call started and not finished, and those
        with several such calls of one run."""
        self.journal.refresh()
        open_calls: set[tuple[int, str]] = set()
        for entry in self.journal.entries[-2000:]:
            if entry["tool"] not in chaos_agents.MANUAL_TOOLS:
                continue
            key = (entry["pid"], entry["op"])
            if entry["ev"] == "start":
                open_calls.add(key)
            elif entry["ev"] in ("done", "aborted"):
                open_calls.discard(key)
        pids = {pid for pid, _ in open_calls}
        per_run = Counter((pid, _op_run(op)) for pid, op in open_calls)
        several = {pid for (pid, _), n in per_run.items() if n > 1}
        return (
            [s for s in alive if s.proc is not None and s.proc.pid in pids],
            [s for s in alive if s.proc is not None and s.proc.pid in several],
        )

    async def supervisor(self) -> None:
        """Restart workers that exited by themselves, and report each exit."""
        while True:
            await asyncio.sleep(0.5)
            for slot in self.workers.reap_exited():
                pid, code, connected = self.workers.exits[-1]
                state = "after connecting" if connected else "before connecting"
                log(f"worker {slot.index} (pid {pid}) exited by itself {state}, code {code}")
            if not self.server_down:  # a worker cannot connect meanwhile: it would exit 1
                for slot in self.workers.slots:
                    if slot.proc is None and not slot.killing:
                        self.workers.start(slot)

    async def server_restarter(self) -> None:
        want = max(1, int(self.size.runs * self.size.restart_after))
        while len(self.completed) < want:
            await self.tick.wait()
        await self.restart_server(phase=f"mid-soak, after {len(self.completed)} completions")

    async def restart_server(self, *, phase: str) -> None:
        async with self.chaos:
            # Let freshly started workers connect first, so "did they survive" is fair.
            for _ in range(75):  # at most 15 s
                if all(s.connected() for s in self.workers.alive()):
                    break
                await asyncio.sleep(0.2)
            before = {s.index: s.proc.pid for s in self.workers.alive() if s.proc is not None}
            log(f"stopping the dev server ({phase})")
            down = time.monotonic()
            self.tally.server_restart_at = self.elapsed()
            self.server_down = True
            await self.server.stop()
            await asyncio.sleep(1.0)
            self.client = DurableClient(await self.server.start(), task_queue=TASK_QUEUE)
            self.server_down = False
            self.tally.server_downtime_s = time.monotonic() - down
            self.tally.server_restarts += 1
            self.tally.restart_phase = phase
            log(f"dev server back after {self.tally.server_downtime_s:.1f} s")
            # Do the workers that lived through it keep polling, or exit?
            await asyncio.sleep(5.0)
            survived = [
                i
                for i, pid in before.items()
                if (p := self.workers.slots[i].proc) is not None
                and p.pid == pid
                and p.poll() is None
            ]
            exited_codes = [code for pid, code, _ in self.workers.exits if pid in before.values()]
            self.tally.workers_alive_after_restart = (
                f"{len(survived)}/{len(before)} kept running"
                + (f"; exited with codes {exited_codes}" if exited_codes else "")
            )
            log(f"workers through the server restart: {self.tally.workers_alive_after_restart}")

    # -- the operator -------------------------------------------------------------------

    async def operator(self) -> None:
        """Look at every parked run about three times a second, each in its own task."""
        gate = asyncio.Semaphore(8)
        tasks: set[asyncio.Task[None]] = set()

        async def attend(run_id: str) -> None:
            try:
                # In this task (not `wait_for`'s own): an error the cut-off call raises
                # instead of its cancellation (an update "may still be applied") lands here.
                async with gate, asyncio.timeout(30):
                    await self.attend(run_id)
            except (*RPC_ERRORS, DurableConflictError) as err:
                log(f"operator on {run_id}: {type(err).__name__}: {err}")
            finally:
                self.busy.discard(run_id)

        def spawn(run_id: str) -> None:
            """Attend the run in a task of its own, unless one is at it already."""
            if run_id in self.busy:
                return
            self.busy.add(run_id)
            task = asyncio.create_task(attend(run_id))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        self.spawn = spawn
        try:
            await self.operate()
        finally:
            for task in tasks:
                task.cancel()

    async def operate(self) -> None:
        while True:
            try:
                assert self.client is not None
                runs = await self.client.list_runs(
                    status=[RunStatus.WAITING, RunStatus.NEEDS_ATTENTION, RunStatus.FAILED],
                    limit=None,
                )
            except RPC_ERRORS:
                await asyncio.sleep(0.5)
                continue
            for summary in runs:  # child runs among them: runs of their own
                if summary.agent_id in chaos_agents.CHILD_AGENTS:
                    self.tally.children_from_list.add(summary.run_id)
                    if summary.parent_run_id is None:
                        self.tally.listed_without_parent.add(summary.run_id)
                self.spawn(summary.run_id)
            await asyncio.sleep(0.3)

    def found_child(self, child_id: str, parent_id: str) -> None:
        """A child run, found from its parent's snapshot."""
        self.tally.child_parent.setdefault(child_id, parent_id)
        self.tally.children_from_parent.add(child_id)

    async def attend(self, run_id: str) -> None:
        """Everything the run waits for at once: the calls of one model answer run
        concurrently, so a run may be blocked on several interrupted calls, have failed
        ones, and wait for approvals, all at the same time (its status names the first).
        A subagent's run is handled by its own id; its parent's snapshot names it."""
        run = RunHandle(self.temporal, run_id)
        snap = await run.snapshot()
        t = self.tally
        t.most_pending[run_id] = max(t.most_pending[run_id], len(snap.interactions))
        t.most_blocked[run_id] = max(t.most_blocked[run_id], len(snap.blocked_operations))
        child_of_call: dict[str, str] = {}  # the parent's subagent call -> its child run
        for child in snap.children:
            child_of_call[child.operation] = child.run_id
            self.found_child(child.run_id, run_id)
            if child.status in ("waiting", "needs_attention", "failed"):
                self.spawn(child.run_id)  # it waits for someone: attend it by its own id
        if snap.interactions:
            await self.answer(run_id, [i.model_dump(mode="json") for i in snap.interactions])
        if snap.status == RunStatus.NEEDS_ATTENTION:
            # `attention` says why the first blocked operation is; the others of a turn
            # are interrupted tool calls too, subagent calls whose child failed, or
            # resolve_tool refuses them (logged).
            reason = snap.attention.reason if snap.attention else "unknown"
            if reason == "subagent_failed" and snap.attention is not None:
                # The parent goes on by itself once its child runs again: mend the child.
                t.parents_parked.add(run_id)
                detail: dict[str, Any] = getattr(snap.attention, "detail", {}) or {}
                child_id = str(detail.get("child_run_id", ""))
                if child_id:
                    self.found_child(child_id, run_id)
                    self.spawn(child_id)
            elif reason == "budget_exceeded" and isinstance(snap.attention, BudgetExceeded):
                await self.raise_limit(run, snap.attention)
                return
            elif reason != "tool_interrupted" or not snap.blocked_operations:
                t.other_attention[run_id] = reason
                await run.retry()
                return
            for key in snap.blocked_operations:  # one at a time; each on its own evidence
                if key in child_of_call:  # a subagent call: its child is attended above
                    continue
                t.attention.setdefault((run_id, key), self.elapsed())
                try:
                    await self.reconcile(run_id, key)
                except DurableConflictError as err:
                    # A decision on its way already, or the snapshot ran ahead of the run:
                    # a query replays every event in history, while the update is validated
                    # before the workflow task's new events (a timed-out call) are applied.
                    t.resolve_conflicts += 1
                    log(f"operator on {run_id}/{key}: {err}")
        if snap.status == RunStatus.FAILED or snap.failed_operations:
            if self.register_down(snap):
                # On purpose: fix the payee register, then retry the child.
                self.tickets.fix(run_id)
                try:
                    await run.retry()
                except DurableConflictError:
                    raise
                except BaseException:
                    t.children_retry_unconfirmed[run_id] += 1
                    raise
                t.children_fixed[run_id] += 1
                log(f"child {run_id} failed: the payee register is down; fixed it, retried")
                return
            t.failed_retried[run_id] += 1
            t.failed_errors.append(f"{run_id}: {snap.failed_operations} {snap.error}")
            log(f"run {run_id} failed ({snap.failed_operations}: {snap.error}); retrying it")
            await run.retry()

    async def raise_limit(self, run: RunHandle, parked: BudgetExceeded) -> None:
        """Allow one more of what the run ran out of (`raise_limits`): a `metered` run
        parks before each tool call after its first, and goes on once raised."""
        t = self.tally
        t.parked_on_limit[run.run_id] += 1
        value = math.floor(parked.used) + 1
        try:
            await run.raise_limits({parked.limit: value}, responder=OPERATOR)
        except (DurableConflictError, InvalidResponseError) as err:
            t.raise_refused += 1  # the snapshot ran ahead, or the run moved on: look again
            log(f"operator on {run.run_id}: raise_limits refused: {err}")
            return
        except BaseException:
            t.raise_unconfirmed += 1
            raise
        t.raised[run.run_id] += 1
        log(f"raised {run.run_id}'s {parked.limit} to {value} (used {parked.used:g})")

    def register_down(self, snap: RunSnapshot) -> bool:
        """A child run failed on purpose: only its payee checks failed, the register
        refused this run's checks, and no retry after fixing it was accepted yet. (The
        error names the last attempt: the register's refusal, or a heartbeat timeout when
        a kill cut that attempt.)"""
        script = chaos_agents.SCRIPTS.get(snap.agent_id, [])
        tools = {
            f"tool:{turn}:t{turn}-{n}": name
            for turn, calls in enumerate(script, start=1)
            for n, (name, _) in enumerate(calls, start=1)
        }
        return (
            snap.parent_run_id is not None
            and bool(snap.failed_operations)
            and all(tools.get(key) == "verify_payee" for key in snap.failed_operations)
            and self.tickets.down[snap.run_id] > 0
            and self.tally.children_fixed[snap.run_id] == 0
        )

    async def answer(self, run_id: str, interactions: list[dict[str, Any]]) -> None:
        """Approve or deny each pending approval not signalled lately: one signal, or one
        signal holding the list (taken all or none) when several are pending."""
        now = time.monotonic()
        due = [
            i for i in interactions if now - self.signalled.get(f"{run_id}/{i['id']}", -1e9) >= 10
        ]  # signalled within 10 s: the run has not caught up yet
        requests: list[RespondRequest] = []
        decisions: dict[str, bool] = {}
        for interaction in due:
            op = f"{run_id}/{interaction['operation']}"
            approved = int(hashlib.sha256(op.encode()).hexdigest()[:8], 16) % 7 != 0
            response: dict[str, Any] = {"type": "tool-approval", "approved": approved}
            if approved:
                response["args_digest"] = interaction["args_digest"]
            else:
                response["reason"] = "chaos operator says no"
            requests.append(
                RespondRequest(
                    interaction_id=interaction["id"], response=response, responder=OPERATOR
                )
            )
            decisions[op] = approved
        if not requests:
            return
        handle = self.temporal.get_workflow_handle(run_id)
        if len(requests) == 1:
            await handle.signal("respond_signal", requests[0])
        else:
            await handle.signal("respond_signal", requests)
            self.tally.batch_signals += 1
        for interaction in due:
            self.signalled[f"{run_id}/{interaction['id']}"] = now
        self.tally.signals_sent += 1
        self.tally.approved.update(decisions)

    async def reconcile(self, run_id: str, key: str) -> None:
        """Resolve an interrupted manual call from the journal, or leave it blocked."""
        assert self.client is not None
        op = f"{run_id}/{key}"
        # Who ran the interrupted attempt: the worker identity in the run's history.
        pid = await self.last_attempt_pid(run_id, key)
        dead = pid is not None and pid in self.workers.dead
        # Read the journal only now: a dead process writes nothing more.
        self.journal.refresh()
        effects = self.journal.of(op, "effect")
        run = RunHandle(self.temporal, run_id)
        if effects:
            await self.decide(run, key, {"type": "json", "value": effects[-1]["result"]})
            self.tally.resolved_json += 1
            log(f"resolved {op}: the journal shows its effect -> json {effects[-1]['result']}")
            return
        starts = [e for e in self.journal.of(op, "start") if e["pid"] == pid]
        aborted = [
            e
            for e in self.journal.of(op, "aborted")
            if e["pid"] == pid and starts and e["t"] >= starts[-1]["t"]
        ]
        if dead or aborted:
            await self.decide(run, key, {"type": "rerun"})
            self.tally.resolved_rerun += 1
            why = f"pid {pid} is dead" if dead else f"pid {pid} aborted before the effect"
            log(f"resolved {op}: no effect and {why} -> rerun")
            return
        self.tally.unresolved_waits += 1  # the attempt may still be running: look later

    async def decide(self, run: RunHandle, key: str, resolution: dict[str, Any]) -> None:
        """`resolve_tool`, remembering the decision: confirmed, or unconfirmed when the
        answer did not come back (a timeout, the server restarting, the operator's time
        limit cutting the call off), since Temporal may apply it all the same."""
        op, kind = f"{run.run_id}/{key}", str(resolution["type"])
        try:
            await run.resolve_tool(key, resolution)
        except (DurableConflictError, InvalidResponseError):
            raise  # refused by the run's validator: nothing was applied
        except BaseException:
            self.tally.unconfirmed[op].append(kind)
            raise
        self.tally.decided[op].append(kind)

    async def last_attempt_pid(self, run_id: str, key: str) -> int | None:
        history = await self.temporal.get_workflow_handle(run_id).fetch_history()
        scheduled: dict[int, str] = {}
        pid: int | None = None
        for event in history.events:
            if event.HasField("activity_task_scheduled_event_attributes"):
                scheduled[event.event_id] = (
                    event.activity_task_scheduled_event_attributes.activity_id
                )
            elif event.HasField("activity_task_started_event_attributes"):
                started = event.activity_task_started_event_attributes
                if scheduled.get(started.scheduled_event_id) == key:
                    with contextlib.suppress(ValueError):
                        pid = int(started.identity.split("@", 1)[0])
        return pid

    # -- the checks -----------------------------------------------------------------------

    def check_delegation(
        self, d: Delegation, outputs: dict[str, dict[str, Any]], problems: list[str]
    ) -> dict[str, str]:
        """Each delegating run: one child workflow per subagent call, no other under its
        id, the child's output the call's result, its usage in the parent's; the children
        whose register was down were fixed and retried, the others never found it down.
        Returns each subagent call's op (`{run}/{key}`) -> its child run id."""
        stats = self.delegation_stats
        call_child: dict[str, str] = {}
        for run_id in self.run_ids:
            calls = subagent_calls(self.agent_of[run_id])
            direct: defaultdict[str, list[tuple[str, str]]] = defaultdict(list)
            for workflow_id, execution in d.listed.get(run_id, []):
                rest = workflow_id[len(run_id) + 1 :]  # `{first run id}/{key}` for a child
                direct[rest.split("/")[-1] if rest.count("/") == 1 else rest].append(
                    (workflow_id, execution)
                )
            for key in sorted(set(direct) - set(calls)):
                stats["workflows under a run's id that no call started"] += 1
                problems.append(f"{run_id}: workflows {direct[key]} no subagent call started")
            for key in calls:
                stats["subagent calls"] += 1
                expected = f"{run_id}/{d.first_run.get(run_id)}/{key}"
                call_child[f"{run_id}/{key}"] = expected
                found = direct.get(key, [])
                if [w for w, _ in found] != [expected]:
                    stats["subagent calls without exactly one child workflow"] += 1
                    problems.append(f"{run_id}/{key}: child workflows {found}, not [{expected}]")
                named = {d.parent_named.get(expected), self.tally.child_parent.get(expected)}
                if named - {None} != {run_id}:
                    stats["children naming another parent"] += 1
                    problems.append(f"{expected}: its parent is {named}, not {run_id}")
                parent, child = d.results.get(run_id), d.results.get(expected)
                if parent is None or child is None:
                    continue  # not completed: counted as lost
                got = outputs.get(run_id, {}).get("results", {}).get(key)
                if got != {"content": child.output, "error": False}:
                    stats["parents without their child's output"] += 1
                    problems.append(
                        f"{run_id}/{key}: result {got}, the child said {child.output!r}"
                    )
                # Its model answers; an attempt a kill interrupted counts as a request too
                # (Temporal tried it again), so a parent may count more, never fewer.
                own = len(chaos_agents.SCRIPTS[self.agent_of[run_id]]) + 1
                if parent.usage.requests < own + child.usage.requests:
                    stats["parents whose usage lacks their child's"] += 1
                    problems.append(
                        f"{run_id}: {parent.usage.requests} model requests, fewer than its "
                        f"own {own} + its child's {child.usage.requests}"
                    )
                fixed = (
                    self.tally.children_fixed[expected]
                    + self.tally.children_retry_unconfirmed[expected]
                )
                down = self.tickets.down[expected]
                if run_id in self.flaky:
                    stats["children failed on purpose (register down), fixed, retried"] += 1
                    if not (fixed and down):
                        problems.append(
                            f"{expected}: register down, yet fixed {fixed}, refused {down}"
                        )
                elif fixed or down:
                    problems.append(f"{expected}: register up, yet fixed {fixed}, refused {down}")
        return call_child

    async def verify(self, soak_s: float) -> int:
        gate = asyncio.Semaphore(16)
        outputs: dict[str, dict[str, Any]] = {}  # scripted agents' outputs, parsed
        task_outputs: dict[str, str] = {}  # task runs' outputs (the task's result)
        statuses: dict[str, str] = {}
        results: dict[str, RunResult] = {}
        first_run: dict[str, str] = {}  # run id -> its chain's first Temporal run id
        listed: dict[str, list[tuple[str, str]]] = {}  # run -> (workflow id, run) by prefix

        async def inspect(run_id: str) -> None:
            async with gate:
                handle = self.temporal.get_workflow_handle(run_id, result_type=RunResult)
                try:
                    desc = await self.retrying(f"describe {run_id}", handle.describe)
                except RPCError as err:
                    statuses[run_id] = f"not found ({err})"
                    return
                first_run[run_id] = desc.raw_description.workflow_execution_info.first_run_id
                if desc.status != WorkflowExecutionStatus.COMPLETED:
                    statuses[run_id] = desc.status.name if desc.status else "unknown"
                    with contextlib.suppress(*RPC_ERRORS):
                        snap = await RunHandle(self.temporal, run_id).snapshot()
                        statuses[run_id] += (
                            f" / {snap.status.value} blocked={snap.blocked_operations} "
                            f"pending={[i.id for i in snap.interactions]} "
                            f"attention={snap.attention} error={snap.error}"
                        )
                    return
                statuses[run_id] = "completed"
                result: RunResult = await self.retrying(f"result {run_id}", handle.result)
                results[run_id] = result
                if self.agent_of.get(run_id) in chaos_agents.TASKS:
                    task_outputs[run_id] = result.output or ""
                else:
                    outputs[run_id] = json.loads(result.output or "{}")

        async def list_children(run_id: str) -> None:
            """Every workflow in the namespace whose id starts with `{run_id}/`."""
            query = f'WorkflowId STARTS_WITH "{run_id}/"'

            async def listing() -> list[tuple[str, str]]:
                return [(w.id, w.run_id) async for w in self.temporal.list_workflows(query)]

            async with gate:
                listed[run_id] = await self.retrying(f"children of {run_id}", listing)

        await asyncio.gather(*(inspect(r) for r in self.run_ids))
        await asyncio.gather(*(list_children(r) for r in self.run_ids))
        # The child runs: the one each subagent or task call should have started (its id
        # is the call's operation id), and whatever else the namespace holds under a
        # run's id.
        children: dict[str, str] = {}  # child run id -> parent run id
        for run_id in self.run_ids:
            calls = subagent_calls(self.agent_of[run_id])
            if run_id in first_run:
                for key in calls:
                    children[f"{run_id}/{first_run[run_id]}/{key}"] = run_id
            for workflow_id, _ in listed.get(run_id, []):
                children.setdefault(workflow_id, run_id)
        for child_id, parent_id in children.items():
            key = child_id.rsplit("/", 1)[1]
            self.agent_of[child_id] = subagent_calls(self.agent_of[parent_id]).get(key, "?")
        await asyncio.gather(*(inspect(c) for c in children))
        parent_named: dict[str, str | None] = {}  # child -> its snapshot's parent_run_id
        snapshots: dict[str, RunSnapshot] = {}  # completed `metered` runs

        async def snapshot(run_id: str) -> None:
            async with gate:
                run = RunHandle(self.temporal, run_id)
                snapshots[run_id] = await self.retrying(f"snapshot {run_id}", run.snapshot)
                parent_named[run_id] = snapshots[run_id].parent_run_id

        metered = [r for r in self.run_ids if self.agent_of[r] == chaos_agents.METERED]
        await asyncio.gather(
            *(snapshot(r) for r in [*children, *metered] if statuses.get(r) == "completed")
        )
        delegation = Delegation(children, listed, results, first_run, parent_named)
        sessions = await self.session_states()
        t = self.tally
        known = {*self.run_ids, *children, *self.children, *t.child_parent, *self.sessions}
        known |= t.children_from_list
        executions = await self.executions(known)
        log(f"replaying {len(executions)} executions")
        check = await check_histories(executions, self.temporal.data_converter)
        # The operator's decisions, from every execution's history (a run that did not
        # complete, or was reset, holds decisions too); the sessions' submissions.
        decisions: dict[tuple[str, str], tuple[str, str]] = {}
        submissions: defaultdict[str, dict[str, tuple[str, bool | None]]] = defaultdict(dict)
        for workflow_id, _, history in executions:
            for update_id, decision in decisions_in(workflow_id, history.events).items():
                decisions[(workflow_id, update_id)] = decision
            if workflow_id in self.sessions:
                submissions[workflow_id].update(submissions_in(history.events))
        resolutions: defaultdict[str, list[str]] = defaultdict(list)  # op -> types
        for op, kind in decisions.values():
            resolutions[op].append(kind)
        timeouts = heartbeat_timeouts(history.events for _, _, history in executions)
        # Read last: a run that completed during the checks journaled its calls before.
        self.journal.refresh()
        self.mcp.refresh()
        found = Found(
            outputs, task_outputs, statuses, resolutions, delegation, snapshots, sessions,
            submissions, timeouts,
        )  # fmt: skip
        return self.report(soak_s, found, check)

    async def session_states(self) -> dict[str, tuple[str, SessionSnapshot | None]]:
        """Each session's workflow status and snapshot (None if it could not be read)."""
        gate = asyncio.Semaphore(16)
        states: dict[str, tuple[str, SessionSnapshot | None]] = {}

        async def state(session_id: str) -> None:
            handle = self.temporal.get_workflow_handle(session_id)
            async with gate:
                try:
                    desc = await self.retrying(f"describe {session_id}", handle.describe)
                except RPCError as err:
                    states[session_id] = (f"not found ({err})", None)
                    return
                status = desc.status.name if desc.status else "unknown"
                snap: SessionSnapshot | None = None
                with contextlib.suppress(*RPC_ERRORS):
                    assert self.client is not None
                    session = await self.client.get_session(session_id)
                    snap = await self.retrying(f"snapshot {session_id}", session.snapshot)
                states[session_id] = (status, snap)

        await asyncio.gather(*(state(s) for s in self.sessions))
        return states

    async def executions(self, known: Iterable[str]) -> list[tuple[str, str, WorkflowHistory]]:
        """Every execution the namespace holds, once each, by (workflow id, run id): what
        visibility lists, and, since visibility can lag or miss one, every run of the
        chain of each workflow id the soak started or found, walked from the chain's
        first run through the run each hands over to."""
        temporal = self.temporal
        gate = asyncio.Semaphore(16)
        histories: dict[tuple[str, str], WorkflowHistory] = {}

        async def history(workflow_id: str, run_id: str) -> WorkflowHistory:
            handle = temporal.get_workflow_handle(workflow_id, run_id=run_id)
            async with gate:
                fetched: WorkflowHistory = await self.retrying(
                    f"history of {workflow_id} {run_id}", handle.fetch_history
                )
            histories[(workflow_id, run_id)] = fetched
            return fetched

        async def chain(workflow_id: str) -> None:
            handle = temporal.get_workflow_handle(workflow_id)
            try:
                async with gate:
                    desc = await self.retrying(f"describe {workflow_id}", handle.describe)
            except RPCError:  # not found: its start never reached the server
                return
            run_id: str | None = desc.raw_description.workflow_execution_info.first_run_id
            while run_id and (workflow_id, run_id) not in histories:
                run_id = next_run(await history(workflow_id, run_id))

        async def listing() -> list[tuple[str, str]]:
            return [(w.id, w.run_id) async for w in temporal.list_workflows()]

        listed = await self.retrying("list the namespace", listing)
        await asyncio.gather(*(chain(w) for w in sorted({*known, *(w for w, _ in listed)})))
        await asyncio.gather(*(history(*e) for e in set(listed) - set(histories)))
        return [(w, r, h) for (w, r), h in sorted(histories.items())]

    def submission(self, run_id: str) -> int:
        """Which submission of its session a run is (1 for a run outside a session)."""
        return self.session_of.get(run_id, ("", 1))[1]

    def check_sessions(self, found: Found, problems: list[str]) -> list[tuple[str, Any]]:
        """Each session closed, its runs exactly its submissions in order (each accepted
        once, all completed), and each run having read every earlier message of the
        session; and how many second submissions the session queued behind the first run
        (it may have completed already: a count, not a check)."""
        wrong_runs = twice = unread = queued = 0
        closed = 0
        for session_id, made in self.sessions.items():
            status, snap = found.sessions.get(session_id, ("unknown", None))
            texts = [text for text, _ in made]
            if status == "COMPLETED" and session_id in self.sessions_closed:
                closed += 1
            else:
                problems.append(f"session {session_id} not closed: {status}")
            if len(made) != chaos_agents.SESSION_SUBMISSIONS:
                problems.append(f"session {session_id}: {len(made)} submissions made")
            shown = [(r.input, r.run_id, r.status) for r in snap.runs] if snap else None
            if shown != [(text, run_id, "completed") for text, run_id in made]:
                wrong_runs += 1
                problems.append(f"session {session_id}: its runs are {shown}, made {made}")
            accepted = list(found.submissions.get(session_id, {}).values())
            inputs = Counter(text for text, _ in accepted)
            if sorted(inputs) != sorted(texts) or any(n > 1 for n in inputs.values()):
                twice += 1
                problems.append(f"session {session_id}: submissions accepted {dict(inputs)}")
            queued += any(q for text, q in accepted if len(texts) > 1 and text == texts[1])
            for n, (_, run_id) in enumerate(made, start=1):
                answer = found.outputs.get(run_id)
                if answer is None:
                    continue  # not completed: counted as lost
                read = (answer.get("earlier"), answer.get("earlier_answers"))
                if read != (texts[: n - 1], n - 1):
                    unread += 1
                    problems.append(
                        f"{run_id}: read {read} of its session, not {(texts[: n - 1], n - 1)}"
                    )
        return [
            ("sessions", len(self.sessions)),
            ("sessions closed", closed),
            ("session runs", sum(len(made) for made in self.sessions.values())),
            ("sessions whose runs are not their submissions, in order, completed", wrong_runs),
            ("sessions with a submission accepted twice or not at all", twice),
            ("submissions queued behind an open run (if_busy=enqueue)", queued),
            ("session runs that did not read every earlier message", unread),
            ("  submissions asked again after an answer was lost", self.tally.submit_retries),
            ("  of which found accepted already", self.tally.submit_found_applied),
            ("  submissions refused as busy, waited out", self.tally.submit_busy_waits),
        ]

    def check_metered(
        self, found: Found, ops: dict[str, list[dict[str, Any]]], problems: list[str]
    ) -> list[tuple[str, Any]]:
        """Each completed `metered` run parked on its limit and was raised before each
        call after its first, and no such call started before the raise it needed (its
        first journaled start after the run's `limits_raised` event)."""
        early = parked = 0
        raises = 0
        metered = [r for r in self.run_ids if self.agent_of[r] == chaos_agents.METERED]
        for run_id in metered:
            snap = found.snapshots.get(run_id)
            if snap is None:
                continue  # not completed: counted as lost
            raised = sorted(e.at.timestamp() for e in snap.events if e.type == "limits_raised")
            raises += len(raised)
            needed = len(chaos_agents.SCRIPTS[chaos_agents.METERED]) - 1
            parked += len(raised) >= needed
            if len(raised) < needed:
                problems.append(f"{run_id}: {len(raised)} limit raises, its calls need {needed}")
            for turn, key in enumerate(expected_keys(chaos_agents.METERED), start=1):
                starts = [e["t"] for e in ops.get(f"{run_id}/{key}", []) if e["ev"] == "start"]
                if (
                    turn > 1
                    and starts
                    and (len(raised) < turn - 1 or min(starts) < raised[turn - 2])
                ):
                    early += 1
                    problems.append(f"{run_id}/{key}: started before the raise it needed")
        t = self.tally
        return [
            ("metered runs", len(metered)),
            ("metered runs parked on their limit and raised before each later call", parked),
            ("limit raises (limits_raised events)", raises),
            ("  runs the operator saw parked budget_exceeded", len(t.parked_on_limit)),
            ("  raise_limits refused (the run had moved on), looked again", t.raise_refused),
            ("  raise_limits unconfirmed (may still be applied)", t.raise_unconfirmed),
            ("tool calls started before the raise they needed", early),
        ]

    def check_tasks(
        self,
        found: Found,
        ops: dict[str, list[dict[str, Any]]],
        ticket_of: dict[str, str],
        denied: set[str],
        problems: list[str],
    ) -> tuple[list[tuple[str, Any]], int]:
        """Each completed task run's output is the journaled result of its one call (a
        denied call's: the denial); returns the lines and how many outputs disagreed."""
        checked = disagree = 0
        for run_id, output in found.task_outputs.items():
            op = f"{run_id}/{chaos_agents.TASK_KEY}"
            effects = [e for e in ops.get(op, []) if e["ev"] == "effect"]
            checked += 1
            if op in denied:
                ok = output.startswith("error: ")
            else:
                try:
                    value = json.loads(output)
                except ValueError:
                    value = None
                if self.agent_of[run_id] in chaos_agents.TICKET_TOOLS:
                    ok = op in ticket_of and value == {"ticket_id": ticket_of[op]}
                else:
                    ok = bool(effects) and value == effects[-1]["result"]
            if not ok:
                disagree += 1
                problems.append(f"{run_id}: task output {output!r} disagrees with the journal")
        standalone = [r for r in self.run_ids if self.agent_of[r] in chaos_agents.TASKS]
        owned = [r for r in found.delegation.children if self.agent_of[r] in chaos_agents.TASKS]
        return [
            ("task runs started with start_task", len(standalone)),
            ("task runs owned by an agent (child runs)", len(owned)),
            ("task outputs checked against the journal", checked),
        ], disagree

    def check_mcp(self, found: Found, problems: list[str]) -> tuple[list[tuple[str, Any]], int]:
        """The MCP server's log is the journal of its tools: each completed `archivist`
        run's write applied exactly once, under its call's operation id, and never under
        another (its read-back is checked with the other results). Returns the lines and
        how many writes were applied under several operation ids (duplicate effects)."""
        applied: defaultdict[str, set[str]] = defaultdict(set)  # key -> ops applied
        sent: Counter[str] = Counter()  # op -> record calls that reached the server
        for line in self.mcp.lines:
            if line.get("tool") != "record" or not line.get("operation_id"):
                continue
            op = _run_op(line["operation_id"])
            sent[op] += 1
            if line.get("applied"):
                applied[line["key"]].add(op)
        twice = [key for key, found_ops in applied.items() if len(found_ops) > 1]
        for key in twice:
            problems.append(f"MCP write {key!r} applied under {sorted(applied[key])}")
        lost = 0
        archivists = [r for r in self.run_ids if self.agent_of[r] == "archivist"]
        record_key = expected_keys("archivist")[0]
        for run_id in archivists:
            if run_id not in found.outputs:
                continue  # not completed: counted as lost
            key = chaos_agents.run_key(run_id)
            if applied.get(key) != {f"{run_id}/{record_key}"}:
                lost += 1
                problems.append(f"{run_id}: MCP write applied under {applied.get(key)}")
        return [
            ("MCP writes applied", sum(len(ops) for ops in applied.values())),
            ("MCP writes applied twice (several operation ids for one call)", len(twice)),
            ("MCP writes of completed runs not applied once under their call", lost),
            (
                "MCP writes sent again (same operation_id, applied once)",
                sum(1 for n in sent.values() if n > 1),
            ),
        ], len(twice)

    def report(self, soak_s: float, found: Found, check: HistoryCheck) -> int:
        t = self.tally
        outputs, statuses, resolutions = found.outputs, found.statuses, found.resolutions
        delegation = found.delegation
        problems: list[str] = []
        manual = chaos_agents.MANUAL_TOOLS
        ops: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
        for entry in self.journal.entries:
            ops[entry["op"]].append(entry)
        tool_of = {op: entries[0]["tool"] for op, entries in ops.items()}
        ticket_of = {_run_op(key): ticket for key, ticket in self.tickets.tickets.items()}

        # Runs.
        lost = [r for r in self.run_ids if statuses.get(r) != "completed"]
        for r in lost:
            problems.append(f"run {r} did not complete: {statuses.get(r)}")
        child_runs = sorted(delegation.children)
        lost_children = [c for c in child_runs if statuses.get(c) != "completed"]
        for c in lost_children:
            problems.append(f"child run {c} did not complete: {statuses.get(c)}")
        delegated = self.check_delegation(delegation, outputs, problems)
        ds = self.delegation_stats

        # Idempotent tool: one ticket per operation_id and per logical call.
        dup_idempotent = 0
        for op, entries in ops.items():
            if tool_of[op] != "create_ticket":
                continue
            tickets = {json.dumps(e["result"]) for e in entries if e["ev"] == "effect"}
            if len(tickets) > 1:
                dup_idempotent += 1
                problems.append(f"{op}: several tickets {sorted(tickets)}")
        for natural, keys in self.tickets.natural.items():
            if len(keys) > 1:
                dup_idempotent += 1
                problems.append(f"ticket {natural!r} opened under {sorted(keys)}")
        idem_reexecuted = sum(1 for n in self.tickets.requests.values() if n > 1)

        # Manual tools: executions, effects, reruns, interruptions.
        manual_twice = 0
        manual_dup_effects = 0
        reruns_total = 0
        interrupted = 0
        interrupted_not_attention = 0
        manual_ops = [op for op in ops if tool_of[op] in manual]
        for op in manual_ops:
            entries = ops[op]
            starts = [e for e in entries if e["ev"] == "start"]
            effects = [e for e in entries if e["ev"] == "effect"]
            done = [e for e in entries if e["ev"] == "done"]
            # The decisions the runs' histories accepted, or, if more, those the operator
            # asked for (confirmed, or unconfirmed: "it may still be applied"): a rerun
            # that was asked for is never a manual call executed twice.
            asked = t.decided.get(op, []) + t.unconfirmed.get(op, [])
            kinds = max(resolutions.get(op, []), asked, key=len)
            reruns = max(resolutions.get(op, []).count("rerun"), asked.count("rerun"))
            reruns_total += reruns
            if len(starts) > 1 + reruns:
                manual_twice += 1
                problems.append(f"{op}: {len(starts)} executions, {reruns} rerun(s) requested")
            if len(effects) > 1:
                manual_dup_effects += 1
                problems.append(f"{op}: {len(effects)} effects")
            broken = len(starts) - len(done)  # started and never returned its result
            interrupted += broken
            if broken > len(kinds):
                interrupted_not_attention += broken - len(kinds)
                problems.append(
                    f"{op}: {broken} interrupted execution(s), but only {len(kinds)} "
                    "resolve_tool while needs_attention"
                )
        attention_manual = len(t.attention)
        several_blocked = [r for r, n in t.most_blocked.items() if n > 1]
        overlapped, multi_turns = overlapping_turns(self.agent_of, self.submission, outputs, ops)
        # How long after killing the worker that ran a manual call the operator saw the
        # run needs_attention (heartbeat timeout + workflow task + the operator's polling).
        noticed: list[float] = []
        for (run_id, key), seen in t.attention.items():
            starts = [e for e in ops.get(f"{run_id}/{key}", []) if e["ev"] == "start"]
            killed = [t.killed_at[e["pid"]] for e in starts if e["pid"] in t.killed_at]
            earlier = [k for k in killed if k <= seen]
            if earlier:
                noticed.append(seen - max(earlier))
        noticed.sort()
        detection = (
            f"median {noticed[len(noticed) // 2]:.1f} s, max {noticed[-1]:.1f} s "
            f"over {len(noticed)} (tools' heartbeat timeout "
            f"{chaos_agents.TOOL_HEARTBEAT.total_seconds():g} s)"
            if noticed
            else "-"
        )

        # Denied approvals never ran; outputs agree with the journal and the service.
        denied = [op for op, ok in t.approved.items() if not ok]
        denied_ran = [op for op in denied if any(e["ev"] == "start" for e in ops.get(op, []))]
        for op in denied_ran:
            problems.append(f"{op}: denied, yet it ran")
        disagree = checked = 0
        lost_results = order_problems = 0
        for run_id, answer in outputs.items():
            results: dict[str, dict[str, Any]] = answer.get("results", {})
            calls = script_calls(self.agent_of.get(run_id, ""), self.submission(run_id))
            # Every call of the script has its result: none lost between the turns.
            missing = sorted(set(calls) - set(results))
            lost_results += len(missing)
            for key in missing:
                problems.append(f"{run_id}/{key}: no result in the run's output")
            for problem in answer.get("problems", []):
                order_problems += 1
                problems.append(f"{run_id}: the model's last transcript: {problem}")
            for key, result in results.items():
                op = f"{run_id}/{key}"
                if op in delegated:  # a subagent call: checked against its child's output
                    continue
                checked += 1
                effects = [e for e in ops.get(op, []) if e["ev"] == "effect"]
                tool = tool_of.get(op) or calls.get(key)
                if result["error"]:
                    ok = op in denied and result["content"].startswith("denied:")
                elif tool in chaos_agents.TICKET_TOOLS:
                    ok = json.loads(result["content"]) == {"ticket_id": ticket_of.get(op)}
                elif tool == chaos_agents.MCP_RECORD:  # checked against the server's log too
                    ok = mcp_content(result["content"]) == f"recorded {run_id}"
                elif tool == chaos_agents.MCP_LOOKUP:
                    ok = mcp_content(result["content"]) == f"v-{run_id}"
                elif tool in manual:
                    ok = bool(effects) and json.loads(result["content"]) == effects[-1]["result"]
                else:
                    ok = tool in chaos_agents.SAFE_TOOLS
                if not ok:
                    disagree += 1
                    problems.append(f"{op}: output {result} disagrees with the journal")

        session_lines = self.check_sessions(found, problems)
        metered_lines = self.check_metered(found, ops, problems)
        task_lines, task_disagree = self.check_tasks(found, ops, ticket_of, set(denied), problems)
        disagree += task_disagree
        mcp_lines, mcp_twice = self.check_mcp(found, problems)
        dup_idempotent += mcp_twice
        unstarted = self.size.runs - len(self.run_ids)
        if unstarted:
            problems.append(f"{unstarted} runs never started: the soak ended first")
        for error in self.driver_errors:
            problems.append(f"the soak's driver crashed: {error}")
        for failed in check.replay_failures:
            problems.append(f"does not replay: {failed}")
        if check.task_failures:
            problems.append(f"workflow tasks failed: {dict(check.task_failures)}")
        # Crashes must never need an operator beyond reconciling manual calls.
        for run_id, times in t.failed_retried.items():
            problems.append(f"run {run_id} failed {times} time(s) and needed retry()")
        completed = len(self.run_ids) - len(lost)
        kills_ok = t.kills >= 2
        lines = [
            ("runs started", len(self.run_ids)),
            ("runs completed", completed),
            ("runs lost", len(lost)),
            ("runs never started", unstarted),
            ("duplicate idempotent effects", dup_idempotent),
            ("idempotent calls executed again (same operation_id, one ticket)", idem_reexecuted),
            ("manual calls executed twice", manual_twice),
            ("manual duplicate effects", manual_dup_effects),
            ("manual reruns after proving no effect", reruns_total),
            ("manual calls interrupted", interrupted),
            ("interrupted manual calls not needs_attention", interrupted_not_attention),
            ("manual operations seen needs_attention (tool_interrupted)", attention_manual),
            ("resolved with the journaled result", t.resolved_json),
            ("resolved rerun", t.resolved_rerun),
            (
                "resolve_tool unconfirmed (may still be applied)",
                sum(len(kinds) for kinds in t.unconfirmed.values()),
            ),
            ("other needs_attention", len(t.other_attention)),
            ("approvals answered by signal", len(t.approved)),
            ("approvals denied", len(denied)),
            ("denied calls executed", len(denied_ran)),
            ("tool results in outputs checked against the journal", checked),
            ("outputs disagreeing with the journal", disagree),
            ("tool results lost (a call of the script without a result)", lost_results),
            ("transcripts with a result missing, repeated or out of call order", order_problems),
            (
                "multi-call runs completed",
                sum(
                    1
                    for r in outputs
                    if any(len(turn) > 1 for turn in chaos_agents.SCRIPTS.get(self.agent_of[r], []))
                ),
            ),
            ("  turns of several calls whose calls overlapped in time", overlapped),
            ("  turns of several calls that ran", multi_turns),
            ("runs seen with several manual calls blocked at once", len(several_blocked)),
            ("  most blocked at once in one run", max(t.most_blocked.values(), default=0)),
            (
                "runs seen with several approvals pending at once",
                sum(1 for n in t.most_pending.values() if n > 1),
            ),
            ("approval signals answering several at once", t.batch_signals),
            ("subagent calls", ds["subagent calls"]),
            ("child runs completed", len(child_runs) - len(lost_children)),
            ("child runs lost", len(lost_children)),
            (
                "subagent calls without exactly one child workflow",
                ds["subagent calls without exactly one child workflow"],
            ),
            (
                "workflows under a run's id that no call started",
                ds["workflows under a run's id that no call started"],
            ),
            ("children naming another parent", ds["children naming another parent"]),
            ("parents without their child's output", ds["parents without their child's output"]),
            (
                "parents whose usage lacks their child's",
                ds["parents whose usage lacks their child's"],
            ),
            (
                "children failed on purpose (register down), fixed, retried",
                ds["children failed on purpose (register down), fixed, retried"],
            ),
            ("  child retries", sum(t.children_fixed.values())),
            (
                "  child retries unconfirmed (may still be applied)",
                sum(t.children_retry_unconfirmed.values()),
            ),
            ("  parents seen parked (subagent_failed)", len(t.parents_parked)),
            (
                "  child runs' manual calls seen needs_attention (tool_interrupted)",
                sum(1 for run_id, _ in t.attention if run_id in delegation.children),
            ),
            (
                "  child runs' approvals answered",
                sum(1 for op in t.approved if _op_run(op) in delegation.children),
            ),
            ("child runs the operator found in the run list", len(t.children_from_list)),
            ("child runs the operator found from the parent", len(t.children_from_parent)),
            (
                "  listed child runs whose RunSummary had no parent_run_id",
                len(t.listed_without_parent),
            ),
            ("resolve_tool refused, the operator looked again", t.resolve_conflicts),
            ("failed runs retried", sum(t.failed_retried.values())),
            ("kills", t.kills),
            ("  of which inside a manual call", t.kills_mid_manual),
            ("  of which inside several manual calls of one run", t.kills_mid_several),
            ("  put off: fewer than two workers connected", t.kills_put_off),
            ("  sparing a model request's last attempt (or put off for one)", t.kills_spared),
            ("worker exits not caused by a kill", len(self.workers.exits)),
            (
                "  of which before connecting",
                sum(1 for _, _, connected in self.workers.exits if not connected),
            ),
            ("server restarts", t.server_restarts),
            ("hostile inputs sent (forged, padded, mistyped)", _by_kind(t.hostile)),
            ("  of which accepted", sum(t.hostile_accepted.values())),
        ]
        lines += [*session_lines, *metered_lines, *task_lines, *mcp_lines]
        for kind, n in t.hostile_accepted.items():
            problems.append(f"{n} hostile {kind} update(s) accepted")
        violations = len(problems)
        of_kind = Counter(self.kind_of.get(r, "?") for r in self.run_ids)
        by_kind = ", ".join(f"{k} {of_kind[k]}" for k in chaos_agents.KINDS if of_kind[k])
        print(
            f"chaos soak: {self.size.runs} runs, {self.size.workers} workers, "
            f"in flight <= {self.size.in_flight}"
        )
        print(f"runs by kind: {by_kind} (children: {len(delegation.children)})")
        for name, value in lines:
            print(f"{name}: {value}")
        print(
            f"server restart: at {t.server_restart_at or 0:.1f} s ({t.restart_phase}), down "
            f"{t.server_downtime_s:.1f} s; workers: {t.workers_alive_after_restart}"
        )
        print(f"needs_attention noticed after the kill: {detection}")
        # A worker killed after its attempt timed out was alive when it did.
        live = [p for p, when in found.heartbeat_timeouts if t.killed_wall.get(p, math.inf) > when]
        print(
            f"heartbeat timeouts in history (an activity's last attempt): "
            f"{len(found.heartbeat_timeouts)}, of a live worker: {len(live)}"
        )
        print(f"operator looks that could not prove an outcome yet: {t.unresolved_waits}")
        print(f"soak time: {soak_s:.1f} s ({self.ended})")
        for line in check.lines():
            print(line)
        print(f"violations: {violations}")
        if violations:
            if check.first_nondeterminism() is None:
                print("first nondeterminism error: none")
            print(f"kept: {self.tmp} (journal/, workers/*.log, server.log, temporal.db)")
        for problem in problems[:50]:
            print(f"  VIOLATION {problem}")
        for error in t.failed_errors[:10]:
            print(f"  failed (retried): {error}")
        for run_id, reason in list(t.other_attention.items())[:10]:
            print(f"  needs_attention {reason}: {run_id}")
        if not kills_ok or t.server_restarts != 1:
            print("  note: fewer than 2 kills or no server restart; the soak was too short")
        return 1 if violations else 0


@dataclass
class Delegation:
    """What the checks found of the subagents' runs."""

    children: dict[str, str]  # child run id -> parent run id
    listed: dict[str, list[tuple[str, str]]]  # run -> (workflow id, execution) by id prefix
    results: dict[str, RunResult]  # completed runs, children too
    first_run: dict[str, str]  # run id -> its chain's first Temporal run id
    parent_named: dict[str, str | None]  # child -> its snapshot's parent_run_id


def plan(runs: int) -> list[str]:
    """The kinds of work a soak of `runs` runs starts, in order: `chaos_agents.KINDS` in
    rotation until `runs` runs are promised (a session promises its submissions), then the
    sessions spread over the first half. A session's runs go one after another, so the
    last session started sets the soak's tail: started late (as the rotation alone
    would), it kept a small soak beside a CPU hog going for minutes after the rest."""
    kinds: list[str] = []
    promised = 0
    for i in itertools.count():
        if promised >= runs:
            break
        kind = chaos_agents.KINDS[i % len(chaos_agents.KINDS)]
        size = chaos_agents.SESSION_SUBMISSIONS if kind == "session" else 1
        if promised + size <= runs:
            kinds.append(kind)
            promised += size
    sessions = kinds.count("session")
    others = [k for k in kinds if k != "session"]
    gap = len(others) // (2 * sessions) if sessions else 0
    ordered: list[str] = []
    for n in range(sessions):
        ordered += ["session", *others[n * gap : (n + 1) * gap]]
    return ordered + others[sessions * gap :]


@dataclass
class Found:
    """What the checks read after the soak, besides the journals and histories."""

    outputs: dict[str, dict[str, Any]]  # completed scripted runs' outputs, parsed
    task_outputs: dict[str, str]  # completed task runs' outputs (the task's result)
    statuses: dict[str, str]  # run id -> "completed", or what it is instead
    resolutions: dict[str, list[str]]  # op -> resolve_tool types the histories accepted
    delegation: Delegation
    snapshots: dict[str, RunSnapshot]  # completed child and `metered` runs
    sessions: dict[str, tuple[str, SessionSnapshot | None]]  # -> workflow status, snapshot
    submissions: dict[str, dict[str, tuple[str, bool | None]]]  # session -> accepted submits
    heartbeat_timeouts: list[tuple[int, float]]  # (worker pid, when) of each, in history


def heartbeat_timeouts(histories: Iterable[Iterable[HistoryEvent]]) -> list[tuple[int, float]]:
    """The worker pid and time of each activity attempt the histories show timed out for
    want of a heartbeat (only an activity's last attempt reaches history). Set beside the
    kills, it tells timeouts of dead workers from those of live ones, which a loaded
    machine causes (see `chaos_agents.HEARTBEAT`)."""
    pids: list[tuple[int, float]] = []
    for events in histories:
        started: dict[int, str] = {}
        for event in events:
            if event.HasField("activity_task_started_event_attributes"):
                started[event.event_id] = event.activity_task_started_event_attributes.identity
            elif event.HasField("activity_task_timed_out_event_attributes"):
                timed_out = event.activity_task_timed_out_event_attributes
                if "heartbeat" not in timed_out.failure.message.lower():
                    continue
                identity = started.get(timed_out.started_event_id, "")
                with contextlib.suppress(ValueError):
                    when = event.event_time.ToNanoseconds() / 1e9
                    pids.append((int(identity.split("@", 1)[0]), when))
    return pids


def script_calls(agent_id: str, submission: int = 1) -> dict[str, str]:
    """The checkpoint key of every call in the agent's script -> its tool's name (in a
    session's `submission`-th run, whose call ids say which submission they belong to)."""
    return {
        f"tool:{turn}:{chaos_agents.call_id(submission, turn, n)}": name
        for turn, calls in enumerate(chaos_agents.SCRIPTS.get(agent_id, []), start=1)
        for n, (name, _) in enumerate(calls, start=1)
    }


def subagent_calls(agent_id: str) -> dict[str, str]:
    """The checkpoint keys of the agent's calls that start a child run (a subagent or a
    task it owns) -> the child's agent id."""
    children = chaos_agents.CHILDREN.get(agent_id, ())
    return {key: name for key, name in script_calls(agent_id).items() if name in children}


def expected_keys(agent_id: str, submission: int = 1) -> list[str]:
    """The checkpoint keys of every call in the agent's script."""
    return list(script_calls(agent_id, submission))


def mcp_content(content: str) -> Any:
    """An MCP tool's result as the model read it: a structured result's `result` field
    (the server's own `-> str` tools answer `{"result": ...}`), else the text."""
    with contextlib.suppress(ValueError):
        value = json.loads(content)
        if isinstance(value, dict) and set(value) == {"result"}:
            return value["result"]
        return value
    return content


def overlapping_turns(
    agent_of: dict[str, str],
    submission_of: Callable[[str], int],
    outputs: dict[str, dict[str, Any]],
    ops: dict[str, list[dict[str, Any]]],
) -> tuple[int, int]:
    """Of the completed runs' turns of several calls, in how many did two calls run at
    the same time (per the journal: a call's first attempt, first to last line), and how
    many had two calls that ran at all (a denied call never starts, an MCP call or a
    child run journals nothing of its own)."""

    def by_time(entry: dict[str, Any]) -> float:
        return float(entry["t"])

    overlapped = examined = 0
    for run_id in outputs:
        script = chaos_agents.SCRIPTS.get(agent_of.get(run_id, ""), [])
        submission = submission_of(run_id)
        for turn, calls in enumerate(script, start=1):
            if len(calls) < 2:
                continue
            spans = []
            for n in range(1, len(calls) + 1):
                key = f"tool:{turn}:{chaos_agents.call_id(submission, turn, n)}"
                entries = sorted(ops.get(f"{run_id}/{key}", []), key=by_time)
                first = [e for e in entries if e["pid"] == entries[0]["pid"]] if entries else []
                if first:  # its first attempt, not stretched by a rerun after a kill
                    spans.append((first[0]["t"], first[-1]["t"]))
            if len(spans) < 2:
                continue
            examined += 1
            spans.sort()
            ends = [end for _, end in spans]
            if any(start < max(ends[:i]) for i, (start, _) in enumerate(spans) if i):
                overlapped += 1
    return overlapped, examined


def _by_kind(counts: Counter[str]) -> str:
    return f"{sum(counts.values())} ({', '.join(f'{k} {n}' for k, n in sorted(counts.items()))})"


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=None, help="runs to start (300; --small 50)")
    parser.add_argument("--workers", type=int, default=3, help="worker processes (3)")
    parser.add_argument("--in-flight", type=int, default=None, help="unfinished runs at once")
    parser.add_argument("--small", action="store_true", help="the CI size (under 3 minutes)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, journal)")
    parser.add_argument("--seed", type=int, default=None, help="seed the killer's choices")
    parser.add_argument(
        "--no-model-retry",
        action="store_true",
        help="register the agents without model_retry (durably's default: 3 attempts)",
    )
    args = parser.parse_args(list(argv) if argv is not None else None)
    size = size_from(args)
    if args.no_model_retry:
        os.environ["CHAOS_NO_MODEL_RETRY"] = "1"  # read by the workers' chaos_agents
    # The driver's client retries through the server restart; keep its warnings off stdout.
    quiet = TelemetryFilter(core_level="ERROR", other_level="ERROR")
    Runtime.set_default(Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(filter=quiet))))
    tmp = Path(tempfile.mkdtemp(prefix="durably-chaos-"))
    soak = Soak(size, tmp)
    if args.seed is not None:
        soak.rng.seed(args.seed)
    code = 2
    try:
        code = asyncio.run(soak.run())
    finally:
        if args.keep or code != 0:
            log(f"kept {tmp} (journal/, workers/*.log, server.log, temporal.db)")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return code


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The Temporal client's native threads can crash interpreter teardown
    # (temporalio/sdk-python#300); the verdict is already printed.
    os._exit(code)
