"""Golden references: recorded answers a model must reproduce before it is ready.

A reference can live in a JSON file (the format :func:`read_reference_file`
reads and :func:`write_reference_answers` updates)::

    {
      "model": "sentence-transformers/all-MiniLM-L6-v2",
      "tolerances": {"cpu": 1e-05, "cuda": 0.001},
      "requests": [{"surface": "embeddings", "body": {"input": ["hello"]}}],
      "answers": {"cpu:x86_64:avx512:bf16_native": [{"object": "list", ...}]},
      "engine_parity": {"onnxruntime": ["cpu:x86_64:avx512:bf16_native"]}
    }

``answers`` maps a reference key to one answer per request, in request order,
without the top-level ``model`` field (that is the served name, which the
operator chooses). ``engine_parity`` (optional) names, per engine, the keys on
which that engine's answers were measured within the tolerance of the recorded ones.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
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
        source: the JSON file the reference was read from (where ``vllm-srun
            golden record`` writes new answers), or ``None``.
        engine_parity: engine name to the reference keys on which that engine's
            answers were measured equal to the recorded ones within the tolerance
            (``--engine auto`` then prefers it under ``exact``:
            :mod:`vllm_srun.compose.engine_choice`).
    """

    model: str
    requests: tuple[Mapping[str, Any], ...]
    answers: Mapping[str, tuple[Mapping[str, Any], ...]]
    tolerances: Mapping[str, float]
    source: Path | None = field(default=None, compare=False)
    engine_parity: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

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
    for engine, keys in ref.engine_parity.items():
        if not isinstance(keys, tuple | list) or not all(k in ref.answers for k in keys):
            problems.append(
                f"engine_parity of {engine!r} must list reference keys that have answers"
            )
    for device_class, tolerance in ref.tolerances.items():
        if type(tolerance) not in (int, float) or not math.isfinite(tolerance) or tolerance < 0:
            problems.append(f"tolerance for {device_class!r} must be a finite number >= 0")
    return problems


class ReferenceFileError(Exception):
    """A golden reference file cannot be read or written; the message names the file."""


def read_reference_file(path: str | os.PathLike[str]) -> GoldenReference:
    """Read a golden reference JSON file (format in this module's docstring).

    Raises:
        ReferenceFileError: the file is unreadable, not JSON, or lacks
            ``model``, a non-empty ``requests`` list, or ``answers`` /
            ``tolerances`` objects.
    """
    source = Path(path)
    try:
        document = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ReferenceFileError(f"golden reference file {source} cannot be read: {err}") from err
    if not isinstance(document, dict):
        raise ReferenceFileError(f"golden reference file {source} must hold a JSON object")
    model = document.get("model")
    requests = document.get("requests")
    answers = document.get("answers", {})
    tolerances = document.get("tolerances", {})
    if not isinstance(model, str) or not model:
        raise ReferenceFileError(f"golden reference file {source} needs a `model` string")
    if not isinstance(requests, list) or not requests:
        raise ReferenceFileError(f"golden reference file {source} needs a `requests` list")
    parity = document.get("engine_parity", {})
    if not isinstance(answers, dict) or not isinstance(tolerances, dict):
        raise ReferenceFileError(
            f"golden reference file {source}: `answers` and `tolerances` must be objects"
        )
    if not isinstance(parity, dict) or not all(
        isinstance(keys, list) and all(isinstance(k, str) for k in keys) for keys in parity.values()
    ):
        raise ReferenceFileError(
            f"golden reference file {source}: `engine_parity` must map engine names to "
            "lists of reference keys"
        )
    return GoldenReference(
        model=model,
        requests=tuple(requests),
        answers={
            key: tuple(value) if isinstance(value, list) else value
            for key, value in answers.items()
        },
        tolerances=dict(tolerances),
        source=source,
        engine_parity={engine: tuple(keys) for engine, keys in parity.items()},
    )


def write_reference_answers(
    path: str | os.PathLike[str],
    key: str,
    answers: list[dict[str, Any]],
    tolerance: tuple[str, float] | None = None,
) -> None:
    """Store ``answers`` under ``key`` in the reference file at ``path``, keeping the rest.

    Args:
        path: an existing reference file (its ``requests`` are what was run).
        key: the reference key the answers were produced on.
        answers: one answer per request of the file, in order.
        tolerance: ``(device class, tolerance)`` to add when the file has no
            tolerance for that class yet; an existing one is never changed.

    Raises:
        ReferenceFileError: the file cannot be read, or ``answers`` does not
            have one answer per request.
    """
    source = Path(path)
    reference = read_reference_file(source)
    if len(answers) != len(reference.requests):
        raise ReferenceFileError(
            f"{len(answers)} answers for the {len(reference.requests)} requests of {source}"
        )
    document = json.loads(source.read_text(encoding="utf-8"))
    document.setdefault("answers", {})[key] = answers
    document["answers"] = dict(sorted(document["answers"].items()))
    if tolerance is not None:
        document.setdefault("tolerances", {}).setdefault(*tolerance)
    text = dump_reference(document)
    temporary = source.with_name(source.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(source)


def write_engine_parity(path: str | os.PathLike[str], engine: str, key: str, held: bool) -> None:
    """Declare (``held``) or withdraw ``engine``'s parity on ``key`` in the reference file
    at ``path``, keeping the rest (an engine left with no key is removed).

    Raises:
        ReferenceFileError: the file cannot be read, or has no answers under ``key``.
    """
    source = Path(path)
    reference = read_reference_file(source)
    if key not in reference.answers:
        raise ReferenceFileError(f"{source} has no answers under {key} to be at parity with")
    document = json.loads(source.read_text(encoding="utf-8"))
    parity = {name: list(keys) for name, keys in document.get("engine_parity", {}).items()}
    keys = set(parity.get(engine, ())) - {key} | ({key} if held else set())
    parity[engine] = sorted(keys)
    document["engine_parity"] = {name: keys for name, keys in sorted(parity.items()) if keys}
    if not document["engine_parity"]:
        del document["engine_parity"]
    temporary = source.with_name(source.name + ".tmp")
    temporary.write_text(dump_reference(document), encoding="utf-8")
    temporary.replace(source)


def dump_reference(document: Any, indent: int = 0) -> str:
    """JSON text of a reference document: two-space indents, lists of scalars on one line.

    Embeddings stay one line each, so a recorded file reads (and diffs) by answer.
    """
    pad, inner = "  " * indent, "  " * (indent + 1)
    if isinstance(document, dict) and document:
        members = [
            f"{inner}{json.dumps(k, ensure_ascii=False)}: {dump_reference(v, indent + 1)}"
            for k, v in document.items()
        ]
        return "{\n" + ",\n".join(members) + "\n" + pad + "}" + ("\n" if indent == 0 else "")
    if isinstance(document, list) and any(isinstance(v, dict | list) for v in document):
        items = [inner + dump_reference(v, indent + 1) for v in document]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return json.dumps(document, ensure_ascii=False, allow_nan=False)
