"""A tiny random-weight decoder this family can always serve: its conformance fixture.

Written through transformers and tokenizers (a 2-layer Qwen3 with a byte-level
BPE trained on a few sentences and a ChatML chat template), seeded, so every
run writes the same bytes. The conformance kit runs it through ``decisions``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

FIXTURE_TEXT = [
    "State: My card was charged twice for the same order. The parcel never arrived.",
    "Question: Which team should handle this? Is it urgent? Reply with one of: A, B, C.",
    "Options: billing shipping technical yes no 1 2 3 4 5",
]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
FIXTURE_REQUEST: dict[str, Any] = {
    "state": "My card was charged twice for the same order",
    "questions": {
        "team": {
            "type": "choice",
            "instructions": "Which team should handle this?",
            "criteria": {
                "billing": "Payments, charges, refunds and invoices",
                "shipping": "Delivery, parcels and tracking",
                "technical": "Bugs, errors, crashes and login problems",
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


def write_fixture(root: Path) -> Path:
    """Write the fixture package under ``root``; returns its directory."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    target = root / "causal-readout-fixture"
    target.mkdir(parents=True, exist_ok=True)
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(FIXTURE_TEXT, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(target)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(target, safe_serialization=True)
    return target
