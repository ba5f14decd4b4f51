"""``max_speed`` quality, measured against ``exact`` (the task_heads family's basis for
serving it, and for never quantising to int8: see ``TaskHeadsFamily.describe``).

- MiniLM on a held-out corpus (``tests/data/heldout_sentences.txt``: 200 generated
  sentences from a seed no other test or benchmark uses): every cosine to ``exact``
  at least 0.999 and a mean top-10 neighbour overlap of at least 0.95.
- Rampart: the spans (labels, offsets, text) under ``max_speed`` equal ``exact``'s on
  the README's and the test suite's sentences.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vllm_srun.accelerators.cpu import bf16_support
from vllm_srun.compose.loader import LoadOptions, ServedModel, load_model

HELD_OUT = (Path(__file__).parent.parent / "data" / "heldout_sentences.txt").read_text().split("\n")
HELD_OUT = [line for line in HELD_OUT if line]

RAMPART_SENTENCES = [
    "Contact Dana Whitfield at dana.whitfield@example.org or 212-555-0147.",  # README
    "Reach Dana at dana.whitfield@example.org",  # README
    "A semantic router picks the model",  # README
    "I live at 42 Elm Street, Portland, OR 97201.",
    "👩‍💻 北京 café Contact Dana Whitfield at dana.whitfield@example.org or 212-555-0147.",
    "Call John Smith tomorrow.",
    "Please forward the invoice to accounts@example.com before Friday.",
    "My passport number is X12345678 and my card is 4111 1111 1111 1111.",
]


@pytest.fixture(scope="module")
def export_cache(tmp_path_factory: pytest.TempPathFactory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_SRUN_CACHE_DIR", str(tmp_path_factory.mktemp("export-cache")))
        yield


def _load(name: str, profile: str, engine: str = "auto") -> ServedModel:
    return load_model(name, LoadOptions(offline=True, profile=profile, engine=engine))


def _vectors(served: ServedModel, texts: list[str]) -> torch.Tensor:
    data = served.answer("embeddings", {"input": texts})["data"]
    return torch.tensor([item["embedding"] for item in data])


@pytest.fixture(scope="module")
def minilm_exact_vectors() -> torch.Tensor:
    return _vectors(_load("sentence-transformers/all-MiniLM-L6-v2", "exact"), HELD_OUT)


NATIVE_BF16 = bf16_support() == "bf16_native"


@pytest.mark.parametrize("engine", ["onnxruntime", "native"])
def test_minilm_max_speed_keeps_cosine_and_neighbours(export_cache, minilm_exact_vectors, engine):
    fast = _load("sentence-transformers/all-MiniLM-L6-v2", "max_speed", engine)
    card = fast.card()
    assert (card["engine"], card["profile"], card["numerics"]) == (
        engine,
        "max_speed",
        "approximate",
    )
    if engine == "onnxruntime":
        assert "max_speed" in str(fast.loaded.host.engine_model.graph)  # the fused graph
    else:  # SDPA, and bfloat16 where this CPU computes it natively
        assert card["attention"] == "sdpa"
        assert card["dtype"] == ("bfloat16" if NATIVE_BF16 else "float32")
    reference, measured = minilm_exact_vectors, _vectors(fast, HELD_OUT)
    assert len(HELD_OUT) == 200
    cosine = (reference * measured).sum(dim=1)
    assert float(cosine.min()) >= 0.999
    overlap = _top10_overlap(reference, measured)
    assert overlap >= 0.95
    assert float(cosine.min()) < 1.0 or overlap == 1.0  # measured, not the same graph twice


def test_minilm_max_speed_engine_follows_the_cpu(export_cache):
    """Under --engine auto, max_speed runs native bfloat16 where the CPU computes it
    natively (faster than the fused float32 graph), else the fused ONNX graph."""
    card = _load("sentence-transformers/all-MiniLM-L6-v2", "max_speed").card()
    if NATIVE_BF16:
        assert (card["engine"], card["dtype"]) == ("native", "bfloat16")
    else:
        assert card["engine"] == "onnxruntime"


def _top10_overlap(reference: torch.Tensor, measured: torch.Tensor) -> float:
    """Mean share of each sentence's 10 nearest neighbours (itself excluded) kept."""

    def neighbours(vectors: torch.Tensor) -> torch.Tensor:
        similarity = vectors @ vectors.T
        similarity.fill_diagonal_(-2.0)
        return similarity.topk(10, dim=1).indices

    ref, got = neighbours(reference), neighbours(measured)
    kept = [len(set(a.tolist()) & set(b.tolist())) / 10 for a, b in zip(ref, got, strict=True)]
    return sum(kept) / len(kept)


def test_rampart_max_speed_finds_the_same_spans(export_cache):
    exact = _load("arcjet/rampart-pii", "exact")
    fast = _load("arcjet/rampart-pii", "max_speed")
    assert fast.card()["numerics"] == "approximate"

    def spans(served: ServedModel) -> list[list[tuple[str, int, int, str]]]:
        results = served.answer("classify", {"input": RAMPART_SENTENCES})["results"]
        return [
            [(s["label"], s["start"], s["end"], s["text"]) for s in r["spans"]] for r in results
        ]

    found = spans(exact)
    assert found[0] == [
        ("GIVEN_NAME", 8, 12, "Dana"),
        ("SURNAME", 13, 22, "Whitfield"),
        ("EMAIL", 26, 52, "dana.whitfield@example.org"),
        ("PHONE", 56, 68, "212-555-0147"),
    ]
    assert spans(fast) == found
