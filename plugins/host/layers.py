"""The plugin layers: which hook fills each, how objects are named and checked."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vllm_srun.plugins.accelerator import NAME_PATTERN, Accelerator
from vllm_srun.plugins.engine import Engine
from vllm_srun.plugins.extension import SurfaceExtension, extension_violations
from vllm_srun.plugins.family import Family
from vllm_srun.plugins.golden import GoldenReference, golden_violations
from vllm_srun.plugins.kernel import Kernel, kernel_violations
from vllm_srun.plugins.models import ModelEntry, model_violations
from vllm_srun.plugins.profiles import profile_violations


@dataclass(frozen=True)
class Layer:
    """One layer of the plugin registry.

    Attributes:
        name: the layer's name in ``vllm-srun plugins --json`` (``accelerators``).
        hook: the hook that fills it (``register_accelerators``).
        contract: the type every registered object must be an instance of.
        key: the object's registry name (unique per layer across plugins).
        violations: reasons an instance of ``contract`` breaks the contract.
    """

    name: str
    hook: str
    contract: type
    key: Callable[[Any], str]
    violations: Callable[[Any], list[str]]

    def check(self, obj: Any) -> list[str]:
        """Reasons ``obj`` cannot be registered in this layer (empty when it can)."""
        if not isinstance(obj, self.contract):
            qualified = f"{self.contract.__module__}.{self.contract.__qualname__}"
            return [f"{type(obj).__qualname__} is not an instance of {qualified}"]
        missing = sorted(
            name
            for name in getattr(self.contract, "__abstractmethods__", ())
            if not callable(getattr(obj, name, None))
        )
        if missing:  # a virtual subclass (Contract.register) skips the ABC's own check
            return [f"missing methods of {self.contract.__name__}: {', '.join(missing)}"]
        return self.violations(obj)


def _named_violations(obj: Any, kind: str) -> list[str]:
    name = getattr(obj, "name", None)
    if type(name) is not str or not NAME_PATTERN.match(name):
        return [f"{kind} name {name!r} must match {NAME_PATTERN.pattern}"]
    return []


def _prioritised_violations(obj: Any, kind: str) -> list[str]:
    problems = _named_violations(obj, kind)
    priority = getattr(obj, "auto_priority", None)
    if priority is not None and type(priority) is not int:
        problems.append(f"{kind} auto_priority must be an int or None, not {priority!r}")
    return problems


def _engine_violations(engine: Engine) -> list[str]:
    problems = _prioritised_violations(engine, "engine")
    declared = getattr(engine, "profiles", None)
    if not isinstance(declared, tuple) or not declared:
        return [*problems, "engine profiles must be a non-empty tuple of Profile"]
    for profile in declared:
        problems.extend(profile_violations(profile))
    names = [getattr(p, "name", None) for p in declared]
    if len(set(names)) != len(names):
        problems.append(f"engine profiles must have distinct names, not {names}")
    return problems


def _accelerator_violations(accelerator: Accelerator) -> list[str]:
    problems = _prioritised_violations(accelerator, "accelerator")
    tolerance = getattr(accelerator, "golden_tolerance", None)
    if (
        not isinstance(tolerance, int | float)
        or isinstance(tolerance, bool)
        or not 0 < tolerance < math.inf
    ):
        problems.append(
            f"accelerator golden_tolerance must be a finite number above 0, not {tolerance!r}"
        )
    return problems


def _family_violations(family: Family) -> list[str]:
    problems = _named_violations(family, "family")
    surfaces = getattr(family, "surfaces", None)
    if (
        not isinstance(surfaces, tuple)
        or not surfaces
        or not all(type(s) is str and s for s in surfaces)
    ):
        problems.append("family surfaces must be a non-empty tuple of surface names")
    return problems


LAYERS: tuple[Layer, ...] = (
    Layer("families", "register_families", Family, lambda o: o.name, _family_violations),
    Layer(
        "engines",
        "register_engines",
        Engine,
        lambda o: o.name,
        _engine_violations,
    ),
    Layer(
        "accelerators",
        "register_accelerators",
        Accelerator,
        lambda o: o.name,
        _accelerator_violations,
    ),
    Layer("kernels", "register_kernels", Kernel, lambda o: o.key, kernel_violations),
    Layer(
        "golden_references",
        "register_golden_references",
        GoldenReference,
        lambda o: o.key,
        golden_violations,
    ),
    Layer("models", "register_models", ModelEntry, lambda o: o.key, model_violations),
    Layer(
        "surface_extensions",
        "register_surface_extensions",
        SurfaceExtension,
        lambda o: o.name,
        extension_violations,
    ),
)
"""Every layer, in the order ``vllm-srun plugins`` shows them."""
