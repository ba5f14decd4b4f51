"""Fit the similarity readout's temperatures on the shipped labelled set.

The labelled set (``calibration/labelled.jsonl``) holds one question per line
with the option a careful reader would pick::

    {"state": "...", "question": {"type": "choice", "instructions": "...",
     "criteria": {...}}, "label": "billing"}

:func:`measure` embeds every example through a host model and returns the
cosine similarities; :func:`fit` chooses the temperature ``T`` on a log grid
that minimises the mean negative log-likelihood of the labelled option under
``softmax(cos / T)`` (temperature scaling, Guo et al. 2017, "On Calibration
of Modern Neural Networks"). Choice takes the ``T`` fitted over Choice and
Score together (fitted alone, a set the model answers without a mistake
drives ``T`` to the bottom of the grid). Score is read as an ordinal scale:
its answer is the expected level ``sum_k k * p_k``, so its own ``T`` is the
one with the least mean absolute error between that expected level and the
labelled one (:func:`mean_abs_error`). Noul fits its ``T`` together with the
baseline ``b`` an undescribed false option reads, so ``P(true) > 0.5`` exactly
when the state is more similar to the question than ``b``: Platt scaling of
the cosine. Accuracy (the labelled option scores highest) does not depend on ``T``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vllm_srun.plugins.decisions import QUESTION_TYPES, Question, parse_request

from .readout import SimilarityDecisions

LABELLED = Path(__file__).with_name("calibration") / "labelled.jsonl"
"""The shipped labelled set."""

GRID = tuple(round(0.002 * (1.05**k), 6) for k in range(0, 110))
"""Candidate temperatures, 0.002 to about 0.42, 5 % apart."""

BASELINES = tuple(round(-0.2 + 0.01 * k, 2) for k in range(0, 81))
"""Candidate Noul baselines, -0.2 to 0.6 in steps of 0.01."""

Measured = tuple[str, torch.Tensor, int, torch.Tensor]
"""``(type, cosines, labelled option index, mask of options that read the baseline)``."""


def read_labelled(path: Path = LABELLED) -> list[dict[str, Any]]:
    """The labelled examples, one JSON object per non-empty line."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def measure(host: Any, examples: Iterable[Mapping[str, Any]]) -> list[Measured]:
    """``(type, cosines, labelled option index, baseline mask)`` per example.

    Every example is embedded through ``host``; an option that reads the
    Noul baseline holds NaN in ``cosines`` and True in the mask.

    Args:
        host: a loaded model serving ``embeddings`` (plan, run, finish).
        examples: labelled examples as :func:`read_labelled` returns them.

    Raises:
        ValueError: an example's label is not one of its question's options, or
            an embedding failed.
    """
    readout = SimilarityDecisions(
        host,
        {"temperature": dict.fromkeys(QUESTION_TYPES, 1.0), "noul_baseline": float("nan")},
    )
    measured = []
    for number, example in enumerate(examples, 1):
        request = parse_request(
            {"state": example["state"], "questions": {"q": example["question"]}}
        )
        plan = readout.plan("decisions", request)
        outputs = host.run(plan.items)
        [entry], _ = readout.similarities(plan, list(outputs))
        question, cosines = entry["q"]
        if not isinstance(question, Question) or not isinstance(cosines, np.ndarray):
            raise ValueError(f"example {number}: {cosines or 'invalid question'}")
        cosines = torch.from_numpy(cosines)  # float64 [options]: the fit runs in torch
        label = str(example["label"])
        if label not in question.keys:
            raise ValueError(f"example {number}: label {label!r} is not one of {question.keys}")
        mask = torch.isnan(cosines)
        measured.append((question.type, cosines, question.keys.index(label), mask))
    return measured


def _with_baseline(measured: Sequence[Measured], baseline: float) -> list[Measured]:
    return [
        (kind, torch.where(mask, torch.full_like(cos, baseline), cos), label, mask)
        for kind, cos, label, mask in measured
    ]


def mean_nll(measured: Sequence[Measured], temperature: float) -> float:
    """Mean negative log-likelihood of the labelled options under ``softmax(cos / T)``."""
    total = 0.0
    for _, cosines, label, _ in measured:
        total -= float(torch.log_softmax(cosines / temperature, dim=0)[label])
    return total / max(len(measured), 1)


def mean_abs_error(measured: Sequence[Measured], temperature: float) -> float:
    """Mean ``|sum_k k * p_k - label level|`` under ``p = softmax(cos / T)`` (levels from 0)."""
    total = 0.0
    for _, cosines, label, _ in measured:
        p = torch.softmax(cosines / temperature, dim=0)
        levels = torch.arange(len(p), dtype=p.dtype)
        total += abs(float((p * levels).sum()) - label)
    return total / max(len(measured), 1)


def accuracy(measured: Sequence[Measured]) -> float:
    """Share of examples whose labelled option has the highest cosine (first on a tie)."""
    hits = sum(int(torch.argmax(cosines)) == label for _, cosines, label, _ in measured)
    return hits / max(len(measured), 1)


def fit(measured: Sequence[Measured]) -> dict[str, Any]:
    """The temperatures and the Noul baseline, with the accuracy and NLL measured.

    Returns:
        ``{"temperature": {type: T}, "noul_baseline": b, "examples": {type: n},
        "accuracy": {type: a, "all": a}, "nll": {type: mean NLL}, "score_mae": e}``.

    Raises:
        ValueError: a question type has no example.
    """
    by_type = {kind: [m for m in measured if m[0] == kind] for kind in QUESTION_TYPES}
    for kind, subset in by_type.items():
        if not subset:
            raise ValueError(f"the labelled set has no {kind} example")
    options = [*by_type["choice"], *by_type["score"]]
    shared = min(GRID, key=lambda t: mean_nll(options, t))
    ordinal = min(GRID, key=lambda t: mean_abs_error(by_type["score"], t))
    baseline, noul_t = min(
        ((b, t) for b in BASELINES for t in GRID),
        key=lambda bt: mean_nll(_with_baseline(by_type["noul"], bt[0]), bt[1]),
    )
    temperature = {"choice": shared, "noul": noul_t, "score": ordinal}
    scored = {
        kind: _with_baseline(subset, baseline) if kind == "noul" else subset
        for kind, subset in by_type.items()
    }
    result: dict[str, Any] = {
        "temperature": temperature,
        "noul_baseline": baseline,
        "examples": {kind: len(subset) for kind, subset in scored.items()},
        "accuracy": {kind: round(accuracy(subset), 4) for kind, subset in scored.items()},
        "nll": {
            kind: round(mean_nll(subset, temperature[kind]), 4) for kind, subset in scored.items()
        },
    }
    result["accuracy"]["all"] = round(accuracy([m for s in scored.values() for m in s]), 4)
    result["score_mae"] = round(mean_abs_error(by_type["score"], ordinal), 4)
    for kind, value in result["nll"].items():
        if not math.isfinite(value):
            raise ValueError(f"the {kind} fit is not finite")
    return result
