"""Where a start's time goes: the phases of `vllm-srun serve MODEL` timed in one process.

Run by bench/startup.py in a fresh process (imports are paid once per process):
``python bench/startup_phases.py MODEL``. Each phase is what the serve command
and :func:`vllm_srun.compose.loader.load_model` do, in their order, called one by one:
imports, plugin discovery, resolution and verification (digests from the
runtime cache when it has them), the family and engine loads, the load-time
probes and the golden self-check. Prints one JSON object: ``phases`` (name,
wall ms, CPU ms, RSS after in MB) and ``peak_rss_mb``.
"""

from __future__ import annotations

import json
import sys
import time
from importlib import import_module
from pathlib import Path
from typing import Any


class Phases:
    """Wall and CPU time of consecutive phases, and the RSS after each."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.wall = time.perf_counter()
        self.cpu = time.process_time()

    def done(self, name: str) -> None:
        """Close the phase ``name`` (it began where the previous one ended)."""
        wall, cpu = time.perf_counter(), time.process_time()
        self.rows.append(
            {
                "name": name,
                "wall_ms": round((wall - self.wall) * 1000),
                "cpu_ms": round((cpu - self.cpu) * 1000),
                "rss_mb": round(_status("VmRSS") / 1024),
            }
        )
        self.wall, self.cpu = time.perf_counter(), time.process_time()


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def main(model: str) -> dict[str, Any]:
    clock = Phases()
    import torch  # noqa: F401

    clock.done("import torch")
    from vllm_srun.serve.app import build_app  # noqa: F401
    from vllm_srun.serve.main import serve  # noqa: F401

    clock.done("import the serve layer (fastapi, uvicorn, pydantic)")
    from vllm_srun.plugins.host import load_catalog

    catalog = load_catalog()
    clock.done("plugin discovery and composition")
    from vllm_srun.compose import loader, registry

    if hasattr(registry, "DigestCache"):
        digests = registry.DigestCache.default()
        prepared = registry.prepare(
            model, builtins=catalog.layer("models"), offline=True, digest_cache=digests
        )
        clock.done(f"resolve and verify ({digests.misses} hashed, {digests.hits} from the cache)")
    else:  # a checkout from before the digest cache (a --baseline)
        prepared = registry.prepare(model, builtins=catalog.layer("models"), offline=True)
        clock.done("resolve and verify (every file hashed)")
    if hasattr(loader, "import_transformers_lean"):
        loader.import_transformers_lean()
    else:
        import transformers.generation.utils
        import transformers.modeling_utils  # noqa: F401
    clock.done("import transformers' model base")
    from vllm_srun.compose.extended import attach_extensions
    from vllm_srun.compose.placement import place, required_bytes

    package = prepared.source.path
    assert prepared.entry is not None
    family = catalog.layer("families")[prepared.entry.family]
    spec = family.describe(package)
    placement = place(catalog, "auto", lambda p: required_bytes(spec, p))
    engine = catalog.layer("engines")["native"]
    profiles = getattr(import_module("vllm_srun.plugins"), "profiles", None)
    exact = getattr(profiles, "EXACT", None)  # None: a checkout from before profiles
    if exact is None:
        kernels = engine.select_kernels(
            catalog.layer("kernels").values(), placement.accelerator.name
        )
    else:
        kernels = engine.select_kernels(
            catalog.layer("kernels").values(), placement.accelerator.name, exact.name
        )
    options = {"torch_device": placement.accelerator.torch_device(None), "kernels": kernels}
    if exact is not None:
        options["profile"] = exact
    engine_model = engine.load(spec, placement.device, options)
    clock.done("engine load (weights)")
    loaded = attach_extensions(catalog, family.load(package, spec, engine_model))
    clock.done("family load (tokenizer, heads)")
    from vllm_srun.compose.probes import measure_batch_invariance, measure_forward_cost

    if exact is not None:  # as load_model runs it under the default profile, exact
        from vllm_srun.compose.batching import fill_forward

        measure_batch_invariance(loaded, 0.0, fill_forward(loaded.run))
    else:
        measure_batch_invariance(loaded)
    clock.done("batch-invariance probe (exact)" if exact is not None else "batch-invariance probe")
    release = getattr(import_module("vllm_srun.compose.probes"), "release_freed_heap", None)
    if release is not None:
        release()
    measure_forward_cost(loaded)
    clock.done("forward-cost probe (measured; a restart reads it from the runtime cache)")
    from vllm_srun.compose.golden import check

    served = loader.ServedModel(
        name=model,
        package=package,
        family=family,
        engine=engine,
        placement=placement,
        spec=spec,
        loaded=loaded,
        kernels={slot: k.name for slot, k in kernels.items()},
        identity=prepared.entry.name,
        prepared=prepared,
    )
    result = check(served, catalog)
    clock.done(f"golden self-check ({result.status})")
    return {"phases": clock.rows, "peak_rss_mb": round(_status("VmHWM") / 1024, 1)}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
