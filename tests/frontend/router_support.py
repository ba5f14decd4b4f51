"""Helpers of the Router-mode end-to-end tests (``test_router_*``): a stub backend that
notices a cancelled stream, the ``vllm-sr serve --config`` process and an in-process
:class:`~vllm_sr.frontend.Frontend` on :mod:`router_worker`, metric reading, bounded
waits."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from .conftest import free_ports, port_offset, unshifted
from .stub_backend import Running, Script, StubBackend

ROUTER_WORKER = Path(__file__).with_name("router_worker.py")
VLLM_SR = [sys.executable, "-m", "vllm_sr"]


def worker_command(script_dir: Path) -> tuple[str, ...]:
    """The steerable worker as a worker command (``VLLM_SRUN_COMMAND`` splits on spaces)."""
    return (sys.executable, str(ROUTER_WORKER), "--script-dir", str(script_dir))


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, every: float = 0.05) -> Any:
    """Poll ``predicate`` until it is truthy (its value), failing after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(every)


# -- the stub backend ----------------------------------------------------------------------------


class RecordingStub(StubBackend):
    """The stub backend, also telling whether a stream it was sending was cut off by the
    other side (:attr:`cancelled`) or sent to its end (:attr:`finished`)."""

    def __init__(self) -> None:
        super().__init__()
        self.cancelled = threading.Event()
        self.finished = threading.Event()

    def reset(self) -> None:
        self.script = Script()
        self.requests.clear()
        self.cancelled.clear()
        self.finished.clear()

    async def _events(self, model: Any, created: int, script: Script) -> AsyncIterator[bytes]:  # type: ignore[override]
        done = False
        try:
            async for event in super()._events(model, created, script):
                yield event
            done = True
        finally:
            (self.finished if done else self.cancelled).set()


class StubServer(Running):
    stub: RecordingStub

    def __init__(self) -> None:
        super().__init__(RecordingStub())


# -- reading metrics ----------------------------------------------------------------------------


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a Prometheus text page: (name, labels, value)."""
    found = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.append((sample.name, dict(sample.labels), float(sample.value)))
    return found


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples ``name`` whose labels include ``labels`` (0 when none)."""
    return sum(
        value
        for sample, have, value in samples(text)
        if sample == name and all(have.get(k) == v for k, v in labels.items())
    )


def label_sets(text: str, name: str) -> list[dict[str, str]]:
    return [have for sample, have, _ in samples(text) if sample == name]


# -- vllm-sr serve --config ----------------------------------------------------------------------


class ServedRouter:
    """``vllm-sr serve --config FILE`` (Router mode) as a process, with its output, its
    management API and its metrics."""

    def __init__(
        self,
        folder: Path,
        document: dict[str, Any],
        env: dict[str, str],
        serve_args: tuple[str, ...] = (),
    ) -> None:
        self.folder = folder
        self.config = folder / "config.yaml"
        self.offset = port_offset()
        # The listeners bind the ports ``document`` names: the file has them less the offset.
        self.config.write_text(yaml.safe_dump(self.as_served(document), sort_keys=False))
        self.env = {**os.environ, "VLLM_SR_PORT_OFFSET": str(self.offset), **env}
        self.out = folder / "stdout.txt"
        self.err = folder / "stderr.txt"
        self.started = time.monotonic()
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.process = subprocess.Popen(
                [*VLLM_SR, "serve", *serve_args, "--config", str(self.config)],
                stdout=out,
                stderr=err,
                env=self.env,
                start_new_session=True,
            )
        self.mgmt_url = f"http://127.0.0.1:{8080 + self.offset}"
        self.metrics_url = f"http://127.0.0.1:{9190 + self.offset}/metrics"
        self.mgmt = httpx.Client(base_url=self.mgmt_url, timeout=10)

    def as_served(self, document: dict[str, Any]) -> dict[str, Any]:
        """``document`` as this frontend is given it (a file, ``config apply``): each
        listener's port less the offset, which ``vllm-sr`` adds back."""
        return unshifted(document, self.offset)

    def output(self) -> str:
        return self.out.read_text() + self.err.read_text()[-6000:]

    def get(self, path: str) -> httpx.Response | None:
        assert self.process.poll() is None, f"vllm-sr exited:\n{self.output()}"
        try:
            return self.mgmt.get(path)
        except httpx.TransportError:
            return None

    def ready_status(self) -> int | None:
        answer = self.get("/ready")
        return None if answer is None else answer.status_code

    def wait_ready(self, timeout: float = 60) -> None:
        wait_for(lambda: self.ready_status() == 200, timeout, f"/ready 200\n{self.output()}")

    def metrics(self) -> str:
        return httpx.get(self.metrics_url, timeout=10).text

    def close(self) -> None:
        self.mgmt.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


# -- an in-process Frontend ---------------------------------------------------------------------


class _ThreadLoop(asyncio.SelectorEventLoop):
    """An event loop for a thread other than the main one: the frontend's signal
    handlers (which only the main thread may install) are not installed."""

    def add_signal_handler(self, sig: int, callback: Any, *args: Any) -> None:
        pass

    def remove_signal_handler(self, sig: int) -> bool:
        return False


class ThreadedFrontend:
    """A :class:`~vllm_sr.frontend.Frontend` of ``document`` on the steerable worker
    (:mod:`router_worker`), run in a thread with its own event loop until :meth:`stop`.

    The workers' scripts and request logs live in :attr:`dir`
    (``<deployment>.json``, ``<deployment>.log``)."""

    def __init__(self, document: dict[str, Any]) -> None:
        from vllm_sr.config.schema import parse_config
        from vllm_sr.frontend import Frontend
        from vllm_sr.workers.environment import RuntimeEnvironment

        self.dir = Path(tempfile.mkdtemp(prefix="vsrr-", dir="/tmp"))
        self.mgmt_port, self.metrics_port = free_ports(2)
        self.config = parse_config(document)
        env = RuntimeEnvironment(command=worker_command(self.dir), directory=self.dir, cores=2)
        self.lines: list[str] = []
        self.frontend = Frontend(
            self.config,
            env,
            management=("127.0.0.1", self.mgmt_port),
            metrics_address=("127.0.0.1", self.metrics_port),
            ready_timeout=30,
            out=self.lines.append,
            result_cache=0,
            supervisor_options={"poller": {"fast": 0.05}},
        )
        self.code: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        with asyncio.Runner(loop_factory=_ThreadLoop) as runner:
            self._loop = runner.get_loop()
            self.code = runner.run(self.frontend.run())

    def start(self) -> ThreadedFrontend:
        self._thread.start()
        return self

    @property
    def mgmt_url(self) -> str:
        return f"http://127.0.0.1:{self.mgmt_port}"

    def listener_url(self, index: int = 0) -> str:
        listener = self.config.listeners[index]
        return f"http://127.0.0.1:{listener.port}"

    def ready_status(self) -> int | None:
        assert self._thread.is_alive(), f"the frontend ended ({self.code}): {self.lines}"
        try:
            return httpx.get(f"{self.mgmt_url}/ready", timeout=5).status_code
        except httpx.TransportError:
            return None

    def wait_ready(self, timeout: float = 30) -> ThreadedFrontend:
        wait_for(lambda: self.ready_status() == 200, timeout, f"/ready 200 ({self.lines})")
        return self

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).text

    def inventory(self) -> list[dict[str, Any]]:
        answer = httpx.get(f"{self.mgmt_url}/api/v1/inventory/model-runtime", timeout=5)
        return list(answer.json()["deployments"])

    def usable(self, timeout: float = 15) -> None:
        """Wait until no replica is in back-off (a failed or late answer puts it there
        until its health probe says ok)."""

        def settled() -> bool:
            return all(r["ready"] for entry in self.inventory() for r in entry.get("replicas", []))

        wait_for(settled, timeout, "every replica out of back-off")

    def steer(self, deployment: str, **script: Any) -> None:
        """Replace ``deployment``'s worker script (see :mod:`router_worker`)."""
        path = self.dir / f"{deployment}.json"
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(script))
        os.replace(temporary, path)

    def calls(self, deployment: str, path: str | None = None) -> list[dict[str, Any]]:
        """The requests ``deployment``'s workers received, oldest first."""
        log = self.dir / f"{deployment}.log"
        if not log.exists():
            return []
        found = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        return [c for c in found if path is None or c["path"] == path]

    def stop(self) -> None:
        loop = self._loop
        if loop is not None and self._thread.is_alive():
            loop.call_soon_threadsafe(self.frontend.request_shutdown)
            loop.call_soon_threadsafe(self.frontend.request_shutdown)  # skip the drain
        self._thread.join(30)
        shutil.rmtree(self.dir, ignore_errors=True)
