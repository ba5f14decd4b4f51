"""The ``cuda`` accelerator with ``torch.cuda`` faked: a T4 (sm_75) and an H100 (sm_90)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_srun.accelerators import cuda as cuda_mod
from vllm_srun.accelerators import rocm as rocm_mod
from vllm_srun.plugins.testing import check_plugin

GIB = 1024**3

T4 = SimpleNamespace(
    name="Tesla T4",
    total_memory=15 * GIB,
    major=7,
    minor=5,
    multi_processor_count=40,
    gcnArchName="",
)
H100 = SimpleNamespace(
    name="NVIDIA H100 80GB HBM3",
    total_memory=80 * GIB,
    major=9,
    minor=0,
    multi_processor_count=132,
    gcnArchName="",
)
MEM = {0: (10 * GIB, 15 * GIB), 1: (70 * GIB, 79 * GIB)}


def _raise(*_args):
    raise RuntimeError("CUDA driver initialization failed")


@pytest.fixture
def fake_cuda(monkeypatch):
    """Install a fake CUDA build; returns a function taking the device properties."""

    def install(props=(T4, H100), *, hip=None, available=True, mem_get_info=None):
        props = list(props)
        monkeypatch.setattr(torch.version, "hip", hip)
        monkeypatch.setattr(torch.version, "cuda", "12.4")
        monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(props))
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])
        monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info or (lambda i: MEM[i]))

    return install


def test_auto_priority():
    assert cuda_mod.CudaAccelerator.name == "cuda"
    assert cuda_mod.CudaAccelerator.auto_priority == 20


def test_cuda_build_claims_gpus_and_rocm_does_not(fake_cuda):
    fake_cuda(hip=None)
    assert cuda_mod.CudaAccelerator().available() is True
    assert rocm_mod.RocmAccelerator().available() is False
    assert rocm_mod.RocmAccelerator().devices() == []


def test_hip_build_is_left_to_rocm(fake_cuda):
    fake_cuda(hip="6.2.41133")
    acc = cuda_mod.CudaAccelerator()
    assert acc.available() is False
    assert acc.devices() == []
    assert rocm_mod.RocmAccelerator().available() is True


def test_no_gpu_is_unavailable(fake_cuda):
    fake_cuda(available=False)
    acc = cuda_mod.CudaAccelerator()
    assert acc.available() is False
    assert acc.devices() == []


def test_raising_probe_is_unavailable(fake_cuda, monkeypatch):
    fake_cuda()
    monkeypatch.setattr(torch.cuda, "is_available", _raise)
    acc = cuda_mod.CudaAccelerator()
    assert acc.available() is False
    assert acc.devices() == []


def test_devices_enumerated(fake_cuda):
    fake_cuda()
    devices = cuda_mod.CudaAccelerator().devices()
    assert [d.device for d in devices] == ["cuda:0", "cuda:1"]
    assert [d.index for d in devices] == [0, 1]
    assert [d.name for d in devices] == ["Tesla T4", "NVIDIA H100 80GB HBM3"]
    assert [d.accelerator for d in devices] == ["cuda", "cuda"]
    assert [(d.total_memory_bytes, d.free_memory_bytes) for d in devices] == [
        (15 * GIB, 10 * GIB),
        (79 * GIB, 70 * GIB),
    ]
    assert dict(devices[1].capabilities) == {
        "compute_capability": "9.0",
        "sm": "sm_90",
        "bf16": "bf16_native",
        "multiprocessors": 132,
        "cuda_version": "12.4",
    }


def test_h100_keys_device_and_providers(fake_cuda):
    fake_cuda()
    acc = cuda_mod.CudaAccelerator()
    device = acc.devices()[1]
    assert device.device == "cuda:1"
    assert acc.reference_keys(device) == ["cuda:sm_90", "cuda"]
    assert acc.reference_keys(device, "bfloat16") == ["cuda:sm_90@bfloat16", "cuda@bfloat16"]
    assert acc.torch_device(1) == torch.device("cuda", 1)
    providers = acc.onnx_providers(device)
    assert providers[0] == ("CUDAExecutionProvider", {"device_id": 1})
    assert providers == [
        ("CUDAExecutionProvider", {"device_id": 1}),
        ("CPUExecutionProvider", {}),
    ]


def test_device_zero_mappings(fake_cuda):
    fake_cuda()
    acc = cuda_mod.CudaAccelerator()
    device = acc.devices()[0]
    assert acc.reference_keys(device) == ["cuda:sm_75", "cuda"]
    assert acc.torch_device(0) == torch.device("cuda", 0)
    assert acc.torch_device(None) == torch.device("cuda", 0)
    assert acc.onnx_providers(device)[0] == ("CUDAExecutionProvider", {"device_id": 0})


@pytest.mark.parametrize(
    ("major", "minor", "bf16"),
    [
        (7, 0, "bf16_emulated"),
        (7, 5, "bf16_emulated"),
        (8, 0, "bf16_native"),
        (8, 6, "bf16_native"),
        (9, 0, "bf16_native"),
        (10, 0, "bf16_native"),
    ],
)
def test_bf16_by_compute_capability(fake_cuda, major, minor, bf16):
    props = SimpleNamespace(
        name="GPU", total_memory=GIB, major=major, minor=minor, multi_processor_count=1
    )
    fake_cuda([props], mem_get_info=lambda i: (GIB // 2, GIB))
    (device,) = cuda_mod.CudaAccelerator().devices()
    assert device.capabilities["bf16"] == bf16
    assert device.capabilities["sm"] == f"sm_{major}{minor}"
    assert device.capabilities["compute_capability"] == f"{major}.{minor}"


def test_mem_get_info_failure_falls_back_to_properties(fake_cuda):
    fake_cuda(mem_get_info=_raise)
    devices = cuda_mod.CudaAccelerator().devices()
    assert [(d.total_memory_bytes, d.free_memory_bytes) for d in devices] == [
        (15 * GIB, None),
        (80 * GIB, None),
    ]


def test_synchronize_targets_device(fake_cuda, monkeypatch):
    fake_cuda()
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", calls.append)
    acc = cuda_mod.CudaAccelerator()
    acc.synchronize(1)
    acc.synchronize(None)
    assert calls == [1, 0]


def test_conforms_with_faked_gpus(fake_cuda):
    fake_cuda()
    report = check_plugin(cuda_mod)
    assert report.ok, report.to_text()
    assert any(f.check == "accelerator cuda: cuda:1 reference_keys" for f in report.findings)


def test_conforms_when_unavailable(fake_cuda):
    fake_cuda(available=False)
    report = check_plugin(cuda_mod)
    assert report.ok, report.to_text()
