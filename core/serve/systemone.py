"""The System One routes' own shapes: ``/v1/systemone/batch`` and the older request
forms ``--systemone-schema vllm-sr/4.0`` accepts.

Both are translations around the one decisions request
(:class:`vllm_srun.plugins.decisions.DecisionsRequest`): a body is rewritten
into a ``/v1/decisions`` body, validated as every decisions body is (duplicate
keys included), answered by the model as usual, and the answer is reshaped
back. Nothing here reads a model.

``vllm-sr/4.0`` accepts, beside every ``vllm-sr/5.0`` form, a Choice
question's ``criteria`` as a plain array of option keys (``["billing",
"outage"]``), read as keys without descriptions. (``states`` as an object of
named entries is no longer a 4.0 form: every decisions body takes it, and the
decisions schema answers it under the same names.)

:func:`reshape` also gives each ``states`` entry of an answer the ``model``
that answered it, as the router's contract has it.
"""

from __future__ import annotations

import re
from collections.abc import ValuesView
from dataclasses import dataclass
from typing import Any

from vllm_srun.plugins.decisions import DecisionsRequest, loads_checked, parse_request
from vllm_srun.plugins.spec import RequestError

from .requests import ApiError

SCHEMAS = ("vllm-sr/5.0", "vllm-sr/4.0")
"""The System One schemas ``--systemone-schema`` names; the first is the default."""

MAX_BATCH_STATES = 64
"""States one ``/v1/systemone/batch`` request may ask about (the command reference's 1-64)."""

Path = tuple[str | int, ...]


@dataclass
class Shape:
    """How the answer to a rewritten body is reshaped back.

    Attributes:
        batch: answer ``{"results": [...]}``, one block per state in order.
    """

    batch: bool = False


def _upgrade_questions(questions: Any) -> None:
    """4.0: a Choice question's ``criteria`` array of keys becomes ``{key: null}``."""
    if not isinstance(questions, dict):
        return
    for question in questions.values():
        if not isinstance(question, dict) or question.get("type") != "choice":
            continue
        criteria = question.get("criteria")
        if (
            isinstance(criteria, list)
            and all(isinstance(key, str) for key in criteria)
            and len(set(criteria)) == len(criteria)
        ):
            question["criteria"] = dict.fromkeys(criteria)


def upgrade_v4(body: dict[str, Any]) -> None:
    """Rewrite ``body`` (in place) from the 4.0 question forms to 5.0: every Choice
    ``criteria`` array of keys, at the top and in each ``states`` entry (an array
    of entries or an object of named ones). Duplicate-key paths are unchanged."""
    _upgrade_questions(body.get("questions"))
    states = body.get("states")
    entries = states.values() if isinstance(states, dict) else states
    for entry in entries if isinstance(entries, list | ValuesView) else ():
        if isinstance(entry, dict):
            _upgrade_questions(entry.get("questions"))


def batch_body(body: dict[str, Any], duplicates: list[Path]) -> tuple[dict[str, Any], list[Path]]:
    """A ``/v1/systemone/batch`` body as the decisions body it means.

    ``{"model", "states": [s0, s1, ...], "questions", "options"}`` becomes
    ``{"model", "state": s0, "questions", "states": [{"state": s1, "questions"}, ...],
    "options"}``: the same questions about every state, each state one entry.

    Raises:
        RequestError: ``invalid_request`` when ``states`` is not an array of 1 to
            :data:`MAX_BATCH_STATES` states, or a field is unknown.
    """
    unknown = sorted(set(body) - {"model", "states", "questions", "options"})
    if unknown:
        raise RequestError(
            "invalid_request",
            f"{unknown[0]}: not a field of this request (check the spelling); a batch takes "
            "model, states, questions and options",
        )
    states = body.get("states")
    if not isinstance(states, list) or not 1 <= len(states) <= MAX_BATCH_STATES:
        count = f"{len(states)} states" if isinstance(states, list) else "something else"
        raise RequestError(
            "invalid_request",
            f"states must be an array of 1 to {MAX_BATCH_STATES} states, not {count}; split "
            "a larger batch into several requests",
        )
    if "questions" not in body:
        raise RequestError("invalid_request", "questions: field required")
    questions = body["questions"]
    rewritten: dict[str, Any] = {k: body[k] for k in ("model", "options") if k in body}
    rewritten["state"] = states[0]
    rewritten["questions"] = questions
    if len(states) > 1:
        rewritten["states"] = [{"state": s, "questions": questions} for s in states[1:]]
    moved: list[Path] = []
    for path in duplicates:
        if len(path) > 1 and path[0] == "states" and isinstance(path[1], int):
            moved.append(
                ("state", *path[2:])
                if path[1] == 0
                else ("states", path[1] - 1, "state", *path[2:])
            )
        else:
            moved.append(path)
    return rewritten, moved


def read_systemone(raw: bytes, schema: str, *, batch: bool) -> tuple[DecisionsRequest, Shape]:
    """A ``/v1/systemone`` or ``/v1/systemone/batch`` body validated as a decisions request.

    Args:
        raw: the body bytes.
        schema: ``--systemone-schema`` (one of :data:`SCHEMAS`).
        batch: whether the body is a batch.

    Raises:
        ApiError: 400 ``invalid_request`` naming the problem.
    """
    try:
        value, duplicates = loads_checked(raw)
        if not isinstance(value, dict):
            raise RequestError("invalid_request", "the request must be a JSON object")
        return systemone_request(value, list(duplicates), schema, batch=batch)
    except RequestError as err:
        raise ApiError(err.code, err.message) from err


def systemone_request(
    value: dict[str, Any], duplicates: list[Path], schema: str, *, batch: bool
) -> tuple[DecisionsRequest, Shape]:
    """A parsed System One body (``value`` is rewritten in place) as a decisions request.

    Args:
        duplicates: the body's duplicated keys, relative to ``value``.

    Raises:
        RequestError: ``invalid_request``.
    """
    shape = Shape(batch=batch)
    if schema == "vllm-sr/4.0":
        if batch:
            _upgrade_questions(value.get("questions"))
        else:
            upgrade_v4(value)
    if not batch:
        return parse_request(value, duplicates), shape
    value, duplicates = batch_body(value, duplicates)
    try:
        return parse_request(value, duplicates), shape
    except RequestError as err:
        raise RequestError(err.code, batch_paths(err.message)) from err


def batch_paths(message: str) -> str:
    """A message about the rewritten body, in the batch's own paths: ``state`` is
    ``states[0]`` and ``states[i].state`` is ``states[i + 1]``."""
    message = re.sub(r"\bstates\[(\d+)\]\.state\b", lambda m: f"states[{int(m[1]) + 1}]", message)
    return re.sub(r"(^|: |; )state\b", r"\1states[0]", message)


def reshape(body: dict[str, Any], shape: Shape) -> dict[str, Any]:
    """The decisions answer in the route's own shape (``body`` is left as it is).

    A decisions answer keeps its form; each ``states`` entry (array or named
    object) gains the ``model`` that answered it. A batch becomes ``{"model",
    "results": [{"index", "answers"}], "usage"}``, its ``usage`` the sum of
    every state's own (the same questions asked of each state, each counted as
    its own request).
    """
    states = body.get("states")
    if shape.batch:
        entries = states or []
        results = [{"index": 0, "answers": body["answers"]}]
        results += [{"index": s["index"] + 1, "answers": s["answers"]} for s in entries]
        usage = {
            key: body["usage"][key] + sum(s["usage"][key] for s in entries) for key in body["usage"]
        }
        reshaped = {"model": body["model"], "results": results, "usage": usage}
        if "meta" in body:
            reshaped["meta"] = body["meta"]
        return reshaped
    model = body.get("model")
    if isinstance(states, dict):
        return {**body, "states": {k: {"model": model, **v} for k, v in states.items()}}
    if isinstance(states, list):
        return {**body, "states": [{"index": v["index"], "model": model, **v} for v in states]}
    return body
