"""Readouts: engine outputs of one input's rows to the numbers a head answers with.

Every function takes float32 CPU tensors of one input (its rows already
trimmed to their real length) and returns float32 tensors.
"""

from __future__ import annotations

import torch

from vllm_srun.plugins.windows import most_central


def pool(hidden: torch.Tensor, mode: str) -> torch.Tensor:
    """One embedding ``[hidden]`` from a row's hidden states ``[tokens, hidden]``.

    Modes follow sentence-transformers' Pooling module: ``mean`` over every
    token of the row (special tokens included, padding already trimmed),
    ``cls`` the first token, ``lasttoken`` the last, ``max`` the per-dimension
    maximum.

    Raises:
        ValueError: unknown ``mode``.
    """
    if mode == "mean":
        return hidden.sum(dim=0) / max(hidden.shape[0], 1)
    if mode == "cls":
        return hidden[0]
    if mode == "lasttoken":
        return hidden[-1]
    if mode == "max":
        return hidden.max(dim=0).values
    raise ValueError(f"unknown pooling mode {mode!r}")


def merge_pooled(embeddings: list[torch.Tensor], weights: list[int]) -> torch.Tensor:
    """Windows' embeddings to one: the mean weighted by each window's content tokens."""
    if len(embeddings) == 1:
        return embeddings[0]
    w = torch.tensor(weights, dtype=torch.float32).clamp(min=1)
    stacked = torch.stack(embeddings)
    return (stacked * w[:, None]).sum(dim=0) / w.sum()


def finish_embedding(vector: torch.Tensor, normalize: bool, dimensions: int | None) -> torch.Tensor:
    """L2-normalise (when the model does), keep the first ``dimensions`` (Matryoshka)
    and normalise again, so a shortened embedding of a normalised model is a unit vector."""
    if normalize:
        vector = torch.nn.functional.normalize(vector, dim=0)
    if dimensions is not None and dimensions < vector.shape[0]:
        vector = vector[:dimensions]
        if normalize:
            vector = torch.nn.functional.normalize(vector, dim=0)
    return vector


def label_scores(rows: list[torch.Tensor], kind: str) -> torch.Tensor:
    """``[labels]`` from each window's logits ``[labels]``: softmax (``sequence``) or
    sigmoid (``scores``) per window, then the maximum per label over windows.

    The window maximum of a softmax is not renormalised: with several windows
    the probabilities may sum above 1, and each says how strongly some part of
    the input carries that label.
    """
    if kind == "sequence":
        per_window = [torch.softmax(r, dim=-1) for r in rows]
    else:
        per_window = [torch.sigmoid(r) for r in rows]
    return torch.stack(per_window).max(dim=0).values


def token_probabilities(
    rows: list[torch.Tensor],
    row_content: list[list[int]],
    windows: list[tuple[int, int]],
    content_tokens: int,
) -> torch.Tensor:
    """``[content tokens, tags]`` BIO probabilities for the whole first text.

    Each window row's logits ``[row tokens, tags]`` are softmaxed; each content
    token takes its probabilities from the window where it sits most centrally.
    """
    chosen = most_central(windows, content_tokens)
    per_row = [torch.softmax(r, dim=-1) for r in rows]
    if content_tokens == 0:
        return torch.zeros((0, rows[0].shape[-1]), dtype=torch.float32)
    out = torch.empty((content_tokens, rows[0].shape[-1]), dtype=torch.float32)
    for index, w in enumerate(chosen):
        start = windows[w][0]
        out[index] = per_row[w][row_content[w][index - start]]
    return out


def label_probabilities(
    probabilities: torch.Tensor, tags: tuple[str, ...], labels: tuple[str, ...]
) -> torch.Tensor:
    """``[tokens, labels]`` from BIO tag probabilities ``[tokens, tags]``: each label's
    probability is ``P(B-label) + P(I-label)``, the chance the token belongs to an entity of
    that type (``O``, outside every entity, is ``1`` minus the row's sum).

    ``tags`` are the head's raw tags (``O``, ``B-TYPE``, ``I-TYPE``), ``labels`` its entity
    types in the order the response lists them.
    """
    column = {label: i for i, label in enumerate(labels)}
    mapping = torch.zeros((len(tags), len(labels)), dtype=torch.float32)
    for row, tag in enumerate(tags):
        if tag != "O":
            mapping[row, column[tag[2:]]] = 1.0
    return probabilities @ mapping
