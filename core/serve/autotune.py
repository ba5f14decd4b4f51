"""``--autotune-cache DIR``: where compiled GPU kernels and kernel tuning persist across runs.

At serve start, before any model loads (so before any kernel compiles), the
directory (``--autotune-cache``, else ``$VLLM_SRUN_AUTOTUNE_CACHE``) gets two
subdirectories and the process environment points the compilers at them:

- ``TRITON_CACHE_DIR=DIR/triton``: Triton's compiled kernels;
- ``TRITON_CACHE_AUTOTUNING=1``: Triton also keeps its autotuning choices there;
- ``TORCHINDUCTOR_CACHE_DIR=DIR/inductor``: TorchInductor's compiled graphs,
  kernels and tuning results.

Both compilers read these variables when they first compile, not when they are
imported. Without the option and the variable nothing is set, and the
libraries keep their own defaults. The directory in effect is on every model
card (``autotune_cache``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path

ENV = "VLLM_SRUN_AUTOTUNE_CACHE"
"""The environment variable ``--autotune-cache`` defaults to."""

TRITON_DIR = "triton"
INDUCTOR_DIR = "inductor"

_applied: str | None = None


def directory(option: str | os.PathLike[str] | None, environ: Mapping[str, str]) -> Path | None:
    """The autotune cache in effect: ``option``, else ``$VLLM_SRUN_AUTOTUNE_CACHE`` (an
    empty value counts as unset), as an absolute path; ``None`` when neither is given."""
    chosen = os.fspath(option) if option else environ.get(ENV) or None
    return Path(chosen).expanduser().resolve() if chosen else None


def apply(
    option: str | os.PathLike[str] | None,
    environ: MutableMapping[str, str] | None = None,
) -> Path | None:
    """Create the autotune cache's directories and point Triton and TorchInductor at them.

    Args:
        option: ``--autotune-cache`` (``None``: the environment variable).
        environ: the environment to read and set (default ``os.environ``).

    Returns:
        The directory in effect, or ``None`` (nothing was set).

    Raises:
        OSError: a directory cannot be created.
    """
    global _applied
    env = os.environ if environ is None else environ
    root = directory(option, env)
    if root is None:
        _applied = None
        return None
    triton, inductor = root / TRITON_DIR, root / INDUCTOR_DIR
    for folder in (triton, inductor):
        folder.mkdir(parents=True, exist_ok=True)
    env["TRITON_CACHE_DIR"] = str(triton)
    env["TRITON_CACHE_AUTOTUNING"] = "1"
    env["TORCHINDUCTOR_CACHE_DIR"] = str(inductor)
    _applied = str(root)
    return root


def applied() -> str | None:
    """The autotune cache this process set up at serve start (the card's ``autotune_cache``)."""
    return _applied


__all__ = ["ENV", "applied", "apply", "directory"]
