"""The ``npu`` accelerator with a fake ``torch_npu`` extension and ``torch.npu`` backend."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from vllm_srun.accelerators import npu as npu_mod
from vllm_srun.plugins.testing import check_plugin

GIB = 1024**3
NAMES = ["Ascend910B1", "Ascend910B1", "Ascend910B2"]


def _raise(*_args):
    raise RuntimeError("ACL error: device not found")


def _backend(*, available=True, names=NAMES, mem_get_info=None, properties=None):
    calls: list[int] = []
    backend = SimpleNamespace(
        is_available=lambda: available,
        device_count=lambda: len(names),
        get_device_name=lambda i: names[i],
        get_device_properties=properties or (lambda i: SimpleNamespace(total_memory=64 * GIB)),
        mem_get_info=mem_get_info or (lambda i: ((60 - i) * GIB, 62 * GIB)),
        synchronize=calls.append,
        calls=calls,
    )
    return backend


@pytest.fixture
def fake_npu(monkeypatch):
    """Make ``torch_npu`` importable and ``torch.npu`` the given fake backend."""

    def install(backend=None):
        backend = backend or _backend()
        monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
        monkeypatch.setattr(torch, "npu", backend, raising=False)
        return backend

    return install


@pytest.fixture
def no_torch_npu(monkeypatch):
    """``import torch_npu`` fails, whatever is installed."""
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    monkeypatch.delattr(torch, "npu", raising=False)


def test_only_when_named():
    assert npu_mod.NpuAccelerator.name == "npu"
    assert npu_mod.NpuAccelerator.auto_priority is None


def test_without_torch_npu_unavailable(no_torch_npu):
    acc = npu_mod.NpuAccelerator()
    assert npu_mod._backend() is None
    assert acc.available() is False
    assert acc.devices() == []
    acc.synchronize(0)  # a no-op, never raises


def test_backend_without_torch_npu_import_unavailable(monkeypatch, no_torch_npu):
    monkeypatch.setattr(torch, "npu", _backend(), raising=False)
    acc = npu_mod.NpuAccelerator()
    assert npu_mod._backend() is None
    assert acc.available() is False
    assert acc.devices() == []


class _BrokenTorchNpu(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A ``torch_npu`` whose import fails the way a missing CANN driver does."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch_npu":
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise RuntimeError("libascendcl.so: cannot open shared object file")


def test_torch_npu_import_error_unavailable(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_BrokenTorchNpu(), *sys.meta_path])
    monkeypatch.setattr(torch, "npu", _backend(), raising=False)
    acc = npu_mod.NpuAccelerator()
    assert acc.available() is False
    assert acc.devices() == []


def test_torch_npu_without_backend_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    monkeypatch.delattr(torch, "npu", raising=False)
    acc = npu_mod.NpuAccelerator()
    assert acc.available() is False
    assert acc.devices() == []


def test_available_with_fake(fake_npu):
    backend = fake_npu()
    assert npu_mod._backend() is backend
    assert npu_mod.NpuAccelerator().available() is True


def test_no_device_is_unavailable(fake_npu):
    fake_npu(_backend(available=False))
    acc = npu_mod.NpuAccelerator()
    assert acc.available() is False
    assert acc.devices() == []


def test_raising_probe_is_unavailable(fake_npu):
    backend = _backend()
    backend.is_available = _raise
    fake_npu(backend)
    acc = npu_mod.NpuAccelerator()
    assert acc.available() is False
    assert acc.devices() == []


def test_devices_enumerated(fake_npu):
    fake_npu()
    devices = npu_mod.NpuAccelerator().devices()
    assert len(devices) == 3
    assert [d.device for d in devices] == ["npu:0", "npu:1", "npu:2"]
    assert [d.index for d in devices] == [0, 1, 2]
    assert [d.name for d in devices] == NAMES
    assert [(d.total_memory_bytes, d.free_memory_bytes) for d in devices] == [
        (62 * GIB, 60 * GIB),
        (62 * GIB, 59 * GIB),
        (62 * GIB, 58 * GIB),
    ]
    assert dict(devices[2].capabilities) == {"soc": "ascend910b2", "bf16": "bf16_native"}


def test_device_two_keys_and_providers(fake_npu):
    fake_npu()
    acc = npu_mod.NpuAccelerator()
    device = acc.devices()[2]
    assert device.device == "npu:2"
    assert device.accelerator == "npu"
    assert acc.reference_keys(device) == ["npu:ascend910b2", "npu"]
    assert acc.reference_keys(device, "bfloat16") == ["npu:ascend910b2@bfloat16", "npu@bfloat16"]
    assert acc.onnx_providers(device) == [
        ("CANNExecutionProvider", {"device_id": 2}),
        ("CPUExecutionProvider", {}),
    ]
    assert acc.onnx_providers(acc.devices()[0])[0] == ("CANNExecutionProvider", {"device_id": 0})


def test_mem_get_info_failure_falls_back_to_properties(fake_npu):
    fake_npu(_backend(mem_get_info=_raise))
    devices = npu_mod.NpuAccelerator().devices()
    assert [(d.total_memory_bytes, d.free_memory_bytes) for d in devices] == [
        (64 * GIB, None),
        (64 * GIB, None),
        (64 * GIB, None),
    ]


def test_no_memory_probe_at_all(fake_npu):
    fake_npu(_backend(mem_get_info=_raise, properties=_raise))
    devices = npu_mod.NpuAccelerator().devices()
    assert [(d.total_memory_bytes, d.free_memory_bytes) for d in devices] == [(None, None)] * 3


def test_synchronize_targets_device(fake_npu):
    backend = fake_npu()
    acc = npu_mod.NpuAccelerator()
    acc.synchronize(2)
    acc.synchronize(None)
    assert backend.calls == [2, 0]


def test_conforms_when_unavailable(no_torch_npu):
    report = check_plugin(npu_mod)
    assert report.ok, report.to_text()
