"""Where vllm-srun keeps what it builds once and reuses: one folder for the runtime and
every plugin (merged adapters, ONNX exports, converted GGUF packages, verified digests,
a third-party family's converted tokenizer), each in a subfolder of its own."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def runtime_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The runtime's cache folder: ``$VLLM_SRUN_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/vllm-srun``, else ``~/.cache/vllm-srun`` (an empty variable counts
    as unset; ``~`` is expanded). Nothing is created.

    Args:
        environ: the environment to read (default ``os.environ``).
    """
    env = os.environ if environ is None else environ
    if env.get("VLLM_SRUN_CACHE_DIR"):
        return Path(env["VLLM_SRUN_CACHE_DIR"]).expanduser()
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]).expanduser() / "vllm-srun"
    return Path.home() / ".cache" / "vllm-srun"


__all__ = ["runtime_cache_dir"]
