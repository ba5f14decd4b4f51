"""The export cache of the ``onnxruntime`` engine: safetensors weights to an ONNX graph, once.

A package without its own graph is exported through optimum's ONNX exporter
(transformers built-in model types only, ``trust_remote_code`` off, local files
only, on the CPU at float32) into ``<cache>/onnx/<weights digest>/<exporter
task>/model.onnx`` (:func:`export_dir`, under :func:`cache_root`), and every
later start reuses it. :func:`ensure_export` writes the export beside its place
and renames it in, so a crash never leaves a half graph there.

Every build carries a record, ``record.json`` (:data:`RECORD_FILE`): the weights
digest it was built from, the SHA-256 of each file it wrote (with the file's
``stat`` identity once the file has settled, as the runtime's digest cache keeps
them: :mod:`vllm_srun.compose.registry.digests`), what it is (``export`` or
``max_speed`` with or without int8) and the versions of the libraries that built
it. A build is used only when its record matches (:func:`check_build`): the files
are hashed again unless their ``stat`` identity is the recorded one, so a restart
reads the record and hashes nothing; a build whose record is missing or does not
match is built again, with a warning saying why.

The export and the ``max_speed`` optimisation import torch, transformers and
optimum (seconds, and hundreds of MB that stay in the process). A process that has
not imported torch and transformers runs them in a child process
(``python -m vllm_srun.engines.onnxruntime.build``, :mod:`.build`), so a server of a
cached graph never imports them, and a first start only in the child.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from vllm_srun.plugins.cache import library_versions, runtime_cache_dir, write_json_atomically
from vllm_srun.plugins.spec import ModelSpec

log = logging.getLogger("vllm_srun.engines.onnxruntime")

EXPORT_TASKS = {
    "encoder": "feature-extraction",
    "sequence_classification": "text-classification",
    "token_classification": "token-classification",
}
"""Encoder task -> the optimum exporter task that yields its outputs."""

GRAPH_FILE = "model.onnx"
"""The graph file an export writes (large models add ``model.onnx_data`` beside it)."""

RECORD_FILE = "record.json"
"""The record every build carries beside its graph (the module's description)."""

RECORD_VERSION = 2
"""The record's ``version``; a build recorded by another version is built again (2: the
weights beside the graph, :data:`WEIGHTS_FILE`)."""

BUILD_LIBRARIES = ("optimum-onnx", "optimum", "transformers", "torch", "onnx", "onnxruntime")
"""The distributions whose versions a record names (what built the graph)."""

SETTLE_NS = 2_000_000_000
"""How old (ns) a file's newest timestamp must be for its ``stat`` identity to be recorded
(the digest cache's rule: a same-size rewrite within a coarse clock tick keeps every
field, so a fresh file is hashed again at the next check instead)."""

IN_PROCESS_MODULES = ("torch", "transformers")
"""When both are imported already, builds and the export check run in this process
(they cost nothing more there); otherwise in a child process (:mod:`.build`)."""


class BuildError(ValueError):
    """A build or its check failed in the child process; the message says what it printed."""


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


def _file_identity(path: Path) -> dict[str, int]:
    info = path.stat()
    return {
        "device": info.st_dev,
        "inode": info.st_ino,
        "size": info.st_size,
        "mtime_ns": info.st_mtime_ns,
        "ctime_ns": info.st_ctime_ns,
    }


def _settled(identity: Mapping[str, int], started_ns: int) -> bool:
    return started_ns - max(identity["mtime_ns"], identity["ctime_ns"]) >= SETTLE_NS


def _built_files(folder: Path) -> list[str]:
    """The files a build wrote at its top level (its record aside): a ``max_speed`` build
    lives in a folder inside the export's and has a record of its own."""
    return sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != RECORD_FILE)


def write_record(folder: Path, weights: str, kind: str) -> dict[str, Any]:
    """Write ``folder/record.json`` for the build in ``folder`` (every file at its top level
    hashed).

    Args:
        folder: the finished build.
        weights: the weights digest it was built from.
        kind: ``export``, ``max_speed`` or ``max_speed_int8``.

    Returns:
        The record.

    Raises:
        OSError: a file cannot be read or the record written.
    """
    started = time.time_ns()
    files: dict[str, dict[str, Any]] = {}
    for rel in _built_files(folder):
        identity = _file_identity(folder / rel)
        entry: dict[str, Any] = {"sha256": _file_sha256(folder / rel)}
        if _settled(identity, started) and _file_identity(folder / rel) == identity:
            entry["stat"] = identity
        files[rel] = entry
    record = {
        "version": RECORD_VERSION,
        "kind": kind,
        "weights_digest": weights,
        "graph": GRAPH_FILE,
        "files": files,
        "libraries": library_versions(BUILD_LIBRARIES),
    }
    write_json_atomically(folder / RECORD_FILE, record)
    return record


def check_build(folder: Path, weights: str, kind: str) -> str | None:
    """``None`` when ``folder`` holds a build of ``kind`` from ``weights`` whose files match
    its record; else why not (``no build``, ``no record``, ``model.onnx differs from
    its record``, ...). A file whose ``stat`` identity is the recorded one is not read;
    one without (or with another, unchanged bytes) is hashed, and the record is
    updated with its identity once it has settled (quietly skipped when the cache
    cannot be written). Never raises."""
    if not (folder / GRAPH_FILE).is_file():
        return "no build"
    try:
        record = json.loads((folder / RECORD_FILE).read_bytes())
    except FileNotFoundError:
        return f"it has no {RECORD_FILE}"
    except (OSError, ValueError) as err:
        return f"its {RECORD_FILE} cannot be read ({err})"
    if not isinstance(record, dict) or record.get("version") != RECORD_VERSION:
        return f"its {RECORD_FILE} is not a version {RECORD_VERSION} record"
    if record.get("weights_digest") != weights or record.get("kind") != kind:
        return "its record names other weights or another build"
    files = record.get("files")
    if not isinstance(files, dict) or GRAPH_FILE not in files:
        return f"its record lists no {GRAPH_FILE}"
    if sorted(files) != _built_files(folder):
        return "its files are not the ones its record lists"
    started, refreshed = time.time_ns(), False
    for rel, entry in files.items():
        path = folder / rel
        try:
            identity = _file_identity(path)
            if isinstance(entry, dict) and entry.get("stat") == identity:
                continue
            if not isinstance(entry, dict) or _file_sha256(path) != entry.get("sha256"):
                return f"{rel} differs from its record"
        except OSError as err:
            return f"{rel} cannot be read ({err.strerror or err})"
        if _settled(identity, started) and _file_identity(path) == identity:
            entry["stat"], refreshed = identity, True
    if refreshed:  # a read-only cache: the files are hashed again next time
        with contextlib.suppress(OSError):
            write_json_atomically(folder / RECORD_FILE, record)
    return None


def export_refusal(model_type: str, task: str) -> str | None:
    """Why optimum cannot export ``model_type`` for the engine's ``task``, or ``None``.

    Imports transformers and optimum (and through them torch): a server runs it in
    the child process (:mod:`.build`, ``check``) unless they are imported already.
    """
    import importlib
    import importlib.util

    try:
        exporter = importlib.util.find_spec("optimum.exporters.onnx")
    except ImportError:  # optimum itself, or its exporters package, is missing
        exporter = None
    if exporter is None:
        return "the package has no ONNX graph and optimum-onnx (to export one) is not installed"
    importlib.import_module("optimum.exporters.onnx.model_configs")  # registers the configs
    import transformers
    from optimum.exporters.tasks import TasksManager
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if model_type not in CONFIG_MAPPING_NAMES:
        return (
            f"transformers {transformers.__version__} has no built-in model type "
            f"{model_type!r} to export (remote code is never run)"
        )
    tasks: Mapping[str, Any] = {}
    for name in dict.fromkeys((model_type, model_type.replace("_", "-"))):
        try:
            tasks = TasksManager.get_supported_tasks_for_model_type(
                name, exporter="onnx", library_name="transformers"
            )
            break
        except KeyError:
            continue
    export_task = EXPORT_TASKS[task]
    if export_task not in tasks:
        what = "" if not tasks else f" for task {export_task}"
        return f"optimum cannot export model type {model_type!r} to ONNX{what}"
    return None


def export_onnx(spec: ModelSpec, output: Path) -> None:
    """Export ``spec``'s safetensors model to an ONNX graph in ``output`` (``model.onnx``).

    Runs optimum's exporter on the package directory with the optimum task of
    ``spec.task``, on the CPU at float32, transformers' built-in classes only,
    local files only and no remote code. optimum's validation run is kept: it
    raises when the graph's outputs do not have the model's shapes. The weights
    are then moved out of the graph into ``model.onnx_data`` (:data:`WEIGHTS_FILE`),
    which ONNX Runtime maps instead of parsing: MiniLM's session opens in 0.13 s
    instead of 0.3 s and its process peaks about 50 MB lower, with the same bits.

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
    external_weights(output / GRAPH_FILE)


WEIGHTS_FILE = GRAPH_FILE + "_data"
"""Where an export keeps its weights, beside the graph (ONNX external data)."""


def external_weights(graph: Path) -> None:
    """Rewrite ``graph`` with every tensor of 1 KiB or more in :data:`WEIGHTS_FILE` beside
    it (ONNX external data, one file); the same graph and the same values.

    Raises:
        OSError: the graph cannot be read or written.
    """
    import onnx

    model = onnx.load(str(graph))  # with any external data it already has
    (graph.parent / WEIGHTS_FILE).unlink(missing_ok=True)  # save_model appends to it
    onnx.save_model(
        model,
        str(graph),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=WEIGHTS_FILE,
        size_threshold=1024,
    )


PARENT_VARIABLE = "VLLM_SRUN_BUILD_PARENT"
"""The environment variable that tells a build child its parent's pid: the child ends
when that process does (:func:`die_with_parent`), so a server stopped or killed during
its first start leaves no export running."""


def die_with_parent() -> None:
    """In a build child: be sent SIGKILL when the parent named by :data:`PARENT_VARIABLE`
    ends (Linux ``prctl(PR_SET_PDEATHSIG)``), and end now if it has ended already. Does
    nothing elsewhere or without the variable."""
    parent = os.environ.get(PARENT_VARIABLE)
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != int(parent):  # it ended before the request took effect
        os._exit(1)


EXPORT_HEADROOM = 64 * 1024 * 1024
"""Bytes an export needs free beyond twice the weights (its staging copy and the graph)."""


def cache_problem(spec: ModelSpec, environ: Mapping[str, str] | None = None) -> str | None:
    """Why an export of ``spec`` could not be written into the runtime cache, or ``None``:
    the cache's nearest existing folder is not a writable folder, or it has less free
    space than twice the weights plus :data:`EXPORT_HEADROOM`. The message names the
    path and the fixes."""
    root = cache_root(environ)
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    fix = "set VLLM_SRUN_CACHE_DIR to a writable folder with room, or serve it with --engine native"
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return f"the runtime cache {root} cannot be written to export the model: {fix}"
    try:
        weights = sum((spec.package / name).stat().st_size for name in spec.weights)
        free = shutil.disk_usage(existing).free
    except OSError:
        return None  # the load reports an unreadable package itself
    needed = 2 * weights + EXPORT_HEADROOM
    if free < needed:
        return (
            f"the runtime cache {root} has {free // 2**20} MiB free; exporting the model "
            f"needs about {needed // 2**20} MiB: {fix}"
        )
    return None


def in_process() -> bool:
    """Whether builds run in this process (:data:`IN_PROCESS_MODULES` already imported)."""
    return all(name in sys.modules for name in IN_PROCESS_MODULES)


def run_builder(*arguments: str) -> str:
    """Run ``python -m vllm_srun.engines.onnxruntime.build ARGUMENTS`` (:mod:`.build`) and
    return what it printed.

    Raises:
        BuildError: the child failed; the message gives the last lines it wrote to
            stderr (optimum's or the exporter's error).
    """
    command = [sys.executable, "-m", "vllm_srun.engines.onnxruntime.build", *arguments]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore", PARENT_VARIABLE: str(os.getpid())},
    )
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        said = [line.removeprefix("error: ") for line in lines if line.startswith("error: ")]
        cause = said[-1] if said else " | ".join(lines[-3:]) or f"exit status {done.returncode}"
        raise BuildError(
            f"the ONNX build process ({' '.join(command[1:3])} {arguments[0]}) failed: {cause}"
        )
    return done.stdout


def ensure_export(spec: ModelSpec, environ: Mapping[str, str] | None = None) -> Path:
    """The cached graph of ``spec``, exporting it first when the cache has no verified one
    (:func:`check_build`).

    The export is written into a temporary sibling folder with its record and renamed
    into place in one step, so a crash mid-export never leaves a half graph where the
    next start would find it; when two processes export at once, the first rename
    wins and the other's copy is discarded. It runs in a child process unless torch
    and transformers are imported here already (:func:`in_process`).

    Returns:
        The path of ``model.onnx``.

    Raises:
        ValueError: optimum cannot export the model (:class:`BuildError` when the
            child process said so).
        OSError: the package cannot be read or the cache written.
    """

    def export(staging: Path) -> None:
        if in_process():
            export_onnx(spec, staging)
        else:
            run_builder("export", str(spec.package), spec.task, str(staging))

    return _build_once(export_dir(spec, environ), export, weights_digest(spec), "export")


def verified_export(spec: ModelSpec, environ: Mapping[str, str] | None = None) -> Path | None:
    """The graph of ``spec``'s verified export (:func:`check_build`), or ``None``."""
    target = export_dir(spec, environ)
    if check_build(target, weights_digest(spec), "export") is None:
        return target / GRAPH_FILE
    return None


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
    if not int8:  # the fused graph, its weights beside it (as the export keeps them)
        (fused / GRAPH_FILE).rename(output / GRAPH_FILE)
        moved = [data.rename(output / data.name) for data in fused.glob(GRAPH_FILE + "*data")]
        external_weights(output / GRAPH_FILE)  # optimum's weights file, if any, read in
        for data in moved:
            if data.name != WEIGHTS_FILE:
                data.unlink()
        shutil.rmtree(fused)
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

    def optimize(staging: Path) -> None:
        if in_process():
            optimize_onnx(source, staging, int8)
        else:
            run_builder("optimize", str(source), str(staging), *(["--int8"] if int8 else []))

    kind = "max_speed_int8" if int8 else "max_speed"
    # the export's own files (this folder is inside it) are verified by the export's record
    return _build_once(optimized_dir(spec, int8, environ), optimize, weights_digest(spec), kind)


def _build_once(target: Path, build: Callable[[Path], None], weights: str, kind: str) -> Path:
    """``target/model.onnx``, built by ``build(staging)`` into a sibling folder, recorded
    (:func:`write_record`) and renamed into place, unless ``target`` already holds a
    build its record verifies (see :func:`ensure_export`). A build that does not verify
    is replaced, with a warning that says why.

    Builds of one target are serialised by an exclusive lock on a sibling lock file
    (``fcntl.flock``, released by the kernel if the holder dies): a start that waited
    checks again and uses what the other built. Under the lock, staging and moved-aside
    folders a killed build left beside the target are removed.
    """
    graph = target / GRAPH_FILE
    if check_build(target, weights, kind) is None:
        return graph
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.parent / f".{target.name}.lock"):
        problem = check_build(target, weights, kind)  # another start may have built it
        if problem is None:
            return graph
        for leftover in target.parent.glob(f".{target.name}.*"):
            if leftover.is_dir() and leftover.suffix in (".tmp", ".old"):
                shutil.rmtree(leftover, ignore_errors=True)  # a killed build's: none runs now
        if target.exists():
            log.warning("the ONNX build %s is not used (%s): building it again", target, problem)
        log.info(
            "building the ONNX %s %s once into the runtime cache (a first start: this takes "
            "seconds to minutes; later starts reuse it)",
            kind,
            target,
        )
        staging = Path(
            tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        )
        try:
            build(staging)
            if not (staging / GRAPH_FILE).is_file():
                raise ValueError(f"no {GRAPH_FILE} was written for {target}")
            write_record(staging, weights, kind)
            if target.exists():  # a build that did not verify: moved aside, then removed
                stale = Path(
                    tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent)
                )
                target.rename(stale / "build")
                shutil.rmtree(stale, ignore_errors=True)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return graph


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the block."""
    with path.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


__all__ = [
    "BUILD_LIBRARIES",
    "EXPORT_HEADROOM",
    "EXPORT_TASKS",
    "GRAPH_FILE",
    "OPTIMIZATION_LEVEL",
    "PARENT_VARIABLE",
    "RECORD_FILE",
    "WEIGHTS_FILE",
    "BuildError",
    "cache_problem",
    "cache_root",
    "check_build",
    "die_with_parent",
    "ensure_export",
    "ensure_optimized",
    "export_dir",
    "export_onnx",
    "export_refusal",
    "external_weights",
    "in_process",
    "optimize_onnx",
    "optimized_dir",
    "run_builder",
    "verified_export",
    "weights_digest",
    "write_record",
]
