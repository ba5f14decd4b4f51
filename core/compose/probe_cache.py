"""The load-time probes' results, kept per machine so that only the first start pays for them.

:func:`vllm_srun.compose.probes.measure_forward_cost` times a dozen forwards (about
0.6 s for MiniLM on a 2-core CPU), and its figure depends only on what runs the
forwards: the model's bytes, the family and engine that run them, the profile,
dtype and kernels, the hardware, the thread count and the versions of the
libraries underneath. :class:`ForwardCostCache` keeps one figure per such
:class:`ForwardCostKey`, in the runtime's cache folder
(:func:`vllm_srun.plugins.runtime_cache_dir`, subfolder :data:`CACHE_FOLDER`),
one file per key named by the SHA-256 of the key; the file repeats the key, and
a file whose key or figure does not match is treated as absent.

The batch-invariance probe (:func:`vllm_srun.compose.probes.measure_batch_invariance`,
about 7 s of a 9 s MiniLM start on ONNX Runtime on a 2-core CPU) is kept the same way by
:class:`BatchInvarianceCache` (subfolder :data:`INVARIANCE_FOLDER`), under an
:class:`InvarianceKey`: the forward-cost key plus what else decides the verdict: the
profile's tolerance, the model's token limit (the ``exact`` width grid), the classes
of the engine's and the family's models, and the probe rows' token ids. Its verdict is
a property of those bits on that hardware with those libraries and threads, which the
key names, so a restart reads what a new probe would find. The golden self-check is
run at every start (it checks the answers themselves) and is never cached.

A file that cannot be read or parsed never fails a load: the probe is run again
(with a warning) and the file rewritten, whole, to a temporary file renamed over
the old one (as the digest cache writes, :mod:`vllm_srun.compose.registry.digests`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm_srun.plugins import runtime_cache_dir
from vllm_srun.plugins.cache import library_versions, write_json_atomically

if TYPE_CHECKING:
    from vllm_srun.compose.placement import Placement
    from vllm_srun.plugins import Engine, Family, Kernel
    from vllm_srun.plugins.loaded import LoadedModel
    from vllm_srun.plugins.profiles import Profile
    from vllm_srun.plugins.spec import DecoderModel, EncoderModel, ModelSpec

log = logging.getLogger(__name__)

CACHE_FOLDER = "forward_cost"
"""The cache's subfolder of :func:`vllm_srun.plugins.runtime_cache_dir`."""

INVARIANCE_FOLDER = "batch_invariance"
"""The batch-invariance cache's subfolder of :func:`vllm_srun.plugins.runtime_cache_dir`."""

CACHE_VERSION = 1
"""The files' ``version``; a file of another version is measured again and rewritten."""

FIGURES = ("fixed_ms", "per_padded_token_ms", "overhead_tokens")
"""The figures :func:`vllm_srun.compose.probes.measure_forward_cost` returns (each a number or
``None``)."""

LIBRARIES = ("vllm-srun", "torch", "transformers")
"""The distributions whose versions are part of every key (absent ones count as ``None``);
:func:`runtime_libraries` adds those the engine model runs on."""


def runtime_libraries(engine_model: EncoderModel | DecoderModel) -> tuple[str, ...]:
    """:data:`LIBRARIES` and the distributions the engine model declares its forwards run
    on (its ``libraries``). Sorted, no duplicates."""
    return tuple(sorted(set(LIBRARIES) | set(engine_model.libraries)))


@dataclass(frozen=True)
class ForwardCostKey:
    """Everything that changes a forward-cost measurement.

    Attributes:
        model: the package's identity (the SHA-256 identity of its verified files,
            :attr:`vllm_srun.compose.registry.verify.Verification.identity`).
        family, engine, profile: the plugin names the model runs through.
        dtype: the dtype the engine model computes in (its ``compute_dtype``: under
            ``max_speed`` a ``--dtype auto`` may run bfloat16), else the one asked for.
        kernels: slot -> kernel name the engine chose.
        hardware: the placement's most specific golden reference key
            (``Accelerator.hardware_keys(device)[0]``) and the device's name (a
            runtime cache on a volume that replicas on other machines share must
            not hand one machine's figure to another).
        threads: the CPU threads the forwards run on: ``torch.get_num_threads()`` when the
            model was loaded, if torch was imported by then (its engine runs on torch);
            else ``--threads`` (0: the engine's default, one per core).
        probe_tokens: the token count of each probe row, in order (the shapes timed).
        options: the family options from the models file.
        libraries: distribution -> version (:func:`~vllm_srun.plugins.cache.library_versions`).
    """

    model: str
    family: str
    engine: str
    profile: str
    dtype: str
    kernels: dict[str, str]
    hardware: tuple[str, str]
    threads: int
    probe_tokens: tuple[int, ...]
    options: dict[str, Any] = field(default_factory=dict)
    libraries: dict[str, str | None] = field(default_factory=lambda: library_versions(LIBRARIES))

    def document(self) -> dict[str, Any]:
        """The key as JSON values (tuples become lists)."""
        fields = asdict(self)
        fields["hardware"] = list(self.hardware)
        fields["probe_tokens"] = list(self.probe_tokens)
        return fields

    def digest(self) -> str:
        """Hex SHA-256 over the key's canonical JSON (sorted keys): the file name."""
        text = json.dumps(self.document(), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode()).hexdigest()


def forward_cost_key(
    identity: str | None,
    runners: tuple[Family, Engine, Profile],
    spec: ModelSpec,
    placement: Placement,
    kernels: Mapping[str, Kernel],
    loaded: LoadedModel[Any],
    options: Mapping[str, Any] | None,
    engine_model: EncoderModel | DecoderModel,
    *,
    threads: int | None = None,
) -> ForwardCostKey | None:
    """The key of a loaded model's forward cost, or ``None`` when nothing identifies its
    bytes (``identity`` empty) or the accelerator cannot name the hardware (its
    ``hardware_keys`` raised): the figure is then measured at every start.

    Args:
        identity: the verified package's identity (or the family's weights digest).
        runners: the family, engine and profile the model runs through.
        spec: the model's spec (its requested ``dtype``, when the engine model says no
            ``compute_dtype``).
        placement: where it runs (the accelerator's most specific hardware key).
        kernels: slot -> kernel the engine chose.
        loaded: the loaded model (its probe rows' lengths).
        options: the models file's family options.
        engine_model: what the engine loaded: its declared ``compute_dtype`` and
            ``libraries`` (:func:`runtime_libraries`).
        threads: ``--threads`` (``None``: the engine's default), the key's thread count
            when torch is not imported (a model on ONNX Runtime: its session's threads).
    """
    if not identity:
        return None
    try:
        reference = str(placement.accelerator.hardware_keys(placement.device)[0])
    except Exception as err:  # a plugin's fault must not fail the load: measure instead
        log.warning("no forward-cost cache key: hardware_keys failed (%s)", err)
        return None
    family, engine, profile = runners
    return ForwardCostKey(
        model=identity,
        family=family.name,
        engine=engine.name,
        profile=profile.name,
        # the dtype it computes in: under max_speed, `auto` may mean bfloat16
        dtype=engine_model.compute_dtype or spec.dtype,
        kernels={slot: kernel.name for slot, kernel in sorted(kernels.items())},
        hardware=(reference, placement.device.name),
        threads=_threads(threads),
        probe_tokens=tuple(item.tokens for item in loaded.probe_items()),
        options=dict(options or {}),
        libraries=library_versions(runtime_libraries(engine_model)),
    )


def _threads(requested: int | None) -> int:
    """The key's thread count (:attr:`ForwardCostKey.threads`); torch is never imported here."""
    torch = sys.modules.get("torch")
    return int(torch.get_num_threads()) if torch is not None else int(requested or 0)


@dataclass(frozen=True)
class InvarianceKey(ForwardCostKey):
    """Everything that changes the batch-invariance verdict: a :class:`ForwardCostKey` and

    Attributes:
        tolerance: the profile's ``batch_tolerance`` (``None``: ``max_speed``).
        token_limit: the model's token limit (the ``exact`` probe's width grid).
        models: ``module.qualname`` of the engine's model and of the loaded model.
        probe_rows: BLAKE2b over the probe rows' token and segment ids.
    """

    tolerance: float | None = None
    token_limit: int | None = None
    models: tuple[str, ...] = ()
    probe_rows: str = ""

    def document(self) -> dict[str, Any]:
        """The key as JSON values (tuples become lists)."""
        fields = super().document()
        fields["models"] = list(self.models)
        return fields


def invariance_key(
    cost_key: ForwardCostKey | None,
    tolerance: float | None,
    token_limit: int | None,
    engine_model: object,
    loaded: LoadedModel[Any],
) -> InvarianceKey | None:
    """The key of a loaded model's batch-invariance verdict, or ``None`` when its forward
    cost has none (nothing identifies the model's bytes or hardware): then it is probed
    at every start.

    Args:
        cost_key: the model's :func:`forward_cost_key`.
        tolerance: the profile's ``batch_tolerance``.
        token_limit: the model's token limit (``spec.token_limit``).
        engine_model: what the engine loaded.
        loaded: the loaded model (its class and its probe rows).
    """
    if cost_key is None:
        return None
    rows = hashlib.blake2b(digest_size=16)
    for item in loaded.probe_items():
        rows.update(repr((item.input_ids, item.token_type_ids, item.prefix)).encode())
    return InvarianceKey(
        **{f.name: getattr(cost_key, f.name) for f in fields(ForwardCostKey)},
        tolerance=tolerance,
        token_limit=token_limit,
        models=tuple(_qualified(m) for m in (engine_model, loaded)),
        probe_rows=rows.hexdigest(),
    )


def _qualified(value: object) -> str:
    return f"{type(value).__module__}.{type(value).__qualname__}"


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python number it holds (JSON writes those as numbers)."""
    item = getattr(value, "item", None)
    return item() if callable(item) else str(value)


class ForwardCostCache:
    """Forward-cost figures remembered per :class:`ForwardCostKey` across processes.

    Args:
        folder: where the files live (default: :data:`CACHE_FOLDER` under
            :func:`vllm_srun.plugins.runtime_cache_dir` of ``environ``).
        environ: the environment to read the cache folder from (default ``os.environ``).
    """

    subfolder = CACHE_FOLDER
    entry = "forward_cost"
    label = "forward-cost"
    what = "the forward cost"

    def __init__(
        self, folder: Path | None = None, environ: Mapping[str, str] | None = None
    ) -> None:
        self.folder = folder if folder is not None else runtime_cache_dir(environ) / self.subfolder

    def path(self, key: ForwardCostKey) -> Path:
        """The file of ``key``: ``<folder>/<key digest>.json``."""
        return self.folder / f"{key.digest()}.json"

    def get(self, key: ForwardCostKey) -> dict[str, Any] | None:
        """The figures recorded for ``key`` (:data:`FIGURES`), or ``None`` when there are
        none, or (with a warning) the file cannot be read, is not JSON, is of another
        :data:`CACHE_VERSION`, holds another key or malformed figures. Never raises."""
        file = self.path(key)
        try:
            text = file.read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, UnicodeDecodeError) as err:
            return self._ignored(file, str(err))
        try:
            document = json.loads(text)
        except ValueError as err:
            return self._ignored(file, f"not JSON: {err}")
        problem = _malformed(document, key) or self._malformed_value(document.get(self.entry))
        if problem is not None:
            return self._ignored(file, problem)
        return self._kept(document[self.entry])

    def put(self, key: ForwardCostKey, cost: Mapping[str, Any]) -> None:
        """Record ``cost``'s :data:`FIGURES` for ``key``, replacing the file atomically
        (mode 0600). A failure to write is logged as a warning (the next start
        measures again); it never raises."""
        file = self.path(key)
        document = {"version": CACHE_VERSION, "key": key.document(), self.entry: self._kept(cost)}
        try:
            write_json_atomically(file, document)
        except OSError as err:
            log.warning(
                "cannot write the %s cache %s (%s): the next start measures %s again; make "
                "the folder writable or set VLLM_SRUN_CACHE_DIR",
                self.label,
                file,
                err.strerror or err,
                self.what,
            )

    def _kept(self, cost: Mapping[str, Any]) -> dict[str, Any]:
        """What a file keeps of a result: the :data:`FIGURES`."""
        return {name: cost.get(name) for name in FIGURES}

    def _malformed_value(self, cost: Any) -> str | None:
        """What is wrong with a file's recorded figures, or ``None``."""
        if not isinstance(cost, dict):
            return "its forward_cost is not an object"
        for name in FIGURES:
            if name not in cost:
                return f"its forward_cost has no {name}"
            value = cost[name]
            if value is not None and (type(value) not in (int, float) or value < 0):
                return f"its {name} is not a non-negative number"
        return None

    def measured(
        self, key: ForwardCostKey | None, measure: Callable[[], dict[str, Any]]
    ) -> dict[str, Any]:
        """The forward cost for ``key``: the recorded figures with ``"source": "cache"``,
        else ``measure()``'s with ``"source": "measured"``, recorded for next time when
        it found a cost (an all-``None`` answer, a device with room to spare or a noisy
        run, is measured again at the next start). ``key`` ``None`` (nothing identifies
        the model's bytes) always measures and records nothing."""
        if key is not None:
            known = self.get(key)
            if known is not None:
                return {**known, "source": "cache"}
        cost = measure()
        if key is not None and self._worth_keeping(cost):
            self.put(key, cost)
        return {**cost, "source": "measured"}

    @staticmethod
    def _worth_keeping(cost: Mapping[str, Any]) -> bool:
        return cost.get("fixed_ms") is not None

    def _ignored(self, file: Path, why: str) -> dict[str, Any] | None:
        """Log that ``file`` is ignored and why; ``None`` (what :meth:`get` answers then)."""
        log.warning(
            "the %s cache file %s is ignored (%s): %s is measured again and the file rewritten",
            self.label,
            file,
            why,
            self.what,
        )
        return None


class BatchInvarianceCache(ForwardCostCache):
    """Batch-invariance verdicts (:func:`vllm_srun.compose.probes.measure_batch_invariance`)
    remembered per :class:`InvarianceKey` across processes, in :data:`INVARIANCE_FOLDER`;
    :meth:`measured` adds ``"source"`` as for the forward cost. A verdict of
    ``one_by_one`` from a probe that found no difference (no probe rows) is kept too:
    it is what the probe finds every time."""

    subfolder = INVARIANCE_FOLDER
    entry = "batch_invariance"
    label = "batch-invariance"
    what = "the batch invariance"

    def _kept(self, cost: Mapping[str, Any]) -> dict[str, Any]:
        kept = {name: value for name, value in cost.items() if name != "source"}
        plain: dict[str, Any] = json.loads(json.dumps(kept, default=_plain))
        return plain

    def _malformed_value(self, cost: Any) -> str | None:
        if not isinstance(cost, dict):
            return "its batch_invariance is not an object"
        if not isinstance(cost.get("method"), str):
            return "its batch_invariance has no method"
        if not isinstance(cost.get("cross_request_batching"), bool):
            return "its batch_invariance has no cross_request_batching"
        return None

    @staticmethod
    def _worth_keeping(cost: Mapping[str, Any]) -> bool:
        return True


def _malformed(document: Any, key: ForwardCostKey) -> str | None:
    """What is wrong with a parsed cache file for ``key`` (its version and key), or ``None``."""
    if not isinstance(document, dict) or document.get("version") != CACHE_VERSION:
        return f"not a version {CACHE_VERSION} cache file"
    expected = json.loads(json.dumps(key.document(), default=str))
    if document.get("key") != expected:
        return "it records another key"
    return None


__all__ = [
    "CACHE_FOLDER",
    "CACHE_VERSION",
    "FIGURES",
    "INVARIANCE_FOLDER",
    "LIBRARIES",
    "BatchInvarianceCache",
    "ForwardCostCache",
    "ForwardCostKey",
    "InvarianceKey",
    "forward_cost_key",
    "invariance_key",
    "runtime_libraries",
]
