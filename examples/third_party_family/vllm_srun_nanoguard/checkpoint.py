"""NanoGuard's ``model.pt``: a torch checkpoint read only with ``torch.load(weights_only=True)``.

The file is a dictionary: ``model_state_dict`` (the tensors), ``config`` (the
hyperparameters, :class:`~.network.NetworkConfig` plus ``n_kv_head`` and
``dropout``), and optionally ``metrics`` and ``version``. ``weights_only`` unpickles
tensors and plain containers only, so a file needing anything else is refused
rather than run.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import torch

from vllm_srun.plugins import PackageError

from .network import NetworkConfig

WEIGHTS = "model.pt"
"""The package's checkpoint."""

ARCHITECTURE = "NanoGuardClassifier"
"""The ``ModelSpec.architecture`` the family describes and the engine runs."""

MARKERS = (b"model_state_dict", b"x0_lambdas", b"cls_head.weight")
"""Strings the checkpoint's pickled header holds: what :func:`looks_like_nanoguard` reads."""

CONFIG_KEYS = ("sequence_len", "vocab_size", "n_layer", "n_head", "n_embd", "num_classes")
"""Integer hyperparameters the ``config`` entry must give."""


def looks_like_nanoguard(package: Path) -> bool:
    """Whether ``package/model.pt`` is a torch zip checkpoint whose header names NanoGuard's
    tensors; reads the header (a few kilobytes), never the weights, and never raises."""
    try:
        with zipfile.ZipFile(package / WEIGHTS) as archive:
            header = next((n for n in archive.namelist() if n.endswith("/data.pkl")), None)
            if header is None:
                return False
            data = archive.read(header)
    except (OSError, zipfile.BadZipFile):
        return False
    return all(marker in data for marker in MARKERS)


def read_checkpoint(package: Path) -> dict[str, Any]:
    """The checkpoint dictionary, tensors memory-mapped on the CPU.

    Raises:
        PackageError: the file is missing, needs more than ``weights_only``, or is
            not a dictionary with ``model_state_dict`` and ``config``.
    """
    try:
        checkpoint = torch.load(package / WEIGHTS, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise PackageError(
            f"{WEIGHTS} does not load with torch.load(weights_only=True): {first}"
        ) from err
    if not isinstance(checkpoint, dict) or not {"model_state_dict", "config"} <= set(checkpoint):
        raise PackageError(f"{WEIGHTS} must be a dictionary with model_state_dict and config")
    return checkpoint


def network_config(checkpoint: dict[str, Any]) -> NetworkConfig:
    """The checked hyperparameters of a checkpoint (:func:`read_checkpoint`).

    Raises:
        PackageError: a missing or non-positive integer, ``n_kv_head`` other than
            ``n_head`` (grouped queries are not implemented), or a head size that
            does not split into rotary pairs.
    """
    raw = checkpoint["config"]
    if not isinstance(raw, dict):
        raise PackageError(f"{WEIGHTS}: config must be a dictionary")
    bad = [k for k in CONFIG_KEYS if type(raw.get(k)) is not int or raw[k] < 1]
    if bad:
        raise PackageError(f"{WEIGHTS}: config needs positive integers for {', '.join(bad)}")
    config = NetworkConfig(**{k: raw[k] for k in CONFIG_KEYS})
    if raw.get("n_kv_head", config.n_head) != config.n_head:
        raise PackageError(
            f"{WEIGHTS}: n_kv_head {raw.get('n_kv_head')} differs from n_head {config.n_head}; "
            "this family runs plain multi-head attention only"
        )
    if config.n_embd % config.n_head or config.head_dim % 2:
        raise PackageError(
            f"{WEIGHTS}: n_embd {config.n_embd} must split into {config.n_head} heads of an "
            "even size (rotary embeddings rotate channel pairs)"
        )
    return config


def parameter_count(checkpoint: dict[str, Any]) -> int:
    """Elements of every tensor in ``model_state_dict`` (16,779,274 for the released model)."""
    return sum(t.numel() for t in checkpoint["model_state_dict"].values())
