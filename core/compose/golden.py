"""Golden self-checks: a loaded model answers its golden requests as recorded, or it fails.

During ``warming`` the runtime runs :func:`check` on each loaded model:

- the golden requests go through the model's real surfaces
  (:meth:`ServedModel.answer <vllm_srun.compose.loader.ServedModel.answer>`);
- the reference is the model identity's :class:`GoldenReference` (the
  ``golden_references`` layer, keyed by built-in model name) and, of the
  device's reference keys (most specific first; with a ``--dtype`` other
  than ``auto`` or the released one, under ``exact``, every key ends
  ``@<dtype>``: :func:`golden_dtype`), the first that has recorded
  answers; that key alone is compared, at the tolerance of its device class
  (the part of the key before the first ``:`` or ``@``, the accelerator's
  name): the reference file's for that class, else the one the accelerator
  declares (:attr:`~vllm_srun.plugins.Accelerator.golden_tolerance`), with no
  fallback to another key and no relaxed tolerance;
- without a recorded key, or for a model that is not built in, the model is
  ``unverified``: its golden requests (the reference's, else the family's
  ``golden(package)``) run twice and must be well formed (finite numbers, no
  item errors) and exactly equal.

:func:`record` runs the golden requests on this machine and writes the answers
under its first reference key (``vllm-srun golden record``).

Why this module is over 400 lines: checking and recording share one reading of the
reference (which key a device takes, the dtype suffix, the tolerance of its class)
and one way of running the requests; apart, the recorder could write a key the
check never reads.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from vllm_srun.compose.engine_choice import reference_for, select_key
from vllm_srun.compose.loader import ServedModel
from vllm_srun.plugins import Accelerator, GoldenReference, read_reference_file
from vllm_srun.plugins.cards import GoldenState, GoldenStatus
from vllm_srun.plugins.golden import write_engine_parity, write_reference_answers
from vllm_srun.plugins.host import Catalog
from vllm_srun.plugins.spec import RequestError

_KEY_CLASS = re.compile(r"[:@]")


GOLDEN_STATUSES: tuple[GoldenState, ...] = get_args(GoldenState)
"""The card's ``golden.status`` values: ``pending`` until the self-check ran (the model
is loading), then ``matched``, ``unverified`` or ``failed``."""


@dataclass(frozen=True)
class GoldenResult:
    """The outcome of a golden self-check.

    Attributes:
        status: one of :data:`GOLDEN_STATUSES`.
        checked: how many golden cases (requests) the check ran; 0 before it ran
            or for a model without golden requests.
        matched: how many of them answered as a recorded reference says (0 when
            nothing recorded was compared: ``unverified``).
        reference: the reference key compared (``cpu:x86_64:avx512:bf16_native``);
            ``""`` when no reference is recorded for this device or the model is
            not built in; ``None`` before the check ran.
        reason: why the check failed, else ``None``.
        deviation: under an ``approximate`` profile, the largest absolute
            difference of any number in the golden answers from the recorded
            ``exact`` answers (labels, spans and shapes must still be equal);
            ``None`` under ``exact`` or when nothing recorded was compared.
    """

    status: GoldenState
    checked: int
    matched: int
    reference: str | None
    reason: str | None = None
    deviation: float | None = None

    def card(self) -> GoldenStatus:
        """The ``golden`` object of a ``/v1/models`` card (wire contract 2.3
        ``GoldenStatus``: ``status``, ``checked`` and ``matched`` counts, ``reference``)."""
        return {
            "status": self.status,
            "checked": self.checked,
            "matched": self.matched,
            "reference": self.reference,
        }


PENDING = GoldenResult("pending", checked=0, matched=0, reference=None)
"""The card's golden object before the self-check ran."""


class GoldenError(Exception):
    """Golden requests cannot be checked or recorded; the message says why and what to do."""


@dataclass(frozen=True)
class Recorded:
    """What :func:`record` wrote.

    Attributes:
        model: the model identity.
        key: the reference key the answers were stored under.
        path: the reference file written.
        answers: how many answers (one per golden request).
        tolerance: the tolerance of the key's device class in the file.
    """

    model: str
    key: str
    path: Path
    answers: int
    tolerance: float | None


def tolerance_for(reference: GoldenReference, klass: str, accelerator: Accelerator) -> float:
    """The absolute tolerance answers under a key of device class ``klass`` are held to:
    the reference file's for the class, else the accelerator's declared
    :attr:`~vllm_srun.plugins.Accelerator.golden_tolerance` (``klass`` is its name)."""
    recorded = reference.tolerances.get(klass)
    return float(recorded) if recorded is not None else accelerator.golden_tolerance


def device_class(key: str) -> str:
    """The device class of a reference key: ``cpu:x86_64:avx2@bfloat16`` -> ``cpu``."""
    return _KEY_CLASS.split(key, maxsplit=1)[0]


def reference_keys(served: ServedModel) -> list[str]:
    """The device's reference keys at the model's dtype (:func:`golden_dtype`), most
    specific first."""
    placement = served.placement
    return list(placement.accelerator.reference_keys(placement.device, golden_dtype(served)))


def golden_dtype(served: ServedModel) -> str:
    """The dtype whose recorded answers the model is checked against.

    ``auto`` (the answers recorded at the released precision) when the model runs
    at that precision, whether ``--dtype`` was left at ``auto`` or pinned to it, and
    under an approximate profile, whose numbers are measured against the released
    precision's answers (the deviation from ``exact``) while labels and spans must
    still match. Otherwise the pinned ``--dtype``: answers recorded at the released
    precision say nothing about an ``exact`` model run at another one.
    """
    dtype = served.spec.dtype
    approximate = getattr(getattr(served, "profile", None), "numerics", "exact") != "exact"
    if dtype == served.spec.released_dtype or approximate:
        return "auto"
    return dtype


def golden_requests(served: ServedModel, reference: GoldenReference | None) -> list[Any]:
    """The requests to run: the reference's, else the family's ``golden(package)``."""
    if reference is not None:
        return list(reference.requests)
    return list(served.family.golden(served.package))


def _describe(index: int, request: Any) -> str:
    surface = request.get("surface") if isinstance(request, Mapping) else None
    return f"request {index + 1} ({surface})"


def run_requests(served: ServedModel, requests: Sequence[Any]) -> list[dict[str, Any]]:
    """Answer each ``{"surface", "body"}`` request; answers lack the top-level ``model``.

    Raises:
        GoldenError: a request is malformed or the model refuses it (``golden
            answers are malformed: request 2 (classify) was refused: ...``).
    """
    answers = []
    for index, request in enumerate(requests):
        what = _describe(index, request)
        if (
            not isinstance(request, Mapping)
            or not isinstance(request.get("surface"), str)
            or not isinstance(request.get("body"), Mapping)
        ):
            raise GoldenError(
                f"golden answers are malformed: {what} is not {{surface, body}}; "
                "fix the golden reference"
            )
        # Golden answers are the family's own: a surface an extension augments (its
        # answers rewritten after the family's) is checked on the family's model alone.
        target = served
        if request["surface"] in served.augmented and served.family_model is not None:
            target = dataclasses.replace(served, loaded=served.family_model)
        try:
            answer = target.answer(request["surface"], dict(request["body"]))
        except RequestError as err:
            raise GoldenError(
                f"golden answers are malformed: {what} was refused ({err.code}: {err.message})"
            ) from err
        answers.append({k: v for k, v in answer.items() if k != "model"})
    return answers


def _join(path: str, part: str | int) -> str:
    if isinstance(part, int):
        return f"{path}[{part}]"
    return f"{path}.{part}" if path else part


def malformation(answer: Any, path: str = "") -> str | None:
    """Where ``answer`` is malformed (a non-finite number or an item ``error``), or ``None``."""
    if isinstance(answer, float) and not math.isfinite(answer):
        return f"{path or 'the answer'} is {answer!r}"
    if isinstance(answer, Mapping):
        if "error" in answer and path:
            return f"{path} failed with {answer['error']!r}"
        for key, value in answer.items():
            found = malformation(value, _join(path, str(key)))
            if found:
                return found
    if isinstance(answer, list | tuple):
        for index, value in enumerate(answer):
            found = malformation(value, _join(path, index))
            if found:
                return found
    return None


def _is_number(value: Any) -> bool:
    return type(value) in (int, float)


def difference(actual: Any, expected: Any, tolerance: float, path: str = "") -> str | None:
    """The first place ``actual`` differs from ``expected``, or ``None`` when they agree.

    Numbers agree within ``tolerance`` (absolute); strings, booleans, ``null``
    and the shape (keys, list lengths) must be equal.
    """
    where = path or "the answer"
    if _is_number(actual) and _is_number(expected):
        if math.isfinite(actual) and abs(actual - expected) <= tolerance:
            return None
        return f"{where}: got {actual!r}, recorded {expected!r}"
    if isinstance(actual, Mapping) and isinstance(expected, Mapping):
        missing = sorted(set(expected) - set(actual))
        extra = sorted(set(actual) - set(expected))
        if missing or extra:
            return f"{where}: keys differ (missing {missing}, extra {extra})"
        for key in expected:
            found = difference(actual[key], expected[key], tolerance, _join(path, str(key)))
            if found:
                return found
        return None
    if isinstance(actual, list | tuple) and isinstance(expected, list | tuple):
        if len(actual) != len(expected):
            return f"{where}: got {len(actual)} items, recorded {len(expected)}"
        for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
            found = difference(a, e, tolerance, _join(path, index))
            if found:
                return found
        return None
    if type(actual) is type(expected) and actual == expected:
        return None
    return f"{where}: got {actual!r}, recorded {expected!r}"


def max_deviation(actual: Any, expected: Any) -> float:
    """The largest absolute difference between numbers at the same place in two answers of
    one shape (:func:`difference` with an unbounded tolerance found none other)."""
    if _is_number(actual) and _is_number(expected):
        return float(abs(actual - expected))
    if isinstance(actual, Mapping) and isinstance(expected, Mapping):
        return max((max_deviation(actual[k], expected[k]) for k in expected), default=0.0)
    if isinstance(actual, list | tuple) and isinstance(expected, list | tuple):
        return max(
            (max_deviation(a, e) for a, e in zip(actual, expected, strict=True)), default=0.0
        )
    return 0.0


def _well_formed_and_deterministic(
    served: ServedModel, requests: Sequence[Any]
) -> list[dict[str, Any]]:
    """Run ``requests`` twice; the first answers when well formed and equal both times.

    Raises:
        GoldenError: ``golden answers are malformed`` or ``golden answers are
            not deterministic``, naming the request and the JSON path.
    """
    first = run_requests(served, requests)
    for index, answer in enumerate(first):
        found = malformation(answer)
        limit = getattr(served.spec, "max_model_len", None)
        if found and limit is not None and "max_length_exceeded" in found:
            raise GoldenError(
                f"golden answers are malformed; max_model_len {limit} may be below what the "
                f"model's own check questions need ({_describe(index, requests[index])}: "
                f"{found}); raise max_model_len"
            )
        if found:
            raise GoldenError(
                f"golden answers are malformed: {_describe(index, requests[index])}: {found}"
            )
    second = run_requests(served, requests)
    for index, (a, b) in enumerate(zip(first, second, strict=True)):
        found = difference(b, a, 0.0)
        if found:
            raise GoldenError(
                f"golden answers are not deterministic: {_describe(index, requests[index])} "
                f"answered differently on a second run at {found.replace('recorded', 'first')}"
            )
    return first


def check(served: ServedModel, catalog: Catalog) -> GoldenResult:
    """The golden self-check of a loaded model (see the module docstring).

    ``served.identity`` names the built-in model whose reference applies
    (``None`` for a package that is not built in). Never raises for a model
    that answers badly or raises: that is a ``failed`` result with its reason.
    """
    reference = reference_for(catalog, getattr(served, "identity", None))
    keys = reference_keys(served)
    key = select_key(reference, keys)
    requests: Sequence[Any] = ()
    try:
        requests = golden_requests(served, reference)
        if key is None or reference is None:
            if not requests:
                return GoldenResult("unverified", checked=0, matched=0, reference="")
            _well_formed_and_deterministic(served, requests)
            return GoldenResult("unverified", checked=len(requests), matched=0, reference="")
        recorded = reference.answers[key]
        klass = device_class(key)
        tolerance = tolerance_for(reference, klass, served.placement.accelerator)
        approximate = getattr(getattr(served, "profile", None), "numerics", "exact") != "exact"
        if approximate:  # numbers are measured against exact, labels and spans still checked
            tolerance = math.inf
        answers = run_requests(served, requests)
    except Exception as err:
        reason = (
            str(err)
            if isinstance(err, GoldenError)
            else f"golden self-check raised {type(err).__name__}: {err}"
        )
        return GoldenResult(
            "failed", checked=len(requests), matched=0, reference=key or "", reason=reason
        )
    differing = [
        (index, found)
        for index, (answer, expected) in enumerate(zip(answers, recorded, strict=True))
        if (found := malformation(answer) or difference(answer, expected, float(tolerance)))
    ]
    matched = len(answers) - len(differing)
    if differing:
        index, found = differing[0]
        return GoldenResult(
            "failed",
            checked=len(answers),
            matched=matched,
            reference=key,
            reason=(
                f"golden self-check failed against {key}: {_describe(index, requests[index])} "
                f"differs at {found} (tolerance {tolerance:g} for {klass})"
            ),
        )
    deviation = None
    if approximate:
        deviation = max(
            (max_deviation(a, e) for a, e in zip(answers, recorded, strict=True)), default=0.0
        )
    return GoldenResult(
        "matched", checked=len(answers), matched=matched, reference=key, deviation=deviation
    )


def record(
    served: ServedModel,
    catalog: Catalog,
    identity: str,
    path: str | Path | None = None,
) -> Recorded:
    """Run the golden requests of ``identity`` on ``served`` and store the answers.

    The answers go under the first of this device's reference keys (at the
    model's dtype) in the reference file: ``path``, else the file the
    registered reference was read from. The requests run twice and must be
    well formed and equal, so a flaky answer is never recorded. A device
    class without a tolerance in the file gets the one its accelerator declares
    (:attr:`~vllm_srun.plugins.Accelerator.golden_tolerance`).

    Raises:
        GoldenError: no reference file for ``identity``, a file for another
            model, malformed or non-deterministic answers.
    """
    if path is not None:
        reference = read_reference_file(path)
        if reference.model != identity:
            raise GoldenError(
                f"{path} holds the golden reference of {reference.model}, not {identity}"
            )
    else:
        registered = reference_for(catalog, identity)
        if registered is None or registered.source is None:
            raise GoldenError(
                f"no golden reference file is registered for {identity}; write one with its "
                "requests (model, tolerances, requests, answers) and pass it with --file"
            )
        reference = registered
    assert reference.source is not None
    key = reference_keys(served)[0]
    answers = _well_formed_and_deterministic(served, list(reference.requests))
    klass = device_class(key)
    write_reference_answers(
        reference.source, key, answers, (klass, served.placement.accelerator.golden_tolerance)
    )
    tolerance = read_reference_file(reference.source).tolerances.get(klass)
    return Recorded(identity, key, reference.source, len(answers), tolerance)


@dataclass(frozen=True)
class Parity:
    """What :func:`measure_parity` found and wrote.

    Attributes:
        engine: the engine measured.
        result: its golden self-check against the recorded answers.
        path: the reference file whose ``engine_parity`` was updated.
    """

    engine: str
    result: GoldenResult
    path: Path

    @property
    def held(self) -> bool:
        """Whether the engine's answers matched within the tolerance."""
        return self.result.status == "matched"


def measure_parity(served: ServedModel, catalog: Catalog) -> Parity:
    """Check ``served`` (loaded on the engine to measure) against the answers recorded for
    its identity on this device, and declare its engine at parity on that key when every
    answer matched within the tolerance, or withdraw the declaration when one did not.

    Raises:
        GoldenError: a model that is not built in, no reference file for it, no answers
            recorded for this device, or a profile that is not ``exact`` (parity is an
            exact promise).
    """
    identity = served.identity
    if identity is None:
        raise GoldenError("the model is not a built-in model: it has no golden reference")
    registered = reference_for(catalog, identity)
    if registered is None or registered.source is None:
        raise GoldenError(f"no golden reference file is registered for {identity}")
    if served.profile.numerics != "exact":
        raise GoldenError(f"parity is measured under the exact profile, not {served.profile.name}")
    key = select_key(registered, reference_keys(served))
    if key is None:
        raise GoldenError(
            f"{identity} has no answers recorded for this device ({reference_keys(served)[0]}); "
            "record them first with `vllm-srun golden record` on the reference engine"
        )
    result = check(served, catalog)
    write_engine_parity(registered.source, served.engine.name, key, result.status == "matched")
    return Parity(served.engine.name, result, registered.source)


__all__ = [
    "GOLDEN_STATUSES",
    "PENDING",
    "GoldenError",
    "GoldenResult",
    "Parity",
    "Recorded",
    "check",
    "device_class",
    "difference",
    "malformation",
    "measure_parity",
    "record",
    "reference_for",
    "select_key",
]
