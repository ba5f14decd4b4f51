"""Helpers of the frontend tests: the misbehaving worker command, a fake clock, plans."""

from __future__ import annotations

import asyncio
import shutil
import socket
import sys
import tempfile
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from vllm_sr.config.schema import parse_config
from vllm_sr.workers.plan import ReplicaPlan, RuntimeEnvironment, plan_workers
from vllm_sr.workers.worker import Worker

FAKE_WORKER = Path(__file__).with_name("fake_worker.py")
FAKE_COMMAND = (sys.executable, str(FAKE_WORKER))


def run(coroutine: Coroutine[Any, Any, Any], timeout: float = 60) -> Any:
    """Run ``coroutine`` in a fresh event loop, bounded by ``timeout`` seconds."""

    async def bounded() -> Any:
        return await asyncio.wait_for(coroutine, timeout)

    return asyncio.run(bounded())


class FakeClock:
    """Time that passes only when the code under test sleeps (or a run is said to last).

    Attributes:
        sleeps: every sleep asked for, in seconds.
        run_lengths: how long each coming process life lasts, in seconds: the
            supervisor reads the clock once when a process starts and once when it
            ended, and the second read advances time by the next length.
    """

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []
        self.run_lengths: list[float] = []
        self._reads = 0

    def monotonic(self) -> float:
        self._reads += 1
        if self._reads % 2 == 0 and self.run_lengths:
            self.now += self.run_lengths.pop(0)
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        await asyncio.sleep(0)


def environment(directory: Path, command: tuple[str, ...] = FAKE_COMMAND, **fields: Any):
    """A worker environment in ``directory`` (keep it short: a socket path over 100 bytes
    moves to /tmp/vsr-*)."""
    return RuntimeEnvironment(
        command=command, directory=directory, cores=fields.pop("cores", 4), **fields
    )


def deployment_config(artifact: str = "fake/model", **fields: Any):
    body = {"provider": "model_runtime", "artifact": artifact, "device": "cpu", **fields}
    return parse_config({"global": {"model_catalog": {"deployments": {"primary": body}}}})


def one_worker(directory: Path, **fields: Any) -> tuple[ReplicaPlan, Worker]:
    """The plan and worker of a one-replica ``primary`` on the fake command."""
    config = deployment_config(**fields)
    [plan] = plan_workers(config, ["primary"], environment(directory))
    worker = Worker(
        deployment=plan.deployment,
        replica_id=plan.replica_id,
        managed=True,
        endpoint=plan.endpoint,
        served_name=plan.served_name,
        process=plan.process,
        device=plan.device,
    )
    return plan, worker


def fake_environ(mode: str, **more: str) -> dict[str, str]:
    import os

    return {**os.environ, "FAKE_WORKER_MODE": mode, **more}


def free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def rundir() -> Iterator[Path]:
    """A short private directory under /tmp for sockets and models files."""
    path = Path(tempfile.mkdtemp(prefix="vsrt-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
