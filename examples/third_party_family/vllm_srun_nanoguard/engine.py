"""The ``nanoguard_torch`` engine: NanoGuard's own PyTorch module on the placed device.

Transformers has no NanoGuard architecture, so the built-in ``native`` engine
refuses the spec; this engine accepts exactly that architecture and nothing
else. It runs where the runtime placed the model (``options["torch_device"]``,
the device ``native`` would use: CPU, CUDA, ROCm, XPU, ...), in eval and
inference mode. Torch stays inside the engine: like every encoder engine it
takes the batch's int64 numpy arrays and returns float32 numpy logits, so the
family never sees a tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from vllm_srun.plugins import DeviceInfo, EncoderBatch, Engine, ModelSpec

from .checkpoint import ARCHITECTURE, WEIGHTS, network_config, read_checkpoint
from .network import NanoGuardNetwork


class NanoGuardModule:
    """A loaded NanoGuard network; :meth:`encode` runs one batch.

    Attributes:
        network: the module, on ``device``.
        device: where it runs.
        compute_dtype: the dtype of its weights (the card's ``dtype``).
        libraries: what its forwards run on: torch and this plugin's own network code.
    """

    libraries = ("torch", "vllm-srun-nanoguard")

    def __init__(self, network: NanoGuardNetwork, device: torch.device) -> None:
        self.network = network
        self.device = device
        self.compute_dtype = str(next(network.parameters()).dtype).removeprefix("torch.")

    def encode(self, batch: EncoderBatch) -> npt.NDArray[np.float32]:
        """float32 ``[rows, labels]`` logits in host memory, C-contiguous.

        ``batch`` holds int64 numpy ``[rows, tokens]`` arrays; they cross into torch
        here and the logits cross back, the only place either happens. Every
        position is attended to, padding included, as the package's own code runs
        the model (its callers pad to ``sequence_len``); the mean pooling reads the
        positions ``attention_mask`` marks as real.
        """
        with torch.inference_mode():
            logits: torch.Tensor = self.network(
                torch.from_numpy(batch.input_ids).to(self.device),
                torch.from_numpy(batch.attention_mask).to(self.device),
                mask_keys=False,
            )
        return np.ascontiguousarray(logits.float().cpu().numpy())


class NanoGuardEngine(Engine):
    """Runs :data:`ARCHITECTURE` specs only; after the built-ins in ``--engine auto``."""

    name = "nanoguard_torch"
    auto_priority = 50

    def supports(self, spec: Any, device: DeviceInfo) -> str | None:
        """``None`` for a NanoGuard sequence-classification spec with ``model.pt``."""
        if not isinstance(spec, ModelSpec) or spec.architecture != ARCHITECTURE:
            return f"{self.name} runs {ARCHITECTURE} only"
        if spec.task != "sequence_classification" or spec.weights != (WEIGHTS,):
            return f"{self.name} runs sequence classification from {WEIGHTS} only"
        if spec.dtype == "float16" and device.accelerator == "cpu":
            return "float16 runs on GPUs only; use --dtype float32 or bfloat16 on a CPU"
        return None

    def load(self, spec: Any, device: DeviceInfo, options: Mapping[str, Any]) -> NanoGuardModule:
        """Build the network from the checkpoint's config, load its tensors strictly, and
        move it to ``options["torch_device"]`` (the CPU when absent) at ``spec``'s dtype.

        Raises:
            ValueError: :meth:`supports` refuses the spec.
            PackageError: the checkpoint does not load with ``weights_only=True`` or its
                config is unusable.
            RuntimeError: a tensor name or shape differs from the network's.
        """
        reason = self.supports(spec, device)
        if reason is not None:
            raise ValueError(reason)
        checkpoint = read_checkpoint(spec.package)
        network = NanoGuardNetwork(network_config(checkpoint))
        network.load_state_dict(checkpoint["model_state_dict"], strict=True)
        target = options.get("torch_device", torch.device("cpu"))
        network.to(device=target, dtype=spec.torch_dtype).eval()
        return NanoGuardModule(network, target)
