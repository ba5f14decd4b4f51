"""Tiny random-weight transformers fixtures, generated (never committed).

Each writes a package directory (``config.json`` + ``model.safetensors``) the
way ``save_pretrained`` does, seeded so every run writes the same weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

VOCAB = 120
SMALL = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
}

ENCODER_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "bert": ("BertConfig", {**SMALL, "max_position_embeddings": 64, "type_vocab_size": 2}),
    "roberta": ("RobertaConfig", {**SMALL, "max_position_embeddings": 66, "pad_token_id": 1}),
    "xlm-roberta": (
        "XLMRobertaConfig",
        {**SMALL, "max_position_embeddings": 66, "pad_token_id": 1},
    ),
    "distilbert": (
        "DistilBertConfig",
        {"dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 64, "max_position_embeddings": 64},
    ),
    "modernbert": (
        "ModernBertConfig",
        {**SMALL, "max_position_embeddings": 64, "pad_token_id": 0, "local_attention": 16},
    ),
    "deberta-v2": (
        "DebertaV2Config",
        {
            **SMALL,
            "max_position_embeddings": 64,
            "relative_attention": True,
            "position_buckets": 16,
            "pos_att_type": ["p2c", "c2p"],
        },
    ),
    "electra": ("ElectraConfig", {**SMALL, "embedding_size": 16, "max_position_embeddings": 64}),
}

TASK_AUTO_CLASSES = {
    "encoder": "AutoModel",
    "sequence_classification": "AutoModelForSequenceClassification",
    "token_classification": "AutoModelForTokenClassification",
}


def write_encoder(
    root: Path, model_type: str, task: str, num_labels: int = 3, seed: int = 0
) -> Path:
    """Write a tiny random ``model_type`` model for ``task`` under ``root``; returns its folder."""
    import transformers

    config_class, kwargs = ENCODER_CONFIGS[model_type]
    config = getattr(transformers, config_class)(vocab_size=VOCAB, num_labels=num_labels, **kwargs)
    torch.manual_seed(seed)
    model = getattr(transformers, TASK_AUTO_CLASSES[task]).from_config(config)
    target = root / f"{model_type}-{task}"
    model.save_pretrained(target, safe_serialization=True)
    return target


def padded_batch(lengths: list[int], pad_id: int = 0, seed: int = 1) -> dict[str, torch.Tensor]:
    """Right-padded random token rows of the given lengths (ids avoid ``pad_id``)."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, :length] = torch.randint(3, VOCAB, (length,), generator=generator)
        mask[row, :length] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
