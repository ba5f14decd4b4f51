"""The Laya decision head in numpy: from the encoder's hidden states to one logit per option.

The head (the ``laya`` package's ``DecisionModel`` after its encoder), for one question's
row of ``T`` real tokens and hidden states ``h`` ``[T, d]``:

1. ``h += type_emb[type]``: the question type's embedding, added at every token;
2. ``head_layers`` transformer layers, pre-norm, without position information (PyTorch's
   ``TransformerEncoderLayer(d, d // 64 heads, feed-forward 4d, norm_first=True)``, ReLU):
   ``h += attention(norm1(h))``, then ``h += linear2(relu(linear1(norm2(h))))``; attention
   reads every real token of the row (the padding is masked as keys);
3. at each option's marker: ``scorer = Linear(d, 1)(GELU(Linear(d, d)(LayerNorm(h))))``,
   GELU the exact (erf) one.

Layer norms use eps 1e-5 (PyTorch's default). Everything runs in float32 on one row at a
time (the row's real tokens only), so a row's logits depend on its own hidden states
alone, whatever else the engine's batch held. The last layer computes only the marker
rows' queries and feed-forward, which is all the scorer reads.

Weights are read from ``model.safetensors`` (float16 as stored, widened to float32 as the
package does when it loads them into its float32 model).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from .checkpoint import head_shapes

Array = npt.NDArray[np.float32]

EPS = 1e-5
"""Layer-norm epsilon of every norm in the head (PyTorch's ``LayerNorm`` default)."""

HEAD_WIDTH = 64
"""Width of one attention head: the package gives the head ``max(1, d // 64)`` heads."""

_erf = np.vectorize(math.erf, otypes=[np.float64])


def layer_norm(x: Array, weight: Array, bias: Array) -> Array:
    """LayerNorm over the last axis (biased variance, eps :data:`EPS`), float32."""
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    variance = (centred * centred).mean(axis=-1, keepdims=True)
    out: Array = centred / np.sqrt(variance + np.float32(EPS)) * weight + bias
    return out


def gelu(x: Array) -> Array:
    """The exact GELU, ``x * (1 + erf(x / sqrt 2)) / 2`` (erf in float64, result float32)."""
    out: Array = (0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))).astype(np.float32)
    return out


def softmax_rows(scores: Array) -> Array:
    """Softmax over the last axis, float32."""
    shifted = np.exp(scores - scores.max(axis=-1, keepdims=True))
    out: Array = shifted / shifted.sum(axis=-1, keepdims=True)
    return out


@dataclass(frozen=True)
class HeadLayer:
    """One transformer layer of the head (PyTorch's ``TransformerEncoderLayer`` tensors)."""

    in_proj: Array  # [3d, d]: query, key and value projections stacked
    in_bias: Array  # [3d]
    out_proj: Array  # [d, d]
    out_bias: Array  # [d]
    linear1: Array  # [4d, d]
    bias1: Array  # [4d]
    linear2: Array  # [d, 4d]
    bias2: Array  # [d]
    norm1: tuple[Array, Array]  # weight, bias [d]
    norm2: tuple[Array, Array]

    def __call__(self, x: Array, rows: npt.NDArray[np.intp] | None, heads: int) -> Array:
        """The layer on ``x`` ``[T, d]``; with ``rows``, only those rows' outputs
        ``[len(rows), d]`` (their queries read every token's keys and values)."""
        width = x.shape[-1]
        size = width // heads
        y = layer_norm(x, *self.norm1)
        keys = y @ self.in_proj[width : 2 * width].T + self.in_bias[width : 2 * width]
        values = y @ self.in_proj[2 * width :].T + self.in_bias[2 * width :]
        if rows is not None:
            x, y = x[rows], y[rows]
        queries = y @ self.in_proj[:width].T + self.in_bias[:width]
        q = queries.reshape(len(queries), heads, size).transpose(1, 0, 2)
        k = keys.reshape(len(keys), heads, size).transpose(1, 2, 0)
        v = values.reshape(len(values), heads, size).transpose(1, 0, 2)
        weights = softmax_rows((q @ k) * np.float32(1.0 / math.sqrt(size)))
        attended = (weights @ v).transpose(1, 0, 2).reshape(len(queries), width)
        x = x + (attended @ self.out_proj.T + self.out_bias)
        y = layer_norm(x, *self.norm2)
        hidden = np.maximum(y @ self.linear1.T + self.bias1, np.float32(0.0))
        out: Array = x + (hidden @ self.linear2.T + self.bias2)
        return out


@dataclass(frozen=True)
class DecisionHead:
    """The head's weights (float32) and its forward for one row.

    Attributes:
        layers: the transformer layers, in order.
        type_embedding: ``[3, d]``, one row per question type
            (:data:`.checkpoint.QUESTION_TYPES` order).
        scorer: LayerNorm weight and bias, first linear weight and bias, output linear
            weight ``[1, d]`` and bias ``[1]``.
    """

    layers: tuple[HeadLayer, ...]
    type_embedding: Array
    scorer: tuple[Array, Array, Array, Array, Array, Array]

    @property
    def width(self) -> int:
        """The hidden width ``d``."""
        return int(self.type_embedding.shape[1])

    @property
    def heads(self) -> int:
        """Attention heads per layer: ``max(1, d // 64)``."""
        return max(1, self.width // HEAD_WIDTH)

    def logits(self, hidden: Array, markers: tuple[int, ...], kind: int) -> Array:
        """One float32 logit per option.

        Args:
            hidden: the row's encoder output at its real tokens, float32 ``[T, d]``.
            markers: the option markers' positions (each below ``T``).
            kind: the question type's row of the type embedding.

        Returns:
            float32 ``[len(markers)]``.
        """
        x = np.ascontiguousarray(hidden, dtype=np.float32) + self.type_embedding[kind]
        at = np.asarray(markers, dtype=np.intp)
        for index, layer in enumerate(self.layers):
            last = index == len(self.layers) - 1
            x = layer(x, at if last else None, self.heads)
        chosen = x if self.layers else x[at]
        norm_w, norm_b, first_w, first_b, out_w, out_b = self.scorer
        y = gelu(layer_norm(chosen, norm_w, norm_b) @ first_w.T + first_b)
        scores: Array = (y @ out_w.T + out_b)[:, 0].astype(np.float32)
        return scores


def load_head(weights: Path, width: int, head_layers: int) -> DecisionHead:
    """Read the head's tensors from ``model.safetensors`` (numpy, no torch) as float32.

    Raises:
        KeyError, ValueError: a tensor is missing or misshapen (:func:`.checkpoint.check_tensors`
            reports these as package errors before a load).
    """
    from safetensors import safe_open

    shapes = head_shapes(width, head_layers)
    tensors: dict[str, Array] = {}
    with safe_open(str(weights), "np") as handle:
        for name, shape in shapes.items():
            value = np.ascontiguousarray(handle.get_tensor(name), dtype=np.float32)
            if value.shape != shape:
                raise ValueError(f"{name} is {list(value.shape)}, not {list(shape)}")
            tensors[name] = value

    def layer(index: int) -> HeadLayer:
        p = f"head.layers.{index}."
        return HeadLayer(
            in_proj=tensors[p + "self_attn.in_proj_weight"],
            in_bias=tensors[p + "self_attn.in_proj_bias"],
            out_proj=tensors[p + "self_attn.out_proj.weight"],
            out_bias=tensors[p + "self_attn.out_proj.bias"],
            linear1=tensors[p + "linear1.weight"],
            bias1=tensors[p + "linear1.bias"],
            linear2=tensors[p + "linear2.weight"],
            bias2=tensors[p + "linear2.bias"],
            norm1=(tensors[p + "norm1.weight"], tensors[p + "norm1.bias"]),
            norm2=(tensors[p + "norm2.weight"], tensors[p + "norm2.bias"]),
        )

    return DecisionHead(
        layers=tuple(layer(i) for i in range(head_layers)),
        type_embedding=tensors["type_emb.weight"],
        scorer=(
            tensors["scorer.0.weight"],
            tensors["scorer.0.bias"],
            tensors["scorer.1.weight"],
            tensors["scorer.1.bias"],
            tensors["scorer.3.weight"],
            tensors["scorer.3.bias"],
        ),
    )
