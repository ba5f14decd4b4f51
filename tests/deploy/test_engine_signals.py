"""The real ``vllm-sr serve MODEL`` process with the fake container CLI: a stop signal is
forwarded once to the container, which stops, and ``vllm-sr`` exits 0."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import FakeRuntime

WAIT_S = 60.0
"""Bound of every wait on the process (its start imports the frontend)."""


def read_until(process: subprocess.Popen[str], text: str, timeout: float) -> list[str]:
    """Lines of ``process``'s stdout up to the one holding ``text``.

    Raises:
        AssertionError: ``timeout`` seconds passed, or the output ended, first.
    """
    assert process.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no {text!r} within {timeout} s: {lines}"
            if not selector.select(left):
                continue
            line = process.stdout.readline()
            assert line, f"stdout ended before {text!r}: {lines}"
            lines.append(line)
            if text in line:
                return lines


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], FakeRuntime]]:
    """``vllm-sr serve vllm-sr/d3-edge`` running its (fake) container in the foreground."""
    fake = FakeRuntime(tmp_path)
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("FAKE_", "HF_", "CONTAINER_RUNTIME", "VLLM_SR_"))
    }
    env.update(fake.env(VLLM_SR_ENGINE_CACHE_DIR=str(tmp_path / "cache")))
    process = subprocess.Popen(
        [sys.executable, "-m", "vllm_sr", "serve", "vllm-sr/d3-edge"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        read_until(process, "fake-container: running", WAIT_S)
        yield process, fake
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=WAIT_S)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_is_forwarded_once_and_exits_0(engine, sig):
    process, fake = engine
    process.send_signal(sig)
    assert process.wait(timeout=WAIT_S) == 0
    assert fake.entries()[-1] == {"stopped": sig.name}
    runs = [call for call in fake.calls() if call[1] == "run"]
    assert len(runs) == 1
    assert process.stderr is not None
    err = process.stderr.read()
    assert f"vllm-sr: stopping the engine container ({sig.name})" in err
    assert err.count("stopping the engine container") == 1


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for the child")
def test_a_container_that_dies_on_its_own_is_not_a_requested_stop(engine):
    process, fake = engine
    container = [e for e in fake.entries() if "argv" in e and e["argv"][1] == "run"]
    assert len(container) == 1
    # The container CLI is the process's only child: kill it as a crash would.
    children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
    assert len(children) == 1
    os.kill(int(children[0]), signal.SIGKILL)
    assert process.wait(timeout=WAIT_S) == 128 + signal.SIGKILL
