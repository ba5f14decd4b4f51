"""``/v1/decisions`` and ``/v1/systemone`` over HTTP, and decisions tasks in a bundle.

The tiny pooled package answers through the ``similarity_readout`` extension;
every response is checked against the OpenAPI snapshot by the client.
"""

from __future__ import annotations

import json
import math

import pytest

from .conftest import make_client

QUESTION = {
    "type": "choice",
    "instructions": "Which team?",
    "criteria": {"billing": "refunds", "shipping": "parcels"},
}


@pytest.fixture
def client(make_runtime):
    return make_client(make_runtime(("pooled", "sequence")))


def post_raw(client, path, text):
    return client.post(path, content=text.encode(), headers={"content-type": "application/json"})


@pytest.mark.parametrize("path", ["/v1/decisions", "/v1/systemone"])
def test_decisions_answer_every_question_type_in_order(client, path):
    response = client.post(
        path,
        json={
            "model": "pooled",
            "state": {"ticket": "charged twice", "channel": "email"},
            "questions": {
                "team": QUESTION,
                "urgent": {"type": "noul", "instructions": "Is it urgent?"},
                "mood": {"type": "score", "instructions": "How calm?", "levels": ["Upset", "Calm"]},
            },
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "pooled"
    assert list(body["answers"]) == ["team", "urgent", "mood"]
    team = body["answers"]["team"]
    assert "choice" in team, body
    assert team["choice"] in ("billing", "shipping")
    assert math.isclose(sum(team["probabilities"].values()), 1.0, abs_tol=1e-6)
    assert 0.0 <= body["answers"]["urgent"]["noul"] <= 1.0
    assert list(body["answers"]["mood"]["legend"]) == ["1", "2"]
    assert body["usage"]["input_tokens"] > 0
    assert "server-timing" in response.headers


def test_the_alias_answers_exactly_like_the_surface(client):
    body = {"model": "pooled", "state": "where is my parcel", "questions": {"team": QUESTION}}
    first = client.post("/v1/decisions", json=body).json()
    second = client.post("/v1/systemone", json=body).json()
    assert first == second


def test_a_duplicated_key_inside_a_question_fails_only_that_question(client):
    text = (
        '{"model": "pooled", "state": "hello", "questions": {'
        '"bad": {"type": "choice", "instructions": "Pick", '
        '"criteria": {"a": "one", "a": "again", "b": "two"}},'
        f'"good": {json.dumps(QUESTION)}}}}}'
    )
    response = post_raw(client, "/v1/decisions", text)
    assert response.status_code == 200, response.text
    answers = response.json()["answers"]
    assert answers["bad"]["error"] == "invalid_question"
    assert "'a'" in answers["bad"]["message"] and "more than once" in answers["bad"]["message"]
    assert answers["good"]["choice"] in ("billing", "shipping")


def test_a_duplicated_top_level_key_is_a_bad_request(client):
    question = json.dumps(QUESTION)
    text = f'{{"model": "pooled", "state": "a", "state": "b", "questions": {{"q": {question}}}}}'
    response = post_raw(client, "/v1/decisions", text)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"
    assert "state" in response.json()["error"]["message"]


def test_only_bad_questions_is_a_bad_request_listing_each_reason(client):
    response = client.post(
        "/v1/decisions",
        json={
            "model": "pooled",
            "state": "x",
            "questions": {
                "one": {"type": "choice", "instructions": " ", "criteria": {"a": 1, "b": 2}},
                "two": {"type": "pick", "instructions": "Which?"},
            },
        },
    )
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "one" in message and "two" in message and "no question is valid" in message


def test_malformed_json_is_a_bad_request(client):
    response = post_raw(client, "/v1/decisions", '{"state": "x", "questions": ')
    assert response.status_code == 400
    assert "not valid JSON" in response.json()["error"]["message"]


def test_a_model_without_decisions_answers_422(client):
    response = client.post(
        "/v1/decisions", json={"model": "sequence", "state": "x", "questions": {"q": QUESTION}}
    )
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "unsupported_surface"


def test_states_are_answered_under_the_same_names(client):
    response = client.post(
        "/v1/decisions",
        json={
            "model": "pooled",
            "state": "first",
            "questions": {"team": QUESTION},
            "states": [{"state": "second", "questions": {"team": QUESTION}}],
            "options": {"return_meta": True},
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert [s["index"] for s in body["states"]] == [0]
    assert "team" in body["states"][0]["answers"]
    assert body["meta"]["numerics"] == "approximate"


def test_a_bundle_carries_decisions_tasks_beside_other_surfaces(client):
    text = (
        '{"tasks": ['
        '{"id": "vec", "embeddings": {"model": "pooled", "input": "hello"}},'
        '{"id": "ask", "decisions": {"model": "pooled", "state": "hi", "questions": {'
        '"bad": {"type": "noul", "instructions": "Yes?", "instructions": "No?"},'
        f'"good": {json.dumps(QUESTION)}}}}}}},'
        '{"id": "none", "decisions": {"model": "pooled", "state": "hi", "questions": {}}},'
        '{"id": "cls", "decisions": {"model": "sequence", "state": "hi", "questions": {'
        f'"q": {json.dumps(QUESTION)}}}}}}}'
        "]}"
    )
    response = post_raw(client, "/v1/bundle", text)
    assert response.status_code == 200, response.text
    results = {r["id"]: r for r in response.json()["results"]}
    assert results["vec"]["status"] == 200
    ask = results["ask"]
    assert ask["status"] == 200
    assert ask["decisions"]["answers"]["bad"]["error"] == "invalid_question"
    assert ask["decisions"]["answers"]["good"]["type"] == "choice"
    assert results["none"]["status"] == 400
    assert results["cls"]["status"] == 422


def test_the_pooled_card_lists_the_extension(client):
    [card] = [c for c in client.get("/v1/models").json()["data"] if c["id"] == "pooled"]
    assert "decisions" in card["surfaces"]
    assert card["extensions"][0]["name"] == "similarity_readout"
    assert card["extensions"][0]["numerics"] == "approximate"


# -- hostile bodies (each once answered 500) --------------------------------------------------
def test_a_lone_surrogate_in_a_name_is_answered_escaped_never_500(client):
    unknown = post_raw(
        client,
        "/v1/decisions",
        '{"model": "pooled", "options": {"\\ud800": 1}, "state": "x", '
        f'"questions": {{"q": {json.dumps(QUESTION)}}}}}',
    )
    assert unknown.status_code == 400
    assert "\\ud800" in unknown.text  # escaped in the JSON text
    named = post_raw(
        client,
        "/v1/decisions",
        '{"model": "pooled", "state": "x", "questions": {'
        '"\\ud800": {"type": "noul", "instructions": " "},'
        f'"good": {json.dumps(QUESTION)}}}}}',
    )
    assert named.status_code == 200, named.text
    answers = named.json()["answers"]
    assert answers["\ud800"]["error"] == "invalid_question"
    assert answers["good"]["type"] == "choice"


def test_deeply_nested_json_is_a_bad_request(client):
    state = "[" * 3000 + "]" * 3000
    text = f'{{"model": "pooled", "state": {state}, "questions": {{"q": {json.dumps(QUESTION)}}}}}'
    response = post_raw(client, "/v1/decisions", text)
    assert response.status_code == 400
    assert "too deeply" in response.json()["error"]["message"]


def test_an_integer_deadline_too_large_for_a_float_is_a_bad_request(client):
    body = {"model": "pooled", "state": "x", "questions": {"q": QUESTION}}
    text = json.dumps(body)[:-1] + ', "options": {"deadline_ms": ' + "9" * 400 + "}}"
    response = post_raw(client, "/v1/decisions", text)
    assert response.status_code == 400
    assert "options.deadline_ms must be a number above 0" in response.json()["error"]["message"]


def test_bad_decisions_tasks_fail_alone_in_a_bundle(client):
    question = json.dumps(QUESTION)
    task = f'{{"model": "pooled", "state": "x", "questions": {{"q": {question}}}}}'
    nan = f'{{"model": "pooled", "state": {{"v": NaN}}, "questions": {{"q": {question}}}}}'
    text = (
        '{"tasks": ['
        f'{{"id": "twice", "decisions": {task}, "decisions": {task}}},'
        f'{{"id": "nan", "decisions": {nan}}},'
        f'{{"id": "fine", "decisions": {task}}}'
        "]}"
    )
    response = post_raw(client, "/v1/bundle", text)
    assert response.status_code == 200, response.text
    results = {r["id"]: r for r in response.json()["results"]}
    assert results["twice"]["status"] == 400
    assert "'decisions' more than once" in results["twice"]["error"]["message"]
    assert results["nan"]["status"] == 400
    assert results["nan"]["error"]["message"] == (
        "tasks[1].decisions.state.v: NaN and Infinity are not JSON numbers"
    )
    assert results["fine"]["status"] == 200


def test_a_boolean_deadline_is_refused_everywhere(client):
    response = client.post(
        "/v1/bundle",
        json={
            "tasks": [{"id": "a", "embeddings": {"model": "pooled", "input": "x"}}],
            "options": {"deadline_ms": True},
        },
    )
    assert response.status_code == 400
    response = client.post(
        "/v1/embeddings",
        content=b'{"model": "pooled", "input": "x", "options": {"deadline_ms": Infinity}}',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400


def test_a_slow_plan_on_one_model_never_holds_up_another(make_runtime):
    import concurrent.futures
    import threading

    runtime = make_runtime(("pooled", "sequence"))
    client = make_client(runtime)
    pooled = runtime.models["pooled"].served.loaded
    release, entered = threading.Event(), threading.Event()
    real_plan = pooled.plan

    def slow_plan(surface, request):
        entered.set()
        assert release.wait(30)
        return real_plan(surface, request)

    pooled.plan = slow_plan
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            held = pool.submit(
                client.post, "/v1/embeddings", json={"model": "pooled", "input": "x"}
            )
            assert entered.wait(10)
            other = client.post("/v1/classify", json={"model": "sequence", "input": "good"})
            assert other.status_code == 200  # planned on its own model's thread
            assert not held.done()
            release.set()
            assert held.result(30).status_code == 200
    finally:
        release.set()


def test_a_deadline_counts_from_arrival_so_slow_planning_spends_it(make_runtime):
    import time

    runtime = make_runtime(("pooled",))
    client = make_client(runtime)
    pooled = runtime.models["pooled"].served.loaded
    real_plan = pooled.plan

    def slow_plan(surface, request):
        time.sleep(0.2)
        return real_plan(surface, request)

    pooled.plan = slow_plan
    late = client.post(
        "/v1/embeddings", json={"model": "pooled", "input": "x", "options": {"deadline_ms": 50}}
    )
    assert late.status_code == 200
    assert late.json()["data"][0]["error"] == "deadline_exceeded"
    in_time = client.post(
        "/v1/embeddings", json={"model": "pooled", "input": "y", "options": {"deadline_ms": 5000}}
    )
    assert "embedding" in in_time.json()["data"][0]
