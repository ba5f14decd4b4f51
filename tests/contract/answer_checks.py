"""The upstream router's answer check, restated here so the contract suite can hold every
decision answer this runtime gives to it.

Source of every rule and tolerance below: upstream ``vllm-project/semantic-router``,
``src/semantic-router/pkg/modelservice/answer_check.go``. Two versions of that file
exist (commit ``3b678159`` and the newer ``f9acb6b2``); we check the union, which is
the newer one, because an answer must pass whichever router it meets. The router runs
the check on each answer after decoding it (Go's ``encoding/json``: an absent number
decodes to 0, an absent string to ``""``) and replaces an answer that fails with
``invalid_model_output``, so a failing answer is lost to the router even though our
HTTP response decoded fine.

The rules, in our words (``SUM_TOLERANCE`` is the upstream tolerance, 0.02):

- an answer that carries an ``error`` is not checked (the router reports it as failed);
  nor (newer version) is the answer to a question the router asks by preset, a form
  this runtime's questions do not have;
- ``type`` equals the asked question's type;
- ``confidence`` (0 when absent) lies in ``[0, 1]`` (newer version);
- Choice: ``probabilities`` is a distribution over exactly the declared option keys
  (as many entries as options, every key present, each value in ``[0, 1]``, the values
  summing to within ``SUM_TOLERANCE`` of 1), and ``choice`` names a key none of whose
  siblings is more probable (ties allowed). The older version let ``choice`` be empty;
  the newer one requires it;
- Noul: ``noul`` in ``[0, 1]``;
- Score with N levels: ``probabilities`` is a distribution (as above) over exactly the
  keys ``"0"``..``"N-1"`` (levels are numbered from 0), ``0 <= score <= N-1``, and
  (newer version) ``|score - sum_i i * p_i| <= SUM_TOLERANCE * (N-1)``, the sum taken
  over the probabilities as given (a key that is missing counts as 0).

Unlike the router, which stops at the first failed rule, :func:`answer_violations`
lists every failed rule, each as one readable line naming the question. It also adds
two rules of our own contract that the router does not check (it skips a missing
answer): every asked question has an answer, and no answer names a question that was
not asked.

Questions are read in the request forms this runtime takes: ``criteria`` (an object of
option keys for Choice and Noul, a list of level descriptions for Score, and the
``vllm-sr/4.0`` list of Choice keys), ``choices`` lists of ``{key, description}``,
``levels`` lists; a Noul's keys default to ``false``/``true`` (the router asks a Noul
without keys and checks only ``noul``).

:func:`check_exchange` walks a whole response: ``/v1/decisions`` and ``/v1/systemone``
(with their ``states`` entries, named or listed), ``/v1/systemone/batch`` results, and
the ``decisions`` and ``systemone_batch`` tasks of a ``/v1/bundle``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

SUM_TOLERANCE = 0.02
"""How far a distribution's total may be from 1, and (times the top level) how far a
score may be from its expected level (upstream ``answer_check.go``)."""

DECISION_PATHS = ("/v1/decisions", "/v1/systemone", "/v1/systemone/batch", "/v1/bundle")
"""The routes whose 200 answers :func:`check_exchange` reads."""


@dataclass(frozen=True)
class Asked:
    """A question as the router's check sees it.

    Attributes:
        type: the question's ``type`` as sent.
        keys: Choice: the option keys in order; Score: ``"0"``..``"N-1"``; Noul:
            ``false``, ``true``; ``None`` where the question is not readable (the
            runtime must then answer it with an ``error``).
        problem: why ``keys`` is ``None``.
    """

    type: Any
    keys: tuple[str, ...] | None
    problem: str = ""


def asked(question: Any) -> Asked:
    """The type and keys of ``question``, in any request form the runtime takes."""
    if not isinstance(question, Mapping):
        return Asked(None, None, "it is not an object")
    kind = question.get("type")
    criteria = question.get("criteria")
    if kind == "choice":
        if isinstance(criteria, Mapping):
            return Asked(kind, tuple(criteria))
        if isinstance(criteria, list) and all(isinstance(k, str) for k in criteria):
            return Asked(kind, tuple(criteria))  # the vllm-sr/4.0 list of keys
        choices = question.get("choices")
        if isinstance(choices, list) and all(
            isinstance(c, Mapping) and isinstance(c.get("key"), str) for c in choices
        ):
            return Asked(kind, tuple(c["key"] for c in choices))
        return Asked(kind, None, "it has no readable criteria or choices")
    if kind == "noul":
        return Asked(kind, ("false", "true"))
    if kind == "score":
        levels = question.get("levels", criteria)
        if isinstance(levels, list):
            return Asked(kind, tuple(str(i) for i in range(len(levels))))
        return Asked(kind, None, "it has no readable levels or criteria")
    return Asked(kind, None, f"its type {kind!r} is not choice, noul or score")


def _number(answer: Mapping[str, Any], key: str) -> float | str:
    """The answer's ``key`` as Go reads it into a float64 (absent or null: 0), or a
    description of why it is not a number."""
    value = answer.get(key)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{key} is {value!r}, not a number"
    if not math.isfinite(value):
        return f"{key} is {value!r}, not a finite number"
    return float(value)


def _show(value: float) -> str:
    return f"{value:.6g}"


def _distribution(
    at: str, probabilities: Any, keys: tuple[str, ...], noun: str
) -> tuple[list[str], dict[str, float]]:
    """The violations of ``probabilities`` as a distribution over ``keys``, and its values
    that are numbers (for the rules that read them)."""
    if probabilities is None:
        probabilities = {}
    if not isinstance(probabilities, Mapping):
        return [f"{at}: probabilities is {probabilities!r}, not an object of numbers"], {}
    found: list[str] = []
    given = list(probabilities)
    if len(given) != len(keys) or set(given) != set(keys):
        found.append(f"{at}: probabilities are keyed {given}, not the {noun} {list(keys)}")
    values: dict[str, float] = {}
    for key, value in probabilities.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            found.append(f"{at}: probabilities[{key!r}] is {value!r}, not a number")
            continue
        if not 0 <= value <= 1:
            found.append(f"{at}: probabilities[{key!r}] = {_show(value)} is outside [0, 1]")
        values[key] = float(value)
    total = sum(values.values())
    if not abs(total - 1) <= SUM_TOLERANCE:
        found.append(
            f"{at}: probabilities of the {noun} sum to {_show(total)}, "
            f"more than {SUM_TOLERANCE} from 1"
        )
    return found, values


def _choice(at: str, answer: Mapping[str, Any], keys: tuple[str, ...]) -> list[str]:
    found, values = _distribution(at, answer.get("probabilities"), keys, "options")
    choice = answer.get("choice")
    if choice is None or choice == "":
        found.append(f"{at}: choice is missing or empty; it must name a most probable option")
    elif not isinstance(choice, str) or choice not in values:
        found.append(f"{at}: choice {choice!r} has no probability")
    else:
        best = max(values, key=lambda k: values[k])
        if values[best] > values[choice]:
            found.append(
                f"{at}: choice {choice!r} (p={_show(values[choice])}) is not a most probable "
                f"option: {best!r} has p={_show(values[best])}"
            )
    return found


def _noul(at: str, answer: Mapping[str, Any]) -> list[str]:
    noul = _number(answer, "noul")
    if isinstance(noul, str):
        return [f"{at}: {noul}"]
    return [] if 0 <= noul <= 1 else [f"{at}: noul {_show(noul)} is outside [0, 1]"]


def _score(at: str, answer: Mapping[str, Any], keys: tuple[str, ...]) -> list[str]:
    found, values = _distribution(at, answer.get("probabilities"), keys, "levels")
    score = _number(answer, "score")
    if isinstance(score, str):
        return [*found, f"{at}: {score}"]
    top = len(keys) - 1
    if not 0 <= score <= top:
        found.append(f"{at}: score {_show(score)} is outside [0, {top}] (levels 0..{top})")
    expected = 0.0
    for i, key in enumerate(keys):  # summed in level order, as the router sums it
        expected += i * values.get(key, 0.0)
    allowed = SUM_TOLERANCE * top
    if not abs(score - expected) <= allowed:
        found.append(
            f"{at}: score {_show(score)} is {_show(abs(score - expected))} from the expected "
            f"level sum_i i*p_i = {_show(expected)}; at most {_show(allowed)} "
            f"({SUM_TOLERANCE} x {top}) is allowed"
        )
    return found


def answer_fits(at: str, question: Any, answer: Any) -> list[str]:
    """Every violation of one answer (not carrying an ``error``) to ``question``."""
    if not isinstance(answer, Mapping):
        return [f"{at}: the answer is {answer!r}, not an object"]
    ask = asked(question)
    if ask.keys is None:
        return [f"{at}: answered without an error, but the question is unreadable: {ask.problem}"]
    found: list[str] = []
    if answer.get("type") != ask.type:
        found.append(f"{at}: type {answer.get('type')!r} is not the question's type {ask.type!r}")
    confidence = _number(answer, "confidence")
    if isinstance(confidence, str):
        found.append(f"{at}: {confidence}")
    elif not 0 <= confidence <= 1:
        found.append(f"{at}: confidence {_show(confidence)} is outside [0, 1]")
    if ask.type == "choice":
        found += _choice(at, answer, ask.keys)
    elif ask.type == "noul":
        found += _noul(at, answer)
    else:
        found += _score(at, answer, ask.keys)
    return found


def answer_violations(questions: Any, answers: Any, where: str = "answers") -> list[str]:
    """Every violation of ``answers`` (a response's ``answers`` object) to ``questions``
    (the request's ``questions`` object), each naming ``where.<question>`` and the rule.

    ``[]``: the router accepts every answer. An answer with an ``error`` is skipped.
    """
    if not isinstance(questions, Mapping):
        return [f"{where}: the request's questions are {questions!r}, not an object"]
    if answers is None:
        return [f"{where}: the response has no answers for these questions"]
    if not isinstance(answers, Mapping):
        return [f"{where}: {answers!r} is not an object of answers"]
    found: list[str] = []
    for name, question in questions.items():
        at = f"{where}.{name}"
        if name not in answers:
            found.append(f"{at}: the question was asked but has no answer")
            continue
        answer = answers[name]
        if isinstance(answer, Mapping) and answer.get("error") not in (None, ""):
            continue
        found += answer_fits(at, question, answer)
    found += [
        f"{where}.{name}: answers a question that was not asked"
        for name in answers
        if name not in questions
    ]
    return found


@dataclass
class Report:
    """What :func:`check_exchange` read.

    Attributes:
        violations: every violation, each naming where in the response it is.
        checked: one ``(route, model, question type)`` per answer checked (an
            answer without an ``error``); ``route`` is the route that answered it,
            ``bundle:decisions`` or ``bundle:systemone_batch`` inside a bundle.
        failed: one ``(where, error, message)`` per answer that carried an ``error``.
    """

    violations: list[str] = field(default_factory=list)
    checked: list[tuple[str, str, str]] = field(default_factory=list)
    failed: list[tuple[str, str, str]] = field(default_factory=list)

    def add(self, route: str, model: Any, questions: Any, answers: Any, where: str) -> None:
        self.violations += answer_violations(questions, answers, where)
        if not isinstance(questions, Mapping) or not isinstance(answers, Mapping):
            return
        for name, answer in answers.items():
            if name not in questions or not isinstance(answer, Mapping):
                continue
            if answer.get("error") not in (None, ""):
                self.failed.append(
                    (f"{where}.{name}", str(answer["error"]), str(answer.get("message")))
                )
            else:
                self.checked.append((route, str(model), str(asked(questions[name]).type)))


def _entries(
    request: Mapping[str, Any], response: Mapping[str, Any], prefix: str
) -> Iterator[tuple[str, Any, Any, Any]]:
    """``(where, model, questions, answers)`` of a decisions (or ``/v1/systemone``) answer:
    its own and each ``states`` entry's, matched by name or by ``index``."""
    model = response.get("model")
    yield f"{prefix}answers", model, request.get("questions"), response.get("answers")
    asked_states = request.get("states")
    answered = response.get("states")
    if isinstance(asked_states, Mapping):
        for name, entry in asked_states.items():
            got = answered.get(name) if isinstance(answered, Mapping) else None
            where = f"{prefix}states.{name}"
            if not isinstance(got, Mapping):
                yield where, model, entry.get("questions"), None
                continue
            yield (
                f"{where}.answers",
                got.get("model", model),
                entry.get("questions"),
                got.get("answers"),
            )
    elif isinstance(asked_states, list):
        by_index = (
            {s.get("index"): s for s in answered if isinstance(s, Mapping)}
            if isinstance(answered, list)
            else {}
        )
        for index, entry in enumerate(asked_states):
            got = by_index.get(index)
            where = f"{prefix}states[{index}]"
            if got is None:
                yield where, model, entry.get("questions"), None
                continue
            yield (
                f"{where}.answers",
                got.get("model", model),
                entry.get("questions"),
                got.get("answers"),
            )


def _batch(
    request: Mapping[str, Any], response: Mapping[str, Any], prefix: str
) -> Iterator[tuple[str, Any, Any, Any]]:
    """``(where, model, questions, answers)`` of each state of a ``/v1/systemone/batch``
    answer: the request's one ``questions`` about every state, matched by ``index``."""
    model = response.get("model")
    results = response.get("results")
    by_index = (
        {r.get("index"): r for r in results if isinstance(r, Mapping)}
        if isinstance(results, list)
        else {}
    )
    states = request.get("states")
    for index in range(len(states) if isinstance(states, list) else 0):
        got = by_index.get(index)
        where = f"{prefix}results[{index}]"
        yield (
            (f"{where}.answers", model, request.get("questions"), got.get("answers"))
            if got is not None
            else (where, model, request.get("questions"), None)
        )


def check_exchange(path: str, request: Any, response: Any) -> Report:
    """Every decision answer in a 200 ``response`` to ``request`` on ``path`` checked
    (see :data:`DECISION_PATHS`; any other path reads nothing)."""
    report = Report()
    if not isinstance(request, Mapping) or not isinstance(response, Mapping):
        return report
    if path in ("/v1/decisions", "/v1/systemone"):
        for where, model, questions, answers in _entries(request, response, ""):
            report.add(path, model, questions, answers, where)
    elif path == "/v1/systemone/batch":
        for where, model, questions, answers in _batch(request, response, ""):
            report.add(path, model, questions, answers, where)
    elif path == "/v1/bundle":
        tasks = request.get("tasks")
        results = response.get("results")
        by_id = (
            {r.get("id"): r for r in results if isinstance(r, Mapping)}
            if isinstance(results, list)
            else {}
        )
        for task in tasks if isinstance(tasks, list) else ():
            if not isinstance(task, Mapping):
                continue
            result = by_id.get(task.get("id"))
            if result is None or result.get("status") != 200:
                continue
            for key, walk in (("decisions", _entries), ("systemone_batch", _batch)):
                if key not in task:
                    continue
                prefix = f"results[id={task.get('id')}].{key}."
                body = result.get(key)
                if not isinstance(body, Mapping):
                    report.violations.append(f"{prefix[:-1]}: a 200 task without its answer")
                    continue
                for where, model, questions, answers in walk(task[key], body, prefix):
                    report.add(f"bundle:{key}", model, questions, answers, where)
    return report
