import pytest

from vllm_srun.placement import (
    DeviceNotAvailable,
    NotEnoughMemory,
    auto_order,
    gib,
    parse_device_spec,
    place,
)
from vllm_srun.plugins import build_catalog

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
    from vllm_srun.plugins import load_catalog

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
        "needs about 10.00 GiB, 9.00 GiB free on gpu:2; free memory on it, choose another "
        "device with --device, or serve a smaller model"
    )
    assert (raised.value.need_bytes, raised.value.free_bytes) == (10 * GIB, 9 * GIB)


def test_a_named_device_is_checked_alone_and_unknown_free_memory_counts_as_enough():
    catalog = catalog_of(gpus("gpu", [1 * GIB, None]))
    with pytest.raises(NotEnoughMemory, match=r"needs about 2.00 GiB, 1.00 GiB free on gpu:0"):
        place(catalog, "gpu:0", lambda p: 2 * GIB)
    with pytest.raises(NotEnoughMemory, match="free on gpu:0"):
        place(catalog, "gpu", lambda p: 2 * GIB)  # the accelerator's first device
    assert place(catalog, "gpu:1", lambda p: 1000 * GIB).device.device == "gpu:1"


def test_gib_keeps_small_sizes_readable():
    assert gib(0) == "0.00"
    assert gib(GIB * 12.5) == "12.50"
    assert gib(GIB // 1000) == "0.001"
    assert gib(GIB // 3000) == "0.00033"
