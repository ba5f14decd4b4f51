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
NOUL = {"type": "noul", "instructions": "Is it urgent?"}


@pytest.fixture
def client(make_runtime):
    return make_client(make_runtime(("pooled", "sequence")))


def post_raw(client, path, text):
    return client.post(path, content=text.encode(), headers={"content-type": "application/json"})


def shipped_calibration():
    """The similarity readout's shipped calibration file, read as JSON here."""
    import importlib.resources

    folder = importlib.resources.files("vllm_srun.extensions.similarity_readout")
    return json.loads((folder / "calibration" / "temperature.json").read_text(encoding="utf-8"))


def cosines_over_http(client, state, options):
    """Cosine of ``state`` to each option text, from the model's own ``/v1/embeddings``."""
    response = client.post("/v1/embeddings", json={"model": "pooled", "input": [state, *options]})
    assert response.status_code == 200, response.text
    vectors = [item["embedding"] for item in response.json()["data"]]

    def norm(v):
        return math.sqrt(sum(x * x for x in v))

    anchor = vectors[0]
    return [
        sum(a * b for a, b in zip(anchor, v, strict=True)) / (norm(anchor) * norm(v))
        for v in vectors[1:]
    ]


def written_softmax(z, temperature):
    top = max(z)
    weights = [math.exp((v - top) / temperature) for v in z]
    return [w / sum(weights) for w in weights]


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
    # The values: the documented readout over the model's own embeddings of the state (as
    # compact JSON) and of each option text, with the shipped temperatures and baseline.
    calibration = shipped_calibration()
    temperature = calibration["temperature"]
    state = '{"ticket": "charged twice", "channel": "email"}'
    texts = ["Which team? billing: refunds", "Which team? shipping: parcels", "Is it urgent?"]
    texts += ["How calm? 0: Upset", "How calm? 1: Calm"]
    z = cosines_over_http(client, state, texts)
    team = body["answers"]["team"]
    p = written_softmax(z[0:2], temperature["choice"])
    assert team["choice"] == ("billing" if p[0] >= p[1] else "shipping")
    assert list(team["probabilities"]) == ["billing", "shipping"]
    assert list(team["probabilities"].values()) == pytest.approx(p, abs=1e-5)
    assert math.isclose(sum(team["probabilities"].values()), 1.0, abs_tol=1e-9)
    urgent = body["answers"]["urgent"]
    p_true = written_softmax([calibration["noul_baseline"], z[2]], temperature["noul"])[1]
    assert urgent == {"type": "noul", "noul": pytest.approx(p_true, abs=1e-5)}
    mood = body["answers"]["mood"]
    p = written_softmax(z[3:5], temperature["score"])
    assert list(mood["probabilities"].values()) == pytest.approx(p, abs=1e-5)
    assert mood["score"] == pytest.approx(0 * p[0] + 1 * p[1], abs=1e-5)
    assert mood["legend"] == {"0": "Upset", "1": "Calm"}
    assert body["usage"]["input_tokens"] > 0 and body["usage"]["output_tokens"] == 0
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
    assert list(answers) == ["bad", "good"]
    assert answers["bad"] == {
        "type": "choice",
        "error": "invalid_question",
        "message": "questions.bad.criteria has the key 'a' more than once",
    }
    assert answers["good"]["choice"] in ("billing", "shipping")
    alone = client.post(
        "/v1/decisions", json={"model": "pooled", "state": "hello", "questions": {"good": QUESTION}}
    )
    assert answers["good"] == alone.json()["answers"]["good"]


def test_a_duplicated_top_level_key_is_a_bad_request(client):
    question = json.dumps(QUESTION)
    text = f'{{"model": "pooled", "state": "a", "state": "b", "questions": {{"q": {question}}}}}'
    response = post_raw(client, "/v1/decisions", text)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"
    assert response.json()["error"]["message"] == "the request has the key 'state' more than once"


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
    assert response.json()["error"]["code"] == "invalid_request"
    assert response.json()["error"]["message"] == (
        "no question is valid: questions.one.instructions is blank; "
        "questions.two.type must be one of choice, noul, score, not 'pick'"
    )


def test_malformed_json_is_a_bad_request(client):
    response = post_raw(client, "/v1/decisions", '{"state": "x", "questions": ')
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"
    assert response.json()["error"]["message"].startswith("the body is not valid JSON: ")


def test_a_model_without_decisions_answers_422(client):
    response = client.post(
        "/v1/decisions", json={"model": "sequence", "state": "x", "questions": {"q": QUESTION}}
    )
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "unsupported_surface"


@pytest.mark.parametrize("named", [False, True])
def test_states_are_answered_in_the_form_asked_each_as_its_own_request(client, named):
    second = {"state": "second", "questions": {"team": QUESTION}}
    third = {"state": {"ticket": "refund please"}, "questions": {"urgent": NOUL}}
    states = {"second": second, "third": third} if named else [second, third]
    response = client.post(
        "/v1/decisions",
        json={
            "model": "pooled",
            "state": "first",
            "questions": {"team": QUESTION},
            "states": states,
            "options": {"return_meta": True},
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    if named:
        assert list(body["states"]) == ["second", "third"]
        answered = body["states"]
        assert all(list(a) == ["model", "answers", "usage"] for a in answered.values())
    else:
        assert [s["index"] for s in body["states"]] == [0, 1]
        assert all(list(a) == ["index", "model", "answers", "usage"] for a in body["states"])
        answered = {"second": body["states"][0], "third": body["states"][1]}
    # Each state answers as if asked alone: its answers, its model and its own usage.
    first = {"model": "pooled", "state": "first", "questions": {"team": QUESTION}}
    alone = client.post("/v1/decisions", json=first).json()
    assert body["answers"] == alone["answers"] and body["usage"] == alone["usage"]
    for name, entry in (("second", second), ("third", third)):
        alone = client.post("/v1/decisions", json={"model": "pooled", **entry}).json()
        assert answered[name]["model"] == "pooled"
        assert answered[name]["answers"] == alone["answers"]
        assert answered[name]["usage"] == alone["usage"]
        assert answered[name]["usage"]["input_tokens"] > 0
    # the readout's own keys beside the model's identity (tests/serve/test_wire23.py)
    meta = body["meta"]
    assert {k: meta[k] for k in ("readout", "numerics", "method", "temperature")} == {
        "readout": "similarity_readout",
        "numerics": "approximate",
        "method": "softmax over cosine(state, instructions + option) / T, T per question type",
        "temperature": shipped_calibration()["temperature"],
    }
    assert (meta["model_id"], meta["profile"]) == ("pooled", "exact")


def test_a_named_state_is_named_in_each_problem(client):
    bad = {"state": "x", "questions": {"q1": {"type": "choice", "instructions": "Pick"}}}
    response = client.post(
        "/v1/decisions",
        json={
            "model": "pooled",
            "state": "first",
            "questions": {"team": QUESTION},
            "states": {"alpha": bad},
        },
    )
    assert response.status_code == 200, response.text
    assert response.json()["states"]["alpha"]["answers"]["q1"] == {
        "type": "choice",
        "error": "invalid_question",
        "message": "states.alpha.questions.q1 needs criteria (an object of options) or choices",
    }
    refused = client.post(
        "/v1/decisions",
        json={
            "model": "pooled",
            "state": "first",
            "questions": {"team": QUESTION},
            "states": {"": bad},
        },
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == (
        "states has a blank or malformed state name ''; name each entry with visible text"
    )


@pytest.mark.parametrize("where", ["request", "entry"])
def test_images_are_accepted_empty_and_refused_otherwise(client, where):
    body = {"model": "pooled", "state": "hi", "questions": {"team": QUESTION}}
    body["states"] = {"a": {"state": "there", "questions": {"team": QUESTION}}}
    holder = body if where == "request" else body["states"]["a"]
    holder["images"] = []
    assert client.post("/v1/decisions", json=body).status_code == 200
    holder["images"] = [{"url": "data:image/png;base64,AAAA"}]
    refused = client.post("/v1/decisions", json=body)
    assert refused.status_code == 400
    prefix = "" if where == "request" else "states.a."
    assert refused.json()["error"] == {
        "code": "invalid_request",
        "message": f"{prefix}images holds 1 image, but this model has no image modality; "
        "describe the images in the state as text, and send images as [] or leave it out",
        "type": "invalid_request_error",
        "param": None,
    }


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
    assert list(ask["decisions"]["answers"]) == ["bad", "good"]
    assert ask["decisions"]["answers"]["bad"] == {
        "type": "noul",
        "error": "invalid_question",
        "message": "questions.bad has the key 'instructions' more than once",
    }
    alone = client.post(
        "/v1/decisions", json={"model": "pooled", "state": "hi", "questions": {"good": QUESTION}}
    )
    assert ask["decisions"]["answers"]["good"] == alone.json()["answers"]["good"]
    assert results["none"]["status"] == 400
    assert results["none"]["error"]["code"] == "invalid_request"
    assert results["none"]["error"]["message"] == (
        "questions must be an object of named questions, not empty"
    )
    assert results["cls"]["status"] == 422
    assert results["cls"]["error"]["code"] == "unsupported_surface"


def test_the_pooled_card_lists_the_extension(client):
    [card] = [c for c in client.get("/v1/models").json()["data"] if c["id"] == "pooled"]
    assert "decisions" in card["surfaces"]
    assert card["question_types"] == ["choice", "noul", "score"]
    [extension] = card["extensions"]
    calibration = shipped_calibration()
    assert extension["name"] == "similarity_readout"
    assert extension["surfaces"] == ["decisions"]
    assert extension["numerics"] == "approximate"
    assert extension["temperature"] == calibration["temperature"]
    assert extension["noul_baseline"] == calibration["noul_baseline"]


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
    assert unknown.json()["error"]["message"] == (
        "options.\ud800 is not an option of decisions (deadline_ms, profile, return_meta)"
    )
    named = post_raw(
        client,
        "/v1/decisions",
        '{"model": "pooled", "state": "x", "questions": {'
        '"\\ud800": {"type": "noul", "instructions": " "},'
        f'"good": {json.dumps(QUESTION)}}}}}',
    )
    assert named.status_code == 200, named.text
    answers = named.json()["answers"]
    assert list(answers) == ["\ud800", "good"]
    assert answers["\ud800"] == {
        "type": "noul",
        "error": "invalid_question",
        "message": "questions has a blank or malformed question name",
    }
    assert answers["good"]["type"] == "choice"


def test_deeply_nested_json_is_a_bad_request(client):
    state = "[" * 3000 + "]" * 3000
    text = f'{{"model": "pooled", "state": {state}, "questions": {{"q": {json.dumps(QUESTION)}}}}}'
    response = post_raw(client, "/v1/decisions", text)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        "the body nests arrays or objects too deeply to read; flatten the state"
    )


def test_an_integer_deadline_too_large_for_a_float_is_a_bad_request(client):
    body = {"model": "pooled", "state": "x", "questions": {"q": QUESTION}}
    text = json.dumps(body)[:-1] + ', "options": {"deadline_ms": ' + "9" * 400 + "}}"
    response = post_raw(client, "/v1/decisions", text)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        f"options.deadline_ms must be a number above 0, not {'9' * 400}"
    )


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
    assert list(results["fine"]["decisions"]["answers"]) == ["q"]
    assert results["fine"]["decisions"]["answers"]["q"]["type"] == "choice"


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


# -- /v1/systemone/batch and --systemone-schema ----------------------------------------------
def test_a_batch_answers_the_same_questions_about_each_state_in_order(client, make_runtime):
    states = ["I was charged twice", "my parcel is late", {"ticket": "refund please"}]
    batch = client.post(
        "/v1/systemone/batch",
        json={"model": "pooled", "states": states, "questions": {"team": QUESTION}},
    )
    assert batch.status_code == 200, batch.text
    body = batch.json()
    assert [r["index"] for r in body["results"]] == [0, 1, 2]
    for state, result in zip(states, body["results"], strict=True):
        alone = client.post(
            "/v1/decisions",
            json={"model": "pooled", "state": state, "questions": {"team": QUESTION}},
        ).json()
        assert result["answers"] == alone["answers"]
    single = client.post(
        "/v1/decisions",
        json={"model": "pooled", "state": states[0], "questions": {"team": QUESTION}},
    ).json()
    assert body["usage"]["input_tokens"] > single["usage"]["input_tokens"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"states": [], "questions": {"q": QUESTION}},
            "states must be an array of 1 to 64 states, not 0 states",
        ),
        (
            {"states": ["s"] * 65, "questions": {"q": QUESTION}},
            "states must be an array of 1 to 64 states, not 65 states",
        ),
        (
            {"states": "s", "questions": {"q": QUESTION}},
            "states must be an array of 1 to 64 states, not something else",
        ),
        ({"states": ["s"], "question": {"q": QUESTION}}, "question: not a field of this request"),
    ],
)
def test_a_bad_batch_is_400_naming_the_problem(client, body, message):
    response = client.post("/v1/systemone/batch", json={"model": "pooled", **body})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"].startswith(message)


def test_each_batch_state_counts_against_the_queue(make_runtime):
    client = make_client(make_runtime(("pooled",), max_queue=4))
    body = {"states": ["a", "b", "c", "d", "e"], "questions": {"q": QUESTION}}
    response = client.post("/v1/systemone/batch", json=body)
    assert response.status_code == 429, response.text


def test_the_older_schema_accepts_the_older_forms(make_runtime):
    old = make_client(make_runtime(("pooled",), systemone_schema="vllm-sr/4.0"))
    new = make_client(make_runtime(("pooled",)))
    keys = {"type": "choice", "instructions": "Which team?", "criteria": ["billing", "shipping"]}
    named = {
        "state": "I was charged twice",
        "questions": {"team": keys},
        "states": {"eu": {"state": "my parcel is late", "questions": {"team": keys}}},
    }
    answered = old.post("/v1/systemone", json=named)
    assert answered.status_code == 200, answered.text
    body = answered.json()
    assert set(body["answers"]["team"]["probabilities"]) == {"billing", "shipping"}
    assert list(body["states"]) == ["eu"] and "answers" in body["states"]["eu"]
    as_new = {
        "state": "I was charged twice",
        "questions": {"team": {**keys, "criteria": {"billing": None, "shipping": None}}},
    }
    assert body["answers"] == new.post("/v1/systemone", json=as_new).json()["answers"]
    refused = new.post("/v1/systemone", json=named)
    assert refused.status_code == 400
    batch = old.post("/v1/systemone/batch", json={"states": ["a"], "questions": {"team": keys}})
    assert batch.status_code == 200, batch.text
    # /v1/decisions keeps the current schema whatever --systemone-schema says
    assert old.post("/v1/decisions", json=named).status_code == 400


def test_a_bundle_carries_a_systemone_batch_task(client):
    batch = {"model": "pooled", "states": ["a refund", "a parcel"], "questions": {"q": QUESTION}}
    alone = client.post("/v1/systemone/batch", json=batch).json()
    tasks = [
        {"id": "b", "systemone_batch": batch},
        {"id": "bad", "systemone_batch": {**batch, "states": []}},
    ]
    response = client.post("/v1/bundle", json={"tasks": tasks})
    assert response.status_code == 200, response.text
    good, bad = response.json()["results"]
    assert good["status"] == 200 and good["systemone_batch"] == alone
    assert bad["status"] == 400 and bad["error"]["message"].startswith("states must be an array")


@pytest.mark.parametrize(
    ("states", "where"),
    [
        (["ok", "fine", "\ud800"], "states[2] holds a lone surrogate"),
        (["ok", None], "states[1] must be"),
        (["\ud800", "ok"], "states[0] holds a lone surrogate"),
    ],
)
def test_a_bad_batch_state_is_named_by_its_own_index(client, states, where):
    body = {"model": "pooled", "states": states, "questions": {"q": QUESTION}}
    response = post_raw(client, "/v1/systemone/batch", json.dumps(body))  # \ud800 escaped
    assert response.status_code == 400, response.text
    assert where in response.json()["error"]["message"]


def test_a_refusal_lists_five_invalid_questions_and_counts_the_rest(client):
    questions = {f"q{i}": {"type": f"bogus{i}", "instructions": "x"} for i in range(20)}
    response = client.post(
        "/v1/decisions", json={"model": "pooled", "state": "s", "questions": questions}
    )
    message = response.json()["error"]["message"]
    assert response.status_code == 400 and message.endswith("; and 15 more")
    assert message.count("bogus") == 5


def test_minilm_answers_named_states_over_http_and_in_a_bundle(make_runtime):
    from vllm_srun.compose.loader import load_model
    from vllm_srun.config import ModelConfig

    minilm = "sentence-transformers/all-MiniLM-L6-v2"
    runtime = make_runtime(
        models=[ModelConfig(model=minilm, name="minilm")], loader=load_model, offline=True
    )
    client = make_client(runtime)
    teams = {
        "type": "choice",
        "instructions": "Which team should handle this?",
        "criteria": {
            "billing": "Payments, charges, refunds and invoices",
            "shipping": "Delivery, parcels and tracking",
            "technical": "Bugs, errors, crashes and login problems",
        },
    }
    parcel = {"state": "The parcel never arrived", "questions": {"team": teams}}
    crash = {"state": "The app crashes when I log in", "questions": {"team": teams}, "images": []}
    body = {
        "state": "My card was charged twice for the same order",
        "questions": {"team": teams},
        "states": {"parcel": parcel, "crash": crash},
    }
    response = client.post("/v1/decisions", json=body)
    assert response.status_code == 200, response.text
    answered = response.json()
    assert answered["model"] == "minilm" and answered["answers"]["team"]["choice"] == "billing"
    assert list(answered["states"]) == ["parcel", "crash"]
    for name, entry, team in (("parcel", parcel, "shipping"), ("crash", crash, "technical")):
        state = answered["states"][name]
        alone = client.post("/v1/decisions", json=entry).json()
        assert state["model"] == "minilm" and state["answers"]["team"]["choice"] == team
        assert state["usage"] == alone["usage"] and state["usage"]["input_tokens"] > 0
    first = {"state": body["state"], "questions": body["questions"]}
    assert answered["usage"] == client.post("/v1/decisions", json=first).json()["usage"]
    bundled = client.post("/v1/bundle", json={"tasks": [{"id": "1", "decisions": body}]})
    [task] = bundled.json()["results"]
    assert task["status"] == 200 and task["decisions"]["states"].keys() == {"parcel", "crash"}
    assert task["decisions"]["usage"] == answered["usage"]
