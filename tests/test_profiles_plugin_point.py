"""Profiles as a plugin point: engines declare them, families may refuse them, the load
and the requests honour the choice, and a third party adds one without the runtime
knowing its name."""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures import write_task_package
from vllm_srun.compose.loader import LoadOptions, load_model
from vllm_srun.errors import LoadError
from vllm_srun.plugins import BATCHING, EXACT, MAX_SPEED, DeviceInfo, ModelSpec, Profile, hookimpl
from vllm_srun.plugins.host import build_catalog, discover
from vllm_srun.plugins.host.discovery import DiscoveredPlugin
from vllm_srun.plugins.kernel import Kernel, select_kernel
from vllm_srun.plugins.profiles import profile_violations

BUILT_IN = ["cpu", "native", "onnxruntime", "task_heads"]

LOW_POWER = Profile(
    "low_power",
    "approximate",
    "Third-party: one thread, cross-request batching within 1e-3.",
    batch_tolerance=1e-3,
)


def _third_party_catalog() -> object:
    """The built-in plugins plus one that registers a native engine subclass declaring
    ``low_power`` under its own name (``quiet``)."""
    from vllm_srun.engines.native import NativeEngine

    class QuietEngine(NativeEngine):
        name = "quiet"
        auto_priority = None
        profiles = (LOW_POWER,)

    module = types.SimpleNamespace(
        register_engines=hookimpl(lambda register: register(QuietEngine()))
    )
    return build_catalog(
        [*discover({}, only=BUILT_IN), DiscoveredPlugin("quiet", "quiet", "quiet", "1", module)]
    )


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_task_package(tmp_path_factory.mktemp("bert"), "bert", "sequence")


def test_the_standard_profiles_conform_and_a_broken_one_is_named():
    assert [profile_violations(p) for p in (EXACT, BATCHING, MAX_SPEED, LOW_POWER)] == [[]] * 4
    broken = Profile("Exact!", "exact", "x", batch_tolerance=1e-5, kernels="fastest")
    assert profile_violations(broken) == [
        "profile name 'Exact!' must match ^[a-z][a-z0-9_]*$",
        "profile Exact!: exact numerics need batch_tolerance 0.0 and bit_exact kernels",
    ]


def test_max_speed_selects_the_fastest_kernel_and_exact_the_reference():
    eager = Kernel("attention", "eager", "eager", bit_exact=True, reference=True)
    sdpa = Kernel("attention", "sdpa", "sdpa", bit_exact=False)
    assert select_kernel([eager, sdpa], "attention", "cpu", "exact") is eager
    assert select_kernel([eager, sdpa], "attention", "cpu", "fastest") is sdpa
    assert select_kernel([eager], "attention", "cpu", "fastest") is eager


def test_native_runs_max_speed_with_sdpa_and_the_others_with_eager(bert):
    catalog = build_catalog(discover({}, only=BUILT_IN))
    cards = {
        profile: load_model(
            str(bert), LoadOptions(profile=profile, engine="native"), catalog=catalog
        ).card()
        for profile in ("exact", "batching", "max_speed")
    }
    assert {p: (c["attention"], c["numerics"]) for p, c in cards.items()} == {
        "exact": ("eager", "exact"),
        "batching": ("eager", "approximate"),
        "max_speed": ("sdpa", "approximate"),
    }
    assert cards["batching"]["batch_invariance"]["method"] == "cross_request"
    assert [p["name"] for p in cards["exact"]["profiles"]] == ["exact", "batching", "max_speed"]
    # a classifier head is not vouched for bfloat16: float32 under every profile
    assert {c["dtype"] for c in cards.values()} == {"float32"}


def test_native_ranks_first_under_max_speed_only_where_it_computes_bfloat16():
    from vllm_srun.engines.native import NativeEngine, computes_bfloat16
    from vllm_srun.engines.onnxruntime import OnnxRuntimeEngine

    spec = ModelSpec(
        package=Path("."),
        architecture="BertModel",
        model_type="bert",
        task="encoder",
        profile="max_speed",
        bf16_tolerant=True,
    )
    native_bf16 = DeviceInfo("cpu", None, "cpu", None, None, {"bf16": "bf16_native"})
    emulated = DeviceInfo("cpu", None, "cpu", None, None, {"bf16": "bf16_emulated"})
    engines = (NativeEngine(), OnnxRuntimeEngine())

    def ranks(spec: ModelSpec, device: DeviceInfo) -> dict[str, int | None]:
        return {engine.name: engine.auto_rank(spec, device) for engine in engines}

    assert computes_bfloat16(spec, native_bf16)
    assert ranks(spec, native_bf16) == {"native": 4, "onnxruntime": 5}
    assert ranks(spec, emulated) == {"native": 10, "onnxruntime": 5}
    for other in (
        dataclasses.replace(spec, bf16_tolerant=False),  # the family does not vouch
        dataclasses.replace(spec, dtype="float32"),  # the operator chose a dtype
        dataclasses.replace(spec, released_dtype="float16"),
    ):
        assert not computes_bfloat16(other, native_bf16)
        assert ranks(other, native_bf16) == {"native": 10, "onnxruntime": 5}
    exact = dataclasses.replace(spec, profile="exact")
    assert not computes_bfloat16(exact, native_bf16)
    assert ranks(exact, native_bf16) == {"native": 10, "onnxruntime": 20}


def test_a_profile_no_engine_declares_is_refused_with_the_ones_that_exist(bert):
    catalog = build_catalog(discover({}, only=BUILT_IN))
    with pytest.raises(LoadError) as caught:
        load_model(str(bert), LoadOptions(profile="fast", engine="native"), catalog=catalog)
    assert str(caught.value) == (
        "engine native cannot run the model: it has no profile 'fast' (its profiles: exact, "
        "batching, max_speed); choose one of those with --profile or models-file `profile`, "
        "or install an engine that declares it"
    )


def test_a_third_party_engine_adds_a_profile(bert):
    catalog = _third_party_catalog()
    served = load_model(
        str(bert), LoadOptions(profile="low_power", engine="quiet"), catalog=catalog
    )
    card = served.card()
    assert (card["engine"], card["profile"], card["numerics"]) == (
        "quiet",
        "low_power",
        "approximate",
    )
    assert card["profiles"] == [LOW_POWER.card()]
    assert card["batch_invariance"]["tolerance"] == 1e-3
    assert served.limits().exact is None
    # the built-in engines do not declare it
    with pytest.raises(LoadError, match="native: it has no profile 'low_power'"):
        load_model(str(bert), LoadOptions(profile="low_power"), catalog=catalog)


def test_a_family_refusal_names_the_family_and_its_reason(bert, monkeypatch):
    catalog = build_catalog(discover({}, only=BUILT_IN))
    family = catalog.layer("families")["task_heads"]
    monkeypatch.setattr(
        type(family),
        "refuse_profile",
        lambda self, profile, spec: (
            "its token head was not measured" if profile != "exact" else None
        ),
    )
    with pytest.raises(LoadError) as caught:
        load_model(str(bert), LoadOptions(profile="max_speed", engine="native"), catalog=catalog)
    assert str(caught.value) == (
        "profile max_speed refused by family task_heads: its token head was not measured"
    )
    card = load_model(str(bert), LoadOptions(engine="native"), catalog=catalog).card()
    assert [p["name"] for p in card["profiles"]] == ["exact"]


def test_an_approximate_profile_batches_across_lengths(bert):
    """``batching`` pads rows of any length into one forward; ``exact`` never does."""
    catalog = build_catalog(discover({}, only=BUILT_IN))
    batching = load_model(str(bert), LoadOptions(profile="batching"), catalog=catalog)
    exact = load_model(str(bert), LoadOptions(profile="exact"), catalog=catalog)
    rows = exact.loaded.probe_items()
    assert len({r.tokens for r in rows}) == len(rows) > 1
    seen: list[int] = []
    for served in (batching, exact):
        original = served.loaded.run

        def counting(batch, original=original):
            seen.append(len(batch))
            return original(batch)

        served.loaded.run = counting  # type: ignore[method-assign]
        outputs = served.run_items(rows)
        assert all(isinstance(o, np.ndarray) and o.dtype == np.float32 for o in outputs)
        seen.append(-1)
    batching_forwards, exact_forwards = " ".join(map(str, seen)).split(" -1")[:2]
    assert batching_forwards.split() == [str(len(rows))]
    # exact: one forward per length, each filled up to 32 tokens with copies of its row
    assert len(exact_forwards.split()) == len(rows)
