"""A System One schema per model, from a models file: ``systemone_schema: jev`` on one
entry, the process's ``vllm-sr/5.0`` on the other, both the real MiniLM (loaded once).

One live server for the module, ``vllm-srun serve --models FILE --offline`` (options read
by the CLI's own parser, served in process on real uvicorn): ``judge`` answers Jev shapes
on ``/v1/systemone``, ``plain`` the ``vllm-sr/5.0`` ones (checked against the OpenAPI
snapshot), ``jev-latest`` reaches ``judge``, and ``/v1/decisions`` keeps ``vllm-sr/5.0``
for both. A bad ``systemone_schema`` in a models file ends ``vllm-srun serve`` with a
message naming the entry and the schemas it may name.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from vllm_srun.cli import main as vllm_srun_main
from vllm_srun.config import SYSTEMONE_SCHEMAS
from vllm_srun.serve.jev import ALIAS
from vllm_srun.service.runtime import Runtime

from .conftest import LiveServer
from .jev_support import (
    MINILM,
    QUESTIONS,
    STATE,
    check_answers,
    entropy_confidence,
    load,
    one_torch_thread,
    serve_args,
)

pytestmark = pytest.mark.slow

JEV, PLAIN = "judge", "plain"

MODELS_FILE = f"""\
models:
  - model: {MINILM}
    name: {PLAIN}
  - model: {MINILM}
    name: {JEV}
    systemone_schema: jev
"""

BODY = {"state": STATE, "questions": QUESTIONS}
INVALID = {"type": "choice", "instructions": "Which one?", "criteria": {"only": None}}
"""A question no schema accepts: a Choice takes 2 to 255 options."""


@pytest.fixture(scope="module")
def server(tmp_path_factory, catalog, caching_loader) -> Iterator[LiveServer]:
    path = tmp_path_factory.mktemp("jev-models") / "models.yaml"
    path.write_text(MODELS_FILE, encoding="utf-8")
    config = serve_args("--models", str(path), "--offline")
    assert config.systemone_schema == "vllm-sr/5.0"
    assert [(m.served_name, m.systemone_schema) for m in config.models] == [
        (PLAIN, None),
        (JEV, "jev"),
    ]
    with one_torch_thread():
        runtime = load(Runtime(config, catalog=catalog, loader=caching_loader))
        live = LiveServer(runtime)
        yield live
        live.close()
        runtime.stop(5)


@pytest.fixture(scope="module")
def raw(server: LiveServer) -> Iterator[httpx.Client]:
    """A plain client, for the Jev shapes (the OpenAPI snapshot describes the vllm-sr ones)."""
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def checked(server: LiveServer) -> Iterator[httpx.Client]:
    """A client whose every answer must match the OpenAPI snapshot (the vllm-sr shapes)."""
    with server.client() as client:
        yield client


def answered(client: httpx.Client, body: dict[str, Any], path: str = "/v1/systemone") -> Any:
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def refused(client: httpx.Client, body: dict[str, Any], status: int, path: str = "/v1/systemone"):
    response = client.post(path, json=body)
    assert response.status_code == status, response.text
    return response.json()


def test_each_entry_answers_in_its_own_schema(raw: httpx.Client, checked: httpx.Client) -> None:
    options = {"options": {"return_meta": True}}
    jev = answered(raw, {"model": JEV, **BODY, **options})
    plain = answered(checked, {"model": PLAIN, **BODY, **options})
    # jev: exactly model, answers, usage (extras under x_), the Jev confidences
    assert list(jev) == ["model", "answers", "usage", "x_meta"] and jev["model"] == JEV
    check_answers(jev["answers"], QUESTIONS)
    # vllm-sr/5.0: `meta` as it is, confidence 1 - normalised entropy
    assert list(plain) == ["model", "answers", "usage", "meta"] and plain["model"] == PLAIN
    assert (plain["meta"]["model_id"], jev["x_meta"]["model_id"]) == (PLAIN, JEV)
    assert plain["meta"]["model_sha256"] == jev["x_meta"]["model_sha256"]  # one model
    # the same model under both names: the same probabilities, each schema's confidence
    assert plain["usage"] == jev["usage"]
    assert plain["answers"]["refund"] == jev["answers"]["refund"]
    for name in ("team", "urgency"):
        ours, theirs = plain["answers"][name], jev["answers"][name]
        assert ours["probabilities"] == theirs["probabilities"]
        assert {k: v for k, v in ours.items() if k != "confidence"} == {
            k: v for k, v in theirs.items() if k != "confidence"
        }
        expected = entropy_confidence(list(ours["probabilities"].values()))
        assert math.isclose(ours["confidence"], expected, abs_tol=1e-9), (name, ours)
        assert not math.isclose(ours["confidence"], theirs["confidence"], abs_tol=1e-6)


def test_jev_latest_reaches_the_jev_entry(raw: httpx.Client, checked: httpx.Client) -> None:
    alias = answered(raw, {"model": ALIAS, **BODY})
    assert alias == answered(raw, {"model": JEV, **BODY})
    assert alias["model"] == JEV
    listed = checked.get("/v1/models").json()
    assert [card["id"] for card in listed["data"]] == [PLAIN, JEV]
    assert [m["name"] for m in listed["models"]] == [PLAIN, JEV, ALIAS]
    schemas = [m["description"] for m in listed["models"]]
    assert "vllm-sr/5.0 schema" in schemas[0] and "jev schema" in schemas[1]
    assert schemas[2].startswith(f"alias of {JEV}")
    # without a model, two models leave the process's schema to say it: vllm-sr/5.0's 400
    assert refused(checked, BODY, 400) == {
        "error": {
            "code": "invalid_request",
            "message": f"name the model: one of {PLAIN}, {JEV}",
            "type": "invalid_request_error",
            "param": None,
        }
    }


def test_an_invalid_question_is_422_at_its_name_in_jev_only(
    raw: httpx.Client, checked: httpx.Client
) -> None:
    questions = {**QUESTIONS, "which": INVALID}
    body = {"model": JEV, "state": STATE, "questions": questions}
    error = refused(raw, body, 422)
    assert error["detail"] == [
        {
            "loc": ["body", "questions", "which"],
            "msg": "questions.which.criteria has 1 option; a question takes 2 to 255",
            "type": "invalid_question",
        }
    ]
    assert error["error"] == {
        "code": "invalid_request",
        "message": error["detail"][0]["msg"],
        "type": "invalid_request_error",
        "param": None,
    }
    # in a states entry, the path goes on into it
    entry = {"state": "the parcel is late", "questions": {"which": INVALID}}
    error = refused(raw, {"model": JEV, **BODY, "states": [entry]}, 422)
    assert [d["loc"] for d in error["detail"]] == [["body", "states", 0, "questions", "which"]]
    # vllm-sr/5.0 answers the others and the invalid one in its place
    plain = answered(checked, {**body, "model": PLAIN})
    assert plain["answers"]["which"] == {
        "type": "choice",
        "error": "invalid_question",
        "message": "questions.which.criteria has 1 option; a question takes 2 to 255",
    }
    assert {k: v for k, v in plain["answers"].items() if k != "which"} == answered(
        checked, {"model": PLAIN, **BODY}
    )["answers"]


def test_unknown_top_level_fields_are_ignored_in_jev_and_refused_in_vllm_sr(
    raw: httpx.Client, checked: httpx.Client
) -> None:
    extra = {"temperature": 0, "metadata": {"ticket": 1234}, "facts": None}
    assert answered(raw, {"model": JEV, **BODY, **extra}) == answered(raw, {"model": JEV, **BODY})
    error = refused(checked, {"model": PLAIN, **BODY, **extra}, 400)
    assert list(error) == ["error"] and error["error"]["code"] == "invalid_request"
    assert error["error"]["message"].startswith("temperature is not a field")


def test_decisions_keeps_the_vllm_sr_shape_for_the_jev_entry(
    raw: httpx.Client, checked: httpx.Client
) -> None:
    jev = answered(raw, {"model": JEV, **BODY})
    decided = answered(
        checked, {"model": JEV, **BODY, "options": {"return_meta": True}}, "/v1/decisions"
    )
    assert "meta" in decided and "x_meta" not in decided
    assert (
        decided["answers"]
        == answered(checked, {"model": PLAIN, **BODY}, "/v1/decisions")["answers"]
    )
    team = decided["answers"]["team"]
    assert team["probabilities"] == jev["answers"]["team"]["probabilities"]
    expected = entropy_confidence(list(team["probabilities"].values()))
    assert math.isclose(team["confidence"], expected, abs_tol=1e-9)
    questions = {**QUESTIONS, "which": INVALID}
    decided = answered(
        checked, {"model": JEV, "state": STATE, "questions": questions}, "/v1/decisions"
    )
    assert decided["answers"]["which"]["error"] == "invalid_question"
    for body, status, code in (
        ({"model": JEV, **BODY, "facts": "x"}, 400, "invalid_request"),
        ({"model": ALIAS, **BODY}, 404, "model_not_found"),
    ):
        error = refused(checked, body, status, "/v1/decisions")
        assert list(error) == ["error"] and error["error"]["code"] == code


def test_a_jev_batch_names_an_invalid_shared_question_once(raw: httpx.Client) -> None:
    body = {"model": JEV, "states": [STATE, "the parcel is late"], "questions": {"which": INVALID}}
    error = refused(raw, body, 422, "/v1/systemone/batch")
    assert [d["loc"] for d in error["detail"]] == [["body", "questions", "which"]]


# -- a bad systemone_schema ends the command -------------------------------------------------
@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("jev/1", "systemone_schema 'jev/1' is not a System One schema"),
        ("JEV", "systemone_schema 'JEV' is not a System One schema"),
        ('"  "', "systemone_schema is blank"),
    ],
)
def test_a_bad_systemone_schema_exits_naming_the_entry_and_the_schemas(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, problem: str
) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(
        f"models:\n  - model: {MINILM}\n    name: {PLAIN}\n"
        f"  - model: {MINILM}\n    name: {JEV}\n    systemone_schema: {value}\n",
        encoding="utf-8",
    )
    with pytest.raises(SystemExit) as exited:
        vllm_srun_main(["serve", "--models", str(path), "--offline"])
    assert exited.value.code == 2
    message = capsys.readouterr().err
    assert f"models file {path}, entry 2 ({MINILM}): {problem}" in message, message
    assert f"give one of {', '.join(SYSTEMONE_SCHEMAS)}" in message, message
    assert SYSTEMONE_SCHEMAS == ("vllm-sr/5.0", "vllm-sr/4.0", "jev")


def test_a_bad_systemone_schema_flag_exits_naming_the_schemas(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        vllm_srun_main(["serve", MINILM, "--offline", "--systemone-schema", "typesafe"])
    assert exited.value.code == 2
    message = capsys.readouterr().err
    assert "--systemone-schema" in message and "'typesafe'" in message, message
    assert all(schema in message for schema in SYSTEMONE_SCHEMAS), message
