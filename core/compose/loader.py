"""Composition of one model: family, placement, engine, kernels, then the family's model.

This is the Python API the serving layer puts behind HTTP::

    from vllm_srun.compose.loader import load_model

    model = load_model("/path/to/package")
    model.answer("embeddings", {"input": ["hello"]})

For each model the families say which one recognises the package (exactly one;
``family=`` forces the choice), the accelerators where to place it, the
engines which one can run it there (``engine="auto"``: the first, by
ascending ``auto_priority``, whose ``supports`` accepts it); the engine
chooses its kernels from the registry (bit-exact ones under ``exact``).

Why this module is over 400 lines: it is one pipeline, :func:`load_model`,
whose every step turns its failure into the operator phrase a
:class:`~vllm_srun.errors.LoadError` carries; :func:`choose_family` and
:func:`~vllm_srun.compose.engine_choice.choose_engine` are two of those steps, and
:class:`ServedModel` is what
the pipeline returns. The parts it calls (placement, the registry, the probes,
the extensions, the batch planning) already live in modules of their own; what stays
here keeps a model that never needs torch or transformers from importing them (the
lean import of transformers' model base when something first imports it, the engine
options whose ``torch_device`` is made on first read, the weights digest read from
verification).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Required

from vllm_srun.compose.adapters import AdapterModel, prepare_adapter
from vllm_srun.compose.batching import (
    ExactShapes,
    LengthEdges,
    SchedulerLimits,
    exact_forward,
    plan_forwards,
)
from vllm_srun.compose.engine_choice import EngineRefused, choose_engine, reference_for
from vllm_srun.compose.extended import ExtendedModel, attach_extensions
from vllm_srun.compose.placement import (
    GIB,
    DeviceNotAvailable,
    NotEnoughMemory,
    Placement,
    free_now,
    gib,
    model_bytes,
    on_cpu,
    place,
    refuse_weight_formats,
    required_bytes,
)
from vllm_srun.compose.probe_cache import (
    BatchInvarianceCache,
    ForwardCostCache,
    forward_cost_key,
    invariance_key,
)
from vllm_srun.compose.probes import (
    measure_batch_invariance,
    measure_forward_cost,
    release_freed_heap,
)
from vllm_srun.compose.registry import IdentityCard, prepare
from vllm_srun.engine_args import EngineArgs
from vllm_srun.errors import LoadError, is_retryable
from vllm_srun.plugins import Engine, Family
from vllm_srun.plugins.cards import AdapterCard, FamilyCard, ProfileInfo
from vllm_srun.plugins.host import Catalog, load_catalog
from vllm_srun.plugins.loaded import Answered, LoadedModel, answered
from vllm_srun.plugins.profiles import EXACT, Numerics, Profile
from vllm_srun.plugins.requests import read_request
from vllm_srun.plugins.spec import (
    ModelSpec,
    RequestError,
    RowOutput,
    WorkItem,
    undeclared_members,
)


@dataclass(kw_only=True)
class LoadOptions(EngineArgs):
    """How to load one model: its engine arguments (:class:`EngineArgs`: device,
    engine, family, dtype, batch bounds, ...) and where its bytes come from.

    Attributes:
        name: the model ID requests use (default: the repository, else the
            package folder's name).
        revision: the 40-hex commit of a Hub repository.
        threads: CPU threads for the engine (``None``: the engine's default).
        cache_dir: the Hugging Face cache (``None``: ``HF_HUB_CACHE``).
        offline: use only installed mirrors and the cache; never download.
        accept_licences: restricted licences the operator accepted.
        family_options: the models-file entry's ``options``, for the family
            (:meth:`vllm_srun.plugins.Family.check_options`).
    """

    name: str | None = None
    revision: str | None = None
    threads: int | None = None
    cache_dir: str | os.PathLike[str] | None = None
    offline: bool = False
    accept_licences: tuple[str, ...] = ()
    family_options: dict[str, Any] = field(default_factory=dict)


class ServedCard(FamilyCard, total=False):
    """What a loaded model's card says (:meth:`ServedModel.card`): the family's part
    (:class:`~vllm_srun.plugins.cards.FamilyCard`), the composition, the identity the
    registry verified (absent for a model loaded without it) and the adapter. The serve
    layer adds the state and writes the rest of the wire's
    :class:`~vllm_srun.plugins.cards.ModelCard`, each key of which this is typed as."""

    id: Required[str]
    family: Required[str]
    engine: Required[str]
    engine_reason: Required[str]
    accelerator: Required[str]
    device: Required[str]
    dtype: Required[str]
    attention: Required[str | None]
    kernels: Required[dict[str, str]]
    profile: Required[str]
    profiles: Required[list[ProfileInfo]]
    numerics: Required[Numerics]
    batch_invariance: Required[dict[str, object]]
    forward_cost: Required[dict[str, object]]
    repo: str | None
    revision: str | None
    licence: str | None
    parameters: int | None
    source: str
    model_sha256: str | None
    verification: str | None
    files: dict[str, str]
    extra_files: list[str]
    adapter: AdapterCard | None


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
            (:class:`vllm_srun.compose.registry.PreparedModel`): repo, revision,
            ``model_sha256``, verification, licence, parameters, files.
        compute_dtype: the dtype the engine model says it runs at (its
            ``compute_dtype``), the card's ``dtype``; ``None``: the requested ``--dtype``.
        family_model: the family's own loaded model, before surface extensions were
            attached (``loaded`` is it, or wraps it).
        augmented: the surfaces the family serves whose answers an extension rewrites;
            the golden self-check compares those on :attr:`family_model` alone.
        engine_reason: why the engine was chosen (:mod:`.engine_choice`), the card's
            ``engine_reason``.
    """

    name: str
    package: Path
    family: Family
    engine: Engine
    placement: Placement
    spec: ModelSpec
    loaded: LoadedModel[Any]
    kernels: dict[str, str]
    identity: str | None = None
    batch_invariance: dict[str, Any] = field(default_factory=dict)
    forward_cost: dict[str, Any] = field(default_factory=dict)
    prepared: Any = None
    options: LoadOptions = field(default_factory=lambda: LoadOptions())
    adapter: AdapterModel | None = None
    profile: Profile = EXACT
    profiles: tuple[Profile, ...] = (EXACT,)
    compute_dtype: str | None = None
    family_model: LoadedModel[Any] | None = None
    augmented: frozenset[str] = frozenset()
    engine_reason: str = "named by --engine"

    def card(self) -> ServedCard:
        """The model's ``/v1/models`` card as far as loading it tells: composition, identity
        (repo, revision, ``model_sha256``, verification, licence, parameters, files) and the
        family's part (:class:`ServedCard`)."""
        composition: ServedCard = {
            "id": self.name,
            "family": self.family.name,
            "surfaces": list(self.loaded.surfaces),
            "engine": self.engine.name,
            "engine_reason": self.engine_reason,
            "accelerator": self.placement.accelerator.name,
            "device": self.placement.device.device,
            "dtype": self.compute_dtype or self.spec.dtype,
            "attention": self.kernels.get("attention"),
            "kernels": dict(self.kernels),
            "profile": self.profile.name,
            "profiles": [p.card() for p in self.profiles],
            "numerics": self.profile.numerics,
            "batch_invariance": dict(self.batch_invariance),
            "forward_cost": dict(self.forward_cost),
        }
        card: ServedCard = {**composition, **self.loaded.card()}
        if self.prepared is not None:
            identity: IdentityCard = self.prepared.card()
            card = {**card, **identity}
        if self.adapter is not None:
            card["adapter"] = self.adapter.card()
        return card

    def exact_shapes(self) -> ExactShapes | None:
        """Under a profile with ``batch_tolerance`` 0.0 (``exact``), the forward shapes
        the load-time probe verified (its ``method``; a model answering one by one
        runs its rows at their own length); ``None`` under the other profiles."""
        if self.profile.batch_tolerance != 0.0:
            return None
        method = self.batch_invariance.get("method")
        return ExactShapes(
            method if method in ("padded_to_edge", "same_bucket") else "equal_length",
            LengthEdges(self.spec.token_limit),
            padded_up_to=int(self.batch_invariance.get("padded_up_to") or 0),
        )

    def limits(self) -> SchedulerLimits:
        """The batch bounds of its forwards: the engine arguments it was loaded with, the
        load-time probes' verdict and the forward cost the length split weighs. Under a
        profile with ``batch_tolerance`` 0.0 forwards take the shapes the probe verified
        (:meth:`exact_shapes`), and a model whose probe found a difference runs rows one
        by one."""
        one_by_one = self.batch_invariance.get("method") == "one_by_one"
        return SchedulerLimits(
            max_num_seqs=1 if one_by_one else self.options.max_num_seqs,
            max_num_batched_tokens=self.options.max_num_batched_tokens,
            batch_window_ms=self.options.batch_window_ms,
            cross_request_batching=bool(self.batch_invariance.get("cross_request_batching")),
            forward_overhead_tokens=self.forward_cost.get("overhead_tokens"),
            exact=self.exact_shapes(),
        )

    def run_rows(self, rows: list[WorkItem]) -> list[Any]:
        """One forward of ``rows`` through the family's ``run``; under ``exact`` at the
        shape the probe verified (:func:`~vllm_srun.compose.batching.exact_forward`: padded to
        the edge of its longest row, a forward of few tokens filled with copies of its
        last row). The scheduler and :meth:`run_items` run every forward through here."""
        shapes = self.exact_shapes()
        if shapes is not None:
            return exact_forward(self.loaded.run, shapes)(rows)
        return self.loaded.run(rows)

    def run_items(self, items: list[WorkItem]) -> list[RowOutput]:
        """Outputs for rows, each distinct row (by content key) computed once, in the
        forwards the model's scheduler takes them in (:func:`plan_forwards`, within
        the batch bounds) but without the length split: that split weighs a forward
        cost timed at load, so it could differ between two runs, and the answers of
        this synchronous path must be the same every run (the golden self-check
        runs a model's requests twice and compares them exactly)."""
        unique: dict[str, WorkItem] = {}
        for item in items:
            unique.setdefault(item.key, item)
        results: dict[str, RowOutput] = {}
        bounds = dataclasses.replace(self.limits(), forward_overhead_tokens=None)
        for batch in plan_forwards(list(unique.values()), bounds):
            for item, output in zip(batch, self.run_rows(batch), strict=True):
                results[item.key] = output
        return [results[item.key] for item in items]

    def answer(self, surface: str, request: dict[str, Any]) -> Answered:
        """Answer one surface request synchronously (plan, run, finish).

        Raises:
            RequestError: the request as a whole cannot be taken.
        """
        plan = self.loaded.plan(surface, read_request(surface, request))
        return answered(self.loaded.finish(plan, self.run_items(plan.items)), self.name)


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


UNUSED_TRANSFORMERS_BACKENDS = ("_sklearn_available", "_scipy_available")
"""transformers' availability flags of the libraries :func:`import_transformers_lean` hides."""


def import_transformers_lean() -> None:
    """Import transformers' model base without the scikit-learn and SciPy it never uses here.

    When scikit-learn and SciPy are installed (sentence-transformers installs
    both), importing ``transformers.modeling_utils`` and ``transformers.generation``
    imports ``sklearn.metrics.roc_curve`` (for the confidence threshold of
    assisted generation) and ``scipy.optimize`` (for the Hungarian matching of
    object-detection training losses): about 2 s of CPU and 80 MB at the first
    model load (``python -X importtime``, ``VmHWM``; bench/results/startup.md),
    for code an inference server of text models never runs. Their availability
    flags read ``False`` only while those two modules are first imported, and
    are restored at once, so a model class imported later that needs SciPy
    (FNet's TPU Fourier transform) still gets it.

    Does nothing when transformers is absent, when those modules are imported
    already, or when its private flags are not there (another transformers).
    """
    if "transformers.modeling_utils" in sys.modules or "transformers.generation" in sys.modules:
        return
    try:
        from transformers.utils import import_utils
    except ImportError:
        return
    flags = {
        name: getattr(import_utils, name)
        for name in UNUSED_TRANSFORMERS_BACKENDS
        if isinstance(getattr(import_utils, name, None), bool)
    }
    try:
        for name in flags:
            setattr(import_utils, name, False)
        import transformers.generation.utils
        import transformers.modeling_utils  # noqa: F401
    finally:
        for name, value in flags.items():
            setattr(import_utils, name, value)


LEAN_MODULES = ("transformers.modeling_utils", "transformers.generation.utils")
"""The modules of transformers' model base :func:`import_transformers_lean` imports lean."""


class _LeanLoader(importlib.abc.Loader):
    """A module loader that runs the module with transformers' unused backends hidden
    (:data:`UNUSED_TRANSFORMERS_BACKENDS` read ``False`` while it and what it imports
    run; restored after the outermost)."""

    depth = 0

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        created: ModuleType | None = self._loader.create_module(spec)
        return created

    def exec_module(self, module: ModuleType) -> None:
        import_utils = sys.modules.get("transformers.utils.import_utils")
        flags = {
            name: getattr(import_utils, name)
            for name in UNUSED_TRANSFORMERS_BACKENDS
            if _LeanLoader.depth == 0 and isinstance(getattr(import_utils, name, None), bool)
        }
        _LeanLoader.depth += 1
        try:
            for name in flags:
                setattr(import_utils, name, False)
            self._loader.exec_module(module)
        finally:
            _LeanLoader.depth -= 1
            for name, value in flags.items():
                setattr(import_utils, name, value)

    def __getattr__(self, name: str) -> Any:  # get_source, get_resource_reader, ...
        return getattr(self._loader, name)


class _LeanModelBase(importlib.abc.MetaPathFinder):
    """Finds :data:`LEAN_MODULES` as the other finders do, with :class:`_LeanLoader`
    around their loader; leaves ``sys.meta_path`` once both are imported."""

    def find_spec(
        self, name: str, path: Any = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name not in LEAN_MODULES:
            return None
        if all(module in sys.modules for module in LEAN_MODULES if module != name):
            sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _LeanModelBase)]
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, _LeanModelBase):
                continue
            found = getattr(finder, "find_spec", None)
            spec = found(name, path, target) if found is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _LeanLoader(spec.loader)
                return spec  # type: ignore[no-any-return]
        return None


def import_transformers_lean_when_needed() -> None:
    """Have transformers' model base imported lean (as :func:`import_transformers_lean`
    does) whenever something first imports it: an engine's model classes, peft,
    a family. Imports nothing itself, so a model that never needs transformers (on ONNX
    Runtime) never pays for it. Idempotent; does nothing once the base is imported."""
    if all(module in sys.modules for module in LEAN_MODULES):
        return
    if not any(isinstance(finder, _LeanModelBase) for finder in sys.meta_path):
        sys.meta_path.insert(0, _LeanModelBase())


def verified_weights_digest(weights: tuple[str, ...], files: Mapping[str, str]) -> str | None:
    """The weights digest of a spec (``ModelSpec.weights_digest``, the ONNX export cache's
    key) from the digests verification already has, so a restart hashes nothing: a single
    weights file's SHA-256, else SHA-256 over one ``name NUL digest`` line per file in
    name order (the rule an ONNX export cache keys its graphs by when a spec carries none).
    ``None`` when the spec names no weights or one was not verified."""
    if not weights or any(name not in files for name in weights):
        return None
    if len(weights) == 1:
        return files[weights[0]]
    combined = hashlib.sha256()
    for name in sorted(weights):
        combined.update(f"{name}\0{files[name]}\n".encode())
    return combined.hexdigest()


class EngineOptions(Mapping[str, Any]):
    """The options an engine's ``load`` receives; ``torch_device`` is made on first read
    (:meth:`~vllm_srun.plugins.Accelerator.torch_device` imports torch), so an engine
    that never reads it (ONNX Runtime) loads without torch."""

    def __init__(self, values: Mapping[str, Any], torch_device: Callable[[], Any]) -> None:
        self._values = dict(values)
        self._torch_device = torch_device

    def __getitem__(self, key: str) -> Any:
        if key == "torch_device" and key not in self._values:
            self._values[key] = self._torch_device()
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(["torch_device", *(k for k in self._values if k != "torch_device")])

    def __len__(self) -> int:
        return len(self._values) + ("torch_device" not in self._values)


def _out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is torch's out-of-memory error (torch only when already imported)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(err, torch.OutOfMemoryError)


def served_profiles(family: Family, engine: Engine, spec: ModelSpec) -> tuple[Profile, ...]:
    """The profiles the model could be loaded under on ``engine``: those it declares,
    less those the family refuses for the model (the card's ``profiles``)."""
    return tuple(
        p
        for p in engine.profiles
        if p.name == spec.profile or family.refuse_profile(p.name, spec) is None
    )


def load_model(
    model: str | os.PathLike[str],
    options: LoadOptions | None = None,
    *,
    catalog: Catalog | None = None,
) -> ServedModel:
    """Load a model through the installed plugins.

    ``model`` is a local package directory, a built-in model name or a Hub
    repository ``owner/name`` at a 40-hex commit (``MODEL@REV`` or
    ``revision``). :func:`vllm_srun.compose.registry.prepare` resolves it (a built-in
    model's installed mirror first, then the Hugging Face cache in
    ``cache_dir``, then a download unless ``offline``) and verifies its files
    before any weight loads; a built-in model is loaded by the family its
    table entry names unless ``family`` forces another. A local adapter package
    (:mod:`vllm_srun.compose.adapters`) is first merged into its recorded base
    (``base_path``, else the registry) and the merged package loads instead.

    Placement weighs the model at the dtype it will run at (:func:`model_bytes`)
    against ``memory_budget_gib`` (``--memory-budget``) and against the
    device's free memory (:func:`required_bytes`).

    Args:
        model: what to load (above).
        options: the engine arguments and where the bytes come from
            (:class:`LoadOptions`; its defaults when ``None``).
        catalog: the composed plugins (:func:`load_catalog` when ``None``).

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
    options = options or LoadOptions()
    catalog = catalog or load_catalog()
    import_transformers_lean_when_needed()  # when peft, a family or an engine imports a model
    name, device, engine, family = options.name, options.device, options.engine, options.family
    dtype, threads, revision = options.dtype, options.threads, options.revision
    max_model_len, memory_budget_gib = options.max_model_len, options.memory_budget_gib
    adapter = prepare_adapter(  # an adapter package: its merged package loads below
        model,
        base_path=options.base_path,
        revision=revision,
        builtins=catalog.layer("models"),
        cache_dir=options.cache_dir,
        offline=options.offline,
        accept_licences=options.accept_licences,
    )
    if adapter is not None:
        model, name = adapter.package, name or adapter.name
    prepared = prepare(
        model,
        builtins=catalog.layer("models"),
        revision=revision,
        cache_dir=options.cache_dir,
        offline=options.offline,
        accept_licences=options.accept_licences,
    )
    package = prepared.source.path
    if family is None and prepared.entry is not None:
        family = prepared.entry.family
    chosen_family = choose_family(catalog, package, family)
    try:
        chosen_family.check_options(options.family_options)
    except ValueError as err:
        raise LoadError(f"{err}; fix `options` in the models file") from err
    if max_model_len is not None and "decisions" not in chosen_family.surfaces:
        raise LoadError(
            "max_model_len applies to Decision models only: the "
            f"{chosen_family.name} family answers no decisions itself (an embedder that "
            "answers them through a surface extension reads its own input limit); drop "
            "max_model_len for this model"
        )
    try:
        chosen_family.verify(package)
        described = chosen_family.describe(package)
        spec = dataclasses.replace(
            described,
            dtype=dtype,
            max_model_len=max_model_len,
            shared_context=options.enable_shared_context,
            profile=options.profile,
            weights_digest=described.weights_digest
            or verified_weights_digest(described.weights, prepared.verification.files),
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
    refuse_weight_formats(package, placement)
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
    reference = reference_for(catalog, prepared.entry.name if prepared.entry is not None else None)
    try:
        choice = choose_engine(catalog, spec, placement, engine, reference)
    except EngineRefused as err:
        raise LoadError(str(err)) from err
    chosen_engine = choice.engine
    profile = chosen_engine.profile(spec.profile) or EXACT
    refused = chosen_family.refuse_profile(profile.name, spec)
    if refused is not None:
        raise LoadError(f"profile {profile.name} refused by family {chosen_family.name}: {refused}")
    try:
        kernels = chosen_engine.select_kernels(
            catalog.layer("kernels").values(), placement.accelerator.name, profile.name
        )
    except LookupError as err:
        raise LoadError(
            f"engine {chosen_engine.name} cannot run on {placement.accelerator.name}: {err}; "
            "install a plugin that registers that kernel, or choose another --engine"
        ) from err
    engine_options = EngineOptions(
        {
            "providers": placement.accelerator.onnx_providers(placement.device),
            "threads": threads,
            "kernels": kernels,
            "profile": profile,
        },
        lambda: placement.accelerator.torch_device(placement.device.index),
    )
    try:
        engine_model = chosen_engine.load(spec, placement.device, engine_options)
        undeclared = undeclared_members(engine_model)
        if undeclared:
            raise LoadError(
                f"engine {chosen_engine.name} returned a model without "
                f"{' and '.join(undeclared)}; an engine model declares both "
                "(vllm_srun.plugins.EncoderModel, DecoderModel)"
            )
        extra = {"options": options.family_options} if options.family_options else {}
        family_model = chosen_family.load(package, spec, engine_model, **extra)
        loaded = attach_extensions(catalog, family_model)
        cost_key = forward_cost_key(
            prepared.verification.identity or spec.weights_digest,
            (chosen_family, chosen_engine, profile),
            spec,
            placement,
            kernels,
            loaded,
            options.family_options,
            engine_model,
            threads=threads,
        )
        invariance = BatchInvarianceCache().measured(  # once per machine and key
            invariance_key(
                cost_key, profile.batch_tolerance, spec.token_limit, engine_model, loaded
            ),
            lambda: measure_batch_invariance(
                loaded, profile.batch_tolerance, LengthEdges(spec.token_limit)
            ),
        )
        forward_cost = ForwardCostCache().measured(  # once per machine: a timing, not a check
            cost_key, lambda: measure_forward_cost(loaded)
        )
        release_freed_heap()  # what the probes' forwards freed: not the server's to keep
    except RuntimeError as err:
        if _out_of_memory(err):
            free = free_now(placement)
            raise LoadError(
                f"needs about {gib(required_bytes(spec, placement))} GiB, "
                f"{'an unknown amount' if free is None else gib(free)} GiB free; out of memory "
                f"on {placement.device.device} ({str(err).splitlines()[0]})",
                retryable=True,
            ) from err
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
        family_model=family_model,
        augmented=loaded.augmented if isinstance(loaded, ExtendedModel) else frozenset(),
        kernels={slot: k.name for slot, k in kernels.items()},
        identity=prepared.entry.name if prepared.entry is not None else None,
        prepared=prepared,
        options=options,
        adapter=adapter,
        profile=profile,
        profiles=served_profiles(chosen_family, chosen_engine, spec),
        compute_dtype=engine_model.compute_dtype,
        engine_reason=choice.reason,
    )
    served.batch_invariance = invariance
    served.forward_cost = forward_cost
    return served


__all__ = [
    "LoadError",
    "LoadOptions",
    "RequestError",
    "ServedModel",
    "is_retryable",
    "load_model",
]
