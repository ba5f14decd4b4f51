"""The forward cost is measured once per machine and key, then read from the runtime cache."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.fixtures import write_task_package
from vllm_srun.compose import loader
from vllm_srun.compose.loader import LoadOptions, load_model
from vllm_srun.compose.probe_cache import (
    CACHE_FOLDER,
    ForwardCostCache,
    ForwardCostKey,
    forward_cost_key,
)

FIGURES = {"fixed_ms": 1.25, "per_padded_token_ms": 0.0125, "overhead_tokens": 100.0}


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_task_package(tmp_path_factory.mktemp("bert"), "bert", "sequence")


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[int]:
    """A fresh runtime cache, and a forward-cost measurement that returns :data:`FIGURES`
    and counts its calls (one list entry per call)."""
    monkeypatch.setenv("VLLM_SRUN_CACHE_DIR", str(tmp_path / "cache"))
    calls: list[int] = []

    def measure(loaded: object) -> dict[str, float]:
        calls.append(1)
        return dict(FIGURES)

    monkeypatch.setattr(loader, "measure_forward_cost", measure)
    return calls


def cost_files(root: Path) -> list[Path]:
    return sorted((root / "cache" / CACHE_FOLDER).glob("*.json"))


def test_a_second_load_reuses_the_figure_and_says_so(bert, measured, tmp_path):
    first = load_model(str(bert), LoadOptions(engine="native"))
    second = load_model(str(bert), LoadOptions(engine="native"))
    assert first.forward_cost == {**FIGURES, "source": "measured"}
    assert second.forward_cost == {**FIGURES, "source": "cache"}
    assert second.card()["forward_cost"]["source"] == "cache"
    assert len(measured) == 1
    [file] = cost_files(tmp_path)
    document = json.loads(file.read_text())
    assert document["forward_cost"] == FIGURES
    assert document["key"]["family"] == "task_heads"
    assert document["key"]["engine"] == "native"
    assert document["key"]["profile"] == "exact"
    assert document["key"]["threads"] == torch.get_num_threads()
    device = first.placement.device
    reference = first.placement.accelerator.hardware_keys(device)[0]
    assert document["key"]["hardware"] == [reference, device.name]
    assert document["key"]["model"] == first.prepared.verification.identity
    assert set(document["key"]["libraries"]) == {"torch", "transformers", "vllm-srun"}


def test_another_profile_or_thread_count_measures_again(bert, measured, tmp_path):
    load_model(str(bert), LoadOptions(engine="native"))
    batching = load_model(str(bert), LoadOptions(engine="native", profile="batching"))
    assert batching.forward_cost["source"] == "measured"
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        more = load_model(str(bert), LoadOptions(engine="native"))
    finally:
        torch.set_num_threads(threads)
    assert more.forward_cost["source"] == "measured"
    assert len(measured) == 3
    assert len(cost_files(tmp_path)) == 3
    again = load_model(str(bert), LoadOptions(engine="native", profile="batching"))
    assert again.forward_cost == {**FIGURES, "source": "cache"}
    assert len(measured) == 3


@pytest.mark.parametrize(
    "garbage",
    [b"\xff\xfe not text", b"{not json", b'{"version": 1, "key": {}, "forward_cost": {}}'],
    ids=["bytes", "not-json", "another-key"],
)
def test_a_corrupt_cache_file_is_measured_again_and_rewritten(
    bert, measured, tmp_path, caplog, garbage
):
    load_model(str(bert), LoadOptions(engine="native"))
    [file] = cost_files(tmp_path)
    file.write_bytes(garbage)
    with caplog.at_level(logging.WARNING, logger="vllm_srun.compose.probe_cache"):
        again = load_model(str(bert), LoadOptions(engine="native"))
    assert again.forward_cost == {**FIGURES, "source": "measured"}
    assert "is ignored" in caplog.text
    assert json.loads(file.read_text())["forward_cost"] == FIGURES
    assert load_model(str(bert), LoadOptions(engine="native")).forward_cost["source"] == "cache"
    assert len(measured) == 2


def key(**overrides: object) -> ForwardCostKey:
    fields: dict = {
        "model": "a" * 64,
        "family": "task_heads",
        "engine": "native",
        "profile": "exact",
        "dtype": "auto",
        "kernels": {"attention": "eager"},
        "hardware": ("cpu:fake", "Fake CPU"),
        "threads": 2,
        "probe_tokens": (3, 17),
        "libraries": {"torch": "2.0", "transformers": "4.0", "onnxruntime": None},
    }
    return ForwardCostKey(**{**fields, **overrides})


def test_no_cost_found_is_not_recorded(tmp_path):
    cache = ForwardCostCache(tmp_path)
    unknown = {"fixed_ms": None, "per_padded_token_ms": None, "overhead_tokens": None}
    assert cache.measured(key(), lambda: dict(unknown)) == {**unknown, "source": "measured"}
    assert list(tmp_path.iterdir()) == []
    assert cache.measured(None, lambda: dict(FIGURES)) == {**FIGURES, "source": "measured"}
    assert list(tmp_path.iterdir()) == []


def test_every_field_of_the_key_names_its_own_file(tmp_path):
    cache = ForwardCostCache(tmp_path)
    cache.put(key(), FIGURES)
    changed = [
        key(model="b" * 64),
        key(dtype="bfloat16"),
        key(kernels={"attention": "sdpa"}),
        key(hardware=("cpu:other", "Fake CPU")),
        key(hardware=("cpu:fake", "Other CPU")),
        key(probe_tokens=(3, 18)),
        key(options={"head": "x"}),
        key(libraries={"torch": "2.1", "transformers": "4.0", "onnxruntime": None}),
    ]
    assert cache.get(key()) == FIGURES
    assert [cache.get(other) for other in changed] == [None] * len(changed)


def test_an_unwritable_cache_warns_and_still_answers(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    cache = ForwardCostCache(blocker / "sub")
    with caplog.at_level(logging.WARNING, logger="vllm_srun.compose.probe_cache"):
        assert cache.measured(key(), lambda: dict(FIGURES)) == {**FIGURES, "source": "measured"}
    assert "cannot write the forward-cost cache" in caplog.text


def test_a_key_needs_the_model_identity_and_the_hardware_name():
    def broken(device):
        raise RuntimeError("no device properties")

    device = SimpleNamespace(name="Fake CPU")
    named = SimpleNamespace(hardware_keys=lambda device: ["cpu:fake", "cpu"])
    runners = tuple(SimpleNamespace(name=name) for name in ("task_heads", "native", "exact"))
    loaded = SimpleNamespace(probe_items=lambda: [SimpleNamespace(tokens=3)])

    def key_with(identity, accelerator):
        placement = SimpleNamespace(accelerator=accelerator, device=device)
        spec = SimpleNamespace(dtype="auto")
        model = SimpleNamespace(compute_dtype=None, libraries=())
        return forward_cost_key(identity, runners, spec, placement, {}, loaded, None, model)

    found = key_with("c" * 64, named)
    assert found is not None
    assert (found.hardware, found.probe_tokens, found.profile) == (
        ("cpu:fake", "Fake CPU"),
        (3,),
        "exact",
    )
    assert key_with("", named) is None
    assert key_with("c" * 64, SimpleNamespace(hardware_keys=broken)) is None


def test_the_key_names_the_libraries_the_engine_model_declares():
    from vllm_srun.compose.probe_cache import runtime_libraries
    from vllm_srun.engines.native import NativeEncoder
    from vllm_srun.engines.onnxruntime import OnnxEncoder

    declared = SimpleNamespace(libraries=("onnxruntime", "torch"))
    assert runtime_libraries(declared) == ("onnxruntime", "torch", "transformers", "vllm-srun")
    assert runtime_libraries(SimpleNamespace(libraries=())) == (
        "torch",
        "transformers",
        "vllm-srun",
    )
    # the built-in engines' models declare what the scan of their attributes used to find
    assert NativeEncoder.libraries == ("torch", "transformers")
    assert OnnxEncoder.libraries == ("onnxruntime",)
