"""The typed surface requests of the plugin API: one validator for HTTP and for
callers without it, and the codes and modes written once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import get_args

import pytest

from vllm_srun.plugins import (
    OVERFLOW_MODES,
    ClassifyRequest,
    EmbeddingsRequest,
    RequestError,
    RerankRequest,
    read_request,
)
from vllm_srun.plugins.decisions import DecisionsRequest
from vllm_srun.plugins.requests import TextPair
from vllm_srun.plugins.spec import ITEM_ERRORS, REQUEST_ERRORS
from vllm_srun.serve.requests import STATUS_OF_CODE

SNAPSHOT = Path(__file__).parents[1] / "serve" / "openapi.json"


def test_read_request_builds_the_typed_request_of_each_surface():
    embeddings = read_request("embeddings", {"input": "a", "user": "ignored"})
    assert isinstance(embeddings, EmbeddingsRequest)
    assert (embeddings.texts, embeddings.encoding_format, embeddings.deadline_ms) == (
        ["a"],
        "float",
        None,
    )
    classify = read_request(
        "classify", {"input": ["a", {"text": "b", "text_pair": "c"}], "options": {"deadline_ms": 5}}
    )
    assert isinstance(classify, ClassifyRequest)
    assert classify.pairs == [TextPair(text="a"), TextPair(text="b", text_pair="c")]
    assert classify.deadline_ms == 5
    assert classify.classify_options.aggregation is None
    rerank = read_request("rerank", {"query": "q", "documents": ["d"], "model": "m"})
    assert isinstance(rerank, RerankRequest) and rerank.model == "m"
    assert rerank.input_options.overflow == "reject"
    decisions = read_request(
        "decisions", {"state": "s", "questions": {"q": {"type": "noul", "instructions": "Is it?"}}}
    )
    assert isinstance(decisions, DecisionsRequest)
    assert read_request("rerank", rerank) is rerank  # a typed request passes through


@pytest.mark.parametrize(
    ("surface", "body", "code", "message"),
    [
        (
            "embeddings",
            {"input": []},
            "invalid_request",
            "input must be a string or a non-empty list",
        ),
        (
            "embeddings",
            {"input": 3},
            "invalid_request",
            "input must be a string or a non-empty list",
        ),
        (
            "embeddings",
            {"input": ["a", 1]},
            "invalid_request",
            'input[1] must be a string or a content part {"type": "text", "text": "..."}',
        ),
        (
            "classify",
            {"input": []},
            "invalid_request",
            "input must be a string or a non-empty list",
        ),
        (
            "classify",
            {"input": ["a", {"text": "b", "text_pair": 1}]},
            "invalid_request",
            "input[1].text_pair must be a string",
        ),
        (
            "classify",
            {"input": [{"text_pair": "b"}]},
            "invalid_request",
            "input[0] must be a string or {text, text_pair}",
        ),
        (
            "classify",
            {"input": "a", "options": {"threshold": True}},
            "invalid_request",
            "options.threshold: Input should be a valid number",
        ),
        (
            "embeddings",
            {"input": "a", "options": {"overflow": "cut", "windw": {}}},
            "invalid_request",
            "options.overflow: Input should be 'reject', 'truncate' or 'window'; "
            "options.windw: not a field of this request (check the spelling)",
        ),
        ("rerank", [1], "invalid_request", "the request must be a JSON object"),
        ("speak", {}, "unsupported_surface", "no surface named 'speak'"),
    ],
)
def test_bad_bodies_name_the_field_and_the_problem(surface, body, code, message):
    with pytest.raises(RequestError) as raised:
        read_request(surface, body)
    assert (raised.value.code, raised.value.message) == (code, message)


def test_window_settings_reach_every_text_surface():
    window = {"overflow": "window", "window": {"tokens": 8, "overlap": 2}}
    for surface, body in (
        ("embeddings", {"input": "a"}),
        ("classify", {"input": "a"}),
        ("rerank", {"query": "q", "documents": ["d"]}),
    ):
        options = read_request(surface, {**body, "options": window}).input_options
        assert (options.overflow, options.window.tokens, options.window.overlap) == (
            "window",
            8,
            2,
        )


def test_codes_and_modes_are_written_once_and_the_contract_shows_them():
    schemas = json.loads(SNAPSHOT.read_text())["components"]["schemas"]
    assert tuple(schemas["ItemError"]["properties"]["error"]["enum"]) == ITEM_ERRORS
    assert tuple(schemas["ErrorBody"]["properties"]["code"]["enum"]) == REQUEST_ERRORS
    assert tuple(schemas["InputOptions"]["properties"]["overflow"]["enum"]) == OVERFLOW_MODES
    assert set(STATUS_OF_CODE) == set(REQUEST_ERRORS)
    assert (
        OVERFLOW_MODES[0]
        == "reject"
        == get_args(EmbeddingsRequest.model_fields["options"].annotation)[0]
        .model_fields["overflow"]
        .default
    )


def test_the_go_clients_bodies_are_read_with_their_2_3_fields():
    embeddings = read_request(
        "embeddings",
        {
            "model": "m",
            "input": [
                {"type": "text", "text": "a"},
                "b",
                {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}},
                {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
            ],
            "dimensions": 8,
            "layer": 6,
            "encoding_format": "base64",
            "input_type": "query",
            "options": {"return_meta": True, "deadline_ms": 250.0, "profile": "exact"},
        },
    )
    assert isinstance(embeddings, EmbeddingsRequest)
    assert embeddings.texts == ["a", "b"]  # the text of every text input, in order
    assert [getattr(c, "modality", "text") for c in embeddings.contents] == [
        "text",
        "text",
        "image",
        "audio",
    ]
    assert embeddings.token_ids is None
    assert (embeddings.layer, embeddings.input_type) == (6, "query")
    options = embeddings.input_options
    assert (options.meta, options.profile, options.deadline_ms) == (True, "exact", 250.0)
    classify = read_request(
        "classify",
        {
            "input": [{"text": "a"}],
            "options": {"return_meta": True, "return_tokens": True, "overflow": "window"},
        },
    )
    assert isinstance(classify, ClassifyRequest)
    assert classify.classify_options.return_tokens is True and classify.input_options.meta
    rerank = read_request(
        "rerank",
        {"query": "q", "documents": ["d"], "layer": 6, "dimensions": 384, "options": {}},
    )
    assert isinstance(rerank, RerankRequest)
    assert (rerank.layer, rerank.dimensions, rerank.input_options.meta) == (6, 384, False)
    assert read_request("rerank", {"query": "q", "documents": ["d"]}).input_options.profile is None
    # token ids are still token ids, never texts
    ids = read_request("embeddings", {"input": [[1, 2], [3]]})
    assert ids.token_ids == [[1, 2], [3]] and ids.texts == [] and ids.contents == []


@pytest.mark.parametrize(
    ("surface", "body", "message"),
    [
        (
            "embeddings",
            {"input": "a", "options": {"return_meta": "yes"}},
            "options.return_meta: Input should be a valid boolean",
        ),
        (
            "classify",
            {"input": "a", "options": {"return_tokens": 1}},
            "options.return_tokens: Input should be a valid boolean",
        ),
        (
            "rerank",
            {"query": "q", "documents": ["d"], "options": {"profile": "Exact"}},
            "options.profile must be a profile name (lower-case letters, digits and _, such as "
            "exact, batching or max_speed), not 'Exact'",
        ),
        (
            "rerank",
            {"query": "q", "documents": ["d"], "dimensions": 0},
            "dimensions: Input should be greater than or equal to 1",
        ),
        (
            "rerank",
            {"query": "q", "documents": ["d"], "layer": True},
            "layer: Input should be a valid integer",
        ),
        (
            "embeddings",
            {"input": "a", "input_type": "passage"},
            "input_type: Input should be 'query' or 'document'",
        ),
        (
            "embeddings",
            {"input": [{"type": "image_url", "image_url": {"uri": "x"}}]},
            "input[0].image_url.uri: not a field of image_url (it has url, detail)",
        ),
        (
            "embeddings",
            {"input": [{"type": "image_url", "image_url": {"url": "x", "detail": 2}}]},
            "input[0].image_url.detail must be a string",
        ),
        (
            "embeddings",
            {"input": [{"type": "input_audio", "input_audio": {"format": "wav"}}]},
            "input[0].input_audio.data must be a string",
        ),
        (
            "embeddings",
            {"input": [{"type": "text", "text": "a"}, [1, 2]]},
            'input[1] must be a string or a content part {"type": "text", "text": "..."}',
        ),
        (
            "embeddings",
            {"input": [1, {"type": "text", "text": "a"}]},
            "input must hold texts (strings or content parts), token ids, or lists of token "
            "ids: one kind",
        ),
    ],
)
def test_bad_2_3_fields_name_their_path(surface, body, message):
    with pytest.raises(RequestError) as raised:
        read_request(surface, body)
    assert (raised.value.code, raised.value.message) == ("invalid_request", message)
