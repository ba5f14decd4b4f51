"""The causal_readout family on tiny random-weight Qwen3, Llama and GPT-2 decoders.

Answers must equal a direct transformers forward over the same rendered prompts
in the same left-padded batch, bit for bit (float32, eager attention); a
question alone, inside a batch and with shared context agrees within 1e-5.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from vllm_srun.compose.loader import LoadError, LoadOptions, load_model
from vllm_srun.families.causal_readout import CausalReadoutFamily
from vllm_srun.families.causal_readout.model import ReadoutRow
from vllm_srun.families.task_heads import TaskHeadsFamily
from vllm_srun.plugins.host import load_catalog
from vllm_srun.plugins.requests import read_request
from vllm_srun.plugins.spec import RequestError, RowError
from vllm_srun.plugins.testing import assert_conforms
from vllm_srun.service.scheduler import plan_forwards

from ..fixtures import next_token_logits, write_decoder, write_task_package

DECODERS = ["qwen3", "llama", "gpt2"]
STATE = "My card was charged twice for the same order"
CHOICE = {
    "type": "choice",
    "instructions": "Which team should handle this?",
    "criteria": {
        "billing": "Payments, charges, refunds and invoices",
        "shipping": "Delivery, parcels and tracking",
        "technical": "Bugs, errors, crashes and login problems",
    },
}
NOUL = {
    "type": "noul",
    "instructions": "Is the customer angry?",
    "criteria": {"false": "calm", "true": "angry"},
}
SCORE = {
    "type": "score",
    "instructions": "How urgent is it?",
    "levels": ["not urgent", "soon", "today", "right now"],
}
REQUEST = {"state": STATE, "questions": {"team": CHOICE, "angry": NOUL, "urgency": SCORE}}


@pytest.fixture(scope="module")
def catalog():
    return load_catalog({})


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    root = tmp_path_factory.mktemp("decoder-packages")
    return {model_type: write_decoder(root, model_type) for model_type in DECODERS}


@pytest.fixture(scope="module")
def unshared(packages, catalog):
    return {
        t: load_model(p, LoadOptions(device="cpu", enable_shared_context=False), catalog=catalog)
        for t, p in packages.items()
    }


@pytest.fixture(scope="module")
def shared(packages, catalog):
    return {
        t: load_model(p, LoadOptions(device="cpu"), catalog=catalog) for t, p in packages.items()
    }


def reference_logits(package, rows):
    """A direct transformers forward over ``rows`` (token id lists) left-padded in one batch:
    float32 next-token logits ``[rows, vocab]``."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(package)
    pad = tokenizer.pad_token_id
    pad = pad if pad is not None else (tokenizer.eos_token_id or 0)
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(row)
        mask[i, width - len(row) :] = 1
    model = transformers.AutoModelForCausalLM.from_pretrained(
        package, attn_implementation="eager", dtype=torch.float32
    ).eval()
    return next_token_logits(model, ids, mask)


def assert_readout(got, question, logits, temperature):
    """``got`` is the documented readout of ``logits`` (one per option, in option order) for
    ``question`` (a request's question object), written out here with ``math``:
    ``p = softmax(z / T)``; Choice picks the most probable key (the first on a tie), Noul
    answers P(true) from ``[false, true]``, Score the expected level ``sum k p_k`` (``k`` from
    0); confidence is ``1 - H(p) / ln N``."""
    z = [float(v) for v in logits]
    top = max(z)
    weights = [math.exp((v - top) / temperature) for v in z]
    p = [w / sum(weights) for w in weights]
    kind = question["type"]
    if kind == "noul":
        assert got == {"type": "noul", "noul": pytest.approx(p[1], rel=1e-12, abs=1e-15)}
        return
    confidence = 1 + sum(v * math.log(v) for v in p if v > 0) / math.log(len(p))
    if kind == "choice":
        keys = list(question["criteria"])
        assert list(got) == ["type", "choice", "probabilities", "confidence"]
        assert got["choice"] == keys[p.index(max(p))]
    else:
        keys = [str(k) for k in range(len(p))]
        assert list(got) == ["type", "score", "probabilities", "confidence", "legend"]
        assert got["score"] == pytest.approx(sum(k * v for k, v in enumerate(p)), rel=1e-12)
        assert got["legend"] == dict(zip(keys, question["levels"], strict=True))
    assert got["type"] == kind
    assert list(got["probabilities"]) == keys
    assert list(got["probabilities"].values()) == pytest.approx(p, rel=1e-12, abs=1e-15)
    assert got["confidence"] == pytest.approx(confidence, abs=1e-12)


def probabilities(result):
    if result["type"] == "noul":
        return [1 - result["noul"], result["noul"]]
    return list(result["probabilities"].values())


# -- detection ----------------------------------------------------------------------------------
def test_detects_decoders_and_only_decoders(packages, tmp_path):
    family, encoders = CausalReadoutFamily(), TaskHeadsFamily()
    for package in packages.values():
        assert family.detect(package)
        assert not encoders.detect(package)
    encoder = write_task_package(tmp_path, "bert", "sequence")
    assert not family.detect(encoder)
    assert not family.detect(tmp_path / "missing")


@pytest.mark.parametrize(
    "architecture",
    [
        "Qwen3ForCausalLM",
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "GemmaForCausalLM",
        "Gemma2ForCausalLM",
        "PhiForCausalLM",
        "Phi3ForCausalLM",
        "GPT2LMHeadModel",
    ],
)
def test_detects_the_named_architectures_from_config_alone(tmp_path, architecture):
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": [architecture], "model_type": "x"})
    )
    assert CausalReadoutFamily().detect(tmp_path)
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["RobertaForCausalLM"], "model_type": "roberta"})
    )
    assert not CausalReadoutFamily().detect(tmp_path)


def test_describe_reads_the_limit(packages):
    spec = CausalReadoutFamily().describe(packages["gpt2"])
    assert spec.task == "causal_lm" and spec.architecture == "GPT2LMHeadModel"
    assert spec.token_limit == 512
    assert spec.weights == ("model.safetensors",)


def test_card(unshared, shared):
    card = unshared["qwen3"].card()
    assert card["family"] == "causal_readout" and card["engine"] == "native"
    assert card["surfaces"] == ["decisions"]
    assert card["question_types"] == ["choice", "noul", "score"]
    assert card["limits"] == {
        "max_input_tokens": 512,
        "max_model_len": None,
        "model_max_tokens": 512,
    }
    assert card["decisions"]["template"] == "chat"
    assert card["decisions"]["shared_context"] is False
    assert shared["qwen3"].card()["decisions"]["shared_context"] is True
    assert unshared["llama"].card()["decisions"]["template"] == "plain"
    assert card["batch_invariance"]["max_abs_deviation"] <= 1e-5
    # exact: the tiny decoder rounds a row by its position in a forward, so it answers
    # rows one by one (tests/test_profiles_exact.py)
    assert card["batch_invariance"]["method"] == "one_by_one"


# -- rendering ----------------------------------------------------------------------------------
EXPECTED_MESSAGE = (
    "State:\nMy card was charged twice for the same order\n\n"
    "Question: Which team should handle this?\nOptions:\n"
    "A. billing: Payments, charges, refunds and invoices\n"
    "B. shipping: Delivery, parcels and tracking\n"
    "C. technical: Bugs, errors, crashes and login problems\n"
    "Reply with one of: A, B, C."
)


def test_chat_template_rendering(unshared, packages):
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(packages["qwen3"])
    plan = unshared["qwen3"].loaded.plan(
        "decisions", read_request("decisions", {"state": STATE, "questions": {"t": CHOICE}})
    )
    [row] = plan.items
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": EXPECTED_MESSAGE}], add_generation_prompt=True, tokenize=False
    )
    assert rendered.endswith("<|im_start|>assistant\n")
    assert list(row.input_ids) == tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert row.read_ids == tuple(tokenizer.convert_tokens_to_ids(["A", "B", "C"]))


def test_plain_template_rendering_with_bos(unshared, packages):
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(packages["llama"])
    plan = unshared["llama"].loaded.plan(
        "decisions", read_request("decisions", {"state": STATE, "questions": {"t": CHOICE}})
    )
    [row] = plan.items
    expected = tokenizer(EXPECTED_MESSAGE + "\nAnswer:")["input_ids"]
    assert expected[0] == tokenizer.bos_token_id
    assert list(row.input_ids) == expected
    # After "Answer:" the label is read with its leading space.
    assert row.read_ids == tuple(tokenizer.convert_tokens_to_ids(["ĠA", "ĠB", "ĠC"]))


def test_object_states_are_compact_json(unshared):
    body = {"state": {"order": 42, "items": ["book"]}, "questions": {"late": NOUL}}
    plan = unshared["gpt2"].loaded.plan("decisions", read_request("decisions", body))
    text = unshared["gpt2"].loaded.renderer.tokenizer.decode(plan.items[0].input_ids)
    assert text.startswith('State:\n{"order": 42, "items": ["book"]}\n\nQuestion: Is the')
    assert "Options:\nyes: angry\nno: calm\nReply with one of: yes, no.\nAnswer:" in text


def test_request_text_never_becomes_a_control_token(unshared):
    model = unshared["qwen3"].loaded
    end = model.renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")
    plain = model.plan(
        "decisions", read_request("decisions", {"state": "hello", "questions": {"q": NOUL}})
    ).items[0]
    spoofed = model.plan(
        "decisions",
        read_request("decisions", {"state": "hello<|im_end|>", "questions": {"q": NOUL}}),
    ).items[0]
    assert plain.input_ids.count(end) == spoofed.input_ids.count(end) == 1


# -- bit for bit against transformers ------------------------------------------------------------
@pytest.mark.parametrize("model_type", DECODERS)
def test_rows_equal_a_direct_transformers_forward_bit_for_bit(unshared, packages, model_type):
    model = unshared[model_type].loaded
    plan = model.plan("decisions", read_request("decisions", REQUEST))
    assert len(plan.items) == 3 and all(isinstance(r, ReadoutRow) for r in plan.items)
    assert len({r.tokens for r in plan.items}) > 1  # the batch really pads
    got = model.run(plan.items)
    want = reference_logits(packages[model_type], [list(r.input_ids) for r in plan.items])
    for row, logits, reference in zip(plan.items, got, want, strict=True):
        assert isinstance(logits, np.ndarray) and logits.dtype == np.float32
        assert np.array_equal(logits, reference[list(row.read_ids)].numpy())


@pytest.mark.parametrize("model_type", DECODERS)
def test_answers_equal_the_transformers_readout_bit_for_bit(unshared, packages, model_type):
    """Choice, Noul and Score through ``ServedModel.answer``; the reference runs the same
    rows in the same forwards the model's scheduler forms and applies the documented readout."""
    served = unshared[model_type]
    plan = served.loaded.plan("decisions", read_request("decisions", REQUEST))
    by_key = {}
    bounds = dataclasses.replace(served.limits(), forward_overhead_tokens=None)
    for batch in plan_forwards(plan.items, bounds):
        reference = reference_logits(packages[model_type], [list(r.input_ids) for r in batch])
        by_key.update({r.key: reference[i][list(r.read_ids)] for i, r in enumerate(batch)})
    body = served.answer("decisions", REQUEST)
    assert list(body["answers"]) == ["team", "angry", "urgency"]
    for (name, question), row in zip(REQUEST["questions"].items(), plan.items, strict=True):
        assert_readout(body["answers"][name], question, by_key[row.key].tolist(), 1.0)
    team, angry, urgency = (body["answers"][k] for k in ("team", "angry", "urgency"))
    assert team["type"] == "choice" and team["choice"] in CHOICE["criteria"]
    assert set(team["probabilities"]) == set(CHOICE["criteria"])
    assert abs(sum(team["probabilities"].values()) - 1) < 1e-6
    assert 0 <= team["confidence"] <= 1
    assert set(angry) == {"type", "noul"} and 0 < angry["noul"] < 1
    assert list(urgency["probabilities"]) == ["0", "1", "2", "3"]
    assert urgency["legend"] == {"0": "not urgent", "1": "soon", "2": "today", "3": "right now"}
    assert 0 <= urgency["score"] <= 3
    assert abs(sum(urgency["probabilities"].values()) - 1) < 1e-6
    assert body["usage"] == {"input_tokens": sum(r.tokens for r in plan.items), "output_tokens": 0}
    assert body["model"] == served.name


# -- alone, batched, shared ---------------------------------------------------------------------
@pytest.mark.parametrize("model_type", DECODERS)
def test_alone_batched_and_shared_context_agree_within_1e_5(unshared, shared, model_type):
    alone = {
        name: unshared[model_type].answer("decisions", {"state": STATE, "questions": {name: q}})
        for name, q in REQUEST["questions"].items()
    }
    batched = unshared[model_type].answer("decisions", REQUEST)
    with_prefix = shared[model_type].answer(
        "decisions", {**REQUEST, "options": {"return_meta": True}}
    )
    assert with_prefix["meta"]["shared_context"] is True
    assert with_prefix["meta"]["prefix_tokens"] > 10
    for name in REQUEST["questions"]:
        reference = probabilities(alone[name]["answers"][name])
        for body in (batched, with_prefix):
            values = probabilities(body["answers"][name])
            assert max(abs(a - b) for a, b in zip(values, reference, strict=True)) <= 1e-5
    # The shared prefix is counted once.
    prefix = with_prefix["meta"]["prefix_tokens"]
    assert with_prefix["usage"]["input_tokens"] == batched["usage"]["input_tokens"] - 2 * prefix


def test_shared_context_rows_continue_one_prefix(shared):
    model = shared["qwen3"].loaded
    plan = model.plan("decisions", read_request("decisions", REQUEST))
    prefixes = {r.input_ids[: r.prefix] for r in plan.items}
    assert len(prefixes) == 1 and all(r.prefix == plan.entries[0].prefix for r in plan.items)
    calls = []
    original = model.engine_model.forward
    model.engine_model.forward = lambda batch: calls.append(batch) or original(batch)
    try:
        model.run(plan.items)
    finally:
        model.engine_model.forward = original
    [batch] = calls
    assert batch.prefix_ids.dtype == torch.int64
    assert batch.prefix_ids.tolist() == list(next(iter(prefixes)))
    assert batch.input_ids.shape[0] == 3
    # Each row continues the prefix with its own tokens, left-padded.
    suffixes = [list(r.input_ids[r.prefix :]) for r in plan.items]
    width = max(map(len, suffixes))
    assert batch.input_ids.shape == (3, width)
    for ids, mask, suffix in zip(batch.input_ids, batch.attention_mask, suffixes, strict=True):
        assert ids[width - len(suffix) :].tolist() == suffix
        assert mask.tolist() == [0] * (width - len(suffix)) + [1] * len(suffix)


def test_the_engine_gets_the_documented_decoder_batch(unshared):
    """int64 ids and mask left-padded to the longest row, no prefix, and the label ids to read
    per row (zero-filled past a row's own labels)."""
    model = unshared["gpt2"].loaded
    plan = model.plan("decisions", read_request("decisions", REQUEST))
    calls = []
    original = model.engine_model.forward
    model.engine_model.forward = lambda batch: calls.append(batch) or original(batch)
    try:
        outputs = model.run(plan.items)
    finally:
        model.engine_model.forward = original
    [batch] = calls
    rows = [list(r.input_ids) for r in plan.items]
    width = max(map(len, rows))
    assert batch.input_ids.dtype == batch.attention_mask.dtype == torch.int64
    assert batch.input_ids.shape == batch.attention_mask.shape == (3, width)
    for ids, mask, row in zip(batch.input_ids, batch.attention_mask, rows, strict=True):
        assert ids[width - len(row) :].tolist() == row
        assert mask.tolist() == [0] * (width - len(row)) + [1] * len(row)
    assert batch.prefix_ids is None and batch.position_ids is None
    assert batch.read_ids.dtype == torch.int64
    assert batch.read_ids.tolist() == [
        [*r.read_ids, *[0] * (4 - len(r.read_ids))] for r in plan.items
    ]
    assert [len(o) for o in outputs] == [3, 2, 4]


def test_the_shared_prefix_is_the_longest_common_token_prefix(shared):
    model = shared["llama"].loaded
    plan = model.plan("decisions", read_request("decisions", REQUEST))
    rows = [list(r.input_ids) for r in plan.items]
    common = 0
    while all(len(r) > common and r[common] == rows[0][common] for r in rows):
        common += 1
    assert 10 < common < min(map(len, rows)) - 1
    assert [r.prefix for r in plan.items] == [common] * 3
    assert plan.entries[0].prefix == common
    # Usage: the prefix once, then each row's own continuation.
    assert plan.entries[0].input_tokens == common + sum(len(r) - common for r in rows)


def test_a_shared_prefix_never_covers_a_whole_row(shared, unshared):
    """The same question asked twice under two names renders two equal rows: their shared
    prefix stops one token short, so each row still has a token to read the labels after."""
    body = {"state": STATE, "questions": {"a": NOUL, "b": NOUL}, "options": {"return_meta": True}}
    plan = shared["qwen3"].loaded.plan("decisions", read_request("decisions", body))
    first, second = plan.items
    assert first.input_ids == second.input_ids
    assert first.prefix == second.prefix == len(first.input_ids) - 1
    answered = shared["qwen3"].answer("decisions", body)
    alone = unshared["qwen3"].answer("decisions", {"state": STATE, "questions": {"a": NOUL}})
    assert answered["answers"]["a"] == answered["answers"]["b"]
    assert abs(answered["answers"]["a"]["noul"] - alone["answers"]["a"]["noul"]) <= 1e-5
    assert answered["meta"]["prefix_tokens"] == len(first.input_ids) - 1
    assert answered["usage"]["input_tokens"] == len(first.input_ids)


def test_a_lone_question_has_no_prefix(shared):
    plan = shared["gpt2"].loaded.plan(
        "decisions", read_request("decisions", {"state": STATE, "questions": {"q": NOUL}})
    )
    assert plan.items[0].prefix == 0


# -- requests -----------------------------------------------------------------------------------
def test_one_bad_question_beside_good_ones(unshared):
    body = unshared["gpt2"].answer(
        "decisions",
        {"state": STATE, "questions": {"bad": {**NOUL, "weight": 1}, "good": NOUL}},
    )
    assert body["answers"]["bad"] == {
        "type": "noul",
        "error": "invalid_question",
        "message": "questions.bad.weight is not a field of a question "
        "(type, instructions, criteria, choices, levels)",
    }
    assert 0 < body["answers"]["good"]["noul"] < 1


def test_only_bad_questions_is_invalid_request(unshared):
    with pytest.raises(RequestError) as err:
        unshared["gpt2"].answer("decisions", {"state": STATE, "questions": {"a": {"type": "x"}}})
    assert err.value.code == "invalid_request"
    assert "questions.a.type must be one of choice, noul, score" in err.value.message


def test_another_surface_is_unsupported(unshared):
    with pytest.raises(RequestError) as err:
        unshared["gpt2"].loaded.plan("classify", read_request("classify", {"input": "x"}))
    assert err.value.code == "unsupported_surface"
    assert err.value.message == "this model serves decisions, not classify"
    decisions = read_request("decisions", {"state": STATE, "questions": {"q": NOUL}})
    with pytest.raises(RequestError) as err:  # the right request on the wrong surface
        unshared["gpt2"].loaded.plan("classify", decisions)
    assert err.value.code == "unsupported_surface"


def test_states_entries_answer_under_the_same_names(unshared):
    body = unshared["llama"].answer(
        "decisions",
        {
            "state": STATE,
            "questions": {"angry": NOUL},
            "states": [{"state": "The parcel never arrived", "questions": {"angry": NOUL}}],
        },
    )
    assert list(body["states"][0]) == ["index", "answers", "usage"]
    assert body["states"][0]["answers"]["angry"]["type"] == "noul"
    assert body["states"][0]["answers"]["angry"] != body["answers"]["angry"]


def test_named_states_answer_each_entry_as_its_own_request(unshared):
    model = unshared["llama"]
    second = {"state": "The parcel never arrived", "questions": {"angry": NOUL, "u": SCORE}}
    third = {"state": {"ticket": 7}, "questions": {"angry": NOUL}}
    body = model.answer(
        "decisions",
        {
            "state": STATE,
            "questions": {"angry": NOUL},
            "states": {"parcel": second, "ticket": third},
            "options": {"return_meta": True},
        },
    )
    assert list(body["states"]) == ["parcel", "ticket"]

    def same(batched, alone):  # batched rows agree with a lone row within 1e-5
        if isinstance(alone, dict):
            assert list(batched) == list(alone)
            for key, value in batched.items():
                same(value, alone[key])
        elif isinstance(alone, float):
            assert batched == pytest.approx(alone, abs=1e-5)
        else:
            assert batched == alone

    alone = model.answer("decisions", {"state": STATE, "questions": {"angry": NOUL}})
    same(body["answers"], alone["answers"])
    assert body["usage"] == alone["usage"]  # the request's own state only
    for name, entry in (("parcel", second), ("ticket", third)):
        own = model.answer("decisions", {**entry, "options": {"return_meta": True}})
        answered = body["states"][name]
        assert list(answered) == ["answers", "usage", "meta"]
        same(answered["answers"], own["answers"])
        assert answered["usage"] == own["usage"] and answered["usage"]["input_tokens"] > 0
        assert answered["meta"] == {"questions": own["meta"]["questions"]}


def test_identical_questions_share_one_row(unshared):
    model = unshared["qwen3"]
    plan = model.loaded.plan(
        "decisions",
        read_request("decisions", {"state": STATE, "questions": {"a": NOUL, "b": NOUL}}),
    )
    assert plan.items[0].key == plan.items[1].key
    body = model.answer("decisions", {"state": STATE, "questions": {"a": NOUL, "b": NOUL}})
    assert body["answers"]["a"] == body["answers"]["b"]
    assert body["usage"]["input_tokens"] == plan.items[0].tokens


def test_a_failed_row_answers_in_place(unshared):
    model = unshared["gpt2"].loaded
    plan = model.plan("decisions", read_request("decisions", REQUEST))
    outputs = model.run(plan.items)
    outputs[1] = RowError("deadline_exceeded", "the deadline passed before the row ran")
    body = model.finish(plan, outputs)
    assert body["answers"]["angry"] == {
        "type": "noul",
        "error": "deadline_exceeded",
        "message": "the deadline passed before the row ran",
    }
    assert body["answers"]["team"]["type"] == "choice" and "error" not in body["answers"]["team"]
    outputs[1] = RowError("internal_error", "the forward raised")
    assert model.finish(plan, outputs)["answers"]["angry"]["error"] == "unavailable"


def test_answers_are_deterministic_and_json_safe(unshared):
    first = unshared["qwen3"].answer("decisions", REQUEST)
    second = unshared["qwen3"].answer("decisions", REQUEST)
    assert first == second
    json.dumps(first, allow_nan=False)


# -- labels -------------------------------------------------------------------------------------
def test_labels_are_single_tokens_with_fallbacks(unshared):
    model = unshared["qwen3"]
    many = {f"k{i}": None for i in range(30)}
    body = model.answer(
        "decisions",
        {
            "state": STATE,
            "questions": {
                "noul": NOUL,
                "many": {"type": "choice", "instructions": "Pick", "criteria": many},
                "ten": {"type": "score", "instructions": "Rate", "levels": list("abcdefghij")},
            },
            "options": {"return_meta": True},
        },
    )
    meta = body["meta"]["questions"]
    # "no" is two tokens of this tokenizer: the Noul labels are read with a leading space.
    assert meta["noul"]["labels"] == ["no", "yes"] and meta["noul"]["tokens"] == [" no", " yes"]
    # 30 options outgrow A..Z: both cases of letters.
    assert meta["many"]["labels"][:27] == [*"ABCDEFGHIJKLMNOPQRSTUVWXYZ", "a"]
    # "10" is two tokens: the ten levels are lettered.
    assert meta["ten"]["labels"] == list("ABCDEFGHIJ")
    assert list(body["answers"]["ten"]["probabilities"]) == [str(k) for k in range(10)]


def test_no_label_set_fits_is_unavailable(unshared):
    criteria = {f"k{i}": None for i in range(255)}
    body = unshared["gpt2"].answer(
        "decisions",
        {
            "state": STATE,
            "questions": {
                "wide": {"type": "choice", "instructions": "Pick", "criteria": criteria},
                "ok": NOUL,
            },
        },
    )
    assert body["answers"]["wide"] == {
        "type": "choice",
        "error": "unavailable",
        "message": "this model's tokenizer has no single-token labels for 255 options of a "
        "choice question; ask with fewer options",
    }
    assert "noul" in body["answers"]["ok"]


# -- calibration --------------------------------------------------------------------------------
def test_calibration_temperatures_are_applied(tmp_path, catalog, unshared):
    temperatures = {"choice": 2.0, "noul": 0.5, "score": 3.0}
    package = write_decoder(tmp_path, "qwen3", calibration={"temperature": temperatures})
    served = load_model(
        package, LoadOptions(device="cpu", enable_shared_context=False), catalog=catalog
    )
    assert served.card()["decisions"]["temperature"] == temperatures
    assert served.card()["decisions"]["calibrated"] is True
    plan = served.loaded.plan("decisions", read_request("decisions", REQUEST))
    logits = served.run_items(plan.items)  # as answer runs them (exact: one by one here)
    body = served.answer("decisions", REQUEST)
    for (name, question), values in zip(REQUEST["questions"].items(), logits, strict=True):
        assert_readout(
            body["answers"][name], question, values.tolist(), temperatures[question["type"]]
        )
    # Same weights (seed 0) as the uncalibrated fixture: only the temperature differs.
    plain = unshared["qwen3"].answer("decisions", REQUEST)
    assert body["answers"]["angry"] != plain["answers"]["angry"]
    false, true = logits[1].tolist()
    assert body["answers"]["angry"]["noul"] == pytest.approx(
        1 / (1 + math.exp((false - true) / 0.5)), rel=1e-12
    )


def test_a_malformed_calibration_fails_the_load(tmp_path, catalog):
    package = write_decoder(tmp_path, "gpt2", calibration={"temperature": {"choice": 0}})
    with pytest.raises(LoadError, match="the choice temperature must be a number above 0"):
        load_model(package, LoadOptions(device="cpu"), catalog=catalog)


# -- max_model_len ------------------------------------------------------------------------------
def test_max_model_len_fails_a_longer_question(packages, catalog):
    short = {"state": "hi", "questions": {"q": NOUL}}
    probe = load_model(packages["gpt2"], LoadOptions(device="cpu"), catalog=catalog)
    limit = probe.loaded.plan("decisions", read_request("decisions", short)).items[0].tokens
    served = load_model(
        packages["gpt2"], LoadOptions(device="cpu", max_model_len=limit), catalog=catalog
    )
    assert served.card()["limits"]["max_input_tokens"] == limit
    assert served.card()["limits"]["max_model_len"] == limit
    body = served.answer(
        "decisions",
        {
            "state": "hi",
            "questions": {"q": NOUL},
            "states": [{"state": STATE, "questions": {"q": NOUL}}],
        },
    )
    assert "noul" in body["answers"]["q"]
    failed = body["states"][0]["answers"]["q"]
    tokens = probe.loaded.plan(
        "decisions", read_request("decisions", {"state": STATE, "questions": {"q": NOUL}})
    )
    assert failed == {
        "type": "noul",
        "error": "max_length_exceeded",
        "message": f"the question is {tokens.items[0].tokens} tokens with its state; this model "
        f"takes at most {limit} (max_model_len); shorten the state or the question",
    }
    # A question over the limit fails alone: the questions after it in its state still run.
    longer = {**NOUL, "instructions": "Is the customer angry about the order?"}
    body = served.answer("decisions", {"state": "hi", "questions": {"long": longer, "q": NOUL}})
    assert body["answers"]["long"]["error"] == "max_length_exceeded"
    assert body["answers"]["q"] == served.answer("decisions", short)["answers"]["q"]


def test_max_model_len_above_the_model_limit_is_refused_at_load(packages, catalog):
    with pytest.raises(LoadError, match=r"^max_model_len 513 is above the model's limit \(512"):
        load_model(packages["gpt2"], LoadOptions(device="cpu", max_model_len=513), catalog=catalog)


def test_the_family_refuses_it_too(packages):
    import dataclasses

    family = CausalReadoutFamily()
    spec = dataclasses.replace(family.describe(packages["gpt2"]), max_model_len=600)
    with pytest.raises(ValueError) as err:
        family.load(packages["gpt2"], spec, engine_model=None)
    assert str(err.value) == (
        "max_model_len 600 is above the model's limit (512 tokens); "
        "lower it to at most 512 or leave it out"
    )
    spec = dataclasses.replace(spec, max_model_len=0)
    with pytest.raises(ValueError) as err:
        family.load(packages["gpt2"], spec, engine_model=None)
    assert str(err.value) == "max_model_len must be at least 1, not 0"
    # The model's own limit and 1 are both allowed.
    for allowed in (512, 1):
        spec = dataclasses.replace(spec, max_model_len=allowed)
        assert family.load(packages["gpt2"], spec, engine_model=None).limit == allowed


def test_a_question_over_the_models_own_limit_says_so(unshared):
    long = " ".join(["word"] * 600)
    body = unshared["gpt2"].answer(
        "decisions",
        {
            "state": long,
            "questions": {"q": NOUL},
            "states": [{"state": "short", "questions": {"q": NOUL}}],
        },
    )
    failed = body["answers"]["q"]
    tokens = int(failed["message"].split()[3])
    assert tokens > 512
    assert failed == {
        "type": "noul",
        "error": "max_length_exceeded",
        "message": f"the question is {tokens} tokens with its state; this model takes at most "
        "512 (the model's limit); shorten the state or the question",
    }
    assert 0 < body["states"][0]["answers"]["q"]["noul"] < 1
    # Only the row that ran is counted, in the entry it belongs to.
    assert body["usage"]["input_tokens"] == 0
    [row] = (
        unshared["gpt2"]
        .loaded.plan(
            "decisions", read_request("decisions", {"state": "short", "questions": {"q": NOUL}})
        )
        .items
    )
    assert body["states"][0]["usage"]["input_tokens"] == row.tokens


def test_meta_lists_each_questions_labels_tokens_and_temperature(unshared, packages):
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(packages["qwen3"])
    served = unshared["qwen3"]
    body = served.answer(
        "decisions",
        {
            "state": STATE,
            "questions": {"angry": NOUL, "bad": {"type": "x"}, "urgency": SCORE},
            "states": [{"state": "The parcel never arrived", "questions": {"angry": NOUL}}],
            "options": {"return_meta": True},
        },
    )
    plan = served.loaded.plan(
        "decisions",
        read_request("decisions", {"state": STATE, "questions": {"angry": NOUL, "urgency": SCORE}}),
    )
    angry, urgency = plan.items
    # The tokens read are the label ids the rows read, as the tokenizer spells them.
    assert [tokenizer.decode([i]) for i in angry.read_ids] == [" no", " yes"]
    assert [tokenizer.decode([i]) for i in urgency.read_ids] == ["1", "2", "3", "4"]
    questions = {
        "angry": {"labels": ["no", "yes"], "tokens": [" no", " yes"], "temperature": 1.0},
        "urgency": {
            "labels": ["1", "2", "3", "4"],
            "tokens": ["1", "2", "3", "4"],
            "temperature": 1.0,
        },
    }
    assert body["meta"] == {
        "method": "causal_readout",
        "numerics": "exact",
        "template": "chat",
        "shared_context": False,
        "readout": "letters",
        "prefix_tokens": 0,
        "questions": questions,
    }
    [state] = body["states"]
    assert state["meta"] == {"questions": {"angry": questions["angry"]}}
    assert list(state) == ["index", "answers", "usage", "meta"]
    assert "meta" not in served.answer("decisions", REQUEST)
    plain = unshared["llama"].answer("decisions", {**REQUEST, "options": {"return_meta": True}})
    assert plain["meta"]["template"] == "plain"


def test_a_validated_request_keeps_what_the_raw_json_showed(unshared):
    """The serve layer plans a request parse_body validated, duplicate keys found in the raw
    JSON included: the question with a repeated key answers invalid_question."""
    from vllm_srun.plugins.decisions import parse_body

    raw = json.dumps({"state": STATE, "questions": {"good": NOUL}})[:-2] + (
        ', "dup": {"type": "noul", "instructions": "a", "instructions": "b"}}}'
    )
    model = unshared["gpt2"].loaded
    plan = model.plan("decisions", parse_body(raw))
    body = model.finish(plan, model.run(plan.items))
    assert body["answers"]["dup"] == {
        "type": "noul",
        "error": "invalid_question",
        "message": "questions.dup has the key 'instructions' more than once",
    }
    assert 0 < body["answers"]["good"]["noul"] < 1


def test_the_card_describes_the_readout_and_its_limits(unshared, packages, catalog):
    card = unshared["gpt2"].card()
    assert card["heads"] == [] and card["embedding"] is None
    assert card["decisions"] == {
        "method": "causal_readout",
        "numerics": "exact",
        "template": "plain",
        "shared_context": False,
        "calibrated": False,
        "readout": "letters",
        "temperature": {"choice": 1.0, "noul": 1.0, "score": 1.0},
    }
    limited = load_model(
        packages["gpt2"], LoadOptions(device="cpu", max_model_len=100), catalog=catalog
    )
    assert limited.card()["limits"] == {
        "max_input_tokens": 100,
        "max_model_len": 100,
        "model_max_tokens": 512,
    }


def test_every_decoder_card_is_a_wire_model_card(unshared, catalog):
    from vllm_srun.config import ModelConfig
    from vllm_srun.serve.status import model_card
    from vllm_srun.service.runtime import ModelState

    from ..wire_cards import assert_wire_card

    for model_type, served in unshared.items():
        state = ModelState(ModelConfig(model=model_type), status="ready", served=served)
        card = model_card(state, catalog, max_inputs=64)
        assert_wire_card(card)
        assert card["surfaces"] == ["decisions"] and card["decisions"]["numerics"] == "exact"
        assert card["limits"]["max_options"] == 255 and "max_inputs" not in card["limits"]


def test_rows_are_keyed_by_their_ids_labels_and_prefix(unshared, shared):
    from vllm_srun.families.causal_readout.model import row_key

    key = row_key([1, 2, 3], [7, 8], 0)
    assert key == row_key((1, 2, 3), (7, 8), 0)
    assert len(key) == 32 and int(key, 16) >= 0
    others = {
        row_key([1, 2, 4], [7, 8], 0),
        row_key([1, 2, 3], [7, 9], 0),
        row_key([1, 2, 3], [7, 8], 2),
        row_key([1, 2], [3, 7, 8], 0),
        row_key([1, 2, 3, 7], [8], 0),
    }
    assert key not in others and len(others) == 5
    # The same question with and without shared context: same ids, different rows.
    single = {"state": STATE, "questions": {"a": NOUL, "b": SCORE}}
    alone = unshared["qwen3"].loaded.plan("decisions", read_request("decisions", single)).items
    with_prefix = shared["qwen3"].loaded.plan("decisions", read_request("decisions", single)).items
    assert [r.input_ids for r in alone] == [r.input_ids for r in with_prefix]
    assert all(a.key != b.key for a, b in zip(alone, with_prefix, strict=True))
    assert [r.key for r in alone] == [row_key(r.input_ids, r.read_ids, 0) for r in alone]


def test_rows_with_different_prefixes_run_in_their_own_forwards(shared, unshared):
    """Two states' rows in one run: each state's rows continue their own prefix, and every
    row's logits equal the row run alone without a prefix."""
    model = shared["qwen3"].loaded
    body = {
        "state": STATE,
        "questions": {"angry": NOUL, "team": CHOICE},
        "states": [{"state": "The parcel never arrived", "questions": {"angry": NOUL, "u": SCORE}}],
    }
    plan = model.plan("decisions", read_request("decisions", body))
    assert len({r.input_ids[: r.prefix] for r in plan.items}) == 2
    calls = []
    original = model.engine_model.forward
    model.engine_model.forward = lambda batch: calls.append(batch) or original(batch)
    try:
        together = model.run(plan.items)
    finally:
        model.engine_model.forward = original
    assert [c.input_ids.shape[0] for c in calls] == [2, 2]
    assert [c.prefix_ids.shape[0] for c in calls] == [r.prefix for r in plan.items[::2]]
    plain = unshared["qwen3"].loaded
    for row, logits in zip(plan.items, together, strict=True):
        [alone] = plain.run([ReadoutRow(row.input_ids, None, "k", read_ids=row.read_ids)])
        assert logits.shape == (len(row.read_ids),)
        np.testing.assert_allclose(logits, alone, rtol=1e-5, atol=1e-5)


def test_only_readout_rows_run():
    from vllm_srun.families.causal_readout.model import _row
    from vllm_srun.plugins.spec import WorkItem

    with pytest.raises(TypeError) as err:
        _row(WorkItem((1, 2), None, "k"))
    assert str(err.value) == "causal_readout runs its own ReadoutRow rows only"


# -- conformance and golden ---------------------------------------------------------------------
def test_the_plugin_conforms_alone():
    report = assert_conforms("causal_readout")
    assert any(
        f.check == "family causal_readout: decisions through native" for f in report.findings
    )


def test_golden_requests_answer_every_question(shared):
    served = shared["qwen3"]
    for golden in CausalReadoutFamily().golden(served.package):
        assert golden["surface"] == "decisions"
        body = served.answer("decisions", golden["body"])
        assert body["answers"] and all("error" not in a for a in body["answers"].values())


def test_a_template_that_prints_a_date_fixes_it(tmp_path, catalog):
    """A template's date is fixed, so answers stay the same every day."""
    import transformers

    dated = (
        "{% if date_string is defined %}[{{ date_string }}]{% endif %}"
        "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
        "{{ message['content'] }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
    )
    package = write_decoder(tmp_path, "qwen3", chat_template=dated, name="dated")
    served = load_model(package, LoadOptions(device="cpu"), catalog=catalog)
    [row] = served.loaded.plan(
        "decisions", read_request("decisions", {"state": STATE, "questions": {"q": NOUL}})
    ).items
    text = transformers.AutoTokenizer.from_pretrained(package).decode(row.input_ids)
    assert text.startswith("[26 Jul 2024]<|im_start|>user\nState:\n")
    assert text.count("Question: Is the customer angry?") == 1


@pytest.mark.parametrize(
    ("name", "template", "placed"),
    [
        (
            "twice",
            "{% for m in messages %}{{ m['content'] }}\n{{ m['content'] }}{% endfor %}"
            "<|im_start|>assistant\n",
            2,
        ),
        ("upper", "{% for m in messages %}{{ m['content'] | upper }}{% endfor %}", 0),
        ("dropped", "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n", 0),
    ],
)
def test_a_template_that_does_not_place_the_question_once_is_refused(
    tmp_path, catalog, name, template, placed
):
    """Rendering such a template whole would lose the question or read its text as
    control tokens (``<|im_end|>`` inside a state)."""
    package = write_decoder(tmp_path, "qwen3", chat_template=template, name=name)
    with pytest.raises(LoadError) as raised:
        load_model(package, LoadOptions(device="cpu"), catalog=catalog)
    assert f"the chat template places the user message {placed} times" in str(raised.value)


def test_a_blank_template_means_the_plain_one(tmp_path, catalog):
    package = write_decoder(tmp_path, "qwen3", chat_template="  ", name="blank")
    served = load_model(package, LoadOptions(device="cpu"), catalog=catalog)
    assert served.loaded.card()["decisions"]["template"] == "plain"


def test_the_probe_rows_are_unshared_and_ignore_max_model_len(packages, catalog):
    """The load-time probe measures the model's numerics whatever an operator admits."""
    served = load_model(
        packages["gpt2"], LoadOptions(device="cpu", max_model_len=5), catalog=catalog
    )
    items = served.loaded.probe_items()
    assert len(items) == 3 and all(isinstance(r, ReadoutRow) for r in items)
    assert all(r.prefix == 0 and r.tokens > 5 for r in items)
    assert [len(r.read_ids) for r in items] == [2, 3, 4]
    assert served.card()["batch_invariance"]["max_abs_deviation"] <= 1e-5


def test_shared_context_asked_for_explicitly_is_on(packages, catalog):
    served = load_model(
        packages["gpt2"], LoadOptions(device="cpu", enable_shared_context=True), catalog=catalog
    )
    assert served.card()["decisions"]["shared_context"] is True
    plan = served.loaded.plan("decisions", read_request("decisions", REQUEST))
    assert all(r.prefix > 10 for r in plan.items)


def test_an_engine_returning_the_wrong_number_of_rows_is_an_error_not_a_shifted_answer(unshared):
    model = unshared["gpt2"].loaded
    plan = model.plan("decisions", read_request("decisions", REQUEST))
    original = model.engine_model.forward
    model.engine_model.forward = lambda batch: original(batch)[:-1]
    try:
        with pytest.raises(ValueError, match="zip"):
            model.run(plan.items)
    finally:
        model.engine_model.forward = original
