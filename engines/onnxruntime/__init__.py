"""The ``onnxruntime`` engine: encoder models as ONNX graphs on ONNX Runtime.

A package's own graph (``spec.onnx``, quantised ones included, such as a
4-bit ``MatMulNBits`` graph) runs as shipped. A package with only safetensors
weights is exported once through optimum's ONNX exporter (transformers built-in
model types only, ``trust_remote_code`` off, local files only) into the export
cache (:mod:`.export`: :func:`cache_root`, keyed by the weights digest), and
reused on every later start.

Sessions run on the execution providers the accelerator names (those this
onnxruntime build lacks are dropped; CPU always closes the list), with
sequential, deterministic session options and ``threads`` intra-op threads.

Profiles (:attr:`OnnxRuntimeEngine.profiles`): ``exact`` and ``batching`` run the
graph as shipped or exported; ``max_speed`` runs an exported graph through
optimum's transformer fusions (attention, GELU, layer norm; int8 dynamic
quantisation only where the family says every head tolerates it,
``spec.int8_tolerant``), cached beside the export by the weights digest, and
drops deterministic compute. A package's own graph (already quantised, such as a
4-bit ``MatMulNBits`` graph) runs as shipped under ``max_speed`` too, without
deterministic compute.

This package is named like the library it wraps; ``import onnxruntime`` in it is
an absolute import and always gets the library, never this package (whose full
name is ``vllm_srun.engines.onnxruntime``).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from vllm_srun.plugins import (
    BATCHING,
    EXACT,
    MAX_SPEED,
    DeviceInfo,
    Engine,
    ExecutionProvider,
    Profile,
    hookimpl,
)
from vllm_srun.plugins.hookspecs import RegisterEngine
from vllm_srun.plugins.spec import EncoderBatch, ModelSpec

from .export import (
    EXPORT_TASKS,
    GRAPH_FILE,
    BuildError,
    cache_problem,
    cache_root,
    ensure_export,
    ensure_optimized,
    export_dir,
    export_onnx,
    export_refusal,
    in_process,
    run_builder,
    verified_export,
    weights_digest,
)

# onnxruntime, transformers and optimum are imported where they are used:
# optimum's exporter alone takes seconds to import, and `vllm-srun plugins`
# should not pay that to list this engine.

CPU_PROVIDER = "CPUExecutionProvider"
"""The provider every session ends with: the fallback for any op the others lack."""

OUTPUT_NAMES = {
    "encoder": "last_hidden_state",
    "sequence_classification": "logits",
    "token_classification": "logits",
}
"""Encoder task -> the graph output it reads."""

OUTPUT_RANKS = {"encoder": 3, "sequence_classification": 2, "token_classification": 3}
"""Encoder task -> the rank of its output (see :class:`~vllm_srun.plugins.spec.EncoderModel`)."""

INPUT_DTYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}
"""ONNX input element types the engine feeds token tensors as."""


def select_providers(
    requested: Sequence[ExecutionProvider], available: Sequence[str]
) -> list[ExecutionProvider]:
    """The requested providers this onnxruntime build has, in order, ending with CPU.

    CPU keeps its requested options when it was requested; otherwise it is
    appended with none. Duplicates keep their first place.
    """
    kept: list[ExecutionProvider] = []
    cpu_options: dict[str, Any] = {}
    seen: set[str] = set()
    for name, options in requested:
        if name in seen:
            continue
        seen.add(name)
        if name == CPU_PROVIDER:
            cpu_options = dict(options)
        elif name in available:
            kept.append((name, dict(options)))
    kept.append((CPU_PROVIDER, cpu_options))
    return kept


ONNX_FLOAT_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(bfloat16)": "bfloat16",
    "tensor(double)": "float64",
}
"""ONNX Runtime's type strings of float tensors, by the name ``--dtype`` and the card use."""


class OnnxEncoder:
    """An ONNX Runtime session of an encoder graph; :meth:`encode` runs one batch.

    Attributes:
        session: the ``onnxruntime.InferenceSession``.
        spec: the model spec.
        graph: the graph file the session was built from.
        providers: the providers the session runs on, preferred first.
        dropped_providers: requested providers this onnxruntime build lacks.
        input_names: the graph's inputs, in graph order.
        output_name: the graph output :meth:`encode` returns.
        compute_dtype: the precision the graph computes its output in (``float32``
            for ``tensor(float)``; quantised weights, such as an int8 or 4-bit
            graph's, still compute in it); the card's ``dtype``.
        libraries: what its forwards run on: onnxruntime.
    """

    libraries = ("onnxruntime",)

    def __init__(
        self, session: Any, spec: ModelSpec, graph: Path, dropped_providers: list[str]
    ) -> None:
        self.session = session
        self.spec = spec
        self.graph = graph
        self.providers: list[str] = list(session.get_providers())
        self.dropped_providers = dropped_providers
        self.input_types = {i.name: i.type for i in session.get_inputs()}
        self.input_names = list(self.input_types)
        outputs = [o.name for o in session.get_outputs()]
        wanted = OUTPUT_NAMES[spec.task]
        if wanted in outputs:
            self.output_name = wanted
        elif spec.task == "encoder" or len(outputs) == 1:
            self.output_name = outputs[0]
        else:
            raise ValueError(f"the graph {graph} has no {wanted!r} output (outputs: {outputs})")
        output_type = next(o.type for o in session.get_outputs() if o.name == self.output_name)
        self.compute_dtype = ONNX_FLOAT_TYPES.get(output_type, output_type)
        missing = {"input_ids", "attention_mask"} - set(self.input_names)
        unknown = set(self.input_names) - {"input_ids", "attention_mask", "token_type_ids"}
        if missing or unknown:
            raise ValueError(
                f"the graph {graph} takes inputs {self.input_names}; the engine feeds "
                "input_ids and attention_mask (and token_type_ids when asked)"
            )
        for name, kind in self.input_types.items():
            if kind not in INPUT_DTYPES:
                raise ValueError(f"the graph input {name!r} is {kind}, not an integer tensor")

    def encode(self, batch: EncoderBatch) -> npt.NDArray[np.float32]:
        """Run the batch (int64 numpy arrays, fed to the session as they are).

        Inputs are fed by name, cast to the graph's integer type where it differs:
        ``token_type_ids`` only when the graph takes it (zeros when the batch has
        none), never an input the graph lacks.

        Returns:
            A C-contiguous float32 numpy array in host memory, shaped as
            :class:`~vllm_srun.plugins.spec.EncoderModel` says.

        Raises:
            ValueError: the graph's output has not the task's rank or rows.
        """
        given = {
            "input_ids": batch.input_ids,
            "attention_mask": batch.attention_mask,
            "token_type_ids": (
                batch.token_type_ids
                if batch.token_type_ids is not None
                else np.zeros_like(batch.input_ids)
            ),
        }
        feed = {
            name: np.ascontiguousarray(given[name], dtype=INPUT_DTYPES[kind])
            for name, kind in self.input_types.items()
        }
        (result,) = self.session.run([self.output_name], feed)
        rank, rows = OUTPUT_RANKS[self.spec.task], batch.input_ids.shape[0]
        if result.ndim != rank or result.shape[0] != rows:
            raise ValueError(
                f"the graph output {self.output_name!r} has shape {list(result.shape)}; "
                f"task {self.spec.task} needs rank {rank} with {rows} rows"
            )
        output: npt.NDArray[np.float32] = np.ascontiguousarray(result, dtype=np.float32)
        return output


class OnnxRuntimeEngine(Engine):
    """ONNX Runtime; tried after ``native`` by ``--engine auto``."""

    name = "onnxruntime"
    auto_priority = 20
    profiles = (
        EXACT.described(
            EXACT.description + " ONNX Runtime: the graph as shipped or exported, "
            "deterministic compute."
        ),
        BATCHING.described(
            BATCHING.description + " ONNX Runtime: the graph as shipped or exported, "
            "deterministic compute."
        ),
        MAX_SPEED.described(
            "ONNX Runtime: the exported graph with optimum's fused attention, GELU and layer "
            "norm (int8 dynamic quantisation where the family says its heads tolerate it), "
            "cached by the weights digest; a package's own graph as shipped; deterministic "
            "compute off. Tried before native under --engine auto.",
            auto_priority=5,
        ),
    )

    def __init__(self) -> None:
        self._refusals: dict[tuple[str, str], str | None] = {}

    def supports(self, spec: Any, device: DeviceInfo) -> str | None:
        """``None`` when the spec has an ONNX graph, or weights optimum can export; else why not.

        A package without a graph whose verified export is in the cache
        (:func:`~.export.verified_export`) is accepted without importing torch,
        transformers or optimum; otherwise optimum is asked (:func:`~.export.export_refusal`,
        in a child process unless torch and transformers are imported here already) and
        its answer kept for the model type and task.
        """
        if not isinstance(spec, ModelSpec):
            return "onnxruntime runs encoder model specs only"
        if spec.task not in EXPORT_TASKS:
            return f"onnxruntime does not run task {spec.task!r}"
        if spec.hidden_layer is not None:
            return (
                f"onnxruntime returns the graph's last hidden state only; hidden_layer "
                f"{spec.hidden_layer} needs --engine native"
            )
        if spec.attention_groups:
            return (
                "onnxruntime runs graphs of input ids and a padding mask; attention groups "
                "(per-token positions and masks) need --engine native"
            )
        if importlib.util.find_spec("onnxruntime") is None:
            return "onnxruntime is not installed"
        if spec.onnx is not None:
            if spec.dtype not in ("auto", spec.released_dtype):
                return (
                    f"the package's ONNX graph runs at its own precision "
                    f"({spec.released_dtype}); use --dtype auto"
                )
            return None
        if not spec.weights:
            return "the package has neither an ONNX graph nor safetensors weights to export"
        served = spec.released_dtype if spec.dtype == "auto" else spec.dtype
        if served != "float32":
            return (
                "onnxruntime exports float32 graphs; use --dtype float32 (or --engine native "
                f"for {served})"
            )
        try:
            if verified_export(spec) is not None:
                return None
        except (OSError, ValueError):  # weights to digest that cannot be read: load says so
            pass
        return cache_problem(spec) or self._export_refusal(spec.model_type, spec.task)

    def _export_refusal(self, model_type: str, task: str) -> str | None:
        """optimum's answer for the model type and task (:func:`~.export.export_refusal`),
        asked once per process: here when torch and transformers are imported already,
        else in the build process."""
        if (model_type, task) in self._refusals:
            return self._refusals[model_type, task]
        if in_process():
            refusal = export_refusal(model_type, task)
        else:
            try:
                said = run_builder("check", model_type, task).strip().splitlines()
                refusal = json.loads(said[-1])["refusal"]
            except (BuildError, ValueError, IndexError, KeyError, TypeError) as err:
                return f"optimum could not be asked whether it exports the model: {err}"
        self._refusals[(model_type, task)] = refusal
        return refusal

    def load(self, spec: Any, device: DeviceInfo, options: Mapping[str, Any]) -> OnnxEncoder:
        """Open ``spec``'s graph in an ONNX Runtime session, exporting it first if needed.

        Options:
            providers: ``(name, options)`` execution providers, preferred
                first, as the accelerator's ``onnx_providers`` names them
                (default CPU only). Those this onnxruntime build lacks are
                dropped; ``CPUExecutionProvider`` always closes the list.
            threads: intra-op threads of the session (``None``: ONNX Runtime's
                default, one per core).
            profile: the :class:`~vllm_srun.plugins.Profile` to run (default
                ``exact``); under ``max_speed`` an exported graph is fused
                (:func:`ensure_optimized`) and compute is not deterministic.

        Raises:
            ValueError: :meth:`supports` refuses the spec, ``threads`` is not
                a positive int, or the graph's inputs or outputs are not an
                encoder's.
            OSError: the graph or weights cannot be read, or the cache written.
        """
        reason = self.supports(spec, device)
        if reason is not None:
            raise ValueError(reason)
        threads = options.get("threads")
        if threads is not None and (type(threads) is not int or threads < 1):
            raise ValueError(f"threads must be a positive int or None, not {threads!r}")
        import onnxruntime

        profile: Profile = options.get("profile") or EXACT
        fastest = profile.kernels == "fastest"
        if spec.onnx is not None:
            graph = spec.package / spec.onnx
        elif fastest:
            graph = ensure_optimized(spec, int8=spec.int8_tolerant)
        else:
            graph = ensure_export(spec)
        if not graph.is_file():
            raise FileNotFoundError(f"the ONNX graph {graph} does not exist")
        requested = list(options.get("providers") or [(CPU_PROVIDER, {})])
        available = onnxruntime.get_available_providers()
        providers = select_providers(requested, available)
        dropped = [name for name, _ in requested if name != CPU_PROVIDER and name not in available]

        session_options = onnxruntime.SessionOptions()
        session_options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        session_options.inter_op_num_threads = 1
        session_options.intra_op_num_threads = threads or 0
        session_options.use_deterministic_compute = not fastest
        session_options.log_severity_level = 3  # errors only: no per-node provider warnings
        session = onnxruntime.InferenceSession(
            str(graph),
            sess_options=session_options,
            providers=[name for name, _ in providers],
            provider_options=[opts for _, opts in providers],
        )
        return OnnxEncoder(session, spec, graph, dropped)


@hookimpl
def register_engines(register: RegisterEngine) -> None:
    """Register the ``onnxruntime`` engine."""
    register(OnnxRuntimeEngine())


__all__ = [
    "CPU_PROVIDER",
    "EXPORT_TASKS",
    "GRAPH_FILE",
    "INPUT_DTYPES",
    "OUTPUT_NAMES",
    "OUTPUT_RANKS",
    "OnnxEncoder",
    "OnnxRuntimeEngine",
    "cache_root",
    "ensure_export",
    "ensure_optimized",
    "export_dir",
    "export_onnx",
    "register_engines",
    "select_providers",
    "weights_digest",
]
