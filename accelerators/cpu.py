"""The ``cpu`` accelerator: always available, the last resort of ``--device auto``.

Golden reference keys are ``cpu:<arch>:<isa>:<bf16>`` then ``cpu``, where
``isa`` is the vector ISA PyTorch's dispatcher selects
(``torch.backends.cpu.get_cpu_capability()``, lower-cased) and ``bf16`` is
``bf16_native`` when the CPU has AVX512-BF16 or AMX tiles, else
``bf16_emulated``: those decide how matmuls round.

A model on ONNX Runtime never imports torch, so on x86-64 Linux, while torch is not
imported, both are read from the CPU flags the kernel lists in ``/proc/cpuinfo``, the
way PyTorch's dispatcher (``aten/src/ATen/native/DispatchStub.cpp``) and
``torch.cpu`` read them through cpuinfo:

- ``ATEN_CPU_CAPABILITY`` set to ``avx512``, ``avx2`` or ``default`` wins (any other
  value is ignored, as PyTorch ignores it with a warning);
- ``avx512``: flags ``avx512vl``, ``avx512bw``, ``avx512dq`` and ``fma`` (AVX512 kernels);
- ``avx2``: flags ``avx2`` and ``fma``;
- ``default`` otherwise;
- ``bf16_native``: flag ``avx512_bf16`` (``torch.cpu._is_avx512_bf16_supported``) or
  ``amx_tile`` (``torch.cpu._is_amx_tile_supported``); else ``bf16_emulated``.

Elsewhere (another architecture, no ``/proc/cpuinfo``), or once torch is imported,
torch answers. ``tests/accelerators/test_cpu.py`` checks the two agree on the
machine it runs on. The facts only torch knows (``lapack``, ``mkldnn``, ``threads``)
are listed only when torch is already imported.
"""

from __future__ import annotations

import os
import platform
import sys
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


_CPUINFO = Path("/proc/cpuinfo")

ISA_FLAGS = (
    ("AVX512", frozenset({"avx512vl", "avx512bw", "avx512dq", "fma"})),
    ("AVX2", frozenset({"avx2", "fma"})),
)
"""PyTorch's x86 CPU capabilities, most capable first, with the ``/proc/cpuinfo`` flags
each needs (the cpuinfo tests of ``compute_cpu_capability``)."""

ISA_OVERRIDES = {"avx512": "AVX512", "avx2": "AVX2", "default": "DEFAULT"}
"""``ATEN_CPU_CAPABILITY`` values an x86 PyTorch honours, and the capability each selects."""

BF16_FLAGS = {"_is_avx512_bf16_supported": "avx512_bf16", "_is_amx_tile_supported": "amx_tile"}
"""``torch.cpu`` probe -> the ``/proc/cpuinfo`` flag it reads."""


def x86_flags(cpuinfo: Path | None = None) -> frozenset[str] | None:
    """The CPU flags of ``/proc/cpuinfo`` (its first ``flags`` line) on x86-64 Linux, or
    ``None`` elsewhere or when the file cannot be read (torch then answers)."""
    if machine_arch() != "x86_64":
        return None
    try:
        with (cpuinfo or _CPUINFO).open(encoding="utf-8", errors="replace") as lines:
            for line in lines:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def isa_from_flags(flags: frozenset[str], override: str | None = None) -> str:
    """PyTorch's CPU capability (``AVX512``, ``AVX2``, ``DEFAULT``) on an x86 CPU with
    ``flags``, under ``ATEN_CPU_CAPABILITY`` ``override`` (see the module's rules)."""
    if override in ISA_OVERRIDES:
        return ISA_OVERRIDES[override]
    for isa, needed in ISA_FLAGS:
        if needed <= flags:
            return isa
    return "DEFAULT"


def cpu_capability() -> str:
    """``torch.backends.cpu.get_cpu_capability()``: read from the CPU flags while torch is
    not imported on x86-64 Linux (the module's rules), else from torch."""
    flags = x86_flags() if "torch" not in sys.modules else None
    if flags is not None:
        return isa_from_flags(flags, os.environ.get("ATEN_CPU_CAPABILITY"))
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


def _cpu_flag(name: str) -> bool:
    """A ``torch.cpu`` probe (:data:`BF16_FLAGS`): the CPU flag while torch is not imported
    on x86-64 Linux, else torch's answer (``False`` when it has no such probe or it
    raises)."""
    flags = x86_flags() if "torch" not in sys.modules else None
    if flags is not None:
        return BF16_FLAGS[name] in flags
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
        """arch, isa, bf16, amx, cores; and, when torch is already imported, lapack
        (PyTorch built with LAPACK), mkldnn and threads (``torch.get_num_threads()``)."""
        found: dict[str, Any] = {
            "arch": machine_arch(),
            "isa": cpu_capability().lower(),
            "bf16": bf16_support(),
            "amx": _cpu_flag("_is_amx_tile_supported"),
            "cores": os.cpu_count(),
        }
        torch = sys.modules.get("torch")
        if torch is not None:
            found["lapack"] = bool(torch._C.has_lapack)
            found["mkldnn"] = bool(torch.backends.mkldnn.is_available())
            found["threads"] = torch.get_num_threads()
        return found

    def devices(self) -> list[DeviceInfo]:
        """The one CPU device, ``cpu``."""
        total, free = memory()
        return [DeviceInfo("cpu", None, _cpu_name(), total, free, self.capabilities())]

    def torch_device(self, index: int | None) -> torch.device:
        """``torch.device("cpu")``; an index is ignored (there is one CPU device)."""
        import torch

        return torch.device("cpu")

    def host_memory(self, device: DeviceInfo) -> bool:
        """``True``: the CPU computes in host memory (said without importing torch)."""
        return True

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
