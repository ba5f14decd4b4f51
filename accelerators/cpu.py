"""The ``cpu`` accelerator: always available, the last resort of ``--device auto``.

Golden reference keys are ``cpu:<arch>:<isa>:<bf16>`` then ``cpu``, where
``isa`` is the vector ISA PyTorch's dispatcher selected
(``torch.backends.cpu.get_cpu_capability()``, lower-cased) and ``bf16`` is
``bf16_native`` when the CPU has AVX512-BF16 or AMX tiles, else
``bf16_emulated``: those decide how matmuls round.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from vllm_srun.plugins import Accelerator, DeviceInfo, ExecutionProvider, hookimpl
from vllm_srun.plugins.hookspecs import RegisterAccelerator

if TYPE_CHECKING:
    import torch

_ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}
_CGROUP_ROOT = Path("/sys/fs/cgroup")


def machine_arch() -> str:
    """The CPU architecture as the kernel names it, normalised (``x86_64``, ``aarch64``)."""
    arch = platform.machine().lower() or "unknown"
    return _ARCH_ALIASES.get(arch, arch)


def _cpu_flag(name: str) -> bool:
    import torch

    probe = getattr(torch.cpu, name, None)
    try:
        return bool(probe()) if probe is not None else False
    except Exception:
        return False


def bf16_support() -> str:
    """``bf16_native`` with AVX512-BF16 or AMX tiles, else ``bf16_emulated``."""
    native = _cpu_flag("_is_avx512_bf16_supported") or _cpu_flag("_is_amx_tile_supported")
    return "bf16_native" if native else "bf16_emulated"


def _cgroup_memory() -> tuple[int | None, int | None]:
    """``(limit, usage)`` in bytes from cgroup v2, or ``None`` where unlimited or absent."""
    try:
        raw = (_CGROUP_ROOT / "memory.max").read_text().strip()
        used = int((_CGROUP_ROOT / "memory.current").read_text().strip())
    except (OSError, ValueError):
        return None, None
    return (None if raw == "max" else int(raw)), used


def memory() -> tuple[int, int]:
    """``(total, free)`` bytes usable by this process.

    Host memory from psutil (free is ``available``: free plus reclaimable
    cache), bounded by the cgroup v2 memory limit when a container sets one.
    """
    vm = psutil.virtual_memory()
    total, free = int(vm.total), int(vm.available)
    limit, used = _cgroup_memory()
    if limit is not None and used is not None and limit < total:
        total, free = limit, max(0, min(free, limit - used))
    return total, free


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or machine_arch()


class CpuAccelerator(Accelerator):
    """The host CPU through PyTorch's CPU backend."""

    name = "cpu"
    auto_priority = 1000
    golden_tolerance = 1e-5
    """A row alone and in a batch differ by about 1e-6 on one machine (DESIGN §6)."""

    def available(self) -> bool:
        """Always ``True``: every PyTorch build runs on the CPU."""
        return True

    def capabilities(self) -> dict[str, Any]:
        """arch, isa, bf16, amx, lapack (PyTorch built with LAPACK), mkldnn, cores, threads."""
        import torch

        return {
            "arch": machine_arch(),
            "isa": str(torch.backends.cpu.get_cpu_capability()).lower(),
            "bf16": bf16_support(),
            "amx": _cpu_flag("_is_amx_tile_supported"),
            "lapack": bool(torch._C.has_lapack),
            "mkldnn": bool(torch.backends.mkldnn.is_available()),  # type: ignore[no-untyped-call]
            "cores": os.cpu_count(),
            "threads": torch.get_num_threads(),
        }

    def devices(self) -> list[DeviceInfo]:
        """The one CPU device, ``cpu``."""
        total, free = memory()
        return [DeviceInfo("cpu", None, _cpu_name(), total, free, self.capabilities())]

    def torch_device(self, index: int | None) -> torch.device:
        """``torch.device("cpu")``; an index is ignored (there is one CPU device)."""
        import torch

        return torch.device("cpu")

    def hardware_keys(self, device: DeviceInfo) -> list[str]:
        """``cpu:<arch>:<isa>:<bf16>`` then ``cpu``."""
        caps = device.capabilities
        return [f"cpu:{caps['arch']}:{caps['isa']}:{caps['bf16']}", "cpu"]

    def weight_format_refusal(self, device: DeviceInfo, weight_format: str) -> str | None:
        """A CPU multiplies neither FP8 nor NVFP4 weights."""
        return "it is a CPU"

    def onnx_providers(self, device: DeviceInfo) -> list[ExecutionProvider]:
        """ONNX Runtime's CPU execution provider."""
        return [("CPUExecutionProvider", {})]


@hookimpl
def register_accelerators(register: RegisterAccelerator) -> None:
    """Register the ``cpu`` accelerator."""
    register(CpuAccelerator())
