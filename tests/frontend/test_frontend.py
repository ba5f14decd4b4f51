"""The frontend composed (§1.6, §1.8, shutdown), in process on the misbehaving worker
command: the management API while waiting and once ready, the inventory and
startup-status shapes, listeners opened only once ready, bindings checked against the
cards, a failed startup, and SIGTERM's drain."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from typing import Any

import httpx
import pytest

from vllm_sr.config.schema import parse_config
from vllm_sr.frontend import Frontend
from vllm_sr.workers.environment import RuntimeEnvironment

from .conftest import FAKE_COMMAND, free_ports, run

pytestmark = pytest.mark.slow

INVENTORY_KEYS = {
    "generation",
    "config_version",
    "name",
    "managed",
    "process",
    "served_name",
    "endpoint",
    "ready",
    "state",
    "reason",
    "restarts",
    "family",
    "repo",
    "revision",
    "surfaces",
    "heads",
    "device",
    "profile",
    "engine",
    "desired_replicas",
    "ready_replicas",
    "replicas",
}
"""Every inventory entry's keys (``embedding`` and ``rerank`` too when the card has them)."""
REPLICA_KEYS = {
    "id",
    "managed",
    "device",
    "ready",
    "state",
    "reason",
    "inflight",
    "estimated_work",
    "restarts",
}
STARTUP_KEYS = {
    "phase",
    "ready",
    "message",
    "downloading_model",
    "pending_models",
    "ready_models",
    "total_models",
    "model_deployments",
    "embedding_provider",
    "updated_at",
}


def document(listener_port: int, **catalog: Any) -> dict[str, Any]:
    deployments = {
        "primary": {
            "provider": "model_runtime",
            "artifact": "fake/model",
            "replicas": [{"device": "cpu"}, {"device": "cpu"}],
        },
        "remote": {
            "provider": "model_runtime",
            "artifact": "fake/remote",
            "endpoint": "unix:///tmp/vsrt-nobody-listens-here.sock",
        },
        "unused": {"provider": "model_runtime", "artifact": "fake/unused", "device": "cpu"},
    }
    return {
        "global": {
            "router": {"enabled": False},
            "model_catalog": {"deployments": deployments, **catalog},
        },
        "listeners": [
            {
                "name": "http",
                "address": "127.0.0.1",
                "port": listener_port,
                "systemone": {"models": ["fake/model"]},
                "runtime": {"models": ["fake/remote"]},
            }
        ],
    }


class Harness:
    """A :class:`Frontend` on the fake worker command (its real pools, listeners and
    metrics), its management API and its listener."""

    def __init__(self, rundir, mode: str, monkeypatch, **catalog: Any) -> None:
        monkeypatch.setenv("FAKE_WORKER_MODE", mode)
        self.rundir = rundir
        self.mgmt, self.listener, self.metrics = free_ports(3)
        self.config = parse_config(document(self.listener, **catalog))
        self.env = RuntimeEnvironment(command=FAKE_COMMAND, directory=rundir, cores=2)
        self.lines: list[str] = []
        self.frontend = Frontend(
            self.config,
            self.env,
            management=("127.0.0.1", self.mgmt),
            metrics_address=("127.0.0.1", self.metrics),
            ready_timeout=30,
            out=self.lines.append,
            result_cache=0,
            supervisor_options={"poller": {"fast": 0.05}},
        )

    def management(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.mgmt}", timeout=5)

    def listener_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.listener}", timeout=10)

    def metrics_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.metrics}", timeout=5)

    async def release(self) -> None:
        """Answer every held request: ``POST /release`` to each fake worker's socket.

        Once the worker holding a request answers it, a draining frontend stops the
        workers: a later one may exit while its own release is on the way (nothing was
        held there, so nothing is lost)."""
        for path in self.rundir.glob("*.sock"):
            transport = httpx.AsyncHTTPTransport(uds=str(path))
            async with httpx.AsyncClient(transport=transport, base_url="http://w") as worker:
                with contextlib.suppress(httpx.TransportError):
                    await worker.post("/release", json={})


async def answered(client: httpx.AsyncClient, path: str, timeout: float = 20) -> httpx.Response:
    """The first answer of ``path`` (the server may not listen yet)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            return await client.get(path)
        except httpx.TransportError:
            assert asyncio.get_running_loop().time() < deadline, f"{path} never answered"
            await asyncio.sleep(0.05)


async def until_ready(client: httpx.AsyncClient, timeout: float = 20) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while (await answered(client, "/ready")).status_code != 200:
        assert asyncio.get_running_loop().time() < deadline, "never ready"
        await asyncio.sleep(0.05)


async def until(predicate: Any, timeout: float = 10) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out waiting"
        await asyncio.sleep(0.01)


QUESTION = {"state": "x", "questions": {"q": {"type": "noul", "instructions": "?"}}}


def test_waiting_ready_inventory_and_drain(rundir, monkeypatch):
    harness = Harness(rundir, "ready", monkeypatch)
    frontend = harness.frontend

    async def scenario():
        running = asyncio.create_task(frontend.run())
        async with harness.management() as mgmt, harness.listener_client() as listener:
            await answered(mgmt, "/ready")
            status = (await mgmt.get("/startup-status")).json()
            await until_ready(mgmt)
            ready_status = (await mgmt.get("/startup-status")).json()
            inventory = (await mgmt.get("/api/v1/inventory/model-runtime")).json()
            instance = (await mgmt.get("/api/v1/status")).json()
            models = (await listener.get("/v1/systemone/models")).json()
            asked = await listener.post("/v1/systemone", json={"model": "fake/model", **QUESTION})
            remote = await listener.post("/v1/embeddings", json={"model": "fake/remote"})
            async with harness.metrics_client() as scraper:
                metrics = (await scraper.get("/metrics")).text
            # SIGTERM: the request in flight finishes, a new one gets 503, /ready says 503.
            held = asyncio.create_task(
                listener.post("/v1/systemone", json={"model": "fake/model", "hold": True})
            )
            [opened] = frontend.listeners.values()
            await until(lambda: opened.inflight == 1)
            frontend.request_shutdown()
            await until(lambda: frontend.draining)
            refused = await listener.post("/v1/systemone", json={"model": "fake/model"})
            not_ready = await mgmt.get("/ready")
            await harness.release()
            finished = await held
        code = await running
        return (
            status,
            ready_status,
            inventory,
            instance,
            (models, asked, remote, metrics),
            refused,
            not_ready,
            finished,
            code,
        )

    (
        status,
        ready_status,
        inventory,
        instance,
        (models, asked, remote, metrics),
        refused,
        not_ready,
        finished,
        code,
    ) = run(scenario())
    assert code == 0
    assert set(status) == STARTUP_KEYS
    assert status["total_models"] == 1  # only managed deployments in use are waited for
    assert ready_status["phase"] == "ready" and ready_status["ready"] is True
    assert ready_status["pending_models"] == [] and ready_status["ready_models"] == 1
    [entry] = ready_status["model_deployments"]
    assert entry["name"] == "primary" and entry["state"] == "ready" and entry["ready"] is True
    assert entry["artifact"] == "fake/model"
    assert harness.lines[-1] == (  # Engine mode names itself
        "Engine-managed model deployments are ready (1). Starting engine services..."
    )
    assert harness.lines[0].startswith(
        "Waiting for Engine-managed model deployments, 0 of 1 ready: primary (fake/model) "
    )

    # The inventory is the pools' own: one entry per deployment in use, sorted by name.
    assert inventory["count"] == 2
    primary, remote_entry = inventory["deployments"]  # `unused` is not in use
    assert set(primary) == INVENTORY_KEYS | {"embedding"}  # the fake card has no rerank
    assert set(remote_entry) == INVENTORY_KEYS  # no card seen: no embedding, no rerank
    assert primary["name"] == "primary" and primary["endpoint"] == "unix"
    assert (primary["generation"], primary["config_version"]) == ("active", 1)
    assert (primary["desired_replicas"], primary["ready_replicas"]) == (2, 2)
    assert primary["ready"] is True and primary["state"] == "ready"
    assert primary["managed"] is True and primary["process"].startswith("primary-r-")
    assert primary["family"] == "fake" and primary["surfaces"] == ["decisions", "embeddings"]
    assert primary["heads"] == [{"name": "spans", "kind": "token", "labels": ["EMAIL"]}]
    assert primary["embedding"] == {"dimensions": [8], "layers": [1], "modalities": ["text"]}
    assert primary["profile"] == "exact" and primary["restarts"] == 0
    assert primary["device"] == "cpu" and primary["served_name"] == "primary"
    for replica in primary["replicas"]:
        assert set(replica) == REPLICA_KEYS
        assert replica["id"].startswith("r-") and len(replica["id"]) == 14
        assert replica["state"] == "ready" and replica["device"] == "cpu"
        assert (replica["inflight"], replica["estimated_work"]) == (0, 0)
    assert remote_entry["managed"] is False and remote_entry["endpoint"] == "unix"
    assert remote_entry["state"] == "unreachable" and remote_entry["ready"] is False
    assert remote_entry["family"] == "" and remote_entry["surfaces"] == []
    text = json.dumps(inventory)
    assert str(rundir) not in text and "nobody-listens" not in text  # never a socket path

    # The listener publishes its grants through the pools, under the public ids.
    assert models == {
        "object": "list",
        "data": [{"id": "fake/model", "object": "model", "api": "systemone", "routing": False}],
    }
    assert asked.status_code == 200 and asked.json()["model"] == "fake/model"
    assert remote.status_code == 503 and remote.json()["error"]["code"] == "runtime_unavailable"
    assert 'vsr_model_runtime_ready{deployment="primary"} 1.0' in metrics
    assert 'vsr_model_runtime_ready{deployment="remote"} 0.0' in metrics
    assert 'vsr_model_runtime_restarts_total{deployment="primary"} 0.0' in metrics

    assert instance["mode"] == "engine" and instance["decision_deployment"] == "primary"
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "systemone_unavailable"
    assert not_ready.status_code == 503 and not_ready.json()["phase"] == "draining"
    assert not_ready.json()["message"].startswith("shutting down")
    assert finished.status_code == 200 and finished.json()["model"] == "fake/model"
    assert not list(rundir.glob("*.sock"))  # the workers are gone


def test_an_address_in_use_fails_startup_with_its_name(rundir, monkeypatch, capsys, caplog):
    harness = Harness(rundir, "ready", monkeypatch)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", harness.listener))
        taken.listen()
        code = run(harness.frontend.run())
    assert code == 1
    err = capsys.readouterr().err
    port = harness.listener
    assert (
        f"Engine startup failed: listener http cannot listen on 127.0.0.1:{port}: port {port} "
        "is in use; stop what listens there, change the listener's port in the configuration, "
        "or set VLLM_SR_PORT_OFFSET=N to move every port of this frontend up by N (the "
        "management API from 8080, the metrics from 9190, the listeners from their "
        "configured ports or 8899)\n"
    ) in err
    assert "Errno" not in err and "Errno" not in caplog.text  # not uvicorn's own record
    assert not list(rundir.glob("*.sock"))  # the workers it started are gone


def test_while_waiting_and_the_readiness_timeout(rundir, monkeypatch, capsys):
    harness = Harness(rundir, "never", monkeypatch)
    harness.frontend.ready_timeout = 2

    async def scenario():
        running = asyncio.create_task(harness.frontend.run())
        async with harness.management() as mgmt, harness.listener_client() as listener:
            ready = await answered(mgmt, "/ready")
            while (await mgmt.get("/startup-status")).json()["model_deployments"][0][
                "state"
            ] != "loading":
                await asyncio.sleep(0.05)
            ready = await mgmt.get("/ready")
            health = await mgmt.get("/health")
            status = (await mgmt.get("/startup-status")).json()
            with pytest.raises(httpx.TransportError):  # listeners open only once ready
                await listener.get("/v1/systemone/models")
        return ready, health, status, await running

    ready, health, status, code = run(scenario())
    assert ready.status_code == 503 and ready.json()["phase"] == "loading_model_deployments"
    assert ready.json()["message"] == (
        "Waiting for Engine-managed model deployments, 0 of 1 ready: primary (fake/model) loading"
    )
    assert health.status_code == 200
    assert status["phase"] == "loading_model_deployments" and status["ready"] is False
    assert status["pending_models"] == ["primary"] and status["total_models"] == 1
    assert status["model_deployments"][0]["process"].count("primary-r-") == 2
    assert code == 1
    assert capsys.readouterr().err.startswith(
        'Engine startup failed: model_runtime deployment "primary" did not become ready '
        "within 2s (VLLM_SRUN_READY_TIMEOUT): loading"
    )
    assert harness.frontend.status.phase == "error"


def test_a_binding_that_does_not_match_the_card_fails_startup(rundir, monkeypatch, capsys):
    bindings = {"domain_classifier": {"deployment": "primary", "contract": "label_scores.v1"}}
    harness = Harness(rundir, "ready", monkeypatch, bindings=bindings)
    code = run(harness.frontend.run())
    assert code == 1
    assert harness.frontend.status.phase == "error"
    err = capsys.readouterr().err
    assert err.startswith(
        "Engine startup failed: a binding does not match the model: domain_classifier "
        "(label_scores.v1) on primary: the model has no scores head (heads: spans (token))"
    )


def test_a_matching_binding_passes(rundir, monkeypatch):
    bindings = {"pii_classifier": {"deployment": "primary", "contract": "token_spans.v1"}}
    harness = Harness(rundir, "ready", monkeypatch, bindings=bindings)

    async def scenario():
        running = asyncio.create_task(harness.frontend.run())
        async with harness.management() as mgmt:
            await until_ready(mgmt)
        harness.frontend.request_shutdown()
        return await running

    assert run(scenario()) == 0


def test_a_failed_startup_says_why_and_stops_the_workers(rundir, monkeypatch, capsys):
    harness = Harness(rundir, "failed", monkeypatch)
    frontend = harness.frontend
    frontend.supervisor_options["recycle"] = False

    async def scenario():
        running = asyncio.create_task(frontend.run())
        code = await running
        return code

    assert run(scenario()) == 1
    err = capsys.readouterr().err
    assert (
        'Engine startup failed: model_runtime deployment "primary": model runtime is not '
        "ready: model primary failed to load: fake: the weights are missing"
    ) in err
    assert frontend.status.document()["phase"] == "error"
    assert not list(rundir.glob("*.sock"))
