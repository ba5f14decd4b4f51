"""A tiny random-weight Laya-format checkpoint this family can always serve: its fixture.

The same files a Laya checkpoint holds (see :mod:`.checkpoint`): ``rl_agent_config.json``,
``model.safetensors`` (the encoder's tensors under ``encoder.``, the decision head's
beside them, stored in float16 as Laya's own ``save_checkpoint`` stores them),
``encoder/config.json`` (a 3-layer ModernBERT, width 128, whose local layers see 8
tokens either side, so short rows already meet the sliding window) and ``tokenizer/`` (a
byte-level BPE trained on a few sentences, with ``[CLS]``, ``[SEP]``, ``[MASK]``,
``[PAD]`` and ``[UNK]``). Written through transformers, tokenizers and safetensors,
seeded, so every run writes the same bytes; the laya package is not needed (the test
suite writes the same format through it, ``tests/families/laya_reference.py``, and
checks both agree).

The pieces are public so that a second writer can reuse them: :func:`write_tokenizer`,
:func:`encoder_config` and :func:`agent_config`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURE_TEXT = (
    "State: My card was charged twice for the same order, and the parcel never arrived.",
    "choice question: Which team should handle this? billing shipping technical",
    "noul question: Is the customer angry? false: no, the statement does not hold",
    "true: yes, the statement holds. score question: How urgent is it? level 0: not urgent",
    "level 1: soon level 2: today level 3: now. Payments, charges, refunds and invoices.",
    '{"order": 42, "status": "late", "items": ["book", "lamp"]} Délai, café, 注文。',
)
"""What the fixture's tokenizer is trained on: the words the tests' questions use."""

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
"""The fixture tokenizer's special tokens, ids 0 to 4 in this order."""

FIXTURE_TEMPERATURES: dict[str, Any] = {
    "temperature": [1.3, 0.8, 2.0],
    "temperature_by_options": {"choice:3-5": 0.7, "score:3-5": 1.6, "choice:2": 0.2},
}
"""The fixture's temperatures (``[choice, score, noul]``, then per option-count bucket):
each type and bucket differ, and ``choice:2`` sits below the lowest temperature Laya
applies (0.5), so the clamp shows."""

FIXTURE_REQUEST: dict[str, Any] = {
    "state": "My card was charged twice for the same order",
    "questions": {
        "team": {
            "type": "choice",
            "instructions": "Which team should handle this?",
            "criteria": {
                "billing": "Payments, charges, refunds and invoices",
                "shipping": "Delivery, parcels and tracking",
                "technical": None,
            },
        },
        "angry": {"type": "noul", "instructions": "Is the customer angry?"},
        "urgency": {
            "type": "score",
            "instructions": "How urgent is it?",
            "levels": ["not urgent", "soon", "today", "now"],
        },
    },
}
"""A decisions request for the fixture: one question of each type."""


QKV_SCALE = 6.0
"""How much the fixture sharpens its encoder's attention (its query, key and value
projections times this): with the initial weights every option marker reads nearly the
same context, and the answers sit within 0.01 of uniform."""


def write_tokenizer(target: Path) -> Any:
    """Train and save the fixture's tokenizer in ``target``; returns the
    ``PreTrainedTokenizerFast`` (its ``tokenizer_class`` is ``PreTrainedTokenizerFast``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(FIXTURE_TEXT, trainer)
    pad, unk, cls, sep, mask = SPECIAL_TOKENS
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=pad,
        unk_token=unk,
        cls_token=cls,
        sep_token=sep,
        mask_token=mask,
        model_max_length=512,
    )
    target.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(target)
    return tokenizer


def encoder_config(vocab_size: int) -> Any:
    """The fixture's ModernBERT configuration (``transformers.ModernBertConfig``): width
    128, 3 layers (global attention every second, the others local over 16 tokens), 4
    attention heads; special-token ids as :data:`SPECIAL_TOKENS` numbers them."""
    from transformers import ModernBertConfig

    return ModernBertConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=192,
        num_hidden_layers=3,
        num_attention_heads=4,
        global_attn_every_n_layers=2,
        local_attention=16,
        max_position_embeddings=512,
        pad_token_id=0,
        cls_token_id=2,
        sep_token_id=3,
        bos_token_id=2,
        eos_token_id=3,
    )


def agent_config(layout: str = "sequential") -> dict[str, Any]:
    """The fixture's ``rl_agent_config.json``: 2 head layers, one act cost (so the act
    head has two outputs, as in a trained checkpoint), Laya's default budgets (512 tokens,
    192 for the question), :data:`FIXTURE_TEMPERATURES` and the option ``layout``."""
    return {
        "encoder": "answerdotai/ModernBERT-base",
        "head_layers": 2,
        "act_costs": {"ask": 0.1},
        "max_len": 512,
        "head_max_len": 192,
        "amp_dtype": "bf16",
        "option_layout": layout,
        **json.loads(json.dumps(FIXTURE_TEMPERATURES)),
    }


def head_tensors(width: int, head_layers: int, actions: int, seed: int) -> dict[str, Any]:
    """Random float32 tensors of a Laya decision head of ``width`` (the names and shapes
    of :mod:`.checkpoint`), seeded; scaled so that option logits differ by a few units."""
    import torch

    generator = torch.Generator().manual_seed(seed)

    def random(*shape: int, scale: float = 0.08) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * scale

    tensors: dict[str, torch.Tensor] = {"temperature": torch.ones(3)}
    for layer in range(head_layers):
        prefix = f"head.layers.{layer}."
        tensors |= {
            prefix + "self_attn.in_proj_weight": random(3 * width, width, scale=0.15),
            prefix + "self_attn.in_proj_bias": random(3 * width),
            prefix + "self_attn.out_proj.weight": random(width, width),
            prefix + "self_attn.out_proj.bias": random(width),
            prefix + "linear1.weight": random(4 * width, width),
            prefix + "linear1.bias": random(4 * width),
            prefix + "linear2.weight": random(width, 4 * width),
            prefix + "linear2.bias": random(width),
            prefix + "norm1.weight": 1 + random(width),
            prefix + "norm1.bias": random(width),
            prefix + "norm2.weight": 1 + random(width),
            prefix + "norm2.bias": random(width),
        }
    tensors |= {
        "type_emb.weight": random(3, width, scale=0.5),
        "scorer.0.weight": 1 + random(width),
        "scorer.0.bias": random(width),
        "scorer.1.weight": random(width, width, scale=0.1),
        "scorer.1.bias": random(width),
        "scorer.3.weight": random(1, width, scale=0.3),
        "scorer.3.bias": random(1),
        "act_head.0.weight": random(256, width + 4),
        "act_head.0.bias": random(256),
        "act_head.2.weight": random(actions, 256),
        "act_head.2.bias": random(actions),
    }
    return tensors


def write_fixture(root: Path, layout: str = "sequential") -> Path:
    """Write the fixture checkpoint under ``root`` (``laya-fixture-<layout>``); returns
    its directory.

    Raises:
        ValueError: ``layout`` is not ``sequential`` or ``parallel``.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import ModernBertModel

    if layout not in ("sequential", "parallel"):
        raise ValueError(f"layout must be sequential or parallel, not {layout!r}")
    target = root / f"laya-fixture-{layout}"
    tokenizer = write_tokenizer(target / "tokenizer")
    config = encoder_config(len(tokenizer))
    torch.manual_seed(0)
    encoder = ModernBertModel(config)
    with torch.no_grad():  # sharper attention than the initial weights': options then differ
        for name, parameter in encoder.named_parameters():
            if name.endswith("attn.Wqkv.weight"):
                parameter.mul_(QKV_SCALE)
    config.save_pretrained(target / "encoder")
    settings = agent_config(layout)
    tensors = {f"encoder.{k}": v for k, v in encoder.state_dict().items()}
    tensors |= head_tensors(config.hidden_size, settings["head_layers"], 2, seed=1)
    save_file(
        {k: v.detach().half().contiguous() for k, v in tensors.items()},
        str(target / "model.safetensors"),
    )
    (target / "rl_agent_config.json").write_text(json.dumps(settings, indent=2) + "\n")
    return target
