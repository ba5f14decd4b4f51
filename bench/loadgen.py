"""The load generators of the serving benchmark: closed loops of ``POST /v1/embeddings``.

``wrk`` with bench/embed.lua over a slice of a file of request bodies (installed
from Debian when missing and run as root), the Python asyncio generator that
stands in when wrk is missing and that samples the server's ``Server-Timing``
phases for the diagnostic pass, and :func:`measure`, which runs one
measurement with whichever was chosen.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from machine import log, percentile
from server import MODEL_ID, Server

HERE = Path(__file__).resolve().parent
PHASES = ("parse", "tokenize", "queue", "forward", "post", "total")
"""The ``Server-Timing`` phases the diagnostic pass reports, in the order they happen."""


def request_bodies(texts: list[str]) -> list[bytes]:
    """One ``/v1/embeddings`` JSON body per text."""
    return [json.dumps({"model": MODEL_ID, "input": t}).encode() for t in texts]


def run_wrk(
    port: int, bodies_file: Path, first: int, count: int, connections: int, threads: int,
    duration: float, path: str = "/v1/embeddings",
) -> dict[str, Any]:  # fmt: skip
    """One wrk measurement over lines ``first .. first+count-1`` (0-based) of the bodies file,
    each a ``POST path``."""
    threads = max(1, min(threads, connections))
    cmd = [
        "wrk", "-t", str(threads), "-c", str(connections), "-d", f"{duration:g}s",
        "--timeout", "30s", "-s", str(HERE / "embed.lua"), f"http://127.0.0.1:{port}",
        "--", str(bodies_file), str(first + 1), str(count), str(threads), path,
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
    port: int,
    bodies: list[bytes],
    connections: int,
    duration: float,
    timing: bool,
    path: str = "/v1/embeddings",
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
        f"POST {path} HTTP/1.1\r\n"
        "Host: 127.0.0.1:{port}\r\n"
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
    port: int,
    bodies: list[bytes],
    connections: int,
    duration: float,
    timing: bool = False,
    path: str = "/v1/embeddings",
) -> dict[str, Any]:
    """The Python load generator (fallback to wrk, and the Server-Timing sampler)."""
    return asyncio.run(_python_load(port, bodies, connections, duration, timing, path))


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


def http_client(port: int) -> http.client.HTTPConnection:
    """A plain connection to the server."""
    return http.client.HTTPConnection("127.0.0.1", port, timeout=60)


def measure(
    generator: str, server: Server | Any, bodies: list[bytes], bodies_file: Path, first: int,
    count: int, connections: int, wrk_threads: int, duration: float,
    path: str = "/v1/embeddings",
) -> dict[str, Any]:  # fmt: skip
    """One closed-loop measurement with the chosen load generator (``server``: anything
    with a ``port``), each request a ``POST path``."""
    if generator == "wrk":
        return run_wrk(
            server.port, bodies_file, first, count, connections, wrk_threads, duration, path
        )
    result = run_python(
        server.port, bodies[first : first + count], connections, duration, path=path
    )
    result.pop("server_timing", None)
    return result
