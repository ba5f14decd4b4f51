import pytest

from vllm_srun.compose.placement import (
    DeviceNotAvailable,
    NotEnoughMemory,
    auto_order,
    gib,
    parse_device_spec,
    place,
)
from vllm_srun.plugins.host import build_catalog

from .plugins.test_manager import make_accelerator, plugin


def catalog_of(*accelerators):
    return build_catalog([plugin(a.name, a) for a in accelerators])


def test_parse_device_spec():
    assert parse_device_spec("cpu") == ("cpu", None)
    assert parse_device_spec("cuda:1") == ("cuda", 1)
    assert parse_device_spec(" npu:2 ") == ("npu", 2)
    for bad in ("cuda:", "CUDA", "cuda:-1", "cuda:a", ""):
        with pytest.raises(DeviceNotAvailable, match="device not available"):
            parse_device_spec(bad)


def test_auto_goes_by_ascending_priority_and_skips_accelerators_without_one():
    catalog = catalog_of(
        make_accelerator("cpu", 1000), make_accelerator("gpu", 20), make_accelerator("named", None)
    )
    assert auto_order(catalog) == ["gpu", "cpu"]
    assert place(catalog).accelerator.name == "gpu"


def test_unavailable_accelerators_are_not_tried():
    gpu = make_accelerator("gpu", 20)
    type(gpu).available = lambda self: False
    catalog = catalog_of(make_accelerator("cpu", 1000), gpu)
    assert auto_order(catalog) == ["cpu"]
    with pytest.raises(
        DeviceNotAvailable, match="device not available: gpu cannot be used on this machine"
    ):
        place(catalog, "gpu")


def test_named_devices():
    catalog = catalog_of(make_accelerator("cpu", 1000), make_accelerator("named", None))
    assert place(catalog, "named").device.device == "named"
    assert place(catalog, "named:0").device.device == "named"  # unnumbered answers to 0
    with pytest.raises(
        DeviceNotAvailable, match=r"named:3 does not exist \(this machine has named\)"
    ):
        place(catalog, "named:3")
    with pytest.raises(DeviceNotAvailable, match="no accelerator plugin named 'tpu' is installed"):
        place(catalog, "tpu")


def test_auto_with_nothing_usable():
    with pytest.raises(
        DeviceNotAvailable, match="no accelerator that --device auto tries is usable"
    ):
        place(catalog_of(make_accelerator("named", None)))


def test_the_real_catalog_places_auto_on_the_cpu_here():
    from vllm_srun.plugins.host import load_catalog

    catalog = load_catalog({})
    assert auto_order(catalog) == ["cpu"]
    placed = place(catalog)
    assert placed.device.device == "cpu"
    assert placed.accelerator.torch_device(None).type == "cpu"


# -- memory ----------------------------------------------------------------------------------
def gpus(name, free, priority=20):
    """An accelerator with one numbered device per entry of ``free`` (bytes, or None)."""
    import torch

    from vllm_srun.plugins import Accelerator, DeviceInfo

    class Gpus(Accelerator):
        auto_priority = priority

        def available(self):
            return True

        def devices(self):
            return [DeviceInfo(name, i, "fake", 100 * GIB, f, {}) for i, f in enumerate(free)]

        def torch_device(self, index):
            return torch.device("cpu")

        def hardware_keys(self, device):
            return [name]

        def onnx_providers(self, device):
            return [("CPUExecutionProvider", {})]

    Gpus.name = name
    return Gpus()


GIB = 1 << 30


def test_auto_takes_the_first_device_with_enough_free_memory_of_the_first_accelerator():
    catalog = catalog_of(gpus("gpu", [1 * GIB, 6 * GIB, 9 * GIB]), make_accelerator("cpu", 1000))
    assert place(catalog, "auto", lambda p: 5 * GIB).device.device == "gpu:1"
    assert place(catalog, "auto").device.device == "gpu:0"  # nothing required: the first
    with pytest.raises(NotEnoughMemory) as raised:
        place(catalog, "auto", lambda p: 10 * GIB)  # never silently on the CPU instead
    assert str(raised.value) == (
        "needs about 10.00 GiB, 9.00 GiB free; out of memory on gpu:2: free memory on it, "
        "choose another device with --device, or serve a smaller model"
    )
    assert (raised.value.need_bytes, raised.value.free_bytes) == (10 * GIB, 9 * GIB)


def test_a_named_device_is_checked_alone_and_unknown_free_memory_counts_as_enough():
    catalog = catalog_of(gpus("gpu", [1 * GIB, None]))
    with pytest.raises(
        NotEnoughMemory, match=r"needs about 2.00 GiB, 1.00 GiB free; out of memory on gpu:0"
    ):
        place(catalog, "gpu:0", lambda p: 2 * GIB)
    with pytest.raises(NotEnoughMemory, match="GiB free; out of memory on gpu:0"):
        place(catalog, "gpu", lambda p: 2 * GIB)  # the accelerator's first device
    assert place(catalog, "gpu:1", lambda p: 1000 * GIB).device.device == "gpu:1"


def test_gib_keeps_small_sizes_readable():
    assert gib(0) == "0.00"
    assert gib(GIB * 12.5) == "12.50"
    assert gib(GIB // 1000) == "0.001"
    assert gib(GIB // 3000) == "0.00033"


# -- weight formats only some devices multiply ---------------------------------------------
def _package_with(tmp_path, config=None, dtype=None):
    import json
    import struct

    package = tmp_path / "pkg"
    package.mkdir(parents=True)
    (package / "config.json").write_text(json.dumps(config or {}))
    if dtype is not None:
        header = json.dumps({"w": {"dtype": dtype, "shape": [1], "data_offsets": [0, 1]}}).encode()
        (package / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0")
    return package


def test_a_package_says_which_weight_formats_it_uses(tmp_path):
    from vllm_srun.compose.placement import weight_formats

    assert weight_formats(_package_with(tmp_path / "a", dtype="F8_E4M3")) == ["fp8"]
    assert weight_formats(_package_with(tmp_path / "b", dtype="BF16")) == []
    fp8 = {"quantization_config": {"quant_method": "fp8"}}
    assert weight_formats(_package_with(tmp_path / "c", config=fp8)) == ["fp8"]
    nvfp4 = {"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}
    assert weight_formats(_package_with(tmp_path / "d", config=nvfp4)) == ["nvfp4"]


def _device(accelerator, **capabilities):
    from vllm_srun.plugins import DeviceInfo

    return DeviceInfo(accelerator, 0, "gpu", None, None, capabilities)


def test_each_accelerator_says_which_weight_formats_its_devices_multiply(monkeypatch):
    import torch

    from vllm_srun.accelerators.cpu import CpuAccelerator
    from vllm_srun.accelerators.cuda import CudaAccelerator
    from vllm_srun.accelerators.rocm import RocmAccelerator

    cuda, rocm = CudaAccelerator(), RocmAccelerator()
    assert CpuAccelerator().weight_format_refusal(_device("cpu"), "fp8") == "it is a CPU"
    assert cuda.weight_format_refusal(_device("cuda", compute_capability="8.6"), "fp8") == (
        "compute capability 8.6"
    )
    assert cuda.weight_format_refusal(_device("cuda", compute_capability="8.9"), "fp8") is None
    assert cuda.weight_format_refusal(_device("cuda", compute_capability="9.0"), "nvfp4") == (
        "compute capability 9.0 has no FP4 tensor cores"
    )
    monkeypatch.delattr(torch, "float4_e2m1fn_x2", raising=False)
    assert cuda.weight_format_refusal(_device("cuda", compute_capability="10.0"), "nvfp4").endswith(
        "has no FP4 tensors"
    )
    assert rocm.weight_format_refusal(_device("rocm", gfx_arch="gfx942"), "fp8") is None
    assert rocm.weight_format_refusal(_device("rocm", gfx_arch="gfx90a"), "fp8") == (
        "gfx90a has no FP8 matrix units"
    )
    assert rocm.weight_format_refusal(_device("rocm", gfx_arch="gfx950"), "nvfp4") == (
        "it is a ROCm GPU"
    )


def test_an_fp8_package_on_a_cpu_is_refused_with_the_guide_sentence(tmp_path):
    import json

    from vllm_srun.compose.loader import LoadError, LoadOptions, load_model

    from .fixtures import write_task_package

    package = write_task_package(tmp_path, "bert", "sequence")
    config = json.loads((package / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8"}
    (package / "config.json").write_text(json.dumps(config))
    with pytest.raises(LoadError) as raised:
        load_model(str(package), LoadOptions(device="cpu"))
    assert str(raised.value) == (
        "FP8 weights need an NVIDIA GPU of compute capability 8.9 or later or an AMD Instinct "
        "MI300 or MI350 series GPU (cpu: it is a CPU). Serve it on such a GPU, or serve the "
        "BF16 or int4 package of the model instead"
    )
    assert not raised.value.retryable
