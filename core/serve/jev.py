"""The ``jev`` System One schema: TypeSafe's Jev API, as its clients read it.

It follows the request and answer shapes of the official SDK ``typesafe-sdk`` 0.7.5 (its
generated wire models) and the requirements of the ecosystem's conformance suite
``jevcompat`` 0.1.1 (SPEC 0.1), which cites TypeSafe's documentation for each. Served on
``/v1/systemone`` and ``/v1/systemone/batch`` by ``--systemone-schema jev`` or a
models-file entry's ``systemone_schema: jev``; it is a translation around the one
decisions request, like the other schemas (:mod:`.systemone`):

- **requests**: ``{"model", "state", "questions"}``; top-level fields this runtime does
  not know are ignored (Jev clients send their own); ``assets`` may be absent, null or
  empty (no model here reads images); a Choice or Score question may leave
  ``instructions`` out (its options say what is asked). ``model: "jev-latest"``
  (:data:`ALIAS`, the SDKs' default) reaches the process's decision model
  (:func:`alias_target`). A request with any invalid question is refused whole.
- **answers**: exactly ``{"model", "answers", "usage"}`` (this runtime's extras only
  under ``x_`` names: ``x_meta``, ``x_states``); each answer carries only the fields
  the Jev schema defines, its ``confidence`` by the Jev formulas
  (:func:`choice_confidence`, :func:`score_confidence`). A question the model could
  not answer (too long, past its deadline, bad model output) fails the whole request:
  a Jev answer has no error field.
- **errors**: a malformed body or an invalid question is 422
  ``{"detail": [{"loc": ["body", ...], "msg", "type"}]}``; every other failure keeps
  its status with ``{"detail": {"error_type", "message"}}``. Both carry this
  runtime's own ``{"error": {"code", "message", "type", "param"}}`` beside, so either
  kind of client finds its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from vllm_srun.plugins.decisions.answers import (
    AnsweredDecisions,
    FailedAnswer,
    QuestionAnswer,
)
from vllm_srun.plugins.spec import MESSAGE_LIMIT, clip

from .requests import ApiError, error_type
from .schemas import (
    JevAnswer,
    JevBatchResponse,
    JevErrorBody,
    JevErrorDocument,
    JevModel,
    JevSystemOneResponse,
    SystemOneBatchResponse,
)

if TYPE_CHECKING:
    from vllm_srun.service.runtime import ModelState, Runtime

SCHEMA = "jev"
"""The schema's name (``--systemone-schema jev``)."""

ALIAS = "jev-latest"
"""The model name the Jev SDKs send by default."""

SDK_VERSION = "typesafe-sdk 0.7.5"
SPEC_VERSION = "jevcompat SPEC 0.1"
"""What this schema follows."""

ANSWER_FIELDS = {
    "noul": ("type", "noul"),
    "choice": ("type", "choice", "probabilities", "confidence"),
    "score": ("type", "score", "probabilities", "confidence", "legend"),
}
"""The fields of each Jev answer, in the order they are written."""

FAILED_ANSWER_STATUS = {
    "max_length_exceeded": 413,
    "deadline_exceeded": 504,
    "invalid_model_output": 502,
    "unavailable": 503,
}
"""The status a request gets when one of its questions failed with this code (any other
code: 500). 413 for an input over the model's budget is what the Jev spec allows."""


def jev_path(path: str, schema: str) -> bool:
    """Whether a request to ``path`` is answered in the ``jev`` schema: a System One route
    (``/v1/systemone``, ``/v1/systemone/batch``) of a process serving that schema."""
    return schema == SCHEMA and path.startswith("/v1/systemone")


class JevError(ApiError):
    """A request-level failure in the Jev schema: ``{"detail": ..., "error": ...}``.

    Attributes:
        status: the HTTP status.
        detail: the Jev ``detail``: a list of ``{loc, msg, type}`` (422) or
            ``{error_type, message}``.
    """

    def __init__(
        self, status: int, code: str, message: str, detail: Any = None, param: str | None = None
    ) -> None:
        message = clip(message, MESSAGE_LIMIT)
        Exception.__init__(self, message)
        self.code = code  # type: ignore[assignment]
        self.message = message
        self.status = status
        self.param = param
        self.detail = detail if detail is not None else {"error_type": code, "message": message}

    def body(self) -> JevErrorDocument:
        """The error document, in both shapes: Jev's ``detail`` and this runtime's ``error``
        (its ``code`` any question error too, ``max_length_exceeded``, ...)."""
        error: JevErrorBody = {
            "code": self.code,
            "message": self.message,
            "type": error_type(self.status, self.code),
            "param": self.param,
        }
        return cast(JevErrorDocument, {"detail": self.detail, "error": error})


def invalid(problems: Iterable[tuple[Sequence[str | int], str, str]]) -> JevError:
    """A 422 validation failure from ``(path in the body, message, type)`` triples."""
    detail: list[dict[str, Any]] = []
    messages: list[str] = []
    for path, message, kind in problems:
        messages.append(clip(message, MESSAGE_LIMIT))
        detail.append({"loc": ["body", *path], "msg": messages[-1], "type": kind})
    message = "; ".join(messages)
    return JevError(422, "invalid_request", message, detail)


def as_jev(err: ApiError) -> JevError:
    """A failure raised in this runtime's own shape, in the Jev one: ``invalid_request``
    becomes a 422 validation failure at ``body``, and so does any other 422 (its code
    kept); any other keeps its status and code with a ``detail`` object."""
    if isinstance(err, JevError):
        return err
    if err.code == "invalid_request":
        return invalid([((), err.message, "invalid_request")])
    if err.status == 422:  # Jev clients read every 422 as a validation failure
        refused = invalid([((), err.message, err.code)])
        refused.code = err.code
        return refused
    return JevError(err.status, err.code, err.message, param=err.param)


# -- confidence ---------------------------------------------------------------------------


def choice_confidence(probabilities: Sequence[float]) -> float:
    """Jev's Choice confidence: ``(max p - 1/n) / (1 - 1/n)``, in [0, 1].

    0 for the uniform distribution, 1 for a certain one (TypeSafe's documented
    formula, as jevcompat SPEC 0.1 §4.5 gives it; also Score's fallback there).
    """
    n = len(probabilities)
    if n < 2:
        return 1.0
    return min(1.0, max(0.0, (max(probabilities) - 1 / n) / (1 - 1 / n)))


def score_confidence(probabilities: Sequence[float]) -> float:
    """Jev's Score confidence: ``1 - sum_i p_i |i - m| / S_n``, clamped to [0, 1].

    ``m`` is the most probable level (the first on a tie) and
    ``S_n = sum_i |i - (n-1)/2| / n`` the same spread of the uniform distribution around
    the middle level, so a distribution no more concentrated than the uniform one reads 0
    (TypeSafe's documented formula, as jevcompat SPEC 0.1 §4.5 gives it).
    """
    n = len(probabilities)
    if n < 2:
        return 1.0
    mode = max(range(n), key=lambda i: (probabilities[i], -i))
    spread = sum(p * abs(i - mode) for i, p in enumerate(probabilities))
    uniform = sum(abs(i - (n - 1) / 2) for i in range(n)) / n
    return min(1.0, max(0.0, 1.0 - spread / uniform))


# -- answers ------------------------------------------------------------------------------


def answer(name: str, found: QuestionAnswer) -> JevAnswer:
    """One answer in the Jev shape (``found`` is a decisions answer): its fields, with
    Jev's ``confidence`` (:func:`choice_confidence`, :func:`score_confidence`).

    Raises:
        JevError: the question failed (``{type, error, message}``): the status of
            :data:`FAILED_ANSWER_STATUS`, the message naming the question.
    """
    if "error" in found:
        failed = cast(FailedAnswer, found)
        code = failed["error"]
        status = FAILED_ANSWER_STATUS.get(code, 500)
        raise JevError(status, code, f"question {clip(name)!r}: {failed['message'] or code}")
    given = found
    if given["type"] == "noul":
        return {"type": "noul", "noul": given["noul"]}
    probabilities = dict(given["probabilities"])
    values = [float(p) for p in probabilities.values()]
    if given["type"] == "choice":
        return {
            "type": "choice",
            "choice": given["choice"],
            "probabilities": probabilities,
            "confidence": choice_confidence(values),
        }
    return {
        "type": "score",
        "score": given["score"],
        "probabilities": probabilities,
        "confidence": score_confidence(values),
        "legend": {k: v or "" for k, v in given["legend"].items()},
    }


def answers(found: Mapping[str, QuestionAnswer]) -> dict[str, JevAnswer]:
    """Every answer of one state in the Jev shape (see :func:`answer`)."""
    return {name: answer(name, value) for name, value in found.items()}


def body(decided: AnsweredDecisions) -> JevSystemOneResponse:
    """A decisions answer body as a Jev one: ``{"model", "answers", "usage"}``, then
    ``x_meta`` and ``x_states`` when the request asked for them (each state's answers in
    the Jev shape too).

    Raises:
        JevError: a question failed (:func:`answer`).
    """
    shaped: JevSystemOneResponse = {
        "model": decided["model"],
        "answers": answers(decided["answers"]),
        "usage": decided["usage"],
    }
    if "meta" in decided:
        shaped["x_meta"] = decided["meta"]
    states = decided.get("states")
    if isinstance(states, dict):
        shaped["x_states"] = {k: {**v, "answers": answers(v["answers"])} for k, v in states.items()}
    elif isinstance(states, list):
        shaped["x_states"] = [{**v, "answers": answers(v["answers"])} for v in states]
    return shaped


def batch_body(decided: SystemOneBatchResponse) -> JevBatchResponse:
    """A ``/v1/systemone/batch`` answer (``{"model", "results", "usage"}``) with every
    result's answers in the Jev shape; ``meta`` becomes ``x_meta``.

    Raises:
        JevError: a question failed (:func:`answer`).
    """
    shaped: JevBatchResponse = {
        "model": decided["model"],
        "results": [
            {"index": r["index"], "answers": answers(r["answers"])} for r in decided["results"]
        ],
        "usage": decided["usage"],
    }
    if "meta" in decided:
        shaped["x_meta"] = decided["meta"]
    return shaped


# -- the alias ----------------------------------------------------------------------------


def alias_target(runtime: Runtime) -> ModelState:
    """The model :data:`ALIAS` reaches when no served model has that ID: the one model
    served, else the one that answers decisions in the ``jev`` schema, else the one that
    answers decisions (a model still loading counts as one that may).

    Raises:
        ApiError: 404 ``model_not_found`` when none or several fit, naming them and the fix.
    """
    from .status import model_card

    states = list(runtime.models.values())
    if len(states) == 1:
        return states[0]
    deciding = [s for s in states if _may_decide(s, model_card)]
    if len(deciding) > 1:
        jev = [s for s in deciding if schema_of(runtime, s) == SCHEMA]
        deciding = jev or deciding
    if len(deciding) == 1:
        return deciding[0]
    which = ", ".join(s.name for s in deciding) or "none"
    raise ApiError(
        "model_not_found",
        f"model {ALIAS!r} names no single decision model here (decision models: {which}); "
        f"name one in `model`, or serve the one it should reach with models-file "
        f"`name: {ALIAS}`",
    )


def _may_decide(state: ModelState, model_card: Any) -> bool:
    if state.served is None and state.details is None:
        return state.status != "failed"  # not loaded yet: it may answer decisions
    return "decisions" in model_card(state)["surfaces"]


def schema_of(runtime: Runtime, state: ModelState | None) -> str:
    """The System One schema of ``state``'s answers: its models-file ``systemone_schema``,
    else the process's ``--systemone-schema``."""
    if state is not None and state.config.systemone_schema:
        return state.config.systemone_schema
    return runtime.config.systemone_schema


def models_list(runtime: Runtime) -> list[JevModel]:
    """The ``models`` list Jev clients read from ``GET /v1/models``: every model that
    answers decisions, then :data:`ALIAS` when it reaches one.

    Each is ``{"name", "description", "release_date"}``. A runtime does not know a
    model's release date: ``release_date`` is the UTC date the runtime took the model on
    (the card's ``created``).
    """
    import datetime

    from .status import model_card

    def date(state: ModelState) -> str:
        return datetime.datetime.fromtimestamp(state.created, datetime.UTC).date().isoformat()

    listed: list[JevModel] = []
    for state in runtime.models.values():
        card = model_card(state)
        if "decisions" not in card["surfaces"]:
            continue
        what = card.get("repo") or state.config.model
        listed.append(
            {
                "name": state.name,
                "description": f"{what}: System One decisions ({card['family']}, "
                f"{schema_of(runtime, state)} schema), served by vllm-srun",
                "release_date": date(state),
            }
        )
    if ALIAS not in runtime.models:
        try:
            target = alias_target(runtime)
        except ApiError:
            return listed
        listed.append(
            {
                "name": ALIAS,
                "description": f"alias of {target.name}, the Jev SDKs' default model name",
                "release_date": date(target),
            }
        )
    return listed
