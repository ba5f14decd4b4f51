"""SIGTERM on a real ``vllm-srun serve`` process: stop admitting, drain, exit 0."""

from __future__ import annotations

import concurrent.futures
import math
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import checked, wait_until

pytestmark = pytest.mark.slow

# Whole words of the fixture tokenizer's vocabulary: one token each.
WORDS = [
    *("the", "a", "an", "of", "to", "in", "and", "is", "was", "for", "on", "with", "as", "by"),
    *("at", "from", "it", "this", "that", "be", "are", "or", "not", "dana", "whitfield"),
    *("email", "phone", "street", "city", "new", "york", "london", "paris", "tokyo", "alice"),
    *("bob", "carol", "good", "bad", "great", "terrible", "love", "hate", "okay", "fine"),
    *("movie", "film"),
]
WORK_SECONDS = 3.0  # how long the queued work should take, measured on this machine


def vllm_srun() -> list[str]:
    script = Path(sys.executable).with_name("vllm-srun")
    return [str(script)] if script.exists() else [sys.executable, "-m", "vllm_srun"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def long_input(seed: int, words: int = 6000) -> dict:
    """A long text that runs as many windows (distinct per seed: no cache hit)."""
    rng = random.Random(seed)
    text = " ".join(rng.choice(WORDS) for _ in range(words))
    return {"model": "emb", "input": text, "options": {"overflow": "window"}}


def rows_seen(client: httpx.Client) -> float:
    """Rows forwarded plus rows queued: what the scheduler has admitted, less a forward."""
    seen = 0.0
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name in ("vllm_srun_batch_rows_sum", "vllm_srun_queue_rows"):
                seen += sample.value
    return seen


def test_sigterm_stops_admission_drains_the_queue_and_exits_0(packages, tmp_path):
    models = tmp_path / "models.yaml"
    models.write_text(f"models:\n  - model: {packages['pooled']}\n    name: emb\n")
    port = free_port()
    log = tmp_path / "serve.log"
    command = [
        *vllm_srun(),
        "serve",
        "--models",
        str(models),
        "--port",
        str(port),
        "--shutdown-grace-seconds",
        "10",
        "--max-num-seqs",
        "4",
        "--threads",
        "1",
        "--log-level",
        "warning",
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)

    def output() -> str:
        return log.read_text(errors="replace")[-3000:]

    client = checked(httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60))

    def ready() -> bool:
        assert process.poll() is None, f"vllm-srun serve exited early:\n{output()}"
        try:
            return client.get("/health").status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(ready, 120, "the server to be ready")
        started = time.perf_counter()
        first = client.post("/v1/embeddings", json=long_input(0))
        alone = time.perf_counter() - started
        assert first.status_code == 200, first.text
        windows = first.json()["data"][0]["input"]["windows"]
        assert windows > 100
        count = max(3, min(30, math.ceil(WORK_SECONDS / alone)))
        baseline = rows_seen(client)

        def send(seed: int) -> tuple[httpx.Response, float]:
            with checked(httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)) as own:
                response = own.post("/v1/embeddings", json=long_input(seed))
                return response, time.monotonic()

        with concurrent.futures.ThreadPoolExecutor(count) as pool:
            queued = [pool.submit(send, seed) for seed in range(1, count + 1)]
            # All admitted: more rows seen than all but one request could hold.
            wait_until(
                lambda: rows_seen(client) - baseline > (count - 1) * windows,
                30,
                "every request to be admitted",
            )
            process.send_signal(signal.SIGTERM)
            draining = False
            deadline = time.monotonic() + 5
            while not draining and time.monotonic() < deadline:
                health = client.get("/health")
                draining = health.status_code == 503
            refused = client.post("/v1/embeddings", json=long_input(10_000))
            probed = time.monotonic()
            answers = [future.result(60) for future in queued]

        assert draining, f"/health stayed {health.status_code} after SIGTERM"
        assert health.json()["status"] == "failed"
        assert health.json()["reason"] == "shutting down"
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"] == {
            "code": "not_ready",
            "message": "the server is shutting down; retry on another replica",
        }
        for response, _ in answers:
            assert response.status_code == 200, response.text
            [item] = response.json()["data"]
            assert "error" not in item, item
            assert item["input"]["windows"] == windows
        assert max(at for _, at in answers) > probed, "the work ended before the probes"
        assert process.wait(30) == 0, output()
    finally:
        client.close()
        if process.poll() is None:
            process.kill()
            process.wait(10)
