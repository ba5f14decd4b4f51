"""The surfaces in process: request errors, per-item errors, encodings, bundles, cards,
``Server-Timing`` and metrics."""

from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import json
import math
import struct

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from vllm_srun.engines.native import NativeEngine

from ..fixtures import HEAD_LABELS
from . import reference
from .conftest import HEADS, control, make_client, timed_phases
from .reference import close

LONG = " ".join(["good movie"] * 60)  # 120 content tokens: over every fixture's limit
NOUL_QUESTION = {"type": "noul", "instructions": "Is it urgent?"}
JSON_TYPE = {"content-type": "application/json"}


def error_of(response, status: int, code: str) -> str:
    """The message of an error document, after checking its status, code and OpenAI's
    ``type`` (``param`` a field name or ``None``)."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "type", "param"}
    assert body["error"]["code"] == code
    kind = "server_error" if status >= 500 or code == "overloaded" else "invalid_request_error"
    assert body["error"]["type"] == kind
    assert body["error"]["param"] is None or isinstance(body["error"]["param"], str)
    return body["error"]["message"]


# -- request-level errors ------------------------------------------------------------------
def test_an_unknown_model_is_404_naming_the_served_ones(client):
    response = client.post("/v1/embeddings", json={"model": "nope", "input": "good"})
    message = error_of(response, 404, "model_not_found")
    assert message == (
        "model 'nope' is not served here (served: sequence, scores, token, pooled, relevance)"
    )


def test_a_surface_the_model_does_not_serve_is_422(client):
    response = client.post("/v1/classify", json={"model": "pooled", "input": "good"})
    message = error_of(response, 422, "unsupported_surface")
    assert message == "this model serves embeddings, rerank, not classify"
    response = client.post("/v1/embeddings", json={"model": "sequence", "input": "good"})
    assert error_of(response, 422, "unsupported_surface") == (
        "this model serves classify, not embeddings"
    )


def test_the_model_may_be_left_out_only_while_one_is_served(make_runtime, packages):
    several = make_client(make_runtime(("pooled", "sequence")))
    message = error_of(several.post("/v1/embeddings", json={"input": "x"}), 400, "invalid_request")
    assert message == "name the model: one of pooled, sequence"
    one = make_client(make_runtime(("pooled",)))
    response = one.post("/v1/embeddings", json={"input": "good"})
    assert response.status_code == 200 and response.json()["model"] == "pooled"
    [item] = response.json()["data"]
    assert close(item["embedding"], reference.embedding(packages["pooled"], "good"))


@pytest.mark.parametrize(
    ("path", "content", "message"),
    [
        ("/v1/embeddings", b'{"input": "good", ', "malformed JSON: Expecting property name"),
        ("/v1/classify", b"not json", "malformed JSON: Expecting value"),
        ("/v1/rerank", b"", "the body is empty; send a JSON object"),
    ],
)
def test_malformed_json_is_400_with_what_is_wrong(client, path, content, message):
    response = client.post(path, content=content, headers={"content-type": "application/json"})
    assert error_of(response, 400, "invalid_request").startswith(message)


BAD_FIELDS = [
    (
        "/v1/embeddings",
        {"model": "pooled", "input": 5},
        "input must be a string or a non-empty list",
    ),
    (
        "/v1/embeddings",
        {"model": "pooled", "input": ["good", 7]},
        'input[1] must be a string or a content part {"type": "text", "text": "..."}',
    ),
    (
        "/v1/embeddings",
        {"model": "pooled", "input": "good", "dimensions": 0},
        "dimensions: Input should be greater than or equal to 1",
    ),
    (
        "/v1/embeddings",
        {"model": "pooled", "input": "good", "dimensions": 33},
        "dimensions must be an integer from 1 to 32, not 33",
    ),
    (
        "/v1/embeddings",
        {"model": "pooled", "input": "good", "dimensions": 8.5},
        "dimensions: Input should be a valid integer",
    ),
    (
        "/v1/embeddings",
        {"model": "pooled", "input": "good", "dimensions": True},
        "dimensions: Input should be a valid integer",
    ),
    (
        "/v1/embeddings",
        {"model": "pooled", "input": "good", "dimensions": "8"},
        "dimensions: Input should be a valid integer",
    ),
    (
        "/v1/rerank",
        {"model": "relevance", "query": "q", "documents": ["d"], "return_documents": "no"},
        "return_documents: Input should be a valid boolean",
    ),
    (
        "/v1/embeddings",
        {"model": "pooled", "input": "good", "encoding_format": "hex"},
        "encoding_format: Input should be 'float' or 'base64'",
    ),
    (
        "/v1/rerank",
        {"model": "relevance", "query": "q", "documents": ["d"], "top_n": 0},
        "top_n: Input should be greater than or equal to 1",
    ),
    (
        "/v1/rerank",
        {"model": "relevance", "query": "q", "documents": "d"},
        "documents: Input should be a valid list",
    ),
    (
        "/v1/classify",
        {"model": "sequence", "input": "good", "top_k": 2},
        "top_k: not a field of this request (check the spelling)",
    ),
    (
        "/v1/classify",
        {"model": "sequence", "input": "good", "options": {"overflow": "split"}},
        "options.overflow: Input should be 'reject', 'truncate' or 'window'",
    ),
    (
        "/v1/classify",
        {"model": "token", "input": "good", "options": {"window": {"tokens": 0}}},
        "options.window.tokens: Input should be greater than or equal to 1",
    ),
    (
        "/v1/classify",
        {"model": "token", "input": "good", "options": {"window": {"size": 8}}},
        "options.window.size: not a field of this request (check the spelling)",
    ),
    (
        "/v1/classify",
        {"model": "token", "input": "good", "options": {"window": 8}},
        "options.window: Input should be a valid dictionary or object to extract fields from",
    ),
    (
        "/v1/classify",
        {
            "model": "token",
            "input": "good",
            "options": {"overflow": "window", "window": {"tokens": 500}},
        },
        "options.window.tokens 500 is above the model's limit 64",
    ),
    (
        "/v1/classify",
        {
            "model": "token",
            "input": "good",
            "options": {"overflow": "window", "window": {"tokens": 10, "overlap": 8}},
        },
        "a window of 10 tokens holds 8 content tokens beside 2 special tokens, "
        "which must be more than the overlap 8",
    ),
    (
        "/v1/classify",
        {"model": "sequence", "input": "good", "options": {"threshold": 2}},
        "options.threshold: Input should be less than or equal to 1",
    ),
    (
        "/v1/classify",
        {"model": "sequence", "input": "good", "head": "nope"},
        "unknown head 'nope'; this model has sequence",
    ),
    (
        "/v1/classify",
        {"model": "sequence", "input": []},
        "input must be a string or a non-empty list",
    ),
    (
        "/v1/embeddings",
        {"model": "pooled", "input": "good", "options": {"deadline_ms": 0}},
        "options.deadline_ms: Input should be greater than 0",
    ),
]


@pytest.mark.parametrize(("path", "body", "message"), BAD_FIELDS)
def test_each_bad_field_is_400_with_a_precise_message(client, path, body, message):
    assert error_of(client.post(path, json=body), 400, "invalid_request") == message


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        # refused by the model (a value that depends on it) or by a rule no schema states
        ("/v1/embeddings", {"model": "pooled", "input": "good", "dimensions": 33}, "dimensions"),
        ("/v1/embeddings", {"model": "pooled", "input": []}, "input"),
        ("/v1/classify", {"model": "sequence", "input": "good", "head": "nope"}, "head"),
        ("/v1/rerank", {"model": "relevance", "query": "q", "documents": []}, "documents"),
        # refused by the schema
        ("/v1/embeddings", {"model": "pooled", "input": "good", "dimensions": 0}, "dimensions"),
        ("/v1/embeddings", {"model": "pooled", "input": 5}, "input"),
    ],
)
def test_a_refusal_names_the_field_at_fault_in_param(client, path, body, param):
    """OpenAI's ``param``: the field at fault, whichever check refused it."""
    response = client.post(path, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_unknown_openai_fields_are_ignored_on_embeddings(client, packages):
    body = {"model": "pooled", "input": "good", "user": "someone"}
    response = client.post("/v1/embeddings", json=body)
    assert response.status_code == 200
    [item] = response.json()["data"]
    assert close(item["embedding"], reference.embedding(packages["pooled"], "good"))
    # [CLS] good [SEP]
    assert response.json()["usage"] == {"prompt_tokens": 3, "total_tokens": 3}


def test_an_unknown_route_answers_an_error_document(client):
    response = client.get("/v1/nothing")
    assert response.status_code == 404
    assert response.json() == {
        "error": {
            "code": "invalid_request",
            "message": "GET /v1/nothing: Not Found",
            "type": "invalid_request_error",
            "param": None,
        }
    }
    wrong_method = client.get("/v1/embeddings")
    assert wrong_method.status_code == 405
    assert wrong_method.headers["allow"] == "POST"  # HTTP: a 405 names the methods
    assert wrong_method.json() == {
        "error": {
            "code": "invalid_request",
            "message": "GET /v1/embeddings: Method Not Allowed",
            "type": "invalid_request_error",
            "param": None,
        }
    }


# -- per-item errors and answers ------------------------------------------------------------
def test_an_input_over_the_limit_fails_alone_beside_its_siblings(client, packages):
    body = {"model": "pooled", "input": ["good movie", LONG, "okay"], "options": {}}
    response = client.post("/v1/embeddings", json=body)
    assert response.status_code == 200
    data = response.json()["data"]
    assert [d["index"] for d in data] == [0, 1, 2]
    assert data[1] == {
        "object": "embedding",
        "index": 1,
        "error": "max_length_exceeded",
        "message": "input has 122 tokens; the limit is 48. Shorten it, or send options.overflow "
        "truncate (keep the beginning) or window",
    }
    # [CLS] good movie [SEP] and [CLS] okay [SEP]: 4 and 3 tokens; the failed input counts none
    for item, text, count in ((data[0], "good movie", 4), (data[2], "okay", 3)):
        assert close(item["embedding"], reference.embedding(packages["pooled"], text))
        assert reference.tokens(packages["pooled"], text) == count
        assert item["input"] == {
            "tokens": count,
            "processed_tokens": count,
            "truncated": False,
            "windows": 1,
        }
    assert response.json()["usage"] == {"prompt_tokens": 7, "total_tokens": 7}

    classify = client.post("/v1/classify", json={"model": "sequence", "input": [LONG, "good"]})
    results = classify.json()["results"]
    assert results[0] == {
        "index": 0,
        "error": "max_length_exceeded",
        "message": "input has 122 tokens; the limit is 64. Shorten it, or send options.overflow "
        "truncate (keep the beginning) or window",
    }
    want = reference.probabilities(packages["sequence"], "good")
    assert close(results[1]["probabilities"], want)
    assert results[1]["label"] == HEAD_LABELS["sequence"][want.index(max(want))]
    assert classify.json()["usage"] == {"input_tokens": 3, "output_tokens": 0}

    truncated = client.post(
        "/v1/embeddings",
        json={"model": "pooled", "input": LONG, "options": {"overflow": "truncate"}},
    )
    [item] = truncated.json()["data"]
    assert item["input"] == {"tokens": 122, "processed_tokens": 48, "truncated": True, "windows": 1}
    # the embedding of the first 48 tokens ([CLS], 46 content tokens, [SEP])
    want = reference.embedding(packages["pooled"], LONG, max_tokens=48)
    assert close(item["embedding"], want)
    assert truncated.json()["usage"] == {"prompt_tokens": 48, "total_tokens": 48}


def test_duplicate_inputs_get_the_same_answer_at_their_own_index(make_runtime, packages):
    runtime = make_runtime(("pooled", "token"), result_cache_entries=0)
    client = make_client(runtime)
    texts = ["good movie", "okay", "good movie", "dana from paris", "okay"]
    before = len(control(runtime, "pooled").forwards)
    data = client.post("/v1/embeddings", json={"model": "pooled", "input": texts}).json()["data"]
    assert [d["index"] for d in data] == [0, 1, 2, 3, 4]
    assert data[0]["embedding"] == data[2]["embedding"]
    assert data[1]["embedding"] == data[4]["embedding"]
    assert data[0]["embedding"] != data[1]["embedding"] != data[3]["embedding"]
    # each distinct row runs once: under exact, in one forward per length, each forward
    # filled up to 32 tokens with copies of its last row (never another row)
    forwards = control(runtime, "pooled").forwards[before:]
    firsts = [key for forward in forwards for key in dict.fromkeys(forward)]
    assert len(firsts) == len(set(firsts)) == 3
    for item, text in zip(data, texts, strict=True):
        assert close(item["embedding"], reference.embedding(packages["pooled"], text)), text
    for index, text in enumerate(texts):
        response = client.post("/v1/embeddings", json={"model": "pooled", "input": text})
        [alone] = response.json()["data"]
        pairs = zip(alone["embedding"], data[index]["embedding"], strict=True)
        assert max(abs(a - b) for a, b in pairs) < 1e-5

    spans = ["dana whitfield", "new york", "dana whitfield"]
    results = client.post(
        "/v1/classify", json={"model": "token", "input": spans, "options": {"threshold": 0}}
    ).json()["results"]
    assert [r["index"] for r in results] == [0, 1, 2]
    assert results[0]["spans"] == results[2]["spans"] != results[1]["spans"]


def test_base64_embeddings_are_little_endian_float32(client, packages):
    request = {"model": "pooled", "input": ["good movie", "okay"], "dimensions": 16}
    floats = client.post("/v1/embeddings", json=request).json()["data"]
    for item, text in zip(floats, request["input"], strict=True):
        want = reference.embedding(packages["pooled"], text, dimensions=16)
        assert close(item["embedding"], want), text
    encoded = client.post("/v1/embeddings", json={**request, "encoding_format": "base64"}).json()[
        "data"
    ]
    for as_float, as_base64 in zip(floats, encoded, strict=True):
        raw = base64.b64decode(as_base64["embedding"])
        assert len(raw) == 16 * 4
        decoded = struct.unpack("<16f", raw)
        expected = struct.unpack("<16f", struct.pack("<16f", *as_float["embedding"]))
        assert decoded == expected
        assert abs(sum(v * v for v in decoded) - 1) < 1e-5  # re-normalised after truncation


def test_rerank_orders_by_score_and_puts_failed_documents_last(client, packages):
    documents = ["good food", LONG, "a movie", "the food was good"]
    body = {"model": "relevance", "query": "good food", "documents": documents}
    results = client.post("/v1/rerank", json={**body, "return_documents": True}).json()["results"]
    ranked, failed = results[:3], results[3:]
    assert sorted(r["index"] for r in ranked) == [0, 2, 3]
    scores = [r["relevance_score"] for r in ranked]
    assert scores == sorted(scores, reverse=True)
    for result in ranked:
        assert result["document"] == documents[result["index"]]
        assert result["relevance_score"] == pytest.approx(1 / (1 + math.exp(-result["logit"])))
        score, logit = reference.relevance(
            packages["relevance"], "good food", documents[result["index"]]
        )
        assert abs(result["logit"] - logit) <= reference.TOLERANCE
        assert abs(result["relevance_score"] - score) <= reference.TOLERANCE
        pair = reference.tokens(packages["relevance"], "good food", documents[result["index"]])
        assert result["input"] == {
            "tokens": pair,
            "processed_tokens": pair,
            "truncated": False,
            "windows": 1,
        }
    assert sum(r["input"]["tokens"] for r in ranked) == 38
    assert failed == [
        {
            "index": 1,
            "error": "max_length_exceeded",
            "message": "input has 128 tokens; the limit is 64. Shorten it, or send "
            "options.overflow truncate (keep the beginning) or window",
        }
    ]
    top = client.post("/v1/rerank", json={**body, "top_n": 2})
    assert [r["index"] for r in top.json()["results"]] == [r["index"] for r in ranked[:2]]
    assert "document" not in top.json()["results"][0]
    # every scored pair counts, query and document: 13 + 10 + 15 tokens, the failed one none
    assert top.json()["usage"] == {"input_tokens": 38, "output_tokens": 0}


def test_bi_encoder_rerank_orders_by_the_cosine_of_the_embeddings(client, packages):
    documents = ["a movie", "the food"]
    body = {"model": "pooled", "query": "good food", "documents": documents}
    response = client.post("/v1/rerank", json=body)
    assert response.status_code == 200
    query = reference.embedding(packages["pooled"], "good food")
    want = {
        i: reference.cosine(query, reference.embedding(packages["pooled"], d))
        for i, d in enumerate(documents)
    }
    assert want[1] - want[0] > 0.1  # the reference puts "the food" clearly first
    results = response.json()["results"]
    assert [r["index"] for r in results] == [1, 0]
    for result in results:
        assert abs(result["relevance_score"] - want[result["index"]]) <= reference.TOLERANCE
        assert result["logit"] == result["relevance_score"]
    # each document's own tokens; the query's count in usage only
    assert [r["input"] for r in results] == [
        {"tokens": 7, "processed_tokens": 7, "truncated": False, "windows": 1},
        {"tokens": 4, "processed_tokens": 4, "truncated": False, "windows": 1},
    ]
    # [CLS] good f ##o ##o ##d [SEP] (7), [CLS] a movie [SEP] (4), [CLS] the f ##o ##o ##d [SEP] (7)
    assert response.json()["usage"] == {"input_tokens": 18, "output_tokens": 0}


# -- bundles --------------------------------------------------------------------------------
def test_a_bundle_keeps_task_order_and_each_task_its_status(make_runtime, packages):
    client = make_client(make_runtime(("pooled", "sequence"), max_bundle_tasks=3))
    tasks = [
        {"id": "first", "embeddings": {"model": "pooled", "input": "good movie"}},
        {"id": "wrong", "classify": {"model": "pooled", "input": "good movie"}},
        {"id": "third", "classify": {"model": "sequence", "input": ["good", "bad"]}},
    ]
    response = client.post("/v1/bundle", json={"tasks": tasks})
    assert response.status_code == 200
    results = response.json()["results"]
    assert [(r["id"], r["status"]) for r in results] == [
        ("first", 200),
        ("wrong", 422),
        ("third", 200),
    ]
    assert results[1]["error"] == {
        "code": "unsupported_surface",
        "message": "this model serves embeddings, rerank, not classify",
        "type": "invalid_request_error",
        "param": None,
    }
    [item] = results[0]["embeddings"]["data"]
    assert close(item["embedding"], reference.embedding(packages["pooled"], "good movie"))
    for result, text in zip(results[2]["classify"]["results"], ["good", "bad"], strict=True):
        assert close(result["probabilities"], reference.probabilities(packages["sequence"], text))
    alone = client.post("/v1/embeddings", json=tasks[0]["embeddings"]).json()
    assert results[0]["embeddings"] == alone
    classified = client.post("/v1/classify", json=tasks[2]["classify"]).json()
    assert results[2]["classify"] == classified
    assert "classify" not in results[1] and "embeddings" not in results[2]


def test_a_bundle_reports_unknown_and_invalid_tasks_in_place(make_runtime, packages):
    client = make_client(make_runtime(("pooled",)))
    tasks = [
        {"id": "a", "embeddings": {"model": "nope", "input": "good"}},
        {"id": "b", "embeddings": {"input": "good", "dimensions": 99}},
        {"id": "c", "embeddings": {"input": "good"}},
    ]
    results = client.post("/v1/bundle", json={"tasks": tasks}).json()["results"]
    assert [(r["id"], r["status"]) for r in results] == [("a", 404), ("b", 400), ("c", 200)]
    assert results[0]["error"] == {
        "code": "model_not_found",
        "message": "model 'nope' is not served here (served: pooled)",
        "type": "invalid_request_error",
        "param": "model",
    }
    assert results[1]["error"] == {
        "code": "invalid_request",
        "message": "dimensions must be an integer from 1 to 32, not 99",
        "type": "invalid_request_error",
        "param": "dimensions",
    }
    [item] = results[2]["embeddings"]["data"]
    assert close(item["embedding"], reference.embedding(packages["pooled"], "good"))


def test_a_bundle_over_max_bundle_tasks_is_413(make_runtime):
    client = make_client(make_runtime(("pooled",), max_bundle_tasks=2))
    tasks = [{"id": str(i), "embeddings": {"input": "good"}} for i in range(3)]
    message = error_of(client.post("/v1/bundle", json={"tasks": tasks}), 413, "request_too_large")
    assert message == "the bundle has 3 tasks; at most 2"


INVALID_TASKS = {
    "embeddings": {"model": "pooled", "input": 3},
    "classify": {"model": "sequence", "input": "x", "colour": "red"},
    "rerank": {"model": "relevance", "query": "q", "documents": ["d"], "top_n": 0},
    "decisions": {"model": "pooled", "state": "s", "questions": {}},
}
VALID_TASKS = {
    "embeddings": {"model": "pooled", "input": "good"},
    "classify": {"model": "sequence", "input": "good"},
    "rerank": {"model": "relevance", "query": "q", "documents": ["d"]},
    "decisions": {"model": "pooled", "state": "s", "questions": {"q": NOUL_QUESTION}},
}


@pytest.mark.parametrize("surface", list(INVALID_TASKS))
def test_an_invalid_task_of_each_surface_fails_alone_with_its_routes_message(client, surface):
    tasks = [{"id": f"ok-{s}", s: body} for s, body in VALID_TASKS.items()]
    tasks.insert(2, {"id": "bad", surface: INVALID_TASKS[surface]})
    response = client.post("/v1/bundle", json={"tasks": tasks})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r["id"] for r in results] == [t["id"] for t in tasks]
    alone = client.post(f"/v1/{surface}", json=INVALID_TASKS[surface])
    assert alone.status_code == 400
    assert results[2] == {"id": "bad", "status": 400, "error": alone.json()["error"]}
    assert alone.json()["error"]["code"] == "invalid_request"
    for result, task in zip(results, tasks, strict=True):
        if result["id"] == "bad":
            continue
        [key] = [k for k in task if k != "id"]
        assert result["status"] == 200, result
        assert result[key] == client.post(f"/v1/{key}", json=task[key]).json()


PARAMS = {
    # OpenAI's param of a task's validation problem: its field, as the route names it
    "options.threshold: Input should be less than or equal to 1": "options.threshold",
    "query: Field required": "query",
}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"embeddings": "good"},
            "the request must be a JSON object",
        ),
        (
            {"classify": {"model": "sequence", "input": "x", "options": {"threshold": 2}}},
            "options.threshold: Input should be less than or equal to 1",
        ),
        ({"rerank": {"model": "relevance", "documents": ["d"]}}, "query: Field required"),
        (
            {
                "decisions": {
                    "model": "pooled",
                    "state": "s",
                    "questions": {"q": NOUL_QUESTION},
                    "x": 1,
                }
            },
            "x is not a field of a decisions request "
            "(model, state, questions, states, images, options)",
        ),
        ({"decisions": []}, "the request must be a JSON object"),
    ],
)
def test_a_task_body_that_fails_validation_is_that_tasks_400(client, body, message):
    tasks = [{"id": "a", **body}, {"id": "b", "embeddings": {"model": "pooled", "input": "x"}}]
    response = client.post("/v1/bundle", json={"tasks": tasks})
    assert response.status_code == 200, response.text
    bad, good = response.json()["results"]
    assert bad == {
        "id": "a",
        "status": 400,
        "error": {
            "code": "invalid_request",
            "message": message,
            "type": "invalid_request_error",
            "param": PARAMS.get(message),
        },
    }
    assert good["status"] == 200


def test_an_empty_task_body_keeps_the_status_its_route_gives(client):
    # the route resolves the model before the request's own rules: 404 first, as alone
    tasks = [
        {"id": "a", "embeddings": {"model": "nope", "input": []}},
        {"id": "b", "embeddings": {"model": "pooled", "input": []}},
    ]
    results = client.post("/v1/bundle", json={"tasks": tasks}).json()["results"]
    for result, task in zip(results, tasks, strict=True):
        alone = client.post("/v1/embeddings", json=task["embeddings"])
        assert (result["status"], result["error"]) == (alone.status_code, alone.json()["error"])
    assert [r["status"] for r in results] == [404, 400]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "tasks: Field required"),
        ({"tasks": {"id": "a"}}, "tasks: Input should be a valid list"),
        ({"tasks": []}, "tasks: List should have at least 1 item after validation, not 0"),
        ({"tasks": ["a"]}, "tasks[0] must be an object {id, <surface>: request}, not a string"),
        (
            {"tasks": [{"id": "a", "embeddings": {"input": "x"}}, None]},
            "tasks[1] must be an object {id, <surface>: request}, not null",
        ),
        ({"tasks": [[]]}, "tasks[0] must be an object {id, <surface>: request}, not an array"),
        ({"tasks": [1.5]}, "tasks[0] must be an object {id, <surface>: request}, not a number"),
        ({"tasks": [True]}, "tasks[0] must be an object {id, <surface>: request}, not a boolean"),
        ({"tasks": [{"embeddings": {"input": "x"}}]}, "tasks.0.id: Field required"),
        (
            {"tasks": [{"id": "", "embeddings": {"input": "x"}}]},
            "tasks.0.id: String should have at least 1 character",
        ),
        (
            {"tasks": [{"id": 1, "embeddings": {"input": "x"}}]},
            "tasks.0.id: Input should be a valid string",
        ),
        (
            {"tasks": [{"id": "a", "embedding": {"input": "x"}}]},
            "tasks.0.embedding: not a field of this request (check the spelling)",
        ),
        (
            {"tasks": [{"id": "a", "embeddings": {"input": "x"}}], "option": {}},
            "option: not a field of this request (check the spelling)",
        ),
        (
            {"tasks": [{"id": "a", "embeddings": {"input": "x"}}], "options": {"deadline_ms": 0}},
            "options.deadline_ms: Input should be greater than 0",
        ),
        (
            [{"id": "a"}],
            "the body must be a JSON object; send it with content-type: application/json",
        ),
    ],
)
def test_only_a_malformed_bundle_is_refused_whole(client, body, message):
    assert error_of(client.post("/v1/bundle", json=body), 400, "invalid_request") == message


def test_a_bundle_is_read_as_json_as_the_typed_routes_read_theirs(client):
    task = b'{"tasks": [{"id": "a", "embeddings": {"model": "pooled", "input": "x"}}]}'
    for content, headers, message in [
        (b"{", JSON_TYPE, "malformed JSON: Expecting property name enclosed in double quotes"),
        (b"", JSON_TYPE, "the body is empty; send a JSON object"),
        (
            task,
            {"content-type": "text/plain"},
            "the body must be a JSON object; send it with content-type: application/json",
        ),
    ]:
        response = client.post("/v1/bundle", content=content, headers=headers)
        alone = client.post("/v1/embeddings", content=content, headers=headers)
        assert error_of(response, 400, "invalid_request") == message
        assert error_of(alone, 400, "invalid_request") == message
    vendor = {"content-type": "application/vnd.api+json; charset=utf-8"}
    assert client.post("/v1/bundle", content=task, headers=vendor).status_code == 200


def test_a_large_bundle_is_read_off_the_event_loop_with_the_same_answers(client):
    from vllm_srun.serve.bundle import INLINE_BYTES

    tasks = [
        {"id": "e", "embeddings": {"model": "pooled", "input": "good"}},
        {"id": "bad", "rerank": {"model": "relevance", "query": "q"}},
        {
            "id": "d",
            "decisions": {"model": "pooled", "state": "s", "questions": {"q": NOUL_QUESTION}},
        },
    ]
    small = json.dumps({"tasks": tasks}).encode()
    large = small + b" " * INLINE_BYTES  # the same JSON document, over the inline size
    answers = [
        client.post("/v1/bundle", content=body, headers=JSON_TYPE) for body in (small, large)
    ]
    assert [a.status_code for a in answers] == [200, 200]
    assert answers[0].json() == answers[1].json()
    assert [r["status"] for r in answers[0].json()["results"]] == [200, 400, 200]
    too_many = json.dumps({"tasks": [tasks[0]] * 65}).encode() + b" " * INLINE_BYTES
    refused = client.post("/v1/bundle", content=too_many, headers=JSON_TYPE)
    assert error_of(refused, 413, "request_too_large") == "the bundle has 65 tasks; at most 64"


def test_a_decisions_task_answers_named_states_like_its_route(client):
    body = {
        "model": "pooled",
        "state": "my card was charged twice",
        "questions": {"q": NOUL_QUESTION},
        "states": {"late": {"state": "my parcel is late", "questions": {"q": NOUL_QUESTION}}},
    }
    response = client.post("/v1/bundle", json={"tasks": [{"id": "1", "decisions": body}]})
    [result] = response.json()["results"]
    assert result["status"] == 200
    assert result["decisions"] == client.post("/v1/decisions", json=body).json()
    assert list(result["decisions"]["states"]) == ["late"]
    assert result["decisions"]["states"]["late"]["model"] == "pooled"


@pytest.mark.parametrize("surfaces", [("embeddings", "classify"), ()])
def test_a_bundle_task_needs_exactly_one_surface(client, surfaces):
    task = {"id": "odd", **{s: {"model": "pooled", "input": "good"} for s in surfaces}}
    ok = {"id": "fine", "embeddings": {"model": "pooled", "input": "good"}}
    response = client.post("/v1/bundle", json={"tasks": [ok, task]})
    assert error_of(response, 400, "invalid_request") == (
        "tasks[1] (odd) must have exactly one of embeddings, classify, rerank, decisions, "
        "systemone_batch"
    )


# -- /v1/models -----------------------------------------------------------------------------
CARD_FIELDS = {  # wire contract 2.3 ModelCard, less manifest_sha256 (no equivalent here)
    "id",
    "object",
    "owned_by",
    "family",
    "repo",
    "revision",
    "model_sha256",
    "surfaces",
    "question_types",
    "presets",
    "modalities",
    "heads",
    "embedding",
    "rerank",
    "limits",
    "licence",
    "profile",
    "profiles",
    "engine",
    "accelerator",
    "accelerator_validated",
    "device",
    "dtype",
    "parameters",
    "ready",
    "status",
    "reason",
    "golden",
    "plugins",
}
HEAD_FIELDS = {  # 2.3 HeadCard, with our extensions overflow_policies and window_reduction
    "name",
    "kind",
    "labels",
    "inputs",
    "default_threshold",
    "thresholds",
    "operating_point_sha256",
    "overflow",
    "overflow_policies",
    "window",
    "reduction",
    "window_reduction",
}
PROFILES = [p.card() for p in NativeEngine.profiles]
"""The native engine's profiles, as every card of a model it runs lists them."""


def integers_are_integers(value, where=""):
    """Fail on a float where the 2.3 contract has an integer: every number under these
    card keys is a count, a size or a layer (a JSON Schema check would take 48.0 for one)."""
    if isinstance(value, dict):
        for key, item in value.items():
            integers_are_integers(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            integers_are_integers(item, f"{where}[{index}]")
    elif isinstance(value, float):
        raise AssertionError(f"{where} is {value!r}, a float where the contract has an integer")


def test_models_lists_limits_plugins_and_a_card_per_model(make_runtime):
    runtime = make_runtime(max_bundle_tasks=7, max_request_bytes=12345)
    body = make_client(runtime).get("/v1/models").json()
    assert body["object"] == "list"
    assert body["api_version"] == "2.3.0"
    assert body["limits"] == {"max_bundle_tasks": 7, "max_request_bytes": 12345}
    plugins = {p["name"]: p for p in body["plugins"]}
    assert {"task_heads", "native", "cpu"} <= set(plugins)
    assert plugins["task_heads"]["error"] is None
    assert plugins["task_heads"]["distribution"] == "vllm-srun"
    cards = {card["id"]: card for card in body["data"]}
    assert list(cards) == list(HEADS)
    assert cards["sequence"]["engine_args"] == {  # the values in effect, per model
        "engine": "auto",
        "dtype": "auto",
        "max_num_seqs": 8192,
        "max_num_batched_tokens": 65536,
        "batch_window_ms": 2.0,
        "max_model_len": None,
        "enable_shared_context": None,
        "profile": "exact",
        "base_path": None,
    }
    for card in cards.values():
        assert set(card) >= CARD_FIELDS
        assert card["status"] == "ready" and card["reason"] is None and card["ready"] is True
        assert card["family"] == "task_heads"
        assert card["engine"] == "native" and card["device"] == "cpu"
        assert card["revision"] is None  # a local package
        assert card["golden"]["status"] == "unverified"  # not built in: nothing recorded
        assert card["golden"]["checked"] >= 1 and card["golden"]["matched"] == 0
        assert card["accelerator_validated"] is False
        assert card["profile"] == "exact" and card["profiles"] == PROFILES
        assert [p["name"] for p in PROFILES] == ["exact", "batching", "max_speed"]
        assert (card["numerics"], card["deviation_from_exact"]) == ("exact", None)
        assert card["presets"] == []
        limit = 48 if card["id"] == "pooled" else 64  # max_seq_length, else the positions
        assert card["limits"]["max_input_tokens"] == limit
        assert "max_tokens" not in card["limits"]
        assert set(card["heads"][0]) == HEAD_FIELDS
        for key in ("limits", "golden", "embedding", "rerank", "parameters", "created"):
            integers_are_integers(card[key], key)
        for head in card["heads"]:
            integers_are_integers(head["window"], "window")
            assert head["overflow"] == "reject"  # a request naming no policy gets reject
            assert head["overflow_policies"] == ["reject", "truncate", "window"]
        groups = [(p["group"], p["name"], p["distribution"]) for p in card["plugins"]]
        assert groups[:3] == [
            ("family", "task_heads", "vllm-srun"),
            ("engine", "native", "vllm-srun"),
            ("accelerator", "cpu", "vllm-srun"),
        ]
        assert ("kernel", "attention.eager", "vllm-srun") in groups
        assert all(p["version"] and isinstance(p["capabilities"], dict) for p in card["plugins"])

    sequence = cards["sequence"]
    assert sequence["surfaces"] == ["classify"]
    [head] = sequence["heads"]
    assert head["kind"] == "sequence" and head["labels"] == list(HEAD_LABELS["sequence"])
    assert head["inputs"] == ["text", "pair"]
    assert (head["default_threshold"], head["thresholds"]) == (None, None)
    assert head["reduction"] == "max"  # the per-label maximum over windows
    assert head["window"] == {"tokens": 64, "overlap": 31}  # half a window's 62 content tokens
    assert sequence["embedding"] is None and sequence["rerank"] is None
    assert sequence["modalities"] == [] and sequence["question_types"] == []

    [scores] = cards["scores"]["heads"]
    assert scores["thresholds"] == [0.5, 0.4, 0.9]  # the packaged operating point, per label
    assert len(scores["operating_point_sha256"]) == 64
    assert scores["reduction"] == "max"

    [token] = cards["token"]["heads"]
    assert token["labels"] == ["PER", "LOC"]  # entities of the BIO tags
    assert token["inputs"] == ["text"]
    assert token["reduction"] is None  # most-central window per token: neither max nor span_union
    assert token["window_reduction"] == "most-central window per token"

    pooled = cards["pooled"]
    assert pooled["surfaces"] == ["embeddings", "rerank", "decisions"]
    assert pooled["embedding"] == {
        "dimensions": [32],  # no Matryoshka sizes declared
        "layers": [2],  # the last of its two hidden layers
        "modalities": ["text"],
        "normalized": True,
        "pooling": "mean",
        "input_types": [],
        "max_tokens": 48,
    }
    exit_ = {"layer": 2, "dimension": 32}
    assert pooled["rerank"] == {"exits": [exit_], "default": exit_}
    assert pooled["modalities"] == ["text"]  # it answers decisions (similarity_readout)
    assert pooled["limits"] == {
        "max_input_tokens": 48,
        "max_inputs": 2048,
        "min_options": 2,
        "max_options": 255,
        "min_levels": 2,
        "max_levels": 10,
    }
    assert ("extension", "similarity_readout", "vllm-srun") in [
        (p["group"], p["name"], p["distribution"]) for p in pooled["plugins"]
    ]

    relevance = cards["relevance"]
    assert relevance["surfaces"] == ["classify", "rerank"]
    assert relevance["rerank"] == {"exits": [exit_], "default": exit_}  # hidden size 32
    assert relevance["heads"][0]["inputs"] == ["text", "pair"]


def test_a_model_is_found_by_its_basename_and_repo_and_an_ambiguous_name_is_refused(
    make_runtime, packages
):
    from vllm_srun.config import ModelConfig

    models = [
        ModelConfig(model=str(packages["pooled"]), name="acme/embedder"),
        ModelConfig(model=str(packages["sequence"]), name="acme/sentiment"),
        ModelConfig(model=str(packages["token"]), name="other/sentiment"),
    ]
    runtime = make_runtime(models=models)
    runtime.models["acme/embedder"].served.prepared = dataclasses.replace(
        runtime.models["acme/embedder"].served.prepared, repo="sentence-transformers/tiny"
    )
    client = make_client(runtime)
    for name in ("acme/embedder", "embedder", "sentence-transformers/tiny", "tiny"):
        response = client.post("/v1/embeddings", json={"model": name, "input": "good"})
        assert response.status_code == 200, (name, response.text)
        assert response.json()["model"] == "acme/embedder"  # always the served ID
        card = client.get(f"/v1/models/{name}").json()
        assert card["id"] == "acme/embedder" and card["repo"] == "sentence-transformers/tiny"
    for route, body in (
        ("/v1/classify", {"model": "sentiment", "input": "good"}),
        ("/v1/models/sentiment", None),
    ):
        response = client.post(route, json=body) if body else client.get(route)
        assert response.status_code == 404
        assert response.json()["error"] == {
            "code": "model_not_found",
            "message": "model 'sentiment' is ambiguous: it names acme/sentiment and "
            "other/sentiment; use the full model ID",
            "type": "invalid_request_error",
            "param": "model",
        }
    exact = client.post("/v1/classify", json={"model": "acme/sentiment", "input": "good"})
    assert exact.status_code == 200


# -- Server-Timing and metrics ---------------------------------------------------------------
def test_every_surface_answer_times_each_phase(runtime, client):
    control(runtime, "sequence").delay = 0.03
    response = client.post("/v1/classify", json={"model": "sequence", "input": "timed text"})
    assert response.status_code == 200
    timing = timed_phases(response)
    assert timing["forward"] >= 30
    assert timing["parse"] > 0 and timing["tokenize"] > 0 and timing["serialize"] > 0
    decisions = {"model": "pooled", "state": "s", "questions": {"q": NOUL_QUESTION}}
    for path, body in [
        ("/v1/embeddings", {"model": "pooled", "input": "good"}),
        ("/v1/rerank", {"model": "relevance", "query": "q", "documents": ["d"]}),
        ("/v1/decisions", decisions),
        (
            "/v1/systemone/batch",
            {"model": "pooled", "states": ["a"], "questions": {"q": NOUL_QUESTION}},
        ),
        ("/v1/bundle", {"tasks": [{"id": "x", "embeddings": {"model": "pooled", "input": "q"}}]}),
        ("/v1/classify", {"model": "pooled", "input": "good"}),
    ]:
        timed_phases(client.post(path, json=body))


def test_a_bundle_reports_the_phases_of_the_task_answered_last(runtime, client):
    control(runtime, "sequence").delay = 0.05
    tasks = [
        {"id": "slow", "classify": {"model": "sequence", "input": "slow one"}},
        {"id": "slow2", "classify": {"model": "sequence", "input": "slow two"}},
        {"id": "fast", "embeddings": {"model": "pooled", "input": "fast"}},
        {"id": "bad", "rerank": {"model": "relevance", "query": "q", "documents": "d"}},
    ]
    response = client.post("/v1/bundle", json={"tasks": tasks})
    assert [r["status"] for r in response.json()["results"]] == [200, 200, 200, 400]
    timing = timed_phases(response)  # two classify forwards are not counted twice
    assert 50 <= timing["forward"] < timing["total"]


def test_every_error_of_a_surface_or_bundle_route_carries_every_phase(make_runtime):
    runtime = make_runtime(("pooled", "sequence"), max_bundle_tasks=2, max_queue=1)
    client = make_client(runtime)
    tasks = [{"id": str(i), "embeddings": {"input": "x"}} for i in range(3)]
    refused = [
        (400, client.post("/v1/embeddings", json={"model": "pooled", "input": 3})),
        (400, client.post("/v1/classify", content=b"{", headers=JSON_TYPE)),
        (400, client.post("/v1/decisions", json={"model": "pooled", "state": "s"})),
        (400, client.post("/v1/bundle", json={"tasks": []})),
        (400, client.post("/v1/bundle", content=b"{", headers=JSON_TYPE)),
        (404, client.post("/v1/rerank", json={"model": "nope", "query": "q", "documents": ["d"]})),
        (404, client.post("/v1/nothing", json={})),
        (413, client.post("/v1/bundle", json={"tasks": tasks})),
        (422, client.post("/v1/classify", json={"model": "pooled", "input": "x"})),
    ]
    forward = control(runtime, "pooled")
    with forward.held(), concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(client.post, "/v1/embeddings", json={"model": "pooled", "input": "a"})
        assert forward.entered.wait(10)
        refused.append((429, client.post("/v1/embeddings", json={"model": "pooled", "input": "b"})))
        forward.release()
        assert first.result(30).status_code == 200
    loading = make_client(make_runtime(("pooled",), load=False))
    refused.append((503, loading.post("/v1/embeddings", json={"input": "x"})))
    for status, response in refused:
        assert response.status_code == status, response.text
        timing = timed_phases(response)
        assert timing["forward"] == 0, response.request.url


def test_every_other_response_carries_the_phases_too(client):
    responses = [
        client.get("/health"),
        client.get("/health/live"),
        client.get("/v1/models"),
        client.get("/metrics"),
        client.get("/v1/nothing"),
        client.post("/v1/embeddings", json={"model": "pooled", "input": 3}),
        client.post("/v1/embeddings", content=b"{", headers=JSON_TYPE),
    ]
    for response in responses:
        timing = timed_phases(response)
        assert timing["tokenize"] == timing["queue"] == timing["forward"] == 0


def test_an_unexpected_failure_is_500_with_timing(runtime, client, packages):
    control(runtime, "sequence").fail_plan = ValueError("tokenizer broke")
    response = client.post("/v1/classify", json={"model": "sequence", "input": "good"})
    assert error_of(response, 500, "internal_error") == "ValueError"
    timed_phases(response)
    control(runtime, "sequence").fail_plan = None
    recovered = client.post("/v1/classify", json={"model": "sequence", "input": "good"})
    assert recovered.is_success
    want = reference.probabilities(packages["sequence"], "good")
    assert close(recovered.json()["results"][0]["probabilities"], want)


def metric_samples(client) -> list:
    text = client.get("/metrics").text
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def value(samples, name: str, **labels: str) -> float:
    found = [s.value for s in samples if s.name == name and s.labels == labels]
    assert len(found) == 1, f"{name} {labels}: {found}"
    return found[0]


def test_metrics_count_requests_by_model_without_request_text(make_runtime):
    runtime = make_runtime(("pooled", "sequence"))
    client = make_client(runtime)
    secret = "carol phone london"
    for _ in range(2):
        client.post("/v1/embeddings", json={"model": "pooled", "input": [secret, "okay"]})
    client.post("/v1/classify", json={"model": "sequence", "input": secret})
    client.post("/v1/classify", json={"model": "pooled", "input": secret})
    client.post("/v1/classify", json={"model": "carol-london", "input": secret})
    tasks = [
        {"id": "1", "classify": {"model": "sequence", "input": "bob"}},
        {"id": "2", "classify": {"model": "pooled", "input": "bob"}},
        {"id": "3", "rerank": {"model": "tokyo", "query": "q", "documents": ["d"]}},
    ]
    client.post("/v1/bundle", json={"tasks": tasks})
    client.post("/v1/embeddings", json={})  # refused before the route: 400
    client.post("/v1/bundle", json={"tasks": 5})
    control(runtime, "sequence").fail_plan = ValueError("tokenizer broke")
    assert client.post("/v1/classify", json={"model": "sequence", "input": "x"}).status_code == 500
    response = client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    for text in (secret, "carol", "tokyo", "bob"):  # inputs and unknown model names
        assert text not in response.text
    samples = metric_samples(client)
    requests = "vllm_srun_requests_total"
    assert value(samples, requests, model="pooled", surface="embeddings", status="200") == 2
    assert value(samples, requests, model="sequence", surface="classify", status="200") == 2
    assert value(samples, requests, model="pooled", surface="classify", status="422") == 2
    assert value(samples, requests, model="-", surface="classify", status="404") == 1
    assert value(samples, requests, model="-", surface="rerank", status="404") == 1
    assert value(samples, requests, model="sequence", surface="classify", status="500") == 1
    assert value(samples, requests, model="-", surface="embeddings", status="400") == 1
    assert value(samples, requests, model="-", surface="bundle", status="400") == 1
    duration = "vllm_srun_request_duration_seconds_count"
    assert value(samples, duration, model="pooled", surface="embeddings") == 2
    assert value(samples, "vllm_srun_queue_duration_seconds_count", model="pooled") == 2
    # the first request's two rows (of two lengths, one forward padded to the edge of the
    # longer under exact); the second request is answered from the cache
    assert value(samples, "vllm_srun_forward_duration_seconds_count", model="pooled") == 1
    assert value(samples, "vllm_srun_batch_rows_sum", model="pooled") == 2
    assert value(samples, "vllm_srun_batch_rows_count", model="sequence") == 2
    assert value(samples, "vllm_srun_queue_rows", model="pooled") == 0
    cache = "vllm_srun_result_cache_total"
    assert value(samples, cache, model="pooled", outcome="miss") == 2
    assert value(samples, cache, model="pooled", outcome="hit") == 2
    assert value(samples, "vllm_srun_model_ready", model="pooled") == 1
    assert value(samples, "vllm_srun_model_ready", model="sequence") == 1
    process_wide = {"vllm_srun_requests_in_flight"}  # received, not yet tied to a model
    model_scoped = [
        s for s in samples if s.name.startswith("vllm_srun_") and s.name not in process_wide
    ]
    assert model_scoped and all("model" in s.labels for s in model_scoped)


# -- one request shape over HTTP and in process ---------------------------------------------
def test_window_settings_reach_embeddings_over_http(make_runtime):
    client = make_client(make_runtime(("pooled",)))
    options = {"overflow": "window", "window": {"tokens": 20, "overlap": 4}}
    response = client.post("/v1/embeddings", json={"input": LONG, "options": options})
    [item] = response.json()["data"]
    # 120 content tokens, 18 a window, step 14: [0, 18), [14, 32), ..., [112, 120)
    assert item["input"] == {
        "tokens": 122,
        "processed_tokens": 120 + 2 * 9,
        "truncated": False,
        "windows": 9,
    }
    assert math.isclose(math.fsum(v * v for v in item["embedding"]), 1.0, rel_tol=1e-5)


def test_a_classify_request_may_mix_single_texts_and_pairs(make_runtime):
    client = make_client(make_runtime(("sequence",)))
    pair = {"text": "good movie", "text_pair": "okay"}
    mixed = client.post("/v1/classify", json={"input": ["good", pair]}).json()["results"]
    single = client.post("/v1/classify", json={"input": "good"}).json()["results"]
    paired = client.post("/v1/classify", json={"input": [pair]}).json()["results"]
    assert close(mixed[0]["probabilities"], single[0]["probabilities"])
    assert close(mixed[1]["probabilities"], paired[0]["probabilities"])


def test_a_bundle_task_naming_a_model_that_is_not_a_string_fails_alone(make_runtime):
    client = make_client(make_runtime(("pooled",)))
    tasks = [
        {"id": "a", "decisions": {"model": {}, "state": "x", "questions": {}}},
        {"id": "b", "embeddings": {"input": "good"}},
    ]
    response = client.post("/v1/bundle", json={"tasks": tasks})
    assert response.status_code == 200, response.text
    first, second = response.json()["results"]
    assert (first["status"], first["error"]["code"]) == (400, "invalid_request")
    assert "model must be a string, not an object" in first["error"]["message"]
    assert second["status"] == 200


# -- OpenAI-faithful embeddings --------------------------------------------------------------
TOO_LONG = (
    "input[1]: input has 122 tokens; the limit is 48. Shorten it, or send "
    "options.overflow truncate (keep the beginning) or window; from the OpenAI SDK, send "
    'options as extra_body={"options": {"overflow": "truncate"}}'
)
"""A plain request's too-long input: the fix, and how an OpenAI SDK client sends it."""


def test_a_plain_openai_request_with_an_unusable_input_is_400_naming_it(client):
    response = client.post("/v1/embeddings", json={"model": "pooled", "input": ["good", LONG]})
    assert error_of(response, 400, "invalid_request") == TOO_LONG
    assert response.json()["error"]["param"] == "input"
    contract = {"model": "pooled", "input": ["good", LONG], "options": {}}
    data = client.post("/v1/embeddings", json=contract).json()["data"]
    assert "embedding" in data[0] and data[1]["error"] == "max_length_exceeded"


def test_the_openai_sdk_reads_every_error_field_and_applies_the_fix(make_runtime, live_server):
    """The real ``openai`` client over a socket: ``code``, ``type`` and ``param`` of each
    error (none is ``None`` where the runtime knows it), and the ``extra_body`` the
    too-long message names works."""
    server = live_server(make_runtime(("pooled",)))
    sdk = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=30)
    with pytest.raises(openai.BadRequestError) as too_long:
        sdk.embeddings.create(model="pooled", input=["good", LONG], encoding_format="float")
    err = too_long.value
    assert (err.status_code, err.code, err.type, err.param) == (
        400,
        "invalid_request",
        "invalid_request_error",
        "input",
    )
    assert err.body == {
        "code": "invalid_request",
        "message": TOO_LONG,
        "type": "invalid_request_error",
        "param": "input",
    }
    fixed = sdk.embeddings.create(
        model="pooled",
        input=["good", LONG],
        encoding_format="float",
        extra_body={"options": {"overflow": "truncate"}},
    )
    assert [len(item.embedding) for item in fixed.data] == [32, 32]
    with pytest.raises(openai.NotFoundError) as unknown:
        sdk.embeddings.create(model="nope", input="good", encoding_format="float")
    assert (unknown.value.code, unknown.value.type, unknown.value.param) == (
        "model_not_found",
        "invalid_request_error",
        "model",
    )
    with pytest.raises(openai.BadRequestError) as invalid:
        sdk.embeddings.create(model="pooled", input="good", dimensions=0, encoding_format="float")
    assert (invalid.value.code, invalid.value.type, invalid.value.param) == (
        "invalid_request",
        "invalid_request_error",
        "dimensions",
    )
    with pytest.raises(openai.UnprocessableEntityError) as surface:
        sdk.post("/classify", body={"model": "pooled", "input": "good"}, cast_to=object)
    assert surface.value.body == {
        "code": "unsupported_surface",
        "message": "this model serves embeddings, rerank, not classify",
        "type": "invalid_request_error",
        "param": None,
    }


def test_tei_truncate_spells_overflow(client, packages):
    body = {"model": "pooled", "input": LONG, "truncate": True}
    [item] = client.post("/v1/embeddings", json=body).json()["data"]
    assert item["input"]["truncated"] is True
    assert close(item["embedding"], reference.embedding(packages["pooled"], LONG, max_tokens=48))
    refused = client.post("/v1/embeddings", json={**body, "truncate": False})
    assert error_of(refused, 400, "invalid_request").startswith("input[0]: input has 122 tokens")
    both = {**body, "options": {"overflow": "reject"}}
    assert error_of(client.post("/v1/embeddings", json=both), 400, "invalid_request") == (
        "truncate true and options.overflow reject disagree; send one of them"
    )


def test_token_ids_are_embedded_as_the_row_they_spell(client, packages):
    text = client.post("/v1/embeddings", json={"model": "pooled", "input": "good movie"}).json()
    ids = reference.ids(packages["pooled"], "good movie")  # [CLS] good movie [SEP]
    for body in ({"input": ids}, {"input": [ids, ids]}):
        data = client.post("/v1/embeddings", json={"model": "pooled", **body}).json()["data"]
        for item in data:
            assert item["embedding"] == text["data"][0]["embedding"]
            assert item["input"]["tokens"] == len(ids)
    out_of_range = client.post(
        "/v1/embeddings", json={"model": "pooled", "input": [[2], [1, 99999]]}
    )
    assert error_of(out_of_range, 400, "invalid_request").startswith(
        "input[1][1] is token id 99999; this model's vocabulary has ids 0 to "
    )
    single = client.post("/v1/embeddings", json={"model": "pooled", "input": [1, 99999]})
    assert error_of(single, 400, "invalid_request").startswith("input[1] is token id 99999")
    negative = client.post("/v1/embeddings", json={"model": "pooled", "input": [[1, -1]]})
    assert error_of(negative, 400, "invalid_request") == (
        "input[0][1] must be a token id (an integer >= 0)"
    )
    empty = client.post("/v1/embeddings", json={"model": "pooled", "input": [[1], []]})
    assert error_of(empty, 400, "invalid_request") == "input[1] is an empty list of token ids"


# -- OpenAI's models list and retrieve; bounded error bodies -------------------------------
def test_the_models_list_and_each_model_answer_as_openai_does(client):
    listed = client.get("/v1/models").json()
    assert listed["object"] == "list"
    for card in listed["data"]:
        assert card["object"] == "model" and card["owned_by"] == "vllm-srun"  # local packages
        assert isinstance(card["created"], int) and card["created"] > 1_700_000_000
        assert client.get(f"/v1/models/{card['id']}").json() == card
    missing = client.get("/v1/models/owner/nope")
    assert error_of(missing, 404, "model_not_found") == (
        "model 'owner/nope' is not served here (served: sequence, scores, token, pooled, relevance)"
    )


def test_error_bodies_never_grow_with_the_request(client):
    name = "m" * 1_000_000
    response = client.post("/v1/embeddings", json={"model": name, "input": "good"})
    message = error_of(response, 404, "model_not_found")
    assert message.startswith("model 'mmm") and "(999800 more characters)" in message
    assert len(response.content) < 1_000
    bad = client.post(
        "/v1/classify",
        json={"model": "sequence", "input": "x", "options": {f"k{i}": i for i in range(2048)}},
    )
    message = error_of(bad, 400, "invalid_request")
    assert message.endswith("; and 2043 more") and len(bad.content) < 1_000


def test_a_cross_encoder_scores_pairs_on_classify_as_rerank_does(make_runtime):
    client = make_client(make_runtime(("relevance",)))
    documents = ["good food", "a movie"]
    reranked = client.post("/v1/rerank", json={"query": "food", "documents": documents}).json()
    pairs = [{"text": "food", "text_pair": d} for d in documents]
    classified = client.post("/v1/classify", json={"input": pairs}).json()
    assert classified["kind"] == "relevance"
    by_index = {r["index"]: r["relevance_score"] for r in reranked["results"]}
    assert [r["scores"] for r in classified["results"]] == [[by_index[0]], [by_index[1]]]


def test_an_empty_list_of_inputs_is_400_on_every_surface(client):
    for path, body in (
        ("/v1/embeddings", {"model": "pooled", "input": []}),
        ("/v1/classify", {"model": "sequence", "input": []}),
        ("/v1/rerank", {"model": "relevance", "query": "q", "documents": []}),
    ):
        message = error_of(client.post(path, json=body), 400, "invalid_request")
        assert message.endswith("a non-empty list"), (path, message)


def test_a_lone_surrogate_fails_what_it_belongs_to(make_runtime):
    client = make_client(make_runtime(("pooled", "relevance")))
    query = b'{"model": "%s", "query": "q\\ud800", "documents": ["a", "b"]}'
    for model in (b"relevance", b"pooled"):  # the query is every pair's: the request fails
        response = client.post(
            "/v1/rerank", content=query % model, headers={"content-type": "application/json"}
        )
        assert error_of(response, 400, "invalid_request") == (
            "query: the text has a lone surrogate U+D800 at code point 1; send valid Unicode "
            "(UTF-8)"
        )
    document = b'{"model": "relevance", "query": "q", "documents": ["a\\ud800", "b"]}'
    response = client.post(
        "/v1/rerank", content=document, headers={"content-type": "application/json"}
    )
    failed = [r for r in response.json()["results"] if "error" in r]
    assert [(r["index"], r["error"]) for r in failed] == [(0, "invalid_input")]  # one document


def test_odd_bodies_get_messages_that_say_what_to_send(client):
    form = client.post(
        "/v1/embeddings",
        content=b"input=good",
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert error_of(form, 400, "invalid_request") == (
        "the body must be a JSON object; send it with content-type: application/json"
    )
    empty = client.post("/v1/embeddings", content=b"", headers={"content-type": "application/json"})
    assert error_of(empty, 400, "invalid_request") == "the body is empty; send a JSON object"
    nan = client.post(
        "/v1/classify",
        content=b'{"model": "sequence", "input": "x", "options": {"threshold": NaN}}',
        headers={"content-type": "application/json"},
    )
    assert (
        error_of(nan, 400, "invalid_request")
        == "options.threshold: Input should be a finite number"
    )
    assert error_of(client.post("/v1/bundle", json={"tasks": []}), 400, "invalid_request") == (
        "tasks: List should have at least 1 item after validation, not 0"
    )
