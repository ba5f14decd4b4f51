"""Helpers of the frontend tests: the misbehaving worker command, a fake clock, plans."""

from __future__ import annotations

import asyncio
import copy
import random
import shutil
import socket
import sys
import tempfile
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_sr.config.schema import parse_config
from vllm_sr.workers.environment import RuntimeEnvironment
from vllm_sr.workers.plan import ReplicaPlan, plan_workers
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


MAX_TEST_OFFSET = 20000
"""The largest offset :func:`port_offset` picks: below the ephemeral ports (32768 and
up) that :func:`free_ports` hands out, so ``port - offset`` is still a port."""


def port_offset() -> int:
    """A ``VLLM_SR_PORT_OFFSET`` that puts 8080, 8899 and 9190 on free ports (below the
    ephemeral range: see :data:`MAX_TEST_OFFSET`)."""
    chooser = random.Random()
    for _ in range(100):
        offset = chooser.randrange(1000, MAX_TEST_OFFSET)
        try:
            for port in (8080 + offset, 8899 + offset, 9190 + offset):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return offset
    raise AssertionError("no free port offset")


def unshifted(document: dict[str, Any], offset: int) -> dict[str, Any]:
    """``document`` (a copy) with ``offset`` taken off each listener's port: ``vllm-sr``
    adds ``VLLM_SR_PORT_OFFSET`` back, so the listeners bind the (free) ports a test chose."""
    found = copy.deepcopy(document)
    for listener in found.get("listeners") or []:
        if isinstance(listener.get("port"), int):
            assert listener["port"] > offset, f"port {listener['port']} is below the offset"
            listener["port"] -= offset
    return found


def unshift_file(path: Path, offset: int) -> None:
    """:func:`unshifted` on the YAML file ``path``, in place."""
    document = yaml.safe_load(path.read_text()) or {}
    path.write_text(yaml.safe_dump(unshifted(document, offset), sort_keys=False))


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
