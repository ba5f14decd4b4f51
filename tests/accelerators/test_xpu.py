"""The ``xpu`` accelerator with ``torch.xpu`` faked: two Intel Data Center GPU Max 1550 tiles."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_srun.accelerators import xpu as xpu_mod
from vllm_srun.plugins.testing import check_plugin

GIB = 1024**3
MAX_1550 = SimpleNamespace(
    name="Intel(R) Data Center GPU Max 1550",
    total_memory=64 * GIB,
    has_bfloat16_conversions=True,
    has_fp64=True,
    driver_version="1.3.29735",
)
ARC = SimpleNamespace(name="Intel(R) Arc(TM) A770 Graphics", total_memory=16 * GIB)
MEM = {0: (60 * GIB, 64 * GIB), 1: (12 * GIB, 16 * GIB)}


def _raise(*_args):
    raise RuntimeError("level zero: no device")


@pytest.fixture
def fake_xpu(monkeypatch):
    """Install a fake ``torch.xpu``; returns a function taking the device properties."""

    def install(props=(MAX_1550, ARC), *, available=True, mem_get_info=None):
        props = list(props)
        monkeypatch.setattr(torch.xpu, "is_available", lambda: available)
        monkeypatch.setattr(torch.xpu, "device_count", lambda: len(props))
        monkeypatch.setattr(torch.xpu, "get_device_properties", lambda i: props[i])
        monkeypatch.setattr(torch.xpu, "mem_get_info", mem_get_info or (lambda i: MEM[i]))

    return install


def test_only_when_named():
    assert xpu_mod.XpuAccelerator.name == "xpu"
    assert xpu_mod.XpuAccelerator.auto_priority is None


def test_available_with_devices(fake_xpu):
    fake_xpu()
    assert xpu_mod.XpuAccelerator().available() is True


def test_no_device_is_unavailable(fake_xpu):
    fake_xpu(available=False)
    acc = xpu_mod.XpuAccelerator()
    assert acc.available() is False
    assert acc.devices() == []


def test_raising_probe_is_unavailable(fake_xpu, monkeypatch):
    fake_xpu()
    monkeypatch.setattr(torch.xpu, "is_available", _raise)
    acc = xpu_mod.XpuAccelerator()
    assert acc.available() is False
    assert acc.devices() == []


def test_build_without_torch_xpu_is_unavailable(monkeypatch):
    monkeypatch.delattr(torch, "xpu", raising=False)
    acc = xpu_mod.XpuAccelerator()
    assert acc.available() is False
    assert acc.devices() == []


def test_devices_enumerated(fake_xpu):
    fake_xpu()
    devices = xpu_mod.XpuAccelerator().devices()
    assert [d.device for d in devices] == ["xpu:0", "xpu:1"]
    assert [d.name for d in devices] == [
        "Intel(R) Data Center GPU Max 1550",
        "Intel(R) Arc(TM) A770 Graphics",
    ]
    assert [(d.total_memory_bytes, d.free_memory_bytes) for d in devices] == [
        (64 * GIB, 60 * GIB),
        (16 * GIB, 12 * GIB),
    ]
    assert dict(devices[0].capabilities) == {
        "device_key": "intel_r_data_center_gpu_max_1550",
        "bf16": "bf16_native",
        "fp64": True,
        "driver_version": "1.3.29735",
    }
    assert dict(devices[1].capabilities) == {
        "device_key": "intel_r_arc_tm_a770_graphics",
        "bf16": "bf16_emulated",
        "fp64": False,
        "driver_version": "",
    }


def test_max_1550_keys_device_and_providers(fake_xpu):
    fake_xpu()
    acc = xpu_mod.XpuAccelerator()
    device = acc.devices()[0]
    assert device.device == "xpu:0"
    assert acc.reference_keys(device) == ["xpu:intel_r_data_center_gpu_max_1550", "xpu"]
    assert acc.reference_keys(device, "bfloat16") == [
        "xpu:intel_r_data_center_gpu_max_1550@bfloat16",
        "xpu@bfloat16",
    ]
    assert acc.torch_device(0) == torch.device("xpu", 0)
    assert acc.torch_device(None) == torch.device("xpu", 0)
    assert acc.onnx_providers(device) == [
        ("OpenVINOExecutionProvider", {"device_type": "GPU.0"}),
        ("CPUExecutionProvider", {}),
    ]


def test_second_device_mappings(fake_xpu):
    fake_xpu()
    acc = xpu_mod.XpuAccelerator()
    device = acc.devices()[1]
    assert device.device == "xpu:1"
    assert acc.reference_keys(device) == ["xpu:intel_r_arc_tm_a770_graphics", "xpu"]
    assert acc.torch_device(1) == torch.device("xpu", 1)
    assert acc.onnx_providers(device)[0] == (
        "OpenVINOExecutionProvider",
        {"device_type": "GPU.1"},
    )


def test_mem_get_info_failure_falls_back_to_properties(fake_xpu):
    fake_xpu(mem_get_info=_raise)
    devices = xpu_mod.XpuAccelerator().devices()
    assert [(d.total_memory_bytes, d.free_memory_bytes) for d in devices] == [
        (64 * GIB, None),
        (16 * GIB, None),
    ]


def test_synchronize_targets_device(fake_xpu, monkeypatch):
    fake_xpu()
    calls = []
    monkeypatch.setattr(torch.xpu, "synchronize", calls.append)
    acc = xpu_mod.XpuAccelerator()
    acc.synchronize(1)
    acc.synchronize(None)
    assert calls == [1, 0]


def test_conforms_with_faked_devices(fake_xpu):
    fake_xpu()
    report = check_plugin(xpu_mod)
    assert report.ok, report.to_text()
    assert any(f.check == "accelerator xpu: xpu:1 onnx_providers" for f in report.findings)


def test_conforms_when_unavailable(fake_xpu):
    fake_xpu(available=False)
    report = check_plugin(xpu_mod)
    assert report.ok, report.to_text()
