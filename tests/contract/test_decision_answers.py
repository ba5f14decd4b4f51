"""Every decision answer of every served decision model passes the upstream router's
answer check (:mod:`.answer_checks`), on every route that answers decisions.

The router checks each answer it gets and drops one that does not fit its question
(``invalid_model_output``), although the body decoded: the Go decoding rules alone
(:mod:`.go`) let an answer with levels keyed from 1 through. The
:class:`~.conftest.Router` holds every decisions answer it sees to the check; these
tests make sure it sees each model kind served here (MiniLM's similarity readout and
the fixture decoders of every architecture and readout; SmolLM2's answers are checked
where tests/families/test_smollm2.py loads it) answer each question type and request form, on
``/v1/decisions`` (named and listed ``states``), ``/v1/systemone``,
``/v1/systemone/batch`` and the ``decisions`` and ``systemone_batch`` tasks of a
bundle.
"""

from __future__ import annotations

from typing import Any

import pytest

from . import go
from . import wire23 as w
from .conftest import FIXTURE_DECODERS, MINILM

pytestmark = pytest.mark.slow

QUESTIONS: dict[str, dict[str, Any]] = {
    # Choice: the router's choices list (a missing description sent as "") ...
    # (short: the fixture encoder reads 48 tokens an option)
    "route": {
        "type": "choice",
        "instructions": "Which team?",
        "choices": [
            {"key": "billing", "description": "payments and refunds"},
            {"key": "technical", "description": "bugs and errors"},
            {"key": "other", "description": ""},
        ],
    },
    # ... and our criteria object, a null description expanded from the key
    "channel": {
        "type": "choice",
        "instructions": "Where should the reply go?",
        "criteria": {"email": "a written reply", "phone_call": None},
    },
    # Noul: the default keys, and criteria describing both
    "urgent": {"type": "noul", "instructions": "Is this message urgent?"},
    "angry": {
        "type": "noul",
        "instructions": "Is the writer angry?",
        "criteria": {"false": "calm and polite", "true": "angry or upset"},
    },
    # Score: levels (2, 3 and the most a question takes, 10) and criteria as a list
    "refund": {
        "type": "score",
        "instructions": "Does the writer want money back?",
        "levels": ["no", "yes"],
    },
    "tone": {
        "type": "score",
        "instructions": "How angry is the writer?",
        "levels": ["calm", "annoyed", "furious"],
    },
    "priority": {
        "type": "score",
        "instructions": "How high a priority is this?",
        "criteria": ["lowest", "low", "medium", "high", "highest"],
    },
    "rating": {
        "type": "score",
        "instructions": "Rate the message's severity.",
        "levels": [f"severity {k}" for k in range(10)],
    },
}
STATES: list[Any] = [
    "I was charged twice for my subscription this month.",
    "The login page shows error 500 for everyone since this morning!",
    {"order": 42, "status": "late", "items": ["book", "lamp"]},
]
ROUTES = (
    "/v1/decisions",
    "/v1/systemone",
    "/v1/systemone/batch",
    "bundle:decisions",
    "bundle:systemone_batch",
)
TYPES = ("choice", "noul", "score")
ANSWER_SECONDS = 600
"""The bound on one request here: SmolLM2 answers its first one (every question about
two states) on a busy CPU in about two minutes; the routes after it reuse the cached
answers."""

# /v1/systemone/batch is our route (not the 2.3 contract's); its body, decoded by Go's rules
BatchResult = go.Struct("SystemOneBatchResult", {"index": go.Int(), "answers": go.Map(w.Answer)})
SystemOneBatchResponse = go.Struct(
    "SystemOneBatchResponse",
    {
        "model": go.Str(),
        "results": go.List(BatchResult),
        "usage": w.Usage,
        "meta": w.ResponseMeta,
    },
)
# states sent as an array are answered as one, each entry with its index (our extension:
# the router's client sends named states, answered as the 2.3 DecisionResponse)
ListedStatesResponse = w.DecisionResponse.extend(
    "DecisionResponse",
    states=go.List(w.DecisionStateResponse.extend("DecisionStateResponse", index=go.Int())),
)
BundleResult = w.BundleResult.extend("BundleResult", systemone_batch=SystemOneBatchResponse)
BundleResponse = go.Struct("BundleResponse", {"results": go.List(BundleResult)})

SIMILARITY_READOUTS = (MINILM, "pooled")  # the real MiniLM and the fixture pooled encoder
CAUSAL_READOUTS = tuple(FIXTURE_DECODERS)
DECISION_MODELS = (*SIMILARITY_READOUTS, *CAUSAL_READOUTS)


def questions_for(model: str) -> dict[str, dict[str, Any]]:
    """The questions asked of ``model``: every one of :data:`QUESTIONS`."""
    return QUESTIONS


def test_every_decision_model_kind_is_served(router):
    _, listing = router.call("GET", "/v1/models", w.ModelList)
    served = {c["id"]: c for c in listing["data"] if "decisions" in c["surfaces"]}
    # a new model answering decisions must join the check below
    assert set(served) == set(DECISION_MODELS)
    for name in DECISION_MODELS:
        family = "task_heads" if name in SIMILARITY_READOUTS else "causal_readout"
        assert served[name]["family"] == family, name
        assert set(served[name]["question_types"]) == set(TYPES), name


@pytest.mark.parametrize("model", DECISION_MODELS)
def test_every_answer_of_every_route_passes_the_routers_check(router, model):
    checked_before = len(router.decision_answers)
    questions = questions_for(model)
    named = w.decisions_body(model, STATES[0], questions)
    named["states"] = {
        "second": {"state": STATES[1], "questions": questions},
        "third": {"state": STATES[2], "questions": {"urgent": QUESTIONS["urgent"]}},
    }
    listed = {**named, "states": list(named["states"].values())}
    batch = {"model": model, "states": STATES[:2], "questions": questions}
    bundle = w.bundle_body([("decisions", named), ("systemone_batch", batch)])
    calls = (
        ("/v1/decisions", w.DecisionResponse, named),
        ("/v1/decisions", ListedStatesResponse, listed),
        ("/v1/systemone", w.DecisionResponse, named),
        ("/v1/systemone/batch", SystemOneBatchResponse, batch),
        ("/v1/bundle", BundleResponse, bundle),
    )
    for path, kind, body in calls:
        # the Router asserts the router's answer check on each 200 answer
        response, answer = router.call("POST", path, kind, body, timeout=ANSWER_SECONDS)
        assert response.status_code == 200, (path, answer)
        if path == "/v1/bundle":
            assert [r["status"] for r in answer["results"]] == [200, 200], answer
    checked = router.decision_answers[checked_before:]
    assert {m for _, m, _ in checked} == {model}
    # every question answered, none with an error (an answer with one is not checked):
    # n + n + 1 per decisions body, n per batch state (the bundle's tasks on their own)
    n = len(questions)
    per_route = {route: sum(1 for r, _, _ in checked if r == route) for route in ROUTES}
    assert per_route == {
        "/v1/decisions": 2 * (2 * n + 1),
        "/v1/systemone": 2 * n + 1,
        "/v1/systemone/batch": 2 * n,
        "bundle:decisions": 2 * n + 1,
        "bundle:systemone_batch": 2 * n,
    }, per_route
    assert {(r, t) for r, _, t in checked} == {(r, t) for r in ROUTES for t in TYPES}
