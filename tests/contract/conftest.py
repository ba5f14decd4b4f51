"""One real ``vllm-srun serve`` process for the contract suite: the two real models
(MiniLM, Rampart) and the tiny fixture packages of every head and a decoder."""

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

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
RAMPART = "arcjet/rampart-pii"
FIXTURE_HEADS = ("sequence", "scores", "token", "pooled", "relevance")
START_SECONDS = 240


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Router:
    """The server as the router calls it: every body decoded by Go's rules.

    ``exchanges`` keeps each ``(method, path, status, body)`` so a test can also
    check the whole run.
    """

    def __init__(self, base_url: str, process: subprocess.Popen[bytes], log: Path) -> None:
        self.http = httpx.Client(base_url=base_url, timeout=120)
        self.process = process
        self.log = log
        self.exchanges: list[tuple[str, str, int, Any]] = []

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def call(
        self, method: str, path: str, expect: go.GoType, body: Any = None
    ) -> tuple[httpx.Response, Any]:
        """Send ``body``; the response and its value, after asserting it decodes as
        ``expect`` (any status but 200: as the contract's error response)."""
        from .wire23 import ErrorResponse

        response = self.http.request(method, path, json=body)
        value = go.parse(response.text)
        kind = expect if response.status_code == 200 else ErrorResponse
        if path == "/health" and response.status_code == 503:
            kind = expect
        problems = kind.problems(value)
        assert not problems, f"{method} {path} -> {response.status_code}: {problems[:5]}"
        self.exchanges.append((method, path, response.status_code, value))
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
    packages["decoder"] = write_decoder(root, "qwen3", seed=3)
    return packages


@pytest.fixture(scope="session")
def router(
    contract_packages: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Router]:
    folder = tmp_path_factory.mktemp("contract-server")
    lines = ["models:", f"  - model: {MINILM}", f"  - model: {RAMPART}"]
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
    try:
        while True:
            assert process.poll() is None, f"vllm-srun serve exited:\n{server.output()}"
            try:
                if server.http.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"not ready in time:\n{server.output()}"
            time.sleep(0.2)
        yield server
    finally:
        server.close()
