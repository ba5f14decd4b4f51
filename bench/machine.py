"""The machine under the serving benchmark and the bookkeeping every measurement shares.

Progress logging, percentiles, what the figures were measured on, waiting for a
quiet machine, CPU metering of a span (the server, this process, its children,
everyone else) and :func:`cleanest`, which retries a measurement while other
processes take CPU and keeps the least noisy try.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CLEAN_PCT = 15.0
"""A try during which other processes used less than this (percent of one core) is clean."""

FIGURE_KEYS = (
    "tps", "p50_ms", "rps", "p99_ms", "requests", "cache_hits", "cache_misses",
    "cache_hit_rate", "wrapped", "errors",
)  # fmt: skip
"""The figures of a try that :func:`cleanest` keeps for every try, the kept one or not."""


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


def cleanest(label: str, tries: int, once: Callable[[], dict[str, Any]]) -> dict[str, Any]:
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
