"""The plugin module the ``nanoguard`` entry point names: the family and the engine it needs.

Transformers cannot build NanoGuard, so no built-in engine accepts its spec; the
distribution ships ``nanoguard_torch`` beside the family. The family never imports
the engine (both read the architecture name from :mod:`.checkpoint`); the runtime
picks the engine through ``--engine auto`` like any other.
"""

from __future__ import annotations

from vllm_srun.plugins import hookimpl
from vllm_srun.plugins.hookspecs import RegisterEngine, RegisterFamily

from .engine import NanoGuardEngine
from .family import NanoGuardFamily


@hookimpl
def register_families(register: RegisterFamily) -> None:
    """Add the ``nanoguard`` family."""
    register(NanoGuardFamily())


@hookimpl
def register_engines(register: RegisterEngine) -> None:
    """Add the ``nanoguard_torch`` engine."""
    register(NanoGuardEngine())
