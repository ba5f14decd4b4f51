"""The ``rocm`` accelerator: AMD GPUs through PyTorch's ROCm (HIP) build.

HIP builds expose AMD GPUs as ``torch.cuda``; ``torch.version.hip`` tells
them apart. Devices are named ``rocm:N`` and map to ``torch.device("cuda",
N)``. Golden reference keys are ``rocm:<gfx arch>`` then ``rocm``.
"""

from __future__ import annotations

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

BF16_NATIVE_ARCH_PREFIXES = ("gfx90a", "gfx94", "gfx95", "gfx11", "gfx12")
"""gfx architectures with bf16 matrix instructions: CDNA2/3/4 and RDNA3/4 (AMD ISA guides)."""


def gfx_arch(props: Any) -> str:
    """The bare gfx architecture (``gfx942``) from ``gcnArchName`` (``gfx942:sramecc+:xnack-``)."""
    raw = str(getattr(props, "gcnArchName", "") or "")
    return raw.split(":", 1)[0] or "unknown"


FP8_ARCHS = ("gfx942", "gfx950")
"""The Instinct MI300 (gfx942) and MI350 (gfx950) series multiply FP8."""


class RocmAccelerator(Accelerator):
    """AMD GPUs; devices ``rocm:0``, ``rocm:1``, ..."""

    name = "rocm"
    auto_priority = 10

    def available(self) -> bool:
        """A HIP build of PyTorch that sees at least one GPU. Said without importing
        torch when its build has no HIP, or (on Linux) ROCm's ``/dev/kfd`` is absent."""
        if "torch" not in sys.modules:
            build = torch_build()
            if build is None or build.get("hip") is None or not device_nodes("/dev/kfd"):
                return False
        import torch

        try:
            return torch.version.hip is not None and bool(torch.cuda.is_available())
        except Exception:
            return False

    def devices(self) -> list[DeviceInfo]:
        """Every visible GPU, with its memory and gfx architecture."""
        import torch

        if not self.available():
            return []
        return torch_devices("rocm", torch.cuda, _capabilities)

    def torch_device(self, index: int | None) -> torch.device:
        """``torch.device("cuda", index)``: HIP devices keep CUDA's device type."""
        import torch

        return torch.device("cuda", index or 0)

    def synchronize(self, index: int | None) -> None:
        """Wait for the GPU's queued kernels."""
        import torch

        torch.cuda.synchronize(index or 0)

    def hardware_keys(self, device: DeviceInfo) -> list[str]:
        """``rocm:gfx942`` then ``rocm``."""
        return [f"rocm:{device.capabilities['gfx_arch']}", "rocm"]

    def weight_format_refusal(self, device: DeviceInfo, weight_format: str) -> str | None:
        """FP8 on the Instinct MI300 (gfx942) and MI350 (gfx950) series; never NVFP4."""
        arch = str(device.capabilities.get("gfx_arch", "unknown"))
        if weight_format == "fp8" and arch in FP8_ARCHS:
            return None
        if weight_format == "nvfp4":
            return "it is a ROCm GPU"
        return f"{arch} has no FP8 matrix units"

    def onnx_providers(self, device: DeviceInfo) -> list[ExecutionProvider]:
        """MIGraphX, then the older ROCm provider, then the CPU."""
        options = {"device_id": device.index or 0}
        return [
            ("MIGraphXExecutionProvider", dict(options)),
            ("ROCMExecutionProvider", dict(options)),
            ("CPUExecutionProvider", {}),
        ]


def _capabilities(props: Any, name: str) -> dict[str, Any]:
    import torch

    arch = gfx_arch(props)
    return {
        "gfx_arch": arch,
        "bf16": "bf16_native" if arch.startswith(BF16_NATIVE_ARCH_PREFIXES) else "bf16_emulated",
        "compute_units": int(getattr(props, "multi_processor_count", 0)),
        "hip_version": torch.version.hip,
    }


@hookimpl
def register_accelerators(register: RegisterAccelerator) -> None:
    """Register the ``rocm`` accelerator."""
    register(RocmAccelerator())
