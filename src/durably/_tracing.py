"""durably's tracing interceptor: Temporal's `TracingInterceptor`, one trace per run.

The failure it prevents: Temporal's interceptor traces a workflow in the
context its start header carries. A run started without one (the Temporal
CLI, an untraced client) has no context, so with
``always_create_workflow_spans`` every workflow-side span (`RunWorkflow`, each
`StartActivity`, each signal) starts a trace of its own, and a worker that
restarts and replays cannot even find the first one again. Here such a run's
context is derived from what every worker reads alike, the run's workflow id
and first execution run id: a trace id and the span id of its root span
(`RunWorkflow`, emitted once, by the worker that runs the chain's first
workflow task). Continue-as-new and child workflows carry the context in
their headers (Temporal's interceptor puts it there), so a run's chain and its
subagents stay in its trace.

Also: queries without a trace header make no span (Temporal's interceptor
would make a root span per `snapshot` query, and durably's clients poll);
activities get the interceptor's tracer in `durably.telemetry.ACTIVITY_TRACER`
for their `chat`/`execute_tool` spans; workflows get the extern function
`TRACE_ID_EXTERN` for `RunSnapshot.trace_id`.

Needs the `otel` extra; imported only when tracing is on.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, cast

import opentelemetry.context
import opentelemetry.trace
import temporalio.workflow
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer, TracerProvider
from opentelemetry.util.types import AttributeValue
from temporalio.contrib.opentelemetry import TracingInterceptor, TracingWorkflowInboundInterceptor
from temporalio.exceptions import ApplicationError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    ExecuteWorkflowInput,
    HandleQueryInput,
    WorkflowInterceptorClassInput,
)

from durably.telemetry import ACTIVITY_TRACER, TRACE_ID_EXTERN

__all__ = [
    "DurablyTracingInterceptor",
    "end_operation_span",
    "run_root_ids",
    "start_operation_span",
]

SCOPE = "durably"
_ROOT_SCOPE = "durably.run-root"  # only the root spans use it (its tracer's ids are forced)
_ROOT_EXTERN = "__durably_root_span"


def run_root_ids(workflow_id: str, first_execution_run_id: str) -> tuple[int, int]:
    """The trace id and root span id of a run started without a trace context."""
    digest = hashlib.sha256(f"durably-trace\0{workflow_id}\0{first_execution_run_id}".encode())
    raw = digest.digest()
    trace_id = int.from_bytes(raw[:16], "big") or 1
    span_id = int.from_bytes(raw[16:24], "big") or 1
    return trace_id, span_id


class DurablyTracingInterceptor(TracingInterceptor):
    """Temporal's `TracingInterceptor` (with workflow spans always created), one trace
    per run. `tracer_provider` defaults to OpenTelemetry's global provider."""

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        self.tracer_provider = tracer_provider
        tracer = (
            tracer_provider.get_tracer(SCOPE)
            if tracer_provider is not None
            else opentelemetry.trace.get_tracer(SCOPE)
        )
        super().__init__(tracer, always_create_workflow_spans=True)

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _ActivityTracer(super().intercept_activity(next), self.tracer)

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[TracingWorkflowInboundInterceptor]:
        super().workflow_interceptor_class(input)
        input.unsafe_extern_functions.update(
            {_ROOT_EXTERN: self._root_span, TRACE_ID_EXTERN: self._run_trace_id}
        )
        return _WorkflowInbound

    def _run_trace_id(self) -> str | None:
        """The current workflow's trace id: from its start header, else derived."""
        info = temporalio.workflow.info()
        header = info.headers.get(self.header_key)
        if not header:
            return f"{run_root_ids(info.workflow_id, info.first_execution_run_id)[0]:032x}"
        carrier = self.payload_converter.from_payloads([header])[0]
        context = self.text_map_propagator.extract(carrier)
        span = opentelemetry.trace.get_current_span(context).get_span_context()
        return f"{span.trace_id:032x}" if span.is_valid else None

    def _root_span(self, params: _RootSpan) -> None:
        """Emit a run's root span with the ids its workflow derived (outside the sandbox).

        Only an OpenTelemetry SDK tracer can be told its ids; with another (or
        with no provider set yet) the root is left out, and the run's spans
        still share its trace id.
        """
        provider = self.tracer_provider or opentelemetry.trace.get_tracer_provider()
        tracer = provider.get_tracer(_ROOT_SCOPE)
        generator = getattr(tracer, "id_generator", None)
        if generator is None:
            return
        if not isinstance(generator, _ForcedIds):
            generator = _ForcedIds(generator)
            tracer.id_generator = generator  # type: ignore[attr-defined]
        with generator.forced(params.trace_id, params.span_id):
            span = tracer.start_span(
                params.name,
                Context(),
                kind=SpanKind.SERVER,
                attributes=params.attributes,
                start_time=params.time_ns,
            )
        span.end(end_time=params.time_ns)


@dataclass(frozen=True)
class _RootSpan:
    name: str
    trace_id: int
    span_id: int
    attributes: Mapping[str, AttributeValue]
    time_ns: int


class _ForcedIds:
    """An id generator that hands out the ids it is told to, else its inner one's."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._next: ContextVar[tuple[int, int] | None] = ContextVar("durably_ids", default=None)

    @contextlib.contextmanager
    def forced(self, trace_id: int, span_id: int) -> Iterator[None]:
        token = self._next.set((trace_id, span_id))
        try:
            yield
        finally:
            self._next.reset(token)

    def generate_trace_id(self) -> int:
        forced = self._next.get()
        return forced[0] if forced else int(self._inner.generate_trace_id())

    def generate_span_id(self) -> int:
        forced = self._next.get()
        return forced[1] if forced else int(self._inner.generate_span_id())

    def is_trace_id_random(self) -> bool:
        check = getattr(self._inner, "is_trace_id_random", None)
        return bool(check()) if check is not None else False


class _WorkflowInbound(TracingWorkflowInboundInterceptor):
    """The workflow side: a run without a start header gets its derived context."""

    def _load_workflow_context_carrier(self) -> dict[str, Any] | None:
        carrier = super()._load_workflow_context_carrier()
        if carrier:
            return carrier
        info = temporalio.workflow.info()
        trace_id, span_id = run_root_ids(info.workflow_id, info.first_execution_run_id)
        self._workflow_context_carrier = {"traceparent": f"00-{trace_id:032x}-{span_id:016x}-01"}
        return self._workflow_context_carrier

    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        info = temporalio.workflow.info()
        if info.headers.get(self.header_key) or info.continued_run_id:
            # A context to continue (a caller's, a parent's, the chain's): Temporal's way.
            return await super().execute_workflow(input)
        with self._top_level_workflow_context(success_is_complete=True):
            if not temporalio.workflow.unsafe.is_replaying():
                trace_id, span_id = run_root_ids(info.workflow_id, info.first_execution_run_id)
                emit = self._extern_functions[_ROOT_EXTERN]  # type: ignore[literal-required]
                emit(
                    _RootSpan(
                        name=f"RunWorkflow:{info.workflow_type}",
                        trace_id=trace_id,
                        span_id=span_id,
                        attributes={
                            "temporalWorkflowID": info.workflow_id,
                            "temporalRunID": info.run_id,
                        },
                        time_ns=temporalio.workflow.time_ns(),
                    )
                )
            return await self.next.execute_workflow(input)

    async def handle_query(self, input: HandleQueryInput) -> Any:
        if input.headers.get(self.header_key):  # a traced caller: its span, in its trace
            return await super().handle_query(input)
        return await self.next.handle_query(input)


class _ActivityTracer(ActivityInboundInterceptor):
    """Hands the interceptor's tracer to the activity (`ACTIVITY_TRACER`)."""

    def __init__(self, next: ActivityInboundInterceptor, tracer: Tracer) -> None:
        super().__init__(next)
        self._tracer = tracer

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        token = ACTIVITY_TRACER.set(self._tracer)
        try:
            return await self.next.execute_activity(input)
        finally:
            ACTIVITY_TRACER.reset(token)


@dataclass
class OperationSpan:
    """A started `chat`/`execute_tool` span, current until it ends."""

    span: opentelemetry.trace.Span
    token: object


def start_operation_span(
    tracer: Tracer, name: str, attributes: Mapping[str, AttributeValue], *, model: bool
) -> OperationSpan:
    """Start `name` as a child of the current span (the activity's `RunActivity`), current."""
    span = tracer.start_span(
        name, kind=SpanKind.CLIENT if model else SpanKind.INTERNAL, attributes=attributes
    )
    token = opentelemetry.context.attach(opentelemetry.trace.set_span_in_context(span))
    return OperationSpan(span, token)


def end_operation_span(
    op: OperationSpan,
    attributes: Mapping[str, AttributeValue],
    *,
    error: BaseException | None = None,
) -> None:
    """End the span with what the operation returned, or the error it raised; never raises."""
    with contextlib.suppress(Exception):
        opentelemetry.context.detach(cast(Any, op.token))
    span = op.span
    try:
        span.set_attributes(attributes)
        if error is not None:
            kind = error.type if isinstance(error, ApplicationError) and error.type else None
            span.set_attribute("error.type", kind or type(error).__name__)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:500]))
    except Exception:  # what the span could not take is left out; it still ends
        pass
    finally:
        span.end()
