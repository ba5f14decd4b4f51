"""Contract 2.3.0: the upstream router's client can attach this runtime.

Each test sends the bodies the router's client builds (:mod:`.wire23`) to one
real server (the real MiniLM and Rampart, and
fixture packages of every head and of decoders), decodes every answer with Go's rules
(:mod:`.go`; the :class:`~.conftest.Router` fails on the first type mismatch) and then
makes the checks the client's own code makes; every decision answer also passes the
router's answer check (:mod:`.answer_checks`, asserted by the Router).
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Any

import pytest
import yaml

from . import wire23 as w
from .conftest import MINILM, RAMPART, real_models

pytestmark = pytest.mark.slow

README_PII = "Email me at dana.whitfield@example.com or call Dana Whitfield tomorrow."


def cards(router) -> dict[str, dict[str, Any]]:
    _, body = router.call("GET", "/v1/models", w.ModelList)
    return {card["id"]: card for card in body["data"]}


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def server_timing(header: str) -> dict[str, float]:
    phases = {}
    for entry in header.split(","):
        name, _, params = entry.strip().partition(";")
        match = re.search(r"dur=([0-9.]+)", params)
        assert match, f"Server-Timing entry without dur: {entry!r}"
        phases[name] = float(match[1])
    return phases


PHASES = ("parse", "tokenize", "queue", "forward", "post", "serialize", "total")


def assert_timing(response) -> None:
    phases = server_timing(response.headers["server-timing"])
    assert tuple(phases) == PHASES, phases
    parts = sum(v for k, v in phases.items() if k != "total")
    assert parts <= phases["total"] + 0.01, phases


# -- readiness --------------------------------------------------------------------------------
def test_health_liveness_and_models_decode_with_major_2_and_every_model_ready(
    router, contract_packages
):
    names = {*real_models(), *contract_packages}
    response, health = router.call("GET", "/health", w.Health)
    assert response.status_code == 200
    assert w.major(health["api_version"]) == "2" and health["api_version"] == w.VERSION
    assert health["status"] == "ready"
    assert {n: m["status"] for n, m in health["models"].items()} == dict.fromkeys(names, "ready")

    _, live = router.call("GET", "/health/live", w.Liveness)
    assert live == {"api_version": w.VERSION, "status": "alive"}

    _, listing = router.call("GET", "/v1/models", w.ModelList)
    assert listing["api_version"] == w.VERSION
    assert listing["limits"]["max_bundle_tasks"] >= 1
    by_id = {card["id"]: card for card in listing["data"]}
    assert set(by_id) == names
    for card in by_id.values():
        # the router's readiness: /health says ready and the card decoded
        assert card["ready"] is True and card["status"] == "ready", card["id"]
        assert card["golden"]["status"] in ("matched", "unverified"), card["golden"]
        assert card["golden"]["matched"] <= card["golden"]["checked"]
        assert card["profiles"][0]["name"] == card["profile"] == "exact"
        assert card["profiles"][0]["numerics"] == "exact"
        if "rerank" in card["surfaces"]:
            exits = card["rerank"]["exits"]
            assert exits and card["rerank"]["default"] in exits, card["id"]
        if "embeddings" in card["surfaces"]:
            assert card["embedding"]["dimensions"] and card["embedding"]["layers"]
        for head in card.get("heads") or []:
            assert head["overflow"] in ("reject", "truncate", "window"), head
            assert head["reduction"] in (None, "max", "span_union"), head
        limits = card["limits"]
        assert limits["max_input_tokens"] >= 1
        if set(card["surfaces"]) & {"classify", "embeddings", "rerank"}:
            assert limits["max_inputs"] == 2048


def test_the_minilm_card_declares_its_real_exits(router):
    card = cards(router)[MINILM]
    assert card["embedding"]["dimensions"][-1] == 384
    assert card["embedding"]["layers"] == [6]
    assert card["embedding"]["modalities"] == ["text"]
    assert card["embedding"]["normalized"] is True
    assert card["rerank"] == {
        "exits": [{"layer": 6, "dimension": 384}],
        "default": {"layer": 6, "dimension": 384},
    }
    assert card["golden"]["status"] == "matched" and card["golden"]["checked"] >= 1
    assert card["limits"]["max_input_tokens"] == 256
    assert card["modalities"] == ["text"]


def test_a_model_is_found_by_its_basename_and_repo(router):
    _, card = router.call("GET", "/v1/models/all-MiniLM-L6-v2", w.ModelCard)
    assert card["id"] == MINILM
    body = w.embeddings_body("all-MiniLM-L6-v2", ["hello"])
    response, answer = router.call("POST", "/v1/embeddings", w.EmbeddingsResponse, body)
    assert response.status_code == 200 and answer["model"] == MINILM


def test_the_contract_document_is_served_as_yaml_with_version_2_3(router):
    response = router.http.get("/openapi.yaml")
    assert response.status_code == 200
    document = yaml.safe_load(response.text)
    assert document["info"]["version"] == w.VERSION
    assert {"/v1/decisions", "/v1/classify", "/v1/embeddings", "/v1/rerank", "/v1/bundle"} <= set(
        document["paths"]
    )


# -- surfaces -----------------------------------------------------------------------------------
def test_embeddings_as_the_router_asks_decode_with_their_representation(router):
    card = cards(router)[MINILM]
    layer, dimension = card["embedding"]["layers"][-1], card["embedding"]["dimensions"][-1]
    texts = ["How do I reset my password?", "Quarterly revenue grew 4%"]
    body = w.embeddings_body(MINILM, texts, dimensions=dimension, layer=layer)
    response, answer = router.call("POST", "/v1/embeddings", w.EmbeddingsResponse, body)
    assert response.status_code == 200, answer
    assert_timing(response)
    vectors = w.check_embeddings(answer, len(texts))
    assert all(v is not None and len(v) == dimension for v in vectors)
    representation = answer["meta"]["representation"]
    assert representation == {
        "model_sha256": card["model_sha256"],
        "layer": layer,
        "dimension": dimension,
        "normalized": True,
        "modality": "text",
    }
    assert answer["meta"]["revision"] == card["revision"]
    assert answer["usage"]["prompt_tokens"] == answer["usage"]["total_tokens"] > 0
    # the same texts as plain strings and float lists: the same vectors, bit for bit
    plain = {"model": MINILM, "input": texts}
    _, floats = router.call("POST", "/v1/embeddings", w.EmbeddingsResponse, plain)
    for got, item in zip(vectors, floats["data"], strict=True):
        assert got == [float(_f32(x)) for x in item["embedding"]]


def _f32(value: float) -> float:
    import struct

    return struct.unpack("<f", struct.pack("<f", value))[0]


def test_an_image_part_on_a_text_embedder_fails_that_item_only(router):
    body = w.embeddings_body(MINILM, ["first", "second"])
    body["input"].insert(
        1, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
    )
    response, answer = router.call("POST", "/v1/embeddings", w.EmbeddingsResponse, body)
    assert response.status_code == 200, answer
    vectors = w.check_embeddings(answer, 3)
    assert vectors[0] is not None and vectors[2] is not None and vectors[1] is None
    assert answer["data"][1]["error"] == "invalid_input"


def test_an_exit_the_model_lacks_is_refused_with_its_exits(router):
    body = w.embeddings_body(MINILM, ["x"], layer=3)
    response, answer = router.call("POST", "/v1/embeddings", w.EmbeddingsResponse, body)
    assert response.status_code == 400
    assert "6" in answer["error"]["message"] and "layer" in answer["error"]["message"]
    body = w.rerank_body(MINILM, "q", ["d"], layer=6, dimensions=128)
    response, answer = router.call("POST", "/v1/rerank", w.RerankResponse, body)
    assert response.status_code == 400 and "384" in answer["error"]["message"]


def test_rerank_on_the_cards_exit_decodes_for_a_bi_encoder_and_a_cross_encoder(router):
    card = cards(router)
    default = card[MINILM]["rerank"]["default"]
    documents = ["A cat sat on the mat.", "Stocks fell sharply.", "Kittens are young cats."]
    body = w.rerank_body(MINILM, "cats", documents, default["layer"], default["dimension"])
    response, answer = router.call("POST", "/v1/rerank", w.RerankResponse, body)
    assert response.status_code == 200, answer
    assert_timing(response)
    w.check_rerank(answer, len(documents))
    assert answer["usage"]["input_tokens"] > 0 and answer["usage"]["output_tokens"] == 0
    assert all(r["input"]["tokens"] > 0 for r in answer["results"])
    assert answer["meta"]["model_sha256"] == card[MINILM]["model_sha256"]

    cross = card["relevance"]["rerank"]["default"]
    body = w.rerank_body("relevance", "good movie", ["great film", "bad"], **_exit(cross))
    response, answer = router.call("POST", "/v1/rerank", w.RerankResponse, body)
    assert response.status_code == 200, answer
    w.check_rerank(answer, 2)
    for result in answer["results"]:
        assert result["relevance_score"] == pytest.approx(sigmoid(result["logit"]), abs=1e-12)


def _exit(value: dict[str, int]) -> dict[str, int]:
    return {"layer": value["layer"], "dimensions": value["dimension"]}


def test_classify_as_the_router_asks_decodes_on_every_head(router):
    response, answer = router.call(
        "POST", "/v1/classify", w.ClassifyResponse, w.classify_body(RAMPART, [{"text": README_PII}])
    )
    assert response.status_code == 200, answer
    assert_timing(response)
    spans = {(s["label"], s["text"]) for s in answer["results"][0]["spans"]}
    assert ("EMAIL", "dana.whitfield@example.com") in spans
    assert answer["usage"]["input_tokens"] > 0 and answer["usage"]["output_tokens"] == 0
    assert answer["meta"]["head"] == answer["head"]

    for model, items in (
        ("sequence", [{"text": "good movie"}, {"text": "bad film"}]),
        ("scores", [{"text": "you are terrible"}]),
        ("relevance", [{"text": "good movie", "text_pair": "great film"}]),
    ):
        body = w.classify_body(model, items)
        response, answer = router.call("POST", "/v1/classify", w.ClassifyResponse, body)
        assert response.status_code == 200, (model, answer)
        assert [r["index"] for r in answer["results"]] == list(range(len(items)))
        for result in answer["results"]:
            values = result.get("probabilities") or result.get("scores")
            assert values and all(math.isfinite(v) for v in values)


def test_a_windowed_classify_input_lists_its_windows(router):
    text = " ".join(["good movie and a great film"] * 40)
    body = w.classify_body(
        "sequence", [{"text": text}], overflow="window", window={"tokens": 32, "overlap": 8}
    )
    response, answer = router.call("POST", "/v1/classify", w.ClassifyResponse, body)
    assert response.status_code == 200, answer
    [result] = answer["results"]
    windows = result["windows"]
    assert len(windows) == result["input"]["windows"] > 1
    assert windows[0]["start"] == 0 and all(len(w_["probabilities"]) == 3 for w_ in windows)
    assert all(a["end"] > b["start"] for a, b in itertools.pairwise(windows))  # they overlap


def test_decisions_as_the_router_asks_decode_on_both_readouts(router):
    questions = {
        "route": {
            "type": "choice",
            "instructions": "Which team should handle this message?",
            "choices": [
                {"key": "billing", "description": "payments, invoices and refunds"},
                {"key": "technical", "description": "bugs, errors and outages"},
                {"key": "other", "description": ""},  # the client's encoding of none
            ],
        },
        "urgent": {"type": "noul", "instructions": "Is this message urgent?"},
        "tone": {
            "type": "score",
            "instructions": "How angry is the writer?",
            "levels": ["calm", "annoyed", "furious"],
        },
    }
    state = "I was charged twice for my subscription this month."
    for model in (MINILM, "decoder"):
        body = w.decisions_body(model, state, questions, deadline_ms=30000.0)
        response, answer = router.call("POST", "/v1/decisions", w.DecisionResponse, body)
        assert response.status_code == 200, answer
        assert_timing(response)
        assert set(answer["answers"]) == set(questions)
        assert all("error" not in a for a in answer["answers"].values()), answer
        assert answer["answers"]["route"]["choice"] in ("billing", "technical", "other")
        assert answer["usage"]["input_tokens"] > 0
        assert answer["meta"]["model_id"] == model


def test_decisions_states_keyed_by_name_are_answered_by_name(router):
    question = {"urgent": {"type": "noul", "instructions": "Is this urgent?"}}
    body = w.decisions_body(MINILM, "The site is down for everyone!", question)
    body["states"] = {
        "second": {"state": "Thanks, all good now.", "questions": question},
        "third": {"state": "Please call me back.", "questions": question},
    }
    response, answer = router.call("POST", "/v1/decisions", w.DecisionResponse, body)
    assert response.status_code == 200, answer
    assert set(answer["states"]) == {"second", "third"}
    alone = {}
    for name, entry in body["states"].items():
        own = w.decisions_body(MINILM, entry["state"], question)
        _, alone[name] = router.call("POST", "/v1/decisions", w.DecisionResponse, own)
    for name, entry in answer["states"].items():
        assert entry["model"] == MINILM
        assert entry["answers"] == alone[name]["answers"]
        assert entry["usage"] == alone[name]["usage"]


# -- bundles ------------------------------------------------------------------------------------
def test_a_bundle_of_every_surface_answers_each_task_with_its_own_status(router):
    card = cards(router)[MINILM]
    exit_ = card["rerank"]["default"]
    tasks = [
        ("embeddings", w.embeddings_body(MINILM, ["hello world"])),
        ("rerank", w.rerank_body(MINILM, "cats", ["a cat", "a dog"], **_exit(exit_))),
        ("classify", w.classify_body(RAMPART, [{"text": README_PII}])),
        (
            "decisions",
            w.decisions_body(
                MINILM, "refund please", {"q": {"type": "noul", "instructions": "Is it billing?"}}
            ),
        ),
        # invalid tasks: each answered alone with the status its route would give
        ("embeddings", {**w.embeddings_body(MINILM, ["x"]), "encoding_format": "hex"}),
        ("classify", w.classify_body("nonexistent-model", [{"text": "x"}])),
        ("rerank", {**w.rerank_body(MINILM, "q", ["d"]), "documents": []}),
    ]
    body = w.bundle_body(tasks)
    response, answer = router.call("POST", "/v1/bundle", w.BundleResponse, body)
    assert response.status_code == 200, answer
    assert_timing(response)
    results = answer["results"]
    assert [r["id"] for r in results] == [t["id"] for t in body["tasks"]]
    assert [r["status"] for r in results] == [200, 200, 200, 200, 400, 404, 400]
    for (surface, _task), result in zip(tasks[:4], results[:4], strict=True):
        problems = w.SURFACE_RESPONSES[surface].problems(result[surface])
        assert not problems and "meta" in result[surface]
    w.check_embeddings(results[0]["embeddings"], 1)
    w.check_rerank(results[1]["rerank"], 2)
    for result in results[4:]:
        assert result["error"]["code"] in ("invalid_request", "model_not_found"), result
    # the same invalid body on its own route gives the same message
    _, alone = router.call("POST", "/v1/embeddings", w.EmbeddingsResponse, tasks[4][1])
    assert alone["error"] == results[4]["error"]


def test_errors_decode_and_carry_every_timing_phase(router):
    for path, body in (
        ("/v1/embeddings", {"model": MINILM}),
        ("/v1/classify", w.classify_body("nonexistent-model", [{"text": "x"}])),
        ("/v1/rerank", {"model": MINILM, "query": "q", "documents": [], "options": {}}),
        ("/v1/decisions", {"model": MINILM, "state": "x", "questions": {}}),
        ("/v1/bundle", {"tasks": []}),
    ):
        response, answer = router.call("POST", path, w.ErrorResponse, body)
        assert response.status_code in (400, 404), (path, answer)
        assert_timing(response)


def test_every_exchange_of_the_run_decoded(router):
    # The Router fixture asserts each decode as it goes; this records that the
    # suite really exercised every surface and the listing.
    paths = {path for _, path, _, _ in router.exchanges}
    assert {"/v1/models", "/health", "/v1/embeddings", "/v1/rerank", "/v1/classify"} <= paths
    # and every decision answer it got passed the router's answer check (the Router
    # asserts that too): both readouts answered here, inside bundles too
    checked = {(route, model) for route, model, _ in router.decision_answers}
    assert {("/v1/decisions", MINILM), ("/v1/decisions", "decoder")} <= checked
    assert ("bundle:decisions", MINILM) in checked
