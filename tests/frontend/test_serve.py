"""``vllm-sr serve -e`` as users run it, with real ``vllm-srun serve --uds`` workers on a
tiny fixture package: two managed replicas, the management API, ``vllm-sr instance``,
and no orphans when ``vllm-sr`` itself is killed with SIGKILL. (A worker killed during a
burst and restarted is ``test_end_to_end.py``.)"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from ..fixtures import write_task_package
from .conftest import port_offset, unshift_file

pytestmark = pytest.mark.slow

VLLM_SR = [sys.executable, "-m", "vllm_sr"]
VLLM_SRUN = str(Path(sys.executable).with_name("vllm-srun"))


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.1)


class Served:
    """A ``vllm-sr serve -e`` process, its output and its management API, on a free
    ``VLLM_SR_PORT_OFFSET``. The listeners of its ``--config`` bind the ports written
    there (the file gets them less the offset, which ``vllm-sr`` adds back), or with
    ``unshift=False`` those ports plus the offset."""

    def __init__(
        self, folder: Path, args: list[str], env: dict[str, str], *, unshift: bool = True
    ) -> None:
        self.offset = port_offset()
        if unshift and "--config" in args:
            unshift_file(Path(args[args.index("--config") + 1]), self.offset)
        self.env = {**os.environ, "VLLM_SR_PORT_OFFSET": str(self.offset), **env}
        self.out = folder / "stdout.txt"
        self.err = folder / "stderr.txt"
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.process = subprocess.Popen(
                [*VLLM_SR, "serve", "-e", *args], stdout=out, stderr=err, env=self.env
            )
        self.mgmt = httpx.Client(base_url=f"http://127.0.0.1:{8080 + self.offset}", timeout=5)
        self.metrics_url = f"http://127.0.0.1:{9190 + self.offset}/metrics"

    def output(self) -> str:
        return self.out.read_text() + self.err.read_text()[-6000:]

    def get(self, path: str) -> httpx.Response | None:
        assert self.process.poll() is None, f"vllm-sr exited:\n{self.output()}"
        try:
            return self.mgmt.get(path)
        except httpx.TransportError:
            return None

    def wait_ready(self, timeout: float = 90) -> None:
        def ready() -> bool:
            answer = self.get("/ready")
            return answer is not None and answer.status_code == 200

        wait_for(ready, timeout, "/ready 200")

    def inventory(self) -> dict[str, Any]:
        answer = self.get("/api/v1/inventory/model-runtime")
        assert answer is not None
        return answer.json()

    def workers(self) -> list[psutil.Process]:
        found = []
        for child in psutil.Process(self.process.pid).children():
            try:
                command = child.cmdline()
            except psutil.NoSuchProcess:  # a child that exited while it was listed
                continue
            if "serve" in command and "--uds" in command:
                found.append(child)
        return found

    def close(self) -> None:
        self.mgmt.close()
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_task_package(tmp_path_factory.mktemp("frontend-packages"), "bert", "pooled")


def config_file(folder: Path, package: Path) -> Path:
    path = folder / "config.yaml"
    path.write_text(
        f"""
global:
  model_catalog:
    deployments:
      primary:
        provider: model_runtime
        artifact: {package}
        public_name: tiny
        device: cpu
"""
    )
    return path


@pytest.fixture(scope="module")
def served(package: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``vllm-sr serve -e --config config.yaml -dp 2``: two managed workers."""
    import tempfile

    folder = tmp_path_factory.mktemp("frontend-serve")
    config = config_file(folder, package)
    rundir = Path(tempfile.mkdtemp(prefix="vsrt-", dir="/tmp"))
    server = Served(
        folder,
        ["--config", str(config), "-dp", "2"],
        {"VLLM_SRUN_DIR": str(rundir), "VLLM_SRUN_COMMAND": VLLM_SRUN},
    )
    server.config = config  # type: ignore[attr-defined]
    try:
        server.wait_ready()
        yield server
    finally:
        server.close()
        for path in rundir.iterdir():
            path.unlink()
        rundir.rmdir()


STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} "
"""The time a frontend's line starts with (as its log lines' ``asctime``)."""


def test_two_managed_workers_serve(served: Served) -> None:
    lines = served.out.read_text().splitlines()
    # The progress lines carry the time, and Engine mode names itself.
    assert re.fullmatch(
        STAMP + r"Waiting for Engine-managed model deployments, 0 of 1 ready: primary \(.*",
        lines[0],
    )
    assert re.fullmatch(
        STAMP
        + r"Engine-managed model deployments are ready \(1\)\. Starting engine services\.\.\.",
        lines[-1],
    )
    assert all(re.match(STAMP, line) for line in lines)
    workers = served.workers()
    assert len(workers) == 2
    for worker in workers:
        argv = worker.cmdline()
        assert argv[argv.index("--max-request-bytes") + 1] == "67108864"
        assert argv[argv.index("--max-bundle-tasks") + 1] == "1024"
        assert argv[argv.index("--threads") + 1] == "1"  # half of this machine's 2 cores
        assert argv[argv.index("--shutdown-grace-seconds") + 1] == "6"
    [entry] = served.inventory()["deployments"]
    assert entry["desired_replicas"] == 2 and entry["endpoint"] == "unix"
    assert entry["family"] == "task_heads" and "decisions" in entry["surfaces"]
    assert len({r["id"] for r in entry["replicas"]}) == 2
    status = served.get("/startup-status")
    assert status is not None and status.json()["phase"] == "ready"
    # Every worker's output is re-logged under its process name, its own log lines with
    # the frontend's time only, at their own level.
    relogged = [
        line for line in served.err.read_text().splitlines() if " vllm_sr.runtime: " in line
    ]
    process = f"primary-{entry['replicas'][0]['id']}"
    assert any(
        re.fullmatch(STAMP + rf"INFO vllm_sr\.runtime: {process}: vllm_srun[.\w]*: .+", line)
        for line in relogged
    )
    assert [line for line in relogged if len(re.findall(STAMP, line)) != 1] == []


def test_instance_status_and_models(served: Served) -> None:
    config = str(served.config)  # type: ignore[attr-defined]
    done = subprocess.run(
        [*VLLM_SR, "instance", "--config", config, "status"],
        capture_output=True,
        text=True,
        env=served.env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    # The file alone says Router mode; the instance was started with -e.
    assert status["desired_mode"] == "router" and status["observed_mode"] == "engine"
    assert status["active_deployment"] == "primary" and status["state"] == "ready"
    done = subprocess.run(
        [*VLLM_SR, "instance", "--config", config, "models"],
        capture_output=True,
        text=True,
        env=served.env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    models = json.loads(done.stdout)
    assert models == {"object": "list", "data": []}  # the file publishes nothing itself
    stopped = subprocess.run(
        [*VLLM_SR, "instance", "--config", config, "models"],
        capture_output=True,
        text=True,
        env={**served.env, "VLLM_SR_PORT_OFFSET": "1"},
        timeout=60,
        check=False,
    )
    assert stopped.returncode == 1
    assert "Instance model inventory is unavailable" in stopped.stderr


def test_no_orphans_when_vllm_sr_is_killed(package: Path, tmp_path: Path, rundir: Path) -> None:
    server = Served(
        tmp_path,
        ["--config", str(config_file(tmp_path, package))],
        {"VLLM_SRUN_DIR": str(rundir), "VLLM_SRUN_COMMAND": VLLM_SRUN},
    )
    try:
        wait_for(lambda: len(server.workers()) == 1, 30, "the worker started")
        [worker] = server.workers()
        server.process.send_signal(signal.SIGKILL)
        server.process.wait(10)
        _, alive = psutil.wait_procs([worker], timeout=20)
        assert not alive, f"worker {worker.pid} outlived vllm-sr"
    finally:
        server.close()
