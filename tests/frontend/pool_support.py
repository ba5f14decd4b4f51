"""Helpers of the data-plane tests: fake workers on Unix sockets, a fake clock, cards,
and a tiny health refresher for real ``vllm-srun serve --uds`` workers.

A fake worker is a plain ASGI app served by uvicorn in the test's own event loop, on a
socket the test binds and listens on before uvicorn starts (so no wait for "started"):
it answers as its :attr:`FakeWorker.mode` says (``ok``, ``500``, ``400``, ``429``,
``422``: its :attr:`FakeWorker.rejection`, ``hang``, ``broken``, ``garbage``) and records
what it received.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from vllm_sr.workers.client import ConnectFailed, ExchangeBroken, ExchangeTimedOut
from vllm_sr.workers.worker import Worker

SHA = "a" * 64

CARD: dict[str, Any] = {
    "id": "served",
    "object": "model",
    "created": 1,
    "owned_by": "vllm-srun",
    "family": "task_heads",
    "repo": "org/model",
    "revision": None,
    "model_sha256": SHA,
    "surfaces": ["embeddings", "decisions"],
    "heads": [{"name": "pooled", "kind": "pooled", "labels": []}],
    "embedding": {"dimensions": [32], "layers": [2], "modalities": ["text"]},
    "rerank": {"exits": [{"layer": 2, "dimension": 32}], "default": {"layer": 2, "dimension": 32}},
    "profile": "exact",
    "engine": "native",
    "accelerator": "cpu",
    "device": "cpu",
    "dtype": "auto",
    "ready": True,
    "status": "ready",
    "reason": None,
}


def card(**changes: Any) -> dict[str, Any]:
    """A ready card (a deep copy of :data:`CARD`) with ``changes``."""
    made = copy.deepcopy(CARD)
    made.update(changes)
    return made


def value(metrics: Any, name: str, **labels: str) -> float:
    """A sample's value on ``metrics``' registry (0 when the series does not exist)."""
    return float(metrics.registry.get_sample_value(name, labels) or 0.0)


def run(coroutine: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
    """Run a test's coroutine in a fresh event loop, bounded."""

    async def bounded() -> Any:
        return await asyncio.wait_for(coroutine, timeout)

    return asyncio.run(bounded())


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def short_socket(name: str) -> Path:
    """A socket path short enough for AF_UNIX (pytest's tmp paths may be too long)."""
    folder = Path(tempfile.mkdtemp(prefix="vsr-t-"))
    return folder / f"{name}.sock"


class FakeWorker:
    """A misbehaving-on-demand worker.

    Attributes:
        mode: how the next requests are answered.
        received: ``(path, body bytes)`` of every request, in order.
        gate: a ``hang`` request waits for it (set it to let them all answer 200).
        timing: the ``Server-Timing`` header it sends.
        rejection: the body of a ``422`` answer.
        listing: the Jev ``models`` list of its ``/v1/models`` (``None``: no such key).
        health_delays: seconds each next ``/health`` waits before it answers, in order
            (a slow probe); ``frozen``: ``/health`` answers only once ``gate`` is set (a
            stopped process).
    """

    def __init__(self, name: str, path: Path) -> None:
        self.name = name
        self.path = path
        self.endpoint = f"unix://{path}"
        self.mode = "ok"
        self.received: list[tuple[str, bytes]] = []
        self.gate = asyncio.Event()
        self.arrived = asyncio.Condition()
        self.timing = "parse;dur=1, tokenize;dur=2, queue;dur=3, forward;dur=4, total;dur=12"
        self.api_version = "2.3.0"
        self.rejection: Any = {"error": {"code": "invalid_request", "message": "SECRET"}}
        self.listing: list[Any] | None = None
        self.health_delays: list[float] = []
        self.frozen = False

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in self.received]

    async def wait_received(self, count: int) -> None:
        """Until ``count`` requests have arrived."""
        async with self.arrived:
            await self.arrived.wait_for(lambda: len(self.received) >= count)

    def worker(self, deployment: str = "dep", replica: str | None = None, **fields: Any) -> Worker:
        """A ready :class:`Worker` for this fake (card :func:`card`)."""
        made = Worker(
            deployment=deployment,
            replica_id=replica or f"r-{self.name:0>12}"[:14],
            managed=fields.pop("managed", True),
            endpoint=self.endpoint,
            served_name=fields.pop("served_name", f"served-{self.name}"),
            **fields,
        )
        made.update("ready", "", card(id=made.served_name))
        return made

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        path = scope["path"]
        if scope["method"] == "GET":
            await self._get(path, send)
            return
        mode = self.mode
        async with self.arrived:
            self.received.append((path, body))
            self.arrived.notify_all()
        if mode == "hang":
            await self.gate.wait()
            mode = "ok"
        if mode == "broken":
            headers = [(b"content-type", b"application/json"), (b"content-length", b"1000")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b'{"model":', "more_body": True})
            raise RuntimeError("the fake worker breaks its body off")
        if mode == "garbage":
            await self._send(send, 200, b"<html>not json</html>", b"text/html")
            return
        if mode == "422":
            await self._send(send, 422, json.dumps(self.rejection).encode())
            return
        if mode in ("500", "400", "429"):
            status = int(mode)
            document = {"error": {"code": "internal_error", "message": "SECRET /srv/sock trace"}}
            if status == 400:
                document["error"]["code"] = "invalid_request"
            await self._send(send, status, json.dumps(document).encode(), retry="2")
            return
        await self._send(send, 200, self.answer(path, body))

    def answer(self, path: str, body: bytes) -> bytes:
        """A 200 answer naming the model the request named, as a worker would."""
        request = json.loads(body)
        if path == "/v1/bundle":
            results = []
            for task in request["tasks"]:
                key = next(k for k in task if k != "id")
                results.append(
                    {
                        "id": task["id"],
                        "status": 200,
                        key: {"model": task[key].get("model"), "worker": self.name},
                    }
                )
            return json.dumps({"results": results}).encode()
        answer: dict[str, Any] = {"model": request.get("model"), "worker": self.name}
        if "states" in request:
            answer["states"] = [{"index": 0, "model": request.get("model")}]
        return json.dumps(answer).encode()

    async def _get(self, path: str, send: Any) -> None:
        if path == "/health" and self.frozen:
            await self.gate.wait()  # no answer until the test ends, as a stopped process
        if path == "/health" and self.health_delays:
            await asyncio.sleep(self.health_delays.pop(0))  # the slow answer being tested
        if path == "/health":
            document = {"status": "ready", "api_version": self.api_version, "model": "x"}
        else:
            document = {
                "object": "list",
                "api_version": self.api_version,
                "limits": {"max_bundle_tasks": 64, "max_request_bytes": 67108864},
                "data": [card(id="x")],
            }
            if self.listing is not None:
                document["models"] = self.listing
        await self._send(send, 200, json.dumps(document).encode())

    async def _send(
        self,
        send: Any,
        status: int,
        content: bytes,
        kind: bytes = b"application/json",
        retry: str | None = None,
    ) -> None:
        headers = [
            (b"content-type", kind),
            (b"content-length", str(len(content)).encode()),
            (b"server-timing", self.timing.encode()),
        ]
        if retry:
            headers.append((b"retry-after", retry.encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})


@contextlib.asynccontextmanager
async def fake_workers(*names: str) -> AsyncIterator[list[FakeWorker]]:
    """Fake workers serving on fresh Unix sockets until the block ends."""
    fakes, servers, tasks = [], [], []
    try:
        for name in names:
            fake = FakeWorker(name, short_socket(name))
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(str(fake.path))
            sock.listen(256)
            config = uvicorn.Config(fake, log_level="critical", lifespan="off", access_log=False)
            server = uvicorn.Server(config)
            tasks.append(asyncio.create_task(server.serve(sockets=[sock])))
            fakes.append(fake)
            servers.append(server)
        yield fakes
    finally:
        for fake in fakes:
            fake.gate.set()
        for server in servers:
            server.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
        for fake in fakes:
            shutil.rmtree(fake.path.parent, ignore_errors=True)


async def close_all(*workers: Worker) -> None:
    for worker in workers:
        await worker.aclose()


# -- real workers --------------------------------------------------------------------------------
def vllm_srun() -> list[str]:
    script = Path(sys.executable).with_name("vllm-srun")
    return [str(script)] if script.exists() else [sys.executable, "-m", "vllm_srun"]


class RealWorker:
    """A ``vllm-srun serve --uds`` process serving one fixture package as ``name``."""

    def __init__(self, package: Path, name: str, folder: Path) -> None:
        self.name = name
        self.socket = short_socket(name)
        models = folder / f"{name}.models.json"
        models.write_text(json.dumps({"models": [{"model": str(package), "name": name}]}))
        self.log = folder / f"{name}.log"
        command = [*vllm_srun(), "serve", "--models", str(models), "--uds", str(self.socket)]
        command += ["--threads", "1", "--log-level", "warning"]
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ}
            )
        self.endpoint = f"unix://{self.socket}"

    def health(self) -> dict[str, Any] | None:
        assert self.process.poll() is None, self.log.read_text(errors="replace")[-3000:]
        try:
            with httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket))) as client:
                return dict(client.get("http://w/health", timeout=5).json())
        except (httpx.TransportError, ValueError):
            return None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        shutil.rmtree(self.socket.parent, ignore_errors=True)


def wait_ready(workers: list[RealWorker], timeout: float = 180.0) -> None:
    """Until every real worker's ``/health`` says ready (bounded)."""
    deadline = time.monotonic() + timeout
    pending = list(workers)
    while pending:
        pending = [w for w in pending if (w.health() or {}).get("status") != "ready"]
        if pending and time.monotonic() > deadline:
            raise AssertionError(f"workers {[w.name for w in pending]} not ready in {timeout} s")
        if pending:
            time.sleep(0.1)


async def refresh(worker: Worker) -> None:
    """One health poll, as the frontend's health poller does it: ``/health`` state and
    ``/v1/models`` card, ``incompatible`` on another contract major."""
    try:
        health = (await worker.client.get("/health", timeout=5)).json()
        models = (await worker.client.get("/v1/models", timeout=5)).json()
    except (ConnectFailed, ExchangeBroken, ExchangeTimedOut):
        worker.update("unreachable", "the worker does not answer")
        return
    if str(health.get("api_version", "")).split(".")[0] != "2":
        worker.update("incompatible", f"api_version {health.get('api_version')} is not 2.x")
        return
    worker.limits = dict(models.get("limits") or {})
    found = [c for c in models.get("data", []) if c.get("id") == worker.served_name]
    worker.update(health.get("status", "unreachable"), health.get("reason") or "", *found[:1])


Refresher = Callable[[Worker], Awaitable[None]]
