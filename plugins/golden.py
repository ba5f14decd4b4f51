"""Golden references: recorded answers a model must reproduce before it is ready."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GoldenReference:
    """Golden requests for one model identity and the answers recorded for them.

    Attributes:
        model: the model identity the answers belong to (a built-in model name).
        requests: surface requests, each ``{"surface": ..., "body": {...}}``.
        answers: reference key (``cpu:x86_64:avx512:bf16_native``, ``cpu``,
            ``cuda:sm_90@bfloat16``) to the recorded answers, one per request.
        tolerances: device class (``cpu``, ``cuda``, ``rocm``, ...) to the
            largest absolute difference allowed on any number of an answer.
    """

    model: str
    requests: tuple[Mapping[str, Any], ...]
    answers: Mapping[str, tuple[Mapping[str, Any], ...]]
    tolerances: Mapping[str, float]

    @property
    def key(self) -> str:
        """The registry name: the model identity."""
        return self.model


def golden_violations(ref: GoldenReference) -> list[str]:
    """Reasons ``ref`` breaks the golden-reference contract (empty when it conforms)."""
    problems = []
    if not isinstance(ref.model, str) or not ref.model:
        problems.append("golden reference model must be a non-empty string")
    if not isinstance(ref.requests, tuple | list) or not ref.requests:
        problems.append("golden reference must have a non-empty tuple of requests")
        return problems
    if not isinstance(ref.answers, Mapping) or not isinstance(ref.tolerances, Mapping):
        problems.append("golden reference answers and tolerances must be mappings")
        return problems
    for key, answers in ref.answers.items():
        if not isinstance(answers, tuple | list) or len(answers) != len(ref.requests):
            count = len(answers) if isinstance(answers, tuple | list) else type(answers).__name__
            problems.append(
                f"reference key {key!r} has {count} answers for {len(ref.requests)} requests"
            )
    for device_class, tolerance in ref.tolerances.items():
        if type(tolerance) not in (int, float) or not math.isfinite(tolerance) or tolerance < 0:
            problems.append(f"tolerance for {device_class!r} must be a finite number >= 0")
    return problems
