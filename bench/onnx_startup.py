"""Startup on ONNX Runtime: `vllm-srun serve MODEL --engine onnxruntime` without torch.

For MiniLM (exported once, in a child process) and Rampart (its own 4-bit graph), on a
runtime cache of the run's own (``VLLM_SRUN_CACHE_DIR``):

- a first start (MiniLM's export, every file hashed, the probes measured), then
  ``--restarts`` restarts on the cache it wrote: seconds from the command to the
  ``model ... is ready`` log line, and the server's peak RSS (``VmHWM``) then;
- where a restart's time goes: each phase timed in one fresh process, in the order
  the serve command runs them (:func:`phases`), and whether torch or transformers
  were imported.

Writes bench/results/onnx_startup.md and prints, as the last line, one JSON object with
the figures. Python's bytecode cache matters here (an installed wheel has it; a checkout
run with ``PYTHONDONTWRITEBYTECODE`` compiles every module at every start, about 0.3 s
more): the report says which it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
BIN = Path(sys.executable).parent
MODELS = ("sentence-transformers/all-MiniLM-L6-v2", "arcjet/rampart-pii")
TARGETS = {MODELS[0]: (1.5, 250.0), MODELS[1]: (2.0, None)}
"""Issue 32's targets: ready seconds and peak RSS MB of a restart."""


def serve_once(model: str, env: dict[str, str], limit_s: float = 600.0) -> dict[str, float]:
    """One `vllm-srun serve MODEL --engine onnxruntime`: ready seconds and VmHWM (MB).

    Raises:
        RuntimeError: the server exited, failed or did not get ready within ``limit_s``.
    """
    argv = [str(BIN / "vllm-srun"), "serve", model, "--offline", "--engine", "onnxruntime"]
    argv += ["--port", "0"]
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    assert process.stderr is not None
    try:
        for raw in process.stderr:
            line = raw.decode(errors="replace")
            if re.search(r"model \S+ is ready on", line):
                ready = time.perf_counter() - started
                status = Path(f"/proc/{process.pid}/status").read_text()
                peak = int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]
                return {"ready_s": round(ready, 3), "peak_rss_mb": round(peak, 1)}
            if "failed" in line or time.perf_counter() - started > limit_s:
                raise RuntimeError(f"{model} did not get ready: {line.strip()}")
        raise RuntimeError(f"{model}: the server exited ({process.wait()})")
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


PHASES = r"""
import functools, json, sys, time
start = time.perf_counter()
rows, last = [], [start]
def mark(name):
    now = time.perf_counter(); rows.append([name, round((now - last[0]) * 1000)]); last[0] = now
from vllm_srun.serve.main import serve  # noqa
from vllm_srun.serve.app import build_app  # noqa
mark("import the serve layer (fastapi, uvicorn, numpy, the runtime)")
from vllm_srun.plugins.host import load_catalog
catalog = load_catalog()
mark("plugin discovery and composition")
from vllm_srun.compose import loader, probe_cache
inner = {}
def timed(owner, name, label):
    real = getattr(owner, name)
    @functools.wraps(real)
    def wrapper(*args, **kwargs):
        began = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            inner[label] = inner.get(label, 0) + (time.perf_counter() - began) * 1000
    setattr(owner, name, wrapper)
timed(loader, "prepare", "resolve and verify (digests from the cache)")
timed(loader, "place", "placement (CPU flags)")
timed(loader, "choose_engine", "engine choice (the export's record)")
engine = type(catalog.layer("engines")["onnxruntime"])
family = type(catalog.layer("families")["task_heads"])
timed(engine, "load", "ONNX Runtime session")
timed(family, "load", "family load (tokenizer, heads)")
timed(loader, "attach_extensions", "extensions (Rampart: Presidio's import)")
timed(probe_cache.BatchInvarianceCache, "measured", "batch invariance (from the cache)")
timed(probe_cache.ForwardCostCache, "measured", "forward cost (from the cache)")
served = loader.load_model(sys.argv[1], loader.LoadOptions(offline=True, engine="onnxruntime"),
                           catalog=catalog)
mark("load the model")
rows.extend([["  " + k, round(v)] for k, v in inner.items()])
served.loaded.warm()
mark("warm up (Rampart: Presidio's patterns)")
from vllm_srun.compose.golden import check
status = check(served, catalog).status
mark(f"golden self-check ({status})")
print(json.dumps({"phases": rows, "total_ms": round((time.perf_counter() - start) * 1000),
                  "torch": "torch" in sys.modules, "transformers": "transformers" in sys.modules,
                  "invariance": served.batch_invariance.get("source"),
                  "forward_cost": served.forward_cost.get("source")}))
"""


def phases(model: str, env: dict[str, str]) -> dict[str, Any]:
    """Each phase of a restart, timed in one fresh process."""
    done = subprocess.run(
        [sys.executable, "-c", PHASES, model], env=env, capture_output=True, text=True, check=True
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=5)
    args = parser.parse_args()
    figures: dict[str, Any] = {}
    bytecode = not os.environ.get("PYTHONDONTWRITEBYTECODE") or any(
        (HERE.parent / "core" / "__pycache__").glob("*.pyc")
    )
    with tempfile.TemporaryDirectory(prefix="onnx-startup-") as cache:
        env = {**os.environ, "VLLM_SRUN_CACHE_DIR": cache}
        for model in MODELS:
            first = serve_once(model, env)
            time.sleep(2.5)  # the export's files settle: their stat identity is recorded
            serve_once(model, env)  # records them (the first restart hashes the graph once)
            again = [serve_once(model, env) for _ in range(args.restarts)]
            figures[model] = {
                "first": first,
                "restart_ready_s": statistics.median(r["ready_s"] for r in again),
                "restart_ready_min_s": min(r["ready_s"] for r in again),
                "restart_peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in again),
                "phases": phases(model, env),
            }
    load = os.getloadavg()[0]
    lines = [
        "# Startup on ONNX Runtime: `vllm-srun serve MODEL --engine onnxruntime`, no torch",
        "",
        f"- {os.cpu_count()} cores, load average {load:.2f}; Python bytecode "
        + ("cached (as an installed wheel)" if bytecode else "compiled at every start"),
        "- ready = the `model ... is ready` log line (`/health` 200 from then); peak RSS = "
        "the server's `VmHWM` then; restarts on the runtime cache the first start wrote "
        f"(median of {args.restarts})",
        "",
        "| model | first start | restart ready | restart peak RSS | target |",
        "| --- | --- | --- | --- | --- |",
    ]
    for model, found in figures.items():
        ready_target, rss_target = TARGETS[model]
        target = f"<= {ready_target} s" + (f", <= {rss_target:.0f} MB" if rss_target else "")
        lines.append(
            f"| {model} | {found['first']['ready_s']} s, {found['first']['peak_rss_mb']} MB | "
            f"{found['restart_ready_s']} s (min {found['restart_ready_min_s']}) | "
            f"{found['restart_peak_rss_mb']} MB | {target} |"
        )
    for model, found in figures.items():
        run = found["phases"]
        lines += [
            "",
            f"## {model}: a restart's phases (one process; torch imported: {run['torch']}, "
            f"transformers: {run['transformers']})",
            "",
            "| phase | wall ms |",
            "| --- | --- |",
        ]
        lines += [f"| {name} | {ms} |" for name, ms in run["phases"]]
        lines.append(
            f"| total (the server adds its start, the app and uvicorn) | {run['total_ms']} |"
        )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "onnx_startup.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
