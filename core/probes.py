"""Load-time probes of a family's model: batch invariance and a forward's fixed cost.

Both run the family's ``probe_items`` (rows of several lengths) through its
``run``. :func:`measure_batch_invariance` decides whether rows of different
requests may share a forward (DESIGN §6); :func:`measure_forward_cost` gives
the scheduler's length split its exchange rate between one more forward and
padded tokens (:func:`vllm_srun.batching.split_by_length`).
"""

from __future__ import annotations

import time
from typing import Any

from vllm_srun.plugins.loaded import LoadedModel
from vllm_srun.plugins.spec import WorkItem

BATCH_INVARIANCE_TOLERANCE = 1e-5
"""Largest absolute difference allowed between a row alone and inside a batch (DESIGN §6)."""


def measure_batch_invariance(loaded: LoadedModel[Any]) -> dict[str, Any]:
    """Run the family's probe rows alone and together; the largest absolute difference.

    A model without probe rows is reported as unprobed, with cross-request
    batching off (nothing vouches for it).

    Returns:
        ``{"max_abs_deviation": float | None, "tolerance": 1e-5,
        "cross_request_batching": bool}``.
    """
    items = loaded.probe_items()
    if not items:
        return {
            "max_abs_deviation": None,
            "tolerance": BATCH_INVARIANCE_TOLERANCE,
            "cross_request_batching": False,
        }
    together = loaded.run(items)
    deviation = 0.0
    for item, batched in zip(items, together, strict=True):
        [alone] = loaded.run([item])
        deviation = max(deviation, float((alone - batched).abs().max()))
    return {
        "max_abs_deviation": deviation,
        "tolerance": BATCH_INVARIANCE_TOLERANCE,
        "cross_request_batching": deviation <= BATCH_INVARIANCE_TOLERANCE,
    }


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
    more than ``a / b`` padded tokens (:func:`vllm_srun.batching.split_by_length`).

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


__all__ = [
    "BATCH_INVARIANCE_TOLERANCE",
    "FORWARD_COST_MIN_MS",
    "FORWARD_COST_REPEATS",
    "FORWARD_COST_TOKENS",
    "measure_batch_invariance",
    "measure_forward_cost",
]
