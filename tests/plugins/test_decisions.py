"""The decisions schema (every rule), duplicate keys in raw JSON, and the readout maths."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from vllm_srun.plugins.decisions import (
    InvalidQuestion,
    Option,
    Question,
    answer,
    choice_answer,
    confidence,
    describe_path,
    is_blank,
    is_encodable,
    loads_checked,
    non_finite,
    noul_answer,
    parse_body,
    parse_request,
    score_answer,
    softmax,
    state_text,
)
from vllm_srun.plugins.spec import RequestError

CHOICE = {
    "type": "choice",
    "instructions": "Which team should handle this?",
    "criteria": {"billing": "Payments", "shipping": None},
}
NOUL = {"type": "noul", "instructions": "Is the customer angry?"}
SCORE = {"type": "score", "instructions": "How urgent?", "criteria": ["low", "high"]}


def request(**questions):
    return {"state": "My card was charged twice", "questions": questions}


def only(question):
    """Parse a request holding ``question`` beside a valid one; return the first's result."""
    parsed = parse_request(request(q=question, ok=NOUL))
    return parsed.entries[0].questions[0]


def message_of(question):
    result = only(question)
    assert isinstance(result, InvalidQuestion), result
    return result.message


# -- duplicate keys in raw JSON ---------------------------------------------------------------
def test_loads_checked_reports_each_duplicate_by_path():
    raw = (
        b'{"state": "s", "questions": {"q": {"type": "choice", "instructions": "i",'
        b' "criteria": {"a": "1", "b": "2", "a": "3"}}, "list": [{"x": 1, "x": 2}]}}'
    )
    value, duplicates = loads_checked(raw)
    assert duplicates == [("questions", "q", "criteria", "a"), ("questions", "list", 0, "x")]
    assert value["questions"]["q"]["criteria"] == {"a": "3", "b": "2"}
    assert type(value["questions"]["q"]) is dict


def test_loads_checked_without_duplicates_and_bad_json():
    assert loads_checked('{"a": [1, {"b": null}]}') == ({"a": [1, {"b": None}]}, [])
    with pytest.raises(RequestError, match="not valid JSON") as err:
        loads_checked(b'{"a": ')
    assert err.value.code == "invalid_request"
    with pytest.raises(RequestError, match="NaN is not a JSON number"):
        loads_checked(b'{"a": NaN}')


def test_describe_path():
    assert describe_path(("questions", "q1", "choices", 0, "key")) == "questions.q1.choices[0].key"
    assert describe_path(("states", 2)) == "states[2]"


def test_a_duplicate_key_inside_a_question_fails_that_question_only():
    raw = json.dumps(request(ok=NOUL))[:-2] + (
        ', "dup": {"type": "noul", "type": "choice", "instructions": "i"}}}'
    )
    parsed = parse_body(raw.encode())
    ok, dup = parsed.entries[0].questions
    assert isinstance(ok, Question)
    assert isinstance(dup, InvalidQuestion)
    assert dup.message == "questions.dup has the key 'type' more than once"


def test_a_duplicate_option_key_names_the_criteria():
    raw = (
        b'{"state": "s", "questions": {"ok": {"type": "noul", "instructions": "i"},'
        b' "q": {"type": "choice", "instructions": "i",'
        b' "criteria": {"a": "1", "a": "2", "b": "3"}}}}'
    )
    q = parse_body(raw).entries[0].questions[1]
    assert isinstance(q, InvalidQuestion)
    assert q.message == "questions.q.criteria has the key 'a' more than once"
    assert q.answer() == {"type": "choice", "error": "invalid_question", "message": q.message}


def test_a_duplicate_question_name_fails_that_question():
    raw = (
        b'{"state": "s", "questions": {"q": {"type": "noul", "instructions": "i"},'
        b' "q": {"type": "noul", "instructions": "j"},'
        b' "ok": {"type": "noul", "instructions": "k"}}}'
    )
    first, ok = parse_body(raw).entries[0].questions
    assert isinstance(first, InvalidQuestion) and isinstance(ok, Question)
    assert first.message == "questions has the question 'q' more than once"


def test_a_duplicate_key_outside_questions_fails_the_request():
    raw = b'{"state": "a", "state": "b", "questions": {"q": {"type": "noul", "instructions": "i"}}}'
    with pytest.raises(RequestError, match="the request has the key 'state' more than once"):
        parse_body(raw)
    raw = (
        b'{"state": "a", "questions": {"q": {"type": "noul", "instructions": "i"}},'
        b' "options": {"profile": "exact", "profile": "exact"}}'
    )
    with pytest.raises(RequestError, match="options has the key 'profile' more than once"):
        parse_body(raw)


def test_duplicates_inside_a_states_entry_question():
    raw = (
        b'{"state": "a", "questions": {"q": {"type": "noul", "instructions": "i"}},'
        b' "states": [{"state": "b", "questions": {"r": {"type": "noul", "instructions": "i",'
        b' "instructions": "j"}}}]}'
    )
    parsed = parse_body(raw)
    [r] = parsed.entries[1].questions
    assert isinstance(r, InvalidQuestion)
    assert r.message == "states[0].questions.r has the key 'instructions' more than once"


# -- valid forms ------------------------------------------------------------------------------
def test_valid_questions_in_every_form():
    parsed = parse_request(
        request(
            choice=CHOICE,
            choices={
                "type": "choice",
                "instructions": "Pick",
                "choices": [{"key": "x", "description": "ex"}, {"key": "y"}],
            },
            noul=NOUL,
            noul_criteria={
                "type": "noul",
                "instructions": "Late?",
                "criteria": {"true": "late", "false": "on time"},
            },
            noul_choices={
                "type": "noul",
                "instructions": "Late?",
                "choices": [{"key": "true", "description": "late"}, {"key": "false"}],
            },
            score=SCORE,
            levels={"type": "score", "instructions": "Rate", "levels": ["a", "b", "c"]},
        )
    )
    q = {question.name: question for question in parsed.entries[0].questions}
    assert all(isinstance(v, Question) for v in q.values())
    assert q["choice"].keys == ("billing", "shipping")
    assert q["choice"].options[1].description is None
    assert q["choices"].keys == ("x", "y")
    assert [o.description for o in q["choices"].options] == ["ex", None]
    assert q["noul"].keys == ("false", "true")
    assert [o.description for o in q["noul_criteria"].options] == ["on time", "late"]
    assert [o.description for o in q["noul_choices"].options] == [None, "late"]
    assert q["score"].keys == ("0", "1")
    assert [o.description for o in q["levels"].options] == ["a", "b", "c"]
    assert parsed.profile is None and parsed.deadline_ms is None
    assert parsed.return_meta is False and parsed.has_states is False


def test_counts_at_the_bounds_are_valid():
    keys = {f"k{i}": None for i in range(255)}
    assert isinstance(only({**CHOICE, "criteria": keys}), Question)
    assert isinstance(only({**SCORE, "criteria": [str(i) for i in range(10)]}), Question)


def test_options_and_states():
    parsed = parse_request(
        {
            "model": "m",
            "state": {"order": 1},
            "questions": {"q": NOUL},
            "states": [{"state": ["a", 1], "questions": {"q": NOUL, "r": SCORE}}],
            "options": {"deadline_ms": 250, "profile": "exact", "return_meta": True},
        }
    )
    assert parsed.model == "m" and parsed.deadline_ms == 250 and parsed.return_meta
    assert parsed.has_states and len(parsed.entries) == 2
    assert parsed.entries[1].where == ("states", 0)
    assert [q.name for q in parsed.entries[1].questions] == ["q", "r"]
    assert parsed.questions == 3


def test_state_text():
    assert state_text("plain text") == "plain text"
    assert state_text({"b": 1, "a": "é"}) == '{"b": 1, "a": "é"}'
    assert state_text([1, {"x": None}]) == '[1, {"x": null}]'


# -- every invalid_question rule --------------------------------------------------------------
INVALID = {
    "not an object": ("text", "questions.q must be an object, not a string"),
    "unknown field": (
        {**NOUL, "weight": 2},
        "questions.q.weight is not a field of a question (type, instructions, criteria, "
        "choices, levels)",
    ),
    "missing type": (
        {"instructions": "i"},
        "questions.q.type must be one of choice, noul, score, not missing",
    ),
    "unknown type": (
        {**NOUL, "type": "rank"},
        "questions.q.type must be one of choice, noul, score, not 'rank'",
    ),
    "missing instructions": ({"type": "noul"}, "questions.q.instructions is missing"),
    "noul with undescribed criteria and no instructions": (
        {"type": "noul", "criteria": {"true": None}},
        "questions.q.instructions is missing",
    ),
    "choice without instructions": (
        {k: v for k, v in CHOICE.items() if k != "instructions"},
        "questions.q.instructions is missing",
    ),
    "blank instructions": ({**NOUL, "instructions": "  \n"}, "questions.q.instructions is blank"),
    "zero-width instructions": (
        {**NOUL, "instructions": "\u200b\u200d"},
        "questions.q.instructions is blank",
    ),
    "instructions not text": (
        {**NOUL, "instructions": 3},
        "questions.q.instructions must be text, an object or an array, not a number",
    ),
    "empty structured instructions": (
        {**NOUL, "instructions": {"task": " ", "also": [None]}},
        "questions.q.instructions is an empty object",
    ),
    "lone surrogate": (
        {**NOUL, "instructions": "bad \ud800"},
        "questions.q.instructions holds a lone surrogate (not Unicode text)",
    ),
    "one option": (
        {**CHOICE, "criteria": {"a": None}},
        "questions.q.criteria has 1 option; a question takes 2 to 255",
    ),
    "256 options": (
        {**CHOICE, "criteria": {f"k{i}": None for i in range(256)}},
        "questions.q.criteria has 256 options; a question takes 2 to 255",
    ),
    "blank option key": (
        {**CHOICE, "criteria": {" ": None, "b": None}},
        "questions.q.criteria has a blank or malformed option key ' '",
    ),
    "blank description": (
        {**CHOICE, "criteria": {"a": "", "b": None}},
        "questions.q.criteria.a is blank (use null for no description)",
    ),
    "description not text": (
        {**CHOICE, "criteria": {"a": 1, "b": None}},
        "questions.q.criteria.a must be text, an object or an array, or null, not a number",
    ),
    "criteria not an object": (
        {**CHOICE, "criteria": ["a", "b"]},
        "questions.q.criteria must be an object of option keys to descriptions, not an array",
    ),
    "criteria and choices": (
        {**CHOICE, "choices": [{"key": "a"}, {"key": "b"}]},
        "questions.q takes criteria or choices, not both",
    ),
    "neither": (
        {"type": "choice", "instructions": "i"},
        "questions.q needs criteria (an object of options) or choices",
    ),
    "choices not a list": (
        {"type": "choice", "instructions": "i", "choices": {"a": 1}},
        "questions.q.choices must be an array of {key, description}, not an object",
    ),
    "choice item unknown field": (
        {"type": "choice", "instructions": "i", "choices": [{"key": "a", "label": 1}]},
        "questions.q.choices[0].label is not a field of a choice (key, description)",
    ),
    "choice item without key": (
        {"type": "choice", "instructions": "i", "choices": [{"description": "d"}]},
        "questions.q.choices[0].key is missing",
    ),
    "choice item blank key": (
        {"type": "choice", "instructions": "i", "choices": [{"key": ""}, {"key": "b"}]},
        "questions.q.choices[0].key is blank",
    ),
    "choice item blank description": (
        {"type": "choice", "instructions": "i", "choices": [{"key": "a", "description": " "}]},
        "questions.q.choices[0].description is blank (use null for no description)",
    ),
    "choice item not an object": (
        {"type": "choice", "instructions": "i", "choices": ["a", "b"]},
        "questions.q.choices[0] must be an object {key, description}, not a string",
    ),
    "choices repeat a key": (
        {"type": "choice", "instructions": "i", "choices": [{"key": "a"}, {"key": "a"}]},
        "questions.q.choices has the key 'a' twice",
    ),
    "one choice": (
        {"type": "choice", "instructions": "i", "choices": [{"key": "a"}]},
        "questions.q.choices has 1 option; a question takes 2 to 255",
    ),
    "levels on a choice": (
        {**CHOICE, "levels": ["a", "b"]},
        "questions.q.levels does not apply to a choice question; use choices",
    ),
    "choices on a score": (
        {**SCORE, "choices": [{"key": "a"}, {"key": "b"}]},
        "questions.q.choices does not apply to a score question; use levels",
    ),
    "criteria and levels": (
        {**SCORE, "levels": ["a", "b"]},
        "questions.q takes criteria or levels, not both",
    ),
    "score without levels": (
        {"type": "score", "instructions": "i"},
        "questions.q needs criteria or levels (a list of level descriptions)",
    ),
    "one level": (
        {**SCORE, "criteria": ["only"]},
        "questions.q.criteria has 1 level; a question takes 2 to 10",
    ),
    "eleven levels": (
        {"type": "score", "instructions": "i", "levels": [str(i) for i in range(11)]},
        "questions.q.levels has 11 levels; a question takes 2 to 10",
    ),
    "levels not a list": (
        {**SCORE, "criteria": {"0": "a"}},
        "questions.q.criteria must be an array of level descriptions, not an object",
    ),
    "blank level": ({**SCORE, "criteria": ["a", " "]}, "questions.q.criteria[1] is blank"),
    "null level": (
        {**SCORE, "criteria": ["a", None]},
        "questions.q.criteria[1] must be text, an object or an array, not null",
    ),
    "noul wrong keys": (
        {**NOUL, "criteria": {"yes": "a", "no": "b"}},
        "questions.q.criteria takes the keys false and true (either or both), not no, yes",
    ),
    "noul extra key": (
        {**NOUL, "criteria": {"true": "a", "maybe": "b"}},
        "questions.q.criteria takes the keys false and true (either or both), not maybe, true",
    ),
    "noul levels": (
        {**NOUL, "levels": ["a", "b"]},
        "questions.q.levels does not apply to a noul question; use choices",
    ),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_each_schema_rule_fails_only_its_question(case):
    question, expected = INVALID[case]
    parsed = parse_request(request(q=question, ok=NOUL))
    bad, ok = parsed.entries[0].questions
    assert isinstance(ok, Question)
    assert isinstance(bad, InvalidQuestion)
    assert bad.message == expected
    assert bad.answer()["error"] == "invalid_question"
    assert parsed.problems == (expected,)


def test_invalid_answer_keeps_the_type_when_known():
    assert only({**NOUL, "extra": 1}).answer()["type"] == "noul"
    assert only({"type": "rank", "instructions": "i"}).answer()["type"] is None


def test_blank_question_name():
    bad = parse_request(request(**{" ": NOUL, "ok": NOUL})).entries[0].questions[0]
    assert isinstance(bad, InvalidQuestion)
    assert bad.message == "questions has a blank or malformed question name"


def test_a_request_with_only_bad_questions_lists_each_reason():
    with pytest.raises(RequestError) as err:
        parse_request(request(a={"type": "noul"}, b={**SCORE, "criteria": ["x"]}))
    assert err.value.code == "invalid_request"
    assert err.value.message == (
        "no question is valid: questions.a.instructions is missing; "
        "questions.b.criteria has 1 level; a question takes 2 to 10"
    )


def test_bad_questions_in_every_entry_fail_the_request_but_one_good_one_saves_it():
    body = {
        "state": "s",
        "questions": {"a": {"type": "noul"}},
        "states": [{"state": "t", "questions": {"b": NOUL}}],
    }
    parsed = parse_request(body)
    assert isinstance(parsed.entries[0].questions[0], InvalidQuestion)
    body["states"][0]["questions"] = {"b": {"type": "x"}}
    with pytest.raises(RequestError, match=r"no question is valid: questions\.a\.instructions"):
        parse_request(body)


# -- request-level rules ----------------------------------------------------------------------
REQUEST_ERRORS = {
    "not an object": (["a"], "the request must be a JSON object"),
    "unknown field": (
        {"state": "s", "questions": {"q": NOUL}, "input": "x"},
        "input is not a field of a decisions request "
        "(model, state, questions, states, images, options)",
    ),
    "no state": ({"questions": {"q": NOUL}}, "state is missing"),
    "blank state": ({"state": " \u200b", "questions": {"q": NOUL}}, "state is blank"),
    "numeric state": (
        {"state": 3, "questions": {"q": NOUL}},
        "state must be text, an object or an array, not a number",
    ),
    "surrogate state": (
        {"state": {"a": "\udc00"}, "questions": {"q": NOUL}},
        "state holds a lone surrogate",
    ),
    "no questions": ({"state": "s"}, "questions must be an object of named questions, not missing"),
    "empty questions": (
        {"state": "s", "questions": {}},
        "questions must be an object of named questions, not empty",
    ),
    "questions list": (
        {"state": "s", "questions": [NOUL]},
        "questions must be an object of named questions, not an array",
    ),
    "options not object": (
        {"state": "s", "questions": {"q": NOUL}, "options": 1},
        "options must be an object, not a number",
    ),
    "unknown option": (
        {"state": "s", "questions": {"q": NOUL}, "options": {"overflow": "window"}},
        "options.overflow is not an option of decisions (deadline_ms, profile, return_meta)",
    ),
    "profile": (
        {"state": "s", "questions": {"q": NOUL}, "options": {"profile": "Fast"}},
        "options.profile must be a profile name (lower-case letters, digits and _, such as "
        "exact, batching or max_speed), not 'Fast'",
    ),
    "deadline": (
        {"state": "s", "questions": {"q": NOUL}, "options": {"deadline_ms": 0}},
        "options.deadline_ms must be a number above 0, not 0",
    ),
    "deadline bool": (
        {"state": "s", "questions": {"q": NOUL}, "options": {"deadline_ms": True}},
        "options.deadline_ms must be a number above 0, not True",
    ),
    "return_meta": (
        {"state": "s", "questions": {"q": NOUL}, "options": {"return_meta": "yes"}},
        "options.return_meta must be true or false",
    ),
    "states neither an object nor a list": (
        {"state": "s", "questions": {"q": NOUL}, "states": 5},
        "states must be an object of named {state, questions} entries or an array of them, "
        "not a number",
    ),
    "named states entry not an object": (
        {"state": "s", "questions": {"q": NOUL}, "states": {"state": "t"}},
        "states.state must be an object {state, questions}, not a string",
    ),
    "states entry not an object": (
        {"state": "s", "questions": {"q": NOUL}, "states": ["t"]},
        "states[0] must be an object {state, questions}, not a string",
    ),
    "states entry unknown field": (
        {"state": "s", "questions": {"q": NOUL}, "states": [{"state": "t", "x": 1}]},
        "states[0].x is not a field of a state entry (state, questions, images)",
    ),
    "states entry blank state": (
        {
            "state": "s",
            "questions": {"q": NOUL},
            "states": [{"state": "", "questions": {"q": NOUL}}],
        },
        "states[0].state is blank",
    ),
    "states entry without questions": (
        {"state": "s", "questions": {"q": NOUL}, "states": [{"state": "t"}]},
        "states[0].questions must be an object of named questions, not missing",
    ),
    "model not text": (
        {"model": 1, "state": "s", "questions": {"q": NOUL}},
        "model must be a string, not a number",
    ),
}


@pytest.mark.parametrize("case", list(REQUEST_ERRORS))
def test_request_level_problems_are_invalid_request(case):
    body, expected = REQUEST_ERRORS[case]
    with pytest.raises(RequestError) as err:
        parse_request(body)
    assert err.value.code == "invalid_request"
    assert err.value.message == expected


@pytest.mark.parametrize("raw", [b"[1, 2]", b"3", b"null", b'"text"'])
def test_parse_body_needs_an_object(raw):
    with pytest.raises(RequestError) as err:
        parse_body(raw)
    assert err.value.code == "invalid_request"
    assert err.value.message == "the request must be a JSON object"


def test_extra_fields_the_caller_handles():
    body = {"surface": "decisions", "state": "s", "questions": {"q": NOUL}}
    assert parse_request(body, extra_fields=("surface",)).entries[0].valid


# -- readout maths ----------------------------------------------------------------------------
def test_softmax_matches_the_formula_and_sums_to_one():
    logits = np.array([2.0, -1.0, 0.5], dtype=np.float32)
    p = softmax(logits)
    z = [2.0, -1.0, 0.5]
    expected = [math.exp(v - 2.0) / sum(math.exp(w - 2.0) for w in z) for v in z]
    assert isinstance(p, np.ndarray) and p.dtype == np.float64
    assert p.tolist() == pytest.approx(expected, abs=1e-15)
    assert abs(float(p.sum()) - 1.0) < 1e-12


def test_softmax_temperature_flattens_and_sharpens():
    logits = [1.0, 0.0]
    warm, plain, cold = softmax(logits, 2.0), softmax(logits, 1.0), softmax(logits, 0.5)
    assert float(warm[0]) == pytest.approx(1 / (1 + math.exp(-0.5)))
    assert float(cold[0]) == pytest.approx(1 / (1 + math.exp(-2.0)))
    assert float(warm[0]) < float(plain[0]) < float(cold[0])
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="temperature"):
            softmax(logits, bad)


def test_softmax_is_stable_for_large_logits():
    p = softmax([1000.0, 999.0])
    assert float(p[0]) == pytest.approx(1 / (1 + math.exp(-1)))


def test_confidence_is_one_minus_normalised_entropy():
    assert confidence([0.25, 0.25, 0.25, 0.25]) == pytest.approx(0.0, abs=1e-12)
    assert confidence([1.0, 0.0, 0.0]) == 1.0
    p = [0.7, 0.2, 0.1]
    entropy = -sum(v * math.log(v) for v in p)
    assert confidence(p) == pytest.approx(1 - entropy / math.log(3), abs=1e-12)
    assert confidence([0.5, 0.5, 0.0, 0.0]) == pytest.approx(0.5, abs=1e-12)


def test_choice_answer_shape_and_values():
    result = choice_answer(["billing", "shipping", "technical"], [1.0, 3.0, 0.0])
    # softmax written out: exp(z - 3) / sum exp(z - 3)
    weights = [math.exp(-2.0), 1.0, math.exp(-3.0)]
    p = [w / sum(weights) for w in weights]
    entropy = -sum(v * math.log(v) for v in p)
    assert result == {
        "type": "choice",
        "choice": "shipping",
        "probabilities": {
            "billing": pytest.approx(p[0], abs=1e-15),
            "shipping": pytest.approx(p[1], abs=1e-15),
            "technical": pytest.approx(p[2], abs=1e-15),
        },
        "confidence": pytest.approx(1 - entropy / math.log(3), abs=1e-12),
    }
    assert list(result) == ["type", "choice", "probabilities", "confidence"]
    assert list(result["probabilities"]) == ["billing", "shipping", "technical"]
    assert abs(sum(result["probabilities"].values()) - 1) < 1e-12
    # The temperature divides every logit: T = 2 halves the gaps.
    warm = choice_answer(["billing", "shipping", "technical"], [1.0, 3.0, 0.0], temperature=2.0)
    weights = [math.exp(-1.0), 1.0, math.exp(-1.5)]
    assert list(warm["probabilities"].values()) == pytest.approx(
        [w / sum(weights) for w in weights], abs=1e-15
    )


def test_a_tie_takes_the_first_option():
    assert choice_answer(["a", "b"], [0.0, 0.0])["choice"] == "a"


def test_noul_answer_is_p_true():
    result = noul_answer([0.0, math.log(3.0)])
    assert result == {"type": "noul", "noul": pytest.approx(0.75, abs=1e-15)}
    assert noul_answer([0.0, math.log(3.0)], temperature=2.0)["noul"] == pytest.approx(
        math.sqrt(3) / (1 + math.sqrt(3))
    )


def test_score_answer_expected_level_and_legend():
    result = score_answer(["low", "mid", "high"], [0.0, 0.0, math.log(2.0)])
    assert result["type"] == "score"
    assert result["probabilities"] == {
        "0": pytest.approx(0.25),
        "1": pytest.approx(0.25),
        "2": pytest.approx(0.5),
    }
    assert result["score"] == pytest.approx(0 * 0.25 + 1 * 0.25 + 2 * 0.5)
    assert result["legend"] == {"0": "low", "1": "mid", "2": "high"}
    assert 0 < result["confidence"] < 1


def test_non_finite_logits_are_invalid_model_output():
    assert choice_answer(["a", "b"], [float("nan"), 0.0]) == {
        "type": "choice",
        "error": "invalid_model_output",
        "message": "the model's logits are not finite",
    }
    assert noul_answer([float("inf"), 0.0])["error"] == "invalid_model_output"
    assert score_answer(["a", "b"], [0.0, float("-inf")])["error"] == "invalid_model_output"


def test_answer_dispatches_by_type():
    parsed = parse_request(request(c=CHOICE, n=NOUL, s=SCORE))
    c, n, s = parsed.entries[0].questions
    assert answer(c, [0.0, 1.0])["choice"] == "shipping"
    assert answer(n, [0.0, 0.0]) == {"type": "noul", "noul": 0.5}
    assert answer(s, [0.0, 0.0])["score"] == 0.5
    # Without a temperature the logits are read as they are (T = 1).
    assert answer(n, [0.0, math.log(3.0)])["noul"] == pytest.approx(0.75, abs=1e-15)
    assert answer(c, [0.0, math.log(3.0)])["probabilities"]["shipping"] == pytest.approx(0.75)
    assert answer(s, [0.0, math.log(3.0)])["score"] == pytest.approx(0.75)


# -- found by trying to break the surface -----------------------------------------------------
@pytest.mark.parametrize("state", [[], {}])
def test_an_empty_state_object_or_array_is_refused_like_a_blank_text(state):
    body = {"state": state, "questions": {"q": {"type": "noul", "instructions": "Is it?"}}}
    with pytest.raises(RequestError, match=r"state is an empty (array|object): there is nothing"):
        parse_request(body)


def test_states_without_a_state_says_how_the_request_is_shaped():
    body = {"states": [{"state": "x", "questions": {}}]}
    with pytest.raises(RequestError, match="state is missing; give `state` and `questions`"):
        parse_request(body)


@pytest.mark.parametrize("key", ["\u2063\u180e", "\u0000", "\u3164", " \u034f "])
def test_option_keys_that_show_nothing_are_blank(key):
    body = {
        "state": "x",
        "questions": {
            "bad": {"type": "choice", "instructions": "Pick", "criteria": {key: "a", "y": None}},
            "good": {"type": "noul", "instructions": "Is it?"},
        },
    }
    [entry] = parse_request(body).entries
    bad, good = entry.questions
    assert isinstance(bad, InvalidQuestion) and "blank" in bad.message
    assert isinstance(good, Question)


def test_nesting_too_deep_to_read_is_a_bad_request():
    with pytest.raises(RequestError, match="nests arrays or objects too deeply"):
        loads_checked("[" * 100_000 + "]" * 100_000)


def test_constants_are_read_only_when_asked_and_found_by_path():
    with pytest.raises(RequestError, match="NaN is not a JSON number"):
        loads_checked('{"a": NaN}')
    value, _ = loads_checked('{"a": [1, {"b": Infinity}]}', constants=True)
    assert non_finite(value) == ("a", 1, "b")
    assert non_finite({"a": [1.5, "NaN"]}) is None


# -- raw JSON: every duplicate once, constants, encodings ----------------------------------------
def test_a_key_repeated_three_times_is_reported_once_at_its_path():
    value, duplicates = loads_checked('{"a": 1, "a": 2, "b": [{"c": 1, "c": 2, "c": 3}], "a": 4}')
    assert duplicates == [("a",), ("b", 0, "c")]
    assert value == {"a": 4, "b": [{"c": 3}]}


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_json_constants_are_refused_by_name_unless_asked_for(constant):
    with pytest.raises(RequestError) as err:
        loads_checked(f'{{"a": [1, {constant}]}}')
    assert err.value.code == "invalid_request"
    assert err.value.message == (f"the body is not valid JSON: {constant} is not a JSON number")
    value, duplicates = loads_checked(f'{{"a": [1, {constant}]}}', constants=True)
    assert duplicates == [] and not math.isfinite(value["a"][1])
    assert non_finite(value) == ("a", 1)


def test_utf16_and_utf32_bodies_are_read_and_bad_utf8_is_not_json():
    text = '{"state": "café", "questions": {}}'
    for encoding in ("utf-16", "utf-32", "utf-8"):
        assert loads_checked(text.encode(encoding))[0]["state"] == "café"
    with pytest.raises(RequestError) as err:
        loads_checked(b'{"state": "\xff\xfe\xfa"}')
    assert err.value.code == "invalid_request"
    assert err.value.message.startswith("the body is not valid JSON: ")


def test_nesting_too_deep_says_to_flatten_the_state():
    with pytest.raises(RequestError) as err:
        loads_checked("[" * 100_000 + "]" * 100_000)
    assert err.value.code == "invalid_request"
    assert err.value.message == (
        "the body nests arrays or objects too deeply to read; flatten the state"
    )


def test_non_finite_finds_the_first_in_document_order_under_a_prefix():
    nan, inf = float("nan"), float("inf")
    document = {"a": [1.0, {"b": 2}], "c": [[3.0, -inf]], "d": nan}
    assert non_finite(document) == ("c", 0, 1)
    assert non_finite(document, ("tasks", 2)) == ("tasks", 2, "c", 0, 1)
    assert non_finite([0.5, [nan], inf]) == (1, 0)
    assert non_finite(inf) == ()
    assert non_finite({"a": {"b": [1, 2.5, "x", None, True]}}) is None


def test_describe_path_starting_with_an_index_and_a_single_key():
    assert describe_path((0, "a", 1)) == "[0].a[1]"
    assert describe_path(("options",)) == "options"
    assert describe_path(()) == ""


# -- text that shows nothing -------------------------------------------------------------------
@pytest.mark.parametrize(
    "text",
    [
        "",
        " \t\n\r",
        "\u00a0\u3000\u2028\u2029",  # no-break, ideographic spaces; line, paragraph separators
        "\x00\x01\x7f",  # controls (Cc) that are not whitespace
        "\u2063\u180e\u200e",  # format characters (Cf): invisible separator, Mongolian vowel sep.
        "\u200b\u200c\u200d\u2060\ufeff\u00ad",  # zero-width ones and the soft hyphen
        "\u034f",  # the combining grapheme joiner (Mn)
        "\u115f\u1160\u3164",  # Hangul fillers (Lo)
    ],
)
def test_text_that_shows_nothing_is_blank(text):
    assert is_blank(text)
    for character in text:
        assert is_blank(character), hex(ord(character))


@pytest.mark.parametrize("text", ["X", "XX", "a\u200b", "\u3164b", ".", "0", "\u0301"])
def test_text_with_anything_visible_is_not_blank(text):
    assert not is_blank(text)


def test_is_encodable_refuses_only_lone_surrogates():
    assert is_encodable("café 👩‍💻")
    assert not is_encodable("a\ud800") and not is_encodable("\udfff")


# -- schema details ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (True, "a boolean"),
        (2, "a number"),
        (2.5, "a number"),
        (("a",), "tuple"),
    ],
)
def test_a_wrong_kind_of_value_is_named(value, kind):
    assert message_of({**NOUL, "instructions": value}) == (
        f"questions.q.instructions must be text, an object or an array, not {kind}"
    )


@pytest.mark.parametrize(("value", "kind"), [([], "array"), ({}, "object")])
def test_empty_structured_text_is_named(value, kind):
    assert message_of({**NOUL, "instructions": value}) == (
        f"questions.q.instructions is an empty {kind}"
    )


def test_question_fields_that_must_be_text_name_their_kind():
    assert message_of({**CHOICE, "criteria": {"a": True, "b": None}}) == (
        "questions.q.criteria.a must be text, an object or an array, or null, not a boolean"
    )
    assert (
        message_of(
            {"type": "choice", "instructions": "i", "choices": [{"key": "a", "description": " "}]}
        )
        == "questions.q.choices[0].description is blank (use null for no description)"
    )
    assert (
        message_of({"type": "choice", "instructions": "i", "choices": [{"key": 1}, {"key": "b"}]})
        == "questions.q.choices[0].key must be a string, not a number"
    )
    assert message_of({**CHOICE, "criteria": {"a\ud800": None, "b": None}}) == (
        "questions.q.criteria has a blank or malformed option key 'a\\ud800'"
    )
    assert message_of({**CHOICE, "criteria": {"a": "x\udc00", "b": None}}) == (
        "questions.q.criteria.a holds a lone surrogate (not Unicode text)"
    )
    assert message_of({**SCORE, "criteria": ["a", 2]}) == (
        "questions.q.criteria[1] must be text, an object or an array, not a number"
    )
    assert message_of([1]) == "questions.q must be an object, not an array"


def test_noul_option_keys_are_false_and_true_either_or_both():
    assert only({**NOUL, "criteria": {}}).options == (Option("false", None), Option("true", None))
    assert only({**NOUL, "criteria": None}).options == (Option("false", None), Option("true", None))
    assert only({**NOUL, "criteria": {"true": "late"}}).options == (
        Option("false", None),
        Option("true", "late"),
    )
    assert message_of({**NOUL, "criteria": {"true": None, "false": None, "maybe": None}}) == (
        "questions.q.criteria takes the keys false and true (either or both), not false, maybe, "
        "true"
    )
    assert (
        message_of({**NOUL, "choices": [{"key": "true"}, {"key": "yes"}]})
        == "questions.q.choices takes the keys false and true (either or both), not true, yes"
    )
    assert message_of({**NOUL, "criteria": {"false": None, "true": None}, "choices": []}) == (
        "questions.q takes criteria or choices, not both"
    )
    # A noul question described by its criteria needs no instructions (the Jev SDKs' rule).
    q = only({"type": "noul", "criteria": {"false": "on time"}})
    assert q.instructions == "" and q.options == (Option("false", "on time"), Option("true", None))
    # Given in either order, the options read false then true, described as given.
    q = only({**NOUL, "choices": [{"key": "true", "description": "yes"}, {"key": "false"}]})
    assert q.options == (Option("false", None), Option("true", "yes"))
    q = only({**NOUL, "criteria": {"true": None, "false": "no"}})
    assert q.options == (Option("false", "no"), Option("true", None))


def test_a_noul_questions_own_options_are_checked_like_a_choices():
    assert message_of({**NOUL, "criteria": ["false", "true"]}) == (
        "questions.q.criteria must be an object of option keys to descriptions, not an array"
    )
    assert message_of({**NOUL, "criteria": {"false": "", "true": None}}) == (
        "questions.q.criteria.false is blank (use null for no description)"
    )
    assert message_of({**NOUL, "choices": {"false": None}}) == (
        "questions.q.choices must be an array of {key, description}, not an object"
    )
    assert message_of({**NOUL, "choices": [{"key": "false"}, "true"]}) == (
        "questions.q.choices[1] must be an object {key, description}, not a string"
    )


def test_score_levels_are_keyed_from_zero_with_their_descriptions():
    q = only({"type": "score", "instructions": "Rate", "levels": ["bad", "ok", "good"]})
    assert q == Question(
        "q", "score", "Rate", (Option("0", "bad"), Option("1", "ok"), Option("2", "good"))
    )
    assert q.keys == ("0", "1", "2")
    q = only({**CHOICE, "choices": None, "criteria": {"x": "ex", "y": None}})
    assert isinstance(q, InvalidQuestion)
    q = only({"type": "choice", "instructions": "Go", "choices": [{"key": "x"}, {"key": "y"}]})
    assert q == Question("q", "choice", "Go", (Option("x", None), Option("y", None)))


def test_counts_just_inside_and_outside_the_bounds():
    assert isinstance(only({**CHOICE, "criteria": {"a": None, "b": None}}), Question)
    assert isinstance(only({**SCORE, "criteria": ["a", "b"]}), Question)
    assert message_of({**SCORE, "criteria": []}) == (
        "questions.q.criteria has 0 levels; a question takes 2 to 10"
    )
    assert message_of({**CHOICE, "criteria": {}}) == (
        "questions.q.criteria has 0 options; a question takes 2 to 255"
    )
    assert message_of({"type": "choice", "instructions": "i", "choices": []}) == (
        "questions.q.choices has 0 options; a question takes 2 to 255"
    )


def test_a_duplicate_key_deep_inside_a_question_names_where_it_is():
    raw = (
        b'{"state": "s", "questions": {"ok": {"type": "noul", "instructions": "i"},'
        b' "q": {"type": "choice", "instructions": "i",'
        b' "choices": [{"key": "a", "key": "b"}, {"key": "c"}]}}}'
    )
    bad = parse_body(raw).entries[0].questions[1]
    assert bad.message == "questions.q.choices[0] has the key 'key' more than once"
    assert bad.answer() == {"type": "choice", "error": "invalid_question", "message": bad.message}


def test_a_question_whose_type_is_not_known_answers_with_a_null_type():
    parsed = parse_request(request(q={"type": "rank", "instructions": "i"}, r=[1], ok=NOUL))
    q, r, _ = parsed.entries[0].questions
    assert q == InvalidQuestion(
        "q", None, "questions.q.type must be one of choice, noul, score, not 'rank'"
    )
    assert r == InvalidQuestion("r", None, "questions.r must be an object, not an array")
    assert r.answer() == {"type": None, "error": "invalid_question", "message": r.message}


# -- entries and the request -----------------------------------------------------------------------
def test_a_states_entry_names_itself_in_each_problem():
    body = {
        "state": "s",
        "questions": {"ok": NOUL},
        "states": [
            {"state": "t", "questions": {"q": {"type": "noul"}, " ": NOUL, "ok": NOUL}},
        ],
    }
    q, blank, ok = parse_request(body).entries[1].questions
    assert q.message == "states[0].questions.q.instructions is missing"
    assert blank.message == "states[0].questions has a blank or malformed question name"
    assert isinstance(ok, Question)
    raw = (
        b'{"state": "s", "questions": {"ok": {"type": "noul", "instructions": "i"}},'
        b' "states": [{"state": "t", "questions": {"q": {"type": "noul", "instructions": "i"},'
        b' "q": {"type": "noul", "instructions": "j"}}}]}'
    )
    [twice] = parse_body(raw).entries[1].questions
    assert twice.message == "states[0].questions has the question 'q' more than once"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"questions": {"q": NOUL}, "states": []},
            "state is missing; give `state` and `questions`, and `states` for further "
            "{state, questions} entries",
        ),
        ({"questions": {"q": NOUL}}, "state is missing"),
        (
            {"state": "s", "questions": {"q": NOUL}, "states": [{"questions": {"q": NOUL}}]},
            "states[0].state is missing",
        ),
        (
            {"state": "s", "questions": {"q": NOUL}, "states": [{"state": [], "questions": {}}]},
            "states[0].state is an empty array: there is nothing to judge",
        ),
        (
            {"state": {}, "questions": {"q": NOUL}},
            "state is an empty object: there is nothing to judge",
        ),
        (
            {"state": None, "questions": {"q": NOUL}},
            "state must be text, an object or an array, not null",
        ),
        (
            {"state": "s", "questions": {"q": NOUL}, "states": [{"state": True, "questions": {}}]},
            "states[0].state must be text, an object or an array, not a boolean",
        ),
        (
            {"state": "s", "questions": {"q": NOUL}, "states": [{"state": ["\ud800"]}]},
            "states[0].state holds a lone surrogate",
        ),
        ({"state": {"\udfff": 1}, "questions": {"q": NOUL}}, "state holds a lone surrogate"),
        (
            {"state": "s", "questions": {"q": NOUL}, "states": [{"state": "t", "questions": 1}]},
            "states[0].questions must be an object of named questions, not a number",
        ),
        (
            {"state": "s", "questions": {"q": NOUL}, "states": [{"state": "t", "questions": {}}]},
            "states[0].questions must be an object of named questions, not empty",
        ),
        (
            {"state": "s", "questions": None},
            "questions must be an object of named questions, not null",
        ),
        (
            {"state": "s", "questions": {"q": NOUL}, "surface": "decisions"},
            "surface is not a field of a decisions request (model, state, questions, states, "
            "images, options)",
        ),
        (
            {"state": "s", "questions": {"q": NOUL}, "options": {"deadline": 5}},
            "options.deadline is not an option of decisions (deadline_ms, profile, return_meta)",
        ),
        (
            {"state": "s", "questions": {"q": NOUL}, "options": {"deadline_ms": -1.5}},
            "options.deadline_ms must be a number above 0, not -1.5",
        ),
        (
            {"state": "s", "questions": {"q": NOUL}, "options": {"deadline_ms": "100"}},
            "options.deadline_ms must be a number above 0, not '100'",
        ),
        (
            {"state": "s", "questions": {"q": NOUL}, "options": {"deadline_ms": float("inf")}},
            "options.deadline_ms must be a number above 0, not inf",
        ),
        (
            {"state": "s", "questions": {"q": NOUL}, "options": {"deadline_ms": 10**400}},
            f"options.deadline_ms must be a number above 0, not {10**400}",
        ),
        (
            {"state": "s", "questions": {"q": NOUL}, "options": {"profile": "Exact"}},
            "options.profile must be a profile name (lower-case letters, digits and _, such "
            "as exact, batching or max_speed), not 'Exact'",
        ),
        (
            {"state": "s", "questions": {"q": NOUL}, "options": {"return_meta": 1}},
            "options.return_meta must be true or false",
        ),
        (
            {"state": "s", "questions": {"q": NOUL}, "options": []},
            "options must be an object, not an array",
        ),
        (
            {"state": "s", "questions": {"q": NOUL}, "model": []},
            "model must be a string, not an array",
        ),
        (
            {"state": "s", "questions": {"q": NOUL}, "states": "t"},
            "states must be an object of named {state, questions} entries or an array of them, "
            "not a string",
        ),
        (
            {"state": "s", "questions": {"q": NOUL}, "states": [None]},
            "states[0] must be an object {state, questions}, not null",
        ),
        (
            {
                "state": "s",
                "questions": {"q": NOUL},
                "states": [{"state": "t", "questions": {"q": NOUL}}, {"state": "u", "x": 1}],
            },
            "states[1].x is not a field of a state entry (state, questions, images)",
        ),
    ],
)
def test_each_request_problem_is_named_exactly(body, message):
    with pytest.raises(RequestError) as err:
        parse_request(body)
    assert err.value.code == "invalid_request"
    assert err.value.message == message


def test_options_take_their_defaults_from_null_and_keep_what_is_given():
    parsed = parse_request({**request(q=NOUL), "options": {"profile": None, "return_meta": None}})
    # no profile named: the request takes whichever the model was loaded with
    assert (parsed.deadline_ms, parsed.profile, parsed.return_meta) == (None, None, False)
    parsed = parse_request({**request(q=NOUL), "options": {"deadline_ms": 0.5}})
    assert parsed.deadline_ms == 0.5 and parsed.return_meta is False
    parsed = parse_request({**request(q=NOUL), "options": {"return_meta": True}})
    assert parsed.return_meta is True and parsed.deadline_ms is None
    parsed = parse_request({**request(q=NOUL), "options": None, "model": None})
    assert parsed.model is None and parsed.profile is None


def test_parse_request_takes_any_mapping_and_refuses_anything_else():
    from types import MappingProxyType

    parsed = parse_request(MappingProxyType(request(q=NOUL)))
    assert parsed.entries[0].valid[0].name == "q"
    for body in ("text", None, [request(q=NOUL)]):
        with pytest.raises(RequestError) as err:
            parse_request(body)
        assert err.value.message == "the request must be a JSON object"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            b'{"state": "s", "questions": {"q": {"type": "noul", "instructions": "i"}},'
            b' "questions": {"r": {"type": "noul", "instructions": "i"}}}',
            "the request has the key 'questions' more than once",
        ),
        (
            b'{"state": "s", "questions": {"q": {"type": "noul", "instructions": "i"}},'
            b' "states": [{"state": "t", "state": "u", "questions": {}}]}',
            "states[0] has the key 'state' more than once",
        ),
        (
            b'{"state": "s", "questions": {"q": {"type": "noul", "instructions": "i"}},'
            b' "states": [{"state": "t", "questions": {}, "questions": {}}]}',
            "states[0] has the key 'questions' more than once",
        ),
        (
            b'{"state": {"a": 1, "a": 2},'
            b' "questions": {"q": {"type": "noul", "instructions": "i"}}}',
            "state has the key 'a' more than once",
        ),
        (
            b'{"model": "m", "model": "n", "state": "s",'
            b' "questions": {"q": {"type": "noul", "instructions": "i"}}}',
            "the request has the key 'model' more than once",
        ),
    ],
)
def test_a_duplicated_key_outside_every_question_fails_the_request(raw, message):
    with pytest.raises(RequestError) as err:
        parse_body(raw)
    assert err.value.code == "invalid_request"
    assert err.value.message == message


def test_duplicates_are_matched_to_their_own_question_only():
    body = request(q=NOUL, qq=NOUL, ok=NOUL)
    parsed = parse_request(body, [("questions", "q", "type")])
    q, qq, ok = parsed.entries[0].questions
    assert q == InvalidQuestion("q", "noul", "questions.q has the key 'type' more than once")
    assert isinstance(qq, Question) and isinstance(ok, Question)
    # A duplicate inside one states entry's question leaves the same name elsewhere alone.
    body = {**request(q=NOUL), "states": [{"state": "t", "questions": {"q": NOUL}}]}
    parsed = parse_request(body, [("states", 0, "questions", "q", "instructions")])
    assert isinstance(parsed.entries[0].questions[0], Question)
    [bad] = parsed.entries[1].questions
    assert bad.message == "states[0].questions.q has the key 'instructions' more than once"


def test_a_request_counts_its_questions_and_keeps_each_problem_in_order():
    parsed = parse_request(
        {
            "state": "s",
            "questions": {"a": {"type": "noul"}, "ok": NOUL},
            "states": [
                {"state": "t", "questions": {"b": {**NOUL, "x": 1}}},
                {"state": "u", "questions": {"c": SCORE, "d": {**SCORE, "criteria": []}}},
            ],
        }
    )
    assert parsed.questions == 5
    assert [len(e.questions) for e in parsed.entries] == [2, 1, 2]
    assert [e.where for e in parsed.entries] == [(), ("states", 0), ("states", 1)]
    assert [q.name for q in parsed.entries[2].valid] == ["c"]
    assert parsed.entries[1].valid == ()
    assert parsed.problems == (
        "questions.a.instructions is missing",
        "states[0].questions.b.x is not a field of a question "
        "(type, instructions, criteria, choices, levels)",
        "states[1].questions.d.criteria has 0 levels; a question takes 2 to 10",
    )
    assert parsed.has_states is True
    assert parse_request(request(q=NOUL)).problems == ()


def test_state_text_of_an_entry_is_compact_json_keeping_key_order_and_text():
    parsed = parse_request(
        {"state": {"z": "日本", "a": [1, 2.5, None, True]}, "questions": {"q": NOUL}}
    )
    assert parsed.entries[0].state_text() == '{"z": "日本", "a": [1, 2.5, null, true]}'


# -- readout maths edges ---------------------------------------------------------------------------
def test_softmax_reads_any_shape_and_refuses_no_logits():
    p = softmax(np.array([[0.0, math.log(3.0)]], dtype=np.float16))
    assert isinstance(p, np.ndarray) and p.shape == (2,) and p.dtype == np.float64
    assert p.tolist() == pytest.approx([0.25, 0.75], abs=1e-3)  # float16 log 3
    assert softmax([5.0]).tolist() == [1.0]
    with pytest.raises(ValueError) as err:
        softmax([])
    assert str(err.value) == "softmax needs at least one logit"
    with pytest.raises(ValueError) as err:
        softmax([1.0, 2.0], 0.0)
    assert str(err.value) == "temperature must be a finite number above 0, not 0.0"
    cold = softmax([0.0, 1.0], 1e-3)
    assert cold.tolist() == [0.0, 1.0]


def test_confidence_is_clamped_to_zero_and_one_and_needs_two_probabilities():
    assert confidence(np.array([0.9, 0.1], dtype=np.float32)) == pytest.approx(
        1 + (0.9 * math.log(0.9) + 0.1 * math.log(0.1)) / math.log(2), abs=1e-7
    )
    assert confidence([1.5, -0.5]) == 1.0  # entropy below 0 outside a distribution
    assert confidence([0.3, 0.3, 0.3, 0.3]) == 0.0  # entropy above ln N
    assert confidence([[0.5], [0.5]]) == pytest.approx(0.0, abs=1e-15)
    for bad in ([1.0], []):
        with pytest.raises(ValueError) as err:
            confidence(bad)
        assert str(err.value) == "confidence needs at least two probabilities"


def test_the_readout_maths_answer_without_importing_torch():
    """The ONNX serving path answers decisions in numpy: no readout imports torch."""
    code = (
        "import sys\n"
        "from vllm_srun.plugins.decisions import parse_request, answer\n"
        "q = parse_request({'state': 's', 'questions': {'q': {'type': 'choice', "
        "'instructions': 'i', 'criteria': {'a': None, 'b': None}}}}).entries[0].valid[0]\n"
        "print(answer(q, [0.0, 1.0])['choice'])\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["b", "[]"]


def test_a_wrong_number_of_logits_is_invalid_model_output():
    failed = {
        "error": "invalid_model_output",
        "message": "the model's logits are not finite",
    }
    assert choice_answer(["a", "b"], [0.0, 1.0, 2.0]) == {"type": "choice", **failed}
    assert noul_answer([0.0]) == {"type": "noul", **failed}
    assert score_answer(["x", "y", "z"], [0.0, 1.0]) == {"type": "score", **failed}
    assert choice_answer(["a", "b"], [0.0, float("-inf")]) == {"type": "choice", **failed}


def test_the_most_probable_choice_wins_wherever_it_sits():
    keys = ["a", "b", "c", "d"]
    assert choice_answer(keys, [0.0, 0.0, 0.0, 1.0])["choice"] == "d"
    assert choice_answer(keys, [3.0, 0.0, 0.0, 1.0])["choice"] == "a"
    assert choice_answer(keys, [0.0, 2.0, 2.0, 1.0])["choice"] == "b"
    assert choice_answer(keys, np.array([0.0, 0.0, 5.0, 1.0], dtype=np.float32))["choice"] == "c"


def test_noul_answer_reads_true_second_and_score_weights_levels_from_zero():
    # P(true) = 1 / (1 + e^(z_false - z_true)): here e^-1 over 1 + e^-1 for true lower.
    assert noul_answer([1.0, 0.0])["noul"] == pytest.approx(1 / (1 + math.e), abs=1e-15)
    assert noul_answer(np.array([0.0, 2.0], dtype=np.float32), 4.0)["noul"] == pytest.approx(
        1 / (1 + math.exp(-0.5)), abs=1e-15
    )
    result = score_answer(["a", None, "c", "d"], [0.0, 0.0, 0.0, 0.0])
    assert result["score"] == pytest.approx(1.5, abs=1e-15)
    assert result["confidence"] == pytest.approx(0.0, abs=1e-12)
    assert result["legend"] == {"0": "a", "1": None, "2": "c", "3": "d"}
    assert list(result) == ["type", "score", "probabilities", "confidence", "legend"]
    result = score_answer(["a", "b"], [0.0, math.log(3.0)], temperature=0.5)
    assert result["probabilities"] == {"0": pytest.approx(0.1), "1": pytest.approx(0.9)}
    assert result["score"] == pytest.approx(0.9)


def test_answer_passes_the_temperature_and_reads_score_descriptions():
    parsed = parse_request(request(c=CHOICE, n=NOUL, s=SCORE))
    c, n, s = parsed.entries[0].questions
    assert answer(c, [0.0, math.log(3.0)], 0.5)["probabilities"] == {
        "billing": pytest.approx(0.1),
        "shipping": pytest.approx(0.9),
    }
    assert answer(n, [0.0, math.log(3.0)], 0.5)["noul"] == pytest.approx(0.9)
    scored = answer(s, [0.0, math.log(3.0)], 0.5)
    assert scored["score"] == pytest.approx(0.9)
    assert scored["legend"] == {"0": "low", "1": "high"}


def test_usage_and_response_bodies():
    from vllm_srun.plugins.decisions import response_body, usage

    assert usage(7) == {"input_tokens": 7, "output_tokens": 0}
    assert usage(7, 2) == {"input_tokens": 7, "output_tokens": 2}
    plain = parse_request(request(q=NOUL))
    assert response_body(plain, [{"q": 1}], 5) == {
        "answers": {"q": 1},
        "usage": {"input_tokens": 5, "output_tokens": 0},
    }
    assert response_body(plain, [{"q": 1}], [5]) == response_body(plain, [{"q": 1}], 5)
    with_states = parse_request(
        {**request(q=NOUL), "states": [{"state": "t", "questions": {"q": NOUL}}] * 2}
    )
    # every entry counts its own tokens; the top-level usage counts the request's own state
    assert response_body(with_states, [{"q": 1}, {"q": 2}, {"q": 3}], [4, 2, 3]) == {
        "answers": {"q": 1},
        "usage": {"input_tokens": 4, "output_tokens": 0},
        "states": [
            {"index": 0, "answers": {"q": 2}, "usage": {"input_tokens": 2, "output_tokens": 0}},
            {"index": 1, "answers": {"q": 3}, "usage": {"input_tokens": 3, "output_tokens": 0}},
        ],
    }
    empty_states = parse_request({**request(q=NOUL), "states": []})
    assert response_body(empty_states, [{"q": 1}], 1)["states"] == []
    empty_named = parse_request({**request(q=NOUL), "states": {}})
    assert response_body(empty_named, [{"q": 1}], [1])["states"] == {}


def test_named_states_are_answered_under_their_names_in_request_order():
    from vllm_srun.plugins.decisions import response_body, state_answers

    parsed = parse_request(
        {
            **request(q=NOUL),
            "states": {
                "zulu": {"state": "t", "questions": {"q": NOUL}},
                "alpha": {"state": "u", "questions": {"r": NOUL}},
            },
        }
    )
    body = response_body(parsed, [{"q": 1}, {"q": 2}, {"r": 3}], [6, 2, 3])
    assert body == {
        "answers": {"q": 1},
        "usage": {"input_tokens": 6, "output_tokens": 0},
        "states": {
            "zulu": {"answers": {"q": 2}, "usage": {"input_tokens": 2, "output_tokens": 0}},
            "alpha": {"answers": {"r": 3}, "usage": {"input_tokens": 3, "output_tokens": 0}},
        },
    }
    assert list(body["states"]) == ["zulu", "alpha"]
    assert state_answers(body) == [body["states"]["zulu"], body["states"]["alpha"]]
    listed = parse_request(
        {**request(q=NOUL), "states": [{"state": "t", "questions": {"q": NOUL}}]}
    )
    as_list = response_body(listed, [{"q": 1}, {"q": 2}], [1, 1])
    assert state_answers(as_list) == as_list["states"]
    assert state_answers(response_body(parse_request(request(q=NOUL)), [{"q": 1}], 1)) == []


@pytest.mark.parametrize(
    ("answered", "tokens", "counts"),
    [([{"q": 1}, {"q": 2}], 9, "2 and 1"), ([{"q": 1}], [4, 5], "1 and 2")],
)
def test_response_body_needs_one_answer_and_one_count_per_entry(answered, tokens, counts):
    from vllm_srun.plugins.decisions import response_body

    parsed = parse_request(
        {**request(q=NOUL), "states": {"b": {"state": "t", "questions": {"q": NOUL}}}}
    )
    with pytest.raises(ValueError) as err:
        response_body(parsed, answered, tokens)
    assert str(err.value) == (
        f"response_body needs one answers mapping and one token count per entry (2), not "
        f"{counts}; pass a list of counts when the request has states"
    )


def test_a_states_object_names_each_entry_and_its_problems():
    parsed = parse_request(
        {
            "state": "s",
            "questions": {"q": NOUL},
            "states": {
                "alpha": {"state": "t", "questions": {"q1": {"type": "noul"}, "ok": NOUL}},
                "beta": {"state": ["u"], "questions": {"r": SCORE}, "images": []},
            },
        }
    )
    assert parsed.has_states and parsed.named_states
    assert [e.where for e in parsed.entries] == [(), ("states", "alpha"), ("states", "beta")]
    assert [e.key for e in parsed.entries] == [None, "alpha", "beta"]
    bad, ok = parsed.entries[1].questions
    assert isinstance(bad, InvalidQuestion) and isinstance(ok, Question)
    assert bad.message == "states.alpha.questions.q1.instructions is missing"
    assert parsed.problems == ("states.alpha.questions.q1.instructions is missing",)
    assert [q.name for q in parsed.entries[2].valid] == ["r"]
    listed = parse_request({"state": "s", "questions": {"q": NOUL}, "states": []})
    assert listed.has_states and not listed.named_states
    assert not parse_request(request(q=NOUL)).named_states


@pytest.mark.parametrize(
    ("states", "message"),
    [
        (
            {"alpha": {"state": "", "questions": {"q": NOUL}}},
            "states.alpha.state is blank",
        ),
        (
            {"alpha": {"state": "t"}},
            "states.alpha.questions must be an object of named questions, not missing",
        ),
        (
            {"alpha": {"state": "t", "questions": {"q": NOUL}, "x": 1}},
            "states.alpha.x is not a field of a state entry (state, questions, images)",
        ),
        (
            {"alpha": None},
            "states.alpha must be an object {state, questions}, not null",
        ),
    ],
)
def test_a_bad_named_states_entry_is_refused_naming_it(states, message):
    with pytest.raises(RequestError) as err:
        parse_request({"state": "s", "questions": {"q": NOUL}, "states": states})
    assert (err.value.code, err.value.message) == ("invalid_request", message)


@pytest.mark.parametrize("name", ["", " \u200b", "\ud800"])
def test_a_state_name_must_show_something(name):
    states = {"ok": request(q=NOUL), name: request(q=NOUL)}
    with pytest.raises(RequestError) as err:
        parse_request({**request(q=NOUL), "states": states})
    assert (err.value.code, err.value.message) == (
        "invalid_request",
        f"states has a blank or malformed state name {name!r}; name each entry with visible text",
    )


def test_duplicates_in_a_states_object_are_found_by_name():
    raw = (
        b'{"state": "s", "questions": {"q": {"type": "noul", "instructions": "i"}},'
        b' "states": {"a": {"state": "t", "questions": {"r": {"type": "noul",'
        b' "instructions": "i", "instructions": "j"},'
        b' "ok": {"type": "noul", "instructions": "k"}}}}}'
    )
    parsed = parse_body(raw)
    bad, ok = parsed.entries[1].questions
    assert bad.message == "states.a.questions.r has the key 'instructions' more than once"
    assert isinstance(ok, Question)
    twice = (
        b'{"state": "s", "questions": {"q": {"type": "noul", "instructions": "i"}},'
        b' "states": {"a": {"state": "t", "questions": {}}, "a": {"state": "u", "questions": {}}}}'
    )
    with pytest.raises(RequestError) as err:
        parse_body(twice)
    assert err.value.message == "states has the key 'a' more than once"
    inside = (
        b'{"state": "s", "questions": {"q": {"type": "noul", "instructions": "i"}},'
        b' "states": {"a": {"state": "t", "state": "u", "questions": {}}}}'
    )
    with pytest.raises(RequestError) as err:
        parse_body(inside)
    assert err.value.message == "states.a has the key 'state' more than once"


@pytest.mark.parametrize("images", [None, []])
def test_no_images_or_an_empty_list_is_accepted(images):
    body = {**request(q=NOUL), "images": images, "states": {"a": {**request(q=NOUL)}}}
    body["states"]["a"]["images"] = images
    parsed = parse_request(body)
    assert [len(e.valid) for e in parsed.entries] == [1, 1]


@pytest.mark.parametrize(
    ("where", "images", "message"),
    [
        (
            "request",
            ["data:image/png;base64,AAAA"],
            "images holds 1 image, but this model has no image modality; describe the images "
            "in the state as text, and send images as [] or leave it out",
        ),
        (
            "entry",
            [{"url": "x"}, {"url": "y"}],
            "states.a.images holds 2 images, but this model has no image modality; describe "
            "the images in the state as text, and send images as [] or leave it out",
        ),
        ("request", "x", "images must be an array, not a string"),
        ("entry", {}, "states.a.images must be an array, not an object"),
    ],
)
def test_images_are_refused_naming_where_they_were(where, images, message):
    body = {**request(q=NOUL), "states": {"a": request(q=NOUL)}}
    (body if where == "request" else body["states"]["a"])["images"] = images
    with pytest.raises(RequestError) as err:
        parse_request(body)
    assert (err.value.code, err.value.message) == ("invalid_request", message)


@pytest.mark.parametrize(("count", "tail"), [(5, "questions.q4.type"), (6, "; and 1 more")])
def test_a_refusal_lists_five_invalid_questions_then_counts(count, tail):
    bad = {f"q{i}": {"type": "rank", "instructions": "i"} for i in range(count)}
    with pytest.raises(RequestError) as err:
        parse_request(request(**bad))
    message = err.value.message
    assert message.count("questions.q") == 5
    assert tail in message.rsplit("; ", 1)[-1] or message.endswith(tail)
    assert ("more" in message) == (count > 5)


def test_an_empty_choice_description_is_no_description_as_the_router_client_sends_it():
    # The router's Go client encodes a choice without a description as "".
    def options(description):
        body = {
            "state": "s",
            "questions": {
                "q": {
                    "type": "choice",
                    "instructions": "i",
                    "choices": [{"key": "a", "description": description}, {"key": "b"}],
                }
            },
        }
        return parse_request(body).entries[0].questions[0].options

    assert options("") == options(None)
    assert options("")[0].description is None


def test_names_a_client_sent_are_cut_so_every_message_keeps_its_fix():
    long = "q" * 50_000
    body = {
        "state": "s",
        "questions": {long: {"type": "bogus", "instructions": "i"}, "ok": NOUL},
        "states": {"n" * 50_000: {"state": "s", "questions": {"ok": NOUL}, "foo": 1}},
    }
    with pytest.raises(RequestError) as refused:
        parse_request(body)
    message = refused.value.message
    assert len(message) < 600, len(message)
    assert message.startswith("states." + "n" * 200 + "... (49800 more characters).foo is not")
    del body["states"]
    failed = parse_request(body).entries[0].questions[0].answer()
    assert len(failed["message"]) < 600
    assert failed["message"].startswith("questions." + "q" * 200 + "... (49800 more characters)")
    wordy = {"type": "noul", "instructions": "i", "x" * 50_000: 1}
    failed = parse_request({"state": "s", "questions": {"q": wordy, "ok": NOUL}})
    assert len(failed.entries[0].questions[0].answer()["message"]) < 600
