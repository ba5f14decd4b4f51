"""The cards and process documents served are exactly their wire types
(:mod:`vllm_srun.plugins.cards`, :mod:`vllm_srun.serve.schemas`): the types the OpenAPI
document is generated from and mypy checks the builders with. The runtime rewrites no
card, so each built-in family must write the 2.3 forms itself."""

from __future__ import annotations

import pydantic
import pytest

from vllm_srun.compose.loader import LoadError
from vllm_srun.plugins.cards import ModelCard
from vllm_srun.serve import schemas
from vllm_srun.serve.status import cards

from ..wire_cards import assert_typed, assert_wire_card, undeclared
from .conftest import HEADS, make_client


def test_every_task_heads_card_is_a_wire_model_card(make_runtime):
    runtime = make_runtime(max_inputs=64)
    served = cards(runtime)
    for card in served:
        assert_wire_card(card)
    by_id = {card["id"]: card for card in served}
    assert set(by_id) == set(HEADS)
    kinds = {head["kind"] for card in served for head in card["heads"]}
    assert kinds == {"sequence", "scores", "token", "pooled", "relevance"}
    assert by_id["pooled"]["embedding"] is not None
    assert by_id["relevance"]["rerank"] is not None
    # similarity_readout attached to the pooled model: its entry is typed, its own keys free
    [extension] = by_id["pooled"]["extensions"]
    assert extension["name"] == "similarity_readout" and "temperature" in extension

    client = make_client(runtime)
    assert_typed(client.get("/v1/models").json(), schemas.ModelList)
    assert_typed(client.get("/v1/models/pooled").json(), ModelCard)
    assert_typed(client.get("/health").json(), schemas.Health)
    assert_typed(client.get("/health/live").json(), schemas.Liveness)


def test_cards_before_loading_and_after_a_failed_load_are_wire_model_cards(make_runtime):
    runtime = make_runtime(("sequence",), load=False)
    [card] = cards(runtime)
    assert_wire_card(card)
    assert card["status"] == "loading" and card["heads"] == [] and card["limits"] == {}

    def broken(model, options, **kwargs):
        raise LoadError("a file hash does not match")

    failed = make_runtime(("sequence",), loader=broken)
    [card] = cards(failed)
    assert_wire_card(card)
    assert card["status"] == "failed" and card["ready"] is False
    assert_typed(make_client(failed).get("/health").json(), schemas.Health)


@pytest.mark.parametrize(
    ("change", "why"),
    [  # the shapes of contract 1 the runtime used to rewrite: now type errors
        ({"heads": [{"overflow": ["reject", "truncate"]}]}, "heads.0.overflow"),
        ({"heads": [{"reduction": "mean over windows"}]}, "heads.0.reduction"),
        ({"embedding": {"dimensions": 32}}, "embedding.dimensions"),
        ({"limits": {"max_input_tokens": 48.0}}, "limits.max_input_tokens"),
        ({"golden": {"checked": True}}, "golden.checked"),
    ],
)
def test_a_card_in_an_earlier_shape_is_refused(make_runtime, change, why):
    [card] = cards(make_runtime(("pooled",)))
    for key, value in change.items():
        if key == "heads":
            card["heads"] = [{**card["heads"][0], **value[0]}]
        else:
            card[key] = {**card[key], **value}
    with pytest.raises(pydantic.ValidationError) as raised:
        assert_wire_card(card)
    assert why in str(raised.value)


def test_an_undeclared_key_is_found_wherever_it_is(make_runtime):
    [card] = cards(make_runtime(("pooled",)))
    card["heads"][0]["colour"] = "blue"
    card["limits"]["max_tokens"] = 48
    card["extensions"][0]["anything"] = {"free": "form"}  # an extension's own keys
    assert undeclared(card, ModelCard) == [
        "$.heads[0].colour",
        "$.limits.max_tokens",
    ]
