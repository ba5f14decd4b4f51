"""Tiny random-weight transformers fixtures, generated (never committed).

Each writes a package directory (``config.json`` + ``model.safetensors``) the
way ``save_pretrained`` does, seeded so every run writes the same weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
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


def padded_batch(
    lengths: list[int], pad_id: int = 0, seed: int = 1
) -> dict[str, npt.NDArray[np.int64]]:
    """Right-padded random token rows of the given lengths (ids avoid ``pad_id``): the
    fields of an :class:`~vllm_srun.plugins.spec.EncoderBatch`, int64 numpy arrays."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, :length] = torch.randint(3, VOCAB, (length,), generator=generator)
        mask[row, :length] = 1
    return {
        "input_ids": ids.numpy(),
        "attention_mask": mask.numpy(),
        "token_type_ids": np.zeros_like(ids.numpy()),
    }


def torch_batch(batch: dict[str, npt.NDArray[np.int64]]) -> dict[str, torch.Tensor]:
    """A :func:`padded_batch` as torch tensors (sharing its memory): a transformers
    reference model's inputs."""
    return {name: torch.from_numpy(array) for name, array in batch.items()}


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


# -- decoders ---------------------------------------------------------------------------------
DECODER_CORPUS = [
    "State: My card was charged twice for the same order.",
    "State: The parcel never arrived. The app crashes when I log in.",
    "Question: Which team should handle this? Is the customer angry? How urgent is it?",
    "Options: billing shipping technical refund invoice delivery crash login",
    "Reply with one of: A, B, C, D. Answer: A Answer: B Answer: C",
    "yes no yes no Yes No true false yes no yes no",
    " yes no yes no 1 2 3 4 5 6 7 8 9 10 level score low high",
    '{"order": 42, "status": "late", "items": ["book", "lamp"]}',
]
"""Text the fixture tokenizers' byte-level BPE is trained on (every byte stays a token)."""

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""A ChatML chat template, the shape Qwen's tokenizers carry."""

DECODER_TOKENIZERS: dict[str, dict[str, Any]] = {
    # Qwen3: ChatML template, a pad token, no BOS.
    "qwen3": {
        "specials": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "eos": "<|im_end|>",
        "pad": "<|endoftext|>",
        "chat_template": CHATML_TEMPLATE,
    },
    # Llama: BOS added to every text, no pad token, no chat template (the plain template).
    "llama": {"specials": ["<s>", "</s>"], "bos": "<s>", "eos": "</s>", "add_bos": True},
    # GPT-2: one special token, no pad token, no chat template.
    "gpt2": {"specials": ["<|endoftext|>"], "bos": "<|endoftext|>", "eos": "<|endoftext|>"},
}

DECODER_SMALL = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "max_position_embeddings": 512,
}


def write_decoder_tokenizer(
    target: Path,
    specials: list[str],
    eos: str,
    bos: str | None = None,
    pad: str | None = None,
    chat_template: str | None = None,
    add_bos: bool = False,
    vocab_size: int = 400,
) -> Any:
    """Train a byte-level BPE on :data:`DECODER_CORPUS` and save it under ``target``.

    Returns the ``PreTrainedTokenizerFast``. Every byte is a token, so any text
    encodes; single letters and digits are one token each.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(DECODER_CORPUS * 4, trainer)
    if add_bos and bos is not None:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[(bos, tokenizer.token_to_id(bos))]
        )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=bos, eos_token=eos, pad_token=pad
    )
    if chat_template is not None:
        fast.chat_template = chat_template
    target.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(target)
    return fast


def write_decoder(
    root: Path,
    model_type: str,
    *,
    seed: int = 0,
    chat_template: str | bool | None = True,
    calibration: dict[str, Any] | None = None,
    name: str | None = None,
) -> Path:
    """A tiny random-weight decoder package (``qwen3``, ``llama`` or ``gpt2``) with its tokenizer.

    ``chat_template`` True keeps the model type's default (ChatML for Qwen3,
    none for the others), False/None drops it, a string sets it.
    ``calibration`` is written as ``calibration.json``.
    """
    import json

    import transformers

    tok_kwargs = dict(DECODER_TOKENIZERS[model_type])
    if chat_template is not True:
        tok_kwargs["chat_template"] = chat_template or None
    target = root / (name or f"{model_type}-decoder")
    tokenizer = write_decoder_tokenizer(target, **tok_kwargs)
    ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    vocab = len(tokenizer)
    if model_type == "qwen3":
        config: Any = transformers.Qwen3Config(
            vocab_size=vocab, num_key_value_heads=1, head_dim=16, **DECODER_SMALL, **ids
        )
    elif model_type == "llama":
        config = transformers.LlamaConfig(
            vocab_size=vocab, num_key_value_heads=1, **DECODER_SMALL, **ids
        )
    else:
        config = transformers.GPT2Config(
            vocab_size=vocab, n_embd=32, n_layer=2, n_head=2, n_positions=512, **ids
        )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(target, safe_serialization=True)
    if calibration is not None:
        (target / "calibration.json").write_text(json.dumps(calibration))
    return target


def next_token_logits(model, input_ids, attention_mask):
    """The transformers reference for a decoder engine's forward: ``[rows, vocab]`` float32.

    It makes the call the native engine documents (explicit position ids from
    the left-padded mask, no KV cache, and only the last position through the
    LM head where the model accepts ``logits_to_keep``). The LM head's matmul
    rounds differently with the number of positions it is given on some CPUs
    (seen at 7e-8 on an AMD EPYC), so a reference computing every position's
    logits is not the same computation and cannot be compared bit for bit.
    """
    import inspect

    import torch

    from vllm_srun.plugins.spec import decoder_positions

    keep = (
        {"logits_to_keep": 1}
        if "logits_to_keep" in inspect.signature(model.forward).parameters
        else {}
    )
    with torch.inference_mode():
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=decoder_positions(attention_mask),
            use_cache=False,
            **keep,
        )
    return out.logits[:, -1, :].float()
