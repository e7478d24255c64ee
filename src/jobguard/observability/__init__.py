"""See what the worker and the store are doing: Prometheus metrics, OpenTelemetry traces, JSON logs.

* :mod:`.metrics` — :class:`~.metrics.MetricsHooks` (counters and histograms from a worker's
  hooks) and :class:`~.metrics.StoreCollector` (queue depth, oldest job, DLQ size, read from the
  store at scrape time); needs the ``observability`` extra (``prometheus-client``).
* :mod:`.tracing` — :class:`~.tracing.TracingHooks`: a span per enqueue, per delivery and per
  step, the trace context carried on the job; needs ``opentelemetry-api`` (the SDK and exporter
  are the application's choice).
* :mod:`.logs` — :class:`~.logs.JsonLogHooks`: one JSON line per attempt event through
  :mod:`logging` (no extra needed).

Each is a :class:`~jobguard.hooks.Hooks`; combine them with :class:`~jobguard.hooks.HookChain`.
"""
