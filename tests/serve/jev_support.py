"""What the Jev tests share: the real MiniLM served from the command line's own options,
one request of each question type, and the checks a Jev answer must pass.

The checks recompute every derived value from the answer's own probabilities, with
jevcompat's reference formulas (:mod:`jevcompat.validate`): levels numbered from 0,
``score = sum i * p_i``, the Choice is the most probable option, and the confidences.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from typing import Any

from jevcompat import validate as reference

from vllm_srun.cli import build_parser
from vllm_srun.config import ServeConfig
from vllm_srun.serve.command import serve_config
from vllm_srun.service.runtime import Runtime

MINILM = "sentence-transformers/all-MiniLM-L6-v2"

LOAD_SECONDS = 300
"""How long MiniLM may take to load and pass its golden self-check (about 15 s on the
2-core reference machine when it is otherwise idle; much more under load)."""

TOLERANCE = 1e-9
"""How far a derived value may be from the same value recomputed here (float rounding
of a sum; every value is read back from JSON exactly)."""

STATE = "My card was charged twice for the same order and I want a refund"

TEAMS = {
    "billing": "Payments, charges, refunds and invoices",
    "shipping": "Delivery, parcels and tracking",
    "technical": "Bugs, errors, crashes and login problems",
}
URGENCY = ["not urgent", "can wait a day", "needs an answer today", "an emergency"]

QUESTIONS: dict[str, dict[str, Any]] = {
    "refund": {"type": "noul", "instructions": "Does the customer ask for their money back?"},
    "team": {"type": "choice", "instructions": "Which team should handle this?", "criteria": TEAMS},
    "urgency": {"type": "score", "instructions": "How urgent is this?", "criteria": URGENCY},
}
"""One question of each type, in the wire form (what a raw HTTP client sends)."""


def serve_args(*args: str) -> ServeConfig:
    """The :class:`ServeConfig` ``vllm-srun serve ARGS`` would serve (the CLI's own parser)."""
    return serve_config(build_parser().parse_args(["serve", *args]))


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Forwards in this process on one torch thread inside the block.

    ``tests/conftest.py`` asks OpenMP's idle threads to sleep (``OMP_WAIT_POLICY=PASSIVE``,
    as ``vllm-srun`` does for itself), but pytest has imported torch before it runs:
    pyproject's ``filterwarnings`` names ``torch.jit.TracerWarning``, which pytest imports
    while reading its configuration. OpenMP reads the policy once, when torch loads it, so
    under a plain ``pytest`` the team's idle threads spin, and on 2 shared cores they take
    the cores from the server's other threads and from the client in the same process
    (measured: MiniLM's load 56 s instead of 20 s, the jevcompat run 69 s instead of 13 s).
    One thread has no team to spin.
    """
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def load(runtime: Runtime) -> Runtime:
    """Load every model of ``runtime`` (bounded) and require each ready."""
    loading = runtime.start_loading()
    loading.join(LOAD_SECONDS)
    assert not loading.is_alive(), f"the models did not load within {LOAD_SECONDS} s"
    for state in runtime.models.values():
        assert state.status == "ready", (state.name, state.status, state.reason)
    return runtime


def entropy_confidence(probabilities: list[float]) -> float:
    """The ``vllm-sr/5.0`` confidence: one minus the normalised entropy."""
    entropy = -sum(p * math.log(p) for p in probabilities if p > 0)
    return 1 - entropy / math.log(len(probabilities))


def check_answers(answers: Mapping[str, Any], questions: Mapping[str, Mapping[str, Any]]) -> None:
    """Fail unless ``answers`` (a Jev body's ``answers``) answers each of ``questions`` with
    exactly the Jev fields and values consistent with its own probabilities."""
    assert list(answers) == list(questions), (list(answers), list(questions))
    for name, question in questions.items():
        answer = answers[name]
        kind = question["type"]
        assert answer["type"] == kind, (name, answer)
        assert set(answer) == reference.ANSWER_FIELDS[kind], (name, answer)
        if kind == "noul":
            assert isinstance(answer["noul"], float) and 0 <= answer["noul"] <= 1, answer
            continue
        probabilities = answer["probabilities"]
        values = list(probabilities.values())
        assert all(isinstance(p, float) and 0 <= p <= 1 for p in values), (name, answer)
        assert math.isclose(sum(values), 1, abs_tol=TOLERANCE), (name, sum(values))
        assert 0 <= answer["confidence"] <= 1, (name, answer)
        if kind == "choice":
            assert set(probabilities) == set(question["criteria"]), (name, answer)
            assert answer["choice"] == max(probabilities, key=probabilities.__getitem__), answer
            expected = reference.choice_confidence(values)
        else:
            levels = [str(i) for i in range(len(question["criteria"]))]
            assert list(probabilities) == levels, (name, answer)
            assert answer["legend"] == dict(zip(levels, question["criteria"], strict=True))
            assert 0 <= answer["score"] <= len(levels) - 1, (name, answer)
            expectation = sum(i * p for i, p in enumerate(values))
            assert math.isclose(answer["score"], expectation, abs_tol=TOLERANCE), answer
            expected = reference.score_confidence(values)
        assert math.isclose(answer["confidence"], expected, abs_tol=TOLERANCE), (name, answer)
