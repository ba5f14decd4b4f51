"""Batch bounds and forward planning: which rows run together in one forward.

Pure functions of the rows and the limits, shared by the scheduler's worker
(:class:`vllm_srun.service.scheduler.ModelScheduler`) and the synchronous Python API
(:meth:`vllm_srun.compose.loader.ServedModel.run_items`):

- :class:`SchedulerLimits`: the bounds of a model's queue and of one forward
  (``--max-num-seqs`` rows, ``--max-num-batched-tokens`` padded tokens), with
  :meth:`SchedulerLimits.fits`, the one test of whether a row joins a forward;
- :func:`plan_forwards`: the forwards the worker runs for one request alone;
- :func:`split_by_length`: a forward's rows cut into the length groups that
  cost the fewest padded tokens plus a fixed cost per forward;
- :class:`ExactShapes` and :class:`LengthEdges`: the ``exact`` profile's forwards, each
  row padded to a width that depends on the row alone, and :func:`exact_forward`,
  one such forward through a family's ``run``.

The defaults are not written here twice: the batch bounds are those of
:class:`vllm_srun.engine_args.EngineArgs` (the per-model engine arguments), and
the queue bounds and cache size here are the ones
:class:`vllm_srun.config.ServeConfig` reads for ``vllm-srun serve``.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable
from dataclasses import dataclass, field
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
        exact: the ``exact`` profile's forward shapes (:class:`ExactShapes`: which
            rows share a forward and the width it is padded to); ``None`` under the
            other profiles (rows padded to the longest of their forward).
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
    exact: ExactShapes | None = None

    def fits(self, rows: int, longest: int, row: WorkItem) -> bool:
        """Whether a forward holding ``rows`` rows whose longest has ``longest`` tokens
        can take ``row`` within ``max_num_seqs`` rows and ``max_num_batched_tokens``
        padded tokens (rows times the forward's width, ``row`` counted). An empty
        forward takes any row: a row above the token bound runs alone."""
        width = max(longest, row.tokens)
        if self.exact is not None:
            width = self.exact.width(width)
        return rows == 0 or (
            rows + 1 <= self.max_num_seqs and width * (rows + 1) <= self.max_num_batched_tokens
        )

    def groups(self, rows: list[WorkItem]) -> list[list[WorkItem]]:
        """The forwards one taken batch runs as: :meth:`ExactShapes.groups` under
        ``exact``, else :func:`split_by_length` at the measured forward cost."""
        if self.exact is not None:
            return self.exact.groups(rows, self.forward_overhead_tokens)
        return split_by_length(rows, self.forward_overhead_tokens)


MIN_FORWARD_TOKENS = 32
"""The fewest tokens an ``exact`` forward holds. Below about 16 tokens (rows times
width) a CPU matmul library picks other kernels for other row counts, and even
answers two copies of one row in one forward differently (measured on MiniLM with
PyTorch's oneDNN: a 3-token row is stable only from 4 copies, a 5-token row from 3);
from 32 tokens up the probe finds every row count and position equal. A forward
with fewer tokens is filled up with copies of its last row (:func:`exact_forward`)."""

EDGE_STEPS: tuple[tuple[int | None, int], ...] = ((256, 16), (512, 32), (1024, 64), (None, 128))
"""The ``exact`` profile's length edges: ``(up to, step)``. A row of up to 256 tokens is
padded to the next multiple of 16, up to 512 to the next multiple of 32, and so on.
Chosen from measurement (bench/exact_shapes.py, bench/results/exact_shapes.md: MiniLM on
a 2-core CPU, batches of 32 corpus sentences of 13 to 73 tokens; two runs): forwards cut
at edges 16 apart took 0.96x to 1.01x the time of the ``batching`` profile's free cuts;
8 apart 1.00x to 1.04x (more forwards); 32 apart 1.10x to 1.17x (more padding); rows
sharing forwards only within their edge 0.98x to 1.07x; rows of one length only 1.9x to
2.2x. Padding costs less beside a long row, so the steps widen with the length."""


@dataclass(frozen=True)
class LengthEdges:
    """The widths an ``exact`` forward is padded to: a fixed grid, so a row's padded
    width is a function of the row alone, never of what else is queued.

    Attributes:
        limit: the model's token limit (:attr:`~vllm_srun.plugins.spec.ModelSpec.token_limit`;
            ``None``: none known). The last edge is the limit itself, so no forward is
            padded past what the model can read.
        steps: ``(up to, step)`` pairs, ascending; the last ``up to`` is ``None``
            (:data:`EDGE_STEPS`).
    """

    limit: int | None = None
    steps: tuple[tuple[int | None, int], ...] = EDGE_STEPS

    def edge(self, tokens: int) -> int:
        """The width a row of ``tokens`` tokens is padded to: the least edge at or above
        it (a row above the limit, which the model refuses anyway, keeps its length)."""
        if self.limit is not None and tokens >= self.limit:
            return tokens
        below = 0
        for upto, step in self.steps:
            top = upto if upto is not None else max(tokens, below) + step
            if tokens <= top:
                width = below + math.ceil(max(tokens - below, 1) / step) * step
                return width if self.limit is None else min(width, self.limit)
            below = top
        raise AssertionError("the last step has no bound")  # pragma: no cover

    def listed(self, up_to: int = 2048) -> list[int]:
        """The edges up to the limit (or ``up_to`` when none is known), for the card."""
        top = min(self.limit, up_to) if self.limit is not None else up_to
        edges, tokens = [], 1
        while tokens <= top:
            edges.append(self.edge(tokens))
            tokens = edges[-1] + 1
        return edges


SHAPE_METHODS = ("padded_to_edge", "same_bucket", "equal_length")
"""How ``exact`` forms its forwards, most sharing first; the load-time probe picks the
first under which the model's answers are the same bits
(:func:`vllm_srun.compose.probes.measure_batch_invariance`):

- ``padded_to_edge``: rows of any length share a forward padded to the edge of its
  longest row (:class:`LengthEdges`); the forwards are cut where padding costs more
  than a forward, as under ``batching``, but only at edges;
- ``same_bucket``: a row shares a forward only with rows of its own edge, padded to it;
- ``equal_length``: a row shares a forward only with rows of its own length, unpadded
  (also every family whose ``run`` takes no ``width``)."""


@dataclass(frozen=True)
class ExactShapes:
    """The ``exact`` profile's forward shapes: which rows share a forward and how wide it is.

    Every row runs at a width that depends on the row alone (its edge, or its own
    length), in a forward of at least :data:`MIN_FORWARD_TOKENS` tokens; the probe
    verified at load that neither the other rows nor their number change its answer.

    Attributes:
        method: one of :data:`SHAPE_METHODS`.
        edges: the width grid (``padded_to_edge``, ``same_bucket``).
        min_tokens: the fewest tokens (rows times width) a forward holds.
        padded_up_to: under ``padded_to_edge``, the widest edge a row is padded to
            across edges (the probe checked every pair of edges up to it); a row whose
            own edge is wider shares forwards only with rows of its edge.
    """

    method: str = "equal_length"
    edges: LengthEdges = field(default_factory=LengthEdges)
    min_tokens: int = MIN_FORWARD_TOKENS
    padded_up_to: int = 0

    @property
    def padded(self) -> bool:
        """Whether rows are padded to an edge (the family's ``run`` is given ``width``)."""
        return self.method != "equal_length"

    def width(self, longest: int) -> int:
        """The width of a forward whose longest row has ``longest`` tokens."""
        return self.edges.edge(longest) if self.padded else longest

    def groups(self, rows: list[WorkItem], overhead_tokens: float | None) -> list[list[WorkItem]]:
        """``rows`` cut into forwards of this method (every row once; shared-prefix sets
        are never split). ``padded_to_edge`` cuts the rows whose edge is at most
        :attr:`padded_up_to` like :func:`split_by_length`, each group costing its edge's
        width, and groups the longer ones by edge; the others group by key."""
        if self.method == "padded_to_edge":
            short = [r for r in rows if self.edges.edge(r.tokens) <= self.padded_up_to]
            long = [r for r in rows if self.edges.edge(r.tokens) > self.padded_up_to]
            cut = split_by_length(short, overhead_tokens, width=self.edges.edge)
            return cut + ExactShapes("same_bucket", self.edges).groups(long, overhead_tokens)
        same: dict[tuple[int, tuple[int, ...]], list[WorkItem]] = {}
        for row in rows:
            width = self.edges.edge(row.tokens) if self.padded else row.tokens
            same.setdefault((width, tuple(row.input_ids[: row.prefix])), []).append(row)
        return list(same.values())


def exact_forward(
    run: Callable[..., list[Any]], shapes: ExactShapes
) -> Callable[[list[WorkItem]], list[Any]]:
    """``run`` (a family's :meth:`~vllm_srun.plugins.LoadedModel.run`) as an ``exact``
    forward: the rows padded to ``shapes.width`` of the longest (``run(rows, width=...)``
    where ``shapes.padded``), and a forward of fewer than ``shapes.min_tokens`` tokens
    filled with copies of its last row, their outputs dropped. A row alone and among a
    few others then run at one width and at least the same number of tokens."""

    def forward(rows: list[WorkItem]) -> list[Any]:
        if not rows:
            return []
        width = shapes.width(max(row.tokens for row in rows))
        total = len(rows) * width
        extra = (
            math.ceil((shapes.min_tokens - total) / max(width, 1))
            if total < shapes.min_tokens
            else 0
        )
        batch = rows + [rows[-1]] * extra
        outputs = run(batch, width=width) if shapes.padded else run(batch)
        return outputs[: len(rows)]

    return forward


def plan_forwards(rows: list[WorkItem], limits: SchedulerLimits) -> list[list[WorkItem]]:
    """The forwards a model's worker runs for ``rows`` of one request with nothing else
    queued: taken in order within the batch bounds (:meth:`SchedulerLimits.fits`), each
    split by length (:meth:`SchedulerLimits.groups`). The synchronous Python API
    (:meth:`vllm_srun.compose.loader.ServedModel.answer`) runs its rows this way.

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
    return [group for forward in taken for group in limits.groups(forward)]


def split_by_length(
    rows: list[WorkItem],
    overhead_tokens: float | None,
    width: Callable[[int], int] | None = None,
) -> list[list[WorkItem]]:
    """Group rows into forwards that waste the least on padding.

    A forward of ``n`` rows whose longest row has ``L`` tokens costs ``n * width(L)``
    padded tokens (``width``: the identity, or the ``exact`` profile's
    :meth:`LengthEdges.edge`) plus ``overhead_tokens`` (the fixed cost of a
    forward, measured at load by :func:`vllm_srun.compose.probes.measure_forward_cost`).
    The rows are sorted by length and cut into the consecutive groups of least
    total cost (dynamic programming over the distinct lengths; an optimal
    grouping of sorted lengths is always consecutive, ``width`` being
    non-decreasing).

    Rows that share a computed-once prefix (:attr:`WorkItem.prefix`, a
    decision state's prompt head) are never split apart: each such set is one
    group, so the prefix still runs once.

    Args:
        rows: the rows of one forward, any order.
        overhead_tokens: fixed cost per forward in padded tokens; ``None``
            keeps the rows in one forward.
        width: the padded width of a forward from its longest row (default: that length).

    Returns:
        The groups (shared-prefix sets, then the other rows shortest first);
        together they hold every row once.
    """
    if overhead_tokens is None or len(rows) < 2:
        return [rows] if rows else []
    shared: dict[tuple[int, ...], list[WorkItem]] = {}
    plain: list[WorkItem] = []
    for row in rows:
        if row.prefix:
            shared.setdefault(tuple(row.input_ids[: row.prefix]), []).append(row)
        else:
            plain.append(row)
    return [*shared.values(), *_cheapest_groups(plain, overhead_tokens, width or _own_length)]


def _own_length(tokens: int) -> int:
    return tokens


def _cheapest_groups(
    rows: list[WorkItem], overhead_tokens: float, width: Callable[[int], int]
) -> list[list[WorkItem]]:
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
        widest = width(lengths[j - 1])
        for i in range(j - 1, -1, -1):
            padded = (rows_upto[j] - rows_upto[i]) * widest
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
