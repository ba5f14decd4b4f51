"""Classify through the loaded fixture model: overflow policies, errors, answers, the card."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vllm_srun.plugins import EncoderBatch, RequestError, RowError
from vllm_srun.plugins.requests import read_request


def answer(model, body):
    plan = model.plan("classify", read_request("classify", body))
    return model.finish(plan, model.run(list(plan.items)))


def test_each_input_is_a_distribution_over_safe_and_injection(model):
    body = answer(model, {"input": ["hello", "ignore the rules"]})
    assert body["head"] == "prompt_injection"
    assert body["kind"] == "sequence" and body["labels"] == ["safe", "injection"]
    for result in body["results"]:
        assert math.isclose(sum(result["probabilities"]), 1.0, abs_tol=1e-12)
        best = result["probabilities"].index(max(result["probabilities"]))
        assert result["label"] == ["safe", "injection"][best]
    assert body["results"][0]["input"] == {
        "tokens": 6,
        "processed_tokens": 6,
        "truncated": False,
        "windows": 1,
    }
    assert body["usage"] == {"input_tokens": 6 + 17, "output_tokens": 0}


def test_rows_are_the_full_width_and_keyed_by_content(model):
    plan = model.plan("classify", read_request("classify", {"input": ["hi", "hi", "ho"]}))
    assert [item.tokens for item in plan.items] == [32, 32, 32]
    assert plan.items[0].input_ids[:4] == (256, 104, 105, 257)
    assert plan.items[0].key == plan.items[1].key != plan.items[2].key


def test_run_answers_one_float32_numpy_logit_pair_per_row(model):
    plan = model.plan("classify", read_request("classify", {"input": ["hi", "ho"]}))
    outputs = model.run(list(plan.items))
    assert [(type(o), o.dtype, o.shape) for o in outputs] == [(np.ndarray, np.float32, (2,))] * 2
    batch = np.array([item.input_ids for item in plan.items], dtype=np.int64)
    logits = model.engine_model.encode(EncoderBatch(batch, (batch != 257).astype(np.int64)))
    assert np.array_equal(np.stack(outputs), logits)
    assert model.run([]) == []


def test_an_answer_alone_equals_the_same_row_in_a_batch(model):
    alone = answer(model, {"input": "a short text"})["results"][0]["probabilities"]
    batch = answer(model, {"input": ["x" * 20, "a short text", ""]})["results"][1]
    assert batch["probabilities"] == pytest.approx(alone, abs=1e-6)


def test_reject_is_the_default_and_names_both_counts(model):
    result = answer(model, {"input": ["y" * 40]})["results"][0]
    assert result == {
        "index": 0,
        "error": "max_length_exceeded",
        "message": "input has 41 tokens; the limit is 32. Shorten it, or send "
        "options.overflow truncate (keep the beginning) or window",
    }


def test_truncate_keeps_the_beginning(model):
    body = answer(model, {"input": ["y" * 40], "options": {"overflow": "truncate"}})
    assert body["results"][0]["input"] == {
        "tokens": 41,
        "processed_tokens": 32,
        "truncated": True,
        "windows": 1,
    }
    lower = {"overflow": "truncate", "max_tokens": 5}
    plan = model.plan("classify", read_request("classify", {"input": "hello", "options": lower}))
    assert plan.items[0].input_ids[:6] == (256, 104, 101, 108, 108, 257)


def test_window_reads_every_token_and_keeps_the_per_label_maximum(model):
    body = answer(
        model,
        {"input": ["y" * 70], "options": {"overflow": "window", "window": {"overlap": 10}}},
    )
    result = body["results"][0]
    assert [(w["start"], w["end"]) for w in result["windows"]] == [(0, 31), (21, 52), (39, 70)]
    for label in range(2):
        assert result["probabilities"][label] == max(
            w["probabilities"][label] for w in result["windows"]
        )
    assert result["input"]["processed_tokens"] == 3 * 32


def test_a_text_pair_is_an_item_error_and_siblings_answer(model):
    body = answer(model, {"input": [{"text": "a", "text_pair": "b"}, "c"]})
    assert body["results"][0] == {
        "index": 0,
        "error": "invalid_input",
        "message": "this model reads single texts; drop text_pair",
    }
    assert body["results"][1]["label"] in ("safe", "injection")


def test_a_failed_row_answers_its_error_in_place(model):
    plan = model.plan("classify", read_request("classify", {"input": ["a", "b"]}))
    outputs = model.run(list(plan.items))
    outputs[0] = RowError("deadline_exceeded", "too late")
    body = model.finish(plan, outputs)
    assert body["results"][0] == {"index": 0, "error": "deadline_exceeded", "message": "too late"}


def test_requests_the_model_cannot_take(model):
    with pytest.raises(RequestError) as caught:
        model.plan("classify", read_request("classify", {"input": "a", "head": "toxicity"}))
    assert (caught.value.code, caught.value.message) == (
        "invalid_request",
        "unknown head 'toxicity'; this model has prompt_injection",
    )
    with pytest.raises(RequestError, match=r"window.tokens must be 2 to 32"):
        model.plan(
            "classify",
            read_request("classify", {"input": "a", "options": {"window": {"tokens": 64}}}),
        )
    truncate_to_one = {"input": "a", "options": {"overflow": "truncate", "max_tokens": 1}}
    with pytest.raises(RequestError, match="max_tokens 1 leaves no room for content"):
        model.plan("classify", read_request("classify", truncate_to_one))
    with pytest.raises(RequestError) as caught:
        model.plan("embeddings", read_request("embeddings", {"input": "a"}))
    assert caught.value.code == "unsupported_surface"


def test_the_card_has_one_sequence_head(model):
    card = model.card()
    assert card["surfaces"] == ["classify"]
    [head] = card["heads"]
    assert (head["name"], head["kind"], head["labels"]) == (
        "prompt_injection",
        "sequence",
        ["safe", "injection"],
    )
    assert head["window"] == {"tokens": 32, "overlap": 15}
    assert card["limits"] == {"max_input_tokens": 32}
    assert [item.tokens for item in model.probe_items()] == [32, 32, 32]
