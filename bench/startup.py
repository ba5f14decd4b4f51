"""Startup benchmark: what `make bench-startup` runs.

Startup cost of plugin composition, measured side by side in one run:
in-process discovery + composition of the installed plugins (`load_catalog`)
against the cost of importing torch, which every process pays anyway, and the
whole `vllm-srun devices` command against a bare `python -c "import torch"`.
Prints a Markdown report to bench/results/startup.md and, as the last line,
one JSON object with the figures.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
BIN = Path(sys.executable).parent


def best_of(repeat: int, fn) -> tuple[float, float]:
    """Median and minimum wall time of ``fn`` in milliseconds over ``repeat`` calls."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), min(times)


def main() -> int:
    import torch  # noqa: F401  (paid before timing composition)

    from vllm_srun.plugins import load_catalog

    load_catalog({})  # warm: modules imported once per process
    catalog_ms, _ = best_of(50, lambda: load_catalog({}))

    def bare() -> None:
        subprocess.run([sys.executable, "-c", "import torch"], check=True)

    def devices() -> None:
        subprocess.run([str(BIN / "vllm-srun"), "devices"], check=True, capture_output=True)

    bare_ms, _ = best_of(5, bare)
    cli_ms, _ = best_of(5, devices)
    figures = {
        "catalog_ms": round(catalog_ms, 2),
        "python_import_torch_ms": round(bare_ms, 1),
        "vllm_srun_devices_ms": round(cli_ms, 1),
        "devices_over_import_torch": round(cli_ms / bare_ms, 3),
    }
    RESULTS.mkdir(exist_ok=True)
    report = [
        "# Startup: plugin discovery and composition",
        "",
        "| measure | median ms |",
        "| --- | --- |",
        f"| load_catalog() in process (discover + compose, warm) | {figures['catalog_ms']} |",
        f"| python -c 'import torch' | {figures['python_import_torch_ms']} |",
        f"| vllm-srun devices | {figures['vllm_srun_devices_ms']} |",
        "",
        f"`vllm-srun devices` / bare torch import: {figures['devices_over_import_torch']}",
        "",
    ]
    (RESULTS / "startup.md").write_text("\n".join(report))
    print("\n".join(report))
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
