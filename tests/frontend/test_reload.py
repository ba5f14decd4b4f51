"""Configuration changes without a restart (ROUTER-SPEC §3.2, scenario T21), end to end:
``vllm-sr serve --config`` (Router mode) and ``vllm-sr serve -e --config`` (Engine mode)
on the steerable worker (:mod:`router_worker`), changed with ``vllm-sr config apply`` and
the configuration API while clients keep sending requests.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml

from .conftest import free_ports
from .router_support import (
    VLLM_SR,
    ServedRouter,
    StubServer,
    label_sets,
    metric,
    wait_for,
    worker_command,
)

pytestmark = pytest.mark.slow

AUTO = "vllm-sr/auto"


# -- the Router-mode documents -------------------------------------------------------------------


def router_document(
    stub_endpoint: str,
    port: int,
    *,
    billing: bool = False,
    embedder: str = "primary",
    artifact: str = "fake/primary",
) -> dict[str, Any]:
    """One listener, two provider models on the stub, a keyword route (``coding``), an
    embedding route on the ``embedder`` deployment, and with ``billing`` a second keyword
    route."""
    keywords = [{"name": "code", "keywords": ["debug"]}]
    decisions: list[dict[str, Any]] = [
        {
            "name": "coding",
            "priority": 100,
            "rules": {"operator": "AND", "conditions": [{"type": "keyword", "name": "code"}]},
            "modelRefs": [{"model": "a-chat"}],
        },
        {
            "name": "weather",
            "priority": 50,
            "rules": {"operator": "AND", "conditions": [{"type": "embedding", "name": "rain"}]},
            "modelRefs": [{"model": "a-chat"}],
        },
    ]
    if billing:
        keywords.append({"name": "invoice", "keywords": ["invoice"]})
        decisions.append(
            {
                "name": "billing",
                "priority": 90,
                "rules": {
                    "operator": "AND",
                    "conditions": [{"type": "keyword", "name": "invoice"}],
                },
                "modelRefs": [{"model": "b-chat"}],
            }
        )
    return {
        "version": "v0.3",
        "listeners": [{"name": "chat", "address": "127.0.0.1", "port": port, "timeout": "30s"}],
        "providers": {
            "defaults": {"default_model": "a-chat"},
            "models": [
                {"name": "a-chat", "backend_refs": [{"name": "a", "endpoint": stub_endpoint}]},
                {"name": "b-chat", "backend_refs": [{"name": "b", "endpoint": stub_endpoint}]},
            ],
        },
        "global": {
            "model_catalog": {
                "deployments": {
                    embedder: {"provider": "model_runtime", "artifact": artifact, "device": "cpu"}
                },
                "bindings": {"embedding": {"deployment": embedder, "contract": "embedding.v1"}},
            }
        },
        "routing": {
            "signals": {
                "keywords": keywords,
                "embeddings": [
                    {"name": "rain", "threshold": 0.999, "candidates": ["will it rain today"]}
                ],
            },
            "decisions": decisions,
        },
    }


class Served:
    """A served frontend and how its tests reach it."""

    def __init__(self, served: ServedRouter, scripts: Path, port: int) -> None:
        self.served = served
        self.scripts = scripts
        self.port = port
        self.listener = f"http://127.0.0.1:{port}"
        self.mgmt = served.mgmt

    def script(self, deployment: str, **script: Any) -> None:
        (self.scripts / f"{deployment}.json").write_text(json.dumps(script))

    def pids(self, deployment: str) -> list[int]:
        path = self.scripts / f"{deployment}.pids"
        return [int(p) for p in path.read_text().split()] if path.exists() else []

    def apply(self, document: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
        """``vllm-sr config apply --config FILE`` against this frontend."""
        path = self.scripts / f"apply-{time.monotonic_ns()}.yaml"
        path.write_text(yaml.safe_dump(self.served.as_served(document), sort_keys=False))
        return subprocess.run(
            [
                *VLLM_SR,
                "config",
                "apply",
                "--config",
                str(path),
                "--endpoint",
                self.served.mgmt_url,
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "VSR_MGMT_TOKEN": ""},
        )

    def hash(self) -> dict[str, Any]:
        return self.mgmt.get("/api/v1/config/hash").json()

    def wait_status(self, status: str, timeout: float = 60) -> dict[str, Any]:
        return wait_for(
            lambda: (doc := self.hash())["activation_status"] == status and doc,
            timeout,
            f"activation_status {status}",
        )

    def chat(self, text: str) -> httpx.Response:
        body = {"model": AUTO, "messages": [{"role": "user", "content": text}]}
        return httpx.post(f"{self.listener}/v1/chat/completions", json=body, timeout=30)

    def alive_workers(self, needle: str) -> list[psutil.Process]:
        """The frontend's descendant processes whose command line contains ``needle``."""
        found = []
        for child in psutil.Process(self.served.process.pid).children(recursive=True):
            try:
                if any(needle in part for part in child.cmdline()):
                    found.append(child)
            except psutil.Error:
                continue
        return found


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, StubServer]]:
    folder = tmp_path_factory.mktemp("reload-router")
    scripts = Path(tempfile.mkdtemp(prefix="vsrl-", dir="/tmp"))
    stub = StubServer()
    [port] = free_ports(1)
    served = ServedRouter(
        folder,
        router_document(stub.stub.endpoint, port),
        {
            "VLLM_SRUN_COMMAND": " ".join(worker_command(scripts)),
            "VLLM_SRUN_DIR": str(scripts),
            "VLLM_SRUN_READY_TIMEOUT": "60s",
        },
    )
    try:
        served.wait_ready()
        yield Served(served, scripts, port), stub
    finally:
        served.close()
        stub.stop()
        shutil.rmtree(scripts, ignore_errors=True)


def test_t21_the_configuration_reads_back_with_its_etag_and_hashes(router) -> None:
    served, _ = router
    read = served.mgmt.get("/api/v1/config")
    assert read.status_code == 200
    data = served.served.config.read_bytes()
    assert read.headers["etag"] == f'"{hashlib.sha256(data).hexdigest()}"'
    assert read.json()["listeners"][0]["name"] == "chat"
    assert read.headers["x-vsr-config-version"] == "1"
    found = served.hash()
    assert found["source_config_hash"] == "sha256:" + hashlib.sha256(data).hexdigest()
    assert found["activation_status"] == "active"
    assert found["active_runtime_hash"] == found["generated_runtime_hash"]
    assert found["generated_runtime_hash"].startswith("sha256:")
    assert found["active_version"] == 1


def test_t21_a_new_decision_is_active_when_apply_returns(router) -> None:
    served, stub = router
    first = served.pids("primary")
    before = served.chat("an invoice question")
    assert before.status_code == 200 and "x-vsr-selected-decision" not in before.headers
    assert before.headers["x-vsr-selected-model"] == "a-chat"  # the default model
    done = served.apply(router_document(stub.stub.endpoint, served.port, billing=True))
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed["applied"] is True
    assert printed["plan"]["valid"] is True and printed["plan"]["changed"] is True
    assert printed["result"]["status"] == "success"
    assert printed["result"]["activation_status"] == "active"
    assert printed["result"]["config_version"] == 2
    answer = served.chat("an invoice question")
    assert answer.status_code == 200
    assert answer.headers["x-vsr-selected-decision"] == "billing"
    assert answer.headers["x-vsr-selected-model"] == "b-chat"
    # Routes changed, the worker did not: same process, no new one.
    assert served.pids("primary") == first
    assert [p.pid for p in served.alive_workers("primary")] != []
    # The file holds what was applied; applying it again changes nothing.
    again = served.apply(router_document(stub.stub.endpoint, served.port, billing=True))
    assert json.loads(again.stdout)["applied"] is False
    assert json.loads(again.stdout)["reason"] == "unchanged"


def test_t21_a_slow_new_deployment_is_pending_while_the_old_routes_serve(router) -> None:
    served, stub = router
    served.script("second", health="loading")
    new = router_document(
        stub.stub.endpoint, served.port, billing=True, embedder="second", artifact="fake/second"
    )
    etag = served.mgmt.get("/api/v1/config").headers["etag"]
    started = time.monotonic()
    answer = served.mgmt.put(
        "/api/v1/config",
        json={"yaml": yaml.safe_dump(served.served.as_served(new))},
        headers={"If-Match": etag},
    )
    assert answer.status_code == 202, answer.text
    assert 4.5 <= time.monotonic() - started < 30
    body = answer.json()
    assert body["status"] == "accepted" and body["activation_status"] == "pending"
    assert "Poll /api/v1/config/hash until activation_status is active" in body["message"]
    # The old generation keeps serving; /ready stays 200; both generations are listed.
    assert served.served.ready_status() == 200
    assert served.chat("an invoice question").headers["x-vsr-selected-decision"] == "billing"
    found = served.hash()
    assert found["activation_status"] == "pending"
    assert found["activation"]["status"] == "pending"
    inventory = served.mgmt.get("/api/v1/inventory/model-runtime").json()["deployments"]
    roles = {(d["name"], d["generation"]) for d in inventory}
    assert roles == {("primary", "active"), ("second", "preparing")}
    status = served.mgmt.get("/startup-status").json()
    assert status["phase"] == "ready" and status["ready_models"] == 1
    assert status["preparing"]["config_version"] == 3
    assert status["preparing"]["pending_models"] == ["second"]
    old_pids = served.pids("primary")
    served.script("second", health="ready")
    found = served.wait_status("active")
    assert found["active_version"] == 3
    assert served.chat("debug this").headers["x-vsr-selected-decision"] == "coding"
    # primary is no longer in use: its worker stops once idle, and its series go.
    wait_for(lambda: not any(psutil.pid_exists(p) for p in old_pids), 30, "primary to exit")
    text = served.served.metrics()
    assert metric(text, "vsr_model_runtime_requests_total", deployment="second") >= 0
    assert 'deployment="primary"' not in text


def test_t21_a_failing_artifact_is_rejected_and_the_old_generation_serves(router) -> None:
    served, stub = router
    before = served.hash()
    new = router_document(
        stub.stub.endpoint, served.port, billing=True, embedder="third", artifact="broken/model"
    )
    done = served.apply(new)
    found = served.wait_status("failed", 60)
    rejection = found["last_rejection"]
    assert rejection["status"] == "failed"
    assert rejection["document_hash"] == found["generated_runtime_hash"]
    assert "third" in rejection["error"] and "cannot load broken/model" in rejection["error"]
    assert rejection["reasons"][0]["code"] == "ACTIVATION_FAILED"
    assert found["active_runtime_hash"] == before["active_runtime_hash"]
    if done.returncode:  # failed within the 5 s the PUT waits
        assert "Router management API returned HTTP 503: activation_failed" in done.stderr
    else:
        assert json.loads(done.stdout)["result"]["activation_status"] == "pending"
    assert served.chat("an invoice question").headers["x-vsr-selected-decision"] == "billing"
    assert served.alive_workers("third") == []
    assert served.served.ready_status() == 200


def test_t21_a_listener_change_needs_a_restart_and_a_stale_etag_is_refused(router) -> None:
    served, stub = router
    [other] = free_ports(1)
    moved = served.apply(
        router_document(
            stub.stub.endpoint, other, billing=True, embedder="second", artifact="fake/second"
        )
    )
    assert moved.returncode == 1
    planned = served.mgmt.post(
        "/api/v1/config/plan",
        json={
            "yaml": yaml.safe_dump(
                served.served.as_served(
                    router_document(
                        stub.stub.endpoint,
                        other,
                        billing=True,
                        embedder="second",
                        artifact="fake/second",
                    )
                )
            )
        },
    ).json()
    assert planned["valid"] is True and planned["restart_required"] is True
    assert planned["reasons"] == [
        {
            "code": "RESTART_REQUIRED",
            "path": "listeners.chat.port",
            "message": f"changing it needs a restart ({served.port} -> {other})",
        }
    ]
    assert moved.stderr.startswith("Router management API returned HTTP 409: RESTART_REQUIRED: ")
    assert f"listeners.chat.port: changing it needs a restart ({served.port} -> {other})" in (
        moved.stderr
    )
    text = yaml.safe_dump(served.served.as_served(router_document(stub.stub.endpoint, served.port)))
    missing = served.mgmt.put("/api/v1/config", json={"yaml": text})
    assert missing.status_code == 428
    assert missing.json()["error"]["code"] == "PRECONDITION_REQUIRED"
    stale = served.mgmt.put("/api/v1/config", json={"yaml": text}, headers={"If-Match": '"0123"'})
    assert stale.status_code == 412
    assert stale.json()["error"] == {
        "code": "CONFIG_CHANGED",
        "message": "The router config changed since it was read; refetch and retry with the "
        "latest ETag",
        "timestamp": stale.json()["error"]["timestamp"],
    }
    assert stale.headers["etag"] == served.mgmt.get("/api/v1/config").headers["etag"]
    bad = served.mgmt.post("/api/v1/config/plan", json={"yaml": "listeners: 3\n"})
    assert bad.status_code == 400
    assert bad.json()["error"]["code"] == "INVALID_CONFIG"
    assert bad.json()["error"]["reasons"][0]["path"].startswith("listeners")


# -- Engine mode under load ----------------------------------------------------------------------


def embedder(view: Served) -> dict[str, Any]:
    """The ``embedder`` deployment's inventory entry."""
    found = view.mgmt.get("/api/v1/inventory/model-runtime").json()["deployments"]
    [entry] = [d for d in found if d["name"] == "embedder"]
    return entry


def engine_document(
    port: int, replicas: int, *, keys: list[str] | None = None, policy: dict[str, Any] | None = None
) -> dict[str, Any]:
    deployment: dict[str, Any] = {
        "provider": "model_runtime",
        "artifact": "fake/embedder",
        "replicas": [{"device": "cpu"} for _ in range(replicas)],
    }
    if policy is not None:
        deployment["input"] = policy
    listener: dict[str, Any] = {
        "name": "http",
        "address": "127.0.0.1",
        "port": port,
        "runtime": {"models": ["fake/embedder"]},
    }
    if keys:
        listener["api_keys"] = keys
    return {
        "global": {"model_catalog": {"deployments": {"embedder": deployment}}},
        "listeners": [listener],
    }


def test_t21_engine_mode_scales_and_changes_policy_under_load_with_only_200s(
    tmp_path: Path,
) -> None:
    scripts = Path(tempfile.mkdtemp(prefix="vsrl-", dir="/tmp"))
    [port] = free_ports(1)
    served = ServedRouter(
        tmp_path,
        engine_document(port, 3),
        {
            "VLLM_SRUN_COMMAND": " ".join(worker_command(scripts)),
            "VLLM_SRUN_DIR": str(scripts),
        },
        serve_args=("-e",),
    )
    stop = threading.Event()
    statuses: Counter[int] = Counter()

    def client() -> None:
        with httpx.Client(timeout=30) as http:
            while not stop.is_set():
                answer = http.post(
                    f"http://127.0.0.1:{port}/v1/embeddings",
                    json={"model": "fake/embedder", "input": ["a text"]},
                )
                statuses[answer.status_code] += 1

    clients = [threading.Thread(target=client) for _ in range(6)]
    try:
        served.wait_ready()
        view = Served(served, scripts, port)
        first = sorted(view.pids("embedder"))
        assert len(first) == 3
        entry = embedder(view)
        replica_ids = {r["id"] for r in entry["replicas"]}
        assert len(replica_ids) == 3
        for thread in clients:
            thread.start()
        wait_for(lambda: sum(statuses.values()) > 30, 30, "load to start")
        counted = {
            rid: metric(
                served.metrics(),
                "vsr_model_runtime_replica_requests_total",
                replica=rid,
                outcome="ok",
            )
            for rid in replica_ids
        }
        down = view.apply(engine_document(port, 2))
        assert down.returncode == 0, down.stderr
        assert json.loads(down.stdout)["result"]["activation_status"] == "active"
        # One worker retired: it exits once it answered its last request; two stay.
        wait_for(lambda: sum(psutil.pid_exists(p) for p in first) == 2, 30, "one worker to retire")
        retired = [p for p in first if not psutil.pid_exists(p)]
        kept = [p for p in first if psutil.pid_exists(p)]
        # Its replica's series are deleted, not left at their last value.
        entry = embedder(view)
        ids = {r["id"] for r in entry["replicas"]}
        assert len(ids) == 2 and ids < replica_ids

        def gone() -> bool:
            found = {
                labels["replica"]
                for labels in label_sets(
                    served.metrics(), "vsr_model_runtime_replica_requests_total"
                )
                if labels["deployment"] == "embedder"
            }
            return found == ids

        wait_for(gone, 30, "the retired replica's series to go")
        # The kept replicas' series go on counting from where they were.
        text = served.metrics()
        for rid in ids:
            kept_count = metric(
                text, "vsr_model_runtime_replica_requests_total", replica=rid, outcome="ok"
            )
            assert kept_count >= counted[rid] > 0
        up = view.apply(engine_document(port, 3))
        assert up.returncode == 0, up.stderr
        policy = view.apply(
            engine_document(port, 3, policy={"max_tokens": 64, "overflow": "truncate"})
        )
        assert policy.returncode == 0, policy.stderr
        wait_for(lambda: sum(statuses.values()) > 60, 30, "load after the applies")
        entry = embedder(view)
        assert entry["desired_replicas"] == 3 and entry["config_version"] == 4
        # The two kept workers served every generation; the policy changed no worker.
        now = view.pids("embedder")
        assert all(psutil.pid_exists(p) for p in kept)
        assert len([p for p in now if psutil.pid_exists(p)]) == 3
        assert retired and not any(psutil.pid_exists(p) for p in retired)
        # A grant change is live too: the listener now asks for a key.
        keyed = view.apply(
            engine_document(
                port, 3, keys=["k-1"], policy={"max_tokens": 64, "overflow": "truncate"}
            )
        )
        assert keyed.returncode == 0, keyed.stderr
        stop.set()
        for thread in clients:
            thread.join(30)
        refused = httpx.post(
            f"http://127.0.0.1:{port}/v1/embeddings",
            json={"model": "fake/embedder", "input": ["a text"]},
        )
        assert refused.status_code == 401
        # Only the clients stopped by the key change may have seen a 401; nothing else.
        assert set(statuses) <= {200, 401}, statuses
        assert statuses[200] > 60
    finally:
        stop.set()
        for thread in clients:
            if thread.is_alive():
                thread.join(30)
        served.close()
        shutil.rmtree(scripts, ignore_errors=True)


def test_t21_a_long_request_finishes_on_the_worker_a_reload_replaced(tmp_path: Path) -> None:
    """A 10 s request admitted before the apply is answered by the worker it reached;
    that worker is stopped only afterwards (the stand-in exits at once on SIGTERM, so
    an early stop would break the request)."""
    scripts = Path(tempfile.mkdtemp(prefix="vsrl-", dir="/tmp"))
    [port] = free_ports(1)
    old = engine_document(port, 1)
    served = ServedRouter(
        tmp_path,
        old,
        {"VLLM_SRUN_COMMAND": " ".join(worker_command(scripts)), "VLLM_SRUN_DIR": str(scripts)},
        serve_args=("-e",),
    )
    answers: list[httpx.Response] = []
    try:
        served.wait_ready()
        view = Served(served, scripts, port)
        [first] = view.pids("embedder")
        view.script("embedder", embeddings={"mode": "stall", "seconds": 10})
        asked = time.monotonic()

        def long_request() -> None:
            answers.append(
                httpx.post(
                    f"http://127.0.0.1:{port}/v1/embeddings",
                    json={"model": "fake/embedder", "input": ["a long one"]},
                    timeout=60,
                )
            )

        thread = threading.Thread(target=long_request)
        thread.start()
        log = scripts / "embedder.log"
        wait_for(lambda: log.exists() and "a long one" in log.read_text(), 10, "the request")
        new = engine_document(port, 1)
        new["global"]["model_catalog"]["deployments"]["embedder"]["artifact"] = "fake/other"
        new["listeners"][0]["runtime"]["models"] = ["fake/other"]
        done = view.apply(new)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["result"]["activation_status"] == "active"
        assert time.monotonic() - asked < 9  # active while the long request still runs
        assert psutil.pid_exists(first) and thread.is_alive()
        thread.join(30)
        [answer] = answers
        assert answer.status_code == 200, answer.text
        assert time.monotonic() - asked >= 9.5
        wait_for(lambda: not psutil.pid_exists(first), 20, "the replaced worker to exit")
    finally:
        served.close()
        shutil.rmtree(scripts, ignore_errors=True)
