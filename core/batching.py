"""Batch bounds and forward planning: which rows run together in one forward.

Pure functions of the rows and the limits, shared by the scheduler's worker
(:class:`vllm_srun.scheduler.ModelScheduler`) and the synchronous Python API
(:meth:`vllm_srun.loader.ServedModel.run_items`):

- :class:`SchedulerLimits`: the bounds of a model's queue and of one forward
  (``--max-num-seqs`` rows, ``--max-num-batched-tokens`` padded tokens), with
  :meth:`SchedulerLimits.fits`, the one test of whether a row joins a forward;
- :func:`plan_forwards`: the forwards the worker runs for one request alone;
- :func:`split_by_length`: a forward's rows cut into the length groups that
  cost the fewest padded tokens plus a fixed cost per forward.

The defaults are not written here twice: the batch bounds are those of
:class:`vllm_srun.engine_args.EngineArgs` (the per-model engine arguments), and
the queue bounds and cache size here are the ones
:class:`vllm_srun.serve.config.ServeConfig` reads for ``vllm-srun serve``.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm_srun.engine_args import EngineArgs

if TYPE_CHECKING:  # the scheduler's limits stay importable without torch (vllm-srun --help)
    from vllm_srun.plugins.spec import WorkItem


@dataclass
class SchedulerLimits:
    """The options that shape a model's queue and forwards.

    Attributes:
        max_queue: ``--max-queue``: admitted requests not yet answered.
        max_queued_tokens: ``--max-queued-tokens``: their tokens.
        max_num_seqs: ``--max-num-seqs``: most rows in one forward.
        max_num_batched_tokens: ``--max-num-batched-tokens``: most padded tokens
            (rows times the longest row) in one forward.
        batch_window_ms: ``--batch-window-ms``: how long a busy worker waits
            after the oldest queued request for more rows.
        result_cache_entries: ``--result-cache-entries``: outputs kept by row
            key (0 disables the cache).
        cross_request_batching: whether rows of different requests may share a
            forward (the load-time batch-invariance probe's verdict).
        forward_overhead_tokens: the fixed cost of one forward in padded tokens
            (``None``: never split a batch).
        equal_length_forwards: the ``exact`` profile's rule: a forward holds only
            rows of one length (and one shared prefix), so no row is padded and no
            kernel sees another row's shape (:func:`split_by_length`).
    """

    max_queue: int = 256
    max_queued_tokens: int = 4_194_304
    # The per-model batch bounds are engine arguments: their defaults are EngineArgs'.
    max_num_seqs: int = EngineArgs.max_num_seqs
    max_num_batched_tokens: int = EngineArgs.max_num_batched_tokens
    batch_window_ms: float = EngineArgs.batch_window_ms
    result_cache_entries: int = 16384
    cross_request_batching: bool = True
    forward_overhead_tokens: float | None = None
    equal_length_forwards: bool = False

    def fits(self, rows: int, longest: int, row: WorkItem) -> bool:
        """Whether a forward holding ``rows`` rows padded to ``longest`` tokens can take
        ``row`` within ``max_num_seqs`` rows and ``max_num_batched_tokens`` padded tokens
        (rows times the longest row, ``row`` counted). An empty forward takes any row:
        a row above the token bound runs alone."""
        width = max(longest, row.tokens)
        return rows == 0 or (
            rows + 1 <= self.max_num_seqs and width * (rows + 1) <= self.max_num_batched_tokens
        )


MIN_FORWARD_TOKENS = 32
"""The fewest tokens an ``exact`` forward holds. Below about 16 tokens (rows times
length) a CPU matmul library picks other kernels for other row counts, and even
answers two copies of one row in one forward differently (measured on MiniLM with
PyTorch's oneDNN: a 3-token row is stable only from 4 copies, a 5-token row from 3);
from 32 tokens up the probe finds every row count and position equal. A forward
with fewer tokens is filled up with copies of its last row (:func:`fill_forward`)."""


def fill_forward(
    run: Callable[[list[WorkItem]], list[Any]], min_tokens: int = MIN_FORWARD_TOKENS
) -> Callable[[list[WorkItem]], list[Any]]:
    """``run`` wrapped so that a forward of fewer than ``min_tokens`` tokens (rows of one
    length: the ``exact`` profile's forwards) runs with copies of its last row added up
    to ``min_tokens``, their outputs dropped. A row alone and the same row among a few
    others then run at one shape: as many rows as ``min_tokens`` needs at its length."""

    def filled(rows: list[WorkItem]) -> list[Any]:
        total = sum(row.tokens for row in rows)
        if not rows or total >= min_tokens:
            return run(rows)
        extra = math.ceil((min_tokens - total) / max(rows[-1].tokens, 1))
        return run(rows + [rows[-1]] * extra)[: len(rows)]

    return filled


def plan_forwards(rows: list[WorkItem], limits: SchedulerLimits) -> list[list[WorkItem]]:
    """The forwards a model's worker runs for ``rows`` of one request with nothing else
    queued: taken in order within the batch bounds (:meth:`SchedulerLimits.fits`), each
    split by length (:func:`split_by_length`). The synchronous Python API
    (:meth:`vllm_srun.loader.ServedModel.answer`) runs its rows this way.

    Returns:
        The forwards in the order they run; together they hold every row once.
    """
    taken: list[list[WorkItem]] = []
    current: list[WorkItem] = []
    longest = 0
    for row in rows:
        if not limits.fits(len(current), longest, row):
            taken.append(current)
            current, longest = [], 0
        current.append(row)
        longest = max(longest, row.tokens)
    if current:
        taken.append(current)
    return [
        group
        for forward in taken
        for group in split_by_length(
            forward, limits.forward_overhead_tokens, limits.equal_length_forwards
        )
    ]


def split_by_length(
    rows: list[WorkItem], overhead_tokens: float | None, equal_length: bool = False
) -> list[list[WorkItem]]:
    """Group rows into forwards that waste the least on padding.

    With ``equal_length`` (the ``exact`` profile) every group holds rows of one
    length and one shared prefix only, in first-seen order, whatever the
    overhead: a row is then never padded, and its forward's shape depends on
    its own length and the number of rows alone.

    A forward of ``n`` rows padded to its longest row ``L`` costs ``n * L``
    padded tokens plus ``overhead_tokens`` (the fixed cost of a forward,
    measured at load by :func:`vllm_srun.probes.measure_forward_cost`). The
    rows are sorted by length and cut into the consecutive groups of least
    total cost (dynamic programming over the distinct lengths; an optimal
    grouping of sorted lengths is always consecutive). Row outputs do not
    depend on the grouping beyond the batch-invariance tolerance.

    Rows that share a computed-once prefix (:attr:`WorkItem.prefix`, a
    decision state's prompt head) are never split apart: each such set is one
    group, so the prefix still runs once.

    Args:
        rows: the rows of one forward, any order.
        overhead_tokens: fixed cost per forward in padded tokens; ``None``
            keeps the rows in one forward.
        equal_length: group by exact length (and shared prefix) instead.

    Returns:
        The groups (shared-prefix sets, then the other rows shortest first);
        together they hold every row once.
    """
    if equal_length:
        same: dict[tuple[int, tuple[int, ...]], list[WorkItem]] = {}
        for row in rows:
            same.setdefault((row.tokens, tuple(row.input_ids[: row.prefix])), []).append(row)
        return list(same.values())
    if overhead_tokens is None or len(rows) < 2:
        return [rows] if rows else []
    shared: dict[tuple[int, ...], list[WorkItem]] = {}
    plain: list[WorkItem] = []
    for row in rows:
        if row.prefix:
            shared.setdefault(tuple(row.input_ids[: row.prefix]), []).append(row)
        else:
            plain.append(row)
    return [*shared.values(), *_cheapest_groups(plain, overhead_tokens)]


def _cheapest_groups(rows: list[WorkItem], overhead_tokens: float) -> list[list[WorkItem]]:
    """Rows cut into the consecutive length-sorted groups of least padded tokens plus overhead."""
    if not rows:
        return []
    ordered = sorted(rows, key=lambda r: r.tokens)
    lengths = sorted({r.tokens for r in ordered})
    counts = collections.Counter(r.tokens for r in ordered)
    # rows_upto[k]: rows whose length is at most lengths[k - 1].
    rows_upto = [0]
    for length in lengths:
        rows_upto.append(rows_upto[-1] + counts[length])
    # best[j]: least cost of the rows of the first j distinct lengths; cut[j]: its last group start.
    best = [0.0] + [float("inf")] * len(lengths)
    cut = [0] * (len(lengths) + 1)
    for j in range(1, len(lengths) + 1):
        width = lengths[j - 1]
        for i in range(j - 1, -1, -1):
            padded = (rows_upto[j] - rows_upto[i]) * width
            if padded >= best[j]:
                break  # longer groups ending here only cost more padding
            cost = best[i] + padded + overhead_tokens
            if cost <= best[j]:  # on a tie, the larger group: fewer forwards
                best[j], cut[j] = cost, i
    groups: list[list[WorkItem]] = []
    j = len(lengths)
    while j > 0:
        i = cut[j]
        groups.append(ordered[rows_upto[i] : rows_upto[j]])
        j = i
    groups.reverse()
    return groups
