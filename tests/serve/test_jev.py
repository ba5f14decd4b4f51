"""The ``jev`` System One schema on the real MiniLM, as Jev's own ecosystem reads it.

One live server for the module: ``vllm-srun serve sentence-transformers/all-MiniLM-L6-v2
--offline --systemone-schema jev``, its options read by the CLI's own parser, served in
process on real uvicorn (MiniLM from its installed mirror). Against it:

- the conformance suite ``jevcompat`` 0.1.1: conformant, every MUST tested and passed,
  every SHOULD it tests passed (authentication is not tested: the runtime has no keys);
- three real clients, unchanged but for the base URL (and the API key the two SDKs
  require, which the runtime ignores): the official ``typesafe-sdk`` 0.7.5, ``jev-lite``
  0.0.6 and ``deqio-client`` 0.6.5, one question of each type each. Each answer is
  checked for its values (:func:`.jev_support.check_answers`) and against the raw HTTP
  answer to the same request: the server is deterministic, so what a client parsed must
  be exactly what the server sent;
- ``/v1/decisions`` on the same server, which keeps the ``vllm-sr/5.0`` shape.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from vllm_srun.serve.jev import ALIAS
from vllm_srun.service.runtime import Runtime

from ..jevcompat_report import failures
from .conftest import LiveServer
from .jev_support import (
    MINILM,
    QUESTIONS,
    STATE,
    TEAMS,
    check_answers,
    entropy_confidence,
    load,
    one_torch_thread,
    serve_args,
)

pytestmark = pytest.mark.slow

jevcompat_runner = pytest.importorskip("jevcompat.runner")
typesafe_sdk = pytest.importorskip("typesafe_sdk")
jev_lite = pytest.importorskip("jev_lite")
deqio_client = pytest.importorskip("deqio_client")

KEY = "unused-key"
"""The API key the SDKs refuse to start without; the runtime itself reads none."""

DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


@pytest.fixture(scope="module")
def server(catalog, caching_loader) -> Iterator[LiveServer]:
    config = serve_args(MINILM, "--offline", "--systemone-schema", "jev")
    assert config.systemone_schema == "jev" and config.offline
    with one_torch_thread():
        runtime = load(Runtime(config, catalog=catalog, loader=caching_loader))
        live = LiveServer(runtime)
        yield live
        live.close()
        runtime.stop(5)


@pytest.fixture(scope="module")
def raw(server: LiveServer) -> Iterator[httpx.Client]:
    """A plain HTTP client: the Jev answers and errors are not the shapes the OpenAPI
    snapshot describes, so this one does not check them against it."""
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def post(raw: httpx.Client, body: dict[str, Any], path: str = "/v1/systemone") -> Any:
    response = raw.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


# -- jevcompat ------------------------------------------------------------------------------
def test_jevcompat_finds_the_runtime_conformant(server: LiveServer) -> None:
    report = jevcompat_runner.run(server.url, model=ALIAS)
    explained = failures(report)
    summary = report.summary()
    assert report.aborted is None, explained
    assert summary["MUST"]["failed"] == 0, explained
    assert summary["MUST"]["passed"] == 32, explained
    assert report.untested_musts == [], explained
    assert summary["SHOULD"]["failed"] == 0, explained
    # every SHOULD is tested but the two that need a key
    skipped = {r.id for r in report.results if r.status == "skip"}
    assert skipped == {"auth.bearer", "auth.missing", "auth.invalid"}, explained
    assert summary["SHOULD"]["passed"] == summary["SHOULD"]["tested"] == 13, explained
    assert report.verdict == "conformant", explained


# -- the official SDK -----------------------------------------------------------------------
def sdk_questions() -> dict[str, Any]:
    """:data:`QUESTIONS` as typesafe-sdk's question objects (they serialise to the same)."""
    return {
        "refund": typesafe_sdk.Noul(instructions=QUESTIONS["refund"]["instructions"]),
        "team": typesafe_sdk.Choice(**{k: v for k, v in QUESTIONS["team"].items() if k != "type"}),
        "urgency": typesafe_sdk.Score(
            **{k: v for k, v in QUESTIONS["urgency"].items() if k != "type"}
        ),
    }


def test_typesafe_sdk_parses_each_answer_type_as_the_server_sent_it(
    server: LiveServer, raw: httpx.Client
) -> None:
    sent = post(raw, {"model": ALIAS, "state": STATE, "questions": QUESTIONS})
    check_answers(sent["answers"], QUESTIONS)
    assert sent["model"] == MINILM
    assert sent["answers"]["team"]["choice"] == "billing"  # MiniLM reads the state right
    with typesafe_sdk.TypeSafeClient(api_key=KEY, base_url=server.url) as client:
        result = client.system_one(state=STATE, questions=sdk_questions())

    assert isinstance(result, typesafe_sdk.SystemOneResponse)
    assert result.model == sent["model"]
    assert (result.usage.input_tokens, result.usage.output_tokens) == (
        sent["usage"]["input_tokens"],
        sent["usage"]["output_tokens"],
    )
    assert result.usage.input_tokens > 0
    assert list(result.answers) == list(QUESTIONS)

    noul = result.nouls["refund"]
    assert isinstance(noul, typesafe_sdk.NoulAnswer)
    assert noul.noul == sent["answers"]["refund"]["noul"]

    choice = result.choices["team"]
    assert isinstance(choice, typesafe_sdk.ChoiceAnswer)
    assert choice.model_dump() == sent["answers"]["team"]
    assert set(choice.probabilities) == set(TEAMS)
    assert choice.choice == max(choice.probabilities, key=choice.probabilities.__getitem__)

    # Levels from 0: the SDK keys a Score's probabilities and legend by integer level and
    # reads `score` as sum(level * p). A 1-based answer would be read wrong without a word.
    score = result.scores["urgency"]
    assert isinstance(score, typesafe_sdk.ScoreAnswer)
    levels = len(QUESTIONS["urgency"]["criteria"])
    assert list(score.probabilities) == list(range(levels))
    assert list(score.legend) == list(range(levels))
    assert [score.legend[i] for i in range(levels)] == QUESTIONS["urgency"]["criteria"]
    assert 0 <= score.score <= levels - 1
    assert math.isclose(
        score.score, sum(i * p for i, p in score.probabilities.items()), abs_tol=1e-9
    )
    wire = sent["answers"]["urgency"]
    assert score.score == wire["score"] and score.confidence == wire["confidence"]
    assert score.probabilities == {int(k): p for k, p in wire["probabilities"].items()}
    assert score.legend == {int(k): text for k, text in wire["legend"].items()}


def test_typesafe_sdk_lists_the_model_and_the_alias(server: LiveServer, raw: httpx.Client) -> None:
    with typesafe_sdk.TypeSafeClient(api_key=KEY, base_url=server.url) as client:
        listed = client.models.list()
    assert isinstance(listed, typesafe_sdk.ListModelsResponse)
    assert [m.name for m in listed.models] == [MINILM, ALIAS]
    for model in listed.models:
        assert isinstance(model, typesafe_sdk.ModelMetadata)
        assert DATE.fullmatch(model.release_date), model
        assert model.description
    assert MINILM in listed.models[1].description  # the alias says what it reaches
    sent = raw.get("/v1/models").json()
    assert [m.model_dump() for m in listed.models] == sent["models"]
    assert [card["id"] for card in sent["data"]] == [MINILM]  # the cards stay as they were


def test_typesafe_sdk_raises_its_validation_error_for_an_invalid_question(
    server: LiveServer,
) -> None:
    one_option = typesafe_sdk.Choice(instructions="Which team?", criteria={"billing": None})
    with (
        typesafe_sdk.TypeSafeClient(api_key=KEY, base_url=server.url) as client,
        pytest.raises(typesafe_sdk.TypeSafeUnprocessableEntityError) as caught,
    ):
        client.system_one(state=STATE, questions={"team": one_option})
    assert caught.value.status == 422
    assert caught.value.body["detail"][0]["loc"] == ["body", "questions", "team"]
    assert "questions.team.criteria has 1 option" in str(caught.value)


# -- jev-lite --------------------------------------------------------------------------------
def test_jev_lite_parses_each_answer_type_and_sends_a_noul_without_criteria(
    server: LiveServer, raw: httpx.Client
) -> None:
    refund = jev_lite.Noul(instructions=QUESTIONS["refund"]["instructions"])
    # jev-lite writes every field of its models: a Noul without criteria goes out as
    # `"criteria": null` (it once crashed the server), a Choice without instructions as
    # `"instructions": null`.
    assert refund.model_dump() == {**QUESTIONS["refund"], "criteria": None}
    team = jev_lite.Choice(criteria=TEAMS)
    urgency = jev_lite.Score(**{k: v for k, v in QUESTIONS["urgency"].items() if k != "type"})
    wire = {
        "refund": refund.model_dump(),
        "team": {"type": "choice", "instructions": None, "criteria": TEAMS},
        "urgency": QUESTIONS["urgency"],
    }
    sent = post(raw, {"model": ALIAS, "state": STATE, "questions": wire})
    check_answers(sent["answers"], wire)
    with jev_lite.TypeSafe(api_key=KEY, base_url=server.url) as client:
        result = client.system_one.create(
            state=STATE, questions={"refund": refund, "team": team, "urgency": urgency}
        )

    assert isinstance(result, jev_lite.SystemOneResponse)
    assert result.model == sent["model"] == MINILM
    assert result.usage.model_dump() == sent["usage"]
    assert isinstance(result.nouls["refund"], jev_lite.NoulAnswer)
    assert isinstance(result.choices["team"], jev_lite.ChoiceAnswer)
    assert isinstance(result.scores["urgency"], jev_lite.ScoreAnswer)
    assert {name: a.model_dump() for name, a in result.answers.items()} == sent["answers"]
    score = result.scores["urgency"]
    assert list(score.probabilities) == ["0", "1", "2", "3"]
    assert 0 <= score.score <= 3
    choice = result.choices["team"]
    assert choice.choice == max(choice.probabilities, key=choice.probabilities.__getitem__)


def test_jev_lite_lists_models_and_raises_for_an_invalid_question(server: LiveServer) -> None:
    with jev_lite.TypeSafe(api_key=KEY, base_url=server.url) as client:
        assert [m.name for m in client.models.list()] == [MINILM, ALIAS]
        with pytest.raises(jev_lite.UnprocessableEntityError) as caught:
            client.system_one.create(
                state=STATE,
                questions={
                    "urgency": jev_lite.Score(criteria=["low", "high"]),
                    "q": {"type": "choice", "criteria": {"only": None}},
                },
            )
    assert caught.value.status_code == 422
    assert [d["loc"] for d in caught.value.body["detail"]] == [["body", "questions", "q"]]


# -- deqio-client ----------------------------------------------------------------------------
def test_deqio_client_gets_the_raw_answer_and_its_facts_are_ignored(
    server: LiveServer, raw: httpx.Client
) -> None:
    client = deqio_client.DeqioClient(server.url, timeout=60)
    # deqio-client's raw System One call sends no `model`: the one model served answers
    answered = client.systemone(STATE, QUESTIONS)
    check_answers(answered["answers"], QUESTIONS)
    assert answered == post(raw, {"state": STATE, "questions": QUESTIONS})
    assert (
        answered["answers"]
        == post(raw, {"model": ALIAS, "state": STATE, "questions": QUESTIONS})["answers"]
    )
    # `facts` is a top-level field the Jev schema does not know: ignored, not refused
    assert client.systemone(STATE, QUESTIONS, facts="order 1234 was charged twice") == answered


def test_deqio_client_reads_the_validation_detail(server: LiveServer) -> None:
    client = deqio_client.DeqioClient(server.url, timeout=60)
    bad = {**QUESTIONS, "empty": {"type": "score", "criteria": ["only level"]}}
    with pytest.raises(deqio_client.DeqioError) as caught:
        client.systemone(STATE, bad)
    assert caught.value.status == 422
    [detail] = caught.value.detail
    assert detail["loc"] == ["body", "questions", "empty"]
    assert detail["type"] == "invalid_question"
    assert "questions.empty.criteria has 1 level" in detail["msg"]


# -- the same answers from every client ------------------------------------------------------
def test_every_client_gets_the_same_answers(server: LiveServer) -> None:
    with typesafe_sdk.TypeSafeClient(api_key=KEY, base_url=server.url) as client:
        official = client.system_one(state=STATE, questions=QUESTIONS)
    with jev_lite.TypeSafe(api_key=KEY, base_url=server.url) as client:
        lite = client.system_one.create(state=STATE, questions=QUESTIONS)
    deqio = deqio_client.DeqioClient(server.url, timeout=60).systemone(STATE, QUESTIONS)
    assert {n: a.model_dump() for n, a in lite.answers.items()} == deqio["answers"]
    official_answers = {n: a.model_dump() for n, a in official.answers.items()}
    urgency = official_answers["urgency"]
    for field in ("probabilities", "legend"):
        urgency[field] = {str(k): v for k, v in urgency[field].items()}
    assert official_answers == deqio["answers"]


# -- /v1/decisions on a jev server -----------------------------------------------------------
def test_decisions_keeps_the_vllm_sr_shape_on_a_jev_server(
    server: LiveServer, raw: httpx.Client
) -> None:
    body = {"model": MINILM, "state": STATE, "questions": QUESTIONS}
    jev = post(raw, body)
    with server.client() as checked:  # the vllm-sr/5.0 answer is the documented one
        response = checked.post("/v1/decisions", json={**body, "options": {"return_meta": True}})
        assert response.status_code == 200, response.text
        decided = response.json()
        # the same probabilities, but confidence is 1 - normalised entropy, and `meta`
        assert "meta" in decided and "x_meta" not in decided
        for name in ("team", "urgency"):
            probabilities = decided["answers"][name]["probabilities"]
            assert probabilities == jev["answers"][name]["probabilities"]
            expected = entropy_confidence(list(probabilities.values()))
            assert math.isclose(decided["answers"][name]["confidence"], expected, abs_tol=1e-9)
            assert decided["answers"][name]["confidence"] != jev["answers"][name]["confidence"]
        # an invalid question is answered in its place, not refused with 422
        bad = {**body, "questions": {**QUESTIONS, "q": {"type": "choice", "criteria": {}}}}
        response = checked.post("/v1/decisions", json=bad)
        assert response.status_code == 200, response.text
        assert response.json()["answers"]["q"]["error"] == "invalid_question"
        # an unknown field is refused, and the Jev alias is no model here
        for refused, status, code in (
            ({**body, "facts": "x"}, 400, "invalid_request"),
            ({**body, "model": ALIAS}, 404, "model_not_found"),
        ):
            response = checked.post("/v1/decisions", json=refused)
            assert response.status_code == status, response.text
            assert response.json() == {"error": response.json()["error"]}
            assert response.json()["error"]["code"] == code


# -- request compression ----------------------------------------------------------------------
def zstd_frame(data: bytes) -> bytes:
    """``data`` as a Zstandard frame (RFC 8878) of one raw (stored) block: what any zstd
    decoder reads back as ``data``, written without a zstd library (none is installed)."""
    assert 256 <= len(data) < 65792  # a 2-byte content size: the size less 256
    header = b"\x28\xb5\x2f\xfd" + bytes([0x60]) + struct.pack("<H", len(data) - 256)
    return header + ((len(data) << 3) | 1).to_bytes(3, "little") + data  # last block, raw


def test_a_zstd_compressed_body_is_answered_as_the_sdk_sends_it(raw: httpx.Client) -> None:
    # typesafe_sdk._core.compression: MIN_COMPRESSED_BODY_LENGTH; zstd is unavailable here,
    # so the SDK itself cannot be made to send it
    from typesafe_sdk._core.compression import MIN_COMPRESSED_BODY_LENGTH

    body = {"model": ALIAS, "state": STATE + " " + "x" * 1000, "questions": QUESTIONS}
    data = json.dumps(body).encode()
    assert len(data) >= MIN_COMPRESSED_BODY_LENGTH
    expected = post(raw, body)
    response = raw.post(
        "/v1/systemone",
        content=zstd_frame(data),
        headers={"content-type": "application/json", "content-encoding": "zstd"},
    )
    assert response.status_code == 200, response.text
    assert response.json() == expected
