"""``--engine auto``: an engine the golden reference declares at parity on this device is
preferred under ``exact`` (issue 32); otherwise the engines by rank; the reason is kept."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from vllm_srun.compose.engine_choice import EngineRefused, choose_engine, parity_key
from vllm_srun.compose.placement import place
from vllm_srun.plugins import BATCHING, EXACT, Engine, GoldenReference, read_reference_file
from vllm_srun.plugins.golden import ReferenceFileError, golden_violations
from vllm_srun.plugins.host import Catalog, load_catalog
from vllm_srun.plugins.spec import ModelSpec

ROOT = Path(__file__).resolve().parents[1]


class Stub(Engine):
    """An engine that accepts or refuses every spec."""

    profiles = (EXACT, BATCHING)

    def __init__(self, name: str, priority: int, refusal: str | None = None) -> None:
        self.name = name
        self.refusal = refusal
        type(self).auto_priority = priority  # per-instance classes below

    def supports(self, spec: Any, device: Any) -> str | None:
        return self.refusal

    def load(self, spec: Any, device: Any, options: Any) -> Any:
        raise AssertionError("never loaded here")


def engine(name: str, priority: int, refusal: str | None = None) -> Engine:
    kind = type(f"Stub_{name}", (Stub,), {})
    return kind(name, priority, refusal)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def real() -> Catalog:
    return load_catalog()


def with_engines(catalog: Catalog, *engines: Engine) -> Catalog:
    layers = {**catalog.layers, "engines": {e.name: e for e in engines}}
    return dataclasses.replace(catalog, layers=layers)


SPEC = ModelSpec(package=Path("."), architecture="BertModel", model_type="bert", task="encoder")


def reference(keys: list[str], parity: dict[str, tuple[str, ...]]) -> GoldenReference:
    return GoldenReference("m", ({},), {k: ({},) for k in keys}, {"cpu": 1e-5}, None, parity)


def test_auto_prefers_the_engine_at_parity_on_this_devices_recorded_key(real):
    placement = place(real, "cpu")
    specific = placement.accelerator.reference_keys(placement.device)[0]
    catalog = with_engines(real, engine("native", 10), engine("onnxruntime", 20))
    declared = reference([specific, "cpu"], {"onnxruntime": (specific,)})
    choice = choose_engine(catalog, SPEC, placement, "auto", declared)
    assert choice.engine.name == "onnxruntime"
    assert choice.reason == (
        f"auto: its answers equal the golden reference on {specific} (measured, declared "
        "by the reference), and it was preferred for that"
    )
    # batching is not exact: the ranks decide
    batching = dataclasses.replace(SPEC, profile="batching")
    choice = choose_engine(catalog, batching, placement, "auto", declared)
    assert (choice.engine.name, choice.reason) == (
        "native",
        "auto: the first engine by rank that accepts the model (native)",
    )
    # parity on the bare class key says nothing where a more specific key is recorded
    broad = reference([specific, "cpu"], {"onnxruntime": ("cpu",)})
    assert choose_engine(catalog, SPEC, placement, "auto", broad).engine.name == "native"
    assert parity_key(broad, [specific, "cpu"], "onnxruntime") is None
    assert choose_engine(catalog, SPEC, placement, "auto", None).engine.name == "native"


def test_an_engine_at_parity_that_refuses_is_passed_over_with_its_reason(real):
    placement = place(real, "cpu")
    specific = placement.accelerator.reference_keys(placement.device)[0]
    catalog = with_engines(
        real, engine("native", 10), engine("onnxruntime", 20, "onnxruntime is not installed")
    )
    declared = reference([specific], {"onnxruntime": (specific,)})
    choice = choose_engine(catalog, SPEC, placement, "auto", declared)
    assert choice.engine.name == "native"
    assert choice.reason == (
        "auto: the first engine by rank that accepts the model (native); passed over: "
        f"onnxruntime (at parity on {specific}): onnxruntime is not installed"
    )
    assert choose_engine(catalog, SPEC, placement, "native", declared).reason == (
        "named by --engine"
    )
    with pytest.raises(EngineRefused, match="engine onnxruntime cannot run the model: onnx"):
        choose_engine(catalog, SPEC, placement, "onnxruntime", declared)
    with pytest.raises(EngineRefused, match=r"no engine named 'x' is installed \(installed"):
        choose_engine(catalog, SPEC, placement, "x", declared)


def test_engine_parity_is_read_from_the_file_and_must_name_recorded_keys(tmp_path):
    document = {
        "model": "m",
        "requests": [{}],
        "answers": {"cpu:a": [{}]},
        "tolerances": {"cpu": 1e-5},
        "engine_parity": {"onnxruntime": ["cpu:a"]},
    }
    path = tmp_path / "ref.json"
    path.write_text(json.dumps(document))
    read = read_reference_file(path)
    assert read.engine_parity == {"onnxruntime": ("cpu:a",)}
    assert golden_violations(read) == []
    unrecorded = dataclasses.replace(read, engine_parity={"onnxruntime": ("cpu:b",)})
    assert golden_violations(unrecorded) == [
        "engine_parity of 'onnxruntime' must list reference keys that have answers"
    ]
    path.write_text(json.dumps({**document, "engine_parity": {"onnxruntime": "cpu:a"}}))
    with pytest.raises(ReferenceFileError, match="`engine_parity` must map engine names"):
        read_reference_file(path)


def test_the_shipped_references_declare_parity_only_on_recorded_keys():
    for path in sorted((ROOT / "families").glob("*/golden/*.json")):
        assert golden_violations(read_reference_file(path)) == [], path


def test_golden_parity_declares_an_engine_that_matches_and_withdraws_one_that_does_not(
    tmp_path,
):
    """``measure_parity`` (``vllm-srun golden parity``) on a fixture package: the engine
    matches the answers recorded on it, then a recorded number moved past the tolerance."""
    from vllm_srun.compose.golden import measure_parity, record, reference_keys
    from vllm_srun.compose.loader import LoadOptions, load_model

    from .fixtures import write_task_package

    catalog = load_catalog({})
    package = write_task_package(tmp_path, "bert", "pooled")
    served = dataclasses.replace(
        load_model(package, LoadOptions(device="cpu", engine="native"), catalog=catalog),
        identity="fake/pooled",
    )
    path = tmp_path / "fake.json"
    path.write_text(
        json.dumps(
            {
                "model": "fake/pooled",
                "tolerances": {"cpu": 1e-5},
                "requests": [{"surface": "embeddings", "body": {"input": ["parity"]}}],
                "answers": {},
            }
        )
    )

    def registered() -> Catalog:
        layers = {**catalog.layers, "golden_references": {"fake/pooled": read_reference_file(path)}}
        return dataclasses.replace(catalog, layers=layers)

    record(served, registered(), "fake/pooled")
    key = reference_keys(served)[0]
    found = measure_parity(served, registered())
    assert found.held and (found.engine, found.result.reference) == ("native", key)
    assert json.loads(path.read_text())["engine_parity"] == {"native": [key]}
    document = json.loads(path.read_text())
    document["answers"][key][0]["data"][0]["embedding"][0] += 1e-3  # past 1e-5
    path.write_text(json.dumps(document))
    found = measure_parity(served, registered())
    assert not found.held
    assert found.result.reason.startswith(f"golden self-check failed against {key}: ")
    assert "engine_parity" not in json.loads(path.read_text())
