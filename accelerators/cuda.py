"""The ``cuda`` accelerator: NVIDIA GPUs through PyTorch's CUDA build.

A ROCm build of PyTorch also answers ``torch.cuda.is_available()``; this
plugin only claims the GPUs when ``torch.version.hip`` is ``None`` and leaves
HIP builds to ``rocm``. Golden reference keys are ``cuda:sm_<major><minor>``
then ``cuda``.
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_srun.plugins import (
    Accelerator,
    DeviceInfo,
    ExecutionProvider,
    hookimpl,
    torch_devices,
)
from vllm_srun.plugins.hookspecs import RegisterAccelerator

BF16_NATIVE_MAJOR = 8
"""Compute capability 8.0 (Ampere) is the first with bf16 tensor cores (CUDA programming guide)."""


class CudaAccelerator(Accelerator):
    """NVIDIA GPUs; devices ``cuda:0``, ``cuda:1``, ..."""

    name = "cuda"
    auto_priority = 20

    def available(self) -> bool:
        """A CUDA (not HIP) build of PyTorch that sees at least one GPU."""
        try:
            return torch.version.hip is None and bool(torch.cuda.is_available())
        except Exception:
            return False

    def devices(self) -> list[DeviceInfo]:
        """Every visible GPU, with memory from ``cudaMemGetInfo`` and its compute capability."""
        if not self.available():
            return []
        return torch_devices("cuda", torch.cuda, _capabilities)

    def torch_device(self, index: int | None) -> torch.device:
        """``torch.device("cuda", index)``."""
        return torch.device("cuda", index or 0)

    def synchronize(self, index: int | None) -> None:
        """Wait for the GPU's queued kernels."""
        torch.cuda.synchronize(index or 0)

    def hardware_keys(self, device: DeviceInfo) -> list[str]:
        """``cuda:sm_90`` then ``cuda``."""
        return [f"cuda:{device.capabilities['sm']}", "cuda"]

    def onnx_providers(self, device: DeviceInfo) -> list[ExecutionProvider]:
        """CUDA on this GPU, then the CPU for operators CUDA lacks."""
        return [
            ("CUDAExecutionProvider", {"device_id": device.index or 0}),
            ("CPUExecutionProvider", {}),
        ]


def _capabilities(props: Any, name: str) -> dict[str, Any]:
    major, minor = int(props.major), int(props.minor)
    return {
        "compute_capability": f"{major}.{minor}",
        "sm": f"sm_{major}{minor}",
        "bf16": "bf16_native" if major >= BF16_NATIVE_MAJOR else "bf16_emulated",
        "multiprocessors": int(getattr(props, "multi_processor_count", 0)),
        "cuda_version": torch.version.cuda,
    }


@hookimpl
def register_accelerators(register: RegisterAccelerator) -> None:
    """Register the ``cuda`` accelerator."""
    register(CudaAccelerator())
