"""The ``mps`` accelerator: Apple-silicon GPUs through Metal Performance Shaders.

One unnumbered device, ``mps``; used only when named. Golden reference keys
are ``mps:<chip slug>`` (``mps:apple_m2_pro``) then ``mps``.
"""

from __future__ import annotations

import platform
import subprocess
from typing import TYPE_CHECKING, Any

from vllm_srun.plugins import Accelerator, DeviceInfo, ExecutionProvider, hookimpl, slug
from vllm_srun.plugins.hookspecs import RegisterAccelerator

if TYPE_CHECKING:
    import torch

BF16_MIN_MACOS = 14
"""MPS gained bfloat16 in macOS 14 (Sonoma) (PyTorch MPS backend notes)."""


def chip_name() -> str:
    """The Apple chip (``Apple M2 Pro``) from sysctl, or ``Apple silicon`` when unknown."""
    try:
        out = subprocess.run(
            ["sysctl", "-n", "machdep.cpu.brand_string"],
            capture_output=True,
            text=True,
            timeout=2,
            check=True,
        )
        return out.stdout.strip() or "Apple silicon"
    except (OSError, subprocess.SubprocessError):
        return "Apple silicon"


def _macos_major() -> int:
    release = platform.mac_ver()[0]
    try:
        return int(release.split(".")[0])
    except ValueError:
        return 0


class MpsAccelerator(Accelerator):
    """The Apple GPU of this Mac; device ``mps``."""

    name = "mps"
    auto_priority = None

    def available(self) -> bool:
        """``torch.backends.mps.is_available()``."""
        import torch

        try:
            return bool(torch.backends.mps.is_available())
        except Exception:
            return False

    def devices(self) -> list[DeviceInfo]:
        """The one MPS device; memory is Metal's recommended working set."""
        import torch

        if not self.available():
            return []
        total: int | None = None
        free: int | None = None
        try:
            recommended = int(torch.mps.recommended_max_memory())
            total, free = (
                recommended,
                max(0, recommended - int(torch.mps.driver_allocated_memory())),
            )
        except Exception:
            total = free = None
        chip = chip_name()
        macos = _macos_major()
        capabilities: dict[str, Any] = {
            "chip": slug(chip),
            "macos": macos,
            "bf16": "bf16_native" if macos >= BF16_MIN_MACOS else "bf16_emulated",
        }
        return [DeviceInfo("mps", None, chip, total, free, capabilities)]

    def torch_device(self, index: int | None) -> torch.device:
        """``torch.device("mps")``."""
        import torch

        return torch.device("mps")

    def synchronize(self, index: int | None) -> None:
        """Wait for queued Metal work."""
        import torch

        torch.mps.synchronize()

    def hardware_keys(self, device: DeviceInfo) -> list[str]:
        """``mps:apple_m2_pro`` then ``mps``."""
        return [f"mps:{device.capabilities['chip']}", "mps"]

    def onnx_providers(self, device: DeviceInfo) -> list[ExecutionProvider]:
        """Core ML, then the CPU."""
        return [("CoreMLExecutionProvider", {}), ("CPUExecutionProvider", {})]


@hookimpl
def register_accelerators(register: RegisterAccelerator) -> None:
    """Register the ``mps`` accelerator."""
    register(MpsAccelerator())
