"""Which engine runs a model, and why: the one decision between a family's spec and a load.

``--engine NAME`` pins an engine. ``--engine auto`` takes, in order:

1. under the ``exact`` profile, an engine the model's golden reference declares at
   parity on this device (``engine_parity``: its answers were measured equal to the
   recorded ones within the golden tolerance for the device's most specific reference
   key that has answers), when that engine accepts the model. The answers a client
   reads are then those of the reference either way, and the engine that starts
   faster serves them (ONNX Runtime needs neither torch nor transformers).
2. otherwise the engines by :meth:`~vllm_srun.plugins.Engine.auto_rank`, the first
   that accepts the model and declares the profile.

The reason is kept with the choice and shown on the card (``engine_reason``), so an
operator reads why a model runs where it does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vllm_srun.compose.placement import Placement
from vllm_srun.plugins import EXACT, Engine, GoldenReference
from vllm_srun.plugins.host import Catalog
from vllm_srun.plugins.spec import ModelSpec


class EngineRefused(Exception):
    """No engine can run the model: the pinned one is missing or refuses, or every engine
    refuses under ``auto``; the message lists each engine's reason."""


@dataclass(frozen=True)
class EngineChoice:
    """The engine a model loads on and why, in words (the card's ``engine_reason``).

    Attributes:
        engine: the chosen engine.
        reason: why it was chosen (``named by --engine``; ``auto: ...``).
    """

    engine: Engine
    reason: str


def reference_for(catalog: Catalog, identity: str | None) -> GoldenReference | None:
    """The golden reference registered for a model identity, or ``None``."""
    if identity is None:
        return None
    found = catalog.layer("golden_references").get(identity)
    return found if isinstance(found, GoldenReference) else None


def select_key(reference: GoldenReference | None, keys: Sequence[str]) -> str | None:
    """The first of ``keys`` (most specific first) the reference has answers for, or
    ``None``: the key the golden self-check compares against."""
    if reference is None:
        return None
    return next((key for key in keys if key in reference.answers), None)


def parity_key(reference: GoldenReference | None, keys: Sequence[str], engine: str) -> str | None:
    """The reference key on which ``reference`` declares ``engine`` at parity, or ``None``.

    Only the most specific of ``keys`` (the device's, most specific first) that has
    recorded answers counts: that is the key the golden self-check compares against,
    so parity declared on a broader key says nothing about this device.
    """
    recorded = select_key(reference, keys)
    if reference is not None and recorded in reference.engine_parity.get(engine, ()):
        return recorded
    return None


def choose_engine(
    catalog: Catalog,
    spec: ModelSpec,
    placement: Placement,
    forced: str,
    reference: GoldenReference | None = None,
) -> EngineChoice:
    """The engine for ``spec`` on the placed device, under the profile ``spec.profile``
    (this module's rules).

    Args:
        catalog: the composed plugins.
        spec: the family's description of the model.
        placement: the device the model was placed on.
        forced: ``--engine`` (``auto`` or an engine name).
        reference: the model's golden reference (its ``engine_parity``), if any.

    Raises:
        EngineRefused: the pinned engine is missing, refuses or does not declare the
            profile, or (``auto``) no engine accepts; the message lists every
            engine's reason.
    """
    engines = catalog.layer("engines")
    if forced != "auto":
        engine = engines.get(forced)
        if engine is None:
            installed = ", ".join(sorted(engines)) or "none"
            raise EngineRefused(f"no engine named {forced!r} is installed (installed: {installed})")
        reason = _refusal(engine, spec, placement)
        if reason is not None:
            raise EngineRefused(f"engine {forced} cannot run the model: {reason}")
        return EngineChoice(engine, "named by --engine")

    reasons = []
    if spec.profile == EXACT.name:
        keys = placement.accelerator.reference_keys(placement.device, _reference_dtype(spec))
        for name in sorted(engines):
            key = parity_key(reference, keys, name)
            if key is None:
                continue
            refusal = _refusal(engines[name], spec, placement)
            if refusal is None:
                return EngineChoice(
                    engines[name],
                    f"auto: its answers equal the golden reference on {key} (measured, "
                    "declared by the reference), and it was preferred for that",
                )
            reasons.append(f"{name} (at parity on {key}): {refusal}")
    ranks = {name: engine.auto_rank(spec, placement.device) for name, engine in engines.items()}
    for _, name in sorted((rank, name) for name, rank in ranks.items() if rank is not None):
        engine = engines[name]
        refusal = _refusal(engine, spec, placement)
        if refusal is None:
            return EngineChoice(engine, _ranked_reason(name, reasons))
        reasons.append(f"{engine.name}: {refusal}")
    raise EngineRefused(
        "no engine can run the model: " + "; ".join(reasons or ["no engine installed"])
    )


def _ranked_reason(name: str, refused: list[str]) -> str:
    """Why the ranked choice ``name`` was taken, naming what was passed over."""
    reason = f"auto: the first engine by rank that accepts the model ({name})"
    return f"{reason}; passed over: {'; '.join(refused)}" if refused else reason


def _reference_dtype(spec: ModelSpec) -> str:
    """The dtype whose recorded answers an ``exact`` model is checked against: ``auto``
    at the released precision (pinned or not), else the pinned ``--dtype``."""
    return "auto" if spec.dtype in ("auto", spec.released_dtype) else spec.dtype


def _refusal(engine: Engine, spec: ModelSpec, placement: Placement) -> str | None:
    """Why ``engine`` will not run ``spec`` on the placed device under its profile."""
    if engine.profile(spec.profile) is None:
        offered = ", ".join(p.name for p in engine.profiles) or "none"
        return (
            f"it has no profile {spec.profile!r} (its profiles: {offered}); choose one of "
            "those with --profile or models-file `profile`, or install an engine that "
            "declares it"
        )
    refusal: str | None = engine.supports(spec, placement.device)
    return refusal


__all__ = [
    "EngineChoice",
    "EngineRefused",
    "choose_engine",
    "parity_key",
    "reference_for",
    "select_key",
]
