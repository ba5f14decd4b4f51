"""The ``host`` accelerator: this machine's CPU under a name and key prefix of its own.

It shows everything an accelerator plugin does, with nothing but
``vllm_srun.plugins`` and torch imported: probe availability without raising,
enumerate devices with memory and capabilities, map a device to torch and to
ONNX Runtime, and name golden reference keys most specific first.
"""

from __future__ import annotations

import os
import platform
from typing import Any

import torch

from vllm_srun.plugins import Accelerator, DeviceInfo, ExecutionProvider, hookimpl
from vllm_srun.plugins.hookspecs import RegisterAccelerator


def _memory() -> tuple[int | None, int | None]:
    """``(total, free)`` bytes from sysconf; ``None`` where the platform has no such name."""
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        return page * os.sysconf("SC_PHYS_PAGES"), page * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None, None


class HostAccelerator(Accelerator):
    """The CPU as device ``host``; never chosen by ``--device auto``."""

    name = "host"
    auto_priority = None
    golden_tolerance = 1e-5  # the CPU underneath is deterministic

    def available(self) -> bool:
        """The CPU is always there."""
        return True

    def devices(self) -> list[DeviceInfo]:
        """One device, ``host``."""
        total, free = _memory()
        capabilities: dict[str, Any] = {
            "arch": platform.machine().lower() or "unknown",
            "threads": torch.get_num_threads(),
        }
        return [DeviceInfo("host", None, "host CPU", total, free, capabilities)]

    def torch_device(self, index: int | None) -> torch.device:
        """Tensors live on the CPU."""
        return torch.device("cpu")

    def hardware_keys(self, device: DeviceInfo) -> list[str]:
        """``host:<arch>:<threads>t`` then ``host``."""
        caps = device.capabilities
        return [f"host:{caps['arch']}:{caps['threads']}t", "host"]

    def onnx_providers(self, device: DeviceInfo) -> list[ExecutionProvider]:
        """ONNX Runtime's CPU provider."""
        return [("CPUExecutionProvider", {})]


@hookimpl
def register_accelerators(register: RegisterAccelerator) -> None:
    """Add the ``host`` accelerator."""
    register(HostAccelerator())
