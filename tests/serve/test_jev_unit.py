""":mod:`vllm_srun.serve.jev` without a server: the Jev confidences against values worked by
hand and against jevcompat's own reference formulas; a decisions answer reshaped into a
Jev body; the request-level failures in the Jev error shapes."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest

from vllm_srun.serve import jev
from vllm_srun.serve.requests import ApiError

reference = pytest.importorskip("jevcompat.validate")


# -- confidence by hand ----------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 3, 5, 10, 255])
def test_choice_confidence_is_0_for_uniform_and_1_for_certain(n: int) -> None:
    assert jev.choice_confidence([1 / n] * n) == pytest.approx(0, abs=1e-12)
    for hot in (0, n - 1):
        assert jev.choice_confidence([float(i == hot) for i in range(n)]) == 1


@pytest.mark.parametrize(
    ("probabilities", "expected"),
    [
        ([0.5, 0.3, 0.2], (0.5 - 1 / 3) / (1 - 1 / 3)),  # 0.25
        ([0.75, 0.25], 0.5),  # (0.75 - 0.5) / 0.5
        ([0.1, 0.2, 0.3, 0.4], (0.4 - 0.25) / 0.75),  # 0.2
        ([1.0], 1.0),  # one option: nothing to doubt
    ],
)
def test_choice_confidence_worked_examples(probabilities: list[float], expected: float) -> None:
    assert jev.choice_confidence(probabilities) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("n", [2, 3, 4, 7, 10])
def test_score_confidence_is_0_for_uniform_and_1_for_certain(n: int) -> None:
    assert jev.score_confidence([1 / n] * n) == pytest.approx(0, abs=1e-12)
    for level in range(n):
        assert jev.score_confidence([float(i == level) for i in range(n)]) == 1


@pytest.mark.parametrize(
    ("probabilities", "expected"),
    [
        # 3 levels: S_3 = (|0-1| + |1-1| + |2-1|) / 3 = 2/3
        # mode 1, spread 0.2*1 + 0.3*1 = 0.5: 1 - 0.5 / (2/3) = 0.25
        ([0.2, 0.5, 0.3], 0.25),
        # mode 2, spread 0.1*2 + 0.2*1 = 0.4: 1 - 0.4 / (2/3) = 0.4
        ([0.1, 0.2, 0.7], 0.4),
        # a tie takes the first level: mode 0, spread 0.4*1 + 0.2*2 = 0.8 > 2/3: clamped to 0
        # (mode 1 would read 1 - 0.6 / (2/3) = 0.1)
        ([0.4, 0.4, 0.2], 0.0),
        # 2 levels: S_2 = 0.5; mode 0, spread 0.2: 1 - 0.2 / 0.5 = 0.6
        ([0.8, 0.2], 0.6),
        # 4 levels: S_4 = (1.5 + 0.5 + 0.5 + 1.5) / 4 = 1; mode 3, spread 0.1*3 + 0.2*1 = 0.5
        ([0.1, 0.0, 0.2, 0.7], 0.5),
    ],
)
def test_score_confidence_worked_examples(probabilities: list[float], expected: float) -> None:
    assert jev.score_confidence(probabilities) == pytest.approx(expected, abs=1e-12)


# -- confidence against jevcompat's reference ------------------------------------------------
def distributions(seed: int, sizes: range, count: int) -> list[list[float]]:
    """Random distributions from flat to sharply peaked (powers of uniform draws), with
    some exact ties and zeros."""
    rng = random.Random(seed)
    made = []
    for _ in range(count):
        n = rng.choice(sizes)
        weights = [rng.random() ** rng.choice([0.2, 1, 3, 12]) for _ in range(n)]
        if rng.random() < 0.1:
            weights[rng.randrange(n)] = max(weights)  # a tie for the most probable
        if rng.random() < 0.1:
            weights[rng.randrange(n)] = 0.0
        total = sum(weights)
        made.append([w / total for w in weights])
    return made


def test_choice_confidence_matches_jevcompat_on_random_distributions() -> None:
    for probabilities in distributions(7, range(2, 256), 2000):
        ours = jev.choice_confidence(probabilities)
        assert 0 <= ours <= 1
        assert math.isclose(ours, reference.choice_confidence(probabilities), abs_tol=1e-12), (
            probabilities
        )


def test_score_confidence_matches_jevcompat_on_random_distributions() -> None:
    for probabilities in distributions(11, range(2, 11), 5000):
        ours = jev.score_confidence(probabilities)
        assert 0 <= ours <= 1
        assert math.isclose(ours, reference.score_confidence(probabilities), abs_tol=1e-12), (
            probabilities
        )


# -- answers -----------------------------------------------------------------------------------
USAGE = {"input_tokens": 21, "output_tokens": 0}


def decided(**extra: Any) -> dict[str, Any]:
    """A decisions answer with fields and answer fields the Jev schema does not have."""
    return {
        "model": "judge",
        "object": "decisions",  # not a Jev field
        "answers": {
            "urgent": {"type": "noul", "noul": 0.25, "rank": 1},
            "team": {
                "type": "choice",
                "choice": "billing",
                "probabilities": {"billing": 0.7, "shipping": 0.3},
                "confidence": 0.1187,  # 1 - normalised entropy: recomputed
                "legend": {"billing": "charges"},
            },
            "severity": {
                "type": "score",
                "score": 1.2,
                "probabilities": {"0": 0.2, "1": 0.4, "2": 0.4},
                "confidence": 0.0,
                "legend": {"0": "low", "1": "medium", "2": "high"},
                "choice": "1",
            },
        },
        "usage": USAGE,
        **extra,
    }


def test_body_keeps_only_the_jev_fields_and_recomputes_confidence() -> None:
    shaped = jev.body(decided())
    assert shaped == {
        "model": "judge",
        "answers": {
            "urgent": {"type": "noul", "noul": 0.25},
            "team": {
                "type": "choice",
                "choice": "billing",
                "probabilities": {"billing": 0.7, "shipping": 0.3},
                "confidence": pytest.approx(0.4),  # (0.7 - 1/2) / (1 - 1/2)
            },
            "severity": {
                "type": "score",
                "score": 1.2,
                "probabilities": {"0": 0.2, "1": 0.4, "2": 0.4},
                # tie: mode 1; spread 0.2 + 0.4 = 0.6; 1 - 0.6 / (2/3)
                "confidence": pytest.approx(0.1),
                "legend": {"0": "low", "1": "medium", "2": "high"},
            },
        },
        "usage": USAGE,
    }
    assert list(shaped) == ["model", "answers", "usage"]
    assert list(shaped["answers"]["severity"]) == list(jev.ANSWER_FIELDS["score"])


def test_body_moves_meta_and_states_under_x_names() -> None:
    meta = {"model_id": "judge"}
    entry = {"index": 0, "model": "judge", "answers": decided()["answers"], "usage": USAGE}
    shaped = jev.body(decided(meta=meta, states=[entry]))
    assert list(shaped) == ["model", "answers", "usage", "x_meta", "x_states"]
    assert shaped["x_meta"] == meta
    [state] = shaped["x_states"]
    assert state["answers"] == shaped["answers"] and state["index"] == 0
    named = jev.body(decided(states={"eu": entry}))["x_states"]
    assert list(named) == ["eu"] and named["eu"]["answers"] == shaped["answers"]


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("max_length_exceeded", 413),
        ("deadline_exceeded", 504),
        ("invalid_model_output", 502),
        ("unavailable", 503),
        ("internal_error", 500),
    ],
)
def test_body_fails_the_request_for_a_failed_question(code: str, status: int) -> None:
    failed = decided()
    failed["answers"]["severity"] = {
        "type": "score",
        "error": code,
        "message": "the state is 700 tokens; the model reads at most 512",
    }
    with pytest.raises(jev.JevError) as caught:
        jev.body(failed)
    err = caught.value
    assert (err.status, err.code) == (status, code)
    assert err.message == (
        "question 'severity': the state is 700 tokens; the model reads at most 512"
    )
    assert err.body() == {
        "detail": {"error_type": code, "message": err.message},
        "error": {
            "code": code,
            "message": err.message,
            "type": "invalid_request_error" if status < 500 else "server_error",
            "param": None,
        },
    }
    with pytest.raises(jev.JevError) as in_batch:
        jev.batch_body({"model": "judge", "results": [{"index": 0, **failed}], "usage": USAGE})
    assert in_batch.value.status == status


# -- errors -----------------------------------------------------------------------------------
def test_as_jev_makes_invalid_request_a_422_at_the_body() -> None:
    err = jev.as_jev(ApiError("invalid_request", "questions must be an object, not missing"))
    assert isinstance(err, jev.JevError) and err.status == 422
    assert err.detail == [
        {
            "loc": ["body"],
            "msg": "questions must be an object, not missing",
            "type": "invalid_request",
        }
    ]
    assert err.detail[0]["loc"] == ["body"]
    assert err.body()["error"] == {
        "code": "invalid_request",
        "message": "questions must be an object, not missing",
        "type": "invalid_request_error",
        "param": None,
    }


@pytest.mark.parametrize(
    ("code", "status"),
    [("model_not_found", 404), ("overloaded", 429), ("not_ready", 503), ("request_too_large", 413)],
)
def test_as_jev_keeps_any_other_failure_its_status_with_a_detail_object(
    code: str, status: int
) -> None:
    err = jev.as_jev(ApiError(code, "why"))  # type: ignore[arg-type]
    assert err.status == status
    kind = "server_error" if status >= 500 or code == "overloaded" else "invalid_request_error"
    assert err.body() == {
        "detail": {"error_type": code, "message": "why"},
        "error": {
            "code": code,
            "message": "why",
            "type": kind,
            "param": "model" if code == "model_not_found" else None,
        },
    }
    assert jev.as_jev(err) is err


def test_invalid_lists_each_problem_at_its_body_path() -> None:
    err = jev.invalid(
        [
            (("questions", "a"), "questions.a.type is missing", "invalid_question"),
            (("states", 0, "questions", "b"), "states[0].questions.b is bad", "invalid_question"),
        ]
    )
    assert err.status == 422 and err.code == "invalid_request"
    assert [d["loc"] for d in err.detail] == [
        ["body", "questions", "a"],
        ["body", "states", 0, "questions", "b"],
    ]
    assert err.message == "questions.a.type is missing; states[0].questions.b is bad"


@pytest.mark.parametrize(
    ("path", "schema", "jev_detail"),
    [
        ("/v1/systemone", "jev", True),
        ("/v1/systemone/batch", "jev", True),
        ("/v1/embeddings", "jev", False),
        ("/v1/systemone", "vllm-sr/4.0", False),
    ],
)
def test_a_body_over_the_limit_by_its_length_is_413_in_the_routes_schema(path, schema, jev_detail):
    """A Content-Length over --max-request-bytes is answered before the body is read, by
    the middleware: on a jev System One route with Jev's detail beside the error, as every
    other jev failure."""
    import asyncio

    from vllm_srun.serve.envelope import Envelope

    async def never(scope, receive, send):  # the application is never reached
        raise AssertionError("the application ran")

    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": [(b"content-length", b"999999999999")],
    }
    envelope = Envelope(never, max_request_bytes=1024, systemone_schema=schema)
    asyncio.run(envelope(scope, receive, send))
    assert sent[0]["status"] == 413
    error = {
        "code": "request_too_large",
        "message": "the body is over 1024 bytes",
        "type": "invalid_request_error",
        "param": None,
    }
    body = json.loads(sent[1]["body"])
    if jev_detail:
        assert body == {
            "detail": {"error_type": "request_too_large", "message": "the body is over 1024 bytes"},
            "error": error,
        }
    else:
        assert body == {"error": error}
