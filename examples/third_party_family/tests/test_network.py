"""NanoGuard's network: rotary embeddings, pooling, and the checkpoint's names and shapes."""

from __future__ import annotations

import math

import torch
from vllm_srun_nanoguard.fixture import FIXTURE_CONFIG
from vllm_srun_nanoguard.network import NanoGuardNetwork, NetworkConfig, rotary_tables, rotate

RELEASED = NetworkConfig(
    sequence_len=512, vocab_size=8192, n_layer=4, n_head=4, n_embd=512, num_classes=2
)


def test_rotary_tables_are_bfloat16_rounded_angles():
    cos, sin = rotary_tables(4, 8)
    assert cos.shape == sin.shape == (4, 4)
    # position 1, pair 1: angle 10000 ** (-2 / 8) = 0.1; cos 0.995004... rounds to 0.99609375
    assert cos[1, 1].item() == 0.99609375
    assert sin[1, 1].item() == torch.tensor(math.sin(0.1)).bfloat16().item()
    assert cos[0].tolist() == [1.0] * 4 and sin[0].tolist() == [0.0] * 4


def test_rotate_turns_pairs_of_channels_and_keeps_their_length():
    x = torch.tensor([[[[1.0, 0.0, 0.0, 2.0]]]])  # rows, tokens, heads, channels
    cos, sin = torch.tensor([[0.0, 1.0]]), torch.tensor([[1.0, 0.0]])
    # pair (0, 2): (1, 0) -> (1*0 + 0*1, 0*0 - 1*1); pair (1, 3): (0, 2) unchanged
    assert rotate(x, cos, sin).flatten().tolist() == [0.0, 0.0, -1.0, 2.0]


def test_parameter_names_and_shapes_are_the_released_checkpoints():
    shapes = {k: tuple(v.shape) for k, v in NanoGuardNetwork(RELEASED).state_dict().items()}
    assert len(shapes) == 31
    assert shapes["transformer.wte.weight"] == (8192, 512)
    assert shapes["transformer.h.3.mlp.c_fc.weight"] == (2048, 512)
    assert shapes["transformer.h.3.mlp.c_proj.weight"] == (512, 2048)
    assert shapes["resid_lambdas"] == shapes["x0_lambdas"] == (4,)
    assert shapes["cls_head.weight"] == (2, 512) and shapes["cls_head.bias"] == (2,)
    assert sum(math.prod(s) for s in shapes.values()) == 16_779_274


def test_pooling_reads_real_tokens_only_and_masked_keys_ignore_padding():
    torch.manual_seed(1)
    network = NanoGuardNetwork(FIXTURE_CONFIG).eval()
    ids = torch.tensor([[5, 6, 7, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 0, 0]])
    with torch.inference_mode():
        short = network(ids[:, :3], mask[:, :3], mask_keys=False)
        keys_masked = network(ids, mask, mask_keys=True)
        padding_attended = network(ids, mask, mask_keys=False)
    assert torch.allclose(short, keys_masked, atol=1e-6)
    assert (short - padding_attended).abs().max() > 1e-3  # the model reads its padding
