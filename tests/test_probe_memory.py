"""The ``exact`` probe runs its largest forwards first and hands freed heap pages back."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from vllm_srun.compose import probes
from vllm_srun.compose.batching import LengthEdges
from vllm_srun.compose.probes import EQUAL_LENGTH_ROWS, measure_batch_invariance, release_freed_heap
from vllm_srun.plugins.spec import WorkItem


class Recorded:
    """A model that answers each row with its length and records every forward's shape."""

    pads_to_width = False

    def __init__(self, lengths: tuple[int, ...]):
        self.lengths = lengths
        self.shapes: list[tuple[int, int]] = []

    def probe_items(self) -> list[WorkItem]:
        return [WorkItem(tuple(range(n)), None, f"r{n}") for n in self.lengths]

    def run(self, rows: list[WorkItem]) -> list[npt.NDArray[np.float32]]:
        self.shapes.append((len(rows), rows[0].tokens))
        return [np.array([row.tokens], dtype=np.float32) for row in rows]


def test_the_equal_length_probe_runs_the_longest_row_and_its_largest_forward_first():
    """A family whose ``run`` takes no width gets the equal-length probe; a forward under
    32 tokens is filled with copies of its last row (3-token rows: 11 rows)."""
    model = Recorded((3, 18, 5, 41))
    report = measure_batch_invariance(model, 0.0)
    assert EQUAL_LENGTH_ROWS == (2, 3, 5, 8, 16)

    def filled(rows: int, length: int) -> tuple[int, int]:
        return (max(rows, -(-32 // length)), length)

    assert model.shapes == [
        filled(rows, length) for length in (41, 18, 5, 3) for rows in (1, 16, 8, 5, 3, 2)
    ]
    assert report == {
        "max_abs_deviation": 0.0,
        "tolerance": 0.0,
        "cross_request_batching": True,
        "method": "equal_length",
        "min_forward_tokens": 32,
    }


class FakeLibc:
    """A C library whose ``malloc_trim`` records its argument and returns ``freed``."""

    def __init__(self, freed: int | None):
        self.calls: list[int] = []
        if freed is not None:

            def malloc_trim(pad: int) -> int:
                self.calls.append(pad)
                return freed

            self.malloc_trim = malloc_trim


def test_freed_heap_is_handed_back_through_malloc_trim_when_the_libc_has_it(monkeypatch):
    for freed, expected in ((1, True), (0, False)):
        libc = FakeLibc(freed)
        monkeypatch.setattr(probes.ctypes, "CDLL", lambda name, libc=libc: libc)
        assert release_freed_heap() is expected
        assert libc.calls == [0]
    monkeypatch.setattr(probes.ctypes, "CDLL", lambda name: FakeLibc(None))
    assert release_freed_heap() is False  # musl: no malloc_trim, nothing done


class Widths(Recorded):
    """A model that pads to a width; its outputs can be made to depend on the width of the
    forward (``by_width``) or on its row count (``by_rows``), as some kernels do."""

    pads_to_width = True

    def __init__(self, lengths: tuple[int, ...], by_width: bool = False, by_rows: bool = False):
        super().__init__(lengths)
        self.by_width, self.by_rows = by_width, by_rows

    def run(self, rows: list[WorkItem], width: int | None = None) -> list[npt.NDArray[np.float32]]:
        width = max(width or 0, *(row.tokens for row in rows))
        self.shapes.append((len(rows), width))
        rounding = (width / 1024 if self.by_width else 0.0) + (
            len(rows) / 1024 if self.by_rows else 0.0
        )
        return [np.array([row.tokens + rounding], dtype=np.float32) for row in rows]


def test_the_exact_probe_pads_rows_to_edges_and_names_the_widest_sharing_that_holds():
    exact = measure_batch_invariance(Widths((3, 18, 20, 41)), 0.0)
    assert (exact["method"], exact["max_abs_deviation"]) == ("padded_to_edge", 0.0)
    assert exact["edges"][:4] == [16, 32, 48, 64]
    # answers that change with the forward's width: rows share forwards of their own edge
    assert measure_batch_invariance(Widths((3, 18, 20, 41), by_width=True), 0.0)["method"] == (
        "same_bucket"
    )
    # answers that change with the row count: one by one, after the first difference
    model = Widths((3, 18, 20, 41), by_rows=True)
    verdict = measure_batch_invariance(model, 0.0)
    assert (verdict["method"], verdict["cross_request_batching"]) == ("one_by_one", False)
    assert verdict["max_abs_deviation"] == 15 / 1024  # the longest row: 16 rows vs 1
    assert len(model.shapes) < 10  # it stopped at the first difference


def test_the_padded_probe_runs_each_edge_and_a_second_length_in_it():
    model = Widths((3, 18, 20, 41))
    verdict = measure_batch_invariance(model, 0.0)
    assert verdict["padded_up_to"] == 128
    widths = {width for _, width in model.shapes}
    assert widths <= set(LengthEdges().listed(up_to=512))  # every row at an edge
    # 18 and 20 share edge 32 with 19 (20 shortened) and the ladder's 31: 4 rows, twice
    assert (8, 32) in model.shapes
    # the ladder's last step: one row of each edge from 16 to 128, all padded to 128
    assert (8, 128) in model.shapes
    # the widest edge read (512 without a known limit): two lengths in it, twice
    assert (4, 512) in model.shapes
