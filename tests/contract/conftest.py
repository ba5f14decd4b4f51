"""One real ``vllm-srun serve`` process for the contract suite: the real models (MiniLM and
Rampart) and the tiny fixture packages of every head and of decoders of each architecture
and readout. SmolLM2's answers are held to the same answer check in
tests/families/test_smollm2.py, on the model that module loads: a second load here (its
load-time batch-invariance probe runs the 135M model 134 times) would cost minutes of
``make test`` for wire shapes the fixture decoders already cover.

Every decision answer a test gets through :meth:`Router.call` is also held to the
upstream router's answer check (:mod:`.answer_checks`)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ..fixtures import write_decoder, write_task_package
from . import go
from .answer_checks import DECISION_PATHS, check_exchange

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
RAMPART = "arcjet/rampart-pii"
FIXTURE_HEADS = ("sequence", "scores", "token", "pooled", "relevance")
FIXTURE_DECODERS: dict[str, tuple[str, dict[str, Any] | None]] = {
    # name: (architecture, calibration.json); "decoder" keeps its default readout
    "decoder": ("qwen3", None),
    "decoder-llama": ("llama", None),
    "decoder-gpt2": ("gpt2", None),
    "decoder-option-sum": ("qwen3", {"temperature": {}, "readout": "option_sum"}),
    "decoder-option-mean": ("qwen3", {"temperature": {}, "readout": "option_mean"}),
    "decoder-letters-cf": ("qwen3", {"temperature": {}, "readout": "letters_cf"}),
}
START_SECONDS = 300
"""The bound on the server's start (a few seconds a model on an idle two-core machine)."""


def real_models() -> tuple[str, ...]:
    """The real models the contract server serves."""
    return (MINILM, RAMPART)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Router:
    """The server as the router calls it: every body decoded by Go's rules.

    ``exchanges`` keeps each ``(method, path, status, body)`` so a test can also
    check the whole run. Each 200 answer of a decisions route (and each decisions
    task of a bundle) must also pass the router's answer check; ``decision_answers``
    keeps ``(route, model, question type)`` of every answer checked.
    """

    def __init__(self, base_url: str, process: subprocess.Popen[bytes], log: Path) -> None:
        self.http = httpx.Client(base_url=base_url, timeout=120)
        self.process = process
        self.log = log
        self.exchanges: list[tuple[str, str, int, Any]] = []
        self.decision_answers: list[tuple[str, str, str]] = []

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def call(
        self,
        method: str,
        path: str,
        expect: go.GoType,
        body: Any = None,
        timeout: float | None = None,
    ) -> tuple[httpx.Response, Any]:
        """Send ``body``; the response and its value, after asserting it decodes as
        ``expect`` (any status but 200: as the contract's error response). ``timeout``
        bounds the wait in seconds (the client's 120 where not given)."""
        from .wire23 import ErrorResponse

        wait = httpx.USE_CLIENT_DEFAULT if timeout is None else timeout
        response = self.http.request(method, path, json=body, timeout=wait)
        value = go.parse(response.text)
        kind = expect if response.status_code == 200 else ErrorResponse
        if path == "/health" and response.status_code == 503:
            kind = expect
        problems = kind.problems(value)
        assert not problems, f"{method} {path} -> {response.status_code}: {problems[:5]}"
        self.exchanges.append((method, path, response.status_code, value))
        if response.status_code == 200 and path in DECISION_PATHS:
            report = check_exchange(path, body, value)
            assert not report.violations, (
                f"{method} {path}: the router's answer check refuses "
                f"{len(report.violations)} answer rule(s):\n" + "\n".join(report.violations)
            )
            self.decision_answers += report.checked
        return response, value

    def close(self) -> None:
        self.http.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


@pytest.fixture(scope="session")
def contract_packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("contract-packages")
    packages = {head: write_task_package(root, "bert", head) for head in FIXTURE_HEADS}
    for name, (architecture, calibration) in FIXTURE_DECODERS.items():
        packages[name] = write_decoder(
            root, architecture, seed=3, calibration=calibration, name=name
        )
    return packages


@pytest.fixture(scope="session")
def router(
    contract_packages: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Router]:
    folder = tmp_path_factory.mktemp("contract-server")
    lines = ["models:", *(f"  - model: {name}" for name in real_models())]
    for name, path in contract_packages.items():
        lines += [f"  - model: {path}", f"    name: {name}"]
    models = folder / "models.yaml"
    models.write_text("\n".join(lines) + "\n")
    port = _free_port()
    script = Path(sys.executable).with_name("vllm-srun")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "vllm_srun"]
    command += ["serve", "--models", str(models), "--offline", "--port", str(port)]
    command += ["--log-level", "warning"]
    log = folder / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ}
        )
    server = Router(f"http://127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + START_SECONDS
    health = "no answer"
    try:
        while True:
            assert process.poll() is None, f"vllm-srun serve exited:\n{server.output()}"
            try:
                response = server.http.get("/health", timeout=10)
                if response.status_code == 200:
                    break
                health = response.text
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (
                f"not ready in {START_SECONDS} s; /health: {health}\n{server.output()}"
            )
            time.sleep(0.2)
        yield server
    finally:
        server.close()
