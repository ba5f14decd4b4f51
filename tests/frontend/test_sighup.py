"""SIGHUP reloads, never kills: a real ``vllm-sr serve -e`` on the misbehaving worker
command. With ``--config`` it applies the file as ``vllm-sr config apply`` would (nothing
when unchanged; a new API key at once, on the same worker; a port change refused); without
it, the signal is logged and ignored."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest
import yaml

from .conftest import FAKE_COMMAND
from .test_cli import fake_served
from .test_serve import Served, wait_for

pytestmark = pytest.mark.slow

SYSTEMONE = {
    "model": "fake/model",
    "state": "a text",
    "questions": {"q": {"type": "choice", "criteria": {"a": "A", "b": "B"}}},
}


def hang_up(server: Served, line: str) -> None:
    """Send SIGHUP and wait for ``line`` in the log (the outcome of that reload)."""
    seen = server.err.read_text().count(line)
    server.process.send_signal(signal.SIGHUP)

    def logged() -> bool:
        code = server.process.poll()
        assert code is None, f"vllm-sr exited ({code}) on SIGHUP:\n{server.output()}"
        return server.err.read_text().count(line) > seen

    wait_for(logged, 30, f"the log line {line!r}")


def test_sighup_applies_the_configuration_file(tmp_path: Path, rundir: Path) -> None:
    server = fake_served(tmp_path, rundir, "ready")
    config = (tmp_path / "config.yaml").resolve()
    try:
        server.wait_ready(30)
        [worker] = server.workers()
        document = yaml.safe_load(config.read_text())
        listener = document["listeners"][0]
        url = f"http://127.0.0.1:{listener['port'] + server.offset}/v1/systemone"
        assert httpx.post(url, json=SYSTEMONE, timeout=10).status_code == 200

        hang_up(
            server,
            f" INFO vllm_sr.reload: SIGHUP: {config} is unchanged; config version 1 keeps "
            "serving\n",
        )

        listener["api_keys"] = ["k-1"]
        config.write_text(yaml.safe_dump(document, sort_keys=False))
        hang_up(
            server,
            f" INFO vllm_sr.reload: SIGHUP: {config} applied: config version 2 is active\n",
        )
        assert httpx.post(url, json=SYSTEMONE, timeout=10).status_code == 401
        keyed = httpx.post(url, json=SYSTEMONE, headers={"authorization": "Bearer k-1"})
        assert keyed.status_code == 200
        assert [p.pid for p in server.workers()] == [worker.pid]  # the same worker serves

        bound = listener["port"] + server.offset
        listener["port"] += 1
        config.write_text(yaml.safe_dump(document, sort_keys=False))
        hang_up(
            server,
            f" ERROR vllm_sr.reload: SIGHUP: {config} was not applied: RESTART_REQUIRED: this "
            "change needs a restart of vllm-sr: listeners.http.port: changing it needs a "
            f"restart ({bound} -> {bound + 1}); config version 2 keeps serving\n",
        )
        keyed = httpx.post(url, json=SYSTEMONE, headers={"authorization": "Bearer k-1"})
        assert keyed.status_code == 200

        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(30) == 0, server.output()
    finally:
        server.close()


def test_sighup_without_a_configuration_file_is_ignored(tmp_path: Path, rundir: Path) -> None:
    env = {
        "VLLM_SRUN_DIR": str(rundir),
        "VLLM_SRUN_COMMAND": " ".join(FAKE_COMMAND),
        "FAKE_WORKER_MODE": "ready",
    }
    server = Served(tmp_path, [], env)
    try:
        server.wait_ready(30)
        [worker] = server.workers()
        hang_up(
            server,
            " INFO vllm_sr.reload: SIGHUP ignored: this frontend was started without "
            "--config, so there is no configuration file to reload; start it with --config "
            "FILE to reload on SIGHUP\n",
        )
        ready = server.get("/ready")
        assert ready is not None and ready.status_code == 200
        assert [p.pid for p in server.workers()] == [worker.pid]
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(30) == 0, server.output()
    finally:
        server.close()
