"""Tracing and metrics for durably's workers (SPEC section 17).

Tracing (OpenTelemetry, the `otel` extra: ``pip install 'durably[otel]'``)::

    runtime = await DurableRuntime.open(agents=registrations, tracing=True)  # global provider
    runtime = await DurableRuntime.open(agents=registrations, tracing=my_tracer_provider)
    client = await Client.connect(..., plugins=[DurablyPlugin(registry, tracing=True)])
    durably worker --agents myapp.agents:registrations --otel

Every run is one trace, kept across continue-as-new; a subagent's run and a
session's runs are child spans of the run (or session) that started them. A
run started by a traced client joins the caller's trace; one started by
anything else (the Temporal CLI, an untraced client) gets a root span of its
own at its first workflow task, with a trace id derived from the run's id and
first execution run id, so every worker agrees on it without recording
anything. `RunSnapshot.trace_id` names it. Each model request is a span
``chat {model}`` and each tool call a span ``execute_tool {tool}`` (the
OpenTelemetry `gen_ai` semantic conventions, plus ``durably.operation_id``,
``durably.attempt``, ``durably.agent_id``, ``durably.agent_version``,
``durably.recovery`` for tools and ``durably.cost_usd`` for models), children
of Temporal's ``RunActivity`` span, one per executed attempt. Workflow-side
spans are Temporal's `TracingInterceptor`'s: emitted as each workflow task
completes, never while a restarted worker replays what was committed.

Metrics, where durably connects (`durably worker --metrics 127.0.0.1:9464`,
`DurableRuntime.open(metrics_bind=...)`), or on a `Client` you connect with
``runtime=metrics_runtime("127.0.0.1:9464")``: Temporal's own worker metrics
and durably's counters, on a Prometheus endpoint (``/metrics``):

- ``durably_operations_started`` / ``_completed`` / ``_failed``: model requests
  and tool calls (one per attempt), by ``kind`` (model, tool), ``policy`` (a
  tool's recovery policy; a model's ``model_retry`` or ``none``) and ``agent_id``;
- ``durably_model_tokens``: tokens the model requests reported, by ``token_type``
  (input, output) and ``agent_id``;
- ``durably_status_transitions``: statuses runs published on this worker, by
  ``status`` and ``agent_id`` (never counted again on replay).

Runs by status come from visibility, not from a worker: `durably runs stats`
(`DurableClient.run_stats`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from temporalio import activity
from temporalio.client import Client
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from durably.contract import operation_id
from durably.errors import DurablyError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.trace import TracerProvider
    from temporalio.contrib.opentelemetry import TracingInterceptor

    from durably.registry import AgentRegistry

__all__ = [
    "MODEL_TOKENS",
    "OPERATIONS_COMPLETED",
    "OPERATIONS_FAILED",
    "OPERATIONS_STARTED",
    "STATUS_TRANSITIONS",
    "metrics_runtime",
    "otlp_tracer_provider",
    "tracing_interceptor",
]

OPERATIONS_STARTED = "durably_operations_started"
OPERATIONS_COMPLETED = "durably_operations_completed"
OPERATIONS_FAILED = "durably_operations_failed"
MODEL_TOKENS = "durably_model_tokens"
# Counted by the workflow (`durably.workflows._metrics`), never on replay.
STATUS_TRANSITIONS = "durably_status_transitions"
# The extern function the tracing interceptor gives workflows: the run's trace id.
TRACE_ID_EXTERN = "__durably_run_trace_id"

_EXTRA = "pip install 'durably[otel]'"


def tracing_interceptor(tracer_provider: TracerProvider | None = None) -> TracingInterceptor:
    """durably's tracing interceptor: Temporal's `TracingInterceptor` with one trace per run.

    Give it to a `Client` (``interceptors=[...]``: its workers get it too) or
    to a `Worker`, in place of Temporal's own (not beside it: every span would
    be twice). `tracer_provider` defaults to OpenTelemetry's global one.
    """
    try:
        from durably._tracing import DurablyTracingInterceptor
    except ImportError as err:
        raise ImportError(f"tracing needs OpenTelemetry ({err}): {_EXTRA}") from err
    return DurablyTracingInterceptor(tracer_provider)


def traced_client(client: Client, tracing: bool | TracerProvider) -> Client:
    """`client`, or the same connection with durably's tracing interceptor added (once)."""
    if tracing is False:
        return client
    config = client.config()
    interceptors = list(config.get("interceptors") or [])
    if any(type(i).__name__ == "DurablyTracingInterceptor" for i in interceptors):
        return client
    provider = None if isinstance(tracing, bool) else tracing
    config["interceptors"] = [*interceptors, tracing_interceptor(provider)]
    return Client(**config)


def otlp_tracer_provider(service_name: str = "durably-worker") -> SdkTracerProvider | None:
    """For a process of its own (`durably worker --otel`): the tracer provider to trace
    with, made global.

    A provider the process already set (your `--agents` module may set one) is
    used as it is, and None is returned. Otherwise an SDK provider exporting in
    batches to OTLP over HTTP, configured by the standard ``OTEL_EXPORTER_OTLP_*``
    and ``OTEL_SERVICE_NAME`` variables (default endpoint
    ``http://localhost:4318``), is set and returned: call its ``shutdown()``
    before the process exits, which sends what is still buffered.
    """
    import os

    try:
        from opentelemetry import trace
    except ImportError as err:
        raise DurablyError(f"--otel needs OpenTelemetry ({err}): {_EXTRA}") from err
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return None  # set by the application already
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider as SdkProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as err:
        raise DurablyError(
            f"--otel needs OpenTelemetry's SDK and OTLP exporter ({err}): {_EXTRA}"
        ) from err
    name = os.environ.get("OTEL_SERVICE_NAME") or service_name
    provider = SdkProvider(resource=Resource.create({SERVICE_NAME: name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider


def metrics_runtime(bind_address: str) -> Runtime:
    """A Temporal `Runtime` serving Prometheus metrics at ``http://{bind_address}/metrics``.

    Temporal's worker and client metrics and durably's counters (this module's
    docstring) are served for every client connected with it. Binds the port
    at once: a port in use raises `DurablyError`.
    """
    host, _, port = bind_address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DurablyError(
            f"metrics address {bind_address!r} is not HOST:PORT (e.g. 127.0.0.1:9464)"
        )
    try:
        return Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address)))
    except Exception as err:
        raise DurablyError(
            f"cannot serve metrics on {bind_address} ({err}); choose another address"
        ) from err


# -- model requests and tool calls, where the activity runs ---------------------------

# The tracer of the activity running in this task, set by durably's tracing
# interceptor (None: no tracing, and no span is made at all).
ACTIVITY_TRACER: ContextVar[Any] = ContextVar("durably_activity_tracer", default=None)

_F = TypeVar("_F", bound=Callable[..., Awaitable[Any]])


def instrumented(kind: Literal["model", "tool"]) -> Callable[[_F], _F]:
    """Count (and, with tracing on, trace) each attempt of an `AgentActivities` method
    taking a `ModelCallInput` or `ToolCallInput`. Telemetry never fails an operation:
    anything it cannot read is left out."""

    def wrap(fn: _F) -> _F:
        @functools.wraps(fn)
        async def run(self: Any, call: Any) -> Any:
            op = _Operation(kind, self.registry, call)
            try:
                result = await fn(self, call)
            except BaseException as exc:
                op.failed(exc)
                raise
            op.completed(result)
            return result

        return cast(_F, run)

    return wrap


class _Operation:
    """One attempt of a model request or tool call, as metrics and a span see it."""

    def __init__(self, kind: Literal["model", "tool"], registry: AgentRegistry, call: Any) -> None:
        self.kind = kind
        self.labels = {"kind": kind, "policy": "-", "agent_id": str(call.agent_id)}
        self.span: Any = None
        try:
            registration = registry.get(call.agent_id, call.version)
            if kind == "tool" and registration is not None:
                self.labels["policy"] = registration.recovery(call.call.name)
            elif registration is not None:
                self.labels["policy"] = "model_retry" if registration.model_retry else "none"
            self._count(OPERATIONS_STARTED, "Model requests and tool calls started (attempts).")
            tracer = ACTIVITY_TRACER.get()
            if tracer is not None:
                from durably._tracing import start_operation_span

                name, attributes = _span_of(kind, call, registration, self.labels["policy"])
                self.span = start_operation_span(tracer, name, attributes, model=kind == "model")
        except Exception:  # a bug here must not fail the operation
            self.span = None

    def completed(self, result: Any) -> None:
        with contextlib.suppress(Exception):
            self._count(OPERATIONS_COMPLETED, "Model requests and tool calls that returned.")
            usage = getattr(result, "usage", None)
            if self.kind == "model" and usage is not None:
                tokens = activity.metric_meter().create_counter(
                    MODEL_TOKENS, "Tokens model requests reported."
                )
                agent = self.labels["agent_id"]
                tokens.add(usage.input_tokens, {"token_type": "input", "agent_id": agent})
                tokens.add(usage.output_tokens, {"token_type": "output", "agent_id": agent})
        self._end(result=result)

    def failed(self, exc: BaseException) -> None:
        with contextlib.suppress(Exception):
            self._count(OPERATIONS_FAILED, "Model requests and tool calls that raised.")
        self._end(error=exc)

    def _end(self, *, result: Any = None, error: BaseException | None = None) -> None:
        if self.span is None:
            return
        from durably._tracing import end_operation_span

        attributes: dict[str, Any] = {}
        with contextlib.suppress(Exception):
            attributes = _result_attributes(result) if error is None else {}
        end_operation_span(self.span, attributes, error=error)
        self.span = None

    def _count(self, name: str, description: str) -> None:
        activity.metric_meter().create_counter(name, description).add(1, self.labels)


def _span_of(
    kind: Literal["model", "tool"], call: Any, registration: Any, policy: str
) -> tuple[str, dict[str, Any]]:
    """A span's name and its attributes known before the operation runs."""
    info = activity.info()
    run_id = info.workflow_id or ""
    attributes: dict[str, Any] = {
        "durably.run_id": run_id,
        "durably.operation_key": call.key,
        "durably.agent_id": call.agent_id,
        "durably.agent_version": call.version,
        "gen_ai.agent.name": call.agent_id,
    }
    if kind == "tool":
        attributes.update(
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": call.call.name,
                "gen_ai.tool.call.id": call.call.call_id,
                "gen_ai.tool.type": "function",
                "durably.operation_id": operation_id(run_id, call.chain, call.key),
                "durably.attempt": info.attempt,
                "durably.recovery": policy,
            }
        )
        return f"execute_tool {call.call.name}", attributes
    identity: Mapping[str, Any] = registration.agent.model.identity if registration else {}
    model = str(identity.get("model") or identity.get("name") or "unknown")
    provider = identity.get("provider")
    system = provider if isinstance(provider, str) and provider else "_OTHER"
    attributes.update(
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.system": system,
            "gen_ai.provider.name": system,
            "gen_ai.request.model": model,
            # The model request has no chain id in its input: its key within the run.
            "durably.operation_id": operation_id(run_id, None, call.key),
            "durably.attempt": call.attempt or info.attempt,
            "durably.model_policy": policy,
        }
    )
    return f"chat {model}", attributes


def _result_attributes(result: Any) -> dict[str, Any]:
    """What a returned model answer or tool result adds to its span."""
    usage = getattr(result, "usage", None)
    if usage is not None:
        attributes: dict[str, Any] = {
            "gen_ai.usage.input_tokens": usage.input_tokens,
            "gen_ai.usage.output_tokens": usage.output_tokens,
            "durably.cost_usd": float(getattr(usage, "cost_usd", 0.0)),
        }
        for name in ("cached_input_tokens", "reasoning_tokens"):
            if getattr(usage, name, 0):
                attributes[f"durably.usage.{name}"] = getattr(usage, name)
        calls = getattr(getattr(result, "message", None), "tool_calls", ())
        attributes["durably.tool_calls"] = len(calls)
        return attributes
    if getattr(result, "is_error", False):
        return {"durably.tool.is_error": True}
    return {}
