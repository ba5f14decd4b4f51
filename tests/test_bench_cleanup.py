"""A bench run that is interrupted leaves nothing running: each bench script that starts
processes (bench/server.py's ``Server``, bench/frontend_section.py's ``Frontend``,
bench/router_section.py's ``Process``, bench/startup.py's ``serve_once``) is run in a
child Python process, which gets SIGTERM (``timeout``'s signal) or SIGHUP (a closed
terminal) once what it started runs; the child exits 128 + the signal and every process
it started is gone."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from .fixtures import write_task_package
from .frontend.conftest import FAKE_COMMAND

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
VLLM_SRUN = str(Path(sys.executable).with_name("vllm-srun"))

PRELUDE = f"""
import sys, tempfile
from pathlib import Path
sys.path.insert(0, {str(ROOT / "bench")!r})
"""

CASES = {
    "server": """
from server import Server, free_port
Server(Path(PACKAGE), free_port(), 1, []).wait_ready(120)
""",
    "frontend": """
from frontend_section import Frontend
config = "global:\\n  router: {enabled: false}\\n"
Frontend("cleanup", config, {"VLLM_SRUN_COMMAND": FAKE, "FAKE_WORKER_MODE": "never"}, 1)
time.sleep(120)
""",
    "router_process": """
from router_section import Process
from server import free_port
port = free_port()
Process("cleanup", [VLLM_SRUN, "serve", PACKAGE, "--port", str(port)]).wait_http(
    f"http://127.0.0.1:{port}/health", 120
)
""",
    "startup": """
from startup import serve_once
from server import free_port
serve_once(VLLM_SRUN, tempfile.mkdtemp(prefix="vsr-cleanup-"), free_port())
""",
}


VLLM_SR = str(Path(sys.executable).with_name("vllm-sr"))


def _runs(procs: list[psutil.Process], command: str, *also: str) -> bool:
    """One of ``procs`` runs ``command`` (a console script: Python and its path) with
    every argument of ``also``."""
    return any(command in _argv(p)[:2] and set(also) <= set(_argv(p)) for p in procs)


def _serving(procs: list[psutil.Process]) -> bool:
    return _runs(procs, VLLM_SRUN, "serve")


def _frontend_and_worker(procs: list[psutil.Process]) -> bool:
    """``vllm-sr serve`` and one of its workers (the fake worker, on ``--uds``)."""
    return _runs(procs, VLLM_SR, "serve") and _runs(procs, FAKE_COMMAND[1], "--uds")


STARTED: dict[str, Callable[[list[psutil.Process]], bool]] = {
    "server": _serving,
    "frontend": _frontend_and_worker,
    "router_process": _serving,
    "startup": _serving,
}


def _argv(proc: psutil.Process) -> list[str]:
    with contextlib.suppress(psutil.Error):
        return proc.cmdline()
    return []


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_task_package(tmp_path_factory.mktemp("bench-cleanup"), "bert", "pooled")


@pytest.fixture
def leftovers() -> Iterator[list[psutil.Process]]:
    """The processes a case saw started; whatever of them still runs is killed after it."""
    found: list[psutil.Process] = []
    yield found
    for proc in found:
        with contextlib.suppress(psutil.Error):
            proc.kill()


@pytest.mark.parametrize(
    ("case", "sig"),
    [
        ("server", signal.SIGTERM),
        ("frontend", signal.SIGTERM),
        ("frontend", signal.SIGHUP),
        ("router_process", signal.SIGTERM),
        ("startup", signal.SIGTERM),
    ],
)
def test_an_interrupted_bench_run_leaves_no_process(
    case: str, sig: signal.Signals, package: Path, leftovers: list[psutil.Process]
) -> None:
    code = (
        PRELUDE
        + f"import time\nPACKAGE = {str(package)!r}\nVLLM_SRUN = {VLLM_SRUN!r}\n"
        + f"FAKE = {' '.join(FAKE_COMMAND)!r}\n"
        + CASES[case]
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            if child.poll() is not None:
                assert child.stderr is not None
                raise AssertionError(f"the bench child ended: {child.stderr.read().decode()}")
            with contextlib.suppress(psutil.NoSuchProcess):
                leftovers[:] = psutil.Process(child.pid).children(recursive=True)
            if STARTED[case](leftovers):
                break
            assert time.monotonic() < deadline, f"{case}: nothing started within 60 s"
            time.sleep(0.05)
        child.send_signal(sig)
        assert child.wait(timeout=60) == 128 + sig
        _, alive = psutil.wait_procs(leftovers, timeout=10)
        assert [(p.pid, _argv(p)) for p in alive] == []
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
        assert child.stderr is not None
        child.stderr.close()
