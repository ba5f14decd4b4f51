"""The ``cpu`` accelerator: capabilities, golden keys and cgroup-bounded memory, probes faked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from vllm_srun.accelerators import cpu as cpu_mod
from vllm_srun.plugins import DeviceInfo
from vllm_srun.plugins.testing import check_plugin

GIB = 1024**3
MIB = 1024**2


def _fake_cpu(monkeypatch, *, machine="x86_64", isa="AVX512", avx512_bf16=False, amx=False):
    monkeypatch.setattr(cpu_mod.platform, "machine", lambda: machine)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: isa)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)


def _fake_host_memory(monkeypatch, total, available):
    vm = SimpleNamespace(total=total, available=available)
    monkeypatch.setattr(cpu_mod.psutil, "virtual_memory", lambda: vm)


def _cgroup(monkeypatch, tmp_path, limit, current):
    (tmp_path / "memory.max").write_text(f"{limit}\n")
    (tmp_path / "memory.current").write_text(f"{current}\n")
    monkeypatch.setattr(cpu_mod, "_CGROUP_ROOT", tmp_path)


def test_always_available_and_last_in_auto():
    acc = cpu_mod.CpuAccelerator()
    assert acc.name == "cpu"
    assert acc.available() is True
    assert cpu_mod.CpuAccelerator.auto_priority == 1000


def test_avx512_bf16_x86_64_key(monkeypatch):
    _fake_cpu(monkeypatch, machine="x86_64", isa="AVX512", avx512_bf16=True, amx=False)
    acc = cpu_mod.CpuAccelerator()
    (device,) = acc.devices()
    caps = device.capabilities
    assert (caps["arch"], caps["isa"], caps["bf16"], caps["amx"]) == (
        "x86_64",
        "avx512",
        "bf16_native",
        False,
    )
    assert acc.reference_keys(device) == ["cpu:x86_64:avx512:bf16_native", "cpu"]
    assert acc.reference_keys(device, "bfloat16") == [
        "cpu:x86_64:avx512:bf16_native@bfloat16",
        "cpu@bfloat16",
    ]


def test_avx2_without_bf16_is_emulated(monkeypatch):
    _fake_cpu(monkeypatch, machine="x86_64", isa="AVX2", avx512_bf16=False, amx=False)
    acc = cpu_mod.CpuAccelerator()
    (device,) = acc.devices()
    assert acc.reference_keys(device) == ["cpu:x86_64:avx2:bf16_emulated", "cpu"]


def test_amx_alone_is_native(monkeypatch):
    _fake_cpu(monkeypatch, machine="x86_64", isa="AVX512", avx512_bf16=False, amx=True)
    caps = cpu_mod.CpuAccelerator().capabilities()
    assert caps["bf16"] == "bf16_native"
    assert caps["amx"] is True


def test_raising_or_missing_bf16_probe_means_emulated(monkeypatch):
    def boom():
        raise RuntimeError("no cpuinfo")

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", boom, raising=False)
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported", raising=False)
    assert cpu_mod.bf16_support() == "bf16_emulated"
    assert cpu_mod.CpuAccelerator().capabilities()["amx"] is False


@pytest.mark.parametrize(
    ("raw", "arch"),
    [
        ("arm64", "aarch64"),
        ("AMD64", "x86_64"),
        ("x64", "x86_64"),
        ("aarch64", "aarch64"),
        ("", "unknown"),
    ],
)
def test_machine_arch_normalised(monkeypatch, raw, arch):
    monkeypatch.setattr(cpu_mod.platform, "machine", lambda: raw)
    assert cpu_mod.machine_arch() == arch


def test_arm64_key(monkeypatch):
    _fake_cpu(monkeypatch, machine="arm64", isa="SVE256", avx512_bf16=False, amx=False)
    acc = cpu_mod.CpuAccelerator()
    (device,) = acc.devices()
    assert acc.reference_keys(device) == ["cpu:aarch64:sve256:bf16_emulated", "cpu"]


@pytest.mark.parametrize("has_lapack", [True, False])
def test_lapack_reflects_torch_build(monkeypatch, has_lapack):
    monkeypatch.setattr(torch._C, "has_lapack", has_lapack)
    assert cpu_mod.CpuAccelerator().capabilities()["lapack"] is has_lapack


def test_real_machine_keys():
    acc = cpu_mod.CpuAccelerator()
    devices = acc.devices()
    assert len(devices) == 1
    keys = acc.reference_keys(devices[0])
    assert len(keys) == 2
    assert keys[0].startswith("cpu:")
    assert len(keys[0].split(":")) == 4
    assert keys[0].split(":")[3] in ("bf16_native", "bf16_emulated")
    assert keys[1] == "cpu"


def test_device_info_and_mappings(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_mod, "_CGROUP_ROOT", tmp_path / "absent")
    _fake_host_memory(monkeypatch, 64 * GIB, 40 * GIB)
    acc = cpu_mod.CpuAccelerator()
    (device,) = acc.devices()
    assert isinstance(device, DeviceInfo)
    assert device.accelerator == "cpu"
    assert device.index is None
    assert device.device == "cpu"
    assert isinstance(device.name, str) and device.name
    assert (device.total_memory_bytes, device.free_memory_bytes) == (64 * GIB, 40 * GIB)
    assert acc.torch_device(None) == torch.device("cpu")
    assert acc.torch_device(3) == torch.device("cpu")
    assert acc.onnx_providers(device) == [("CPUExecutionProvider", {})]


def test_unknown_dtype_rejected():
    acc = cpu_mod.CpuAccelerator()
    (device,) = acc.devices()
    with pytest.raises(ValueError, match="unknown dtype"):
        acc.reference_keys(device, "int8")


def test_cgroup_limit_bounds_memory(monkeypatch, tmp_path):
    _fake_host_memory(monkeypatch, 64 * GIB, 40 * GIB)
    _cgroup(monkeypatch, tmp_path, 1 * GIB, 256 * MIB)
    assert cpu_mod._cgroup_memory() == (1 * GIB, 256 * MIB)
    assert cpu_mod.memory() == (1 * GIB, 768 * MIB)
    (device,) = cpu_mod.CpuAccelerator().devices()
    assert (device.total_memory_bytes, device.free_memory_bytes) == (1 * GIB, 768 * MIB)


def test_cgroup_free_never_exceeds_host_free(monkeypatch, tmp_path):
    _fake_host_memory(monkeypatch, 64 * GIB, 100 * MIB)
    _cgroup(monkeypatch, tmp_path, 1 * GIB, 256 * MIB)
    assert cpu_mod.memory() == (1 * GIB, 100 * MIB)


def test_cgroup_usage_over_limit_gives_zero_free(monkeypatch, tmp_path):
    _fake_host_memory(monkeypatch, 64 * GIB, 40 * GIB)
    _cgroup(monkeypatch, tmp_path, 1 * GIB, 2 * GIB)
    assert cpu_mod.memory() == (1 * GIB, 0)


def test_cgroup_max_means_unlimited(monkeypatch, tmp_path):
    _fake_host_memory(monkeypatch, 64 * GIB, 40 * GIB)
    _cgroup(monkeypatch, tmp_path, "max", 256 * MIB)
    assert cpu_mod._cgroup_memory() == (None, 256 * MIB)
    assert cpu_mod.memory() == (64 * GIB, 40 * GIB)


def test_cgroup_limit_above_host_is_ignored(monkeypatch, tmp_path):
    _fake_host_memory(monkeypatch, 64 * GIB, 40 * GIB)
    _cgroup(monkeypatch, tmp_path, 128 * GIB, 256 * MIB)
    assert cpu_mod.memory() == (64 * GIB, 40 * GIB)


def test_no_cgroup_files_means_host_memory(monkeypatch, tmp_path):
    _fake_host_memory(monkeypatch, 64 * GIB, 40 * GIB)
    monkeypatch.setattr(cpu_mod, "_CGROUP_ROOT", tmp_path)
    assert cpu_mod._cgroup_memory() == (None, None)
    assert cpu_mod.memory() == (64 * GIB, 40 * GIB)


def test_malformed_cgroup_files_mean_host_memory(monkeypatch, tmp_path):
    _fake_host_memory(monkeypatch, 64 * GIB, 40 * GIB)
    _cgroup(monkeypatch, tmp_path, "1G", "lots")
    assert cpu_mod._cgroup_memory() == (None, None)
    assert cpu_mod.memory() == (64 * GIB, 40 * GIB)


def test_conforms():
    report = check_plugin(cpu_mod)
    assert report.ok, report.to_text()


def test_conforms_with_faked_avx512_bf16(monkeypatch):
    _fake_cpu(monkeypatch, machine="x86_64", isa="AVX512", avx512_bf16=True)
    report = check_plugin(cpu_mod)
    assert report.ok, report.to_text()


# -- the capabilities without torch ----------------------------------------------------------

CAPABILITIES = """
import json, sys
from vllm_srun.accelerators.cpu import CpuAccelerator
acc = CpuAccelerator()
(device,) = acc.devices()
print(json.dumps({"caps": device.capabilities, "keys": acc.hardware_keys(device),
                  "torch": "torch" in sys.modules}))
"""
TORCH_CAPABILITY = "import torch; print(torch.backends.cpu.get_cpu_capability())"


def _run(code: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**environ, **env},
    )
    return done.stdout.strip().splitlines()[-1]


needs_flags = pytest.mark.skipif(
    cpu_mod.x86_flags() is None,
    reason="the capabilities are read from /proc/cpuinfo on x86-64 Linux only",
)


@needs_flags
def test_without_torch_the_flags_give_torch_s_capabilities_and_keys():
    """A process that never imports torch names this machine as torch does: the same ISA,
    bf16 class and AMX, so the same golden reference key; torch-only facts are left out."""
    found = json.loads(_run(CAPABILITIES))
    assert found["torch"] is False
    caps = found["caps"]
    assert set(caps) == {"arch", "isa", "bf16", "amx", "cores"}
    assert caps["isa"] == str(torch.backends.cpu.get_cpu_capability()).lower()
    amx = bool(torch.cpu._is_amx_tile_supported())
    native = bool(torch.cpu._is_avx512_bf16_supported()) or amx
    assert caps["bf16"] == ("bf16_native" if native else "bf16_emulated")
    assert caps["amx"] is amx
    acc = cpu_mod.CpuAccelerator()
    (with_torch,) = acc.devices()
    assert "lapack" in with_torch.capabilities and "threads" in with_torch.capabilities
    assert found["keys"] == acc.hardware_keys(with_torch)


@needs_flags
@pytest.mark.parametrize("override", ["default", "avx2", "avx512", "AVX2", "sve256", "bogus"])
def test_aten_cpu_capability_is_read_as_torch_reads_it(override):
    """torch honours ATEN_CPU_CAPABILITY's x86 values (lower case) and ignores the others."""
    without = json.loads(_run(CAPABILITIES, ATEN_CPU_CAPABILITY=override))["caps"]["isa"]
    assert without == _run(TORCH_CAPABILITY, ATEN_CPU_CAPABILITY=override).lower()


AVX512 = frozenset({"avx512f", "avx512vl", "avx512bw", "avx512dq", "fma", "avx2", "avx"})


@pytest.mark.parametrize(
    ("flags", "isa"),
    [
        (AVX512, "AVX512"),
        (AVX512 - {"avx512dq"}, "AVX2"),  # AVX512 kernels need VL, BW and DQ
        (AVX512 - {"fma"}, "DEFAULT"),  # both need FMA
        (frozenset({"avx2", "fma", "avx"}), "AVX2"),
        (frozenset({"avx2"}), "DEFAULT"),
        (frozenset(), "DEFAULT"),
    ],
)
def test_the_flag_rules(flags, isa):
    assert cpu_mod.isa_from_flags(flags) == isa
    assert cpu_mod.isa_from_flags(flags, "default") == "DEFAULT"
    assert cpu_mod.isa_from_flags(flags, "zvector") == isa


def test_bf16_and_amx_come_from_their_flags_without_torch(monkeypatch, tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fma avx2 amx_tile\n")
    monkeypatch.setattr(cpu_mod, "_CPUINFO", cpuinfo)
    monkeypatch.setattr(cpu_mod.platform, "machine", lambda: "x86_64")
    monkeypatch.delitem(sys.modules, "torch")  # as in a process that never imported it
    caps = cpu_mod.CpuAccelerator().capabilities()
    assert (caps["isa"], caps["bf16"], caps["amx"]) == ("avx2", "bf16_native", True)
    assert "lapack" not in caps and "threads" not in caps
    cpuinfo.write_text("flags\t\t: fma avx2 avx512_bf16\n")
    assert cpu_mod.bf16_support() == "bf16_native"
    cpuinfo.write_text("flags\t\t: fma avx2\n")
    assert cpu_mod.bf16_support() == "bf16_emulated"


def test_the_cpu_computes_in_host_memory_without_torch():
    acc = cpu_mod.CpuAccelerator()
    (device,) = acc.devices()
    assert acc.host_memory(device) is True
