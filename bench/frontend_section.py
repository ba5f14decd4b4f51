"""The frontend section of the serving benchmark: ``vllm-sr serve -e`` in front of workers.

Two comparisons, each measured back to back on the same corpus slices' kind (every
measurement its own slice, so no answer comes from a cache):

- **decisions**: ``POST /v1/systemone`` (a Choice question about one corpus sentence)
  straight to one ``vllm-srun serve`` worker (``--threads N``) vs through a frontend
  whose deployment is attached to that same worker (its listener, its pool): the p50
  the frontend adds at one connection, and the c32 throughput ratio;
- **embeddings**: ``POST /v1/embeddings`` straight to that one worker with N threads vs
  through a frontend's ``runtime`` grant over two managed workers of one thread each
  (``-dp 2``, ``VLLM_SRUN_CPU_THREADS=1``): the c32 (and c1) ratios.

The frontends run with ``--log-level warning`` (a worker's access lines are not
re-logged) and ``VLLM_SRUN_RESULT_CACHE=0`` (nothing is answered from the frontend's
own cache).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from machine import CpuMeter, cleanest, log
from server import BIN, MODEL_ID, Server, free_port, register, registered, stopped

DECISIONS_PATH = "/v1/systemone"
EMBEDDINGS_PATH = "/v1/embeddings"

CRITERIA = {
    "billing": "Payments, charges and refunds",
    "shipping": "Parcels and delivery",
    "technical": "Bugs, crashes and errors",
}

FRONTEND_TARGETS = {"added_p50_ms": 1.0, "decisions_tput_ratio_c32": 0.95}
"""Issue 14's targets: the p50 the frontend adds at c1 (at most, ms) and its c32 decisions
throughput over the worker's own (at least)."""


def decision_bodies(texts: list[str]) -> list[bytes]:
    """One ``/v1/systemone`` body per text: a Choice question about it."""
    return [
        json.dumps(
            {
                "model": MODEL_ID,
                "state": text,
                "questions": {
                    "team": {
                        "type": "choice",
                        "instructions": "Which team should handle this?",
                        "criteria": CRITERIA,
                    }
                },
            }
        ).encode()
        for text in texts
    ]


def port_offset() -> int:
    """An offset that puts the frontend's 8080, 8899 and 9190 on free ports; below the
    ephemeral ports :func:`free_port` hands out, so a listener's port less it is a port."""
    chooser = random.Random()
    for _ in range(100):
        offset = chooser.randrange(1000, 20000)
        try:
            for port in (8080 + offset, 8899 + offset, 9190 + offset):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return offset
    raise RuntimeError("no free port offset for the frontend")


def served_config(text: str, offset: int) -> str:
    """``text`` as a frontend with ``VLLM_SR_PORT_OFFSET=offset`` is given it: each
    listener's port less the offset (which the frontend adds back), so the listeners bind
    the ports ``text`` names."""
    document = yaml.safe_load(text) or {}
    for listener in document.get("listeners") or []:
        listener["port"] -= offset
    return yaml.safe_dump(document, sort_keys=False)


@dataclass
class Target:
    """Where a measurement sends its requests (what :func:`loadgen.measure` reads)."""

    port: int


class Frontend:
    """``vllm-sr serve -e --config FILE`` in a child process; always stopped by :meth:`stop`."""

    def __init__(self, name: str, config: str, env: dict[str, str], listener: int) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix=f"vsr-bench-{name}-", dir="/tmp"))
        self.offset = port_offset()
        (self.folder / "config.yaml").write_text(served_config(config, self.offset))
        self.port = listener
        self.mgmt = f"http://127.0.0.1:{8080 + self.offset}"
        self.log = (self.folder / "frontend.log").open("w+")
        self.cmd = [
            str(BIN / "vllm-sr"),
            "serve",
            "-e",
            "--config",
            str(self.folder / "config.yaml"),
            "--offline",
            "--log-level",
            "warning",
        ]
        environ = {
            **os.environ,
            "VLLM_SR_PORT_OFFSET": str(self.offset),
            "VLLM_SRUN_DIR": str(self.folder / "run"),
            "VLLM_SRUN_COMMAND": str(BIN / "vllm-srun"),
            "VLLM_SRUN_RESULT_CACHE": "0",
            **env,
        }
        log(f"starting frontend {name}: " + " ".join(self.cmd))
        register(self)  # stopped at exit too: an interrupted run leaves no frontend
        self.proc = subprocess.Popen(
            self.cmd, stdout=self.log, stderr=subprocess.STDOUT, env=environ
        )

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.mgmt + path, timeout=5) as resp:
            return json.loads(resp.read())

    def wait_ready(self, replicas: int, timeout: float = 180.0) -> float:
        """Seconds until ``/ready`` and every replica of its deployment are ready."""
        started = time.perf_counter()
        while time.perf_counter() - started < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the frontend exited ({self.proc.returncode}):\n{self.tail()}")
            with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
                [entry] = self.get("/api/v1/inventory/model-runtime")["deployments"]
                if entry["ready_replicas"] == replicas:
                    with urllib.request.urlopen(self.mgmt + "/ready", timeout=5) as resp:
                        if resp.status == 200:
                            return time.perf_counter() - started
            time.sleep(0.25)
        raise RuntimeError(f"the frontend was not ready within {timeout:.0f} s:\n{self.tail()}")

    def pids(self) -> list[int]:
        """The frontend's and its workers' pids (what the CPU meter counts as the server)."""
        import psutil

        return [self.proc.pid, *(c.pid for c in psutil.Process(self.proc.pid).children())]

    def tail(self, lines: int = 40) -> str:
        self.log.flush()
        return "\n".join((self.folder / "frontend.log").read_text().splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM (the frontend stops its workers), SIGKILL after 30 s (a second call
        does nothing)."""
        if not registered(self):
            return
        proc: subprocess.Popen[bytes] | None = getattr(self, "proc", None)  # None: not started
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self.log.close()
        subprocess.run(["rm", "-rf", str(self.folder)], check=False)
        stopped(self)


def attached_config(worker_port: int, listener: int) -> str:
    """A frontend attached to the worker on ``worker_port``, System One on ``listener``."""
    return f"""
global:
  model_catalog:
    deployments:
      minilm:
        provider: model_runtime
        artifact: {MODEL_ID}
        endpoint: http://127.0.0.1:{worker_port}
        served_name: {MODEL_ID}
    system:
      decision_model: {{deployment: minilm}}
listeners:
  - name: bench
    address: 127.0.0.1
    port: {listener}
    systemone: {{models: [{MODEL_ID}]}}
"""


def managed_config(replicas: int, listener: int) -> str:
    """A frontend with ``replicas`` managed MiniLM workers, published on a runtime grant."""
    placements = ", ".join("{device: cpu}" for _ in range(replicas))
    return f"""
global:
  model_catalog:
    deployments:
      minilm:
        provider: model_runtime
        artifact: {MODEL_ID}
        replicas: [{placements}]
    system:
      decision_model: {{deployment: minilm}}
listeners:
  - name: bench
    address: 127.0.0.1
    port: {listener}
    runtime: {{models: [{MODEL_ID}]}}
"""


@dataclass
class FrontendSection:
    """The frontend section's measurements, sharing the serving run's corpus and tools."""

    args: Any
    take: Callable[[int], tuple[int, list[str]]]
    slice_size: int
    generator: str
    run_measure: Callable[..., dict[str, Any]]

    def one(
        self,
        label: str,
        target: Target,
        bodies: list[bytes],
        bodies_file: Path,
        path: str,
        c: int,
        pids: Callable[[], list[int]],
    ) -> dict[str, Any]:
        """The cleanest of ``--tries`` closed-loop measurements, each on a fresh slice."""

        def once() -> dict[str, Any]:
            first, _ = self.take(self.slice_size)
            meter = CpuMeter(None)
            import psutil

            processes = [psutil.Process(p) for p in pids()]
            before = sum(sum(p.cpu_times()[:2]) for p in processes)
            result = self.run_measure(
                self.generator, target, bodies, bodies_file, first, self.slice_size, c,
                self.args.wrk_threads, self.args.duration, path,
            )  # fmt: skip
            spent = sum(sum(p.cpu_times()[:2]) for p in processes) - before
            result.update(meter.stop())
            server_pct = 100 * spent / result["seconds"]
            result["server_cpu_pct"] = round(server_pct, 1)
            result["foreign_cpu_pct"] = round(max(0.0, result["foreign_cpu_pct"] - server_pct), 1)
            log(
                f"{label} c{c}: {result['rps']:.1f} req/s, p50 {result['p50_ms']:.2f} ms, "
                f"p99 {result['p99_ms']:.2f} ms, errors {result['errors']}, CPU % server "
                f"{server_pct:.0f} others {result['foreign_cpu_pct']:.0f}"
            )
            return result

        return cleanest(f"{label} c{c}", self.args.tries, once)


def run_section(
    args: Any,
    model_dir: Path,
    take: Callable[[int], tuple[int, list[str]]],
    texts: list[str],
    slice_size: int,
    generator: str,
    run_measure: Callable[..., dict[str, Any]],
    embedding_bodies: list[bytes],
    embedding_file: Path,
) -> dict[str, Any]:
    """Both comparisons, ``args.rounds`` rounds each; the figures and every measurement."""
    section = FrontendSection(args, take, slice_size, generator, run_measure)
    decisions = decision_bodies(texts)
    decisions_file = Path(tempfile.mkstemp(prefix="vllm-sr-bench-", suffix=".jsonl")[1])
    decisions_file.write_bytes(b"\n".join(decisions) + b"\n")
    worker = Server(model_dir, free_port(), args.threads, [])
    direct = Target(worker.port)
    frontend: Frontend | None = None
    rounds: list[dict[str, Any]] = []
    try:
        worker.wait_ready(120)
        worker_pids = lambda: [worker.proc.pid]  # noqa: E731
        # -- decisions: the same worker, straight and through an attached frontend ----------
        listener = free_port()
        frontend = Frontend("decisions", attached_config(worker.port, listener), {}, listener)
        frontend.wait_ready(1)
        through = Target(frontend.port)
        both = lambda: [worker.proc.pid, *frontend.pids()]  # noqa: E731
        warm = decisions[:64]
        for body in warm:  # the option descriptions' embeddings warm the worker's cache
            request = urllib.request.Request(
                f"http://127.0.0.1:{worker.port}{DECISIONS_PATH}",
                body,
                {"content-type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=30) as resp:
                resp.read()
        for number in range(1, args.rounds + 1):
            log(f"frontend section, decisions round {number} of {args.rounds}")
            record: dict[str, Any] = {}
            for c in (32, 1):
                record[f"direct_c{c}"] = section.one(
                    "worker", direct, decisions, decisions_file, DECISIONS_PATH, c, worker_pids
                )
                record[f"frontend_c{c}"] = section.one(
                    "frontend", through, decisions, decisions_file, DECISIONS_PATH, c, both
                )
            rounds.append({"decisions": record})
        frontend.stop()
        # -- embeddings: one worker with N threads vs -dp 2 of one thread each ---------------
        listener = free_port()
        frontend = Frontend(
            "embeddings", managed_config(2, listener), {"VLLM_SRUN_CPU_THREADS": "1"}, listener
        )
        frontend.wait_ready(2)
        through = Target(listener)
        for number in range(1, args.rounds + 1):
            log(f"frontend section, embeddings round {number} of {args.rounds}")
            record = {}
            for c in (32, 1):
                record[f"worker_c{c}"] = section.one(
                    f"1 worker x {args.threads} threads", direct, embedding_bodies,
                    embedding_file, EMBEDDINGS_PATH, c, worker_pids,
                )  # fmt: skip
                record[f"dp2_c{c}"] = section.one(
                    "frontend -dp 2 x 1 thread", through, embedding_bodies, embedding_file,
                    EMBEDDINGS_PATH, c, frontend.pids,
                )  # fmt: skip
            rounds[number - 1]["embeddings"] = record
    finally:
        if frontend is not None:
            frontend.stop()
        worker.stop()
        decisions_file.unlink(missing_ok=True)
    return {"figures": figures(rounds, args), "rounds": rounds}


def figures(rounds: list[dict[str, Any]], args: Any) -> dict[str, Any]:
    """Means over the rounds, and the targets."""

    def mean(part: str, key: str, field: str) -> float:
        return sum(r[part][key][field] for r in rounds) / len(rounds)

    d_ratio = mean("decisions", "frontend_c32", "rps") / mean("decisions", "direct_c32", "rps")
    added = mean("decisions", "frontend_c1", "p50_ms") - mean("decisions", "direct_c1", "p50_ms")
    found: dict[str, Any] = {
        "decisions_worker_rps_c32": round(mean("decisions", "direct_c32", "rps"), 2),
        "decisions_frontend_rps_c32": round(mean("decisions", "frontend_c32", "rps"), 2),
        "decisions_tput_ratio_c32": round(d_ratio, 4),
        "decisions_worker_p50_ms_c1": round(mean("decisions", "direct_c1", "p50_ms"), 3),
        "decisions_frontend_p50_ms_c1": round(mean("decisions", "frontend_c1", "p50_ms"), 3),
        "added_p50_ms": round(added, 3),
        "embeddings_worker_rps_c32": round(mean("embeddings", "worker_c32", "rps"), 2),
        "embeddings_dp2_rps_c32": round(mean("embeddings", "dp2_c32", "rps"), 2),
        "embeddings_dp2_ratio_c32": round(
            mean("embeddings", "dp2_c32", "rps") / mean("embeddings", "worker_c32", "rps"), 4
        ),
        "embeddings_worker_rps_c1": round(mean("embeddings", "worker_c1", "rps"), 2),
        "embeddings_dp2_rps_c1": round(mean("embeddings", "dp2_c1", "rps"), 2),
        "embeddings_dp2_ratio_c1": round(
            mean("embeddings", "dp2_c1", "rps") / mean("embeddings", "worker_c1", "rps"), 4
        ),
        "threads": args.threads,
        "rounds": len(rounds),
        "duration_s": args.duration,
    }
    found["targets_met"] = {
        "added_p50_ms": found["added_p50_ms"] <= FRONTEND_TARGETS["added_p50_ms"],
        "decisions_tput_ratio_c32": (
            found["decisions_tput_ratio_c32"] >= FRONTEND_TARGETS["decisions_tput_ratio_c32"]
        ),
    }
    return found


def markdown(section: dict[str, Any]) -> list[str]:
    """The frontend section of serving.md."""
    f = section["figures"]

    def met(key: str) -> str:
        return "**met**" if f["targets_met"][key] else "**not met**"

    m = section["machine"]
    lines = [
        "# Serving through the frontend (`vllm-sr serve -e`)",
        "",
        f"- date: {section['date']}",
        f"- machine: {m['cpu']}, {m['cores']} cores ({m['affinity']} usable), Python "
        f"{m['python']}, torch {m['torch']}; load average {m['loadavg_before']:.2f} before, "
        f"{section['loadavg_after']:.2f} after",
        f"- load generator: {section['wrk'] or 'the Python asyncio load generator'} "
        "(closed loop, one question or text per request, every measurement its own corpus "
        "slice); the load generator, the frontend and the workers share the same cores",
        "",
        "Decisions: `POST /v1/systemone` (a Choice question of three options about one corpus "
        f"sentence) straight to one worker (`--threads {f['threads']}`) vs through a frontend "
        "attached to that same worker. Embeddings: `POST /v1/embeddings` straight to that "
        "worker vs through a frontend's `runtime` grant over two managed workers of one "
        "thread each (`-dp 2`, `VLLM_SRUN_CPU_THREADS=1`). Frontends run with `--log-level "
        f"warning` and `VLLM_SRUN_RESULT_CACHE=0`; {f['rounds']} rounds of "
        f"{f['duration_s']:g} s measurements, means over the rounds.",
        "",
        "| figure | value | goal | |",
        "| --- | --- | --- | --- |",
        f"| added p50 at c1 (frontend - worker, decisions) | {f['added_p50_ms']:.2f} ms "
        f"| <= {FRONTEND_TARGETS['added_p50_ms']} ms | {met('added_p50_ms')} |",
        f"| decisions c32 throughput, frontend / worker | {f['decisions_tput_ratio_c32']:.3f} "
        f"| >= {FRONTEND_TARGETS['decisions_tput_ratio_c32']} "
        f"| {met('decisions_tput_ratio_c32')} |",
        f"| embeddings c32, -dp 2 x 1 thread / 1 worker x {f['threads']} threads "
        f"| {f['embeddings_dp2_ratio_c32']:.3f} | (reported) | |",
        f"| embeddings c1, -dp 2 x 1 thread / 1 worker x {f['threads']} threads "
        f"| {f['embeddings_dp2_ratio_c1']:.3f} | (reported) | |",
        "",
        "| round | measure | req/s | p50 ms | p99 ms | errors | CPU % server / others | try |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for number, r in enumerate(section["rounds"], 1):
        for part, record in r.items():
            for key, row in record.items():
                lines.append(
                    f"| {number} | {part} {key} | {row['rps']:.1f} | {row['p50_ms']:.2f} "
                    f"| {row['p99_ms']:.2f} | {row['errors']} | {row['server_cpu_pct']:.0f} / "
                    f"{row['foreign_cpu_pct']:.0f} | {row['try']} of {len(row['tries'])} |"
                )
    lines += [
        "",
        "CPU % server counts the worker and, through the frontend, the frontend and its "
        "workers too (percent of one core).",
    ]
    return lines


if __name__ == "__main__":  # pragma: no cover - run through bench/run.py
    sys.exit("run bench/run.py (make bench); --sections frontend runs this section alone")
