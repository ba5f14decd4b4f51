"""The upstream router's answer check (:mod:`.answer_checks`) fails exactly the answers
the router would turn into ``invalid_model_output``, and passes good ones: the checks
the contract suite makes on every served decision answer are worth as much as these."""

from __future__ import annotations

import copy

import pytest

from .answer_checks import answer_violations, asked, check_exchange

QUESTIONS = {
    "route": {
        "type": "choice",
        "instructions": "Which team?",
        "criteria": {"billing": "payments", "technical": None, "other": None},
    },
    "listed": {
        "type": "choice",
        "instructions": "Which team?",
        "choices": [{"key": "a", "description": "first"}, {"key": "b", "description": ""}],
    },
    "urgent": {"type": "noul", "instructions": "Is it urgent?"},
    "tone": {"type": "score", "instructions": "How angry?", "levels": ["calm", "cross", "irate"]},
    "size": {"type": "score", "instructions": "How big?", "criteria": ["s", "m", "l", "xl", "xxl"]},
}

GOOD = {
    "route": {
        "type": "choice",
        "choice": "billing",
        "probabilities": {"billing": 0.7, "technical": 0.2, "other": 0.1},
        "confidence": 0.4,
    },
    # a tie: either most probable key is a valid choice
    "listed": {"type": "choice", "choice": "b", "probabilities": {"a": 0.5, "b": 0.5}},
    # no confidence: Go decodes it as 0, inside [0, 1]
    "urgent": {"type": "noul", "noul": 0.25},
    "tone": {
        "type": "score",
        "score": 0.3 + 2 * 0.6,
        "probabilities": {"0": 0.1, "1": 0.3, "2": 0.6},
        "confidence": 0.2,
        "legend": {"0": "calm", "1": "cross", "2": "irate"},
    },
    # sums to 1.01 (within 0.02), the score over the values as given
    "size": {
        "type": "score",
        "score": 0.21 + 0.6 + 0.9 + 0.4,
        "probabilities": {"0": 0.1, "1": 0.21, "2": 0.3, "3": 0.3, "4": 0.1},
        "confidence": 1,
    },
}


def bad(name: str, **fields) -> dict:
    """:data:`GOOD` with ``fields`` of the answer to ``name`` replaced."""
    answers = copy.deepcopy(GOOD)
    answers[name].update(fields)
    return answers


def test_good_answers_pass():
    assert answer_violations(QUESTIONS, GOOD) == []


def test_levels_keyed_from_1_fail_as_the_router_saw_every_score_of_the_old_runtime():
    # what the runtime answered before the fix: levels "1".."N", score sum_k k * p_k from 1
    old = bad(
        "tone",
        probabilities={"1": 0.1, "2": 0.3, "3": 0.6},
        score=1 * 0.1 + 2 * 0.3 + 3 * 0.6,
        legend={"1": "calm", "2": "cross", "3": "irate"},
    )
    assert answer_violations(QUESTIONS, old) == [
        "answers.tone: probabilities are keyed ['1', '2', '3'], not the levels ['0', '1', '2']",
        "answers.tone: score 2.5 is outside [0, 2] (levels 0..2)",
        # the router reads level i from key "i": "0" is missing (0), "1" is 0.1, "2" is 0.3
        "answers.tone: score 2.5 is 1.8 from the expected level sum_i i*p_i = 0.7; "
        "at most 0.04 (0.02 x 2) is allowed",
    ]


def test_a_score_off_its_expected_level_by_more_than_the_tolerance_fails():
    # expected 1.5 on 3 levels: 0.04 allowed; 1.53 passes, 1.545 does not
    assert answer_violations(QUESTIONS, bad("tone", score=1.53)) == []
    assert answer_violations(QUESTIONS, bad("tone", score=1.545)) == [
        "answers.tone: score 1.545 is 0.045 from the expected level sum_i i*p_i = 1.5; "
        "at most 0.04 (0.02 x 2) is allowed"
    ]
    # on 5 levels the allowance is 0.08
    assert answer_violations(QUESTIONS, bad("size", score=2.11 - 0.09)) == [
        "answers.size: score 2.02 is 0.09 from the expected level sum_i i*p_i = 2.11; "
        "at most 0.08 (0.02 x 4) is allowed"
    ]


def test_a_choice_that_is_not_a_most_probable_option_fails():
    assert answer_violations(QUESTIONS, bad("route", choice="technical")) == [
        "answers.route: choice 'technical' (p=0.2) is not a most probable option: "
        "'billing' has p=0.7"
    ]
    assert answer_violations(QUESTIONS, bad("route", choice="")) == [
        "answers.route: choice is missing or empty; it must name a most probable option"
    ]
    assert answer_violations(QUESTIONS, bad("route", choice="refund")) == [
        "answers.route: choice 'refund' has no probability"
    ]


def test_probabilities_summing_to_0_95_fail():
    answers = bad("route", probabilities={"billing": 0.65, "technical": 0.2, "other": 0.1})
    assert answer_violations(QUESTIONS, answers) == [
        "answers.route: probabilities of the options sum to 0.95, more than 0.02 from 1"
    ]
    # 0.98 is within the tolerance
    answers = bad("route", probabilities={"billing": 0.68, "technical": 0.2, "other": 0.1})
    assert answer_violations(QUESTIONS, answers) == []


def test_options_missing_or_extra_or_out_of_range_fail():
    answers = bad("route", probabilities={"billing": 0.7, "technical": 0.3})
    assert answer_violations(QUESTIONS, answers) == [
        "answers.route: probabilities are keyed ['billing', 'technical'], "
        "not the options ['billing', 'technical', 'other']"
    ]
    answers = bad("listed", choice="a", probabilities={"a": 1.2, "b": -0.2})
    assert answer_violations(QUESTIONS, answers) == [
        "answers.listed: probabilities['a'] = 1.2 is outside [0, 1]",
        "answers.listed: probabilities['b'] = -0.2 is outside [0, 1]",
    ]


def test_a_confidence_of_1_2_fails():
    assert answer_violations(QUESTIONS, bad("route", confidence=1.2)) == [
        "answers.route: confidence 1.2 is outside [0, 1]"
    ]
    assert answer_violations(QUESTIONS, bad("urgent", confidence=-0.1)) == [
        "answers.urgent: confidence -0.1 is outside [0, 1]"
    ]


def test_a_type_that_is_not_the_questions_fails():
    answers = copy.deepcopy(GOOD)
    answers["urgent"] = {"type": "score", "noul": 0.25}
    assert answer_violations(QUESTIONS, answers) == [
        "answers.urgent: type 'score' is not the question's type 'noul'"
    ]


def test_a_noul_outside_0_1_fails():
    assert answer_violations(QUESTIONS, bad("urgent", noul=1.5)) == [
        "answers.urgent: noul 1.5 is outside [0, 1]"
    ]


def test_an_answer_with_an_error_is_not_checked_and_a_missing_one_is_named():
    answers = copy.deepcopy(GOOD)
    answers["tone"] = {"type": "score", "error": "invalid_model_output", "message": "NaN"}
    del answers["size"]
    answers["extra"] = {"type": "noul", "noul": 0.5}
    assert answer_violations(QUESTIONS, answers, "states.alpha.answers") == [
        "states.alpha.answers.size: the question was asked but has no answer",
        "states.alpha.answers.extra: answers a question that was not asked",
    ]


def test_every_request_form_gives_the_routers_keys():
    assert asked(QUESTIONS["route"]).keys == ("billing", "technical", "other")
    assert asked(QUESTIONS["listed"]).keys == ("a", "b")
    assert asked({"type": "choice", "criteria": ["x", "y"]}).keys == ("x", "y")  # vllm-sr/4.0
    assert asked(QUESTIONS["urgent"]).keys == ("false", "true")
    assert asked({"type": "noul", "criteria": {"true": "y", "false": "n"}}).keys == (
        "false",
        "true",
    )
    assert asked(QUESTIONS["tone"]).keys == ("0", "1", "2")
    assert asked(QUESTIONS["size"]).keys == ("0", "1", "2", "3", "4")
    assert asked({"type": "verdict"}).keys is None


def test_a_whole_exchange_is_read_on_every_route():
    question = {"tone": QUESTIONS["tone"]}
    good = {"tone": GOOD["tone"]}
    old = {"tone": bad("tone", probabilities={"1": 0.4, "2": 0.6}, score=2.6)["tone"]}
    body = {"model": "m", "state": "s", "questions": question}
    named = {**body, "states": {"alpha": {"state": "t", "questions": question}}}
    answer = {"model": "m", "answers": good, "states": {"alpha": {"model": "m", "answers": old}}}
    report = check_exchange("/v1/decisions", named, answer)
    assert report.violations == [
        "states.alpha.answers.tone: probabilities are keyed ['1', '2'], not the levels "
        "['0', '1', '2']",
        "states.alpha.answers.tone: score 2.6 is outside [0, 2] (levels 0..2)",
        "states.alpha.answers.tone: score 2.6 is 1 from the expected level sum_i i*p_i = 1.6; "
        "at most 0.04 (0.02 x 2) is allowed",
    ]
    assert report.checked == [("/v1/decisions", "m", "score")] * 2

    listed = {**body, "states": [{"state": "t", "questions": question}]}
    report = check_exchange("/v1/systemone", listed, {"model": "m", "answers": good, "states": []})
    assert report.violations == ["states[0]: the response has no answers for these questions"]

    batch = {"model": "m", "states": ["a", "b"], "questions": question}
    results = [{"index": 0, "answers": good}, {"index": 1, "answers": old}]
    report = check_exchange("/v1/systemone/batch", batch, {"model": "m", "results": results})
    assert [v.split(":")[0] for v in report.violations] == ["results[1].answers.tone"] * 3

    bundle = {"tasks": [{"id": "1", "decisions": body}, {"id": "2", "systemone_batch": batch}]}
    answer = {
        "results": [
            {"id": "1", "status": 200, "decisions": {"model": "m", "answers": old}},
            {"id": "2", "status": 200, "systemone_batch": {"model": "m", "results": results}},
        ]
    }
    report = check_exchange("/v1/bundle", bundle, answer)
    assert [v.split(":")[0] for v in report.violations] == [
        *["results[id=1].decisions.answers.tone"] * 3,
        *["results[id=2].systemone_batch.results[1].answers.tone"] * 3,
    ]
    assert {route for route, _, _ in report.checked} == {
        "bundle:decisions",
        "bundle:systemone_batch",
    }


@pytest.mark.parametrize("path", ["/v1/embeddings", "/v1/classify", "/v1/rerank"])
def test_other_routes_are_not_read(path):
    assert check_exchange(path, {"questions": {}}, {"answers": {"x": 1}}).violations == []
