import pytest

from vllm_srun.placement import DeviceNotAvailable, auto_order, parse_device_spec, place
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
