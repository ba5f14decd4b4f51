"""The vllm-srun hook specifications: the whole extension surface on one page.

A plugin is any module (or object) named by an entry point in the group
``vllm_srun`` that implements one or more of these hooks with
:data:`vllm_srun.plugins.hookimpl`. Every hook receives a ``register``
callback; call it once per object the plugin contributes (zero is fine)::

    from vllm_srun.plugins import hookimpl

    @hookimpl
    def register_accelerators(register):
        register(MyAccelerator())

Every hook is *collect-all*: the runtime calls each plugin's implementation
on its own, so every object is attributed to the plugin that registered it.
Names are unique per layer across all plugins; when two plugins register the
same name in one layer, neither object is used and ``vllm-srun plugins``
shows the clash naming both. An object that fails its contract is refused
with the reason. Implementations must be idempotent: a process may load the
plugins more than once (a test, a worker subprocess).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:  # the contracts import nothing from here; avoid a cycle at run time
    from vllm_srun.plugins.accelerator import Accelerator
    from vllm_srun.plugins.engine import Engine
    from vllm_srun.plugins.extension import SurfaceExtension
    from vllm_srun.plugins.family import Family
    from vllm_srun.plugins.golden import GoldenReference
    from vllm_srun.plugins.kernel import Kernel
    from vllm_srun.plugins.models import ModelEntry

PROJECT_NAME = "vllm_srun"
"""The pluggy project name and the entry-point group plugins are found in."""

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

RegisterFamily = Callable[["Family"], None]
RegisterEngine = Callable[["Engine"], None]
RegisterAccelerator = Callable[["Accelerator"], None]
RegisterKernel = Callable[["Kernel"], None]
RegisterGoldenReference = Callable[["GoldenReference"], None]
RegisterModel = Callable[["ModelEntry"], None]
RegisterSurfaceExtension = Callable[["SurfaceExtension"], None]
"""The callback each hook receives: ``register(obj)`` adds one object of the hook's layer
(an object of another type is refused with the reason, never registered)."""


@hookspec
def register_families(register: RegisterFamily) -> None:
    """Register model families (:class:`vllm_srun.plugins.Family` instances)."""


@hookspec
def register_engines(register: RegisterEngine) -> None:
    """Register engines (:class:`vllm_srun.plugins.Engine` instances)."""


@hookspec
def register_accelerators(register: RegisterAccelerator) -> None:
    """Register accelerators (:class:`vllm_srun.plugins.Accelerator` instances)."""


@hookspec
def register_kernels(register: RegisterKernel) -> None:
    """Register kernel implementations (:class:`vllm_srun.plugins.Kernel`) for an op slot."""


@hookspec
def register_golden_references(register: RegisterGoldenReference) -> None:
    """Register recorded golden answers (:class:`vllm_srun.plugins.GoldenReference`)."""


@hookspec
def register_models(register: RegisterModel) -> None:
    """Register built-in pinned models (:class:`vllm_srun.plugins.ModelEntry`)."""


@hookspec
def register_surface_extensions(register: RegisterSurfaceExtension) -> None:
    """Register surface extensions (:class:`vllm_srun.plugins.SurfaceExtension`).

    An extension adds a surface to a model another family loaded, when that
    model's card qualifies (``similarity_readout``: decisions from embeddings).
    """
