"""The export cache of the ``onnxruntime`` engine: safetensors weights to an ONNX graph, once.

A package without its own graph is exported through optimum's ONNX exporter
(transformers built-in model types only, ``trust_remote_code`` off, local files
only, on the CPU at float32) into ``<cache>/onnx/<weights digest>/<exporter
task>/model.onnx`` (:func:`export_dir`, under :func:`cache_root`), and every
later start reuses it. :func:`ensure_export` writes the export beside its place
and renames it in, so a crash never leaves a half graph there.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from vllm_srun.plugins.cache import runtime_cache_dir
from vllm_srun.plugins.spec import ModelSpec

EXPORT_TASKS = {
    "encoder": "feature-extraction",
    "sequence_classification": "text-classification",
    "token_classification": "token-classification",
}
"""Encoder task -> the optimum exporter task that yields its outputs."""

GRAPH_FILE = "model.onnx"
"""The graph file an export writes (large models add ``model.onnx_data`` beside it)."""


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """The runtime's cache directory, where exported graphs are kept
    (:func:`vllm_srun.plugins.runtime_cache_dir`)."""
    return runtime_cache_dir(environ)


def weights_digest(spec: ModelSpec) -> str:
    """The export cache key of a spec's weights: hex SHA-256.

    ``spec.weights_digest`` when the family set one. Otherwise computed: for a
    single weights file the SHA-256 of its bytes (so it equals a pinned file
    digest); for several, the SHA-256 over one ``name NUL file-digest`` line
    per file, in name order.

    Raises:
        ValueError: the spec names no weights files.
        OSError: a weights file cannot be read.
    """
    if spec.weights_digest:
        return spec.weights_digest
    if not spec.weights:
        raise ValueError("the package has no safetensors weights to digest")
    digests = {name: _file_sha256(spec.package / name) for name in spec.weights}
    if len(digests) == 1:
        return next(iter(digests.values()))
    combined = hashlib.sha256()
    for name in sorted(digests):
        combined.update(f"{name}\0{digests[name]}\n".encode())
    return combined.hexdigest()


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def export_dir(spec: ModelSpec, environ: Mapping[str, str] | None = None) -> Path:
    """Where the export of ``spec`` lives: ``<cache>/onnx/<weights digest>/<exporter task>/``.

    The task is part of the key because one set of weights exports to
    different graphs (a bare encoder, or encoder plus head).
    """
    return cache_root(environ) / "onnx" / weights_digest(spec) / EXPORT_TASKS[spec.task]


def export_onnx(spec: ModelSpec, output: Path) -> None:
    """Export ``spec``'s safetensors model to an ONNX graph in ``output`` (``model.onnx``).

    Runs optimum's exporter on the package directory with the optimum task of
    ``spec.task``, on the CPU at float32, transformers' built-in classes only,
    local files only and no remote code. optimum's validation run is kept: it
    raises when the graph's outputs do not have the model's shapes.

    Raises:
        ValueError: optimum cannot export the model.
        OSError: the package cannot be read or ``output`` written.
    """
    from optimum.exporters.onnx import main_export

    main_export(
        str(spec.package),
        output,
        task=EXPORT_TASKS[spec.task],
        device="cpu",
        library_name="transformers",
        local_files_only=True,
        trust_remote_code=False,
    )


def ensure_export(spec: ModelSpec, environ: Mapping[str, str] | None = None) -> Path:
    """The cached graph of ``spec``, exporting it first when the cache lacks it.

    The export is written into a temporary sibling folder and renamed into
    place in one step, so a crash mid-export never leaves a half graph where
    the next start would find it; when two processes export at once, the
    first rename wins and the other's copy is discarded.

    Returns:
        The path of ``model.onnx``.

    Raises:
        ValueError: optimum cannot export the model.
        OSError: the package cannot be read or the cache written.
    """
    return _build_once(export_dir(spec, environ), lambda staging: export_onnx(spec, staging))


OPTIMIZATION_LEVEL = 2
"""optimum's ``OptimizationConfig.optimization_level`` for ``max_speed``: 2 adds the
transformer fusions (attention, GELU, layer norm, skip layer norm) to ONNX Runtime's
basic ones; 99 would also fold shapes the CPU provider does not gain from."""


def optimized_dir(spec: ModelSpec, int8: bool, environ: Mapping[str, str] | None = None) -> Path:
    """Where the ``max_speed`` graph of ``spec`` lives: ``<export dir>/max_speed/`` (fused
    float32) or ``<export dir>/max_speed_int8/`` (fused, then int8 dynamic quantisation)."""
    return export_dir(spec, environ) / ("max_speed_int8" if int8 else "max_speed")


def optimize_onnx(source: Path, output: Path, int8: bool) -> None:
    """Write ``output/model.onnx``: ``source`` (an optimum export folder) with optimum's
    transformer fusions (:data:`OPTIMIZATION_LEVEL`; exact GELU, no approximation) and,
    with ``int8``, ONNX Runtime's dynamic int8 quantisation of the weights (per channel,
    signed; activations quantised per batch at run time, so answers then depend on the
    batch).

    Raises:
        ValueError: optimum cannot optimise the graph.
        OSError: ``source`` cannot be read or ``output`` written.
    """
    from optimum.onnxruntime import ORTOptimizer
    from optimum.onnxruntime.configuration import OptimizationConfig

    fused = output / "fused"
    optimizer = ORTOptimizer.from_pretrained(source, file_names=[GRAPH_FILE])
    optimizer.optimize(
        OptimizationConfig(optimization_level=OPTIMIZATION_LEVEL), fused, file_suffix=None
    )
    if not int8:
        (fused / GRAPH_FILE).rename(output / GRAPH_FILE)
        return
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # Fused nodes come from ONNX Runtime's own domain, which ONNX shape inference cannot
    # type: the quantiser is told their outputs are float32 (its documented option).
    quantize_dynamic(
        fused / GRAPH_FILE,
        output / GRAPH_FILE,
        weight_type=QuantType.QInt8,
        per_channel=True,
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )


def ensure_optimized(
    spec: ModelSpec, int8: bool = False, environ: Mapping[str, str] | None = None
) -> Path:
    """The cached ``max_speed`` graph of ``spec`` (:func:`optimize_onnx` of its export),
    built once per weights digest and kept beside the export (:func:`optimized_dir`).

    Raises:
        ValueError: optimum cannot export or optimise the model.
        OSError: the package cannot be read or the cache written.
    """
    source = ensure_export(spec, environ).parent
    return _build_once(
        optimized_dir(spec, int8, environ), lambda staging: optimize_onnx(source, staging, int8)
    )


def _build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """``target/model.onnx``, built by ``build(staging)`` into a sibling folder renamed
    into place when the cache lacks it (see :func:`ensure_export`)."""
    graph = target / GRAPH_FILE
    if graph.is_file():
        return graph
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        build(staging)
        if not (staging / GRAPH_FILE).is_file():
            raise ValueError(f"no {GRAPH_FILE} was written for {target}")
        if target.exists() and not graph.is_file():
            shutil.rmtree(target)  # not one of ours: a complete build always has the graph
        try:
            staging.rename(target)
        except OSError:
            if not graph.is_file():  # not a concurrent build that won the race
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return graph


__all__ = [
    "EXPORT_TASKS",
    "GRAPH_FILE",
    "OPTIMIZATION_LEVEL",
    "cache_root",
    "ensure_export",
    "ensure_optimized",
    "export_dir",
    "export_onnx",
    "optimize_onnx",
    "optimized_dir",
    "weights_digest",
]
