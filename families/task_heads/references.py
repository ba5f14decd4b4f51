"""Golden references of the built-in models this family loads, and generic golden requests.

The references live beside this module in ``golden/*.json``, one file per
model (format: :mod:`vllm_srun.plugins.golden`): the model name, its golden
requests, the answers recorded per reference key and a tolerance per device
class. ``vllm-srun golden record MODEL --device D`` adds or replaces the
answers of the recording machine's first reference key.

A package that is not built in has no recorded answers; the runtime then runs
:func:`generic_requests` twice and checks the answers are well formed and
equal (the family's ``golden(package)``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_srun.plugins import GoldenReference, hookimpl, read_reference_file
from vllm_srun.plugins.hookspecs import RegisterGoldenReference

from . import package as packages

GOLDEN_DIR = Path(__file__).with_name("golden")
"""Where the built-in models' reference files are (package data)."""

GENERIC_TEXTS = (
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Contact Jane Doe at jane.doe@example.com about invoice 4417.",
)
"""Texts of the generic golden requests: plain English, and one with entity-like spans."""

GENERIC_OPTIONS = {"overflow": "truncate"}
"""Inputs are cut to the model's limit, so a tiny limit cannot turn a request into an
item error."""


def golden_references(directory: Path = GOLDEN_DIR) -> list[GoldenReference]:
    """Every reference file in ``directory``, sorted by file name.

    Raises:
        ReferenceFileError: a file cannot be read (the plugin then fails to
            register, and ``vllm-srun plugins`` shows why).
    """
    return [read_reference_file(path) for path in sorted(directory.glob("*.json"))]


def generic_requests(package: Path) -> tuple[dict[str, Any], ...]:
    """One golden request per head of the package (``{"surface", "body"}``).

    Classify heads are named; a pooled head adds an embeddings and a rerank
    request (a bi-encoder reranks by cosine); a relevance head a rerank one.
    """
    requests: list[dict[str, Any]] = []
    heads = packages.describe(package).heads
    for head in heads:
        if head.surface == "classify":
            body: dict[str, Any] = {"head": head.name, "input": list(GENERIC_TEXTS)}
            requests.append({"surface": "classify", "body": {**body, "options": GENERIC_OPTIONS}})
        elif head.surface == "embeddings":
            requests.append(
                {
                    "surface": "embeddings",
                    "body": {"input": list(GENERIC_TEXTS), "options": GENERIC_OPTIONS},
                }
            )
    if any(h.surface in ("embeddings", "rerank") for h in heads):
        requests.append(
            {
                "surface": "rerank",
                "body": {
                    "query": "Who can I contact about the invoice?",
                    "documents": list(GENERIC_TEXTS),
                    "options": GENERIC_OPTIONS,
                },
            }
        )
    return tuple(requests)


@hookimpl
def register_golden_references(register: RegisterGoldenReference) -> None:
    """Register the built-in models' golden references (``golden/*.json``)."""
    for reference in golden_references():
        register(reference)
