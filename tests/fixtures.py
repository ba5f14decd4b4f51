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


WORDS = [
    "the",
    "a",
    "an",
    "of",
    "to",
    "in",
    "and",
    "is",
    "was",
    "for",
    "on",
    "with",
    "as",
    "by",
    "at",
    "from",
    "it",
    "this",
    "that",
    "be",
    "are",
    "or",
    "not",
    "dana",
    "whitfield",
    "email",
    "phone",
    "street",
    "city",
    "new",
    "york",
    "london",
    "paris",
    "tokyo",
    "alice",
    "bob",
    "carol",
    "good",
    "bad",
    "great",
    "terrible",
    "love",
    "hate",
    "okay",
    "fine",
    "movie",
    "film",
    "book",
    "food",
    "service",
    "price",
    "query",
    "document",
    "search",
    "result",
    "relevant",
    "answer",
    "question",
    "model",
    "runtime",
    "router",
    "token",
    "span",
    "label",
    "score",
    "embed",
    "vector",
    "cosine",
    "window",
    "batch",
    "padding",
    "limit",
    "input",
    "output",
    "text",
]

HEAD_LABELS = {
    "sequence": ("negative", "neutral", "positive"),
    "scores": ("toxic", "insult", "threat"),
    "token": ("O", "B-PER", "I-PER", "B-LOC", "I-LOC"),
    "relevance": ("LABEL_0",),
}
ROBERTA_STYLE = ("roberta", "xlm-roberta")


def write_tokenizer(target: Path, model_type: str, model_max_length: int = 512) -> None:
    """A WordPiece tokenizer over :data:`WORDS` and single letters, at most :data:`VOCAB` ids.

    RoBERTa-style models get ``<s>``/``<pad>``/``</s>`` with the pad id 1 their
    configs assume; the others BERT's ``[CLS]``/``[PAD]``/``[SEP]`` with pad id 0.
    """
    from transformers import BertTokenizerFast

    if model_type in ROBERTA_STYLE:
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        names = {
            "cls_token": "<s>",
            "pad_token": "<pad>",
            "sep_token": "</s>",
            "unk_token": "<unk>",
            "mask_token": "<mask>",
        }
    else:
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        names = {}
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces = ["##" + c for c in letters] + list("0123456789.,@-!?")
    vocab = list(dict.fromkeys(specials + letters + pieces + list(WORDS)))[:VOCAB]
    target.mkdir(parents=True, exist_ok=True)
    (target / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizer = BertTokenizerFast(
        vocab_file=str(target / "vocab.txt"), model_max_length=model_max_length, **names
    )
    tokenizer.save_pretrained(target)


def write_task_package(root: Path, model_type: str, head: str, seed: int = 0) -> Path:
    """A complete tiny package (weights, tokenizer, head files) for ``head``.

    ``head`` is ``sequence``, ``scores`` (multi-label, with ``thresholds.json``),
    ``token`` (BIO tags), ``pooled`` (sentence-transformers files: mean pooling,
    Normalize, max_seq_length 48) or ``relevance`` (one-logit cross-encoder).
    """
    import json

    import transformers

    config_class, kwargs = ENCODER_CONFIGS[model_type]
    extra: dict[str, Any] = {}
    if head in HEAD_LABELS:
        labels = HEAD_LABELS[head]
        extra["id2label"] = dict(enumerate(labels))
        extra["label2id"] = {label: i for i, label in enumerate(labels)}
        extra["num_labels"] = len(labels)
    if head == "scores":
        extra["problem_type"] = "multi_label_classification"
    config = getattr(transformers, config_class)(vocab_size=VOCAB, **kwargs, **extra)
    task = {"token": "token_classification", "pooled": "encoder"}.get(
        head, "sequence_classification"
    )
    torch.manual_seed(seed)
    model = getattr(transformers, TASK_AUTO_CLASSES[task]).from_config(config)
    target = root / f"{model_type}-{head}"
    model.save_pretrained(target, safe_serialization=True)
    write_tokenizer(target, model_type)
    if head == "scores":
        (target / "thresholds.json").write_text(
            json.dumps({"toxic": 0.5, "insult": 0.4, "threat": 0.9})
        )
    if head == "pooled":
        (target / "modules.json").write_text(
            json.dumps(
                [
                    {
                        "idx": 0,
                        "name": "0",
                        "path": "",
                        "type": "sentence_transformers.models.Transformer",
                    },
                    {
                        "idx": 1,
                        "name": "1",
                        "path": "1_Pooling",
                        "type": "sentence_transformers.models.Pooling",
                    },
                    {
                        "idx": 2,
                        "name": "2",
                        "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize",
                    },
                ]
            )
        )
        (target / "1_Pooling").mkdir()
        (target / "1_Pooling" / "config.json").write_text(
            json.dumps(
                {
                    "word_embedding_dimension": config.hidden_size
                    if hasattr(config, "hidden_size")
                    else 32,
                    "pooling_mode_mean_tokens": True,
                    "pooling_mode_cls_token": False,
                    "pooling_mode_max_tokens": False,
                }
            )
        )
        (target / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 48}))
    return target


def spec_for(package: Path, task: str, **overrides: Any) -> Any:
    """The :class:`~vllm_srun.plugins.spec.ModelSpec` of a fixture package written by
    :func:`write_encoder` (safetensors weights), with ``overrides`` applied."""
    import json

    from vllm_srun.plugins.spec import ModelSpec

    config = json.loads((package / "config.json").read_text())
    fields = {"weights": ("model.safetensors",), **overrides}
    return ModelSpec(
        package=package,
        architecture=config["architectures"][0],
        model_type=config["model_type"],
        task=task,
        **fields,
    )
