"""The Go decoding rules of :mod:`.go` catch what Go's ``encoding/json`` refuses, and
only that: the contract suite is worth as much as this checker."""

from __future__ import annotations

import pytest

from . import go
from . import wire23 as w

POINT = go.Struct("Point", {"x": go.Int(), "y": go.Float(), "tags": go.List(go.Str())})


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"x": True}, "$.x: cannot unmarshal bool into Go value of type int"),
        ({"x": 1.0}, "$.x: cannot unmarshal number 1.0 into Go value of type int"),
        ({"x": "1"}, "$.x: cannot unmarshal string into Go value of type int"),
        ({"x": 2**63}, f"$.x: number {2**63} overflows int"),
        ({"y": "0.5"}, "$.y: cannot unmarshal string into Go value of type float64"),
        ({"tags": "a"}, "$.tags: cannot unmarshal string into Go value of type []string"),
        ({"tags": ["a", 1]}, "$.tags[1]: cannot unmarshal number into Go value of type string"),
        ({"X": False}, "$.X: cannot unmarshal bool into Go value of type int"),
        ([1], "$: cannot unmarshal array into Go value of type Point"),
    ],
)
def test_a_type_mismatch_fails(value, problem):
    assert POINT.problems(value) == [problem]


@pytest.mark.parametrize(
    "value",
    [
        {"x": 1, "y": 2, "tags": ["a"]},  # an integer literal is a valid float64
        {"x": None, "y": None, "tags": None},  # null is a no-op anywhere
        {"unknown": [1, {"deep": True}]},  # unknown keys are ignored
        {"Y": 0.5, "TAGS": []},  # keys match case-insensitively
        None,
    ],
)
def test_what_go_accepts_decodes(value):
    assert POINT.problems(value) == []


def test_float32_overflow_and_non_json_numbers_are_refused():
    assert go.Float(32).problems(1e39) == ["$: number 1e+39 overflows float32"]
    assert go.Float(64).problems(1e39) == []
    with pytest.raises(ValueError, match="NaN is not JSON"):
        go.parse('{"y": NaN}')


def test_the_version_1_card_fails_exactly_where_the_router_failed():
    # The card this runtime served before contract 2.3 (trimmed to the fields that matter).
    card = {
        "id": "sentence-transformers/all-MiniLM-L6-v2",
        "surfaces": ["embeddings", "rerank", "decisions"],
        "heads": [{"name": "pooled", "kind": "pooled", "labels": [], "overflow": ["reject"]}],
        "embedding": {"dimensions": 384, "normalized": True, "pooling": "mean"},
        "limits": {"max_tokens": 256},
        "profiles": ["exact"],
        "status": "ready",
        "golden": {"status": "matched", "checked": True, "matched": True},
    }
    assert w.ModelCard.problems(card) == [
        "$.heads[0].overflow: cannot unmarshal array into Go value of type string",
        "$.embedding.dimensions: cannot unmarshal number into Go value of type []int",
        "$.profiles[0]: cannot unmarshal string into Go value of type ProfileInfo",
        "$.golden.checked: cannot unmarshal bool into Go value of type int",
        "$.golden.matched: cannot unmarshal bool into Go value of type int",
    ]


def test_the_client_refuses_a_vector_that_is_not_base64_float32():
    assert w.vector("AACAPw==") == [1.0]
    with pytest.raises(AssertionError, match="not standard base64"):
        w.vector("AACAPw")
    with pytest.raises(AssertionError, match="not base64 float32"):
        w.vector("AACA")
    with pytest.raises(AssertionError, match="not finite"):
        w.vector("AADAfw==")
