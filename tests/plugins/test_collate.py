"""Rows to one engine batch and back (vllm_srun.plugins.collate), exact arrays: encoder
batches and row outputs are numpy, decoder batches torch."""

import numpy as np
import pytest

from vllm_srun.plugins import WorkItem, left_padded, right_padded, split_rows


def row(ids, types=None, prefix=0):
    return WorkItem(
        tuple(ids), None if types is None else tuple(types), key=repr(ids), prefix=prefix
    )


def test_right_padded_pads_on_the_right_and_carries_type_ids_when_any_row_has_them():
    batch = right_padded([row([5, 6, 7]), row([8, 9], types=[0, 1])], pad_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7], [8, 9, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch.token_type_ids is not None
    assert batch.token_type_ids.tolist() == [[0, 0, 0], [0, 1, 0]]
    for array in (batch.input_ids, batch.attention_mask, batch.token_type_ids):
        assert isinstance(array, np.ndarray) and array.dtype == np.int64
        assert array.flags.c_contiguous


def test_right_padded_to_a_width_and_without_type_ids():
    batch = right_padded([row([5]), row([6, 7])], pad_id=3, width=4)
    assert batch.input_ids.tolist() == [[5, 3, 3, 3], [6, 7, 3, 3]]
    assert batch.attention_mask.tolist() == [[1, 0, 0, 0], [1, 1, 0, 0]]
    assert batch.token_type_ids is None
    # a width below the longest row's does not cut it
    assert right_padded([row([1, 2, 3])], 0, width=2).input_ids.tolist() == [[1, 2, 3]]


def test_left_padded_ends_every_row_in_the_last_position_and_skips_a_shared_prefix():
    batch = left_padded([row([1, 2, 3, 4]), row([1, 2, 5])], pad_id=0, skip=2)
    assert batch.input_ids.tolist() == [[3, 4], [0, 5]]
    assert batch.attention_mask.tolist() == [[1, 1], [0, 1]]
    assert batch.prefix_ids is None and batch.read_ids is None
    wide = left_padded([row([7, 8])], pad_id=9, width=4)
    assert wide.input_ids.tolist() == [[9, 9, 7, 8]]
    assert wide.attention_mask.tolist() == [[0, 0, 1, 1]]
    import torch  # decoders run on the native engine: their batches stay torch tensors

    assert isinstance(wide.input_ids, torch.Tensor) and wide.input_ids.dtype == torch.long


def test_split_rows_drops_each_rows_padding_or_keeps_per_row_vectors():
    items = [row([1, 2, 3]), row([4])]
    hidden = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)
    first, second = split_rows(hidden, items)
    assert first.tolist() == hidden[0].tolist()
    assert second.tolist() == [[6.0, 7.0]]
    assert all(np.shares_memory(part, hidden) for part in (first, second))  # views, no copy
    assert first.dtype == second.dtype == np.float32
    logits = np.array([[0.5, 1.5], [2.5, 3.5]], dtype=np.float32)
    parts = split_rows(logits, items)
    assert [t.tolist() for t in parts] == [[0.5, 1.5], [2.5, 3.5]]
    assert all(isinstance(t, np.ndarray) and t.shape == (2,) for t in parts)
    scalars = split_rows(np.array([0.25, 0.75], dtype=np.float32), items)  # one per row
    assert [(type(s), s.shape, float(s)) for s in scalars] == [
        (np.ndarray, (), 0.25),
        (np.ndarray, (), 0.75),
    ]


def test_bad_batches_are_refused_with_what_is_wrong():
    with pytest.raises(ValueError, match="at least one row"):
        right_padded([], pad_id=0)
    with pytest.raises(ValueError, match="skip=3 is longer than a row"):
        left_padded([row([1, 2])], pad_id=0, skip=3)
    with pytest.raises(ValueError, match="answered 1 rows for 2"):
        split_rows(np.zeros((1, 4), dtype=np.float32), [row([1]), row([2])])


def test_a_row_built_with_of_is_keyed_by_what_decides_its_output():
    a = WorkItem.of([101, 7, 102])
    assert (a.input_ids, a.token_type_ids, a.prefix) == ((101, 7, 102), None, 0)
    assert WorkItem.of((101, 7, 102)).key == a.key  # the same ids: the same key
    assert len(a.key) == 64 and int(a.key, 16) >= 0
    others = {
        WorkItem.of([101, 8, 102]).key,
        WorkItem.of([101, 7, 102], token_type_ids=[0, 0, 1]).key,
        WorkItem.of([101, 7, 102], prefix=1).key,
    }
    assert a.key not in others and len(others) == 3
