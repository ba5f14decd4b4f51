"""Served answers against the package's own scanner, on the shipped prompt set.

Needs ``metatronnanoguard`` (installed with ``--no-deps``; its scanner imports
tiktoken, a dependency of this example). The scanner's code runs here only as the
reference; the family never imports it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vllm_srun_nanoguard.locate import package_folder

from vllm_srun.plugins.requests import read_request

RELEASED = package_folder()
PROMPTS = json.loads((Path(__file__).with_name("prompts.json")).read_text())["prompts"]

pytestmark = pytest.mark.skipif(
    RELEASED is None,
    reason="metatronnanoguard is not installed (pip install --no-deps "
    "metatronnanoguard==0.1.0); the comparison needs the released model and its scanner",
)


@pytest.fixture(scope="module")
def scanner_scores() -> list[float]:
    from nanoguard import NanoGuard

    scanner = NanoGuard(device="cpu")
    return [r.injection_score for r in scanner.scan_batch([p["text"] for p in PROMPTS])]


def test_the_prompt_set_has_fifteen_of_each_label():
    assert [p["label"] for p in PROMPTS].count("safe") == 15
    assert [p["label"] for p in PROMPTS].count("injection") == 15


def test_served_probabilities_equal_the_scanners_within_1e_3(scanner_scores, load_package):
    assert RELEASED is not None
    model = load_package(RELEASED)
    request = read_request("classify", {"input": [p["text"] for p in PROMPTS]})
    plan = model.plan("classify", request)
    body = model.finish(plan, model.run(list(plan.items)))
    served = [r["probabilities"][1] for r in body["results"]]
    worst = max(abs(a - b) for a, b in zip(served, scanner_scores, strict=True))
    assert worst <= 1e-3, f"largest difference {worst}"
    assert [r["label"] for r in body["results"]] == [
        "injection" if s >= 0.5 else "safe" for s in scanner_scores
    ]
