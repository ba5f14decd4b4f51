"""Router mode's pure parts: keyword matching (T4), three-valued decisions (T13), ranking
(T5), the signal deadline (T16), the texts signals read, context bands (T19)."""

from __future__ import annotations

import pytest

from vllm_sr.config.routing import ContextRule, Decision, KeywordRule, RuleNode
from vllm_sr.router.deadline import signal_deadline
from vllm_sr.router.decisions import SignalResults, evaluate, rank
from vllm_sr.router.signals.context import context_matches, token_estimate
from vllm_sr.router.signals.keywords import keyword_matches
from vllm_sr.router.texts import request_texts


def keywords(words, **kw):
    return KeywordRule.model_validate({"name": "k", "keywords": words, **kw})


# -- T4: keyword semantics ---------------------------------------------------------------------


def test_a_literal_keyword_is_a_whole_word():
    rule = keywords(["code"])
    assert keyword_matches(rule, "please review my code.")[0]
    assert not keyword_matches(rule, "the decoder is slow")[0]
    assert not keyword_matches(rule, "barcodes")[0]


def test_keywords_ignore_case_unless_case_sensitive():
    assert keyword_matches(keywords(["Python"]), "i like PYTHON")[0]
    assert not keyword_matches(keywords(["Python"], case_sensitive=True), "i like PYTHON")[0]
    assert keyword_matches(keywords(["Python"], case_sensitive=True), "i like Python")[0]


def test_regex_metacharacters_are_literal_without_method_regex():
    assert keyword_matches(keywords(["c++"]), "I write c++ daily")[0]
    assert not keyword_matches(keywords(["a.c"]), "abc")[0]
    assert keyword_matches(keywords([r"err(or)?\s+\d+"], method="regex"), "saw error 42")[0]


def test_a_han_keyword_is_found_inside_a_sentence():
    assert keyword_matches(keywords(["代码"]), "请帮我调试这段代码好吗")[0]


@pytest.mark.parametrize(
    ("operator", "text", "expected"),
    [
        ("OR", "debug this function", True),
        ("OR", "nothing here", False),
        ("AND", "debug this function", True),
        ("AND", "debug this", False),
        ("NOR", "nothing here", True),
        ("NOR", "a function", False),
    ],
)
def test_operators(operator, text, expected):
    rule = keywords(["debug", "function"], operator=operator)
    assert keyword_matches(rule, text)[0] is expected


# -- T13: three-valued logic ---------------------------------------------------------------------


def decision(rules, name="d", priority=0, **kw):
    return Decision.model_validate(
        {"name": name, "priority": priority, "rules": rules, "modelRefs": [{"model": "m"}], **kw}
    )


def leaf(kind, name, **kw):
    return {"type": kind, "name": name, **kw}


def test_false_and_unknown_is_false_true_or_unknown_is_true_not_unknown_is_unknown():
    results = SignalResults()
    results.match("keywords", "yes")
    results.errors["decision:slow"] = "decision_timeout"
    policy = {"on_unknown": "no_match"}
    both = decision(
        {
            "operator": "AND",
            **policy,
            "conditions": [leaf("keyword", "no"), leaf("decision", "slow")],
        }
    )
    either = decision(
        {
            "operator": "OR",
            **policy,
            "conditions": [leaf("keyword", "yes"), leaf("decision", "slow")],
        }
    )
    negated = decision({"operator": "NOT", **policy, "conditions": [leaf("decision", "slow")]})
    assert evaluate(both, results).state == "false"
    assert evaluate(either, results).state == "true"
    outcome = evaluate(negated, results)
    assert outcome.state == "unknown"
    assert outcome.trace["root_trace"]["children"][0]["state"] == "unknown"
    assert outcome.trace["root_trace"]["children"][0]["signal_error"] == "decision_timeout"
    assert outcome.policy == "no_match" and not outcome.matched


def test_without_a_policy_a_failed_leaf_resolves_through_on_error():
    results = SignalResults()
    results.errors["decision:slow"] = "decision_timeout"
    plain = decision({"conditions": [leaf("decision", "slow")]})
    lenient = decision({"conditions": [leaf("decision", "slow", on_error="match")]})
    assert evaluate(plain, results).state == "false"
    assert evaluate(lenient, results).state == "true"


def test_on_unknown_match_and_fail_request():
    results = SignalResults()
    results.errors["decision:slow"] = "decision_timeout"
    matching = decision({"on_unknown": "match", "conditions": [leaf("decision", "slow")]}, "m")
    failing = decision(
        {"on_unknown": "fail_request", "conditions": [leaf("decision", "slow")]}, "f"
    )
    ranked = rank([matching, failing], results)
    assert ranked.policies == {"m": "match", "f": "fail_request"}
    assert ranked.failed is not None and ranked.failed.decision.name == "f"
    assert ranked.chosen is not None and ranked.chosen.decision.name == "m"
    assert ranked.chosen.confidence == 1.0


def test_a_routed_request_ranks_the_same_without_building_traces():
    results = SignalResults()
    results.match("keywords", "a")
    results.errors["decision:slow"] = "decision_timeout"
    decisions = [
        decision({"on_unknown": "match", "conditions": [leaf("decision", "slow")]}, "m"),
        decision({"operator": "OR", "conditions": [leaf("keyword", "a")]}, "k", priority=9),
    ]
    traced, plain = rank(decisions, results), rank(decisions, results, traced=False)
    assert [o.trace for o in plain.outcomes] == [{}, {}]
    assert all(o.trace["root_trace"] for o in traced.outcomes)
    same = [(o.state, o.matched, o.confidence, o.policy) for o in traced.outcomes]
    assert same == [(o.state, o.matched, o.confidence, o.policy) for o in plain.outcomes]
    assert traced.chosen.decision.name == plain.chosen.decision.name == "k"


# -- T5: ranking ----------------------------------------------------------------------------------


def test_priority_wins_then_names_and_catch_alls_go_last():
    results = SignalResults()
    results.match("keywords", "a")
    low = decision({"conditions": [leaf("keyword", "a")]}, "low", priority=1)
    high = decision({"conditions": [leaf("keyword", "a")]}, "high", priority=5)
    catch_all = Decision.model_validate(
        {"name": "aaa-all", "priority": 99, "modelRefs": [{"model": "m"}]}
    )
    assert rank([low, high, catch_all], results).chosen.decision.name == "high"
    tie_b = decision({"conditions": [leaf("keyword", "a")]}, "b")
    tie_a = decision({"conditions": [leaf("keyword", "a")]}, "a")
    assert rank([tie_b, tie_a], results).chosen.decision.name == "a"
    assert rank([catch_all], SignalResults()).chosen.decision.name == "aaa-all"


def test_confidence_breaks_priority_ties_only_in_a_comparable_pool():
    results = SignalResults()
    for name, score in (("math", 0.6), ("code", 0.9)):
        results.match("domains", name)
        results.confidences[f"domain:{name}"] = score
    math = decision({"conditions": [leaf("domain", "math")]}, "a-math", priority=1)
    code = decision({"conditions": [leaf("domain", "code")]}, "b-code", priority=1)
    assert rank([math, code], results).chosen.decision.name == "b-code"
    math_high = decision({"conditions": [leaf("domain", "math")]}, "a-math", priority=2)
    assert rank([math_high, code], results).chosen.decision.name == "a-math"
    assert rank([math_high, code], results, "confidence").chosen.decision.name == "b-code"
    results.match("keywords", "kw")
    keyword = decision({"conditions": [leaf("keyword", "kw")]}, "c-kw", priority=1)
    # a keyword decision has no evidence score: the pool is no longer comparable
    assert rank([math, code, keyword], results).chosen.decision.name == "a-math"


# -- T16: the signal deadline ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("timeout_ms", "request_in", "expected"),
    [
        (0, 120.0, 108.0),
        (5000, 120.0, 5.0),
        (200_000, 120.0, 108.0),
        (0, 3.0, 2.0),
        (0, 0.5, 0.5),
        (0, None, 45.0),
        (300, None, 0.3),
    ],
)
def test_upstream_deadline_values(timeout_ms, request_in, expected):
    now = 1000.0
    request = None if request_in is None else now + request_in
    assert signal_deadline(now, timeout_ms, request) - now == pytest.approx(expected)


# -- texts -----------------------------------------------------------------------------------------


def test_the_evaluation_text_is_the_last_non_empty_user_message():
    texts = request_texts(
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "an answer"},
            {"role": "tool", "content": "tool output"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "debug"}, {"type": "text", "text": "this"}],
            },
            {"role": "user", "content": "   "},
        ]
    )
    assert texts.evaluation == "debug this"
    assert texts.whole == "You are terse. an answer debug this"
    assert texts.history == ("You are terse.", "first question", "an answer", "tool output")
    assert texts.pieces(False) == ("debug this",)


def test_without_a_user_message_the_context_is_read():
    texts = request_texts(
        [{"role": "system", "content": "sys"}, {"role": "assistant", "content": "asst"}]
    )
    assert texts.evaluation == "sys asst"


# -- T19: context bands ----------------------------------------------------------------------------


def test_context_counts_four_bytes_a_token_and_takes_k_suffixes():
    assert token_estimate("abcd") == 1 and token_estimate("abcde") == 2
    assert token_estimate("é") == 1  # 2 UTF-8 bytes
    band = ContextRule.model_validate({"name": "long", "min_tokens": "1K", "max_tokens": "32K"})
    assert (band.min_tokens, band.max_tokens) == (1000, 32000)
    assert not context_matches(band, 999)
    assert context_matches(band, 1000) and context_matches(band, 32000)
    assert not context_matches(band, 32001)


# -- T2: tree validation ---------------------------------------------------------------------------


def test_tree_problems_in_upstream_shape():
    node = RuleNode.model_validate(
        {
            "operator": "AND",
            "conditions": [
                leaf("keyword", "a"),
                {"operator": "NOT", "conditions": [leaf("keyword", "a"), leaf("keyword", "b")]},
            ],
        }
    )
    assert list(node.problems("rules", root=True)) == [
        "rules.conditions[1]: NOT requires exactly one child condition, got 2"
    ]
    mixed = RuleNode.model_validate(
        {"operator": "OR", "type": "keyword", "name": "a", "conditions": []}
    )
    assert list(mixed.problems("rules", root=True)) == [
        "rules: a condition node cannot mix leaf fields (type, name) with operator or conditions"
    ]
    nested = RuleNode.model_validate(
        {"conditions": [{"on_unknown": "match", **leaf("keyword", "a")}]}
    )
    assert "rules.conditions[0]: on_unknown is allowed only on the root rule" in list(
        nested.problems("rules", root=True)
    )


# -- language (lingua) -----------------------------------------------------------------------------


def test_language_rules_match_the_detected_code_above_their_threshold():
    import asyncio

    from vllm_sr.config.routing import Routing
    from vllm_sr.router.signals.evaluate import Evaluation, Modules, Setup
    from vllm_sr.router.texts import Texts

    routing = Routing.model_validate(
        {
            "signals": {
                "language": [{"name": "fr"}, {"name": "en"}, {"name": "de", "threshold": 0.9}]
            }
        }
    )
    setup = Setup(routing=routing, modules=Modules(), pools={}, decision_deployment="primary")
    text = "Bonjour, pouvez-vous m'aider avec ma facture du mois dernier ?"
    found = asyncio.run(Evaluation(setup, Texts(text, text), None, float("inf")).run())
    assert found.matched == {"language": {"fr"}}
    assert found.labels["language"] == "fr"


@pytest.mark.parametrize(
    ("body", "usage"),
    [
        (
            b'{"id":"c","choices":[{"message":{"content":"see \\"usage\\": 9"}}],'
            b'"usage": {"prompt_tokens": 7, "completion_tokens": 3}}',
            {"prompt_tokens": 7, "completion_tokens": 3},
        ),
        (  # usage first, then a nested object that also has a "usage" key
            b'{"usage":{"prompt_tokens":1},"choices":[{"x":{"usage":"text"}}]}',
            {"prompt_tokens": 1},
        ),
        (b'{"id":"c","usage":null}', {}),
        (b'{"id":"c"}', {}),
        (b"not json", {}),
    ],
)
def test_usage_is_read_from_the_answer(body: bytes, usage: dict[str, int]) -> None:
    from vllm_sr.router.metrics import usage_of

    assert usage_of(body) == usage


def test_an_unserved_model_name_that_is_not_text_is_counted_as_other():
    from prometheus_client import CollectorRegistry, generate_latest

    from vllm_sr.router.metrics import OTHER_MODEL, RoutingMetrics

    registry = CollectorRegistry()
    metrics = RoutingMetrics(registry)
    metrics.unserved("x\udc00")
    metrics.unserved("gpt-nope")
    page = generate_latest(registry).decode()
    assert f'llm_request_errors_total{{model="{OTHER_MODEL}",reason="model_not_found"}} 1.0' in page
    assert 'llm_request_errors_total{model="gpt-nope",reason="model_not_found"} 1.0' in page
