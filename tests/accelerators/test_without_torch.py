"""``--device auto`` decides without importing torch where torch could not reach a GPU: the
build it was made for is read from ``torch/version.py`` and the driver's device nodes."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest
import torch

from vllm_srun.accelerators import cuda as cuda_mod
from vllm_srun.accelerators import rocm as rocm_mod
from vllm_srun.plugins.accelerator import device_nodes, torch_build

PROBE = """
import json, sys
from vllm_srun.accelerators.cuda import CudaAccelerator
from vllm_srun.accelerators.rocm import RocmAccelerator
from vllm_srun.plugins.accelerator import torch_build
print(json.dumps({"cuda": CudaAccelerator().available(), "rocm": RocmAccelerator().available(),
                  "build": torch_build(), "torch": "torch" in sys.modules}))
"""


def test_the_build_is_read_as_torch_version_says_it():
    build = torch_build()
    assert build is not None
    for name in ("__version__", "cuda", "hip", "git_version", "debug"):
        assert build[name] == getattr(torch.version, name)


@pytest.mark.skipif(platform.system() != "Linux", reason="device nodes are read on Linux only")
def test_device_nodes_match_globs(tmp_path):
    (tmp_path / "nvidia0").write_text("")
    assert device_nodes(str(tmp_path / "nvidia[0-9]*"))
    assert not device_nodes(str(tmp_path / "kfd"), str(tmp_path / "dxg"))


@pytest.mark.slow
def test_a_process_without_torch_answers_as_torch_would():
    """Where torch cannot see a GPU (a CPU build, or no driver), the GPU accelerators say so
    without importing it; where it might, torch is asked as before."""
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["cuda"] == cuda_mod.CudaAccelerator().available()
    assert found["rocm"] == rocm_mod.RocmAccelerator().available()
    reachable = (
        found["build"]["cuda"] is not None and device_nodes("/dev/nvidia*", "/dev/dxg")
    ) or (found["build"]["hip"] is not None and device_nodes("/dev/kfd"))
    if not reachable:
        assert found["torch"] is False
