"""Rows to one engine batch and one batch output back to rows: what every ``run`` does.

A family's ``run`` receives :class:`~vllm_srun.plugins.spec.WorkItem` rows from
many requests and returns one output per row. With these helpers it is a line::

    def run(self, items, width=None):
        return split_rows(self.engine_model.encode(right_padded(items, self.pad_id, width)), items)

- :func:`right_padded`: an encoder batch, rows padded on the right (token type
  ids when any row has them);
- :func:`left_padded`: a decoder batch, rows padded on the left (so every row's
  last token sits in the last position, where next-token logits are read);
- :func:`split_rows`: a batch output back to one array per row, padding dropped.

An encoder batch is int64 numpy arrays in host memory and its output a float32 numpy
array (an engine moves them to and from its device); a decoder batch is int64 torch
tensors on the CPU (decoders run on the native engine only, which imports torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from vllm_srun.plugins.spec import DecoderBatch, EncoderBatch, WorkItem

ScalarT = TypeVar("ScalarT", bound=np.generic)


def _width(items: Sequence[WorkItem], width: int | None, skip: int = 0) -> int:
    """The padded length: the longest row's (less ``skip``), or ``width`` when longer."""
    if not items:
        raise ValueError("a batch needs at least one row")
    return max((width or 0) - skip, *(item.tokens - skip for item in items))


def right_padded(items: Sequence[WorkItem], pad_id: int, width: int | None = None) -> EncoderBatch:
    """Rows right-padded to one length: an encoder's batch.

    Args:
        items: the rows, at least one; row ``r`` of the batch is ``items[r]``.
        pad_id: the tokenizer's padding id (masked out, so any id reads the same).
        width: pad every row to this many tokens when it is longer than the longest
            row (a model with ``pads_to_width``; ``None``: the longest row's length).

    Returns:
        An :class:`~vllm_srun.plugins.spec.EncoderBatch` of C-contiguous int64
        ``[rows, width]`` numpy arrays: ``input_ids``, ``attention_mask`` (1 for real
        tokens) and ``token_type_ids`` (zeros where a row has none), the last ``None``
        when no row carries type ids.

    Raises:
        ValueError: no rows.
    """
    length = _width(items, width)
    ids = np.full((len(items), length), pad_id, dtype=np.int64)
    mask = np.zeros((len(items), length), dtype=np.int64)
    types = None
    if any(item.token_type_ids is not None for item in items):
        types = np.zeros((len(items), length), dtype=np.int64)
    for row, item in enumerate(items):
        ids[row, : item.tokens] = item.input_ids
        mask[row, : item.tokens] = 1
        if types is not None and item.token_type_ids is not None:
            types[row, : item.tokens] = item.token_type_ids
    return EncoderBatch(ids, mask, types)


def left_padded(
    items: Sequence[WorkItem], pad_id: int, width: int | None = None, skip: int = 0
) -> DecoderBatch:
    """Rows left-padded to one length: a decoder's batch (every row ends in the last
    position).

    Args:
        items: the rows, at least one.
        pad_id: the tokenizer's padding id.
        width: pad every row to this many tokens (``skip`` included) when longer than
            the longest row.
        skip: leading tokens every row shares and the batch leaves out (a prefix the
            caller passes as ``prefix_ids``); each row's first ``skip`` ids are dropped.

    Returns:
        A :class:`~vllm_srun.plugins.spec.DecoderBatch` of int64 ``[rows, width -
        skip]`` ``input_ids`` and ``attention_mask`` (0 for padding, then 1); set its
        ``prefix_ids`` and ``read_ids`` as the model needs.

    Raises:
        ValueError: no rows, or ``skip`` longer than a row.
    """
    import torch

    if any(item.tokens < skip for item in items):
        raise ValueError(f"skip={skip} is longer than a row")
    length = _width(items, width, skip)
    ids = torch.full((len(items), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(items), length), dtype=torch.long)
    for row, item in enumerate(items):
        suffix = item.input_ids[skip:]
        if suffix:
            ids[row, length - len(suffix) :] = torch.tensor(suffix, dtype=torch.long)
            mask[row, length - len(suffix) :] = 1
    return DecoderBatch(ids, mask)


def split_rows(
    output: npt.NDArray[ScalarT], items: Sequence[WorkItem]
) -> list[npt.NDArray[ScalarT]]:
    """A right-padded batch's output as one array per row, in row order.

    Args:
        output: a numpy array (float32 from an engine): ``[rows, tokens, ...]``
            per-token outputs (hidden states, token logits), or ``[rows, ...]`` of
            fewer dimensions per row than tokens (sequence logits).
        items: the rows the batch was made of (:func:`right_padded`).

    Returns:
        ``[tokens_r, ...]`` views of each row's real tokens for a per-token output
        (``output.ndim >= 3``), else views of each row's ``[...]`` slice; they share
        ``output``'s memory and dtype.

    Raises:
        ValueError: ``output`` has another number of rows than ``items``.
    """
    if output.shape[0] != len(items):
        raise ValueError(f"the engine answered {output.shape[0]} rows for {len(items)}")
    if output.ndim < 3:
        return [output[row, ...] for row in range(len(items))]
    return [output[row, : item.tokens] for row, item in enumerate(items)]


__all__ = ["left_padded", "right_padded", "split_rows"]
