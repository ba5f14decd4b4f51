"""The option-text readouts (``option_sum``, ``option_mean``) on a tiny random decoder."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from vllm_srun.compose.loader import LoadError, LoadOptions, load_model
from vllm_srun.families.causal_readout import shipped_calibration
from vllm_srun.families.causal_readout.readouts import option_message, option_texts
from vllm_srun.plugins.decisions import parse_request
from vllm_srun.plugins.host import load_catalog

from ..fixtures import write_decoder
from .test_causal_readout import CHOICE, NOUL, SCORE, STATE, reference_logits

QUESTIONS = {"team": CHOICE, "angry": NOUL, "urgency": SCORE}


@pytest.fixture(scope="module")
def catalog():
    return load_catalog({})


@pytest.fixture(scope="module")
def served(tmp_path_factory, catalog):
    root = tmp_path_factory.mktemp("option-readouts")
    models = {}
    for readout in ("option_sum", "option_mean", "letters_cf", "letters"):
        package = write_decoder(
            root, "qwen3", calibration={"temperature": {}, "readout": readout}, name=readout
        )
        models[readout] = load_model(package, LoadOptions(device="cpu"), catalog=catalog)
    return models


def test_the_option_message_lists_the_options_without_labels():
    [question] = parse_request({"state": STATE, "questions": {"q": CHOICE}}).entries[0].questions
    assert option_message(STATE, question) == (
        "State:\nMy card was charged twice for the same order\n\n"
        "Question: Which team should handle this?\nOptions:\n"
        "- billing: Payments, charges, refunds and invoices\n"
        "- shipping: Delivery, parcels and tracking\n"
        "- technical: Bugs, errors, crashes and login problems\n"
        "Reply with one of: billing, shipping, technical."
    )
    [noul] = parse_request({"state": STATE, "questions": {"q": NOUL}}).entries[0].questions
    assert option_texts(noul) == ("no", "yes")
    assert option_message(STATE, noul).endswith(
        "Options:\n- no: calm\n- yes: angry\nReply with one of: yes, no."
    )


def expected_scores(model, name):
    """Per option, the summed log-probability of its reply tokens from a direct transformers
    forward over each full sequence (prompt + the reply's first j tokens)."""
    question = next(
        q
        for q in parse_request({"state": STATE, "questions": QUESTIONS}).entries[0].questions
        if q.name == name
    )
    renderer = model.loaded.renderer
    prompt = renderer.encode(option_message(STATE, question))
    replies = [
        renderer.text.encode(t, add_special_tokens=False).ids for t in option_texts(question)
    ]
    rows = [prompt + reply[:j] for reply in replies for j in range(len(reply))]
    logprobs = torch.log_softmax(reference_logits(str(model.spec.package), rows).double(), 1)
    sums, row = [], 0
    for reply in replies:
        total = 0.0
        for token in reply:
            total += float(logprobs[row, token])
            row += 1
        sums.append(total)
    return sums, [len(r) for r in replies]


def softmax(values):
    top = max(values)
    weights = [math.exp(v - top) for v in values]
    return [w / sum(weights) for w in weights]


def log_softmax(values):
    top = max(values)
    total = math.log(sum(math.exp(v - top) for v in values))
    return [v - top - total for v in values]


@pytest.mark.parametrize("readout", ["option_sum", "option_mean"])
def test_answers_are_the_softmax_of_each_options_reply_log_probability(served, readout):
    model = served[readout]
    body = model.answer("decisions", {"state": STATE, "questions": QUESTIONS})
    assert model.card()["decisions"]["readout"] == readout
    for name in QUESTIONS:
        sums, lengths = expected_scores(model, name)
        scores = (
            sums if readout == "option_sum" else [s / n for s, n in zip(sums, lengths, strict=True)]
        )
        want = softmax(scores)
        got = body["answers"][name]
        if got["type"] == "noul":
            assert got["noul"] == pytest.approx(want[1], abs=1e-5)
        else:
            assert list(got["probabilities"].values()) == pytest.approx(want, abs=1e-5)


def test_a_question_alone_equals_the_same_question_among_others(served):
    model = served["option_sum"]
    together = model.answer("decisions", {"state": STATE, "questions": QUESTIONS})["answers"]
    for name, question in QUESTIONS.items():
        alone = model.answer("decisions", {"state": STATE, "questions": {name: question}})
        for key, value in alone["answers"][name].items():
            if isinstance(value, dict | float):
                assert value == pytest.approx(together[name][key], abs=1e-5)
            else:
                assert value == together[name][key]


def test_a_reply_over_the_limit_fails_that_question_only(tmp_path, catalog):
    package = write_decoder(
        tmp_path, "qwen3", calibration={"temperature": {}, "readout": "option_sum"}
    )
    model = load_model(package, LoadOptions(device="cpu", max_model_len=80), catalog=catalog)
    body = model.answer("decisions", {"state": STATE, "questions": QUESTIONS})
    team = body["answers"]["team"]
    assert (team["type"], team["error"]) == ("choice", "max_length_exceeded")
    assert team["message"].startswith("the question is ")
    assert team["message"].endswith(
        "tokens with its state; this model takes at most 80 (max_model_len); shorten the "
        "state or the question"
    )


def test_an_unknown_readout_fails_the_load(tmp_path, catalog):
    package = write_decoder(
        tmp_path, "qwen3", calibration={"temperature": {}, "readout": "letters_perm"}
    )
    with pytest.raises(LoadError) as raised:
        load_model(package, LoadOptions(device="cpu"), catalog=catalog)
    assert str(raised.value).endswith(
        "calibration.json: readout 'letters_perm' is not one of letters, letters_cf, "
        "option_sum, option_mean"
    )


def test_a_shipped_calibration_is_found_by_its_gguf_digest(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"gguf_sha256": "1" * 64}))
    (tmp_path / "b.json").write_text(json.dumps({"gguf_sha256": "2" * 64}))
    (tmp_path / "broken.json").write_text("{")
    assert shipped_calibration("2" * 64, tmp_path) == tmp_path / "b.json"
    assert shipped_calibration("3" * 64, tmp_path) is None


def test_letters_cf_subtracts_the_content_free_states_label_log_probabilities(served):
    calibrated, plain = served["letters_cf"], served["letters"]
    body = {"state": STATE, "questions": QUESTIONS}
    got = calibrated.answer("decisions", body)["answers"]
    own = plain.loaded.plan("decisions", parse_request(body))
    free = plain.loaded.plan("decisions", parse_request({**body, "state": "N/A"}))
    own_rows = plain.run_items(own.items)
    free_rows = plain.run_items(free.items)
    for index, name in enumerate(QUESTIONS):
        own, free = ([float(v) for v in rows[index]] for rows in (own_rows, free_rows))
        assert all(isinstance(r, np.ndarray) for r in (own_rows[index], free_rows[index]))
        scores = [a - b for a, b in zip(log_softmax(own), log_softmax(free), strict=True)]
        want = softmax(scores)
        if got[name]["type"] == "noul":
            assert got[name]["noul"] == pytest.approx(want[1], abs=1e-5)
        else:
            assert list(got[name]["probabilities"].values()) == pytest.approx(want, abs=1e-5)
    assert calibrated.card()["decisions"]["readout"] == "letters_cf"
