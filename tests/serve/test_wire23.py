"""Wire contract 2.3 on the surfaces, on the tiny fixture packages: the bodies the upstream
router's Go client sends (``options.return_meta``, ``options.profile``, content parts,
``layer`` and ``dimensions``), ``meta`` with the model's identity, ``Usage``, rerank's
``input``, classify ``windows`` and ``tokens``.

The Go client decodes every answer with ``encoding/json``: an integer field must be a JSON
integer and a number field a number, so the tests check JSON types, not only values.
"""

from __future__ import annotations

import base64
import struct

import pytest

from vllm_srun.plugins.windows import plan_windows

from ..fixtures import HEAD_LABELS
from . import reference
from .conftest import make_client
from .reference import close

LONG = " ".join(["good movie"] * 60)  # 120 content tokens: over every fixture's limit
IDENTITY = ("model_id", "revision", "model_sha256", "profile", "numerics")
PLACEMENT = ("engine", "accelerator", "device")
META = {"return_meta": True}


def error_of(response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code, response.text
    return response.json()["error"]["message"]


def card_of(client, model: str) -> dict:
    return client.get(f"/v1/models/{model}").json()


def assert_identity(meta: dict, card: dict, numerics: str = "exact") -> None:
    """``meta``'s identity is the card's, and its timings are float milliseconds."""
    assert meta["model_id"] == card["id"]
    for key in ("revision", "model_sha256", *PLACEMENT):
        assert meta[key] == card[key], key
    assert meta["profile"] == card["profile"] == "exact"
    assert meta["numerics"] == numerics
    assert isinstance(meta["model_sha256"], str) and len(meta["model_sha256"]) == 64
    for key in ("queue_ms", "compute_ms"):
        assert type(meta[key]) is float and meta[key] >= 0, key


# -- meta ------------------------------------------------------------------------------------
def test_return_meta_adds_the_identity_and_each_surface_its_own_keys(client):
    classified = client.post(
        "/v1/classify", json={"model": "sequence", "input": [{"text": "good"}], "options": META}
    ).json()
    assert_identity(classified["meta"], card_of(client, "sequence"))
    assert classified["meta"]["head"] == "sequence"
    assert classified["meta"]["compute_ms"] > 0  # its row ran in a forward

    embedded = client.post(
        "/v1/embeddings",
        json={"model": "pooled", "input": ["good"], "dimensions": 8, "options": META},
    ).json()
    card = card_of(client, "pooled")
    meta = embedded["meta"]
    assert_identity(meta, card)
    # the fixture has 2 hidden layers of 32; dimensions 8 is the output's size
    assert meta["representation"] == {
        "model_sha256": card["model_sha256"],
        "layer": 2,
        "dimension": 8,
        "normalized": True,
        "modality": "text",
    }
    assert "head" not in meta

    reranked = client.post(
        "/v1/rerank",
        json={"model": "relevance", "query": "q", "documents": ["d"], "options": META},
    ).json()
    assert_identity(reranked["meta"], card_of(client, "relevance"))
    assert set(reranked["meta"]) == {*IDENTITY, *PLACEMENT, "queue_ms", "compute_ms"}


def test_meta_is_absent_unless_asked(client):
    for options in (None, {}, {"return_meta": False}, {"return_meta": None}):
        body = {"model": "sequence", "input": "good"}
        if options is not None:
            body["options"] = options
        assert "meta" not in client.post("/v1/classify", json=body).json()
    bodies = [
        ("/v1/embeddings", {"model": "pooled", "input": "good", "options": {}}),
        ("/v1/rerank", {"model": "pooled", "query": "q", "documents": ["d"]}),
    ]
    for path, body in bodies:
        assert "meta" not in client.post(path, json=body).json(), path


def test_decisions_meta_keeps_the_readout_keys_beside_the_identity(make_runtime):
    client = make_client(make_runtime(("pooled",)))
    question = {"type": "noul", "instructions": "Is it good?"}
    body = {"state": "good movie", "questions": {"q": question}, "options": META}
    meta = client.post("/v1/decisions", json=body).json()["meta"]
    # similarity_readout answers decisions zero-shot: its numerics win over the profile's
    assert_identity(meta, card_of(client, "pooled"), numerics="approximate")
    assert meta["readout"] == "similarity_readout" and "temperature" in meta
    plain = client.post("/v1/decisions", json={**body, "options": {}}).json()
    assert "meta" not in plain


def test_the_go_clients_bundle_gets_meta_on_every_task(make_runtime, packages):
    client = make_client(make_runtime(("pooled", "sequence", "relevance")))
    tasks = [
        {
            "id": "1",
            "classify": {
                "model": "sequence",
                "input": [{"text": "good movie"}],
                "options": {"return_meta": True, "deadline_ms": 5000.0, "overflow": "truncate"},
            },
        },
        {
            "id": "2",
            "embeddings": {
                "model": "pooled",
                "input": [{"type": "text", "text": "good movie"}],
                "encoding_format": "base64",
                "options": {"return_meta": True, "max_tokens": 40, "overflow": "reject"},
            },
        },
        {
            "id": "3",
            "rerank": {
                "model": "relevance",
                "query": "good food",
                "documents": ["the food", "a movie"],
                "layer": 2,
                "dimensions": 32,
                "options": {"return_meta": True, "profile": "exact"},
            },
        },
    ]
    response = client.post("/v1/bundle", json={"tasks": tasks})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [(r["id"], r["status"]) for r in results] == [("1", 200), ("2", 200), ("3", 200)]
    for result, model in zip(results, ("sequence", "pooled", "relevance"), strict=True):
        [answer] = [v for k, v in result.items() if k not in ("id", "status")]
        assert_identity(answer["meta"], card_of(client, model))
    [item] = results[1]["embeddings"]["data"]
    raw = base64.b64decode(item["embedding"])
    vector = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert close(list(vector), reference.embedding(packages["pooled"], "good movie"))


# -- profile ---------------------------------------------------------------------------------
def test_a_profile_other_than_the_loaded_one_is_refused(client):
    for path, body in (
        ("/v1/classify", {"model": "sequence", "input": "good"}),
        ("/v1/embeddings", {"model": "pooled", "input": "good"}),
        ("/v1/rerank", {"model": "relevance", "query": "q", "documents": ["d"]}),
    ):
        exact = client.post(path, json={**body, "options": {"profile": "exact", **META}})
        assert exact.status_code == 200 and exact.json()["meta"]["profile"] == "exact", path
        fast = client.post(path, json={**body, "options": {"profile": "fast"}})
        assert error_of(fast, 400, "invalid_request") == (
            f"options.profile 'fast' is not how model {body['model']} was loaded: it was loaded "
            "with profile exact; send exact or leave options.profile out, or load the model "
            "with another profile (--profile NAME or models-file `profile: NAME`; it can load "
            "under exact, batching, max_speed)"
        )
        bad = client.post(path, json={**body, "options": {"profile": "Fast!"}})
        assert error_of(bad, 400, "invalid_request") == (
            "options.profile must be a profile name (lower-case letters, digits and _, such as "
            "exact, batching or max_speed), not 'Fast!'"
        )
        number = client.post(path, json={**body, "options": {"profile": 3}})
        assert error_of(number, 400, "invalid_request") == (
            "options.profile must be a profile name (lower-case letters, digits and _, such as "
            "exact, batching or max_speed), not 3"
        )


# -- usage -----------------------------------------------------------------------------------
def test_classify_and_rerank_usage_are_input_and_output_tokens(client):
    classified = client.post("/v1/classify", json={"model": "sequence", "input": ["good", LONG]})
    # [CLS] good [SEP]; the rejected input counts nothing
    assert classified.json()["usage"] == {"input_tokens": 3, "output_tokens": 0}
    reranked = client.post(
        "/v1/rerank", json={"model": "relevance", "query": "good", "documents": ["bad"]}
    )
    assert reranked.json()["usage"] == {"input_tokens": 5, "output_tokens": 0}
    embedded = client.post("/v1/embeddings", json={"model": "pooled", "input": "good"})
    assert embedded.json()["usage"] == {"prompt_tokens": 3, "total_tokens": 3}  # OpenAI's
    for usage in (classified.json()["usage"], reranked.json()["usage"]):
        assert all(type(v) is int for v in usage.values())


# -- content parts ---------------------------------------------------------------------------
def test_text_parts_embed_as_their_text_mixed_with_strings(client, packages):
    parts = [{"type": "text", "text": "good movie"}, "okay", {"type": "text", "text": "okay"}]
    body = {"model": "pooled", "input": parts, "options": {}}
    data = client.post("/v1/embeddings", json=body).json()["data"]
    assert [d["index"] for d in data] == [0, 1, 2]
    for item, text in zip(data, ("good movie", "okay", "okay"), strict=True):
        assert close(item["embedding"], reference.embedding(packages["pooled"], text)), text
        assert item["input"]["tokens"] == reference.tokens(packages["pooled"], text)
    assert data[1]["embedding"] == data[2]["embedding"]


def test_image_and_audio_parts_fail_alone_on_a_text_model(client, packages):
    parts = [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "text", "text": "good"},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
    ]
    response = client.post(
        "/v1/embeddings", json={"model": "pooled", "input": parts, "options": {}}
    )
    assert response.status_code == 200, response.text
    image, text, audio = response.json()["data"]
    assert image == {
        "object": "embedding",
        "index": 0,
        "error": "invalid_input",
        "message": "an image_url part (image) cannot be embedded here: this model embeds text "
        'only (its card\'s embedding.modalities are ["text"]); send it to a model whose '
        "embedding.modalities list image",
    }
    assert (audio["error"], audio["index"]) == ("invalid_input", 2)
    assert "input_audio part (audio)" in audio["message"] and '["text"]' in audio["message"]
    assert close(text["embedding"], reference.embedding(packages["pooled"], "good"))
    assert response.json()["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    # OpenAI's plain form (no options) fails the request instead, naming the input once
    plain = client.post("/v1/embeddings", json={"model": "pooled", "input": parts[:2]})
    assert error_of(plain, 400, "invalid_request") == "input[0]: " + image["message"]


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (
            {"type": "video", "video": "x"},
            "input[2].type 'video' is not a content part type; send one of text, image_url, "
            "input_audio",
        ),
        (
            {"text": "no type"},
            'input[2].type is missing; a content part is {"type": "text", "text": "..."} '
            "(or image_url, input_audio)",
        ),
        ({"type": "text", "text": 3}, "input[2].text must be a string"),
        ({"type": "text"}, "input[2].text must be a string"),
        (
            {"type": "text", "text": "a", "lang": "en"},
            "input[2].lang: not a field of a text part (it has type, text)",
        ),
        (
            {"type": "image_url", "image_url": "https://x"},
            'input[2].image_url must be an object {"url": "..."}',
        ),
        (
            {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": 1}},
            "input[2].input_audio.format must be a string",
        ),
        (
            {"type": 7},
            "input[2].type '7' is not a content part type; send one of text, "
            "image_url, input_audio",
        ),
        (5, 'input[2] must be a string or a content part {"type": "text", "text": "..."}'),
    ],
)
def test_a_malformed_part_is_400_naming_its_path(client, item, message):
    body = {"model": "pooled", "input": ["good", {"type": "text", "text": "ok"}, item]}
    assert error_of(client.post("/v1/embeddings", json=body), 400, "invalid_request") == message


# -- exits -----------------------------------------------------------------------------------
def test_embeddings_answer_the_models_exit_and_refuse_another_layer(client, packages):
    want = reference.embedding(packages["pooled"], "good")
    for layer in (None, 2):
        body = {"model": "pooled", "input": "good", "options": META}
        if layer is not None:
            body["layer"] = layer
        answered = client.post("/v1/embeddings", json=body).json()
        assert close(answered["data"][0]["embedding"], want)
        assert answered["meta"]["representation"]["layer"] == 2
    for layer in (0, 1, 3, -1):
        refused = client.post(
            "/v1/embeddings", json={"model": "pooled", "input": "good", "layer": layer}
        )
        assert error_of(refused, 400, "invalid_request") == (
            f"layer {layer} is not an exit of this model; its exits are [2]"
        )
    bad_type = client.post("/v1/embeddings", json={"model": "pooled", "input": "g", "layer": 2.0})
    assert error_of(bad_type, 400, "invalid_request") == "layer: Input should be a valid integer"


def test_rerank_answers_its_exit_and_refuses_another_layer_or_dimension(client):
    # a cross-encoder reads its last layer at its hidden size, a bi-encoder its embedding
    for model in ("relevance", "pooled"):
        body = {"model": model, "query": "good food", "documents": ["the food", "a movie"]}
        plain = client.post("/v1/rerank", json=body).json()["results"]
        for exit_ in ({"layer": 2}, {"dimensions": 32}, {"layer": 2, "dimensions": 32}):
            named = client.post("/v1/rerank", json={**body, **exit_})
            assert named.status_code == 200, (model, exit_, named.text)
            assert named.json()["results"] == plain
        layer = client.post("/v1/rerank", json={**body, "layer": 6})
        assert error_of(layer, 400, "invalid_request") == (
            "layer 6 is not an exit of this model; its exits are [2]"
        )
        dimension = client.post("/v1/rerank", json={**body, "layer": 2, "dimensions": 16})
        assert error_of(dimension, 400, "invalid_request") == (
            "dimensions 16 is not an exit of this model at layer 2; its exits are "
            "[layer 2 at dimension 32]: send 32 or leave it out"
        )


# -- rerank ----------------------------------------------------------------------------------
def test_every_scored_rerank_result_reports_its_input(client, packages):
    documents = ["good food", LONG, "a movie"]
    body = {"model": "relevance", "query": "good", "documents": documents}
    results = client.post("/v1/rerank", json=body).json()["results"]
    for result in results:
        if "error" in result:
            assert result["index"] == 1 and "input" not in result
            continue
        count = reference.tokens(packages["relevance"], "good", documents[result["index"]])
        assert result["input"] == {
            "tokens": count,
            "processed_tokens": count,
            "truncated": False,
            "windows": 1,
        }
        score, logit = reference.relevance(
            packages["relevance"], "good", documents[result["index"]]
        )
        # relevance_score is the sigmoid of the raw logit the result also carries
        assert abs(result["relevance_score"] - score) <= reference.TOLERANCE
        assert abs(result["logit"] - logit) <= reference.TOLERANCE
        assert type(result["relevance_score"]) is float and type(result["logit"]) is float
    cut = client.post(
        "/v1/rerank", json={**body, "documents": [LONG], "options": {"overflow": "truncate"}}
    ).json()["results"]
    assert cut[0]["input"] == {
        "tokens": reference.tokens(packages["relevance"], "good", LONG),
        "processed_tokens": 64,
        "truncated": True,
        "windows": 1,
    }


# -- classify windows and tokens -------------------------------------------------------------
WINDOW = {"overflow": "window", "window": {"tokens": 20, "overlap": 4}}
# 120 content tokens, 18 a window, step 14
SPANS = plan_windows(120, 18, 4)


def test_a_windowed_input_lists_every_window_with_its_readout(client, packages):
    assert SPANS[0] == (0, 18) and SPANS[-1] == (102, 120) and len(SPANS) == 9
    for model, key in (("sequence", "probabilities"), ("scores", "scores")):
        body = {"model": model, "input": [LONG, "good"], "options": WINDOW}
        long, short = client.post("/v1/classify", json=body).json()["results"]
        assert [(w["start"], w["end"]) for w in long["windows"]] == SPANS
        assert all(set(w) == {"start", "end", key} for w in long["windows"])
        # every window holds 18 tokens starting on "good": the same text, "good movie" 9 times
        text = " ".join(["good movie"] * 9)
        want = (reference.probabilities if key == "probabilities" else reference.scores)(
            packages[model], text
        )
        for window in long["windows"]:
            assert close(window[key], want), (model, window)
        merged = [max(w[key][i] for w in long["windows"]) for i in range(len(want))]
        assert close(long[key], merged, 0.0)
        # a short input is one window of its content tokens
        assert short["windows"] == [{"start": 0, "end": 1, key: short[key]}]
        assert long["input"]["windows"] == 9 and short["input"]["windows"] == 1

    token = client.post(
        "/v1/classify", json={"model": "token", "input": LONG, "options": WINDOW}
    ).json()["results"][0]
    assert token["windows"] == [{"start": s, "end": e} for s, e in SPANS]
    unwindowed = client.post("/v1/classify", json={"model": "sequence", "input": "good"})
    assert "windows" not in unwindowed.json()["results"][0]


def test_return_tokens_lists_each_tokens_label_probabilities(client, packages):
    text = "dana whitfield from new york"
    body = {"model": "token", "input": [text], "options": {"return_tokens": True}}
    response = client.post("/v1/classify", json=body).json()
    [result] = response["results"]
    labels = response["labels"]
    assert labels == ["PER", "LOC"]
    tags = HEAD_LABELS["token"]
    want = reference.token_tags(packages["token"], text)
    assert [(t["start"], t["end"]) for t in result["tokens"]] == [(s, e) for s, e, _ in want]
    for got, (_, _, distribution) in zip(result["tokens"], want, strict=True):
        expected = [
            sum(p for tag, p in zip(tags, distribution, strict=True) if tag[2:] == label)
            for label in labels
        ]
        assert close(got["probabilities"], expected)
        assert sum(got["probabilities"]) <= 1 + 1e-6
        assert type(got["start"]) is int and type(got["end"]) is int
    assert "spans" in result  # the spans are still there
    quiet = client.post("/v1/classify", json={**body, "options": {}}).json()["results"][0]
    assert "tokens" not in quiet and quiet["spans"] == result["spans"]
    # a sequence head has no tokens to list: the option changes nothing
    sequence = {"model": "sequence", "input": "good", "options": {"return_tokens": True}}
    assert "tokens" not in client.post("/v1/classify", json=sequence).json()["results"][0]


def test_return_tokens_reads_windows_back_to_code_points(client, packages):
    text = " ".join(["dana whitfield from new york"] * 12)  # 60 content tokens: 4 windows
    body = {"model": "token", "input": text, "options": {**WINDOW, "return_tokens": True}}
    [result] = client.post("/v1/classify", json=body).json()["results"]
    assert len(result["windows"]) > 1
    starts = [(t["start"], t["end"]) for t in result["tokens"]]
    assert [text[s:e] for s, e in starts] == text.split()
