"""The ``rocm`` accelerator with a HIP build of ``torch.cuda`` faked: an MI300X (gfx942)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_srun.accelerators import cuda as cuda_mod
from vllm_srun.accelerators import rocm as rocm_mod
from vllm_srun.plugins.testing import check_plugin

GIB = 1024**3
HIP = "6.2.41133-dd7f95766"


def _props(arch, name="AMD Instinct MI300X", total=192 * GIB, cus=304):
    return SimpleNamespace(
        name=name,
        total_memory=total,
        major=9,
        minor=4,
        multi_processor_count=cus,
        gcnArchName=arch,
    )


MI300X = _props("gfx942:sramecc+:xnack-")
MI50 = _props("gfx906:sramecc+:xnack-", name="AMD Instinct MI50", total=32 * GIB, cus=60)


def _raise(*_args):
    raise RuntimeError("HIP error: no ROCm-capable device is detected")


@pytest.fixture
def fake_rocm(monkeypatch):
    """Install a fake ROCm build; returns a function taking the device properties."""

    def install(props=(MI300X, MI50), *, hip=HIP, available=True, mem_get_info=None):
        props = list(props)
        monkeypatch.setattr(torch.version, "hip", hip)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(props))
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])
        default = lambda i: (props[i].total_memory // 2, props[i].total_memory)  # noqa: E731
        monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info or default)

    return install


def test_auto_priority():
    assert rocm_mod.RocmAccelerator.name == "rocm"
    assert rocm_mod.RocmAccelerator.auto_priority == 10


def test_hip_build_claims_gpus_and_cuda_does_not(fake_rocm):
    fake_rocm()
    assert rocm_mod.RocmAccelerator().available() is True
    assert cuda_mod.CudaAccelerator().available() is False
    assert cuda_mod.CudaAccelerator().devices() == []


def test_cuda_build_is_left_to_cuda(fake_rocm):
    fake_rocm(hip=None)
    acc = rocm_mod.RocmAccelerator()
    assert acc.available() is False
    assert acc.devices() == []
    assert cuda_mod.CudaAccelerator().available() is True


def test_no_gpu_is_unavailable(fake_rocm):
    fake_rocm(available=False)
    acc = rocm_mod.RocmAccelerator()
    assert acc.available() is False
    assert acc.devices() == []


def test_raising_probe_is_unavailable(fake_rocm, monkeypatch):
    fake_rocm()
    monkeypatch.setattr(torch.cuda, "is_available", _raise)
    acc = rocm_mod.RocmAccelerator()
    assert acc.available() is False
    assert acc.devices() == []


def test_devices_enumerated(fake_rocm):
    fake_rocm()
    devices = rocm_mod.RocmAccelerator().devices()
    assert [d.device for d in devices] == ["rocm:0", "rocm:1"]
    assert [d.name for d in devices] == ["AMD Instinct MI300X", "AMD Instinct MI50"]
    assert [(d.total_memory_bytes, d.free_memory_bytes) for d in devices] == [
        (192 * GIB, 96 * GIB),
        (32 * GIB, 16 * GIB),
    ]
    assert dict(devices[0].capabilities) == {
        "gfx_arch": "gfx942",
        "bf16": "bf16_native",
        "compute_units": 304,
        "hip_version": HIP,
    }


def test_mi300x_keys_device_and_providers(fake_rocm):
    fake_rocm()
    acc = rocm_mod.RocmAccelerator()
    device = acc.devices()[0]
    assert device.device == "rocm:0"
    assert device.accelerator == "rocm"
    assert acc.reference_keys(device) == ["rocm:gfx942", "rocm"]
    assert acc.reference_keys(device, "float16") == ["rocm:gfx942@float16", "rocm@float16"]
    assert acc.torch_device(0) == torch.device("cuda", 0)
    assert acc.torch_device(None) == torch.device("cuda", 0)
    assert acc.onnx_providers(device) == [
        ("MIGraphXExecutionProvider", {"device_id": 0}),
        ("ROCMExecutionProvider", {"device_id": 0}),
        ("CPUExecutionProvider", {}),
    ]


def test_second_device_mappings(fake_rocm):
    fake_rocm()
    acc = rocm_mod.RocmAccelerator()
    device = acc.devices()[1]
    assert device.device == "rocm:1"
    assert acc.reference_keys(device) == ["rocm:gfx906", "rocm"]
    assert acc.torch_device(1) == torch.device("cuda", 1)
    assert acc.onnx_providers(device)[0] == ("MIGraphXExecutionProvider", {"device_id": 1})
    assert acc.onnx_providers(device)[1] == ("ROCMExecutionProvider", {"device_id": 1})


@pytest.mark.parametrize(
    ("raw", "arch", "bf16"),
    [
        ("gfx906:sramecc+:xnack-", "gfx906", "bf16_emulated"),
        ("gfx90a:sramecc+:xnack-", "gfx90a", "bf16_native"),
        ("gfx942:sramecc+:xnack-", "gfx942", "bf16_native"),
        ("gfx1100", "gfx1100", "bf16_native"),
        ("", "unknown", "bf16_emulated"),
    ],
)
def test_bf16_by_gfx_arch(fake_rocm, raw, arch, bf16):
    fake_rocm([_props(raw)])
    (device,) = rocm_mod.RocmAccelerator().devices()
    assert device.capabilities["gfx_arch"] == arch
    assert device.capabilities["bf16"] == bf16


def test_gfx_arch_without_attribute():
    assert rocm_mod.gfx_arch(SimpleNamespace()) == "unknown"
    assert rocm_mod.gfx_arch(SimpleNamespace(gcnArchName=None)) == "unknown"


def test_mem_get_info_failure_falls_back_to_properties(fake_rocm):
    fake_rocm(mem_get_info=_raise)
    devices = rocm_mod.RocmAccelerator().devices()
    assert [(d.total_memory_bytes, d.free_memory_bytes) for d in devices] == [
        (192 * GIB, None),
        (32 * GIB, None),
    ]


def test_synchronize_targets_device(fake_rocm, monkeypatch):
    fake_rocm()
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", calls.append)
    acc = rocm_mod.RocmAccelerator()
    acc.synchronize(1)
    acc.synchronize(None)
    assert calls == [1, 0]


def test_conforms_with_faked_gpus(fake_rocm):
    fake_rocm()
    report = check_plugin(rocm_mod)
    assert report.ok, report.to_text()
    assert any(f.check == "accelerator rocm: rocm:1 reference_keys" for f in report.findings)


def test_conforms_when_unavailable(fake_rocm):
    fake_rocm(hip=None)
    report = check_plugin(rocm_mod)
    assert report.ok, report.to_text()
