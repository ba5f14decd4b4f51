"""A tiny random-weight package this family can always serve: its conformance fixture.

Written through transformers (a 1-layer BERT token classifier with BIO tags and
a small WordPiece vocabulary), seeded, so every run writes the same bytes. The
conformance kit runs it through the ``classify`` surface.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

FIXTURE_TAGS = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")
FIXTURE_WORDS = ["dana", "whitfield", "lives", "in", "new", "york", "and", "works", "in", "london"]
FIXTURE_REQUEST: dict[str, Any] = {
    "input": ["dana whitfield lives in new york", "works in london"],
    "options": {"threshold": 0.0},
}


def write_fixture(root: Path) -> Path:
    """Write the fixture package under ``root``; returns its directory."""
    import torch
    from transformers import BertConfig, BertForTokenClassification, BertTokenizerFast

    target = root / "task-heads-fixture"
    target.mkdir(parents=True, exist_ok=True)
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters, *("##" + c for c in letters)]
    vocab = list(dict.fromkeys([*vocab, *FIXTURE_WORDS]))
    (target / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizerFast(vocab_file=str(target / "vocab.txt"), model_max_length=64).save_pretrained(
        target
    )
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
        id2label=dict(enumerate(FIXTURE_TAGS)),
        label2id={tag: i for i, tag in enumerate(FIXTURE_TAGS)},
    )
    torch.manual_seed(0)
    BertForTokenClassification(config).save_pretrained(target, safe_serialization=True)
    return target
