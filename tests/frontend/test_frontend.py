"""The frontend composed (§1.6, §1.8, shutdown), in process on the misbehaving worker
command: the management API while waiting and once ready, the inventory and
startup-status shapes, listeners opened only once ready, bindings checked against the
cards, a failed startup, and SIGTERM's drain."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from vllm_sr.config.schema import parse_config
from vllm_sr.frontend import Frontend, Parts
from vllm_sr.workers.plan import RuntimeEnvironment

from .conftest import FAKE_COMMAND, free_ports, run

pytestmark = pytest.mark.slow

INVENTORY_KEYS = {
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
    "embedding",
    "rerank",
    "device",
    "profile",
    "engine",
    "desired_replicas",
    "ready_replicas",
    "replicas",
}
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
    """A :class:`Frontend` on the fake worker command, with a listener app that can hold a
    request, and the pools it was given."""

    def __init__(self, rundir, mode: str, monkeypatch, **catalog: Any) -> None:
        monkeypatch.setenv("FAKE_WORKER_MODE", mode)
        self.mgmt, self.listener = free_ports(2)
        self.config = parse_config(document(self.listener, **catalog))
        self.env = RuntimeEnvironment(command=FAKE_COMMAND, directory=rundir, cores=2)
        self.release = asyncio.Event()
        self.entered = asyncio.Event()
        self.pools: dict[str, Any] = {}
        self.lines: list[str] = []

        async def slow(request: Request) -> JSONResponse:
            self.entered.set()
            await self.release.wait()
            return JSONResponse({"answered": True})

        async def pools(request: Request) -> JSONResponse:
            return JSONResponse(sorted(self.pools))

        def listener_app(listener, by_public_id):
            self.pools = dict(by_public_id)
            return Starlette(routes=[Route("/slow", slow), Route("/pools", pools)])

        def pool_factory(name, workers, metrics, *, public_name, served_name):
            return {"name": name, "replicas": len(workers), "public_name": public_name}

        self.frontend = Frontend(
            self.config,
            self.env,
            management=("127.0.0.1", self.mgmt),
            metrics_address=None,
            ready_timeout=30,
            out=self.lines.append,
            parts=Parts(pool_factory=pool_factory, listener_app=listener_app),
            supervisor_options={"poller": {"fast": 0.05}},
        )

    def management(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.mgmt}", timeout=5)

    def listener_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.listener}", timeout=10)


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
            assert (await listener.get("/pools")).json() == ["fake/model", "fake/remote"]
            # SIGTERM: the request in flight finishes, a new one gets 503, /ready says 503.
            held = asyncio.create_task(listener.get("/slow"))
            await asyncio.wait_for(harness.entered.wait(), 10)
            frontend.request_shutdown()
            await asyncio.sleep(0.1)
            refused = await listener.get("/pools")
            not_ready = await mgmt.get("/ready")
            harness.release.set()
            finished = await held
        code = await running
        return status, ready_status, inventory, instance, refused, not_ready, finished, code

    status, ready_status, inventory, instance, refused, not_ready, finished, code = run(scenario())
    assert code == 0
    assert set(status) == STARTUP_KEYS
    assert status["total_models"] == 1  # only managed deployments in use are waited for
    assert ready_status["phase"] == "ready" and ready_status["ready"] is True
    assert ready_status["pending_models"] == [] and ready_status["ready_models"] == 1
    [entry] = ready_status["model_deployments"]
    assert entry["name"] == "primary" and entry["state"] == "ready" and entry["ready"] is True
    assert entry["artifact"] == "fake/model"
    assert harness.lines[-1] == (
        "Router-managed model deployments are ready (1). Starting router services..."
    )
    assert harness.lines[0].startswith(
        "Waiting for Router-managed model deployments, 0 of 1 ready: primary (fake/model) "
    )

    assert inventory["count"] == 2
    primary, remote = inventory["deployments"]  # sorted by name; `unused` is not in use
    assert set(primary) == INVENTORY_KEYS and set(remote) == INVENTORY_KEYS
    assert primary["name"] == "primary" and primary["endpoint"] == "unix"
    assert (primary["desired_replicas"], primary["ready_replicas"]) == (2, 2)
    assert primary["ready"] is True and primary["state"] == "ready"
    assert primary["managed"] is True and primary["process"].startswith("primary-r-")
    assert primary["family"] == "fake" and primary["surfaces"] == ["decisions", "embeddings"]
    assert primary["heads"] == [{"name": "spans", "kind": "token", "labels": ["EMAIL"]}]
    assert primary["embedding"] == {"dimensions": [8], "layers": [1], "modalities": ["text"]}
    assert primary["profile"] == "exact" and primary["restarts"] == 0
    for replica in primary["replicas"]:
        assert set(replica) == REPLICA_KEYS
        assert replica["id"].startswith("r-") and len(replica["id"]) == 14
        assert replica["state"] == "ready" and replica["device"] == "cpu"
    assert remote["managed"] is False and remote["endpoint"] == "unix"
    assert remote["state"] == "unreachable" and remote["ready"] is False
    assert remote["family"] == "" and remote["surfaces"] == [] and remote["heads"] == []
    text = json.dumps(inventory)
    assert str(rundir) not in text and "nobody-listens" not in text  # never a socket path

    assert instance["mode"] == "engine" and instance["decision_deployment"] == "primary"
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "systemone_unavailable"
    assert not_ready.status_code == 503 and not_ready.json()["phase"] == "draining"
    assert finished.status_code == 200 and finished.json() == {"answered": True}
    assert not list(rundir.glob("*.sock"))  # the workers are gone


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
                await listener.get("/pools")
        return ready, health, status, await running

    ready, health, status, code = run(scenario())
    assert ready.status_code == 503 and ready.json()["phase"] == "loading_model_deployments"
    assert ready.json()["message"] == (
        "Waiting for Router-managed model deployments, 0 of 1 ready: primary (fake/model) loading"
    )
    assert health.status_code == 200
    assert status["phase"] == "loading_model_deployments" and status["ready"] is False
    assert status["pending_models"] == ["primary"] and status["total_models"] == 1
    assert status["model_deployments"][0]["process"].count("primary-r-") == 2
    assert code == 1
    assert capsys.readouterr().err.startswith(
        'Router startup failed: model_runtime deployment "primary" did not become ready '
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
        "Router startup failed: a binding does not match the model: domain_classifier "
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
        'Router startup failed: model_runtime deployment "primary": model runtime is not '
        "ready: model primary failed to load: fake: the weights are missing"
    ) in err
    assert frontend.status.document()["phase"] == "error"
    assert not list(rundir.glob("*.sock"))
