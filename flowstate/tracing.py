"""OpenTelemetry traces of FlowState's work, off unless asked for (docs/operations.md).

When on (``enable``: ``--otlp-endpoint``, or ``$OTEL_EXPORTER_OTLP_ENDPOINT``), every turn is a span tree —
the HTTP request (``serving``), then ``flowstate.turn`` → ``flowstate.step`` → ``flowstate.model_call`` (tokens,
TTFT, the engine; a memory method's own call is one too, with its purpose) and ``flowstate.tool_call`` — with ISU's
rejected operations and PSA's disclosures and refusals as events of their step. A session is named by a hash,
never by its text. When off, nothing of the SDK is imported and each hook is one branch on a module global.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from flowstate.errors import FlowStateError

SERVICE = "flowstate"
_tracer: Any = None  # an opentelemetry Tracer while tracing is on
_provider: Any = None
_OFF: AbstractContextManager[None] = nullcontext()


class TracingUnavailable(FlowStateError):
    """Tracing was asked for and the SDK is not installed."""


def on() -> bool:
    return _tracer is not None


def endpoint_from_env() -> str | None:
    """Where OpenTelemetry's own variables say to send traces (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
    ``OTEL_EXPORTER_OTLP_ENDPOINT``), or None."""
    return os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None


def enable(endpoint: str | None = None, *, service: str | None = None, exporter: Any = None) -> Any:
    """Trace from now on: spans to an OTLP/HTTP ``endpoint`` (a collector's base URL, ``/v1/traces`` added as the
    OTLP variables do; batched), or to ``exporter`` (an SDK exporter, each span as it ends: tests). The service is
    ``service``, else ``$OTEL_SERVICE_NAME``, else ``flowstate``. Returns the tracer provider."""
    global _tracer, _provider
    try:
        from opentelemetry import propagate  # noqa: F401  (loaded: the OpenAI-server engine sends traceparent on)
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    except ImportError as exc:
        raise TracingUnavailable(f"tracing needs the OpenTelemetry SDK ({exc.name} is missing): "
                                 "pip install -e '.[otel]'") from exc
    disable()
    provider = TracerProvider(resource=Resource.create(
        {"service.name": service or os.environ.get("OTEL_SERVICE_NAME") or SERVICE}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        url = endpoint or endpoint_from_env()
        if not url:
            raise TracingUnavailable("tracing needs an OTLP endpoint (--otlp-endpoint or $OTEL_EXPORTER_OTLP_ENDPOINT)")
        if not url.rstrip("/").endswith("/v1/traces"):
            url = url.rstrip("/") + "/v1/traces"
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
    _provider, _tracer = provider, provider.get_tracer("flowstate")
    return provider


def disable() -> None:
    """Stop tracing; what was recorded is sent first."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


scrub: Callable[[str], str] | None = None  # set by a redacting server: every text attribute goes through it


def _scrubbed(attributes: Mapping[str, Any]) -> dict[str, Any]:
    return {k: scrub(v) if scrub is not None and isinstance(v, str) else v for k, v in attributes.items()
            if v is not None}


def hashed(session: str) -> str:
    """How a span names a session: the first 16 hex digits of its name's SHA-256."""
    return hashlib.sha256(session.encode()).hexdigest()[:16]


def span(name: str, attributes: Mapping[str, Any] | None = None, *, parent: Any = None) -> AbstractContextManager[Any]:
    """A span around a block (the current one's child, or ``parent``'s: a context ``extract`` gave), or nothing."""
    if _tracer is None:
        return _OFF
    started: AbstractContextManager[Any] = _tracer.start_as_current_span(name, context=parent,
                                                                         attributes=_scrubbed(attributes or {}))
    return started


def current() -> Any:
    """The span a block runs in (None while tracing is off)."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    return trace.get_current_span()


def event(name: str, attributes: Mapping[str, Any] | None = None) -> None:
    """An event of the current span (an ISU rejection, a PSA disclosure)."""
    if _tracer is not None:
        current().add_event(name, dict(attributes or {}))


def annotate(attributes: Mapping[str, Any]) -> None:
    """Attributes of the current span, known once its work is done (a model call's tokens)."""
    if _tracer is not None:
        current().set_attributes(_scrubbed(attributes))


def extract(headers: Mapping[str, str]) -> Any:
    """The W3C trace context an incoming request carries (``traceparent``), as a parent for ``span``; None if off."""
    if _tracer is None:
        return None
    from opentelemetry import propagate

    return propagate.extract(dict(headers))
