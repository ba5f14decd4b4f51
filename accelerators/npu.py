"""The ``npu`` accelerator: Huawei Ascend NPUs through the ``torch_npu`` extension.

Available only when ``torch_npu`` imports (it registers ``torch.npu``); used
only when named (``--device npu[:N]``). Golden reference keys are
``npu:<SoC name slug>`` (``npu:ascend910b2``) then ``npu``.
"""

from __future__ import annotations

import importlib
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


def _backend() -> Any:
    """``torch.npu`` once ``torch_npu`` has imported, else ``None``."""
    import torch

    try:
        importlib.import_module("torch_npu")
    except Exception:
        return None
    return getattr(torch, "npu", None)


class NpuAccelerator(Accelerator):
    """Ascend NPUs; devices ``npu:0``, ``npu:1``, ..."""

    name = "npu"
    auto_priority = None

    def available(self) -> bool:
        """``torch_npu`` imports and sees at least one NPU."""
        backend = _backend()
        try:
            return backend is not None and bool(backend.is_available())
        except Exception:
            return False

    def devices(self) -> list[DeviceInfo]:
        """Every visible NPU, with its memory and SoC name."""
        backend = _backend()
        if backend is None or not self.available():
            return []
        return torch_devices(
            "npu",
            backend,
            lambda props, name: {"soc": slug(name), "bf16": "bf16_native"},
            name=lambda index, props: str(backend.get_device_name(index)),
            optional_properties=True,
        )

    def torch_device(self, index: int | None) -> torch.device:
        """``torch.device("npu", index)`` (the device type ``torch_npu`` registers)."""
        import torch

        return torch.device("npu", index or 0)

    def synchronize(self, index: int | None) -> None:
        """Wait for the NPU's queued work."""
        backend = _backend()
        if backend is not None:
            backend.synchronize(index or 0)

    def hardware_keys(self, device: DeviceInfo) -> list[str]:
        """``npu:ascend910b2`` then ``npu``."""
        return [f"npu:{device.capabilities['soc']}", "npu"]

    def onnx_providers(self, device: DeviceInfo) -> list[ExecutionProvider]:
        """CANN on this NPU, then the CPU."""
        return [
            ("CANNExecutionProvider", {"device_id": device.index or 0}),
            ("CPUExecutionProvider", {}),
        ]


@hookimpl
def register_accelerators(register: RegisterAccelerator) -> None:
    """Register the ``npu`` accelerator."""
    register(NpuAccelerator())
