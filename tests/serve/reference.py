"""Independent answers for the HTTP tests: each fixture package run with ``transformers``
directly (its own tokenizer and model classes, eager attention, one text at a time), so a
served value is compared with something no runtime code computed.

- :func:`tokens`: the token count of a text (or text pair), special tokens included.
- :func:`embedding`: mean pooling over every token, L2-normalised; with ``dimensions`` the
  first components, normalised again (Matryoshka); with ``max_tokens`` the first tokens.
- :func:`probabilities`: softmax over a sequence head's logits.
- :func:`scores`: sigmoid of a multi-label head's logits.
- :func:`relevance`: a cross-encoder's one logit and its sigmoid.
- :func:`token_tags`: a token head's tag distribution per content token, with the token's
  code-point offsets.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import torch

TOLERANCE = 1e-5
"""How far a served number may be from the reference: DESIGN §6's batch-invariance bound."""


@functools.cache
def _tokenizer(package: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(package)


@functools.cache
def _model(package: str, kind: str) -> Any:
    import transformers

    auto = getattr(transformers, kind)
    return auto.from_pretrained(package, attn_implementation="eager").eval()


def ids(package: Path, text: str, pair: str | None = None, max_tokens: int | None = None):
    """The input ids of ``text`` (and ``pair``), truncated to ``max_tokens`` when given."""
    truncation = {"truncation": True, "max_length": max_tokens} if max_tokens else {}
    return _tokenizer(str(package))(text, pair, **truncation)["input_ids"]


def tokens(package: Path, text: str, pair: str | None = None) -> int:
    return len(ids(package, text, pair))


def _logits(package: Path, text: str, pair: str | None = None) -> torch.Tensor:
    encoded = _tokenizer(str(package))(text, pair, return_tensors="pt")
    model = _model(str(package), "AutoModelForSequenceClassification")
    with torch.inference_mode():
        return model(**encoded).logits[0]


def embedding(
    package: Path, text: str, dimensions: int | None = None, max_tokens: int | None = None
) -> list[float]:
    row = torch.tensor([ids(package, text, max_tokens=max_tokens)])
    model = _model(str(package), "AutoModel")
    with torch.inference_mode():
        hidden = model(input_ids=row, token_type_ids=torch.zeros_like(row)).last_hidden_state[0]
    vector = hidden.mean(dim=0)
    vector = vector / vector.norm()
    if dimensions is not None:
        vector = vector[:dimensions] / vector[:dimensions].norm()
    return [float(v) for v in vector]


def probabilities(package: Path, text: str, pair: str | None = None) -> list[float]:
    return [float(v) for v in torch.softmax(_logits(package, text, pair), dim=-1)]


def scores(package: Path, text: str) -> list[float]:
    return [float(v) for v in torch.sigmoid(_logits(package, text))]


def relevance(package: Path, query: str, document: str) -> tuple[float, float]:
    """``(relevance_score, logit)`` of a cross-encoder for one query and document."""
    logit = float(_logits(package, query, document)[0])
    return 1 / (1 + math.exp(-logit)), logit


def token_tags(package: Path, text: str) -> list[tuple[int, int, list[float]]]:
    """``(start, end, softmax over the tags)`` of every content token of ``text`` (special
    tokens left out), ``start``/``end`` the token's code-point offsets."""
    encoded = _tokenizer(str(package))(
        text, return_tensors="pt", return_offsets_mapping=True, return_special_tokens_mask=True
    )
    offsets = encoded.pop("offset_mapping")[0].tolist()
    special = encoded.pop("special_tokens_mask")[0].tolist()
    model = _model(str(package), "AutoModelForTokenClassification")
    with torch.inference_mode():
        logits = model(**encoded).logits[0]
    rows = torch.softmax(logits, dim=-1)
    return [
        (int(start), int(end), [float(v) for v in rows[i]])
        for i, ((start, end), s) in enumerate(zip(offsets, special, strict=True))
        if not s
    ]


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def close(got: list[float], want: list[float], tolerance: float = TOLERANCE) -> bool:
    """Same length and every component within ``tolerance``."""
    return len(got) == len(want) and all(
        abs(g - w) <= tolerance for g, w in zip(got, want, strict=True)
    )
