"""The native engine's decoder path: bit for bit against transformers on the same batch,
left padding with explicit positions, a shared prefix, models without a pad token."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vllm_srun.engines.native import NativeDecoder, NativeEngine
from vllm_srun.plugins import DeviceInfo
from vllm_srun.plugins.spec import DecoderBatch, ModelSpec, decoder_positions

from ..fixtures import next_token_logits, write_decoder

CPU = DeviceInfo("cpu", None, "cpu", None, None, {})
DECODERS = ["qwen3", "llama", "gpt2"]


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    root = tmp_path_factory.mktemp("decoders")
    return {model_type: write_decoder(root, model_type) for model_type in DECODERS}


def decoder_spec(package):
    import json

    config = json.loads((package / "config.json").read_text())
    return ModelSpec(
        package=package,
        architecture=config["architectures"][0],
        model_type=config["model_type"],
        task="causal_lm",
        weights=("model.safetensors",),
    )


def left_padded(lengths, pad_id, seed=3, low=10, high=300):
    """Random rows of the given lengths, padded on the left with ``pad_id``."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, width - length :] = torch.randint(low, high, (length,), generator=generator)
        mask[row, width - length :] = 1
    return ids, mask


def reference_model(package):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        package, attn_implementation="eager"
    ).eval()


def test_decoder_positions_number_real_tokens_from_the_offset():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    assert decoder_positions(mask).tolist() == [
        [0, 0, 0, 1, 2],
        [0, 1, 2, 3, 4],
        [0, 0, 0, 0, 0],
    ]
    assert decoder_positions(mask, offset=7)[0].tolist() == [7, 7, 7, 8, 9]


@pytest.mark.parametrize("model_type", DECODERS)
def test_last_position_logits_equal_transformers_bit_for_bit(packages, model_type):
    package = packages[model_type]
    engine = NativeEngine()
    spec = decoder_spec(package)
    assert engine.supports(spec, CPU) is None
    loaded = engine.load(spec, CPU, {"attention": "eager"})
    assert isinstance(loaded, NativeDecoder)
    ids, mask = left_padded([9, 4, 6], pad_id=0)
    got = loaded.forward(DecoderBatch(ids, mask))
    model = reference_model(package)
    want = next_token_logits(model, ids, mask)
    assert got.dtype == torch.float32 and got.shape == (3, model.config.vocab_size)
    assert torch.equal(got, want)
    read = torch.tensor([[5, 9], [7, 3], [11, 2]])
    gathered = loaded.forward(DecoderBatch(ids, mask, read_ids=read))
    assert torch.equal(gathered, want.gather(1, read))


@pytest.mark.parametrize("model_type", DECODERS)
def test_padding_never_changes_a_row(packages, model_type):
    """Left padding with explicit positions: a row alone and padded agree within 1e-5,
    whatever id pads it (GPT-2 and the Llama fixture have no pad token)."""
    loaded = NativeEngine().load(decoder_spec(packages[model_type]), CPU, {})
    ids, mask = left_padded([12, 5], pad_id=0)
    batched = loaded.forward(DecoderBatch(ids, mask))
    other_pad = ids.masked_fill(mask == 0, 123)
    assert torch.equal(loaded.forward(DecoderBatch(other_pad, mask)), batched)
    alone = loaded.forward(DecoderBatch(ids[1:, -5:], mask[1:, -5:]))
    assert (alone[0] - batched[1]).abs().max() <= 1e-5


@pytest.mark.parametrize("model_type", DECODERS)
def test_shared_prefix_equals_the_unshared_rows(packages, model_type):
    package = packages[model_type]
    loaded = NativeEngine().load(decoder_spec(package), CPU, {})
    prefix = torch.arange(20, 37)
    suffix, mask = left_padded([6, 2, 4], pad_id=0)
    shared = loaded.forward(DecoderBatch(suffix, mask, prefix_ids=prefix))
    # The same rows written out in full: prefix, then each row's suffix right-aligned.
    full_ids = torch.cat([prefix.expand(3, -1), suffix], dim=1)
    full_mask = torch.cat([torch.ones(3, len(prefix), dtype=torch.long), mask], dim=1)
    model = reference_model(package)
    want = next_token_logits(model, full_ids, full_mask)
    assert (shared - want).abs().max() <= 1e-5
    # ... and each row alone, with no padding at all.
    for row in range(3):
        real = suffix[row][mask[row] == 1]
        alone_ids = torch.cat([prefix, real]).unsqueeze(0)
        with torch.inference_mode():
            alone = model(input_ids=alone_ids).logits[0, -1, :]
        assert (shared[row] - alone).abs().max() <= 1e-5


def test_supports_causal_lm_and_refuses_what_it_cannot_run(packages):
    engine = NativeEngine()
    spec = decoder_spec(packages["qwen3"])
    assert engine.supports(spec, CPU) is None
    assert "has no weights (*.safetensors or pytorch_model*.bin)" in engine.supports(
        dataclasses.replace(spec, weights=()), CPU
    )
    reason = engine.supports(dataclasses.replace(spec, model_type="distilbert"), CPU)
    assert reason.endswith("has no causal LM for model type 'distilbert'")


OTHER_DECODERS = {
    "mistral": ("MistralConfig", {"num_key_value_heads": 1}),
    "gemma": ("GemmaConfig", {"num_key_value_heads": 1, "head_dim": 16}),
    "gemma2": ("Gemma2Config", {"num_key_value_heads": 1, "head_dim": 16, "sliding_window": 8}),
    "phi": ("PhiConfig", {}),
    "phi3": ("Phi3Config", {"num_key_value_heads": 1, "pad_token_id": 0}),
}


@pytest.mark.parametrize("model_type", list(OTHER_DECODERS))
def test_other_architectures_bit_for_bit_and_with_a_prefix(tmp_path, model_type):
    """Mistral, Gemma (Gemma 2 with a sliding window shorter than the rows), Phi, Phi-3."""
    import transformers

    config_class, extra = OTHER_DECODERS[model_type]
    config = getattr(transformers, config_class)(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=256,
        **extra,
    )
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    spec = decoder_spec(tmp_path)
    loaded = NativeEngine().load(spec, CPU, {"attention": "eager"})
    ids, mask = left_padded([12, 7, 3], pad_id=0)
    model = reference_model(tmp_path)
    want = next_token_logits(model, ids, mask)
    assert torch.equal(loaded.forward(DecoderBatch(ids, mask)), want)
    prefix = torch.arange(40, 50)
    shared = loaded.forward(DecoderBatch(ids, mask, prefix_ids=prefix))
    full_ids = torch.cat([prefix.expand(3, -1), ids], dim=1)
    full_mask = torch.cat([torch.ones(3, 10, dtype=torch.long), mask], dim=1)
    unshared = next_token_logits(model, full_ids, full_mask)
    assert (shared - unshared).abs().max() <= 1e-5
