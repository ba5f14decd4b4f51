import types

import pytest
import torch

from vllm_srun.plugins import Accelerator, DeviceInfo, slug, torch_memory_info


class Board(Accelerator):
    name = "board"

    def available(self):
        return True

    def devices(self):
        return [DeviceInfo("board", 3, "Board", 10, 4, {"rev": "b2"})]

    def torch_device(self, index):
        return torch.device("cpu")

    def hardware_keys(self, device):
        return [f"board:{device.capabilities['rev']}", "board"]

    def onnx_providers(self, device):
        return [("CPUExecutionProvider", {})]


def test_device_strings():
    assert DeviceInfo("cpu", None, "x", None, None).device == "cpu"
    assert DeviceInfo("cuda", 1, "x", None, None).device == "cuda:1"
    assert DeviceInfo("npu", 2, "x", None, None).device == "npu:2"
    assert DeviceInfo("rocm", 0, "x", 8, 2, {"gfx_arch": "gfx942"}).to_json() == {
        "device": "rocm:0",
        "accelerator": "rocm",
        "name": "x",
        "total_memory_bytes": 8,
        "free_memory_bytes": 2,
        "capabilities": {"gfx_arch": "gfx942"},
    }


def test_reference_keys_append_a_dtype_other_than_auto():
    board = Board()
    [device] = board.devices()
    assert board.reference_keys(device) == ["board:b2", "board"]
    assert board.reference_keys(device, "bfloat16") == ["board:b2@bfloat16", "board@bfloat16"]
    assert board.reference_keys(device, "float32") == ["board:b2@float32", "board@float32"]
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
        board.reference_keys(device, "fp8")


def test_slug():
    assert slug("Intel(R) Data Center GPU Max 1550") == "intel_r_data_center_gpu_max_1550"
    assert slug("Ascend910B2") == "ascend910b2"


def test_torch_memory_info_falls_back_to_the_properties_total():
    ok = types.SimpleNamespace(mem_get_info=lambda i: (3, 10))
    assert torch_memory_info(ok, 0, 99) == (10, 3)

    def fail(i):
        raise RuntimeError("no context")

    assert torch_memory_info(types.SimpleNamespace(mem_get_info=fail), 0, 99) == (99, None)
