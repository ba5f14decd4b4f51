"""The ``xpu`` accelerator: Intel GPUs through PyTorch's ``torch.xpu`` backend.

Used only when named (``--device xpu[:N]``). Golden reference keys are
``xpu:<device name slug>`` then ``xpu``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm_srun.plugins import (
    Accelerator,
    DeviceInfo,
    ExecutionProvider,
    hookimpl,
    slug,
    torch_devices,
)
from vllm_srun.plugins.hookspecs import RegisterAccelerator

if TYPE_CHECKING:
    import torch


class XpuAccelerator(Accelerator):
    """Intel GPUs; devices ``xpu:0``, ``xpu:1``, ..."""

    name = "xpu"
    auto_priority = None

    def available(self) -> bool:
        """A PyTorch build with ``torch.xpu`` that sees at least one device."""
        import torch

        backend = getattr(torch, "xpu", None)
        try:
            return backend is not None and bool(backend.is_available())
        except Exception:
            return False

    def devices(self) -> list[DeviceInfo]:
        """Every visible Intel GPU, with its memory."""
        import torch

        if not self.available():
            return []
        return torch_devices("xpu", torch.xpu, _capabilities)

    def torch_device(self, index: int | None) -> torch.device:
        """``torch.device("xpu", index)``."""
        import torch

        return torch.device("xpu", index or 0)

    def synchronize(self, index: int | None) -> None:
        """Wait for the device's queued kernels."""
        import torch

        torch.xpu.synchronize(index or 0)

    def hardware_keys(self, device: DeviceInfo) -> list[str]:
        """``xpu:intel_data_center_gpu_max_1550`` then ``xpu``."""
        return [f"xpu:{device.capabilities['device_key']}", "xpu"]

    def onnx_providers(self, device: DeviceInfo) -> list[ExecutionProvider]:
        """OpenVINO on this GPU, then the CPU."""
        return [
            ("OpenVINOExecutionProvider", {"device_type": f"GPU.{device.index or 0}"}),
            ("CPUExecutionProvider", {}),
        ]


def _capabilities(props: Any, name: str) -> dict[str, Any]:
    return {
        "device_key": slug(name),
        "bf16": "bf16_native"
        if getattr(props, "has_bfloat16_conversions", False)
        else "bf16_emulated",
        "fp64": bool(getattr(props, "has_fp64", False)),
        "driver_version": str(getattr(props, "driver_version", "")),
    }


@hookimpl
def register_accelerators(register: RegisterAccelerator) -> None:
    """Register the ``xpu`` accelerator."""
    register(XpuAccelerator())
