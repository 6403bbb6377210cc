"""Fuzzing a session's doors (SPEC section 20): `submit` and `close` updates and the
`run_status` signal take anyone's input. Whatever arrives is refused with a message
or ignored, never fails a workflow task, and leaves the session taking submissions."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from durably import DurableClient
from durably.contract import ErrorType, SessionHandler

from .conftest import Runtimes
from .test_sessions import clerk

_REFUSED = {ErrorType.INVALID_RESPONSE.value, ErrorType.INVALID_RUN_INPUT.value}


def nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = {"input": value}
    return value


junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=50),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=12,
)
small_submit = st.one_of(
    junk,
    st.fixed_dictionaries({"input": junk}),
    st.fixed_dictionaries({"input": st.text(max_size=20), "if_busy": st.text(max_size=12) | junk}),
    st.sampled_from([{"input": ""}, {"input": " \n\t"}, nested(150)]),
)
# Near the limits, one argument at a time: Temporal echoes a rejected update's request
# in the rejection, so a request near 2 MB fails the task whatever the handler does
# (the same limit as `tests/test_fuzz.py`'s, Temporal's own).
large_submit = st.sampled_from(
    [
        [{"input": "x" * (2**20 + 1)}],  # one byte past a run's input limit
        [{"input": "x" * 2**19, "if_busy": "sometimes"}],
    ]
)
submit_args = st.lists(small_submit, max_size=2) | large_submit


async def test_no_input_fails_a_session_task_or_stops_it_taking_submissions(
    client: DurableClient, runtimes: Runtimes
) -> None:
    seen: list[list[str]] = []
    await runtimes.start([clerk(seen)])
    session = await client.start_session("clerk")
    handle = client.temporal.get_workflow_handle(session.session_id)
    loop = asyncio.get_running_loop()
    outcomes: list[str] = []

    async def submit(args: list[Any]) -> None:
        try:
            await handle.execute_update(SessionHandler.SUBMIT, args=args)
            outcomes.append("accepted")
        except WorkflowUpdateFailedError as err:
            cause = err.cause
            assert isinstance(cause, ApplicationError), cause
            assert cause.type in _REFUSED, (cause.type, cause.message)
            assert cause.message, "a refusal says why"
            outcomes.append("refused")

    @settings(
        max_examples=40,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],  # shared session: no shrinking
        suppress_health_check=list(HealthCheck),
    )
    @given(args=submit_args)
    def property(args: list[Any]) -> None:
        if len(args) == 1 and isinstance(args[0], dict) and _valid(args[0]):
            return  # a valid submission would start a run: not this property's business
        asyncio.run_coroutine_threadsafe(submit(args), loop).result(timeout=60)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        await loop.run_in_executor(pool, property)
    for note in (None, "x" * 100_000, {"run_id": "nobody", "status": "failed"}, [1, 2]):
        await handle.signal(SessionHandler.RUN_STATUS, note)
    for args in ([], [1], ["close"], [{}, {}]):
        try:
            await handle.execute_update(SessionHandler.CLOSE, args=args)
        except WorkflowUpdateFailedError:
            pass
        else:
            raise AssertionError(f"close({args!r}) was accepted")

    assert "refused" in outcomes
    run = await session.submit("still here?")
    assert (await run.result()).output == "noted: still here?"
    history = await handle.fetch_history()
    failed = [
        e for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
    ]
    assert failed == []


def _valid(value: dict[str, Any]) -> bool:
    text = value.get("input")
    return (
        isinstance(text, str)
        and bool(text.strip())
        and len(text.encode("utf-8", "surrogatepass")) <= 2**20
        and value.get("if_busy", "reject") in ("reject", "enqueue", "interrupt")
        and set(value) <= {"input", "if_busy"}
    )
