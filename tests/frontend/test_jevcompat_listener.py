"""Acceptance: the Jev conformance suite (``jevcompat``) against a frontend listener.

``vllm-sr serve -e sentence-transformers/all-MiniLM-L6-v2 --systemone-schema jev`` starts
one managed ``vllm-srun`` worker (the built-in MiniLM from its installed mirror,
``--offline``) whose System One routes answer in TypeSafe's Jev schema; its listener
publishes MiniLM behind an API key. ``jevcompat.runner.run`` then sends every case of
the suite to the listener, as a Jev client would (``model: "jev-latest"``, the key as
``Authorization: Bearer``, then missing and wrong), and the listener must be conformant:
no MUST and no SHOULD failed, authentication tested and passed.

It exercises both sides: the runtime's Jev answers and 422s, and the frontend's alias,
error shapes, 401 and model list. A failure lists every failed requirement with its
findings and the exchange that shows it.
"""

from __future__ import annotations

import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from jevcompat import runner as jevcompat_runner

from ..jevcompat_report import failures
from .conftest import free_ports
from .test_serve import VLLM_SRUN, Served

pytestmark = pytest.mark.slow

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
KEY = "jev-acceptance-key"

REQUEST_TIMEOUT = 120.0
"""jevcompat's wait for one answer (its default): MiniLM answers 255 options on 2 cores
in well under that."""

READY_TIMEOUT = 180.0
"""How long MiniLM may take to load (the built-in MiniLM tests give it 120 s)."""


def config_file(folder: Path, port: int) -> Path:
    """A listener with an API key that publishes MiniLM on the System One routes (the
    deployment itself comes from MODEL and ``--systemone-schema``)."""
    path = folder / "config.yaml"
    path.write_text(
        f"""
listeners:
  - name: jev
    address: 127.0.0.1
    port: {port}
    api_keys: [{KEY}]
    systemone: {{models: [{MINILM}]}}
"""
    )
    return path


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[str, Served]]:
    [port] = free_ports(1)
    rundir = Path(tempfile.mkdtemp(prefix="vsrt-", dir="/tmp"))
    server = Served(
        tmp_path,
        [
            MINILM,
            "--systemone-schema",
            "jev",
            "--offline",
            "--config",
            str(config_file(tmp_path, port)),
        ],
        {"VLLM_SRUN_DIR": str(rundir), "VLLM_SRUN_COMMAND": VLLM_SRUN},
    )
    try:
        server.wait_ready(READY_TIMEOUT)
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.close()
        for path in rundir.iterdir():
            path.unlink()
        rundir.rmdir()


def test_the_listener_is_jev_conformant(listener: tuple[str, Served]) -> None:
    url, server = listener
    report = jevcompat_runner.run(url, key=KEY, model="jev-latest", timeout=REQUEST_TIMEOUT)
    explained = failures(report) + f"\n--- vllm-sr output ---\n{server.output()[-4000:]}"
    summary = report.summary()
    assert report.aborted is None, explained
    assert summary["MUST"]["failed"] == 0, explained
    assert summary["SHOULD"]["failed"] == 0, explained
    assert report.verdict == "conformant", explained
    by_id = {result.id: result for result in report.results}
    for requirement in ("auth.missing", "auth.invalid", "auth.bearer"):
        assert by_id[requirement].status == "pass", f"{requirement}\n{explained}"
        assert by_id[requirement].cases, f"{requirement} was not exercised\n{explained}"
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(30) == 0, server.output()
