"""Where a restart on ONNX Runtime spends its time: the phases of `vllm-srun serve MODEL
--engine onnxruntime` timed in one fresh process, and whether torch or transformers were
imported.

bench/startup.py (`make bench-startup`) calls :func:`phases` for MiniLM and Rampart on the
runtime cache its own starts warmed; the native path's phases are bench/startup_phases.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

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
