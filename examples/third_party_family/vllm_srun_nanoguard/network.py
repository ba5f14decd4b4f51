"""NanoGuard's network in PyTorch, written from its checkpoint's shapes and its description.

The published description: a bidirectional transformer (4 layers at the released
size) with rotary position embeddings, QK-norm, a squared-ReLU MLP, masked mean
pooling, a LayerNorm and a linear head over ``safe`` / ``injection``. The
checkpoint (``model.pt``) adds what the description leaves out, and its tensor
names fix the parameter layout:

- ``transformer.wte.weight`` ``[vocab, width]`` (bfloat16 in the file, served in
  float32 like the package's own scanner does);
- per block ``attn.c_q``, ``c_k``, ``c_v``, ``c_proj`` ``[width, width]`` and
  ``mlp.c_fc`` ``[4 * width, width]``, ``mlp.c_proj`` ``[width, 4 * width]``, all
  without biases;
- ``resid_lambdas`` and ``x0_lambdas`` ``[layers]``: each block reads
  ``resid_lambdas[i] * x + x0_lambdas[i] * x0``, where ``x0`` is the normalised
  token embedding;
- ``cls_norm`` (a LayerNorm with weight and bias) and ``cls_head`` ``[labels, width]``.

Numerical details that decide agreement with the package's scanner (read from its
source as facts): every normalisation but ``cls_norm`` is an RMS norm without a
weight (:func:`torch.nn.functional.rms_norm`, default epsilon); rotary angles use
base 10000 and their cosines and sines are rounded to bfloat16 before use; the
rotation pairs channel ``j`` with ``j + head_dim / 2``; QK-norm follows the
rotation; attention is :func:`torch.nn.functional.scaled_dot_product_attention`
with its default scale ``1 / sqrt(head_dim)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

ROTARY_BASE = 10000.0
"""The rotary embeddings' base (RoFormer's, Su et al. 2021)."""


@dataclass(frozen=True)
class NetworkConfig:
    """The checkpoint's ``config`` entry, the hyperparameters the weights do not show.

    Attributes:
        sequence_len: positions the model was trained at (512 released); the rotary
            table covers twice that, as the package's own does.
        vocab_size: rows of the token embedding.
        n_layer: transformer blocks.
        n_head: attention heads (``n_kv_head`` must equal it: no grouped queries here).
        n_embd: the residual width.
        num_classes: logits the head returns.
    """

    sequence_len: int
    vocab_size: int
    n_layer: int
    n_head: int
    n_embd: int
    num_classes: int

    @property
    def head_dim(self) -> int:
        """Channels per head: ``n_embd // n_head``."""
        return self.n_embd // self.n_head


def rms(x: torch.Tensor) -> torch.Tensor:
    """RMS norm over the last dimension, without a learned weight."""
    return F.rms_norm(x, (x.size(-1),))


def rotary_tables(positions: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine and sine of the rotary angles, ``[positions, head_dim / 2]`` each.

    Angle ``t * base ** (-2j / head_dim)`` for position ``t`` and pair ``j``,
    computed in float32 and rounded to bfloat16 (the precision the model was
    trained with), returned as float32 holding those bfloat16 values.
    """
    inverse = 1.0 / ROTARY_BASE ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(positions, dtype=torch.float32), inverse)
    return angles.cos().bfloat16().float(), angles.sin().bfloat16().float()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs ``(j, j + d/2)`` of ``x`` ``[rows, tokens, heads, d]``.

    ``cos`` and ``sin`` are ``[tokens, d/2]``; the first half becomes
    ``a cos + b sin`` and the second ``b cos - a sin``.
    """
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([a * cos + b * sin, b * cos - a * sin], dim=-1)


class Attention(nn.Module):
    """Bidirectional multi-head self-attention with rotary embeddings and QK-norm."""

    def __init__(self, config: NetworkConfig) -> None:
        super().__init__()
        width = config.n_embd
        self.heads = config.n_head
        self.c_q = nn.Linear(width, width, bias=False)
        self.c_k = nn.Linear(width, width, bias=False)
        self.c_v = nn.Linear(width, width, bias=False)
        self.c_proj = nn.Linear(width, width, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        keys: torch.Tensor | None,
    ) -> torch.Tensor:
        """``x`` ``[rows, tokens, width]``; ``keys`` a bool ``[rows, 1, 1, tokens]`` mask of
        the keys each query may read, or ``None`` for every key."""
        rows, tokens, width = x.shape
        shape = (rows, tokens, self.heads, width // self.heads)
        q = rms(rotate(self.c_q(x).view(shape), cos, sin)).transpose(1, 2)
        k = rms(rotate(self.c_k(x).view(shape), cos, sin)).transpose(1, 2)
        v = self.c_v(x).view(shape).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keys)
        return self.c_proj(y.transpose(1, 2).reshape(rows, tokens, width))  # type: ignore[no-any-return]


class Feedforward(nn.Module):
    """The MLP: ``c_proj(relu(c_fc(x)) ** 2)`` (squared ReLU, So et al. 2021, Primer)."""

    def __init__(self, config: NetworkConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[rows, tokens, width]`` to the same shape."""
        return self.c_proj(F.relu(self.c_fc(x)).square())  # type: ignore[no-any-return]


class Block(nn.Module):
    """Pre-norm residual block: attention, then the MLP."""

    def __init__(self, config: NetworkConfig) -> None:
        super().__init__()
        self.attn = Attention(config)
        self.mlp = Feedforward(config)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor | None
    ) -> torch.Tensor:
        """``[rows, tokens, width]`` to the same shape."""
        x = x + self.attn(rms(x), cos, sin, keys)
        return x + self.mlp(rms(x))  # type: ignore[no-any-return]


class NanoGuardNetwork(nn.Module):
    """The whole classifier: token ids to ``[rows, num_classes]`` logits.

    Its ``state_dict`` keys are the checkpoint's ``model_state_dict`` keys, so
    ``load_state_dict(strict=True)`` checks every name and shape.
    """

    cos: torch.Tensor  # [2 * sequence_len, head_dim / 2], buffers not in the state dict
    sin: torch.Tensor

    def __init__(self, config: NetworkConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(config.vocab_size, config.n_embd),
                "h": nn.ModuleList(Block(config) for _ in range(config.n_layer)),
            }
        )
        self.resid_lambdas = nn.Parameter(torch.ones(config.n_layer))
        self.x0_lambdas = nn.Parameter(torch.zeros(config.n_layer))
        self.cls_norm = nn.LayerNorm(config.n_embd)
        self.cls_head = nn.Linear(config.n_embd, config.num_classes)
        cos, sin = rotary_tables(2 * config.sequence_len, config.head_dim)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, mask_keys: bool
    ) -> torch.Tensor:
        """Logits of each row.

        Args:
            input_ids: int64 ``[rows, tokens]``, right-padded.
            attention_mask: ``[rows, tokens]``, 1 for real tokens: the mean pooling
                reads those only.
            mask_keys: also hide padding from attention. ``False`` lets every token
                attend to every position, padding included, as the model was trained
                and as its scanner runs it (rows padded to ``sequence_len``).

        Returns:
            float32 ``[rows, num_classes]``.
        """
        tokens = input_ids.shape[1]
        cos = self.cos[:tokens].to(self.cls_head.weight.dtype)
        sin = self.sin[:tokens].to(self.cls_head.weight.dtype)
        real = attention_mask.bool()
        keys = real[:, None, None, :] if mask_keys else None
        parts = self.transformer
        embed, blocks = cast(nn.Embedding, parts["wte"]), cast(nn.ModuleList, parts["h"])
        x0 = rms(embed(input_ids))
        x = x0
        for i, block in enumerate(blocks):
            x = block(self.resid_lambdas[i] * x + self.x0_lambdas[i] * x0, cos, sin, keys)
        x = rms(x)
        weights = real.unsqueeze(-1).to(x.dtype)
        pooled = (x * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)
        return self.cls_head(self.cls_norm(pooled)).float()  # type: ignore[no-any-return]
