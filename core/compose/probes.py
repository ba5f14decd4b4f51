"""Load-time probes of a family's model: batch invariance and a forward's fixed cost.

Both run the family's ``probe_items`` (rows of several lengths) through its
``run``. :func:`measure_batch_invariance` decides whether rows of different
requests may share a forward (DESIGN §6) and, under ``exact``, at which shapes;
:func:`measure_forward_cost` gives
the scheduler's length split its exchange rate between one more forward and
padded tokens (:func:`vllm_srun.compose.batching.split_by_length`).
"""

from __future__ import annotations

import ctypes
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from vllm_srun.compose.batching import MIN_FORWARD_TOKENS, ExactShapes, LengthEdges, exact_forward
from vllm_srun.plugins.loaded import LoadedModel
from vllm_srun.plugins.spec import WorkItem

BATCH_INVARIANCE_TOLERANCE = 1e-5
"""Largest absolute difference allowed between a row alone and inside a batch (DESIGN §6)."""


EQUAL_LENGTH_ROWS = (2, 3, 5, 8, 16)
"""Forward sizes the ``exact`` probe's fallback runs each probe row in (copies of the row,
so every position of every size is compared with the row alone)."""


def measure_batch_invariance(
    loaded: LoadedModel[Any],
    tolerance: float | None = BATCH_INVARIANCE_TOLERANCE,
    edges: LengthEdges | None = None,
) -> dict[str, Any]:
    """Run the family's probe rows alone and inside batches; the largest absolute difference.

    ``tolerance`` is the profile's ``batch_tolerance``:

    - ``0.0`` (``exact``): the rows run at the shapes the profile serves
      (:func:`vllm_srun.compose.batching.exact_forward`) and must be the same bits alone and
      in every forward; the first of :data:`~vllm_srun.compose.batching.SHAPE_METHODS` that
      holds is the ``method`` (:func:`_exact_invariance`), else ``one_by_one``.
    - a positive number (``batching``): the probe rows run alone and together
      (padded to the longest); cross-request batching is on when the largest
      difference is within it (``method`` ``cross_request``, else ``per_request``).
    - ``None`` (``max_speed``): as ``batching``, but cross-request batching stays on
      whatever the deviation (reported only).

    A model without probe rows is reported as unprobed: one by one under ``exact``,
    cross-request batching off under a tolerance (nothing vouches for it).

    Args:
        loaded: the family's loaded model.
        tolerance: the profile's ``batch_tolerance``.
        edges: the ``exact`` width grid (default: no token limit known).

    Returns:
        ``{"max_abs_deviation": float | None, "tolerance": float | None,
        "cross_request_batching": bool, "method": str}``; under ``exact`` with rows
        padded to edges, also ``edges`` (the widths, up to the model's limit) and
        ``min_forward_tokens``.
    """
    items = loaded.probe_items()
    if tolerance == 0.0:
        return _exact_invariance(loaded, items, edges or LengthEdges())
    if not items:
        return {
            "max_abs_deviation": None,
            "tolerance": tolerance,
            "cross_request_batching": tolerance is None,
            "method": "cross_request" if tolerance is None else "per_request",
        }
    together = loaded.run(items)
    deviation = 0.0
    for item, batched in zip(items, together, strict=True):
        [alone] = loaded.run([item])
        deviation = max(deviation, _largest_difference(alone, batched))
    shared = tolerance is None or deviation <= tolerance
    return {
        "max_abs_deviation": deviation,
        "tolerance": tolerance,
        "cross_request_batching": shared,
        "method": "cross_request" if shared else "per_request",
    }


PAD_ACROSS_MAX = 128
"""The widest edge the ``exact`` probe checks rows padded across edges to (every pair of
edges up to it); longer rows share forwards only with rows of their own edge. Measured on
MiniLM (AVX2, oneDNN): rows padded from their edge to a wider one gave the same bits up to
192 tokens, and differed from 208 on (rows of 210 to 240 tokens beside one of 256), while
rows of one edge agree at every width; padding across edges pays most on short rows."""


def _exact_invariance(
    loaded: LoadedModel[Any], items: list[WorkItem], edges: LengthEdges
) -> dict[str, Any]:
    """The ``exact`` probe (see :func:`measure_batch_invariance`).

    With a family whose ``run`` pads to a width (:attr:`LoadedModel.pads_to_width`),
    the probe rows, a shortened copy of the longest row of each edge they reach (another
    length in that bucket), and one row per edge built from the longest probe row (one
    token short of each edge up to :data:`PAD_ACROSS_MAX`, and two at the widest edge
    the model reads, up to 512) run at their edge's width:

    1. each alone (a filled forward);
    2. the rows of each edge together, then again in reverse order (twice as many
       rows: other positions and another row count);
    3. edge by edge upwards to :data:`PAD_ACROSS_MAX`: one row of every narrower edge
       with the row of this edge, all padded to it.

    Equal bits in 1 and 2, and in 3 up to at least the second edge: ``padded_to_edge``,
    with ``padded_up_to`` the widest edge 3 held at (rows of wider edges share forwards
    within their edge only); in 1 and 2 only: ``same_bucket``. Otherwise (or for a
    family that does not pad to a width) each probe row runs alone and as every row of
    forwards of :data:`EQUAL_LENGTH_ROWS` copies of itself: equal bits give
    ``equal_length``, any difference ``one_by_one``. Each stage stops at its first
    difference (one decides; a decoder's forwards are slow), so ``max_abs_deviation``
    under ``one_by_one`` is the difference found.
    """
    if not items:
        return _exact_verdict("one_by_one", None, edges)
    if loaded.pads_to_width:
        listed = edges.listed(up_to=512)
        ladder = [e for e in listed if e <= PAD_ACROSS_MAX]
        template = max(items, key=lambda row: row.tokens)
        per_edge = {e: _row_of_length(template, max(e - 1, 2)) for e in ladder}
        widest = listed[-1]
        long_rows = [_row_of_length(template, widest), _row_of_length(template, widest - 2)]
        rows = [*items, *_other_lengths(items, edges), *per_edge.values(), *long_rows]
        forward = exact_forward(loaded.run, ExactShapes("padded_to_edge", edges))
        alone: dict[int, Any] = {}

        def same_bits(batch: list[WorkItem]) -> bool:
            for row, output in zip(batch, forward(batch), strict=True):
                if id(row) not in alone:
                    [alone[id(row)]] = forward([row])
                if not _same_bits(output, alone[id(row)]):
                    return False
            return True

        buckets = ExactShapes("same_bucket", edges).groups(rows, None)
        if all(same_bits(group + group[::-1]) for group in buckets):  # stops at a difference
            padded_up_to = 0
            for k, edge in enumerate(ladder):
                if not same_bits([per_edge[e] for e in ladder[: k + 1]]):
                    break
                padded_up_to = edge
            if len(ladder) > 1 and padded_up_to >= ladder[1]:
                return _exact_verdict("padded_to_edge", 0.0, edges, padded_up_to)
            return _exact_verdict("same_bucket", 0.0, edges)
    return _equal_length_invariance(
        exact_forward(loaded.run, ExactShapes("equal_length", edges)), items, edges
    )


def _largest_difference(a: Any, b: Any) -> float:
    """The largest absolute difference between two row outputs (numpy arrays of one
    shape), computed in their dtype; NaN where either holds a NaN."""
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


def _same_bits(a: Any, b: Any) -> bool:
    """Whether two row outputs are the same values at the same shape (``0.0`` equals
    ``-0.0``, as ``torch.equal`` held): what the ``exact`` probe asks of a row."""
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


def _row_of_length(template: WorkItem, length: int) -> WorkItem:
    """A probe row of ``length`` tokens from ``template``: its first token, its inner tokens
    repeated, its last token (special tokens stay where the tokenizer put them)."""
    ids = template.input_ids
    inner = ids[1:-1] or ids
    body = (inner * (length // max(len(inner), 1) + 1))[: max(length - 2, 0)]
    made = (ids[:1] + body + ids[-1:])[:length]
    types = None
    if template.token_type_ids is not None:
        types = (0,) * len(made)
    return dataclasses.replace(
        template, input_ids=made, token_type_ids=types, key=f"{template.key}-{length}"
    )


def _other_lengths(items: list[WorkItem], edges: LengthEdges) -> list[WorkItem]:
    """For each edge the probe rows reach, its longest row one token shorter (the last
    token kept) where that stays in the same edge: a second length in the bucket."""
    longest: dict[int, WorkItem] = {}
    for row in items:
        width = edges.edge(row.tokens)
        if row.tokens > max(row.prefix + 2, 3) and (
            width not in longest or row.tokens > longest[width].tokens
        ):
            longest[width] = row
    shorter = []
    for width, row in longest.items():
        ids = row.input_ids[:-2] + row.input_ids[-1:]
        types = row.token_type_ids[:-2] + row.token_type_ids[-1:] if row.token_type_ids else None
        if edges.edge(len(ids)) == width:
            shorter.append(
                dataclasses.replace(row, input_ids=ids, token_type_ids=types, key=f"{row.key}-1")
            )
    return shorter


def _exact_verdict(
    method: str, deviation: float | None, edges: LengthEdges, padded_up_to: int = 0
) -> dict[str, Any]:
    verdict: dict[str, Any] = {
        "max_abs_deviation": deviation,
        "tolerance": 0.0,
        "cross_request_batching": method != "one_by_one",
        "method": method,
    }
    if method in ("padded_to_edge", "same_bucket"):
        verdict["edges"] = edges.listed()
    if method == "padded_to_edge":
        verdict["padded_up_to"] = padded_up_to
    if method != "one_by_one":
        verdict["min_forward_tokens"] = MIN_FORWARD_TOKENS
    return verdict


def _equal_length_invariance(
    run: Callable[[list[WorkItem]], list[Any]], items: list[WorkItem], edges: LengthEdges
) -> dict[str, Any]:
    """The ``exact`` probe's fallback for rows of one length (see :func:`_exact_invariance`).

    The rows run longest first, and each in its largest forward first: the
    allocator then serves every later, smaller forward from blocks the largest
    one freed, instead of growing the heap at each new shape (MiniLM: the peak
    RSS during the probe 542 MB against 559 MB shortest first, in one process). The
    comparisons are the same in any order.
    """
    for item in sorted(items, key=lambda row: row.tokens, reverse=True):
        [alone] = run([item])
        for rows in sorted(EQUAL_LENGTH_ROWS, reverse=True):
            deviation = max(_largest_difference(output, alone) for output in run([item] * rows))
            if deviation:  # one difference decides: the rest would only cost load time
                return _exact_verdict("one_by_one", deviation, edges)
    return _exact_verdict("equal_length", 0.0, edges)


FORWARD_COST_REPEATS = 5
"""Timed runs per probe shape; the fastest counts (the others met a busy core)."""

FORWARD_COST_TOKENS = 1024
"""Most padded tokens of the larger timed forward."""

FORWARD_COST_MIN_MS = 50.0
"""How long the larger timed forward must take at least: enough work that a busy core's
noise cannot hide the cost per token. It grows from the probe rows, doubling, until it
takes that long or reaches :data:`FORWARD_COST_TOKENS` (on a 2-core CPU, MiniLM's
probe rows, 164 padded tokens, already take about that long)."""


def measure_forward_cost(loaded: LoadedModel[Any]) -> dict[str, Any]:
    """The fixed cost of one forward, in milliseconds and in padded tokens.

    A forward of ``n`` rows padded to ``L`` tokens costs about ``a + b * n * L``
    on a device whose throughput the rows saturate (a CPU). ``a`` is read off
    the shortest probe row run alone, ``b`` off the probe rows repeated until
    one forward takes :data:`FORWARD_COST_MIN_MS` (at most
    :data:`FORWARD_COST_TOKENS` padded tokens); the two shapes are timed in
    turn, :data:`FORWARD_COST_REPEATS` times each, and the fastest of each
    counts. The scheduler splits a batch by length when padding would cost
    more than ``a / b`` padded tokens (:func:`vllm_srun.compose.batching.split_by_length`).

    Returns:
        ``{"fixed_ms", "per_padded_token_ms", "overhead_tokens"}``; every
        value ``None`` when the family has no probe rows, or when the larger
        forward did not take longer than the lone row (a device with room to
        spare: then batches are never split).
    """
    unknown = {"fixed_ms": None, "per_padded_token_ms": None, "overhead_tokens": None}
    items = list(loaded.probe_items())
    if not items:
        return unknown
    shortest = min(items, key=lambda item: item.tokens)
    width = max(item.tokens for item in items)

    def timed(rows: list[WorkItem]) -> float:
        started = time.perf_counter()
        loaded.run(rows)
        return (time.perf_counter() - started) * 1000

    loaded.run([shortest])  # warm: first calls build kernels and allocate
    large = items
    while timed(large) < FORWARD_COST_MIN_MS and 2 * len(large) * width <= FORWARD_COST_TOKENS:
        large = large * 2  # the loop ends after running the chosen shape once: warm
    padded = len(large) * width
    alone_ms, together_ms = [], []
    for _ in range(FORWARD_COST_REPEATS):  # in turn, so a burst of noise hits both shapes
        alone_ms.append(timed([shortest]))
        together_ms.append(timed(large))
    alone, together = min(alone_ms), min(together_ms)
    if together <= alone:
        return unknown
    per_token = (together - alone) / max(padded - shortest.tokens, 1)
    fixed = max(alone - per_token * shortest.tokens, 0.0)
    return {
        "fixed_ms": round(fixed, 3),
        "per_padded_token_ms": round(per_token, 6),
        "overhead_tokens": round(fixed / per_token, 1),
    }


def release_freed_heap() -> bool:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim(0)``).

    The probes run a few dozen forwards of different shapes; glibc keeps the
    memory they freed in its heaps (MiniLM on a 2-core CPU: about 26 MB of RSS
    after the ``exact`` probe), which then counts in the server's resident set
    and in its peak. Nothing is freed that is still in use.

    Returns:
        ``True`` when the C library is glibc and had memory to hand back; ``False``
        otherwise (another C library, such as musl: nothing is done).
    """
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the process's own symbols, libc's among them
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))


__all__ = [
    "BATCH_INVARIANCE_TOLERANCE",
    "EQUAL_LENGTH_ROWS",
    "FORWARD_COST_MIN_MS",
    "FORWARD_COST_REPEATS",
    "FORWARD_COST_TOKENS",
    "PAD_ACROSS_MAX",
    "measure_batch_invariance",
    "measure_forward_cost",
    "release_freed_heap",
]
