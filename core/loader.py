"""Composition of one model: family, placement, engine, kernels, then the family's model.

This is the Python API the serving layer puts behind HTTP::

    from vllm_srun.loader import load_model

    model = load_model("/path/to/package")
    model.answer("embeddings", {"input": ["hello"]})

For each model the families say which one recognises the package (exactly one;
``family=`` forces the choice), the accelerators where to place it, the
engines which one can run it there (``engine="auto"``: the first, by
ascending ``auto_priority``, whose ``supports`` accepts it); the kernel
registry chooses bit-exact kernels for the accelerator.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vllm_srun.extended import attach_extensions
from vllm_srun.placement import GIB, DeviceNotAvailable, NotEnoughMemory, Placement, gib, place
from vllm_srun.plugins import Catalog, Engine, Family, load_catalog, select_kernel
from vllm_srun.plugins.spec import LoadedModel, ModelSpec, RequestError, WorkItem

BATCH_INVARIANCE_TOLERANCE = 1e-5
"""Largest absolute difference allowed between a row alone and inside a batch (DESIGN §6)."""


WEIGHT_OVERHEAD = 0.10
"""Memory a model takes beyond its weights, as a fraction of them ("plus 10%", the
troubleshooting guide's estimate of what a loaded model holds)."""

GPU_WORKSPACE_BYTES = 2 * GIB
"""Free memory a GPU needs beside the weights ("and 2 GiB", the troubleshooting guide):
the caching allocator's activations and kernel workspaces."""

BYTES_PER_ELEMENT = {"float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes per weight element at each ``--dtype``."""

RETRYABLE_RUNTIME_MESSAGES = ("out of memory", "busy")
"""A ``RuntimeError`` whose message holds one of these is a passing cause: CUDA and HIP
report an exhausted or busy device (``CUDA error: out of memory``, ``all CUDA-capable
devices are busy or unavailable``) as plain ``RuntimeError``."""


class LoadError(Exception):
    """A model cannot be loaded; the message starts with the operator phrase.

    Args:
        message: the reason (``needs about 3.20 GiB, 1.10 GiB free on cuda:0; ...``).
        retryable: whether the cause can pass (no device with enough free memory,
            a busy device, an interrupted download): the runtime loads the model
            again (``--load-attempts``); other causes fail the model at once.
    """

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


def is_retryable(err: BaseException) -> bool:
    """Whether a load failure can pass: a retryable :class:`LoadError`, a torch
    out-of-memory error, or a ``RuntimeError`` saying the device is out of memory or busy."""
    if isinstance(err, LoadError):
        return err.retryable
    if isinstance(err, torch.OutOfMemoryError):
        return True
    if isinstance(err, RuntimeError):
        message = str(err).lower()
        return any(phrase in message for phrase in RETRYABLE_RUNTIME_MESSAGES)
    return False


@dataclass
class ServedModel:
    """A loaded model and what it was composed of.

    Attributes:
        name: the model ID requests use.
        package: the package directory.
        family, engine, placement, spec: the composition.
        loaded: the family's model (plan, run, finish).
        identity: the built-in model name the package was resolved as (its
            golden reference's key), or ``None`` for a package that is not built in.
        batch_invariance: the load-time probe: largest deviation measured,
            the tolerance, and whether rows of different requests may share
            a forward.
        forward_cost: the load-time measurement of a forward's fixed cost
            (:func:`measure_forward_cost`), which the scheduler's length split uses.
        prepared: how the registry resolved and verified the package
            (:class:`vllm_srun.registry.PreparedModel`): repo, revision,
            ``model_sha256``, verification, licence, parameters, files.
    """

    name: str
    package: Path
    family: Family
    engine: Engine
    placement: Placement
    spec: ModelSpec
    loaded: LoadedModel
    attention: str
    identity: str | None = None
    batch_invariance: dict[str, Any] = field(default_factory=dict)
    forward_cost: dict[str, Any] = field(default_factory=dict)
    prepared: Any = None
    max_num_seqs: int = 8192
    max_num_batched_tokens: int = 65536

    def card(self) -> dict[str, Any]:
        """The model's ``/v1/models`` card: composition, identity (repo, revision,
        ``model_sha256``, verification, licence, parameters, files) and the family's part."""
        family_card = getattr(self.loaded, "card", lambda: {})()
        identity = self.prepared.card() if self.prepared is not None else {}
        return {
            "id": self.name,
            "family": self.family.name,
            **identity,
            "engine": self.engine.name,
            "accelerator": self.placement.accelerator.name,
            "device": self.placement.device.device,
            "dtype": self.spec.dtype,
            "attention": self.attention,
            "batch_invariance": dict(self.batch_invariance),
            "forward_cost": dict(self.forward_cost),
            **family_card,
        }

    def batches(self, items: list[WorkItem]) -> list[list[WorkItem]]:
        """Split rows into forwards within ``max_num_seqs`` rows and
        ``max_num_batched_tokens`` padded tokens (rows times the longest row);
        a single row above the token budget still runs alone."""
        batches: list[list[WorkItem]] = []
        current: list[WorkItem] = []
        longest = 0
        for item in sorted(items, key=lambda i: i.tokens):
            width = max(longest, item.tokens)
            if current and (
                len(current) + 1 > self.max_num_seqs
                or width * (len(current) + 1) > self.max_num_batched_tokens
            ):
                batches.append(current)
                current, width = [], item.tokens
            current.append(item)
            longest = width
        if current:
            batches.append(current)
        return batches

    def run_items(self, items: list[WorkItem]) -> list[torch.Tensor]:
        """Outputs for rows, each distinct row (by content key) computed once."""
        unique: dict[str, WorkItem] = {}
        for item in items:
            unique.setdefault(item.key, item)
        results: dict[str, torch.Tensor] = {}
        for batch in self.batches(list(unique.values())):
            for item, output in zip(batch, self.loaded.run(batch), strict=True):
                results[item.key] = output
        return [results[item.key] for item in items]

    def answer(self, surface: str, request: dict[str, Any]) -> dict[str, Any]:
        """Answer one surface request synchronously (plan, run, finish).

        Raises:
            RequestError: the request as a whole cannot be taken.
        """
        plan = self.loaded.plan(surface, request)
        body = self.loaded.finish(plan, self.run_items(plan.items))
        return {"model": self.name, **body}


def choose_family(catalog: Catalog, package: Path, forced: str | None) -> Family:
    """The family that loads ``package``.

    Raises:
        LoadError: ``no family recognizes the package`` (or the forced one is
            not installed, or several claim it).
    """
    families = catalog.layer("families")
    if forced is not None:
        if forced not in families:
            installed = ", ".join(sorted(families)) or "none"
            raise LoadError(f"no family named {forced!r} is installed (installed: {installed})")
        return families[forced]  # type: ignore[no-any-return]
    claims = [f for _, f in sorted(families.items()) if _detects(f, package)]
    if not claims:
        unreadable = _unreadable_config(package)
        if unreadable is not None:
            raise LoadError(
                f"no family recognizes the package at {package}: its config.json is not valid "
                f"JSON ({unreadable}); fix or replace the file"
            )
        raise LoadError(
            f"no family recognizes the package at {package}; see `vllm-srun plugins` for the "
            "installed families, or force one with --family"
        )
    if len(claims) > 1:
        names = ", ".join(f.name for f in claims)
        raise LoadError(f"several families recognize the package ({names}); choose with --family")
    return claims[0]  # type: ignore[no-any-return]


def _unreadable_config(package: Path) -> str | None:
    """Why ``package/config.json`` cannot be read as JSON, or ``None`` (absent or fine)."""
    path = package / "config.json"
    if not path.is_file():
        return None
    try:
        json.loads(path.read_bytes())
    except (ValueError, OSError, RecursionError) as err:
        return str(err).splitlines()[0] if str(err) else type(err).__name__
    return None


def _detects(family: Any, package: Path) -> bool:
    try:
        return bool(family.detect(package))
    except Exception:
        return False


def choose_engine(catalog: Catalog, spec: ModelSpec, placement: Placement, forced: str) -> Engine:
    """The engine for ``spec`` on the placed device.

    Raises:
        LoadError: the pinned engine is missing or refuses, or (``auto``) no
            engine accepts; the message lists every engine's reason.
    """
    engines = catalog.layer("engines")
    if forced != "auto":
        engine = engines.get(forced)
        if engine is None:
            installed = ", ".join(sorted(engines)) or "none"
            raise LoadError(f"no engine named {forced!r} is installed (installed: {installed})")
        reason = engine.supports(spec, placement.device)
        if reason is not None:
            raise LoadError(f"engine {forced} cannot run the model: {reason}")
        return engine  # type: ignore[no-any-return]
    ranked = sorted(
        (e for e in engines.values() if type(e).auto_priority is not None),
        key=lambda e: (type(e).auto_priority, e.name),
    )
    reasons = []
    for engine in ranked:
        reason = engine.supports(spec, placement.device)
        if reason is None:
            return engine  # type: ignore[no-any-return]
        reasons.append(f"{engine.name}: {reason}")
    raise LoadError("no engine can run the model: " + "; ".join(reasons or ["no engine installed"]))


def on_cpu(placement: Placement) -> bool:
    """Whether the placement runs on host memory (its torch device type is ``cpu``)."""
    return placement.accelerator.torch_device(placement.device.index).type == "cpu"


def weight_bytes(spec: ModelSpec, cpu: bool) -> int:
    """Estimated bytes of a model's weights at the dtype it will run at.

    An ONNX graph counts its file size (graphs run at their exported
    precision); safetensors files count their size scaled from the released
    dtype to the one served (``--dtype``; under ``auto``, a float16 release
    runs as float32 on a CPU, as the native engine does).
    """
    if spec.onnx is not None:
        graph = spec.package / spec.onnx
        return sum(p.stat().st_size for p in [graph, *graph.parent.glob(graph.name + "_data")])
    stored = sum((spec.package / name).stat().st_size for name in spec.weights)
    released = spec.released_dtype
    served = released if spec.dtype == "auto" else spec.dtype
    if cpu and served == "float16":
        served = "float32"
    return stored * BYTES_PER_ELEMENT.get(served, 4) // BYTES_PER_ELEMENT.get(released, 4)


def model_bytes(spec: ModelSpec, cpu: bool) -> int:
    """What a loaded model holds: :func:`weight_bytes` plus :data:`WEIGHT_OVERHEAD`."""
    return int(weight_bytes(spec, cpu) * (1 + WEIGHT_OVERHEAD))


def required_bytes(spec: ModelSpec, placement: Placement) -> int:
    """Free memory a placement needs: :func:`model_bytes`, plus
    :data:`GPU_WORKSPACE_BYTES` on a device that is not the CPU."""
    cpu = on_cpu(placement)
    return model_bytes(spec, cpu) + (0 if cpu else GPU_WORKSPACE_BYTES)


def _free_now(placement: Placement) -> int | None:
    """The device's free memory enumerated again (after a failed allocation)."""
    try:
        for device in placement.accelerator.devices():
            if device.device == placement.device.device:
                return device.free_memory_bytes
    except Exception:
        pass
    return placement.device.free_memory_bytes


def measure_batch_invariance(loaded: Any) -> dict[str, Any]:
    """Run the family's probe rows alone and together; the largest absolute difference.

    Families without ``probe_items`` are reported as unprobed, with
    cross-request batching off (nothing vouches for it).
    """
    probe = getattr(loaded, "probe_items", None)
    if probe is None:
        return {
            "max_abs_deviation": None,
            "tolerance": BATCH_INVARIANCE_TOLERANCE,
            "cross_request_batching": False,
        }
    items = probe()
    together = loaded.run(items)
    deviation = 0.0
    for item, batched in zip(items, together, strict=True):
        [alone] = loaded.run([item])
        deviation = max(deviation, float((alone - batched).abs().max()))
    return {
        "max_abs_deviation": deviation,
        "tolerance": BATCH_INVARIANCE_TOLERANCE,
        "cross_request_batching": deviation <= BATCH_INVARIANCE_TOLERANCE,
    }


FORWARD_COST_REPEATS = 5
"""Timed runs per probe shape; the fastest counts (the others met a busy core)."""

FORWARD_COST_TOKENS = 1024
"""Padded tokens of the larger timed forward: enough work (tens of ms on a CPU) that
a busy core's noise cannot hide the cost per token."""


def measure_forward_cost(loaded: Any) -> dict[str, Any]:
    """The fixed cost of one forward, in milliseconds and in padded tokens.

    A forward of ``n`` rows padded to ``L`` tokens costs about ``a + b * n * L``
    on a device whose throughput the rows saturate (a CPU). ``a`` is read off
    the shortest probe row run alone, ``b`` off the probe rows repeated to about
    :data:`FORWARD_COST_TOKENS` padded tokens; the two shapes are timed in
    turn, :data:`FORWARD_COST_REPEATS` times each, and the fastest of each
    counts. The scheduler splits a batch by length when padding would cost
    more than ``a / b`` padded tokens (:func:`vllm_srun.scheduler.split_by_length`).

    Returns:
        ``{"fixed_ms", "per_padded_token_ms", "overhead_tokens"}``; every
        value ``None`` when the family has no probe rows, or when the larger
        forward did not take longer than the lone row (a device with room to
        spare: then batches are never split).
    """
    unknown = {"fixed_ms": None, "per_padded_token_ms": None, "overhead_tokens": None}
    probe = getattr(loaded, "probe_items", None)
    if probe is None:
        return unknown
    items = list(probe())
    if not items:
        return unknown
    shortest = min(items, key=lambda item: item.tokens)
    width = max(item.tokens for item in items)
    copies = max(1, -(-FORWARD_COST_TOKENS // (len(items) * width)))
    large = items * copies
    padded = len(large) * width

    def timed(rows: list[WorkItem]) -> float:
        started = time.perf_counter()
        loaded.run(rows)
        return (time.perf_counter() - started) * 1000

    loaded.run([shortest])  # warm: first calls build kernels and allocate
    loaded.run(large)
    alone_ms, together_ms = [], []
    for _ in range(FORWARD_COST_REPEATS):  # in turn, so a burst of noise hits both shapes
        alone_ms.append(timed([shortest]))
        together_ms.append(timed(large))
    alone, together = min(alone_ms), min(together_ms)
    if together <= alone:
        return unknown
    per_token = (together - alone) / max(padded - shortest.tokens, 1)
    fixed = max(alone - per_token * shortest.tokens, 0.0)
    return {
        "fixed_ms": round(fixed, 3),
        "per_padded_token_ms": round(per_token, 6),
        "overhead_tokens": round(fixed / per_token, 1),
    }


def load_model(
    model: str | os.PathLike[str],
    *,
    catalog: Catalog | None = None,
    name: str | None = None,
    device: str = "auto",
    engine: str = "auto",
    family: str | None = None,
    dtype: str = "auto",
    threads: int | None = None,
    max_num_seqs: int = 8192,
    max_num_batched_tokens: int = 65536,
    max_model_len: int | None = None,
    enable_shared_context: bool | None = None,
    memory_budget_gib: float | None = None,
    revision: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    offline: bool = False,
    accept_licences: Iterable[str] = (),
) -> ServedModel:
    """Load a model through the installed plugins.

    ``model`` is a local package directory, a built-in model name or a Hub
    repository ``owner/name`` at a 40-hex commit (``MODEL@REV`` or
    ``revision``). :func:`vllm_srun.registry.prepare` resolves it (a built-in
    model's installed mirror first, then the Hugging Face cache in
    ``cache_dir``, then a download unless ``offline``) and verifies its files
    before any weight loads; a built-in model is loaded by the family its
    table entry names unless ``family`` forces another.

    Placement weighs the model at the dtype it will run at (:func:`model_bytes`)
    against ``memory_budget_gib`` (``--memory-budget``) and against the
    device's free memory (:func:`required_bytes`).

    Raises:
        LoadError: with the operator phrase (``a revision is required``,
            ``revision must be a 40-hex commit``, ``a file hash does not
            match``, ``access denied, gated or private``, ``a licence must be
            accepted``, ``download interrupted`` (retryable), ``no family
            recognizes the package``, ``device not available``, ``needs about X GiB, Y GiB
            free`` (retryable), ``needs about X GiB, above --memory-budget Y
            GiB``, ``float16 runs on GPUs only``, ``no engine can run the
            model``) and what to do; ``retryable`` when the device was out of
            memory or busy.
    """
    from vllm_srun.registry import prepare

    catalog = catalog or load_catalog()
    prepared = prepare(
        model,
        builtins=catalog.layer("models"),
        revision=revision,
        cache_dir=cache_dir,
        offline=offline,
        accept_licences=accept_licences,
    )
    package = prepared.source.path
    if family is None and prepared.entry is not None:
        family = prepared.entry.family
    chosen_family = choose_family(catalog, package, family)
    if max_model_len is not None and "decisions" not in chosen_family.surfaces:
        raise LoadError(
            "max_model_len applies to Decision models only: the "
            f"{chosen_family.name} family answers no decisions itself (an embedder that "
            "answers them through similarity_readout reads its own input limit); drop "
            "max_model_len for this model"
        )
    try:
        chosen_family.verify(package)
        spec = dataclasses.replace(
            chosen_family.describe(package),
            dtype=dtype,
            max_model_len=max_model_len,
            shared_context=enable_shared_context,
        )
    except LoadError:
        raise
    except Exception as err:
        raise LoadError(f"{chosen_family.name} cannot read the package: {err}") from err
    if (
        max_model_len is not None
        and spec.token_limit is not None
        and max_model_len > spec.token_limit
    ):
        raise LoadError(
            f"max_model_len {max_model_len} is above the model's limit ({spec.token_limit} "
            f"tokens); lower it to at most {spec.token_limit} or leave it out"
        )
    try:
        placement = place(catalog, device, lambda p: required_bytes(spec, p))
    except DeviceNotAvailable as err:
        raise LoadError(str(err)) from err
    except NotEnoughMemory as err:
        raise LoadError(str(err), retryable=True) from err
    cpu = on_cpu(placement)
    if dtype == "float16" and cpu:
        raise LoadError(
            f"float16 runs on GPUs only: --dtype float16 cannot be served on "
            f"{placement.device.device}; use --dtype auto, float32 or bfloat16, or a GPU --device"
        )
    if memory_budget_gib is not None and model_bytes(spec, cpu) > memory_budget_gib * GIB:
        raise LoadError(
            f"needs about {gib(model_bytes(spec, cpu))} GiB, above --memory-budget "
            f"{memory_budget_gib:g} GiB; raise --memory-budget, choose a smaller --dtype, "
            "or serve a smaller model"
        )
    chosen_engine = choose_engine(catalog, spec, placement, engine)
    kernel = select_kernel(
        catalog.layer("kernels").values(), "attention", placement.accelerator.name
    )
    options = {
        "torch_device": placement.accelerator.torch_device(placement.device.index),
        "providers": placement.accelerator.onnx_providers(placement.device),
        "threads": threads,
        "attention": kernel.implementation,
    }
    try:
        engine_model = chosen_engine.load(spec, placement.device, options)
        loaded = attach_extensions(catalog, chosen_family.load(package, spec, engine_model))
        invariance = measure_batch_invariance(loaded)
        forward_cost = measure_forward_cost(loaded)
    except torch.OutOfMemoryError as err:
        free = _free_now(placement)
        raise LoadError(
            f"needs about {gib(required_bytes(spec, placement))} GiB, "
            f"{'an unknown amount' if free is None else gib(free)} GiB free on "
            f"{placement.device.device}; out of memory ({str(err).splitlines()[0]})",
            retryable=True,
        ) from err
    except RuntimeError as err:
        if "LAPACK" in str(err):
            raise LoadError(
                f"built without LAPACK: the model needs LAPACK on {placement.device.device} and "
                "this PyTorch has none; put the model on a GPU (--device cuda or rocm) or serve "
                f"it from a PyTorch built with LAPACK ({str(err).splitlines()[0]})"
            ) from err
        if not is_retryable(err):
            raise
        raise LoadError(
            f"device busy: {placement.device.device} could not take the model "
            f"({str(err).splitlines()[0]}); it is retried",
            retryable=True,
        ) from err
    served = ServedModel(
        name=name or prepared.source.repo or package.name,
        package=package,
        family=chosen_family,
        engine=chosen_engine,
        placement=placement,
        spec=spec,
        loaded=loaded,
        attention=str(kernel.implementation),
        identity=prepared.entry.name if prepared.entry is not None else None,
        prepared=prepared,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    served.batch_invariance = invariance
    served.forward_cost = forward_cost
    return served


__all__ = ["LoadError", "RequestError", "ServedModel", "is_retryable", "load_model"]
