"""Readiness: ``/health`` 503 with per-model states until every model is ready, then 200;
requests for a model that is not ready are 503 ``not_ready``; ``/health/live`` always 200."""

from __future__ import annotations

import threading

from vllm_srun.compose.loader import LoadError

from .conftest import make_client, wait_until


def test_health_follows_loading_then_ready(make_runtime, controlled_loader):
    loaded = threading.Event()

    def slow_loader(model, options, **kwargs):
        if options.name == "sequence":
            assert loaded.wait(30)
        return controlled_loader(model, options, **kwargs)

    runtime = make_runtime(("pooled", "sequence"), loader=slow_loader, load=False)
    client = make_client(runtime)

    response = client.get("/health")
    assert response.status_code == 503
    assert response.json() == {
        "status": "starting",
        "api_version": "2.3.0",
        "reason": None,
        "model": None,  # two models: the client reads models by name
        "models": {
            "pooled": {"status": "loading", "reason": None},
            "sequence": {"status": "loading", "reason": None},
        },
    }
    assert client.get("/health/live").json() == {"status": "alive", "api_version": "2.3.0"}

    runtime.start_loading()
    wait_until(lambda: runtime.models["pooled"].status == "ready", 30, "pooled to load")
    response = client.get("/health")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "loading"
    assert body["models"] == {
        "pooled": {"status": "ready", "reason": None},
        "sequence": {"status": "loading", "reason": None},
    }
    refused = client.post("/v1/classify", json={"model": "sequence", "input": "good"})
    assert refused.status_code == 503
    assert refused.json()["error"] == {
        "code": "not_ready",
        "message": "model sequence is loading",
        "type": "server_error",
        "param": None,
    }
    assert refused.headers["retry-after"] == "5"
    served = client.post("/v1/embeddings", json={"model": "pooled", "input": "good"})
    assert served.status_code == 200  # a ready model answers while another loads
    cards = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
    assert cards["sequence"]["status"] == "loading" and cards["sequence"]["heads"] == []
    assert cards["sequence"]["ready"] is False
    assert cards["sequence"]["golden"] == {  # not checked yet
        "status": "pending",
        "checked": 0,
        "matched": 0,
        "reference": None,
    }
    assert cards["sequence"]["plugins"] == [] and cards["sequence"]["rerank"] is None
    assert cards["pooled"]["status"] == "ready" and cards["pooled"]["ready"] is True
    assert client.get("/health/live").status_code == 200

    loaded.set()
    wait_until(lambda: client.get("/health").status_code == 200, 30, "/health 200")
    assert client.get("/health").json()["status"] == "ready"
    assert client.post("/v1/classify", json={"model": "sequence", "input": "good"}).is_success
    metrics = client.get("/metrics").text
    assert 'vllm_srun_model_ready{model="sequence"} 1.0' in metrics


def test_a_one_model_process_names_its_model_on_health(make_runtime):
    runtime = make_runtime(("pooled",))
    response = make_client(runtime).get("/health")
    assert response.status_code == 200
    assert response.json() == {
        "status": "ready",
        "api_version": "2.3.0",
        "reason": None,
        "model": "pooled",
        "models": {"pooled": {"status": "ready", "reason": None}},
    }


def test_a_model_that_fails_to_load_is_reported_and_refused(make_runtime, controlled_loader):
    def loader(model, options, **kwargs):
        if options.name == "sequence":
            raise LoadError("no engine can run the model: native: broken weights")
        return controlled_loader(model, options, **kwargs)

    runtime = make_runtime(("pooled", "sequence"), loader=loader)
    client = make_client(runtime)
    response = client.get("/health")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "degraded"
    assert body["reason"] == (
        "some models failed to load: model sequence failed to load: no engine can run the "
        "model: native: broken weights"
    )
    assert body["models"]["sequence"] == {
        "status": "failed",
        "reason": "no engine can run the model: native: broken weights",
    }
    refused = client.post("/v1/classify", json={"model": "sequence", "input": "good"})
    assert refused.status_code == 503
    assert refused.json()["error"]["message"] == (
        "model sequence failed to load: no engine can run the model: native: broken weights"
    )
    assert 'vllm_srun_model_ready{model="sequence"} 0.0' in client.get("/metrics").text


def test_every_model_failing_is_failed(make_runtime):
    def loader(model, options, **kwargs):
        raise RuntimeError("out of memory")

    runtime = make_runtime(("pooled",), loader=loader, load_attempts=1)  # a passing cause
    body = make_client(runtime).get("/health").json()
    assert body["status"] == "failed"
    assert body["reason"] == (
        "every model failed to load: model pooled failed to load: loading raised "
        "RuntimeError: out of memory"
    )
    assert body["models"]["pooled"]["reason"] == "loading raised RuntimeError: out of memory"


def test_a_stopping_runtime_refuses_work_and_reports_it(make_runtime):
    runtime = make_runtime(("pooled",))
    client = make_client(runtime)
    assert client.get("/health").status_code == 200
    runtime.stop()
    response = client.get("/health")
    assert response.status_code == 503
    assert response.json()["status"] == "failed"
    assert response.json()["reason"] == "shutting down"
    refused = client.post("/v1/embeddings", json={"model": "pooled", "input": "good"})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "not_ready"
    assert client.get("/health/live").status_code == 200


def test_max_model_len_on_an_encoder_model_fails_it_with_the_operator_phrase(make_runtime, catalog):
    from vllm_srun.compose.loader import load_model

    def loader(path, options, **kwargs):  # the real loader: the check comes before any weight loads
        return load_model(path, options, catalog=catalog)

    runtime = make_runtime(("pooled",), max_model_len=128, loader=loader)
    state = runtime.models["pooled"]
    assert state.status == "failed"
    assert state.reason.startswith(
        "max_model_len applies to Decision models only: the task_heads family answers no "
        "decisions itself"
    )
