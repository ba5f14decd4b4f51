"""The ``exact`` probe runs its largest forwards first and hands freed heap pages back."""

from __future__ import annotations

import torch

from vllm_srun import probes
from vllm_srun.plugins.spec import WorkItem
from vllm_srun.probes import EQUAL_LENGTH_ROWS, measure_batch_invariance, release_freed_heap


class Recorded:
    """A model that answers each row with its length and records every forward's shape."""

    def __init__(self, lengths: tuple[int, ...]):
        self.lengths = lengths
        self.shapes: list[tuple[int, int]] = []

    def probe_items(self) -> list[WorkItem]:
        return [WorkItem(tuple(range(n)), None, f"r{n}") for n in self.lengths]

    def run(self, rows: list[WorkItem]) -> list[torch.Tensor]:
        self.shapes.append((len(rows), rows[0].tokens))
        return [torch.tensor([float(row.tokens)]) for row in rows]


def test_the_exact_probe_runs_the_longest_row_and_its_largest_forward_first():
    model = Recorded((3, 18, 5, 41))
    report = measure_batch_invariance(model, 0.0)
    assert EQUAL_LENGTH_ROWS == (2, 3, 5, 8, 16)
    assert model.shapes == [
        shape
        for length in (41, 18, 5, 3)
        for shape in [(1, length), *((rows, length) for rows in (16, 8, 5, 3, 2))]
    ]
    assert report == {
        "max_abs_deviation": 0.0,
        "tolerance": 0.0,
        "cross_request_batching": True,
        "method": "equal_length",
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
