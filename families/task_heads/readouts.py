"""Readouts: engine outputs of one input's rows to the numbers a head answers with.

Every function takes float32 numpy arrays of one input (its rows already trimmed
to their real length) and returns float32 arrays. Each reduces over one row's own
data only (its tokens, its labels), in an order fixed by that row's shape, so a row's
readout is the same bits alone and in any batch whenever its engine output is.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from vllm_srun.plugins.windows import most_central

Floats = npt.NDArray[np.float32]
"""A float32 numpy array."""

NORM_EPS = np.float32(1e-12)
"""The smallest norm :func:`l2_normalize` divides by (``torch.nn.functional.normalize``'s)."""


def pool(hidden: Floats, mode: str) -> Floats:
    """One embedding ``[hidden]`` from a row's hidden states ``[tokens, hidden]``.

    Modes follow sentence-transformers' Pooling module: ``mean`` over every
    token of the row (special tokens included, padding already trimmed; zeros
    for a row of no tokens), ``cls`` the first token, ``lasttoken`` the last,
    ``max`` the per-dimension maximum.

    Raises:
        ValueError: unknown ``mode``.
    """
    if mode == "mean":
        total: Floats = hidden.sum(axis=0, dtype=np.float32)
        return total / np.float32(max(hidden.shape[0], 1))
    if mode == "cls":
        first: Floats = hidden[0]
        return first
    if mode == "lasttoken":
        last: Floats = hidden[-1]
        return last
    if mode == "max":
        most: Floats = hidden.max(axis=0)
        return most
    raise ValueError(f"unknown pooling mode {mode!r}")


def l2_normalize(vector: Floats) -> Floats:
    """``vector / max(||vector||_2, 1e-12)`` in float32, as
    ``torch.nn.functional.normalize(vector, dim=0)`` computes it (a zero vector stays zero)."""
    norm = np.sqrt(np.sum(vector * vector, dtype=np.float32))
    unit: Floats = vector / np.maximum(norm, NORM_EPS)
    return unit


def merge_pooled(embeddings: list[Floats], weights: list[int]) -> Floats:
    """Windows' embeddings to one: the mean weighted by each window's content tokens
    (a weight below 1 counts as 1)."""
    if len(embeddings) == 1:
        return embeddings[0]
    w = np.maximum(np.asarray(weights, dtype=np.float32), np.float32(1))
    stacked = np.stack(embeddings)
    merged: Floats = (stacked * w[:, None]).sum(axis=0, dtype=np.float32) / w.sum()
    return merged


def finish_embedding(vector: Floats, normalize: bool, dimensions: int | None) -> Floats:
    """L2-normalise (when the model does, :func:`l2_normalize`), keep the first
    ``dimensions`` (Matryoshka) and normalise again, so a shortened embedding of a
    normalised model is a unit vector."""
    if normalize:
        vector = l2_normalize(vector)
    if dimensions is not None and dimensions < vector.shape[0]:
        vector = vector[:dimensions]
        if normalize:
            vector = l2_normalize(vector)
    return vector


def softmax(logits: Floats) -> Floats:
    """Softmax over the last axis in float32: ``exp(x - max) / sum(exp(x - max))``."""
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probabilities: Floats = shifted / shifted.sum(axis=-1, keepdims=True, dtype=np.float32)
    return probabilities


def sigmoid(logits: Floats) -> Floats:
    """The logistic sigmoid ``1 / (1 + exp(-x))`` elementwise in float32 (0 where
    ``exp(-x)`` overflows)."""
    with np.errstate(over="ignore"):
        scores: Floats = np.float32(1) / (np.float32(1) + np.exp(-logits))
    return scores


def label_scores(rows: list[Floats], kind: str) -> Floats:
    """``[labels]`` from each window's logits ``[labels]``: softmax (``sequence``) or
    sigmoid (``scores``) per window, then the maximum per label over windows.

    The window maximum of a softmax is not renormalised: with several windows
    the probabilities may sum above 1, and each says how strongly some part of
    the input carries that label.
    """
    read = softmax if kind == "sequence" else sigmoid
    best: Floats = np.stack([read(r) for r in rows]).max(axis=0)
    return best


def token_probabilities(
    rows: list[Floats],
    row_content: list[list[int]],
    windows: list[tuple[int, int]],
    content_tokens: int,
) -> Floats:
    """``[content tokens, tags]`` BIO probabilities for the whole first text.

    Each window row's logits ``[row tokens, tags]`` are softmaxed; each content
    token takes its probabilities from the window where it sits most centrally.
    """
    tags = rows[0].shape[-1]
    if content_tokens == 0:
        return np.zeros((0, tags), dtype=np.float32)
    chosen = most_central(windows, content_tokens)
    per_row = [softmax(r) for r in rows]
    out = np.empty((content_tokens, tags), dtype=np.float32)
    for index, w in enumerate(chosen):
        start = windows[w][0]
        out[index] = per_row[w][row_content[w][index - start]]
    return out


def label_probabilities(
    probabilities: Floats, tags: tuple[str, ...], labels: tuple[str, ...]
) -> Floats:
    """``[tokens, labels]`` from BIO tag probabilities ``[tokens, tags]``: each label's
    probability is ``P(B-label) + P(I-label)``, the chance the token belongs to an entity of
    that type (``O``, outside every entity, is ``1`` minus the row's sum).

    ``tags`` are the head's raw tags (``O``, ``B-TYPE``, ``I-TYPE``), ``labels`` its entity
    types in the order the response lists them.
    """
    column = {label: i for i, label in enumerate(labels)}
    out = np.zeros((probabilities.shape[0], len(labels)), dtype=np.float32)
    for row, tag in enumerate(tags):
        if tag != "O":
            out[:, column[tag[2:]]] += probabilities[:, row]
    return out
