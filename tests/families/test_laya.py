"""The laya family against the ``laya`` package itself, on tiny random checkpoints.

The checkpoints are built and saved by the package (``laya_reference.py``). Our answers
must equal the package's: the same token sequences and markers, and probabilities within
1e-5 for every question type, a question asked alone or with others, a state alone or
several in one request, against the package's ``system_one`` (one state per forward) and
``predict_batch`` (several states in one forward). Under ``exact`` a question's answer is
the same bits alone and in any batch. One ``vllm-srun serve`` of a checkpoint shows the
card and one HTTP answer per question type.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.registry.conftest import write_cache
from vllm_srun.compose.loader import LoadError, LoadOptions, ServedModel, load_model
from vllm_srun.compose.registry.verify import identity, is_loadable
from vllm_srun.families.laya import LayaFamily, checkpoint
from vllm_srun.families.laya.fixture import FIXTURE_REQUEST, write_fixture
from vllm_srun.families.laya.model import max_options
from vllm_srun.families.laya.sequences import build_sequence, question_head
from vllm_srun.plugins.decisions import parse_request
from vllm_srun.plugins.host import load_catalog
from vllm_srun.plugins.package import PackageError
from vllm_srun.plugins.testing import assert_conforms

from ..fixtures import write_task_package
from ..served import free_port, serving
from .laya_reference import (
    as_laya,
    largest_difference,
    load_agent,
    load_parallel_agent,
    reference,
    write_reference_checkpoint,
)

LONG = " ".join(["The parcel never arrived, support did not answer and I was charged twice."] * 60)
STATES: list[Any] = [
    "My card was charged twice for the same order",
    {"order": 42, "status": "late", "items": ["book", "lamp"], "note": "Délai, café, 注文"},
    ["hi, my parcel is late", "which order?", "order 42, the one with the lamp"] * 12,
    LONG,
    "An order whose text spells [MASK], the marker token",
    ["a short conversation", "in two turns"],
]
"""A text, an object and an array state (a conversation whose oldest turns do not fit), a
state far longer than the model reads, one that spells the mask token, and an array state
that fits whole."""

TEAMS = {
    "billing": "Payments, charges, refunds and invoices",
    "shipping": "Delivery, parcels and tracking",
    "technical": None,
}
QUESTIONS: dict[str, dict[str, Any]] = {
    "team": {"type": "choice", "instructions": "Which team should handle this?", "criteria": TEAMS},
    "pair": {
        "type": "choice",
        "instructions": "Refund or replace?",
        "choices": [{"key": "refund", "description": None}, {"key": "replace"}],
    },
    "seven": {
        "type": "choice",
        "instructions": "Which word fits best?",
        "criteria": {w: None for w in ("book", "lamp", "order", "card", "parcel", "café", "注文")},
    },
    "dozen": {
        "type": "choice",
        "instructions": {"ask": "Which level?", "of": "support"},
        "criteria": {f"tier {k}": f"level {k} of support" for k in range(12)},
    },
    "wide": {
        "type": "choice",
        "instructions": "Which of these many labels?",
        "criteria": {
            f"label{k}": "a long description of what this label covers" for k in range(60)
        },
    },
    "verbose": {
        "type": "choice",
        "instructions": "Which one?",
        "criteria": {"first": " ".join(["support"] * 80), "second": "the other one"},
    },
    "angry": {
        "type": "noul",
        "instructions": "Is the customer angry?",
        "criteria": {"false": "calm", "true": "angry"},
    },
    "late": {"type": "noul", "instructions": "Is the order late?", "criteria": {"true": "late"}},
    "plain": {"type": "noul", "instructions": "Is it about a parcel?"},
    "urgency": {
        "type": "score",
        "instructions": "How urgent is it?",
        "levels": ["not urgent", "soon", "today", "now"],
    },
    "ten": {
        "type": "score",
        "instructions": "How bad is it?",
        "levels": [f"{k} of 9" for k in range(10)],
    },
}
"""Every question type; options in each temperature bucket (2, 3-5, 6-10, 11+); structured
instructions; options cut to the head's budget (60 options); an option of more than 48
tokens; Noul with both sides, one side and no side described."""

TEMPERATURES = {
    "team": 0.7,  # choice:3-5
    "pair": 0.5,  # choice:2 ships 0.2, clamped to the package's lowest, 0.5
    "seven": 1.3,  # no choice:6-10: the choice temperature
    "dozen": 1.3,
    "wide": 1.3,
    "verbose": 0.5,
    "angry": 2.0,  # noul
    "late": 2.0,
    "plain": 2.0,
    "urgency": 1.6,  # score:3-5
    "ten": 0.8,  # score
}
"""The temperature each question is read at: the fixture configuration's."""

LAYA_SOURCES = Path(__file__).resolve().parents[2] / "families" / "laya"

TOLERANCE = 1e-5
"""How far our probabilities may be from the package's (the issue's bound)."""


@pytest.fixture(scope="module", autouse=True)
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The runtime's cache (where converted encoders go) in a folder of this module's."""
    cache = tmp_path_factory.mktemp("laya-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_SRUN_CACHE_DIR", str(cache))
        yield cache


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_reference_checkpoint(tmp_path_factory.mktemp("laya-reference"))


@pytest.fixture(scope="module")
def catalog() -> Any:
    return load_catalog({})


@pytest.fixture(scope="module")
def served(package: Path, catalog: Any) -> ServedModel:
    return load_model(package, LoadOptions(device="cpu", name="laya"), catalog=catalog)


@pytest.fixture(scope="module")
def agent(package: Path) -> Any:
    return load_agent(package)


def ask(served: ServedModel, states: list[Any], questions: dict[str, Any]) -> list[dict[str, Any]]:
    """Our answers to ``questions`` about each state, in one request (``states`` entries
    after the first)."""
    body: dict[str, Any] = {"state": states[0], "questions": questions}
    if len(states) > 1:
        body["states"] = [{"state": s, "questions": questions} for s in states[1:]]
    answered = served.answer("decisions", body)
    return [answered["answers"], *(entry["answers"] for entry in answered.get("states", []))]


# -- the checkpoint ----------------------------------------------------------------------
def test_detects_laya_checkpoints_and_only_them(package, tmp_path):
    family = LayaFamily()
    assert family.detect(package)
    assert family.detect(write_fixture(tmp_path, "parallel"))
    encoder = write_task_package(tmp_path, "modernbert", "sequence")
    assert not family.detect(encoder)
    assert not family.detect(tmp_path / "nowhere")
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "rl_agent_config.json").write_text('{"encoder": "x", "head_layers": 2}')
    assert not family.detect(tmp_path / "bare")  # no model.safetensors
    others = [f for f in load_catalog({}).layer("families").values() if f.name != "laya"]
    assert [f.name for f in others if f.detect(package)] == []


def test_reads_the_configuration_as_the_package_applies_it(package):
    config = checkpoint.read_config(package)
    assert (config.head_layers, config.max_len, config.head_max_len, config.layout) == (
        2,
        512,
        192,
        "sequential",
    )
    assert config.temperature == {"choice": 1.3, "score": 0.8, "noul": 2.0}
    assert config.by_options == {"choice:3-5": 0.7, "score:3-5": 1.6, "choice:2": 0.5}
    assert [config.temperature_for("choice", n) for n in (2, 3, 5, 6, 11)] == [
        0.5,
        0.7,
        0.7,
        1.3,
        1.3,
    ]
    assert [checkpoint.applied_temperature(v) for v in (True, "2.5", None, 9, 0.1, 1.7)] == [
        1.0,
        2.5,
        1.0,
        5.0,
        0.5,
        1.7,
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"temperature": [1.0, 1.0]}, "temperature must be a list of 3 numbers"),
        ({"option_layout": "diagonal"}, "option_layout must be sequential or parallel"),
        ({"head_layers": 3}, "lacks the head tensor head.layers.2.self_attn.in_proj_weight"),
        ({"head_layers": 1}, "holds more head layers than rl_agent_config.json's head_layers (1)"),
        ({"max_len": "512"}, "max_len must be an integer of at least 8"),
    ],
)
def test_verify_names_what_is_wrong(package, tmp_path, change, message):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(package, broken)
    settings = json.loads((broken / "rl_agent_config.json").read_text())
    (broken / "rl_agent_config.json").write_text(json.dumps({**settings, **change}))
    with pytest.raises(PackageError) as caught:
        LayaFamily().verify(broken)
    assert message in str(caught.value)


def test_a_checkpoint_without_a_file_fails_to_load_naming_it(package, tmp_path, catalog):
    import shutil

    broken = tmp_path / "no-encoder"
    shutil.copytree(package, broken)
    (broken / "encoder" / "config.json").unlink()
    with pytest.raises(LoadError) as caught:
        load_model(broken, LoadOptions(device="cpu"), catalog=catalog)
    assert (
        str(caught.value)
        == "laya cannot read the package: the checkpoint has no encoder/config.json"
    )


def test_the_family_conforms():
    report = assert_conforms("laya")
    assert not report.warnings


# -- sequences ---------------------------------------------------------------------------
def test_sequences_and_markers_are_the_package_layout(served, agent):
    tokens = served.loaded.tokens
    internal = {name: agent._to_internal(as_laya(q)) for name, q in QUESTIONS.items()}
    for state in STATES:
        theirs = agent._encode_state(state, list(QUESTIONS), internal)
        entry = parse_request({"state": state, "questions": QUESTIONS}).entries[0]
        state_ids = tokens.encode(entry.state_text())
        for question, item in zip(entry.questions, theirs, strict=True):
            head = question_head(tokens, question, 192)
            ours = build_sequence(tokens, head, state_ids, 512, keep_end=isinstance(state, list))
            assert list(ours.ids) == item["ids"], question.name
            assert list(ours.markers) == item["markers"], question.name
            assert ours.state_dropped == item["state_stats"]["state_tokens_dropped"]
    assert served.loaded.tokens.encode("a [MASK] b") == served.loaded.tokens.encode("a   b")


def test_request_text_spelling_a_special_token_is_text(served, agent):
    """As every family here reads request text (the package itself would read ``[SEP]`` in
    a state as its separator token)."""
    tokens = served.loaded.tokens
    assert tokens.sep_id not in tokens.encode("an order [SEP] with [CLS] in it")
    assert (
        agent.tok.sep_token_id in agent.tok("an order [SEP]", add_special_tokens=False)["input_ids"]
    )


def test_long_states_lose_their_tail_and_conversations_their_head(served):
    tokens = served.loaded.tokens
    entry = parse_request({"state": LONG, "questions": {"q": QUESTIONS["angry"]}}).entries[0]
    state_ids = tokens.encode(LONG)
    head = question_head(tokens, entry.questions[0], 192)
    first = build_sequence(tokens, head, state_ids, 512)
    last = build_sequence(tokens, head, state_ids, 512, keep_end=True)
    kept = 512 - len(head.ids) - 1
    assert first.ids[len(head.ids) : -1] == tuple(state_ids[:kept])
    assert last.ids[len(head.ids) : -1] == tuple(state_ids[-kept:])
    assert first.state_dropped == last.state_dropped == len(state_ids) - kept > 0


# -- answers -----------------------------------------------------------------------------
def test_probabilities_equal_the_package_alone_and_batched(served, agent):
    """Four ways to ask, each within 1e-5 of the package's two ways."""
    ours_alone = [
        {name: ask(served, [state], {name: q})[0][name] for name, q in QUESTIONS.items()}
        for state in STATES
    ]
    ours_state_alone = [ask(served, [state], QUESTIONS)[0] for state in STATES]
    ours_batched = ask(served, STATES, QUESTIONS)
    theirs_alone = [reference(agent, [state], QUESTIONS)[0] for state in STATES]
    theirs_batched = reference(agent, STATES, QUESTIONS)
    worst = 0.0
    for ours in (ours_alone, ours_state_alone, ours_batched):
        for theirs in (theirs_alone, theirs_batched):
            for mine, reference_answers in zip(ours, theirs, strict=True):
                for name in QUESTIONS:
                    assert mine[name]["type"] == QUESTIONS[name]["type"]
                    worst = max(worst, largest_difference(mine[name], reference_answers[name]))
                    if mine[name]["type"] == "choice":
                        assert mine[name]["choice"] == reference_answers[name]["choice"], name
    assert worst < TOLERANCE
    print(f"laya parity, sequential layout: largest probability difference {worst:.3g}")


def test_under_exact_a_question_is_the_same_bits_alone_and_in_any_batch(served):
    assert served.card()["profile"] == "exact"
    batched = ask(served, STATES, QUESTIONS)
    reordered = ask(served, STATES[::-1], dict(reversed(QUESTIONS.items())))[::-1]
    for index, state in enumerate(STATES):
        for name, question in QUESTIONS.items():
            alone = ask(served, [state], {name: question})[0][name]
            assert batched[index][name] == alone, (index, name)
            assert reordered[index][name] == alone, (index, name)


def test_each_question_reads_its_checkpoint_temperature(served):
    body = served.answer(
        "decisions",
        {"state": STATES[0], "questions": QUESTIONS, "options": {"return_meta": True}},
    )
    meta = body["meta"]
    assert (meta["method"], meta["readout"], meta["numerics"]) == (
        "laya",
        "option_markers",
        "exact",
    )
    assert {name: q["temperature"] for name, q in meta["questions"].items()} == TEMPERATURES
    assert meta["questions"]["angry"] == {
        "labels": ["false", "true"],
        "tokens": ["false: calm", "true: angry"],
        "temperature": 2.0,
    }
    assert meta["questions"]["plain"]["tokens"] == [
        "false: no, the statement does not hold",
        "true: yes, the statement holds",
    ]
    assert meta["questions"]["urgency"]["tokens"][0] == "level 0: not urgent"
    assert meta["questions"]["team"]["tokens"] == [
        "billing: Payments, charges, refunds and invoices",
        "shipping: Delivery, parcels and tracking",
        "technical",
    ]
    assert meta["state_tokens_dropped"] == {}
    long = served.answer(
        "decisions",
        {"state": LONG, "questions": {"q": QUESTIONS["angry"]}, "options": {"return_meta": True}},
    )
    assert long["meta"]["state_tokens_dropped"]["q"] > 0


def test_a_question_whose_markers_do_not_fit_fails_alone(served):
    crowded = {f"option number {k}": "a long description of the option" for k in range(200)}
    body = served.answer(
        "decisions",
        {
            "state": STATES[0],
            "questions": {
                "crowded": {"type": "choice", "instructions": "Which?", "criteria": crowded},
                "angry": QUESTIONS["angry"],
            },
        },
    )
    assert body["answers"]["crowded"] == {
        "type": "choice",
        "error": "max_length_exceeded",
        "message": "only 126 of the question's 200 options fit in this model's 512 tokens; "
        "ask with fewer or shorter options",
    }
    assert body["answers"]["angry"]["type"] == "noul"
    assert "noul" in body["answers"]["angry"]


def test_max_options_always_fit(served):
    """The card's max_options: that many options fit whatever their texts."""
    assert max_options(512, 192) == 126
    assert max_options(256, 192) == 62
    tokens = served.loaded.tokens
    state = tokens.encode(STATES[0])
    long_text = "words " * 100
    for count in (126, 127):
        criteria = {f"key{k} {long_text}": None for k in range(count)}
        question = (
            parse_request(
                {
                    "state": "s",
                    "questions": {
                        "q": {"type": "choice", "instructions": long_text, "criteria": criteria}
                    },
                }
            )
            .entries[0]
            .questions[0]
        )
        sequence = build_sequence(tokens, question_head(tokens, question, 192), state, 512)
        assert sequence.complete == (count == 126)


def test_the_card(served):
    card = served.card()
    assert (card["family"], card["engine"], card["surfaces"]) == ("laya", "native", ["decisions"])
    assert card["question_types"] == ["choice", "noul", "score"]
    assert card["limits"] == {
        "max_input_tokens": 512,
        "max_model_len": None,
        "model_max_tokens": 512,
        "min_options": 2,
        "max_options": 126,
        "min_levels": 2,
        "max_levels": 10,
    }
    assert card["decisions"] == {
        "method": "laya",
        "numerics": "exact",
        "readout": "option_markers",
        "shared_context": False,
        "calibrated": True,
        "temperature": {
            "choice": 1.3,
            "score": 0.8,
            "noul": 2.0,
            "choice:3-5": 0.7,
            "score:3-5": 1.6,
            "choice:2": 0.5,
        },
        "option_layout": "sequential",
        "max_len": 512,
        "head_max_len": 192,
        "option_tokens": 48,
        "state_overflow": "truncate",
        "shipped_temperatures": {
            "temperature": [1.3, 0.8, 2.0],
            "temperature_by_options": {"choice:3-5": 0.7, "score:3-5": 1.6, "choice:2": 0.2},
        },
    }
    weights = card["weights"]
    assert weights["format"] == "laya"
    assert weights["encoder"]["from"] == "model.safetensors (encoder.*), encoder/config.json"
    assert sorted(weights["sources"]) == [
        "encoder/config.json",
        "model.safetensors",
        "tokenizer/special_tokens_map.json",
        "tokenizer/tokenizer.json",
        "tokenizer/tokenizer_config.json",
    ]
    invariance = card["batch_invariance"]
    assert (invariance["method"], invariance["max_abs_deviation"]) == ("padded_to_edge", 0.0)


def test_max_model_len_shortens_the_sequences(package, catalog):
    short = load_model(
        package, LoadOptions(device="cpu", max_model_len=256, profile="batching"), catalog=catalog
    )
    card = short.card()
    assert (card["limits"]["max_input_tokens"], card["limits"]["max_model_len"]) == (256, 256)
    assert card["limits"]["max_options"] == 62
    body = short.answer(
        "decisions",
        {"state": LONG, "questions": {"q": QUESTIONS["angry"]}, "options": {"return_meta": True}},
    )
    assert body["usage"]["input_tokens"] == 256
    with pytest.raises(LoadError, match="max_model_len 513 is above the model's limit"):
        load_model(package, LoadOptions(device="cpu", max_model_len=513), catalog=catalog)


def test_the_family_fixture_reads_as_the_package_reads_it(tmp_path, catalog):
    """The family's own fixture writer and the package agree on the format."""
    fixture = write_fixture(tmp_path)
    ours = load_model(fixture, LoadOptions(device="cpu", profile="batching"), catalog=catalog)
    answers = ours.answer("decisions", FIXTURE_REQUEST)["answers"]
    theirs = reference(
        load_agent(fixture), [FIXTURE_REQUEST["state"]], FIXTURE_REQUEST["questions"]
    )[0]
    assert max(largest_difference(answers[n], theirs[n]) for n in answers) < TOLERANCE


# -- ONNX Runtime --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def onnx(package: Path, catalog: Any) -> ServedModel:
    options = LoadOptions(device="cpu", name="laya-onnx", engine="onnxruntime")
    return load_model(package, options, catalog=catalog)


def test_on_onnx_runtime_probabilities_equal_the_package_alone_and_batched(onnx, agent):
    """The encoder exported by optimum (cached by its weights' digest), the head as on native."""
    assert (onnx.card()["engine"], onnx.card()["batch_invariance"]["method"]) == (
        "onnxruntime",
        "padded_to_edge",
    )
    ours_alone = [
        {name: ask(onnx, [state], {name: q})[0][name] for name, q in QUESTIONS.items()}
        for state in STATES
    ]
    ours_batched = ask(onnx, STATES, QUESTIONS)
    assert ours_alone == ours_batched  # exact: the same bits
    theirs_alone = [reference(agent, [state], QUESTIONS)[0] for state in STATES]
    theirs_batched = reference(agent, STATES, QUESTIONS)
    worst = 0.0
    for theirs in (theirs_alone, theirs_batched):
        for mine, reference_answers in zip(ours_batched, theirs, strict=True):
            for name in QUESTIONS:
                worst = max(worst, largest_difference(mine[name], reference_answers[name]))
    assert worst < TOLERANCE
    print(f"laya parity, sequential layout on onnxruntime: largest difference {worst:.3g}")


# -- the parallel layout -------------------------------------------------------------------
@pytest.fixture(scope="module")
def parallel_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_reference_checkpoint(tmp_path_factory.mktemp("laya-parallel"), "parallel")


@pytest.fixture(scope="module")
def parallel(parallel_package: Path, catalog: Any) -> ServedModel:
    return load_model(
        parallel_package, LoadOptions(device="cpu", name="laya-parallel"), catalog=catalog
    )


@pytest.fixture(scope="module")
def parallel_agent(parallel_package: Path) -> Any:
    return load_parallel_agent(parallel_package)


def test_parallel_positions_and_groups_are_the_package_layout(parallel, parallel_agent):
    tokens = parallel.loaded.tokens
    internal = {name: parallel_agent._to_internal(as_laya(q)) for name, q in QUESTIONS.items()}
    for state in STATES:
        theirs = parallel_agent._encode_state(state, list(QUESTIONS), internal)
        entry = parse_request({"state": state, "questions": QUESTIONS}).entries[0]
        state_ids = tokens.encode(entry.state_text())
        for question, item in zip(entry.questions, theirs, strict=True):
            head = question_head(tokens, question, 192)
            ours = build_sequence(
                tokens, head, state_ids, 512, keep_end=isinstance(state, list), parallel=True
            )
            assert (list(ours.ids), list(ours.markers)) == (item["ids"], item["markers"])
            assert list(ours.positions) == item["layout"]["position_ids"], question.name
            assert list(ours.groups) == item["layout"]["option_ids"], question.name
    # every option starts at the first marker's position; the state follows the longest
    question = parse_request({"state": "s", "questions": {"q": QUESTIONS["team"]}})
    head = question_head(tokens, question.entries[0].questions[0], 192)
    laid = build_sequence(tokens, head, [], 512, parallel=True)
    assert [laid.positions[m] for m in laid.markers] == [laid.markers[0]] * 3
    assert sorted(set(laid.groups)) == [0, 1, 2, 3]


def test_parallel_probabilities_equal_the_package_alone_and_batched(parallel, parallel_agent):
    ours_alone = [
        {name: ask(parallel, [state], {name: q})[0][name] for name, q in QUESTIONS.items()}
        for state in STATES
    ]
    ours_batched = ask(parallel, STATES, QUESTIONS)
    theirs_alone = [reference(parallel_agent, [state], QUESTIONS)[0] for state in STATES]
    theirs_batched = reference(parallel_agent, STATES, QUESTIONS)
    worst = 0.0
    for ours in (ours_alone, ours_batched):
        for theirs in (theirs_alone, theirs_batched):
            for mine, reference_answers in zip(ours, theirs, strict=True):
                for name in QUESTIONS:
                    worst = max(worst, largest_difference(mine[name], reference_answers[name]))
    assert worst < TOLERANCE
    assert ours_alone == ours_batched  # exact: the same bits
    print(f"laya parity, parallel layout: largest probability difference {worst:.3g}")


def test_parallel_answers_follow_their_options_in_any_order(parallel, served):
    """Options blind to each other: reordering them reorders the probabilities (within
    rounding), where the sequential layout's answers move."""
    criteria = {"billing": "Payments", "shipping": "Parcels", "technical": "Bugs", "other": None}
    reordered = dict(reversed(criteria.items()))
    moved = {"parallel": 0.0, "sequential": 0.0}
    for layout, model in (("parallel", parallel), ("sequential", served)):
        for state in STATES:
            answers = [
                ask(
                    model,
                    [state],
                    {"q": {"type": "choice", "instructions": "Which?", "criteria": c}},
                )
                for c in (criteria, reordered)
            ]
            first, second = (a[0]["q"]["probabilities"] for a in answers)
            moved[layout] = max(moved[layout], max(abs(first[k] - second[k]) for k in criteria))
    assert moved["parallel"] < TOLERANCE
    assert moved["sequential"] > 0.01


def test_the_native_engine_masks_other_groups_and_far_positions():
    import torch

    from vllm_srun.engines.native import grouped_masks

    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    positions = torch.tensor([[0, 1, 1, 3, 5, 0]])
    groups = torch.tensor([[0, 1, 2, 2, 0, 0]])
    full, sliding = grouped_masks(mask, positions, groups, 2, torch.float32)
    allowed = (full[0, 0] == 0).int().tolist()
    assert allowed == [
        [1, 1, 1, 1, 1, 0],  # a shared token sees every real token
        [1, 1, 0, 0, 1, 0],  # group 1 never sees group 2
        [1, 0, 1, 1, 1, 0],
        [1, 0, 1, 1, 1, 0],
        [1, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1, 0],  # padding is never seen
    ]
    near = (sliding[0, 0] == 0).int().tolist()
    assert near[4] == [0, 0, 0, 1, 1, 0]  # position 5 reaches positions 3 to 7
    assert near[1] == [1, 1, 0, 0, 0, 0]
    assert full.min().item() == torch.finfo(torch.float32).min


def test_parallel_checkpoints_run_on_native_only(parallel, parallel_package, catalog):
    assert parallel.card()["decisions"]["option_layout"] == "parallel"
    assert parallel.card()["engine"] == "native"
    with pytest.raises(LoadError) as caught:
        load_model(
            parallel_package, LoadOptions(device="cpu", engine="onnxruntime"), catalog=catalog
        )
    assert "attention groups (per-token positions and masks) need --engine native" in str(
        caught.value
    )


# -- the published checkpoints -----------------------------------------------------------------
def checkpoint_revision(name: str) -> str:
    """The revision the family pins ``convaiinnovations/<name>`` at."""
    from vllm_srun.families.laya.builtin import BUILTIN_MODELS

    return next(e.revision for e in BUILTIN_MODELS if e.name == f"convaiinnovations/{name}")


def test_the_published_checkpoints_are_known_at_the_package_s_reviewed_revisions(catalog):
    from laya.revisions import PINNED_REVISIONS

    known = {
        name: entry for name, entry in catalog.layer("models").items() if entry.family == "laya"
    }
    assert {name: entry.revision for name, entry in known.items()} == PINNED_REVISIONS
    for entry in known.values():
        assert (entry.files, entry.licence) == ({}, "apache-2.0")
        assert entry.patterns == (
            "rl_agent_config.json",
            "model.safetensors",
            "tokenizer/*",
            "encoder/*",
        )


def test_a_published_checkpoint_in_the_cache_loads_with_its_digests_computed(
    package, catalog, tmp_path
):
    name, revision = "convaiinnovations/laya", "55cf4c4ebb4ebe31b2550e8bdf3bd21b99753851"
    cache = tmp_path / "hub"
    write_cache(cache, name, revision, package)
    served = load_model(
        name,
        LoadOptions(offline=True, cache_dir=cache, device="cpu", profile="batching"),
        catalog=catalog,
    )
    card = served.card()
    files = {
        path.relative_to(package).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(package.rglob("*"))
        if path.is_file() and is_loadable(path.relative_to(package).as_posix())
    }
    assert sorted(files) == [
        "encoder/config.json",
        "model.safetensors",
        "rl_agent_config.json",
        "tokenizer/special_tokens_map.json",
        "tokenizer/tokenizer.json",
        "tokenizer/tokenizer_config.json",
    ]
    assert (card["repo"], card["revision"], card["family"]) == (name, revision, "laya")
    assert (card["verification"], card["model_sha256"], card["files"]) == (
        "computed",
        identity(files),
        files,
    )
    assert card["licence"] == "apache-2.0"
    assert card["parameters"] == sum(  # counted from the weights' headers
        math.prod(shape)
        for shape in checkpoint.tensor_shapes(package / "model.safetensors").values()
    )
    body = served.answer("decisions", {"state": STATES[0], "questions": {"q": QUESTIONS["angry"]}})
    assert body["answers"]["q"]["type"] == "noul"


@pytest.mark.slow
def test_serving_a_published_checkpoint_offline_without_it_says_how_to_fetch_it(tmp_path):
    import subprocess

    cache = tmp_path / "empty"
    argv = [sys.executable, "-m", "vllm_srun", "serve", "convaiinnovations/laya", "--offline"]
    argv += ["--cache-dir", str(cache), "--port", str(free_port())]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    revision = "55cf4c4ebb4ebe31b2550e8bdf3bd21b99753851"
    phrase = (
        f"convaiinnovations/laya at {revision} is not in the Hugging Face cache at {cache}, "
        "and downloads are off (--offline). Fill the cache first (hf download "
        f"convaiinnovations/laya --revision {revision} --cache-dir {cache}), point --cache-dir "
        "at a cache that holds it, or start without --offline and HF_HUB_OFFLINE"
    )
    assert done.returncode == 1
    assert (
        f"exiting with status 1: no model can be served: model convaiinnovations/laya: {phrase}"
        in done.stderr
    )
    assert "Traceback" not in done.stderr + done.stdout


def test_a_published_checkpoint_at_another_revision_is_a_hub_repository(catalog, tmp_path):
    other = "0" * 40
    with pytest.raises(LoadError) as caught:
        load_model(
            f"convaiinnovations/laya@{other}",
            LoadOptions(offline=True, cache_dir=tmp_path, device="cpu"),
            catalog=catalog,
        )
    assert str(caught.value).startswith(
        f"convaiinnovations/laya at {other} is not in the Hugging Face cache at {tmp_path}"
    )
    with pytest.raises(LoadError, match="revision must be a 40-hex commit, not 'main'"):
        load_model("convaiinnovations/laya@main", LoadOptions(offline=True), catalog=catalog)


def test_make_eval_finds_a_published_checkpoint_once_it_is_here(
    package, served, tmp_path, monkeypatch
):
    """``make eval`` evaluates every decision model whose files are here (eval/run.py)."""
    repo = Path(__file__).resolve().parents[2]
    monkeypatch.syspath_prepend(str(repo / "eval"))
    import run as evaluation

    cache = tmp_path / "hub"
    write_cache(
        cache, "convaiinnovations/laya", "55cf4c4ebb4ebe31b2550e8bdf3bd21b99753851", package
    )
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    names = ["convaiinnovations/laya", "convaiinnovations/laya-multilingual"]
    available, missing = evaluation.local_decision_models(load_catalog({}), names)
    assert available == ["convaiinnovations/laya"]
    assert missing == {
        "convaiinnovations/laya-multilingual": "convaiinnovations/laya-multilingual at "
        f"e4e9ddf21a7b1903b7acffd8814ad4307bf63a67 is not in the Hugging Face cache at {cache}, "
        "and downloads are off (--offline)"
    }
    rows = [r for r in evaluation.read_jsonl("decisions.jsonl") if r["set"] == "helpdesk_queue"]
    lines = evaluation.model_section("convaiinnovations/laya", "laya", rows, served)
    assert lines[0] == "## Decisions: convaiinnovations/laya"
    table = [line for line in lines if line.startswith("| choice |")]
    assert table and all(f"| {len(rows)} |" in line for line in table if "(all)" in line)


def test_the_plugin_guide_shows_the_family_s_own_code_and_card(served, tmp_path, catalog):
    """docs/plugin-authors.md's Laya walk-through: its code blocks are the family's code, and
    the card it prints is the family fixture's."""
    from tests.test_plugin_authors_doc import GUIDE, blocks

    lines = GUIDE.read_text("utf-8").split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("### Worked example: Laya"))
    end = next(i for i, line in enumerate(lines) if i > start and line.startswith("## "))
    sources = "\n".join(p.read_text("utf-8") for p in LAYA_SOURCES.glob("*.py"))
    shown = [(lang, body) for line, lang, body in blocks() if start < line < end]
    assert [lang for lang, _ in shown] == ["python", "python", "python", "json"]
    for _, body in shown[:-1]:  # a method is shown dedented, so that the block compiles
        assert any(textwrap.indent(body, " " * n) in sources for n in (0, 4)), body
    fixture = load_model(write_fixture(tmp_path), LoadOptions(device="cpu"), catalog=catalog)
    card = fixture.card()
    printed = json.loads(shown[-1][1])
    assert printed == {key: card[key] for key in printed}


# -- serving -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(package, cache_dir, tmp_path_factory):
    port = free_port()
    argv = [sys.executable, "-m", "vllm_srun", "serve", str(package), "--offline"]
    argv += ["--served-model-name", "laya", "--port", str(port), "--device", "cpu"]
    env = {**os.environ, "VLLM_SRUN_CACHE_DIR": str(cache_dir)}
    log = tmp_path_factory.mktemp("laya-serve") / "serve.log"
    with serving(argv, env, log, port, 300, 60) as client:
        yield client


@pytest.mark.slow
def test_served_card_and_one_answer_per_question_type(server, served):
    card = next(m for m in server.get("/v1/models").json()["data"] if m["id"] == "laya")
    assert (card["family"], card["status"], card["verification"]) == ("laya", "ready", "local")
    assert card["question_types"] == ["choice", "noul", "score"]
    assert card["decisions"] == served.card()["decisions"]
    assert card["limits"]["max_options"] == 126
    assert card["golden"]["status"] == "unverified"
    assert card["golden"]["checked"] == 2
    for name in ("team", "angry", "urgency"):
        request = {"model": "laya", "state": STATES[1], "questions": {name: QUESTIONS[name]}}
        response = server.post("/v1/decisions", json=request)
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["model"] == "laya"
        assert body["answers"] == ask(served, [STATES[1]], {name: QUESTIONS[name]})[0]
        assert body["usage"]["input_tokens"] > 0
