"""A fixture decision model's golden reference: recorded here, then checked at warm-up.

The same path as the built-in encoders': ``vllm_srun.compose.golden.record`` writes the
answers under this machine's first reference key, the runtime's warming step
compares them at the device-class tolerance, and a changed answer fails the
model with the operator reason.
"""

from __future__ import annotations

import dataclasses
import json

from vllm_srun.compose.golden import record, reference_keys
from vllm_srun.compose.loader import LoadOptions, load_model
from vllm_srun.plugins import read_reference_file

from ..fixtures import write_decoder
from .conftest import make_client

IDENTITY = "fixture/qwen3-decisions"
REQUESTS = [
    {
        "surface": "decisions",
        "body": {
            "state": {"ticket": "charged twice", "priority": "high"},
            "questions": {
                "team": {
                    "type": "choice",
                    "instructions": "Which team?",
                    "criteria": {"billing": "money", "shipping": "parcels", "tech": None},
                },
                "urgent": {"type": "noul", "instructions": "Is it urgent?"},
                "calm": {"type": "score", "instructions": "How calm?", "levels": ["no", "yes"]},
            },
        },
    }
]


def with_reference(catalog, reference):
    layers = {**catalog.layers}
    layers["golden_references"] = {**layers["golden_references"], reference.model: reference}
    return dataclasses.replace(catalog, layers=layers)


def serve(make_runtime, catalog, package, reference_path):
    reference = read_reference_file(reference_path)

    def loader(path, options, **kwargs):
        served = load_model(path, LoadOptions(name=options.name), catalog=catalog)
        return dataclasses.replace(served, identity=IDENTITY)

    from vllm_srun.config import ModelConfig

    runtime = make_runtime(
        models=[ModelConfig(model=str(package), name="decider")], loader=loader, load=False
    )
    runtime.catalog = with_reference(catalog, reference)
    runtime.start_loading().join(120)
    return runtime


def test_a_recorded_decision_reference_matches_at_warm_up_and_a_changed_one_fails(
    tmp_path, make_runtime, catalog
):
    package = write_decoder(tmp_path / "pkg", "qwen3", seed=3)
    path = tmp_path / "golden.json"
    path.write_text(
        json.dumps({"model": IDENTITY, "requests": REQUESTS, "tolerances": {"cpu": 1e-5}})
    )
    served = load_model(package, catalog=catalog)
    recorded = record(served, with_reference(catalog, read_reference_file(path)), IDENTITY, path)
    key = reference_keys(served)[0]
    assert recorded.key == key and recorded.answers == 1

    runtime = serve(make_runtime, catalog, package, path)
    state = runtime.models["decider"]
    assert (state.status, state.reason) == ("ready", None)
    [card] = make_client(runtime).get("/v1/models").json()["data"]
    assert card["golden"] == {
        "status": "matched",
        "checked": 1,
        "matched": 1,
        "reference": key,
    }
    # the rest of its 2.3 card: a decision model's modalities and limits
    assert card["ready"] is True and card["accelerator_validated"] is True
    assert card["modalities"] == ["text"] and card["presets"] == []
    assert card["limits"] == {
        "max_input_tokens": 512,
        "max_model_len": None,
        "model_max_tokens": 512,
        "min_options": 2,
        "max_options": 255,
        "min_levels": 2,
        "max_levels": 10,
    }
    assert (card["heads"], card["embedding"], card["rerank"]) == ([], None, None)
    assert [(p["group"], p["name"]) for p in card["plugins"]] == [
        ("family", "causal_readout"),
        ("engine", "native"),
        ("accelerator", "cpu"),
        ("kernel", "attention.eager"),
    ]
    assert card["plugins"][0]["capabilities"] == {"surfaces": ["decisions"]}

    document = json.loads(path.read_text())
    answers = document["answers"][key][0]["answers"]
    answers["urgent"]["noul"] += 0.001
    path.write_text(json.dumps(document))
    runtime = serve(make_runtime, catalog, package, path)
    state = runtime.models["decider"]
    assert state.status == "failed"
    assert state.reason.startswith(f"golden self-check failed against {key}: request 1 (decisions)")
    assert "answers.urgent.noul" in state.reason


def test_a_max_model_len_below_the_golden_questions_says_so(tmp_path, catalog):
    from vllm_srun.compose.golden import check

    package = write_decoder(tmp_path / "pkg", "qwen3", seed=3)
    served = load_model(package, LoadOptions(max_model_len=24), catalog=catalog)
    result = check(served, catalog)
    assert result.status == "failed"
    assert result.reason.startswith(
        "golden answers are malformed; max_model_len 24 may be below what the model's own "
        "check questions need"
    )
    assert result.reason.endswith("raise max_model_len")
