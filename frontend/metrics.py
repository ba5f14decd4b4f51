"""The frontend's ``vsr_model_runtime_*`` series, on a registry of their own.

Every label value comes from the configuration (deployment names, replica ids)
or from a fixed vocabulary below (outcomes, surfaces, phases, reasons, cache
results), never from a request: a client cannot grow the series.

State that already lives elsewhere (a pool's readiness, each replica's in-flight
exchanges and outstanding bytes, restarts) is read when Prometheus scrapes, from
the pools :meth:`Metrics.watch` was given; events (requests, durations, cache
lookups) are counted as they happen.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from fastapi import FastAPI
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.responses import Response

from .pages import METRICS_LINKS, add_index

REPLICA_OUTCOMES = ("ok", "failed", "rejected", "canceled", "timeout")
"""How one exchange with one replica ended (``vsr_model_runtime_replica_requests_total``)."""

REQUEST_OUTCOMES = (
    "ok",
    "timeout",
    "unavailable",
    "overloaded",
    "rejected",
    "failed",
    "cancelled",
    "unknown_deployment",
)
"""How one request to a deployment ended (``vsr_model_runtime_requests_total``): the
replica outcomes (``canceled`` counted as ``cancelled``, the digest's spellings) plus the
pool's own refusals."""

SURFACES = ("decisions", "classify", "embeddings", "rerank", "bundle")
"""The ``surface`` label: the worker's routes (``/v1/systemone`` and its batch are
``decisions``)."""

PHASES = ("parse", "tokenize", "queue", "forward", "post", "serialize", "other")
"""The worker's ``Server-Timing`` phases; ``other`` is its total less the named ones."""

UNKNOWN_REASONS = ("timeout", "unavailable", "overloaded", "rejected", "failed")
"""Why a model signal resolved as unknown (``vsr_model_runtime_unknown_answers_total``)."""

CACHE_RESULTS = ("hit", "miss")

DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Seconds, 1 ms to 5 s."""

BUNDLE_TASK_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0)


@dataclass(frozen=True)
class ReplicaSample:
    """One replica as the gauges show it."""

    replica: str
    ready: bool
    inflight: int
    admitted_bytes: int


@dataclass(frozen=True)
class PoolSample:
    """One deployment's pool as the gauges show it."""

    deployment: str
    ready: bool
    restarts: int
    replicas: tuple[ReplicaSample, ...]


class Observable(Protocol):
    """What :meth:`Metrics.watch` reads at scrape time (a replica pool)."""

    @property
    def deployment(self) -> str: ...

    def sample(self) -> PoolSample: ...


class _PoolCollector(Collector):
    """The gauges and the restart counter, read from the watched pools at scrape time."""

    def __init__(self, pools: Mapping[str, Observable]) -> None:
        self._pools = pools

    def collect(self) -> Iterable[Metric]:
        ready = GaugeMetricFamily(
            "vsr_model_runtime_ready",
            "1 while the deployment answers (at least one ready replica).",
            labels=["deployment"],
        )
        replica_ready = GaugeMetricFamily(
            "vsr_model_runtime_replica_ready",
            "1 while the replica's worker is ready and compatible with its pool.",
            labels=["deployment", "replica"],
        )
        inflight = GaugeMetricFamily(
            "vsr_model_runtime_replica_inflight",
            "Admitted exchanges outstanding on the replica.",
            labels=["deployment", "replica"],
        )
        admitted = GaugeMetricFamily(
            "vsr_model_runtime_replica_admitted_bytes",
            "Request bytes outstanding on the replica.",
            labels=["deployment", "replica"],
        )
        restarts = CounterMetricFamily(
            "vsr_model_runtime_restarts",
            "Managed worker process restarts.",
            labels=["deployment"],
        )
        for name in sorted(self._pools):
            sample = self._pools[name].sample()
            ready.add_metric([sample.deployment], 1.0 if sample.ready else 0.0)
            restarts.add_metric([sample.deployment], float(sample.restarts))
            for replica in sample.replicas:
                labels = [sample.deployment, replica.replica]
                replica_ready.add_metric(labels, 1.0 if replica.ready else 0.0)
                inflight.add_metric(labels, float(replica.inflight))
                admitted.add_metric(labels, float(replica.admitted_bytes))
        yield from (ready, replica_ready, inflight, admitted, restarts)

    def describe(self) -> Iterable[Metric]:
        return ()


class Metrics:
    """Every ``vsr_model_runtime_*`` series, on :attr:`registry` (its own, never the
    process-wide default one)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._pools: dict[str, Observable] = {}
        self.registry.register(_PoolCollector(self._pools))
        r = self.registry
        self.replica_requests = Counter(
            "vsr_model_runtime_replica_requests",
            "Completed dispatches to one replica, by outcome.",
            ["deployment", "replica", "outcome"],
            registry=r,
        )
        self.requests = Counter(
            "vsr_model_runtime_requests",
            "Requests to a deployment, by outcome.",
            ["deployment", "outcome"],
            registry=r,
        )
        self.duration = Histogram(
            "vsr_model_runtime_request_duration_seconds",
            "Seconds from admission to the worker's answer read, per deployment and surface.",
            ["deployment", "surface"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.transport = Histogram(
            "vsr_model_runtime_transport_seconds",
            "Exchange seconds less the worker's own Server-Timing total.",
            ["deployment", "surface"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.server = Histogram(
            "vsr_model_runtime_server_seconds",
            "The worker's Server-Timing phases, in seconds.",
            ["deployment", "surface", "phase"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.unknown = Counter(
            "vsr_model_runtime_unknown_answers",
            "Model signals resolved as unknown, by reason.",
            ["deployment", "reason"],
            registry=r,
        )
        self.cache = Counter(
            "vsr_model_runtime_result_cache",
            "Lookups in a single-worker deployment's result cache.",
            ["deployment", "result"],
            registry=r,
        )
        self.bundle_tasks = Histogram(
            "vsr_model_runtime_bundle_tasks",
            "Tasks per bundle exchange sent to a worker.",
            ["deployment"],
            buckets=BUNDLE_TASK_BUCKETS,
            registry=r,
        )
        self.bundle_wait = Histogram(
            "vsr_model_runtime_bundle_wait_seconds",
            "Seconds a bundle waited to be sent (0 when it is sent as it comes).",
            ["deployment"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.bundle_question_wait = Histogram(
            "vsr_model_runtime_bundle_question_wait_seconds",
            "Seconds a question waited to join a bundle (routing; none in Engine mode).",
            ["deployment"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.stage_decision_calls = Counter(
            "vsr_model_runtime_stage_decision_calls",
            "Decisions calls per request stage round (routing; none in Engine mode).",
            ["deployment", "round"],
            registry=r,
        )

    # -- pools -------------------------------------------------------------------------------
    def watch(self, pool: Observable) -> None:
        """Show ``pool``'s gauges (replacing an earlier pool of the same deployment) and
        start every labelled series of its deployment at zero."""
        name = pool.deployment
        self._pools[name] = pool
        for outcome in REQUEST_OUTCOMES:
            self.requests.labels(name, outcome)
        for reason in UNKNOWN_REASONS:
            self.unknown.labels(name, reason)
        for result in CACHE_RESULTS:
            self.cache.labels(name, result)
        for surface in SURFACES:
            self.duration.labels(name, surface)
            self.transport.labels(name, surface)
        self.bundle_tasks.labels(name)
        self.bundle_wait.labels(name)
        self.bundle_question_wait.labels(name)
        for replica in pool.sample().replicas:
            for outcome in REPLICA_OUTCOMES:
                self.replica_requests.labels(name, replica.replica, outcome)

    def forget(self, pool: Observable) -> None:
        """Stop showing ``pool``'s gauges (when it is still the one watched)."""
        if self._pools.get(pool.deployment) is pool:
            del self._pools[pool.deployment]

    def drop(self, deployment: str, replica: str | None = None) -> None:
        """Delete every labelled series of ``deployment`` (of its ``replica`` only, when
        given): a reload removed it, and a removed replica's counters must vanish, not
        stay at their last value."""
        for metric in self.registry_metrics():
            names = metric._labelnames  # prometheus_client keeps no public accessor
            if "deployment" not in names or (replica is not None and "replica" not in names):
                continue
            found = set()
            for family in metric.collect():
                for sample in family.samples:
                    labels = sample.labels
                    if labels.get("deployment") != deployment:
                        continue
                    if replica is not None and labels.get("replica") != replica:
                        continue
                    found.add(tuple(labels.get(n, "") for n in names))
            for values in found:
                with contextlib.suppress(KeyError):
                    metric.remove(*values)

    def registry_metrics(self) -> list[Counter | Histogram]:
        """The labelled counters and histograms of this registry."""
        return [
            value
            for value in vars(self).values()
            if isinstance(value, Counter | Histogram) and value._labelnames
        ]

    # -- events ------------------------------------------------------------------------------
    def request(self, deployment: str, outcome: str) -> None:
        """One request to ``deployment`` ended with ``outcome`` (of :data:`REQUEST_OUTCOMES`)."""
        self.requests.labels(deployment, _checked(outcome, REQUEST_OUTCOMES)).inc()

    def exchanged(
        self,
        deployment: str,
        replica: str,
        surface: str,
        outcome: str,
        seconds: float,
        server_ms: Mapping[str, float] | None = None,
    ) -> None:
        """One exchange with ``replica`` ended with ``outcome`` (of :data:`REPLICA_OUTCOMES`)
        after ``seconds``; ``server_ms`` is the worker's ``Server-Timing`` (``total`` and
        phases, milliseconds) when it sent one."""
        surface = _checked(surface, SURFACES)
        self.replica_requests.labels(deployment, replica, _checked(outcome, REPLICA_OUTCOMES)).inc()
        self.duration.labels(deployment, surface).observe(seconds)
        if not server_ms or "total" not in server_ms:
            return
        total = server_ms["total"] / 1000.0
        self.transport.labels(deployment, surface).observe(max(0.0, seconds - total))
        named = 0.0
        for phase in PHASES[:-1]:
            if phase in server_ms:
                value = server_ms[phase] / 1000.0
                named += value
                self.server.labels(deployment, surface, phase).observe(value)
        self.server.labels(deployment, surface, "other").observe(max(0.0, total - named))

    def cache_lookup(self, deployment: str, hit: bool) -> None:
        """A result-cache lookup for ``deployment``."""
        self.cache.labels(deployment, "hit" if hit else "miss").inc()

    def bundle(self, deployment: str, tasks: int, wait_seconds: float = 0.0) -> None:
        """A bundle of ``tasks`` tasks sent to a worker of ``deployment``."""
        self.bundle_tasks.labels(deployment).observe(tasks)
        self.bundle_wait.labels(deployment).observe(wait_seconds)

    def unknown_answer(self, deployment: str, reason: str) -> None:
        """A model signal of ``deployment`` resolved as unknown (routing consumers)."""
        self.unknown.labels(deployment, _checked(reason, UNKNOWN_REASONS)).inc()

    def render(self) -> bytes:
        """The Prometheus text exposition of every series."""
        return generate_latest(self.registry)


def _checked(value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{value!r} is not one of {', '.join(allowed)}")
    return value


def metrics_app(metrics: Metrics) -> FastAPI:
    """The metrics listener (port 9190): ``GET /metrics``, the Prometheus text format, and
    ``GET /`` linking to it (:mod:`vllm_sr.pages`)."""
    app = FastAPI(title="vllm-sr metrics", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/metrics")
    async def exposition() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    add_index(app, "metrics", METRICS_LINKS)
    return app
