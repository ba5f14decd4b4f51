"""The router benchmark: Router mode (``vllm-sr serve --config``, no ``-e``) in front of a
fast stand-in Chat backend, side by side with the backend alone and with LiteLLM's proxy.

One run, every figure measured side by side in alternating rounds (the order reversed
every other round, so drift hits every side alike), each measurement a closed loop of
``POST`` requests with wrk (bench/embed.lua; the Python generator when wrk is missing):

1. **keywords**: ``/v1/chat/completions`` for ``vllm-sr/auto`` with a message a keyword
   rule matches, (a) straight to the backend (bench/fast_backend.py: uvicorn, uvloop,
   httptools, a raw ASGI app answering a fixed ``chat.completion``), (b) through a
   Router-mode frontend whose configuration has one listener, one provider model on that
   backend, one keyword signal and one decision (it starts no worker): the p50 the router
   adds at c1 and its c32 throughput over the backend's;
2. **embedding**: the same through a second Router-mode frontend whose one decision reads
   one embeddings rule, MiniLM (``primary``) bound as ``embedding`` (contract
   ``embedding.v1``): the p50 it adds at c1, beside MiniLM's own c1 p50 for
   ``POST /v1/embeddings`` with one such text, straight to a ``vllm-srun serve`` worker
   with the same thread count as the frontend's managed worker;
3. **LiteLLM**: the same requests through ``litellm --config`` (``litellm[proxy]``, in
   its own venv ``build/litellm-venv``, created on first use) with one static route to the
   same backend: its c1 added p50 and c32 throughput. Skipped, with a note, when it cannot
   be installed or started.

Every Chat and embeddings text is a distinct short corpus sentence (bench/corpus.py, 10 to
16 words); the embedding measurements never repeat a text (no result-cache hit), the
keyword ones cycle through a fixed set (nothing on their path caches). Each measurement
waits for a quiet machine and is retried while other processes take CPU
(machine.cleanest); each column of the report's table comes from the cleanest round (the
one whose measurements of that column saw the least CPU used by other processes), and
every round is listed. With ``--profile`` (the default) a last pass runs the keyword
router under cProfile (CPU time) at c1 and lists where its time goes.

Writes bench/results/router.md and router.json; prints the report.

    .venv/bin/python bench/router_section.py [--duration 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import itertools
import json
import math
import os
import pstats
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import corpus  # noqa: E402
import machine as machine_module  # noqa: E402
from frontend_section import port_offset, served_config  # noqa: E402
from loadgen import ensure_wrk, run_python, run_wrk  # noqa: E402
from machine import CpuMeter, cleanest, log, machine  # noqa: E402
from server import (  # noqa: E402
    BIN,
    MODEL_ID,
    default_model_dir,
    free_port,
    register,
    registered,
    stopped,
)

RESULTS = HERE / "results"
LITELLM_VENV = ROOT / "build" / "litellm-venv"
CHAT_PATH = "/v1/chat/completions"
EMBEDDINGS_PATH = "/v1/embeddings"
AUTO = "vllm-sr/auto"
KEYWORD = "debug"
SHORT_WORDS = (10, 16)
"""The word counts of the texts sent (corpus sentences of this length)."""

TARGETS = {
    "keyword_added_p50_ms": 1.0,
    "keyword_tput_ratio_c32": 0.95,
    "embedding_added_over_own_ms": 1.0,
    "litellm_fraction": 1 / 3,
}
"""Issue 26's targets: the p50 keyword routing adds at c1 (at most, ms); its c32 throughput
over the backend's (at least); the p50 an embedding signal adds at c1 over the embedding's
own p50 (at most, ms); our keyword added p50 over LiteLLM's (at most)."""

WEATHER = [
    "What is the weather forecast for tomorrow?",
    "Will it rain today?",
    "How hot will it be this afternoon?",
]
"""The embeddings rule's candidates (what matches does not matter here: both outcomes go
to the same backend)."""


# -- the texts --------------------------------------------------------------------------------
class Texts:
    """Distinct short corpus sentences, handed out once each."""

    def __init__(self) -> None:
        low, high = SHORT_WORDS
        self._source: Iterator[str] = (s for s in corpus.stream() if low <= len(s.split()) <= high)

    def take(self, count: int) -> list[str]:
        return list(itertools.islice(self._source, count))


def chat_body(text: str) -> bytes:
    return json.dumps({"model": AUTO, "messages": [{"role": "user", "content": text}]}).encode()


def embeddings_body(text: str) -> bytes:
    return json.dumps({"model": MODEL_ID, "input": text}).encode()


def keyword_text(text: str) -> str:
    return f"Please {KEYWORD} this function: {text}"


# -- the processes ----------------------------------------------------------------------------
class Process:
    """A child process with its log; :meth:`stop` ends it and everything it started."""

    def __init__(
        self,
        name: str,
        cmd: list[str],
        env: dict[str, str] | None = None,
        unset: tuple[str, ...] = (),
    ) -> None:
        self.name = name
        self.folder = Path(tempfile.mkdtemp(prefix=f"vsr-bench-router-{name}-", dir="/tmp"))
        self.log_path = self.folder / "out.log"
        self.log = self.log_path.open("w+")
        self.cmd = cmd
        shown = ["<cProfile wrapper>" if "\n" in part else part for part in cmd]
        log(f"starting {name}: " + " ".join(shown))
        register(self)  # stopped at exit too: an interrupted run leaves nothing running
        self.proc = subprocess.Popen(
            cmd,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset},
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tree(self) -> list[Any]:
        """The process and its descendants (psutil processes)."""
        import psutil

        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def tail(self, lines: int = 30) -> str:
        self.log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited ({self.proc.returncode}):\n{self.tail()}")

    def wait_http(
        self, url: str, timeout: float, ok: Callable[[bytes], bool] | None = None
    ) -> float:
        """Seconds until ``GET url`` answers 200 (and ``ok(body)``), within ``timeout``."""
        started = time.perf_counter()
        while time.perf_counter() - started < timeout:
            self.check()
            with (
                contextlib.suppress(OSError, urllib.error.URLError, ValueError),
                urllib.request.urlopen(url, timeout=5) as resp,
            ):
                if resp.status == 200 and (ok is None or ok(resp.read())):
                    return time.perf_counter() - started
            time.sleep(0.25)
        raise RuntimeError(f"{self.name}: {url} not ready within {timeout:.0f} s:\n{self.tail()}")

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM (a frontend stops its workers), then SIGKILL whatever is left of the
        process, its group and its descendants (a second call does nothing)."""
        import psutil

        if not registered(self):
            return
        if getattr(self, "proc", None) is None:  # a signal came before the start
            stopped(self)
            return
        family = self.tree()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=5)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for child in family[1:]:
            with contextlib.suppress(psutil.Error):
                child.kill()
        psutil.wait_procs(family[1:], timeout=5)
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)
        stopped(self)


def start_backend() -> tuple[Process, int]:
    port = free_port()
    backend = Process(
        "backend", [sys.executable, str(HERE / "fast_backend.py"), "--port", str(port)]
    )
    backend.wait_http(f"http://127.0.0.1:{port}/health", 60)
    return backend, port


def keyword_config(listener: int, backend_port: int) -> str:
    return f"""version: v0.3
listeners:
  - {{name: chat, address: 127.0.0.1, port: {listener}}}
providers:
  models:
    - name: fast
      provider_model_id: bench-7b
      backend_refs: [{{name: local, endpoint: "127.0.0.1:{backend_port}"}}]
routing:
  signals:
    keywords:
      - {{name: code, operator: OR, keywords: [{KEYWORD}, stack trace]}}
  decisions:
    - name: coding
      priority: 50
      rules:
        conditions: [{{type: keyword, name: code}}]
      modelRefs: [{{model: fast}}]
"""


def embedding_config(listener: int, backend_port: int) -> str:
    candidates = ", ".join(json.dumps(c) for c in WEATHER)
    return f"""version: v0.3
listeners:
  - {{name: chat, address: 127.0.0.1, port: {listener}}}
providers:
  defaults: {{default_model: fast}}
  models:
    - name: fast
      provider_model_id: bench-7b
      backend_refs: [{{name: local, endpoint: "127.0.0.1:{backend_port}"}}]
global:
  model_catalog:
    signal_timeout_ms: 10000
    deployments:
      primary:
        provider: model_runtime
        artifact: {MODEL_ID}
        device: cpu
    bindings:
      embedding: {{deployment: primary, contract: embedding.v1}}
routing:
  signals:
    embeddings:
      - name: weather
        aggregation_method: max
        threshold: 0.6
        candidates: [{candidates}]
  decisions:
    - name: weather
      priority: 50
      rules:
        conditions: [{{type: embedding, name: weather}}]
      modelRefs: [{{model: fast}}]
"""


class RouterProcess(Process):
    """``vllm-sr serve --config FILE`` (Router mode) on its own port offset."""

    def __init__(
        self,
        name: str,
        config_for: Callable[[int], str],
        threads: int,
        python: list[str] | None = None,
    ) -> None:
        offset = port_offset()
        self.port = free_port()
        config = config_for(self.port)
        self.mgmt = f"http://127.0.0.1:{8080 + offset}"
        folder = Path(tempfile.mkdtemp(prefix=f"vsr-bench-router-{name}-cfg-", dir="/tmp"))
        self.config_folder = folder
        (folder / "config.yaml").write_text(served_config(config, offset))
        command = python or [str(BIN / "vllm-sr")]
        super().__init__(
            name,
            [
                *command,
                "serve",
                "--config",
                str(folder / "config.yaml"),
                "--offline",
                "--log-level",
                "warning",
            ],
            {
                "VLLM_SR_PORT_OFFSET": str(offset),
                "VLLM_SRUN_DIR": str(folder / "run"),
                "VLLM_SRUN_COMMAND": str(BIN / "vllm-srun"),
                "VLLM_SRUN_RESULT_CACHE": "0",
                "VLLM_SRUN_CPU_THREADS": str(threads),
            },
        )

    def wait_ready(self, timeout: float) -> float:
        """Seconds until ``/ready`` answers 200 and every deployment in use is ready."""

        def all_ready(body: bytes) -> bool:
            deployments = json.loads(body).get("deployments", [])
            return all(d.get("ready_replicas", 0) >= 1 for d in deployments)

        started = time.perf_counter()
        self.wait_http(self.mgmt + "/api/v1/inventory/model-runtime", timeout, all_ready)
        self.wait_http(self.mgmt + "/ready", max(1.0, timeout - (time.perf_counter() - started)))
        return time.perf_counter() - started

    def stop(self, grace: float = 30.0) -> None:
        super().stop(grace)
        shutil.rmtree(self.config_folder, ignore_errors=True)


# -- LiteLLM ----------------------------------------------------------------------------------
LITELLM_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of the cost map (no network here)
    "LITELLM_LOG": "ERROR",
    "DISABLE_ADMIN_UI": "True",
    "LITELLM_TELEMETRY": "False",
    # no master key, like the router's listener here (no key checks on either side)
    "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
}


def ensure_litellm(install_timeout: float) -> tuple[Path | None, str]:
    """LiteLLM's CLI in ``build/litellm-venv`` (created and installed on first use), and its
    version or why it is missing."""
    cli = LITELLM_VENV / "bin" / "litellm"
    python = LITELLM_VENV / "bin" / "python"
    if not cli.exists():
        log(f"installing litellm[proxy] into {LITELLM_VENV} (first use)")
        try:
            if not python.exists():
                subprocess.run(
                    [sys.executable, "-m", "venv", str(LITELLM_VENV)],
                    check=True,
                    capture_output=True,
                    timeout=300,
                )
            done = subprocess.run(
                [
                    str(python),
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--disable-pip-version-check",
                    "litellm[proxy]",
                ],
                capture_output=True,
                text=True,
                timeout=install_timeout,
            )
        except (OSError, subprocess.SubprocessError) as err:
            return None, f"litellm[proxy] could not be installed: {err}"
        if done.returncode != 0 or not cli.exists():
            tail = " ".join((done.stderr or done.stdout).split()[-40:])
            return None, f"litellm[proxy] could not be installed (pip {done.returncode}): {tail}"
    probe = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.metadata as m, importlib.util as u; print(m.version('litellm'), "
            "'httptools' if u.find_spec('httptools') else 'h11')",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode != 0:
        return None, f"litellm is installed but does not import: {probe.stderr.strip()[-300:]}"
    version, parser = probe.stdout.split()
    return cli, f"{version} (its uvicorn parses HTTP with {parser})"


def litellm_config(backend_port: int) -> str:
    return f"""model_list:
  - model_name: {AUTO}
    litellm_params:
      model: openai/bench-7b
      api_base: http://127.0.0.1:{backend_port}/v1
      api_key: none
litellm_settings:
  set_verbose: false
  telemetry: false
  turn_off_message_logging: true
general_settings:
  disable_spend_logs: true
  disable_error_logs: true
"""


class LiteLLMProcess(Process):
    """``litellm --config FILE --port N`` (one uvicorn worker, no database)."""

    def __init__(self, cli: Path, backend_port: int) -> None:
        self.port = free_port()
        folder = Path(tempfile.mkdtemp(prefix="vsr-bench-router-litellm-cfg-", dir="/tmp"))
        self.config_folder = folder
        (folder / "config.yaml").write_text(litellm_config(backend_port))
        super().__init__(
            "litellm",
            [
                str(cli),
                "--config",
                str(folder / "config.yaml"),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--num_workers",
                "1",
            ],
            LITELLM_ENV,
            unset=("DATABASE_URL", "LITELLM_MASTER_KEY", "REDIS_HOST", "REDIS_URL", "REDIS_PORT"),
        )

    def stop(self, grace: float = 30.0) -> None:
        super().stop(grace)
        shutil.rmtree(self.config_folder, ignore_errors=True)


# -- the measurements -------------------------------------------------------------------------
@dataclass
class Target:
    """What one measurement loads: where, which route, and whose CPU counts as its own."""

    label: str
    port: int
    path: str
    bodies: Callable[[int], list[bytes]]
    own: list[Process] = field(default_factory=list)


@dataclass
class Bench:
    args: Any
    generator: str
    processes: list[Process]
    backend: Process | None = None

    def measure(self, target: Target, connections: int) -> dict[str, Any]:
        """The cleanest of ``--tries`` closed-loop measurements of ``target``."""

        def once() -> dict[str, Any]:
            slice_size = self.slice_size(connections)
            bodies = target.bodies(slice_size)
            handle, name = tempfile.mkstemp(prefix="vsr-bench-router-", suffix=".jsonl")
            with os.fdopen(handle, "wb") as out:
                out.write(b"\n".join(bodies) + b"\n")
            ours = [p for proc in self.processes for p in proc.tree()]
            own = [p for proc in target.own for p in proc.tree()]
            backend = self.backend.tree() if self.backend is not None else []
            before = [_cpu(ours), _cpu(own), _cpu(backend)]
            meter = CpuMeter(None)
            try:
                if self.generator == "wrk":
                    result = run_wrk(
                        target.port,
                        Path(name),
                        0,
                        len(bodies),
                        connections,
                        self.args.wrk_threads,
                        self.args.duration,
                        target.path,
                    )
                else:
                    result = run_python(
                        target.port, bodies, connections, self.args.duration, path=target.path
                    )
                    result.pop("server_timing", None)
            finally:
                os.unlink(name)
            result.update(meter.stop())
            spent = [_cpu(ours) - before[0], _cpu(own) - before[1], _cpu(backend) - before[2]]
            seconds = result["seconds"]
            ours_pct = 100 * spent[0] / seconds
            result["ours_cpu_pct"] = round(ours_pct, 1)
            result["target_cpu_pct"] = round(100 * spent[1] / seconds, 1)
            result["backend_cpu_pct"] = round(100 * spent[2] / seconds, 1)
            done = max(1, result["requests"])
            result["target_cpu_ms_per_request"] = round(1000 * spent[1] / done, 3)
            result["backend_cpu_ms_per_request"] = round(1000 * spent[2] / done, 3)
            result["foreign_cpu_pct"] = round(max(0.0, result["foreign_cpu_pct"] - ours_pct), 1)
            result["loadavg"] = round(os.getloadavg()[0], 2)
            log(
                f"{target.label} c{connections}: {result['rps']:.1f} req/s, p50 "
                f"{result['p50_ms']:.3f} ms, p99 {result['p99_ms']:.2f} ms, errors "
                f"{result['errors']}, wrapped {result['wrapped']}, CPU % target "
                f"{result['target_cpu_pct']:.0f} backend {result['backend_cpu_pct']:.0f} "
                f"others {result['foreign_cpu_pct']:.0f}"
            )
            if result["errors"]:
                log(f"warning: {target.label} c{connections} had {result['errors']} errors")
            return result

        return cleanest(f"{target.label} c{connections}", self.args.tries, once)

    def slice_size(self, connections: int) -> int:
        """Enough bodies that a measurement of an embedding target never repeats a text."""
        rate = 600 if connections == 1 else 2000
        return math.ceil(self.args.duration * rate)

    def warm(self, target: Target, connections: int, seconds: float = 2.0) -> None:
        """An unrecorded short load (connections, caches, first-request costs)."""
        bodies = target.bodies(int(seconds * 600))
        handle, name = tempfile.mkstemp(prefix="vsr-bench-router-warm-", suffix=".jsonl")
        with os.fdopen(handle, "wb") as out:
            out.write(b"\n".join(bodies) + b"\n")
        try:
            if self.generator == "wrk":
                run_wrk(
                    target.port, Path(name), 0, len(bodies), connections, 1, seconds, target.path
                )
            else:
                run_python(target.port, bodies, connections, seconds, path=target.path)
        finally:
            os.unlink(name)


def pytest_running() -> bool:
    """Whether a pytest process runs on this machine (its CPU would make the figures noisy)."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error, TypeError):
            if any("pytest" in part for part in proc.info["cmdline"] or ()):
                return True
    return False


def _cpu(processes: list[Any]) -> float:
    import psutil

    total = 0.0
    for p in processes:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def post(port: int, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", body, {"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, dict(resp.headers.items()), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers.items()), err.read()


def check_route(port: int, text: str, decision: str | None) -> None:
    """One Chat request through a router: 200 and, when given, the decision expected."""
    status, headers, body = post(port, CHAT_PATH, chat_body(text))
    if status != 200:
        raise RuntimeError(f"the router on {port} answered {status}: {body[:300]!r}")
    lowered = {k.lower(): v for k, v in headers.items()}
    if decision is not None and lowered.get("x-vsr-selected-decision") != decision:
        raise RuntimeError(f"the router chose {lowered.get('x-vsr-selected-decision')!r}")


# -- one run ----------------------------------------------------------------------------------
C1_ORDER = ("direct", "router_keyword", "litellm", "router_embedding", "embedding_worker")
C32_ORDER = ("direct", "router_keyword", "litellm")


def run(args: argparse.Namespace) -> dict[str, Any]:
    generator = "wrk" if args.load_generator != "python" and ensure_wrk() else "python"
    if args.load_generator == "wrk" and generator != "wrk":
        raise SystemExit("wrk is not installed and could not be installed")
    wrk_version = None
    if generator == "wrk":
        probe = subprocess.run(["wrk", "--version"], capture_output=True, text=True)
        wrk_version = (probe.stdout + probe.stderr).splitlines()[0].strip()
    log(f"load generator: {generator} {wrk_version or ''}")
    litellm_cli, litellm_version = (None, "skipped (--no-litellm)")
    if not args.no_litellm:
        litellm_cli, litellm_version = ensure_litellm(args.install_timeout)
        log(f"litellm: {litellm_version}")
    texts = Texts()
    keyword_bodies = [chat_body(keyword_text(t)) for t in texts.take(2000)]

    def cycle(count: int) -> list[bytes]:
        return list(itertools.islice(itertools.cycle(keyword_bodies), count))

    def fresh_chat(count: int) -> list[bytes]:
        return [chat_body(t) for t in texts.take(count)]

    def fresh_embeddings(count: int) -> list[bytes]:
        return [embeddings_body(t) for t in texts.take(count)]

    processes: list[Process] = []
    started: dict[str, float] = {}
    record: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "wrk": wrk_version,
        "generator": generator,
        "litellm_version": litellm_version,
        "litellm": litellm_cli is not None,
        "threads": args.threads,
        "duration_s": args.duration,
        "rounds_asked": args.rounds,
        "pytest_running_before": pytest_running(),
    }
    rounds: list[dict[str, Any]] = []
    try:
        backend, backend_port = start_backend()
        processes.append(backend)
        keyword_router = RouterProcess(
            "router-keyword", lambda port: keyword_config(port, backend_port), args.threads
        )
        processes.append(keyword_router)
        started["router_keyword_ready_s"] = round(keyword_router.wait_ready(120), 2)
        embedding_router = RouterProcess(
            "router-embedding", lambda port: embedding_config(port, backend_port), args.threads
        )
        processes.append(embedding_router)
        worker_port = free_port()
        worker = Process(
            "minilm-worker",
            [
                str(BIN / "vllm-srun"),
                "serve",
                str(args.model or default_model_dir()),
                "--served-model-name",
                MODEL_ID,
                "--port",
                str(worker_port),
                "--threads",
                str(args.threads),
                "--offline",
                "--log-level",
                "warning",
            ],
        )
        processes.append(worker)
        litellm: LiteLLMProcess | None = None
        if litellm_cli is not None:
            litellm = LiteLLMProcess(litellm_cli, backend_port)
            processes.append(litellm)
        started["router_embedding_ready_s"] = round(embedding_router.wait_ready(300), 2)
        started["worker_ready_s"] = round(
            worker.wait_http(f"http://127.0.0.1:{worker_port}/health", 180), 2
        )
        if litellm is not None:
            try:
                started["litellm_ready_s"] = round(
                    litellm.wait_http(f"http://127.0.0.1:{litellm.port}/health/liveliness", 180),
                    2,
                )
                status, _, body = post(litellm.port, CHAT_PATH, keyword_bodies[0])
                if status != 200:
                    raise RuntimeError(f"LiteLLM answered {status}: {body[:300]!r}")
            except RuntimeError as err:
                log(f"LiteLLM is left out: {err}")
                record["litellm_version"] = f"{litellm_version}; left out: {str(err)[:400]}"
                record["litellm"] = False
                litellm.stop()
                processes.remove(litellm)
                litellm = None
        check_route(keyword_router.port, keyword_text("the first request"), "coding")
        check_route(embedding_router.port, WEATHER[1], "weather")
        status, _, body = post(worker_port, EMBEDDINGS_PATH, embeddings_body("a first text"))
        if status != 200:
            raise RuntimeError(f"the MiniLM worker answered {status}: {body[:300]!r}")
        record["startup"] = started

        targets = {
            "direct": Target("direct to the backend", backend_port, CHAT_PATH, cycle, [backend]),
            "router_keyword": Target(
                "router (keyword)", keyword_router.port, CHAT_PATH, cycle, [keyword_router]
            ),
            "router_embedding": Target(
                "router (embedding, MiniLM)",
                embedding_router.port,
                CHAT_PATH,
                fresh_chat,
                [embedding_router],
            ),
            "embedding_worker": Target(
                "MiniLM /v1/embeddings, worker alone",
                worker_port,
                EMBEDDINGS_PATH,
                fresh_embeddings,
                [worker],
            ),
        }
        if litellm is not None:
            targets["litellm"] = Target(
                "LiteLLM (static route)", litellm.port, CHAT_PATH, cycle, [litellm]
            )
        bench = Bench(args, generator, processes, backend)
        log("warming every target")
        for key, target in targets.items():
            bench.warm(target, 1, 6.0 if key in ("router_embedding", "embedding_worker") else 2.0)
            if key in C32_ORDER:
                bench.warm(target, 32)
        for number in range(1, args.rounds + 1):
            log(f"round {number} of {args.rounds}")
            measured: dict[str, Any] = {}
            c1 = [k for k in C1_ORDER if k in targets]
            c32 = [k for k in C32_ORDER if k in targets]
            if number % 2 == 0:  # ABBA: every other round in the reverse order
                c1.reverse()
                c32.reverse()
            for key in c1:
                measured[f"{key}_c1"] = bench.measure(targets[key], 1)
            for key in c32:
                measured[f"{key}_c32"] = bench.measure(targets[key], 32)
            rounds.append(measured)
        if args.profile:
            record["profile"] = profile_keyword_router(args, generator, backend_port, cycle)
    finally:
        for process in reversed(processes):
            try:
                process.stop()
            except Exception as err:  # stop the others all the same
                log(f"stopping {process.name}: {err}")
    record["rounds"] = rounds
    record["loadavg_after"] = os.getloadavg()[0]
    record["pytest_running_after"] = pytest_running()
    record["figures"] = figures(rounds)
    return record


# -- the profile ------------------------------------------------------------------------------
PROFILER = """
import cProfile, runpy, signal, sys, time
out = sys.argv[1]
sys.argv = sys.argv[2:]
profile = cProfile.Profile(time.process_time)
def start(*_):
    profile.enable()
def stop(*_):
    profile.disable()
    profile.dump_stats(out + ".part")
    __import__("os").replace(out + ".part", out)
signal.signal(signal.SIGUSR1, start)
signal.signal(signal.SIGUSR2, stop)
runpy.run_path(sys.argv[0], run_name="__main__")
"""
"""The profiled router's interpreter: cProfile (CPU time) from SIGUSR1 to SIGUSR2, which
writes the statistics (so that start-up and shutdown are left out)."""


def profile_keyword_router(
    args: argparse.Namespace,
    generator: str,
    backend_port: int,
    bodies: Callable[[int], list[bytes]],
) -> dict[str, Any]:
    """A keyword router under cProfile (CPU time) at c1 for ``--duration`` seconds, after a
    warm-up: where its CPU goes per request (the figures above ran without the profiler)."""
    out = Path(tempfile.mkdtemp(prefix="vsr-bench-router-prof-", dir="/tmp")) / "router.prof"
    router = RouterProcess(
        "router-profiled",
        lambda port: keyword_config(port, backend_port),
        args.threads,
        python=[sys.executable, "-c", PROFILER, str(out), str(BIN / "vllm-sr")],
    )
    try:
        router.wait_ready(120)
        target = Target("router (keyword) under cProfile", router.port, CHAT_PATH, bodies)
        bench = Bench(args, generator, [router])
        bench.warm(target, 1)
        router.proc.send_signal(signal.SIGUSR1)
        check_route(router.port, keyword_text("profiling starts"), "coding")  # runs the handler
        handle, name = tempfile.mkstemp(prefix="vsr-bench-router-prof-", suffix=".jsonl")
        with os.fdopen(handle, "wb") as file:
            file.write(b"\n".join(bodies(2000)) + b"\n")
        try:
            if generator == "wrk":
                result = run_wrk(router.port, Path(name), 0, 2000, 1, 1, args.duration, CHAT_PATH)
            else:
                result = run_python(router.port, bodies(2000), 1, args.duration, path=CHAT_PATH)
        finally:
            os.unlink(name)
        router.proc.send_signal(signal.SIGUSR2)
        waited = time.perf_counter()
        while not out.exists() and time.perf_counter() - waited < 30:
            with contextlib.suppress(OSError, RuntimeError):  # wakes an idle event loop
                check_route(router.port, keyword_text("profiling ends"), None)
            time.sleep(0.5)
        log(
            f"router (keyword) under cProfile c1: {result['rps']:.1f} req/s, p50 "
            f"{result['p50_ms']:.3f} ms (the profiler's own cost included)"
        )
    finally:
        router.stop()
    if not out.exists():
        shutil.rmtree(out.parent, ignore_errors=True)
        return {"error": "the profiler wrote nothing"}
    try:
        summary = summarize_profile(out, result["requests"] + 2)
        summary["p50_ms_under_profiler"] = round(result["p50_ms"], 3)
        return summary
    finally:
        shutil.rmtree(out.parent, ignore_errors=True)


def short_name(filename: str) -> str:
    """A profiled function's file, relative to its package folder or the checkout."""
    for marker in ("site-packages/", f"{ROOT}/", "lib/python3.11/", "lib/python3.12/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


def summarize_profile(path: Path, requests: int) -> dict[str, Any]:
    """The functions called at least about once per request, with their own and cumulative
    CPU time per request, and each one's share of the whole profiled CPU time."""
    stats = pstats.Stats(str(path))
    table = stats.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in table.values())
    rows = []
    for (filename, line, name), (_cc, nc, tt, ct, _) in table.items():
        if nc < requests * 0.9:
            continue
        rows.append(
            {
                "function": f"{short_name(filename)}:{line}({name})",
                "calls_per_request": round(nc / requests, 2),
                "own_us_per_request": round(1e6 * tt / requests, 1),
                "cumulative_us_per_request": round(1e6 * ct / requests, 1),
                "own_share": round(tt / total, 4) if total else 0.0,
                "cumulative_share": round(ct / total, 4) if total else 0.0,
            }
        )
    own = sorted(rows, key=lambda r: r["own_us_per_request"], reverse=True)[:20]
    cumulative = sorted(rows, key=lambda r: r["cumulative_us_per_request"], reverse=True)[:40]
    return {
        "requests": requests,
        "cpu_us_per_request": round(1e6 * total / requests, 1),
        "top_own": own,
        "top_cumulative": cumulative,
    }


# -- the figures and the report ---------------------------------------------------------------
def cleanest_round(rounds: list[dict[str, Any]], keys: list[str]) -> int:
    """The index of the round whose measurements ``keys`` saw the least CPU of others."""
    present = [i for i, r in enumerate(rounds) if all(k in r for k in keys)]
    return min(present, key=lambda i: max(rounds[i][k]["foreign_cpu_pct"] for k in keys))


def figures(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    if not rounds:
        return {}
    first = rounds[0]
    c1_keys = [f"{k}_c1" for k in C1_ORDER if f"{k}_c1" in first]
    c32_keys = [f"{k}_c32" for k in C32_ORDER if f"{k}_c32" in first]
    i1, i32 = cleanest_round(rounds, c1_keys), cleanest_round(rounds, c32_keys)
    r1, r32 = rounds[i1], rounds[i32]
    direct_p50 = r1["direct_c1"]["p50_ms"]
    direct_rps = r32["direct_c32"]["rps"]
    f: dict[str, Any] = {"c1_round": i1 + 1, "c32_round": i32 + 1, "scenarios": {}}
    for key in ("direct", "router_keyword", "litellm", "router_embedding", "embedding_worker"):
        row: dict[str, Any] = {}
        if f"{key}_c1" in r1:
            m = r1[f"{key}_c1"]
            row["c1_p50_ms"] = round(m["p50_ms"], 3)
            row["c1_p99_ms"] = round(m["p99_ms"], 3)
            row["c1_target_cpu_ms_per_request"] = m["target_cpu_ms_per_request"]
            if key != "embedding_worker":
                row["added_p50_ms"] = round(m["p50_ms"] - direct_p50, 3)
        if f"{key}_c32" in r32:
            m = r32[f"{key}_c32"]
            row["c32_rps"] = round(m["rps"], 1)
            row["c32_ratio"] = round(m["rps"] / direct_rps, 4)
            row["c32_target_cpu_ms_per_request"] = m["target_cpu_ms_per_request"]
        # the median over every round, beside the cleanest round's figure
        for c in ("c1", "c32"):
            values = [r[f"{key}_{c}"] for r in rounds if f"{key}_{c}" in r]
            if values:
                field_ = "p50_ms" if c == "c1" else "rps"
                row[f"{c}_{field_}_median_rounds"] = round(
                    statistics.median(v[field_] for v in values), 3
                )
        if key != "direct" and key != "embedding_worker":
            added = [
                r[f"{key}_c1"]["p50_ms"] - r["direct_c1"]["p50_ms"]
                for r in rounds
                if f"{key}_c1" in r and "direct_c1" in r
            ]
            if added:
                row["added_p50_ms_median_rounds"] = round(statistics.median(added), 3)
        f["scenarios"][key] = row
    s = f["scenarios"]
    met: dict[str, bool | None] = {
        "keyword_added_p50_ms": s["router_keyword"]["added_p50_ms"]
        <= TARGETS["keyword_added_p50_ms"],
        "keyword_tput_ratio_c32": s["router_keyword"]["c32_ratio"]
        >= TARGETS["keyword_tput_ratio_c32"],
        "embedding_added_over_own_ms": s["router_embedding"]["added_p50_ms"]
        <= s["embedding_worker"]["c1_p50_ms"] + TARGETS["embedding_added_over_own_ms"],
        "litellm_fraction": None,
    }
    if s.get("litellm", {}).get("added_p50_ms") is not None:
        ratio = s["router_keyword"]["added_p50_ms"] / s["litellm"]["added_p50_ms"]
        f["keyword_over_litellm_added"] = round(ratio, 4)
        met["litellm_fraction"] = ratio <= TARGETS["litellm_fraction"]
    f["targets_met"] = met
    return f


LABELS = {
    "direct": "direct to the fast backend",
    "router_keyword": "vllm-sr Router mode, one keyword signal",
    "litellm": "LiteLLM proxy, one static route",
    "router_embedding": "vllm-sr Router mode, one embedding signal (MiniLM)",
    "embedding_worker": "MiniLM `POST /v1/embeddings` straight to a worker (own p50)",
}


def _fmt(value: Any, digits: int = 2, suffix: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}{suffix}"


def markdown(record: dict[str, Any]) -> str:
    f = record["figures"]
    m = record["machine"]
    s = f["scenarios"]

    def met(key: str) -> str:
        value = f["targets_met"].get(key)
        return "(not measured)" if value is None else ("**met**" if value else "**not met**")

    lines = [
        "# Router mode: routing overhead (`vllm-sr serve --config`)",
        "",
        f"- date: {record['date']}",
        f"- machine: {m['cpu']}, {m['cores']} cores ({m['affinity']} usable), Python "
        f"{m['python']}, torch {m['torch']}; load average (1 min) {m['loadavg_before']:.2f} "
        f"before, {record['loadavg_after']:.2f} after; a pytest run "
        f"{'was' if record['pytest_running_before'] else 'was not'} running at the start, "
        f"{'was' if record['pytest_running_after'] else 'was not'} at the end"
        + (f"; {record['note']}" if record.get("note") else ""),
        f"- load generator: {record['wrk'] or 'the Python asyncio load generator'}, closed "
        "loop, `-t 1`; the load generator, the backend, the proxies and the MiniLM workers "
        "share the same cores",
        f"- LiteLLM: {record['litellm_version']}",
        f"- {record['rounds_asked']} rounds of {record['duration_s']:g} s measurements, the "
        "order reversed every other round; MiniLM workers (the router's managed one and the "
        f"one measured alone) with {record['threads']} torch thread(s) each",
        "",
        "Every request is `POST /v1/chat/completions` with `model: vllm-sr/auto` and one "
        "user message (a short corpus sentence, 10 to 16 words); the keyword ones start "
        f"`Please {KEYWORD} this function:`, which the keyword rule matches. The backend "
        "(bench/fast_backend.py: uvicorn, uvloop, httptools, a raw ASGI app) answers a fixed "
        "`chat.completion` at once. The keyword router's configuration has one listener, one "
        "provider model on that backend, one keyword signal and one decision (no worker); the "
        "embedding router's has MiniLM as `primary`, bound as `embedding` (`embedding.v1`), "
        "one embeddings rule and one decision (the default model is the same backend). "
        "LiteLLM runs `litellm --config` with one `model_list` entry "
        "(`openai/` provider, `api_base` the backend), one uvicorn worker, no database, no "
        "master key, spend and error logs off, `LITELLM_LOG=ERROR`. The routers run with "
        "`--log-level warning` and `VLLM_SRUN_RESULT_CACHE=0`; embedding texts are never "
        "repeated.",
        "",
        f"c1 columns from round {f['c1_round']}, c32 columns from round {f['c32_round']} "
        "(the cleanest: least CPU used by other processes); added p50 = scenario p50 - "
        "direct p50 at c1 in that round. CPU ms/req is the proxy's (or worker's) own CPU per "
        "request, its managed worker included.",
        "",
        "| scenario | c1 p50 ms | added p50 ms | c32 req/s | ratio vs direct | CPU ms/req c1 "
        "| CPU ms/req c32 |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key, label in LABELS.items():
        row = s.get(key)
        if not row:
            lines.append(f"| {label} | (skipped) | | | | | |")
            continue
        lines.append(
            f"| {label} | {_fmt(row.get('c1_p50_ms'), 3)} | {_fmt(row.get('added_p50_ms'), 3)} "
            f"| {_fmt(row.get('c32_rps'), 0)} | {_fmt(row.get('c32_ratio'), 3)} "
            f"| {_fmt(row.get('c1_target_cpu_ms_per_request'), 3)} "
            f"| {_fmt(row.get('c32_target_cpu_ms_per_request'), 3)} |"
        )
    kw, emb, own = s["router_keyword"], s["router_embedding"], s["embedding_worker"]
    lit = s.get("litellm") or {}
    lines += [
        "",
        "| target | measured | goal | |",
        "| --- | --- | --- | --- |",
        f"| keyword routing: added p50 at c1 | {kw['added_p50_ms']:.3f} ms "
        f"| <= {TARGETS['keyword_added_p50_ms']:g} ms | {met('keyword_added_p50_ms')} |",
        f"| keyword routing: c32 throughput / direct | {kw['c32_ratio']:.3f} "
        f"| >= {TARGETS['keyword_tput_ratio_c32']} | {met('keyword_tput_ratio_c32')} |",
        f"| embedding signal: added p50 at c1 | {emb['added_p50_ms']:.3f} ms | <= the "
        f"embedding's own p50 ({own['c1_p50_ms']:.3f} ms) + "
        f"{TARGETS['embedding_added_over_own_ms']:g} ms "
        f"| {met('embedding_added_over_own_ms')} |",
        f"| keyword added p50 / LiteLLM's added p50 "
        f"| {_fmt(f.get('keyword_over_litellm_added'), 3)} "
        f"(LiteLLM adds {_fmt(lit.get('added_p50_ms'), 3, ' ms')}) | <= 1/3 "
        f"| {met('litellm_fraction')} |",
        "",
        "Medians over all rounds (for comparison with the cleanest round's): added p50 at c1 "
        f"keyword {_fmt(kw.get('added_p50_ms_median_rounds'), 3, ' ms')}, embedding "
        f"{_fmt(emb.get('added_p50_ms_median_rounds'), 3, ' ms')}, LiteLLM "
        f"{_fmt(lit.get('added_p50_ms_median_rounds'), 3, ' ms')}.",
        "",
        "## Every measurement",
        "",
        "| round | measure | req/s | p50 ms | p99 ms | errors | wrapped | CPU % target / backend "
        "/ others | load avg | try |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for number, r in enumerate(record["rounds"], 1):
        for key, row in r.items():
            lines.append(
                f"| {number} | {key} | {row['rps']:.1f} | {row['p50_ms']:.3f} "
                f"| {row['p99_ms']:.2f} | {row['errors']} | {row['wrapped']} "
                f"| {row['target_cpu_pct']:.0f} / {row['backend_cpu_pct']:.0f} / "
                f"{row['foreign_cpu_pct']:.0f} | {row['loadavg']:.2f} "
                f"| {row['try']} of {len(row['tries'])} |"
            )
    lines += [
        "",
        "`wrapped` counts passes over a measurement's bodies after the first: the keyword "
        "and LiteLLM measurements cycle through 2000 texts on purpose (nothing on their path "
        "caches); the embedding ones must show 0.",
    ]
    profile = record.get("profile")
    if profile and "top_own" in profile:
        lines += [
            "",
            "## Where the keyword router's CPU goes (cProfile, CPU time, c1)",
            "",
            "A separate keyword router under cProfile (`time.process_time`), profiling from "
            f"after its warm-up to the end of a {record['duration_s']:g} s c1 load: "
            f"{profile['requests']} requests, {profile['cpu_us_per_request']:.0f} us of "
            f"profiled CPU per request (p50 {profile['p50_ms_under_profiler']:.2f} ms under "
            "the profiler, whose own cost inflates every figure: read the shares). Functions "
            "called at least about once per request, by cumulative time (own time is spent in "
            "the function itself; a coroutine counts once per resumption).",
            "",
            "| function | calls/req | cumulative us/req | share | own us/req | own share |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for row in profile["top_cumulative"]:
            lines.append(
                f"| `{row['function']}` | {row['calls_per_request']} "
                f"| {row['cumulative_us_per_request']:.0f} | {100 * row['cumulative_share']:.1f}% "
                f"| {row['own_us_per_request']:.0f} | {100 * row['own_share']:.1f}% |"
            )
        lines += [
            "",
            "By own time:",
            "",
            "| function | calls/req | own us/req | own share |",
            "| --- | --- | --- | --- |",
        ]
        for row in profile["top_own"]:
            lines.append(
                f"| `{row['function']}` | {row['calls_per_request']} "
                f"| {row['own_us_per_request']:.0f} | {100 * row['own_share']:.1f}% |"
            )
    elif profile:
        lines += ["", f"Profile: {profile.get('error')}"]
    return "\n".join(lines) + "\n"


def options(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (at least 2)")
    parser.add_argument(
        "--tries", type=int, default=2, help="tries per measurement while other processes are busy"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=max(1, (os.cpu_count() or 2) // 2),
        help="torch threads of each MiniLM worker (default: the frontend's own, half the cores)",
    )
    parser.add_argument("--model", type=Path, default=None, help="MiniLM model directory")
    parser.add_argument("--load-generator", choices=("auto", "wrk", "python"), default="auto")
    parser.add_argument("--wrk-threads", type=int, default=1, help="wrk -t (CPU is scarce)")
    parser.add_argument("--no-litellm", action="store_true", help="leave LiteLLM out")
    parser.add_argument(
        "--install-timeout", type=float, default=1200.0, help="seconds for pip to install LiteLLM"
    )
    parser.add_argument(
        "--no-profile", dest="profile", action="store_false", help="skip the cProfile pass"
    )
    parser.add_argument(
        "--quiet-limit",
        type=float,
        default=90.0,
        help="seconds each measurement waits at most for a quiet machine",
    )
    parser.add_argument("--note", default="", help="a note for the machine line of the report")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.duration < 8:
        log(f"warning: --duration {args.duration:g} is under the 8 s a stable c1 p50 needs")
    if args.rounds < 2:
        log("warning: --rounds under 2 measures no side twice")
    return args


def main(argv: list[str] | None = None) -> int:
    args = options(argv)

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)  # the finally blocks stop every process

    signal.signal(signal.SIGTERM, stop)
    if args.quiet_limit != 90.0:  # machine.cleanest waits through machine.wait_quiet
        machine_module.wait_quiet = functools.partial(
            machine_module.wait_quiet, limit_s=args.quiet_limit
        )
    record = run(args)
    if args.note:
        record["note"] = args.note
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "router.json").write_text(json.dumps(record, indent=2) + "\n")
    report = markdown(record)
    (args.results / "router.md").write_text(report)
    print(report)
    print(json.dumps(record["figures"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
