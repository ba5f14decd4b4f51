"""The ``cuda`` accelerator: NVIDIA GPUs through PyTorch's CUDA build.

A ROCm build of PyTorch also answers ``torch.cuda.is_available()``; this
plugin only claims the GPUs when ``torch.version.hip`` is ``None`` and leaves
HIP builds to ``rocm``. Golden reference keys are ``cuda:sm_<major><minor>``
then ``cuda``.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import TYPE_CHECKING, Any

from vllm_srun.plugins import (
    Accelerator,
    DeviceInfo,
    ExecutionProvider,
    hookimpl,
    torch_devices,
)
from vllm_srun.plugins.accelerator import device_nodes, torch_build
from vllm_srun.plugins.hookspecs import RegisterAccelerator

if TYPE_CHECKING:
    import torch

BF16_NATIVE_MAJOR = 8
"""Compute capability 8.0 (Ampere) is the first with bf16 tensor cores (CUDA programming guide)."""


FP8_MIN_CAPABILITY = (8, 9)
"""FP8 tensor cores start with compute capability 8.9 (Ada Lovelace; Hopper is 9.0)."""

NVFP4_MAJORS = (10, 12)
"""Blackwell data-centre (10.x) and consumer (12.x) GPUs multiply NVFP4."""


class CudaAccelerator(Accelerator):
    """NVIDIA GPUs; devices ``cuda:0``, ``cuda:1``, ..."""

    name = "cuda"
    auto_priority = 20

    def available(self) -> bool:
        """A CUDA (not HIP) build of PyTorch that sees at least one GPU. Said without
        importing torch when its build has no CUDA, or (on Linux) no NVIDIA device node
        exists (``/dev/nvidiactl``, ``/dev/nvidia<N>``, WSL's ``/dev/dxg``)."""
        if "torch" not in sys.modules:
            build = torch_build()
            if build is None or build.get("cuda") is None or build.get("hip") is not None:
                return False
            if not device_nodes("/dev/nvidiactl", "/dev/nvidia[0-9]*", "/dev/dxg"):
                return False
        import torch

        try:
            return torch.version.hip is None and bool(torch.cuda.is_available())
        except Exception:
            return False

    def devices(self) -> list[DeviceInfo]:
        """Every visible GPU, with memory from ``cudaMemGetInfo`` and its compute capability."""
        import torch

        if not self.available():
            return []
        return torch_devices("cuda", torch.cuda, _capabilities)

    def torch_device(self, index: int | None) -> torch.device:
        """``torch.device("cuda", index)``."""
        import torch

        return torch.device("cuda", index or 0)

    def synchronize(self, index: int | None) -> None:
        """Wait for the GPU's queued kernels."""
        import torch

        torch.cuda.synchronize(index or 0)

    def hardware_keys(self, device: DeviceInfo) -> list[str]:
        """``cuda:sm_90`` then ``cuda``."""
        return [f"cuda:{device.capabilities['sm']}", "cuda"]

    def weight_format_refusal(self, device: DeviceInfo, weight_format: str) -> str | None:
        """FP8 from compute capability 8.9 (Ada, Hopper); NVFP4 on 10.x and 12.x
        (Blackwell) with a PyTorch that has FP4 tensors and Triton installed."""
        import torch

        capability = str(device.capabilities.get("compute_capability", "0.0"))
        major, _, minor = capability.partition(".")
        version = (int(major), int(minor or 0))
        if weight_format == "fp8":
            return None if version >= FP8_MIN_CAPABILITY else f"compute capability {capability}"
        if weight_format == "nvfp4":
            if version[0] not in NVFP4_MAJORS:
                return f"compute capability {capability} has no FP4 tensor cores"
            if not hasattr(torch, "float4_e2m1fn_x2"):
                return f"PyTorch {torch.__version__} has no FP4 tensors"
            if importlib.util.find_spec("triton") is None:
                return "Triton is missing"
            return None
        return super().weight_format_refusal(device, weight_format)

    def onnx_providers(self, device: DeviceInfo) -> list[ExecutionProvider]:
        """CUDA on this GPU, then the CPU for operators CUDA lacks."""
        return [
            ("CUDAExecutionProvider", {"device_id": device.index or 0}),
            ("CPUExecutionProvider", {}),
        ]


def _capabilities(props: Any, name: str) -> dict[str, Any]:
    import torch

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
