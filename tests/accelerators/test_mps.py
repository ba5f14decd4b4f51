"""The ``mps`` accelerator with Metal, the chip name and the macOS release faked."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest
import torch

from vllm_srun.accelerators import mps as mps_mod
from vllm_srun.plugins.testing import check_plugin

GIB = 1024**3


def _raise(*_args, **_kwargs):
    raise RuntimeError("MPS backend unavailable")


@pytest.fixture
def fake_mps(monkeypatch):
    """Install a fake Apple M2 Pro; returns a function to vary it."""

    def install(
        *, available=True, total=21 * GIB, allocated=5 * GIB, chip="Apple M2 Pro", macos=14
    ):
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: available)
        monkeypatch.setattr(torch.mps, "recommended_max_memory", lambda: total)
        monkeypatch.setattr(torch.mps, "driver_allocated_memory", lambda: allocated)
        monkeypatch.setattr(mps_mod, "chip_name", lambda: chip)
        monkeypatch.setattr(mps_mod, "_macos_major", lambda: macos)

    return install


def test_only_when_named():
    assert mps_mod.MpsAccelerator.name == "mps"
    assert mps_mod.MpsAccelerator.auto_priority is None


def test_unavailable_lists_nothing(fake_mps):
    fake_mps(available=False)
    acc = mps_mod.MpsAccelerator()
    assert acc.available() is False
    assert acc.devices() == []


def test_raising_probe_is_unavailable(fake_mps, monkeypatch):
    fake_mps()
    monkeypatch.setattr(torch.backends.mps, "is_available", _raise)
    acc = mps_mod.MpsAccelerator()
    assert acc.available() is False
    assert acc.devices() == []


def test_m2_pro_device(fake_mps):
    fake_mps()
    acc = mps_mod.MpsAccelerator()
    assert acc.available() is True
    (device,) = acc.devices()
    assert device.accelerator == "mps"
    assert device.index is None
    assert device.device == "mps"
    assert device.name == "Apple M2 Pro"
    assert (device.total_memory_bytes, device.free_memory_bytes) == (21 * GIB, 16 * GIB)
    assert dict(device.capabilities) == {"chip": "apple_m2_pro", "macos": 14, "bf16": "bf16_native"}


def test_m2_pro_keys_device_and_providers(fake_mps):
    fake_mps()
    acc = mps_mod.MpsAccelerator()
    (device,) = acc.devices()
    assert acc.reference_keys(device) == ["mps:apple_m2_pro", "mps"]
    assert acc.reference_keys(device, "float32") == ["mps:apple_m2_pro@float32", "mps@float32"]
    assert acc.torch_device(None) == torch.device("mps")
    assert acc.torch_device(0) == torch.device("mps")
    assert acc.onnx_providers(device) == [
        ("CoreMLExecutionProvider", {}),
        ("CPUExecutionProvider", {}),
    ]


@pytest.mark.parametrize(
    ("macos", "bf16"),
    [(13, "bf16_emulated"), (14, "bf16_native"), (15, "bf16_native"), (0, "bf16_emulated")],
)
def test_bf16_by_macos_release(fake_mps, macos, bf16):
    fake_mps(macos=macos)
    (device,) = mps_mod.MpsAccelerator().devices()
    assert device.capabilities["bf16"] == bf16
    assert device.capabilities["macos"] == macos


def test_free_memory_never_negative(fake_mps):
    fake_mps(total=8 * GIB, allocated=9 * GIB)
    (device,) = mps_mod.MpsAccelerator().devices()
    assert (device.total_memory_bytes, device.free_memory_bytes) == (8 * GIB, 0)


def test_memory_probe_failure_means_unknown(fake_mps, monkeypatch):
    fake_mps()
    monkeypatch.setattr(torch.mps, "recommended_max_memory", _raise)
    (device,) = mps_mod.MpsAccelerator().devices()
    assert (device.total_memory_bytes, device.free_memory_bytes) == (None, None)


def test_synchronize(fake_mps, monkeypatch):
    fake_mps()
    calls = []
    monkeypatch.setattr(torch.mps, "synchronize", lambda: calls.append("sync"))
    mps_mod.MpsAccelerator().synchronize(None)
    assert calls == ["sync"]


def test_chip_name_from_sysctl(monkeypatch):
    seen = []

    def run(cmd, **kwargs):
        seen.append(cmd)
        return SimpleNamespace(stdout="Apple M3 Max\n")

    monkeypatch.setattr(mps_mod.subprocess, "run", run)
    assert mps_mod.chip_name() == "Apple M3 Max"
    assert seen == [["sysctl", "-n", "machdep.cpu.brand_string"]]


@pytest.mark.parametrize(
    "outcome",
    [
        FileNotFoundError("sysctl"),
        subprocess.TimeoutExpired("sysctl", 2),
        SimpleNamespace(stdout="  \n"),
    ],
)
def test_chip_name_fallback(monkeypatch, outcome):
    def run(cmd, **kwargs):
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    monkeypatch.setattr(mps_mod.subprocess, "run", run)
    assert mps_mod.chip_name() == "Apple silicon"


@pytest.mark.parametrize(("release", "major"), [("14.5", 14), ("13.6.1", 13), ("", 0)])
def test_macos_major(monkeypatch, release, major):
    monkeypatch.setattr(mps_mod.platform, "mac_ver", lambda: (release, ("", "", ""), "arm64"))
    assert mps_mod._macos_major() == major


def test_conforms_with_faked_device(fake_mps):
    fake_mps()
    report = check_plugin(mps_mod)
    assert report.ok, report.to_text()
    assert any(f.check == "accelerator mps: mps reference_keys" for f in report.findings)


def test_conforms_when_unavailable(fake_mps):
    fake_mps(available=False)
    report = check_plugin(mps_mod)
    assert report.ok, report.to_text()
