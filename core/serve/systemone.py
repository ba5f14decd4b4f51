"""The System One routes' own shapes: ``/v1/systemone/batch``, the older request
forms ``--systemone-schema vllm-sr/4.0`` accepts, and the ``jev`` schema (:mod:`.jev`).

Both are translations around the one decisions request
(:class:`vllm_srun.plugins.decisions.DecisionsRequest`): a body is rewritten
into a ``/v1/decisions`` body, validated as every decisions body is (duplicate
keys included), answered by the model as usual, and the answer is reshaped
back. Nothing here reads a model.

A model's schema is its models-file ``systemone_schema``, else the process's
``--systemone-schema`` (:func:`target` finds it from the body's ``model``, the Jev
alias ``jev-latest`` included). ``vllm-sr/4.0`` accepts, beside every ``vllm-sr/5.0`` form, a Choice
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
from typing import TYPE_CHECKING, Any, cast

from vllm_srun.config import SYSTEMONE_SCHEMAS
from vllm_srun.plugins.decisions import (
    DecisionsRequest,
    InvalidQuestions,
    loads_checked,
    parse_request,
)
from vllm_srun.plugins.decisions.answers import (
    AnsweredDecisions,
    DecisionsResponse,
    DecisionUsage,
    IndexedStateAnswer,
)
from vllm_srun.plugins.decisions.schema import REQUEST_FIELDS
from vllm_srun.plugins.spec import RequestError

from . import jev
from .requests import ApiError
from .schemas import (
    JevBatchResponse,
    JevSystemOneResponse,
    SystemOneBatchResponse,
    SystemOneBatchResult,
)

if TYPE_CHECKING:
    from vllm_srun.service.runtime import Runtime

SCHEMAS = SYSTEMONE_SCHEMAS
"""The System One schemas (``--systemone-schema``); the first is the default."""

MAX_BATCH_STATES = 64
"""States one ``/v1/systemone/batch`` request may ask about (the command reference's 1-64)."""

Path = tuple[str | int, ...]


@dataclass
class Shape:
    """How the answer to a rewritten body is reshaped back.

    Attributes:
        batch: answer ``{"results": [...]}``, one block per state in order.
        schema: the System One schema the answer follows (:data:`SCHEMAS`).
    """

    batch: bool = False
    schema: str = SCHEMAS[0]


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


def target(runtime: Runtime, model: Any) -> tuple[Any, str]:
    """The ``model`` a System One body should carry and the schema it is answered in.

    ``jev-latest`` (:data:`.jev.ALIAS`), when no model is served under that ID, becomes
    the model it reaches (:func:`.jev.alias_target`). The schema is the named model's
    (:func:`.jev.schema_of`); an unknown or absent name takes the process's (the
    failure is then reported as that schema reports it).

    Raises:
        ApiError: 404 ``model_not_found``: the alias reaches no single decision model.
    """
    state = None
    if model == jev.ALIAS and jev.ALIAS not in runtime.models:
        state = jev.alias_target(runtime)
        model = state.name
    elif isinstance(model, str):
        try:
            state = runtime.served_state(model)
        except RequestError:
            state = None
    elif model is None and len(runtime.models) == 1:
        state = next(iter(runtime.models.values()))
    return model, jev.schema_of(runtime, state)


def read_systemone(
    raw: bytes, runtime: Runtime | None, schema: str, *, batch: bool
) -> tuple[DecisionsRequest, Shape]:
    """A ``/v1/systemone`` or ``/v1/systemone/batch`` body validated as a decisions request.

    Args:
        raw: the body bytes.
        runtime: the runtime whose models the body's ``model`` names (:func:`target`);
            ``None`` reads the body in ``schema`` as it is.
        schema: the process's ``--systemone-schema`` (one of :data:`SCHEMAS`), for a body
            whose model does not say.
        batch: whether the body is a batch.

    Raises:
        ApiError: 400 ``invalid_request`` naming the problem, or 404 ``model_not_found``
            (the Jev alias reaches no single model); in the ``jev`` schema a
            :class:`~.jev.JevError` (422 for a malformed body or an invalid question).
    """
    try:
        value, duplicates = loads_checked(raw)
        if not isinstance(value, dict):
            raise RequestError("invalid_request", "the request must be a JSON object")
        if runtime is not None:
            try:
                value["model"], schema = target(runtime, value.get("model"))
            except ApiError as err:
                raise (jev.as_jev(err) if schema == jev.SCHEMA else err) from None
            if value["model"] is None:
                del value["model"]
        return systemone_request(value, list(duplicates), schema, batch=batch)
    except InvalidQuestions as err:
        problems = ((path, message, "invalid_question") for path, message in err.questions)
        raise jev.invalid(problems) from err
    except RequestError as err:
        error = ApiError(err.code, err.message)
        raise (jev.as_jev(error) if schema == jev.SCHEMA else error) from err


def systemone_request(
    value: dict[str, Any], duplicates: list[Path], schema: str, *, batch: bool
) -> tuple[DecisionsRequest, Shape]:
    """A parsed System One body (``value`` is rewritten in place) as a decisions request.

    Args:
        duplicates: the body's duplicated keys, relative to ``value``.

    Raises:
        RequestError: ``invalid_request``; in the ``jev`` schema
            :class:`~vllm_srun.plugins.decisions.InvalidQuestions` for invalid questions.
    """
    shape = Shape(batch=batch, schema=schema)
    strict = schema == jev.SCHEMA
    if schema == "vllm-sr/4.0":
        if batch:
            _upgrade_questions(value.get("questions"))
        else:
            upgrade_v4(value)
    if strict:
        value, duplicates = jev_fields(value, duplicates, batch=batch)
    if not batch:
        return parse_request(
            value, duplicates, instructions_optional=strict, refuse_invalid=strict
        ), shape
    value, duplicates = batch_body(value, duplicates)
    try:
        return parse_request(
            value, duplicates, instructions_optional=strict, refuse_invalid=strict
        ), shape
    except InvalidQuestions as err:
        moved = [(_batch_path(path), batch_paths(message)) for path, message in err.questions]
        raise InvalidQuestions(list(dict.fromkeys(moved))) from err
    except RequestError as err:
        raise RequestError(err.code, batch_paths(err.message)) from err


BATCH_FIELDS = ("model", "states", "questions", "options")
"""The fields of a ``/v1/systemone/batch`` body."""


def jev_fields(
    value: dict[str, Any], duplicates: list[Path], *, batch: bool
) -> tuple[dict[str, Any], list[Path]]:
    """A Jev body with only the fields this runtime reads: others are ignored, as Jev
    clients expect (they send their own); ``assets`` must hold no image.

    Raises:
        RequestError: ``invalid_request``: ``assets`` holds an asset (no model served here
            reads images).
    """
    assets = value.get("assets")
    if assets:
        raise RequestError(
            "invalid_request",
            "assets holds an image, but no model served here reads images; describe the "
            "image in the state as text, and leave assets out",
        )
    known = BATCH_FIELDS if batch else REQUEST_FIELDS
    kept = {key: item for key, item in value.items() if key in known}
    return kept, [path for path in duplicates if path and path[0] in known]


def _batch_path(path: Path) -> Path:
    """A path in the rewritten batch body, in the batch's own terms (see :func:`batch_paths`):
    every state's questions are the batch's one ``questions``."""
    if path[:1] == ("states",) and len(path) > 2 and path[2] == "questions":
        return path[2:]
    if path[:1] == ("states",) and len(path) > 1 and isinstance(path[1], int):
        return ("states", path[1] + 1, *path[2:])
    return ("states", 0, *path) if path[:1] != ("questions",) else path


def batch_paths(message: str) -> str:
    """A message about the rewritten body, in the batch's own paths: ``state`` is
    ``states[0]``, ``states[i].state`` is ``states[i + 1]``, and every entry's
    ``questions`` is the batch's one ``questions``."""
    message = re.sub(r"\bstates\[\d+\]\.questions\b", "questions", message)
    message = re.sub(r"\bstates\[(\d+)\]\.state\b", lambda m: f"states[{int(m[1]) + 1}]", message)
    return re.sub(r"(^|: |; )state\b", r"\1states[0]", message)


def reshape(
    body: AnsweredDecisions, shape: Shape
) -> DecisionsResponse | SystemOneBatchResponse | JevSystemOneResponse | JevBatchResponse:
    """The decisions answer in the route's own shape (``body`` is left as it is).

    A decisions answer keeps its form; each ``states`` entry (array or named
    object) gains the ``model`` that answered it. A batch becomes ``{"model",
    "results": [{"index", "answers"}], "usage"}``, its ``usage`` the sum of
    every state's own (the same questions asked of each state, each counted as
    its own request). In the ``jev`` schema the answer is the Jev one (:mod:`.jev`).

    Raises:
        JevError: in the ``jev`` schema, a question failed (a Jev answer has no error).
    """
    if shape.schema == jev.SCHEMA:
        return jev.batch_body(_batched(body)) if shape.batch else jev.body(body)
    return _batched(body) if shape.batch else _named(body)


def _batched(body: AnsweredDecisions) -> SystemOneBatchResponse:
    """A decisions answer as a batch's ``{"model", "results", "usage"}`` (a batch's
    ``states`` is always an array: :func:`batch_body`)."""
    entries = cast(list[IndexedStateAnswer], body.get("states") or [])
    results: list[SystemOneBatchResult] = [{"index": 0, "answers": body["answers"]}]
    results += [{"index": s["index"] + 1, "answers": s["answers"]} for s in entries]
    usage: DecisionUsage = {
        "input_tokens": body["usage"]["input_tokens"]
        + sum(s["usage"]["input_tokens"] for s in entries),
        "output_tokens": body["usage"]["output_tokens"]
        + sum(s["usage"]["output_tokens"] for s in entries),
    }
    reshaped: SystemOneBatchResponse = {"model": body["model"], "results": results, "usage": usage}
    if "meta" in body:
        reshaped["meta"] = body["meta"]
    return reshaped


def _named(body: AnsweredDecisions) -> DecisionsResponse:
    """A decisions answer whose ``states`` entries each name the ``model`` that answered."""
    model = body["model"]
    named: DecisionsResponse = {"model": model, "answers": body["answers"], "usage": body["usage"]}
    states = body.get("states")
    if isinstance(states, dict):
        named["states"] = {k: {"model": model, **v} for k, v in states.items()}
    elif isinstance(states, list):
        named["states"] = [{"index": v["index"], "model": model, **v} for v in states]
    if "meta" in body:
        named["meta"] = body["meta"]
    return named
