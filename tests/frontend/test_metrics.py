"""The frontend's ``vsr_model_runtime_*`` series (§1.10): every family on its own
registry, the gauges read from the pools, exchanges and phases counted, label values
only from the configuration and fixed vocabularies, the metrics app."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from vllm_sr.api.native import Listener
from vllm_sr.api.published import Grant
from vllm_sr.metrics import (
    CACHE_RESULTS,
    PHASES,
    REPLICA_OUTCOMES,
    REQUEST_OUTCOMES,
    SURFACES,
    UNKNOWN_REASONS,
    Metrics,
    metrics_app,
)
from vllm_sr.pool.pool import ReplicaPool

from .pool_support import Clock, close_all, fake_workers, run, value

FAMILIES = {
    "vsr_model_runtime_ready": "gauge",
    "vsr_model_runtime_replica_ready": "gauge",
    "vsr_model_runtime_replica_inflight": "gauge",
    "vsr_model_runtime_replica_admitted_bytes": "gauge",
    "vsr_model_runtime_replica_requests": "counter",
    "vsr_model_runtime_requests": "counter",
    "vsr_model_runtime_request_duration_seconds": "histogram",
    "vsr_model_runtime_transport_seconds": "histogram",
    "vsr_model_runtime_server_seconds": "histogram",
    "vsr_model_runtime_unknown_answers": "counter",
    "vsr_model_runtime_restarts": "counter",
    "vsr_model_runtime_result_cache": "counter",
    "vsr_model_runtime_bundle_tasks": "histogram",
    "vsr_model_runtime_bundle_wait_seconds": "histogram",
    "vsr_model_runtime_bundle_question_wait_seconds": "histogram",
    "vsr_model_runtime_stage_decision_calls": "counter",
}
QUESTION = b'{"model":"pub","state":"x","questions":{}}'


def families(metrics: Metrics) -> dict[str, object]:
    """The families of the exposition (prometheus-client's ``*_created`` aside)."""
    found = text_string_to_metric_families(metrics.render().decode())
    return {f.name: f for f in found if not f.name.endswith("_created")}


def test_every_series_is_on_its_own_registry():
    async def scenario():
        async with fake_workers("a") as (a,):
            worker = a.worker()
            metrics = Metrics()
            ReplicaPool("dep", [worker], metrics, public_name="pub", cache_entries=0)
            found = families(metrics)
            assert {name: f.type for name, f in found.items()} == FAMILIES
            assert not [n for n in REGISTRY._names_to_collectors if n.startswith("vsr_")]
            # Labelled series start at zero for the configured deployment.
            for outcome in REQUEST_OUTCOMES:
                assert (
                    metrics.registry.get_sample_value(
                        "vsr_model_runtime_requests_total",
                        {"deployment": "dep", "outcome": outcome},
                    )
                    == 0
                )
            for outcome in REPLICA_OUTCOMES:
                labels = {"deployment": "dep", "replica": worker.replica_id, "outcome": outcome}
                assert (
                    metrics.registry.get_sample_value(
                        "vsr_model_runtime_replica_requests_total", labels
                    )
                    == 0
                )
            await worker.aclose()

    run(scenario())


def test_gauges_follow_the_pool():
    async def scenario():
        async with fake_workers("a", "b") as (a, b):
            workers = [a.worker(), b.worker()]
            workers[0].restarts, workers[1].restarts = 1, 2
            metrics = Metrics()
            pool = ReplicaPool("dep", workers, metrics, public_name="pub", clock=Clock())
            ra, rb = (w.replica_id for w in workers)
            assert value(metrics, "vsr_model_runtime_ready", deployment="dep") == 1
            assert value(metrics, "vsr_model_runtime_restarts_total", deployment="dep") == 3
            a.mode = b.mode = "hang"
            held = [
                asyncio.create_task(
                    pool.exchange("decisions", "/v1/decisions", QUESTION, timeout=5)
                )
                for _ in range(3)
            ]
            await asyncio.gather(a.wait_received(2), b.wait_received(1))
            inflight = {
                r: value(metrics, "vsr_model_runtime_replica_inflight", deployment="dep", replica=r)
                for r in (ra, rb)
            }
            assert inflight == {ra: 2, rb: 1}
            admitted = value(
                metrics, "vsr_model_runtime_replica_admitted_bytes", deployment="dep", replica=ra
            )
            assert admitted == 2 * len(QUESTION)
            a.gate.set()
            b.gate.set()
            await asyncio.gather(*held)
            workers[1].update("loading", "")
            assert (
                value(metrics, "vsr_model_runtime_replica_ready", deployment="dep", replica=rb) == 0
            )
            assert (
                value(metrics, "vsr_model_runtime_replica_ready", deployment="dep", replica=ra) == 1
            )
            workers[0].update("failed", "no memory")
            assert value(metrics, "vsr_model_runtime_ready", deployment="dep") == 0
            metrics.forget(pool)
            assert (
                metrics.registry.get_sample_value("vsr_model_runtime_ready", {"deployment": "dep"})
                is None
            )
            await close_all(*workers)

    run(scenario())


def test_an_exchange_counts_its_duration_transport_and_server_phases():
    async def scenario():
        async with fake_workers("a") as (a,):
            worker = a.worker()
            metrics = Metrics()
            pool = ReplicaPool("dep", [worker], metrics, public_name="pub", cache_entries=0)
            # parse 1 + tokenize 2 + queue 3 + forward 4 of a 12 ms total: other is 2 ms.
            reply = await pool.exchange("decisions", "/v1/decisions", QUESTION, timeout=5)
            assert reply.server_ms["total"] == 12
            rid = worker.replica_id
            assert (
                value(
                    metrics,
                    "vsr_model_runtime_replica_requests_total",
                    deployment="dep",
                    replica=rid,
                    outcome="ok",
                )
                == 1
            )
            assert (
                value(metrics, "vsr_model_runtime_requests_total", deployment="dep", outcome="ok")
                == 1
            )
            labels = {"deployment": "dep", "surface": "decisions"}
            duration = value(metrics, "vsr_model_runtime_request_duration_seconds_sum", **labels)
            transport = value(metrics, "vsr_model_runtime_transport_seconds_sum", **labels)
            assert transport == pytest.approx(max(0.0, reply.seconds - 0.012))
            phases = {
                phase: value(metrics, "vsr_model_runtime_server_seconds_sum", phase=phase, **labels)
                for phase in PHASES
            }
            assert phases == pytest.approx(
                {
                    "parse": 0.001,
                    "tokenize": 0.002,
                    "queue": 0.003,
                    "forward": 0.004,
                    "post": 0.0,
                    "serialize": 0.0,
                    "other": 0.002,
                }
            )
            assert duration == pytest.approx(reply.seconds)
            await worker.aclose()

    run(scenario())


def test_label_values_come_only_from_the_configuration():
    async def scenario():
        async with fake_workers("a") as (a,):
            worker = a.worker()
            metrics = Metrics()
            pools = {"pub": ReplicaPool("dep", [worker], metrics, public_name="pub")}
            listener = Listener(Grant("http", systemone=("pub",), runtime=("pub",)), pools)
            transport = httpx.ASGITransport(app=listener.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://l") as client:
                for model in ("pub", 'evil"}', "../x", "pub2"):
                    body = {"model": model, "state": "x", "questions": {}}
                    await client.post("/v1/systemone", json=body)
                    await client.post("/v1/embeddings", json={"model": model, "input": "x"})
                    await client.post(f"/v1/{model}", json=body)
                tasks = [{"id": "weird id", "embeddings": {"model": "pub", "input": "x"}}]
                await client.post("/v1/bundle", json={"tasks": tasks})
            allowed = {
                "dep",
                worker.replica_id,
                *REQUEST_OUTCOMES,
                *REPLICA_OUTCOMES,
                *SURFACES,
                *PHASES,
                *UNKNOWN_REASONS,
                *CACHE_RESULTS,
            }
            seen = set()
            for family in metrics.registry.collect():
                for sample in family.samples:
                    seen |= {v for k, v in sample.labels.items() if k != "le"}
            assert seen <= allowed, seen - allowed
            assert value(metrics, "vsr_model_runtime_bundle_tasks_count", deployment="dep") == 1
            await worker.aclose()

    run(scenario())


def test_the_metrics_app_serves_the_exposition():
    async def scenario():
        async with fake_workers("a") as (a,):
            worker = a.worker()
            metrics = Metrics()
            ReplicaPool("dep", [worker], metrics, public_name="pub")
            metrics.unknown_answer("dep", "timeout")
            transport = httpx.ASGITransport(app=metrics_app(metrics))
            async with httpx.AsyncClient(transport=transport, base_url="http://m") as client:
                response = await client.get("/metrics")
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/plain")
            assert 'vsr_model_runtime_ready{deployment="dep"} 1.0' in response.text
            assert (
                'vsr_model_runtime_unknown_answers_total{deployment="dep",reason="timeout"} 1.0'
                in response.text
            )
            await worker.aclose()

    run(scenario())


def test_an_outcome_outside_the_vocabulary_is_refused():
    metrics = Metrics()
    for call in (
        lambda: metrics.request("dep", "weird"),
        lambda: metrics.unknown_answer("dep", "weird"),
        lambda: metrics.exchanged("dep", "r", "chat", "ok", 1.0),
    ):
        try:
            call()
        except ValueError as err:
            assert "is not one of" in str(err)
        else:
            raise AssertionError("accepted a label outside its vocabulary")
