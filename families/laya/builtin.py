"""The published Laya checkpoints this family knows (filled in below)."""

from __future__ import annotations

from vllm_srun.plugins import ModelEntry, hookimpl
from vllm_srun.plugins.hookspecs import RegisterModel

BUILTIN_MODELS: tuple[ModelEntry, ...] = ()


@hookimpl
def register_models(register: RegisterModel) -> None:
    """Register the published Laya checkpoints."""
    for entry in BUILTIN_MODELS:
        register(entry)
