"""Golden tolerances come from the accelerator: a third-party one declares its own, and the
reference file can still set one per device class."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from vllm_srun.compose.golden import check, record
from vllm_srun.compose.loader import LoadOptions, load_model
from vllm_srun.compose.placement import Placement
from vllm_srun.plugins import Accelerator, DeviceInfo, GoldenReference, read_reference_file
from vllm_srun.plugins.host import Catalog, load_catalog
from vllm_srun.plugins.host.layers import LAYERS

from .fixtures import write_task_package

REQUESTS = ({"surface": "embeddings", "body": {"input": ["a tolerance of its own"]}},)


class Abacus(Accelerator):
    """A test accelerator (a CPU underneath) that declares a loose golden tolerance."""

    name = "abacus"
    golden_tolerance = 0.01

    def available(self) -> bool:
        return True

    def devices(self) -> list[DeviceInfo]:
        return [DeviceInfo("abacus", None, "bead frame", 1 << 30, 1 << 30)]

    def torch_device(self, index: int | None) -> torch.device:
        return torch.device("cpu")

    def hardware_keys(self, device: DeviceInfo) -> list[str]:
        return ["abacus:beads", "abacus"]

    def onnx_providers(self, device: DeviceInfo) -> list[tuple[str, dict[str, str]]]:
        return [("CPUExecutionProvider", {})]


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog({})


@pytest.fixture(scope="module")
def on_abacus(tmp_path_factory: pytest.TempPathFactory, catalog: Catalog):
    package = write_task_package(tmp_path_factory.mktemp("abacus"), "bert", "pooled")
    served = load_model(package, LoadOptions(device="cpu"), catalog=catalog)
    abacus = Abacus()
    return dataclasses.replace(
        served, placement=Placement(abacus, abacus.devices()[0]), identity="test/abacus"
    )


def embedding_answer(served) -> dict:
    body = served.answer("embeddings", REQUESTS[0]["body"])
    return {k: v for k, v in body.items() if k != "model"}


def moved(answer: dict, delta: float) -> dict:
    changed = json.loads(json.dumps(answer))
    changed["data"][0]["embedding"][0] += delta
    return changed


def with_reference(catalog: Catalog, reference: GoldenReference) -> Catalog:
    layers = {**catalog.layers}
    layers["golden_references"] = {**layers["golden_references"], reference.model: reference}
    return dataclasses.replace(catalog, layers=layers)


def test_the_accelerator_declares_a_golden_tolerance_and_the_contract_checks_it():
    layer = next(layer for layer in LAYERS if layer.name == "accelerators")
    assert layer.check(Abacus()) == []
    bad = type("Bad", (Abacus,), {"golden_tolerance": 0})()
    assert layer.check(bad) == [
        "accelerator golden_tolerance must be a finite number above 0, not 0"
    ]
    assert load_catalog({}).layer("accelerators")["cpu"].golden_tolerance == 1e-5


@pytest.mark.parametrize(("delta", "status"), [(0.009, "matched"), (0.011, "failed")])
def test_a_key_without_a_tolerance_in_the_file_uses_the_accelerators(
    on_abacus, catalog, delta, status
):
    recorded = moved(embedding_answer(on_abacus), delta)
    reference = GoldenReference("test/abacus", REQUESTS, {"abacus:beads": (recorded,)}, {})
    result = check(on_abacus, with_reference(catalog, reference))
    assert (result.status, result.reference) == (status, "abacus:beads")
    if status == "failed":
        assert "(tolerance 0.01 for abacus)" in (result.reason or "")


def test_the_reference_files_tolerance_wins_over_the_accelerators(on_abacus, catalog):
    recorded = moved(embedding_answer(on_abacus), 0.005)
    reference = GoldenReference(
        "test/abacus", REQUESTS, {"abacus:beads": (recorded,)}, {"abacus": 0.001}
    )
    result = check(on_abacus, with_reference(catalog, reference))
    assert result.status == "failed"
    assert "(tolerance 0.001 for abacus)" in (result.reason or "")


def test_recording_writes_the_accelerators_tolerance_for_a_new_device_class(
    on_abacus, catalog, tmp_path: Path
):
    path = tmp_path / "abacus.json"
    path.write_text(
        json.dumps(
            {"model": "test/abacus", "tolerances": {}, "requests": list(REQUESTS), "answers": {}}
        )
    )
    recorded = record(on_abacus, catalog, "test/abacus", path=path)
    assert (recorded.key, recorded.tolerance) == ("abacus:beads", 0.01)
    assert read_reference_file(path).tolerances == {"abacus": 0.01}
