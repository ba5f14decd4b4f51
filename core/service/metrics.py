"""Prometheus metrics of a serving process (prometheus-client), one registry per app.

Model-scoped metrics carry a ``model`` label. No request text ever reaches a
metric or a log line.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from vllm_srun.service.scheduler import SchedulerMetrics

LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
"""Seconds; dense below 50 ms, where encoder requests on a CPU land."""

ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 8192)


class Metrics:
    """The process's metrics, and a per-model view the scheduler reports through."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "vllm_srun_requests_total",
            "Requests answered, by model, surface and HTTP status.",
            ["model", "surface", "status"],
            registry=r,
        )
        self.request_duration = Histogram(
            "vllm_srun_request_duration_seconds",
            "Time from a request's arrival to its answer.",
            ["model", "surface"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_duration = Histogram(
            "vllm_srun_queue_duration_seconds",
            "Time a request waited between admission and its first forward.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.forward_duration = Histogram(
            "vllm_srun_forward_duration_seconds",
            "Duration of one forward (one batch of rows).",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_rows = Histogram(
            "vllm_srun_batch_rows",
            "Rows in one forward.",
            ["model"],
            buckets=ROW_BUCKETS,
            registry=r,
        )
        self.queue_rows = Gauge(
            "vllm_srun_queue_rows", "Rows waiting for a forward.", ["model"], registry=r
        )
        self.result_cache = Counter(
            "vllm_srun_result_cache_total",
            "Result cache lookups, by outcome (hit, miss).",
            ["model", "outcome"],
            registry=r,
        )
        self.model_ready = Gauge(
            "vllm_srun_model_ready", "1 when the model answers, else 0.", ["model"], registry=r
        )
        self.requests_in_flight = Gauge(
            "vllm_srun_requests_in_flight",
            "HTTP requests received and not yet answered (vllm-srun serve).",
            registry=r,
        )

    def for_model(self, model: str) -> ModelMetrics:
        """The scheduler-facing view of one model's metrics."""
        return ModelMetrics(self, model)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


class ModelMetrics(SchedulerMetrics):
    """What a model's scheduler reports, bound to its ``model`` label."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        self._queue_rows = metrics.queue_rows.labels(model=model)
        self._queue_duration = metrics.queue_duration.labels(model=model)
        self._forward = metrics.forward_duration.labels(model=model)
        self._rows = metrics.batch_rows.labels(model=model)
        self._hit = metrics.result_cache.labels(model=model, outcome="hit")
        self._miss = metrics.result_cache.labels(model=model, outcome="miss")

    def queued(self, rows: int) -> None:
        """Rows now waiting."""
        self._queue_rows.set(rows)

    def dispatched(self, queue_seconds: float) -> None:
        """A request's wait before its first forward."""
        self._queue_duration.observe(queue_seconds)

    def forward(self, rows: int, seconds: float) -> None:
        """One forward's size and duration."""
        self._rows.observe(rows)
        self._forward.observe(seconds)

    def cache(self, outcome: str) -> None:
        """A result cache hit or miss."""
        (self._hit if outcome == "hit" else self._miss).inc()
