"""The similarity readout: embedders answer decisions through their own embeddings.

The real MiniLM embedder answers the issue's routing questions; the shipped
calibration is exactly what the shipped labelled set fits (set
``VLLM_SRUN_UPDATE_CALIBRATION=1`` to rewrite it after changing the set or the
method).
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from vllm_srun.extended import ExtendedModel
from vllm_srun.extensions.similarity_readout import SimilarityReadout, calibrate
from vllm_srun.extensions.similarity_readout.readout import CALIBRATION, read_calibration
from vllm_srun.loader import LoadOptions, load_model
from vllm_srun.plugins.testing import check_plugin

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
TEAMS = {
    "billing": "Payments, charges, refunds and invoices",
    "shipping": "Delivery, parcels and tracking",
    "technical": "Bugs, errors, crashes and login problems",
}


@pytest.fixture(scope="module")
def minilm():
    return load_model(MINILM, LoadOptions(offline=True))


def team_question(state):
    return {
        "state": state,
        "questions": {
            "team": {
                "type": "choice",
                "instructions": "Which team should handle this?",
                "criteria": TEAMS,
            }
        },
    }


@pytest.mark.parametrize(
    ("state", "team"),
    [
        ("My card was charged twice for the same order", "billing"),
        ("The parcel never arrived", "shipping"),
        ("The app crashes when I log in", "technical"),
    ],
)
def test_minilm_routes_support_tickets_to_the_right_team(minilm, state, team):
    body = minilm.answer("decisions", team_question(state))
    answer = body["answers"]["team"]
    assert answer["choice"] == team
    assert max(answer["probabilities"], key=answer["probabilities"].get) == team
    assert math.isclose(sum(answer["probabilities"].values()), 1.0, abs_tol=1e-6)
    assert 0.0 <= answer["confidence"] <= 1.0
    assert body["usage"]["input_tokens"] > 0 and body["usage"]["output_tokens"] == 0


def test_the_card_marks_the_answers_approximate_and_names_the_method(minilm):
    card = minilm.card()
    assert "decisions" in card["surfaces"]
    assert card["question_types"] == ["choice", "noul", "score"]
    [extension] = card["extensions"]
    assert extension["name"] == "similarity_readout"
    assert extension["numerics"] == "approximate"
    assert "cosine" in extension["method"]
    assert extension["temperature"] == read_calibration()["temperature"]


def test_probabilities_are_the_softmax_of_cosines_over_the_temperature(minilm):
    host = minilm.loaded.host
    question = team_question("The parcel never arrived")
    body = minilm.answer("decisions", question)
    texts = ["The parcel never arrived"] + [
        f"Which team should handle this? {key}: {text}" for key, text in TEAMS.items()
    ]
    plan = host.plan("embeddings", {"input": texts})
    vectors = [
        torch.tensor(d["embedding"], dtype=torch.float64)
        for d in host.finish(plan, host.run(plan.items))["data"]
    ]
    cosines = torch.stack([vectors[0] @ v / (vectors[0].norm() * v.norm()) for v in vectors[1:]])
    expected = torch.softmax(cosines / read_calibration()["temperature"]["choice"], dim=0)
    got = torch.tensor(list(body["answers"]["team"]["probabilities"].values()), dtype=torch.float64)
    assert torch.allclose(got, expected, atol=1e-6)


def test_noul_score_states_and_a_bad_question_in_place(minilm):
    body = minilm.answer(
        "decisions",
        {
            "state": "The flight was delayed by six hours",
            "questions": {
                "travel": {"type": "noul", "instructions": "Is this about travel?"},
                "bad": {"type": "choice", "instructions": "Pick", "criteria": {"only": None}},
                "mood": {
                    "type": "score",
                    "instructions": "How positive is the message?",
                    "levels": ["Negative", "Neutral", "Positive"],
                },
            },
            "states": [
                {
                    "state": "I need help with my tax return",
                    "questions": {
                        "travel": {"type": "noul", "instructions": "Is this about travel?"}
                    },
                }
            ],
            "options": {"return_meta": True},
        },
    )
    answers = body["answers"]
    assert list(answers) == ["travel", "bad", "mood"]
    assert answers["travel"]["type"] == "noul" and answers["travel"]["noul"] > 0.5
    assert answers["bad"]["error"] == "invalid_question"
    assert "criteria" in answers["bad"]["message"]
    mood = answers["mood"]
    assert list(mood["legend"]) == ["1", "2", "3"] and 1.0 <= mood["score"] <= 3.0
    [other] = body["states"]
    assert other["answers"]["travel"]["noul"] < 0.5
    assert body["meta"]["numerics"] == "approximate"


def test_an_option_over_the_input_limit_fails_only_its_question(minilm):
    long = " ".join(["word"] * 400)
    body = minilm.answer(
        "decisions",
        {
            "state": "The parcel never arrived",
            "questions": {
                "long": {
                    "type": "choice",
                    "instructions": "Pick",
                    "criteria": {"a": long, "b": "x"},
                },
                "team": team_question("")["questions"]["team"],
            },
        },
    )
    assert body["answers"]["long"]["error"] == "max_length_exceeded"
    assert body["answers"]["long"]["message"].startswith(
        "an option is longer than this model reads (input has "
    )
    assert "options." not in body["answers"]["long"]["message"]
    assert body["answers"]["team"]["choice"] == "shipping"


def test_the_shipped_calibration_is_the_fit_of_the_shipped_labelled_set(minilm):
    measured = calibrate.measure(minilm.loaded.host, calibrate.read_labelled())
    fitted = calibrate.fit(measured)
    fitted["model"] = MINILM
    if os.environ.get("VLLM_SRUN_UPDATE_CALIBRATION"):
        CALIBRATION.write_text(json.dumps(fitted, indent=2) + "\n", encoding="utf-8")
    shipped = read_calibration()
    assert shipped["temperature"] == fitted["temperature"]
    assert shipped["noul_baseline"] == fitted["noul_baseline"]
    assert shipped["accuracy"] == fitted["accuracy"]
    # the accuracy the closing note reports; a change of method must not lose it silently
    assert fitted["accuracy"]["choice"] == 1.0
    assert fitted["accuracy"]["all"] >= 0.8


def test_qualifies_only_models_with_a_pooled_head():
    ext = SimilarityReadout()
    assert ext.qualifies({"surfaces": ["embeddings"], "embedding": {"dimensions": 8}}) is None
    assert "no embeddings" in ext.qualifies({"surfaces": ["classify"], "embedding": None})
    assert "pooled" in ext.qualifies({"surfaces": ["embeddings"], "embedding": None})


def test_the_extension_passes_the_conformance_kit_alone():
    report = check_plugin("similarity_readout")
    assert report.ok, report.to_text()


def test_a_classifier_gets_no_decisions(tmp_path):
    from tests.fixtures import write_task_package

    package = write_task_package(tmp_path / "seq", "bert", "sequence")
    model = load_model(package)
    assert not isinstance(model.loaded, ExtendedModel)
    assert "decisions" not in model.loaded.surfaces


def test_a_host_without_probe_rows_stays_unprobed_under_an_extension():
    from vllm_srun.extended import ExtendedModel
    from vllm_srun.loader import measure_batch_invariance

    class Host:
        surfaces = ("embeddings",)

        def card(self):
            return {"surfaces": ["embeddings"], "embedding": {"dimensions": 4}}

    host = Host()
    extended = ExtendedModel(host, [(SimilarityReadout(), object(), ("decisions",))])
    assert getattr(extended, "probe_items", None) is None
    assert measure_batch_invariance(extended)["cross_request_batching"] is False
