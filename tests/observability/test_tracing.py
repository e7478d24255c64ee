"""OpenTelemetry traces with the SDK's in-memory exporter: deliveries, their steps, their facts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from jobguard import App, Context, HookChain, Hooks
from jobguard.observability.tracing import TracingHooks


@pytest.fixture
def exporter() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """A tracer provider of its own (never the global one) exporting to memory."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    yield provider, memory
    provider.shutdown()


def named(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    """The spans whose name starts with ``prefix``, in start order."""
    return sorted((s for s in spans if s.name.startswith(prefix)), key=lambda s: s.start_time or 0)


def build_app(path: Path, hooks: Hooks) -> App:
    """A task with two steps whose first attempt fails between them."""
    app = App(f"sqlite:///{path}", hooks=hooks)

    @app.task(
        name="ship",
        operation_key="ship:{order_id}",
        resource_key="order:{order_id}",
        backoff_base_s=0.001,
        backoff_cap_s=0.001,
    )
    def ship(ctx: Context, order_id: int) -> str:
        label = ctx.step("print-label", lambda: f"label-{order_id}")
        if ctx.attempt == 1:
            raise ConnectionError("carrier API timed out")
        return ctx.step("book-pickup", lambda: f"{label}/pickup")

    return app


def test_each_delivery_is_a_span_with_the_attempts_facts_and_its_steps_as_children(
    tmp_path: Path, exporter: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, memory = exporter
    app = build_app(tmp_path / "t.db", HookChain(Hooks(), TracingHooks(provider)))
    job = app.tasks["ship"].enqueue(order_id=7)
    app.worker(install_signal_handlers=False, concurrency=1).run(burst=True)
    app.close()

    spans = memory.get_finished_spans()
    first, second = named(spans, "jobguard run ship")
    for span, attempt in ((first, 1), (second, 2)):
        attributes = dict(span.attributes or {})
        assert attributes["jobguard.job_id"] == job.id
        assert attributes["jobguard.attempt"] == attempt
        assert attributes["jobguard.operation_key"] == "ship:7"
        assert len(str(attributes["jobguard.lease_token"])) == 32
        assert attributes["jobguard.fence"] == attempt  # a fresh lock grant per attempt
    assert dict(first.attributes or {})["jobguard.outcome"] == "retry"
    assert first.status.status_code is StatusCode.ERROR
    assert [e.attributes["exception.type"] for e in first.events if e.attributes] == [
        "ConnectionError"
    ]
    assert dict(second.attributes or {})["jobguard.outcome"] == "completed"
    assert second.status.status_code is StatusCode.UNSET

    steps = named(spans, "jobguard step")
    by_parent = {
        (
            span.parent.span_id if span.parent else None,
            span.name,
            bool((span.attributes or {}).get("jobguard.step.skipped")),
        )
        for span in steps
    }
    assert by_parent == {
        (first.context.span_id, "jobguard step print-label", False),
        (second.context.span_id, "jobguard step print-label", True),
        (second.context.span_id, "jobguard step book-pickup", False),
    }


def test_one_trace_runs_from_the_web_request_through_the_enqueue_to_every_attempt_and_step(
    tmp_path: Path, exporter: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, memory = exporter
    app = build_app(tmp_path / "t.db", TracingHooks(provider))
    with provider.get_tracer("shop.web").start_as_current_span("POST /orders/7/ship"):
        job = app.tasks["ship"].enqueue(order_id=7)
    assert job.headers is not None
    assert "traceparent" in job.headers
    # The worker runs in no trace of its own: the job's headers carry the request's.
    app.worker(install_signal_handlers=False, concurrency=1).run(burst=True)
    app.close()

    spans = memory.get_finished_spans()
    (request,) = named(spans, "POST /orders")
    (enqueue,) = named(spans, "jobguard enqueue ship")
    first, second = named(spans, "jobguard run ship")
    steps = named(spans, "jobguard step")
    assert len(steps) == 3
    assert {span.context.trace_id for span in spans} == {request.context.trace_id}
    assert request.parent is None
    assert enqueue.parent is not None
    assert enqueue.parent.span_id == request.context.span_id
    for delivery in (first, second):
        assert delivery.parent is not None
        assert delivery.parent.span_id == enqueue.context.span_id
    assert dict(enqueue.attributes or {})["jobguard.job_id"] == job.id
    assert [dict(s.attributes or {})["jobguard.outcome"] for s in (first, second)] == [
        "retry",
        "completed",
    ]


def test_headers_that_are_not_a_json_object_of_strings_start_a_new_trace() -> None:
    from opentelemetry import trace

    from jobguard.observability.tracing import parent_context

    for headers in (None, "", "not json", "[1, 2]", '{"traceparent": 7}'):
        context = parent_context(headers)
        assert not trace.get_current_span(context).get_span_context().is_valid
