"""Golden self-checks: key selection, comparison, recording, and the real built-in models."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pytest

from vllm_srun import cli
from vllm_srun.compose.golden import (
    GoldenError,
    GoldenResult,
    check,
    device_class,
    difference,
    malformation,
    record,
    reference_for,
    reference_keys,
    run_requests,
    select_key,
)
from vllm_srun.compose.loader import LoadOptions, load_model
from vllm_srun.plugins import GoldenReference, read_reference_file
from vllm_srun.plugins.golden import write_reference_answers
from vllm_srun.plugins.host import Catalog, load_catalog

from .fixtures import write_task_package

REQUESTS = (
    {"surface": "embeddings", "body": {"input": ["hello golden", "a second text"]}},
    {"surface": "rerank", "body": {"query": "hello", "documents": ["golden", "silver"]}},
)
BUILT_IN = ("sentence-transformers/all-MiniLM-L6-v2", "arcjet/rampart-pii")


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog({})


@pytest.fixture(scope="module")
def pooled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_task_package(tmp_path_factory.mktemp("golden"), "bert", "pooled")


@pytest.fixture(scope="module")
def served(pooled: Path, catalog: Catalog):
    return load_model(pooled, LoadOptions(device="cpu"), catalog=catalog)


def answers_of(model, requests=REQUESTS) -> list[dict]:
    return [
        {k: v for k, v in model.answer(r["surface"], r["body"]).items() if k != "model"}
        for r in requests
    ]


def with_reference(catalog: Catalog, reference: GoldenReference) -> Catalog:
    layers = {**catalog.layers}
    layers["golden_references"] = {**layers["golden_references"], reference.model: reference}
    return dataclasses.replace(catalog, layers=layers)


def nudge(answer: dict, delta: float) -> dict:
    """A copy of an embeddings answer with component 3 of item 0 moved by ``delta``."""
    changed = json.loads(json.dumps(answer))
    changed["data"][0]["embedding"][3] += delta
    return changed


# -- comparison ------------------------------------------------------------------------------
def test_device_class_is_the_key_before_the_first_colon_or_at():
    assert device_class("cpu:x86_64:avx512:bf16_native") == "cpu"
    assert device_class("cuda@bfloat16") == "cuda"
    assert device_class("rocm:gfx942@float16") == "rocm"
    assert device_class("cpu") == "cpu"


def test_difference_names_the_path_the_values_and_respects_the_tolerance():
    recorded = {"data": [{"embedding": [0.5, 0.25], "label": "EMAIL", "ok": True}]}
    assert difference(recorded, recorded, 0.0) is None
    close = {"data": [{"embedding": [0.5 + 9e-6, 0.25], "label": "EMAIL", "ok": True}]}
    assert difference(close, recorded, 1e-5) is None
    assert difference(close, recorded, 1e-6) == (
        f"data[0].embedding[0]: got {0.5 + 9e-6!r}, recorded 0.5"
    )
    label = {"data": [{"embedding": [0.5, 0.25], "label": "PHONE", "ok": True}]}
    assert difference(label, recorded, 1.0) == "data[0].label: got 'PHONE', recorded 'EMAIL'"
    short = {"data": [{"embedding": [0.5], "label": "EMAIL", "ok": True}]}
    assert difference(short, recorded, 1.0) == "data[0].embedding: got 1 items, recorded 2"
    flipped = {"data": [{"embedding": [0.5, 0.25], "label": "EMAIL", "ok": 1}]}
    assert difference(flipped, recorded, 1.0) == "data[0].ok: got 1, recorded True"
    renamed = {"data": [{"embedding": [0.5, 0.25], "tag": "EMAIL", "ok": True}]}
    assert difference(renamed, recorded, 1.0) == (
        "data[0]: keys differ (missing ['label'], extra ['tag'])"
    )
    assert difference({"x": float("nan")}, {"x": 0.5}, 1.0) == "x: got nan, recorded 0.5"


def test_difference_at_the_top_level_and_across_shapes():
    assert difference(0.5, 0.75, 0.1) == "the answer: got 0.5, recorded 0.75"
    assert difference(0.5, 0.55, 0.1) is None
    # a missing key alone, an extra key alone
    assert difference({"a": 1}, {"a": 1, "b": 2}, 0.0) == (
        "the answer: keys differ (missing ['b'], extra [])"
    )
    assert difference({"a": 1, "c": 3}, {"a": 1}, 0.0) == (
        "the answer: keys differ (missing [], extra ['c'])"
    )
    # an object where a list was recorded, a list where a string was recorded
    assert difference({"a": 1}, ["a"], 0.0) == "the answer: got {'a': 1}, recorded ['a']"
    assert difference(["x"], "x", 0.0) == "the answer: got ['x'], recorded 'x'"
    assert difference("x", ["x"], 0.0) == "the answer: got 'x', recorded ['x']"
    assert difference(["x"], {"0": "x"}, 0.0) == "the answer: got ['x'], recorded {'0': 'x'}"
    # a tuple and a list of the same items agree (answers read back from JSON are lists)
    assert difference((0.5, "a"), [0.5, "a"], 0.0) is None


def test_malformation_finds_non_finite_numbers_and_item_errors():
    assert malformation({"data": [{"embedding": [0.1, 0.2]}]}) is None
    assert malformation({"data": [{"embedding": [0.1, float("inf")]}]}) == (
        "data[0].embedding[1] is inf"
    )
    item_error = {"results": [{"index": 0, "error": {"code": "invalid_input"}}]}
    assert malformation(item_error) == "results[0] failed with {'code': 'invalid_input'}"
    assert malformation(float("nan")) == "the answer is nan"
    assert malformation([0.5, float("-inf")]) == "[1] is -inf"
    # a top-level "error" key is an answer's field, not an item error
    assert malformation({"error": "none", "data": [1.0]}) is None


# -- reference keys --------------------------------------------------------------------------
def test_reference_for_returns_only_golden_references(catalog):
    reference = GoldenReference("fake/ref", REQUESTS, {}, {"cpu": 1e-5})
    with_ref = with_reference(catalog, reference)
    assert reference_for(with_ref, "fake/ref") is reference
    assert reference_for(with_ref, None) is None
    assert reference_for(with_ref, "fake/other") is None
    layers = {**with_ref.layers}
    layers["golden_references"] = {**layers["golden_references"], "fake/junk": {"cpu": []}}
    assert reference_for(dataclasses.replace(catalog, layers=layers), "fake/junk") is None


def test_the_most_specific_recorded_key_is_selected_and_dtype_keys_only_at_their_dtype(served):
    acc, device = served.placement.accelerator, served.placement.device
    specific = acc.reference_keys(device, "auto")[0]
    reference = GoldenReference(
        "fake/model",
        REQUESTS,
        {"cpu": ({}, {}), specific: ({}, {}), "cpu@bfloat16": ({}, {})},
        {"cpu": 1e-5},
    )
    assert specific.startswith("cpu:") and specific != "cpu"
    assert select_key(reference, acc.reference_keys(device, "auto")) == specific
    assert select_key(reference, acc.reference_keys(device, "bfloat16")) == "cpu@bfloat16"
    assert select_key(reference, acc.reference_keys(device, "float32")) is None
    only_dtype = GoldenReference("fake/model", REQUESTS, {"cpu@bfloat16": ({}, {})}, {})
    assert select_key(only_dtype, acc.reference_keys(device, "auto")) is None
    assert select_key(None, ["cpu"]) is None


# -- check -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("request_", "what"),
    [
        ("embeddings", "request 2 (None)"),
        ({"body": {"input": "x"}}, "request 2 (None)"),
        ({"surface": 3, "body": {"input": "x"}}, "request 2 (3)"),
        ({"surface": "embeddings", "body": "hello"}, "request 2 (embeddings)"),
        ({"surface": "embeddings"}, "request 2 (embeddings)"),
    ],
)
def test_a_request_that_is_not_surface_and_body_is_malformed(served, request_, what):
    with pytest.raises(GoldenError) as raised:
        run_requests(served, [REQUESTS[0], request_])
    assert str(raised.value) == (
        f"golden answers are malformed: {what} is not {{surface, body}}; fix the golden reference"
    )


def test_a_refused_golden_request_names_the_request_and_the_error(served):
    with pytest.raises(GoldenError) as raised:
        run_requests(served, [{"surface": "classify", "body": {"input": "x"}}])
    assert str(raised.value) == (
        "golden answers are malformed: request 1 (classify) was refused "
        "(unsupported_surface: this model serves embeddings, rerank, not classify)"
    )


def test_run_requests_answers_each_request_without_the_model_name(served):
    answers = run_requests(served, list(REQUESTS))
    assert [sorted(a) for a in answers] == [["data", "object", "usage"], ["results", "usage"]]
    assert answers == answers_of(served)


def test_a_recorded_reference_that_agrees_is_matched(served, catalog):
    reference = GoldenReference(
        "fake/pooled", REQUESTS, {"cpu": tuple(answers_of(served))}, {"cpu": 1e-5}
    )
    model = dataclasses.replace(served, identity="fake/pooled")
    result = check(model, with_reference(catalog, reference))
    assert result == GoldenResult("matched", checked=2, matched=2, reference="cpu")
    assert result.card() == {  # counts of golden cases (wire contract 2.3 GoldenStatus)
        "status": "matched",
        "checked": 2,
        "matched": 2,
        "reference": "cpu",
    }


def test_a_mismatch_fails_with_request_path_values_and_tolerance(served, catalog):
    answers = answers_of(served)
    recorded = nudge(answers[0], 2e-5)
    reference = GoldenReference(
        "fake/pooled", REQUESTS, {"cpu": (recorded, answers[1])}, {"cpu": 1e-5}
    )
    result = check(
        dataclasses.replace(served, identity="fake/pooled"), with_reference(catalog, reference)
    )
    assert (result.status, result.checked, result.matched, result.reference) == (
        "failed",
        2,
        1,  # the second request agreed
        "cpu",
    )
    got = answers[0]["data"][0]["embedding"][3]
    assert result.reason == (
        "golden self-check failed against cpu: request 1 (embeddings) differs at "
        f"data[0].embedding[3]: got {got!r}, recorded {recorded['data'][0]['embedding'][3]!r} "
        "(tolerance 1e-05 for cpu)"
    )
    # within the tolerance the same nudge passes
    small = nudge(answers[0], 5e-6)
    passing = GoldenReference("fake/pooled", REQUESTS, {"cpu": (small, answers[1])}, {"cpu": 1e-5})
    model = dataclasses.replace(served, identity="fake/pooled")
    assert check(model, with_reference(catalog, passing)).status == "matched"


def test_a_non_finite_answer_fails_against_a_recorded_key_as_non_finite(served, catalog):
    answers = answers_of(served)
    real_answer = served.answer

    def broken(surface, body):
        answer = real_answer(surface, body)
        if surface == "embeddings":
            answer["data"][1]["embedding"][0] = float("nan")
        return answer

    model = dataclasses.replace(served, identity="fake/pooled")
    model.answer = broken  # type: ignore[method-assign]
    reference = GoldenReference("fake/pooled", REQUESTS, {"cpu": tuple(answers)}, {"cpu": 1e-5})
    result = check(model, with_reference(catalog, reference))
    assert result.reason == (
        "golden self-check failed against cpu: request 1 (embeddings) differs at "
        "data[1].embedding[0] is nan (tolerance 1e-05 for cpu)"
    )


def test_a_mismatching_specific_key_never_falls_back_to_the_device_class(served, catalog):
    answers = answers_of(served)
    specific = reference_keys(served)[0]
    reference = GoldenReference(
        "fake/pooled",
        REQUESTS,
        {specific: (nudge(answers[0], 0.5), answers[1]), "cpu": tuple(answers)},
        {"cpu": 1e-5},
    )
    model = dataclasses.replace(served, identity="fake/pooled")
    result = check(model, with_reference(catalog, reference))
    assert result.status == "failed" and result.reference == specific


def test_a_device_without_recorded_answers_is_unverified_without_a_reason(served, catalog):
    answers = answers_of(served)
    reference = GoldenReference(
        "fake/pooled", REQUESTS, {"cuda:sm_90": tuple(answers)}, {"cuda": 1e-3}
    )
    model = dataclasses.replace(served, identity="fake/pooled")
    result = check(model, with_reference(catalog, reference))
    assert result == GoldenResult("unverified", checked=2, matched=0, reference="", reason=None)
    # a package that is not built in: the family's generic requests, well formed and repeatable
    local = check(served, catalog)
    assert local == GoldenResult(
        "unverified", checked=local.checked, matched=0, reference="", reason=None
    )
    assert local.checked > 0  # the family's generic requests ran


@pytest.fixture(scope="module")
def served_bf16(pooled: Path, catalog: Catalog):
    return load_model(pooled, LoadOptions(device="cpu", dtype="bfloat16"), catalog=catalog)


@pytest.mark.parametrize(("factor", "status"), [(0.99, "matched"), (1.01, "failed")])
def test_a_dtype_key_compares_at_its_device_class_tolerance(served_bf16, catalog, factor, status):
    """Answers recorded under ``cpu@bfloat16`` are compared at the ``cpu`` tolerance (0.01
    here, not the ``cuda`` one): a deviation just below it matches, just above it fails."""
    assert reference_keys(served_bf16)[-1] == "cpu@bfloat16"
    answers = answers_of(served_bf16)
    recorded = nudge(answers[0], 0.01 * factor)
    reference = GoldenReference(
        "fake/pooled",
        REQUESTS,
        {"cpu@bfloat16": (recorded, answers[1]), "cpu": (nudge(answers[0], 0.5), answers[1])},
        {"cpu": 0.01, "cuda": 0.5},
    )
    model = dataclasses.replace(served_bf16, identity="fake/pooled")
    result = check(model, with_reference(catalog, reference))
    assert (result.status, result.checked, result.reference) == (status, 2, "cpu@bfloat16")
    if status == "matched":
        assert (result.matched, result.reason) == (2, None)
    else:
        got = answers[0]["data"][0]["embedding"][3]
        assert result.matched == 1
        assert result.reason == (
            "golden self-check failed against cpu@bfloat16: request 1 (embeddings) differs at "
            f"data[0].embedding[3]: got {got!r}, recorded "
            f"{recorded['data'][0]['embedding'][3]!r} (tolerance 0.01 for cpu)"
        )


@pytest.mark.parametrize(("delta", "status"), [(9e-6, "matched"), (1.1e-5, "failed")])
def test_a_recorded_key_without_a_file_tolerance_uses_the_accelerators(
    served, catalog, delta, status
):
    """The file sets only cuda's tolerance: the cpu key is held to the cpu accelerator's
    declared 1e-5, not to cuda's 1e-3 nor refused."""
    recorded = [nudge(answers_of(served)[0], delta), *answers_of(served)[1:]]
    reference = GoldenReference("fake/pooled", REQUESTS, {"cpu": tuple(recorded)}, {"cuda": 1e-3})
    model = dataclasses.replace(served, identity="fake/pooled")
    result = check(model, with_reference(catalog, reference))
    assert (result.status, result.checked, result.reference) == (status, 2, "cpu")
    assert result.matched == (2 if status == "matched" else 1)
    if status == "failed":
        assert result.reason is not None and result.reason.endswith("(tolerance 1e-05 for cpu)")


def test_a_model_without_golden_requests_is_unverified_and_unchecked(served, catalog):
    reference = GoldenReference("fake/pooled", (), {"cuda": ()}, {"cuda": 1e-3})
    model = dataclasses.replace(served, identity="fake/pooled")
    result = check(model, with_reference(catalog, reference))
    assert result == GoldenResult("unverified", checked=0, matched=0, reference="", reason=None)
    assert result.card() == {
        "status": "unverified",
        "checked": 0,
        "matched": 0,
        "reference": "",
    }


def test_an_unverified_model_that_answers_differently_twice_fails(served, catalog):
    calls = {"n": 0}
    real_answer = served.answer

    def drifting(surface, body):
        calls["n"] += 1
        answer = real_answer(surface, body)
        if surface == "embeddings" and calls["n"] > len(served.family.golden(served.package)):
            answer = {**answer, "data": [nudge(answer, 1e-7)["data"][0], *answer["data"][1:]]}
        return answer

    model = dataclasses.replace(served)
    model.answer = drifting  # type: ignore[method-assign]
    result = check(model, catalog)
    assert result.status == "failed" and result.reference == ""
    assert result.reason is not None
    first = served.family.golden(served.package)[0]
    value = real_answer(first["surface"], first["body"])["data"][0]["embedding"][3]
    assert result.reason == (
        "golden answers are not deterministic: request 1 (embeddings) answered differently "
        f"on a second run at data[0].embedding[3]: got {value + 1e-7!r}, first {value!r}"
    )


def test_a_model_with_non_finite_answers_fails_as_malformed(served, catalog):
    real_answer = served.answer

    def broken(surface, body):
        answer = real_answer(surface, body)
        if surface == "embeddings":
            answer["data"][1]["embedding"][0] = float("nan")
        return answer

    model = dataclasses.replace(served)
    model.answer = broken  # type: ignore[method-assign]
    result = check(model, catalog)
    assert result.status == "failed"
    assert result.reason == (
        "golden answers are malformed: request 1 (embeddings): data[1].embedding[0] is nan"
    )


def test_an_input_over_the_limit_in_a_golden_request_fails_as_malformed(served, catalog):
    long = " ".join(["golden"] * 60)  # over the package's 48 tokens
    requests = (REQUESTS[0], {"surface": "embeddings", "body": {"input": ["fine", long]}})
    reference = GoldenReference("fake/pooled", requests, {}, {"cpu": 1e-5})
    registered = with_reference(catalog, reference)
    model = dataclasses.replace(served, identity="fake/pooled")
    result = check(model, registered)
    assert (result.status, result.checked, result.matched, result.reference) == (
        "failed",
        2,
        0,
        "",
    )
    assert result.reason == (
        "golden answers are malformed: request 2 (embeddings): data[1] failed with "
        "'max_length_exceeded'"
    )
    # with --max-model-len set, the reason says it may be what is too small
    limited = dataclasses.replace(model, spec=dataclasses.replace(model.spec, max_model_len=48))
    assert check(limited, registered).reason == (
        "golden answers are malformed; max_model_len 48 may be below what the model's own "
        "check questions need (request 2 (embeddings): data[1] failed with "
        "'max_length_exceeded'); raise max_model_len"
    )


# -- record ----------------------------------------------------------------------------------
def test_golden_record_writes_this_machines_key_and_the_check_then_matches(
    pooled, served, catalog, tmp_path
):
    path = tmp_path / "fake.json"
    path.write_text(
        json.dumps(
            {"model": "fake/pooled", "tolerances": {}, "requests": list(REQUESTS), "answers": {}}
        )
    )
    out = io.StringIO()
    argv = ["golden", "record", str(pooled), "--device", "cpu", "--name", "fake/pooled"]
    assert (
        cli.run_golden_record(
            cli.build_parser().parse_args([*argv, "--file", str(path)]), catalog, out
        )
        == 0
    )
    key = reference_keys(served)[0]
    assert out.getvalue() == (
        f"recorded 2 golden answers of fake/pooled under {key} (tolerance 1e-05) in {path}\n"
    )
    reference = read_reference_file(path)
    assert reference.tolerances == {"cpu": 1e-5}
    assert list(reference.answers) == [key]
    assert list(reference.answers[key]) == answers_of(served)
    model = dataclasses.replace(served, identity="fake/pooled")
    assert check(model, with_reference(catalog, reference)).status == "matched"
    # a second recording replaces the key's answers and keeps the file's tolerance
    write_reference_answers(path, key, answers_of(served), ("cpu", 0.5))
    assert read_reference_file(path).tolerances == {"cpu": 1e-5}


def reference_file(path: Path, model: str = "fake/pooled") -> Path:
    path.write_text(
        json.dumps({"model": model, "tolerances": {}, "requests": list(REQUESTS), "answers": {}})
    )
    return path


def test_record_without_a_file_writes_the_registered_reference_file(served, catalog, tmp_path):
    path = reference_file(tmp_path / "fake.json")
    registered = with_reference(catalog, read_reference_file(path))
    recorded = record(served, registered, "fake/pooled")
    key = reference_keys(served)[0]
    assert (recorded.model, recorded.key, recorded.path) == ("fake/pooled", key, path)
    assert (recorded.answers, recorded.tolerance) == (2, 1e-5)
    written = json.loads(path.read_text())
    assert written["tolerances"] == {"cpu": 1e-5}
    assert written["answers"] == {key: answers_of(served)}


def test_record_refuses_an_identity_without_a_reference_file(served, catalog, tmp_path):
    message = (
        "no golden reference file is registered for fake/pooled; write one with its requests "
        "(model, tolerances, requests, answers) and pass it with --file"
    )
    with pytest.raises(GoldenError) as raised:
        record(served, catalog, "fake/pooled")
    assert str(raised.value) == message
    in_memory = GoldenReference("fake/pooled", REQUESTS, {}, {"cpu": 1e-5})  # no source file
    with pytest.raises(GoldenError) as raised:
        record(served, with_reference(catalog, in_memory), "fake/pooled")
    assert str(raised.value) == message


def test_record_refuses_a_file_of_another_model(served, catalog, tmp_path):
    path = reference_file(tmp_path / "other.json", model="fake/other")
    with pytest.raises(GoldenError) as raised:
        record(served, catalog, "fake/pooled", path)
    assert str(raised.value) == f"{path} holds the golden reference of fake/other, not fake/pooled"
    assert json.loads(path.read_text())["answers"] == {}  # nothing written


class TpuKeys:
    """An accelerator of a device class the reference file has no tolerance for."""

    golden_tolerance = 0.002

    def reference_keys(self, device, dtype="auto"):
        return ["tpu:v5e", "tpu"]


def test_record_on_a_new_device_class_writes_the_accelerators_tolerance(served, catalog, tmp_path):
    path = reference_file(tmp_path / "fake.json")
    model = dataclasses.replace(
        served, placement=dataclasses.replace(served.placement, accelerator=TpuKeys())
    )
    recorded = record(model, catalog, "fake/pooled", path)
    assert (recorded.key, recorded.tolerance) == ("tpu:v5e", 0.002)
    written = json.loads(path.read_text())
    assert written["tolerances"] == {"tpu": 0.002}
    assert list(written["answers"]) == ["tpu:v5e"]


def test_golden_record_needs_a_name_for_a_package_that_is_not_built_in(pooled, catalog, capsys):
    args = cli.build_parser().parse_args(["golden", "record", str(pooled), "--device", "cpu"])
    assert cli.run_golden_record(args, catalog, io.StringIO()) == 1
    assert capsys.readouterr().err == (
        f"vllm-srun golden record: {pooled} is not a built-in model; pass --name MODEL_ID "
        "to say whose golden reference to update\n"
    )


# -- the built-in models ---------------------------------------------------------------------
def test_the_built_in_references_are_registered_with_recorded_cpu_answers(catalog):
    references = catalog.layer("golden_references")
    for name in BUILT_IN:
        reference = references[name]
        assert reference.source is not None and reference.source.is_file()
        assert reference.tolerances["cpu"] == 1e-5
        assert "cpu:x86_64:avx512:bf16_native" in reference.answers
    minilm = references[BUILT_IN[0]]
    assert [r["surface"] for r in minilm.requests] == ["embeddings"] * 4
    assert any("dimensions" in r["body"] for r in minilm.requests)
    rampart = references[BUILT_IN[1]]
    [first] = rampart.answers["cpu:x86_64:avx512:bf16_native"][0]["results"]
    assert [(s["text"], s["label"]) for s in first["spans"]] == [
        ("Dana", "GIVEN_NAME"),
        ("Whitfield", "SURNAME"),
        ("dana.whitfield@example.org", "EMAIL"),
        ("212-555-0147", "PHONE"),
    ]


@pytest.mark.parametrize("name", BUILT_IN)
def test_the_built_in_models_match_their_golden_answers_here(name, catalog):
    model = load_model(name, LoadOptions(offline=True), catalog=catalog)
    assert model.identity == name
    keys = reference_keys(model)
    recorded = select_key(catalog.layer("golden_references")[name], keys)
    result = check(model, catalog)
    cases = len(catalog.layer("golden_references")[name].requests)
    if recorded is None:  # a machine no reference was recorded on
        assert result == GoldenResult("unverified", cases, 0, "", None)
    else:
        assert result == GoldenResult("matched", cases, cases, recorded, None), result.reason


def test_the_golden_dtype_is_the_released_one_unless_an_exact_model_runs_another():
    from types import SimpleNamespace

    from vllm_srun.compose.golden import golden_dtype
    from vllm_srun.plugins import EXACT, MAX_SPEED

    def served(dtype: str, profile: object, released: str = "float32") -> SimpleNamespace:
        spec = SimpleNamespace(dtype=dtype, released_dtype=released)
        return SimpleNamespace(spec=spec, profile=profile)

    assert golden_dtype(served("auto", EXACT)) == "auto"
    assert golden_dtype(served("float32", EXACT)) == "auto"  # pinned to the released one
    assert golden_dtype(served("bfloat16", EXACT)) == "bfloat16"
    assert golden_dtype(served("bfloat16", EXACT, released="bfloat16")) == "auto"
    # approximate: numbers measured against the released precision's answers
    assert golden_dtype(served("bfloat16", MAX_SPEED)) == "auto"
    assert golden_dtype(served("float32", MAX_SPEED)) == "auto"
