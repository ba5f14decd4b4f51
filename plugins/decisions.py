"""System One decisions: the request schema and the readout maths every decision family shares.

A decisions request asks typed questions about a ``state``::

    {"state": "My card was charged twice",
     "questions": {"team": {"type": "choice", "instructions": "Which team?",
                            "criteria": {"billing": "Payments", "shipping": null}}},
     "states": [{"state": {...}, "questions": {...}}],
     "options": {"deadline_ms": 500, "profile": "exact", "return_meta": true}}

- :func:`loads_checked` parses raw body bytes and reports every duplicate
  object key by its path (``json.loads`` alone keeps the last one silently);
- :func:`parse_request` validates a parsed body into a :class:`DecisionsRequest`.
  A bad question becomes an :class:`InvalidQuestion` in its place (answered
  ``invalid_question``, never failing its siblings); a malformed request, or
  one whose every question is invalid, raises :class:`RequestError`
  ``invalid_request`` listing each reason;
- :func:`parse_body` does both for the serve layer;
- :func:`softmax`, :func:`confidence` and the ``*_answer`` builders turn one
  logit per option into the answer shapes of the surface.

Answer shapes (``probabilities`` in option order; Score levels keyed ``"1"``..``"N"``):

- Choice ``{"type": "choice", "choice", "probabilities", "confidence"}``;
- Noul ``{"type": "noul", "noul"}``, ``noul`` = P(true);
- Score ``{"type": "score", "score", "probabilities", "confidence", "legend"}``,
  ``score`` the expected level;
- a failed question ``{"type", "error", "message"}``.
"""

from __future__ import annotations

import json
import math
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from vllm_srun.plugins.spec import RequestError

QUESTION_TYPES = ("choice", "noul", "score")
"""The System One question types."""

QUESTION_ERRORS = (
    "invalid_question",
    "max_length_exceeded",
    "deadline_exceeded",
    "invalid_model_output",
    "unavailable",
)
"""Codes a failed question answers with (``{type, error, message}``)."""

PROFILES = ("exact",)
"""Values ``options.profile`` accepts."""

REQUEST_FIELDS = ("model", "state", "questions", "states", "options")
ENTRY_FIELDS = ("state", "questions")
OPTION_FIELDS = ("deadline_ms", "profile", "return_meta")
QUESTION_FIELDS = ("type", "instructions", "criteria", "choices", "levels")
CHOICE_FIELDS = ("key", "description")

MIN_CHOICES, MAX_CHOICES = 2, 255
"""A Choice question has 2..255 options."""

MIN_LEVELS, MAX_LEVELS = 2, 10
"""A Score question has 2..10 levels."""

NOUL_KEYS = ("false", "true")
"""A Noul question's two options, in readout order (``noul`` is the second's probability)."""

INVISIBLE_CHARS = frozenset("\u200b\u200c\u200d\u2060\ufeff\u00ad\u034f\u115f\u1160\u3164")
"""Characters that render empty whatever their category: zero-width ones, the soft
hyphen, the combining grapheme joiner and the Hangul fillers."""

Path = tuple[str | int, ...]
"""Where a value sits in a JSON document: object keys and array indices from the root."""


# -- raw JSON ---------------------------------------------------------------------------------
class _Object(dict[str, Any]):
    """A parsed JSON object that remembers the keys it saw more than once."""

    repeated: list[str]


def _collect(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object()
    obj.repeated = []
    for key, value in pairs:
        if key in obj and key not in obj.repeated:
            obj.repeated.append(key)
        obj[key] = value
    return obj


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _plain(value: Any, path: Path, found: list[Path]) -> Any:
    """``value`` rebuilt from plain dicts and lists, duplicate keys appended to ``found``."""
    if isinstance(value, dict):
        found.extend((*path, key) for key in getattr(value, "repeated", ()))
        return {k: _plain(v, (*path, k), found) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, (*path, i), found) for i, v in enumerate(value)]
    return value


def loads_checked(
    raw: bytes | bytearray | str, *, constants: bool = False
) -> tuple[Any, list[Path]]:
    """Parse JSON text and report each duplicated object key.

    Args:
        raw: the body (UTF-8, UTF-16 or UTF-32 bytes, as :func:`json.loads` detects, or text).
        constants: accept ``NaN``/``Infinity`` (to find the duplicates of a
            document another parser already accepted; check its values apart).

    Returns:
        ``(value, duplicates)``: the document built from plain ``dict``/``list``
        (a duplicated key keeps its last value, as :func:`json.loads` does)
        and, in document order, the path of every key that appeared more than
        once in its object, e.g. ``("questions", "team", "criteria", "billing")``.

    Raises:
        RequestError: ``invalid_request`` when the text is not JSON, uses
            ``NaN``/``Infinity`` (which JSON does not have) without
            ``constants``, or nests too deeply to read.
    """
    try:
        value = json.loads(
            raw,
            object_pairs_hook=_collect,
            parse_constant=float if constants else _reject_constant,
        )
        found: list[Path] = []
        return _plain(value, (), found), found
    except (ValueError, UnicodeDecodeError) as err:
        raise RequestError("invalid_request", f"the body is not valid JSON: {err}") from err
    except RecursionError as err:
        raise RequestError(
            "invalid_request",
            "the body nests arrays or objects too deeply to read; flatten the state",
        ) from err


def non_finite(value: Any, path: Path = ()) -> Path | None:
    """The path of the first NaN or infinite number in a parsed document, or ``None``."""
    stack: list[tuple[Any, Path]] = [(value, path)]
    while stack:
        current, where = stack.pop()
        if isinstance(current, float) and not math.isfinite(current):
            return where
        if isinstance(current, dict):
            stack.extend((v, (*where, k)) for k, v in reversed(list(current.items())))
        elif isinstance(current, list):
            stack.extend((v, (*where, i)) for i, v in reversed(list(enumerate(current))))
    return None


def describe_path(path: Path) -> str:
    """``("questions", "q1", "choices", 0, "key")`` as ``questions.q1.choices[0].key``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


# -- the request ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Option:
    """One option of a question: what the answer is keyed by, and what it means.

    Attributes:
        key: the option's key (Choice: the client's key; Noul: ``false``/``true``;
            Score: the level ``"1"``..``"N"``).
        description: what the option means, or ``None``.
    """

    key: str
    description: str | None


@dataclass(frozen=True)
class Question:
    """A valid question.

    Attributes:
        name: the question's name in ``questions``.
        type: ``choice``, ``noul`` or ``score``.
        instructions: the question itself (non-blank).
        options: Choice: the client's options in order; Noul: ``false`` then
            ``true``; Score: levels ``"1"``..``"N"``, level 1 first.
    """

    name: str
    type: str
    instructions: str
    options: tuple[Option, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        """Option keys in readout order."""
        return tuple(option.key for option in self.options)


@dataclass(frozen=True)
class InvalidQuestion:
    """A question that breaks the schema; it answers ``invalid_question`` in its place.

    Attributes:
        name: the question's name.
        type: its ``type`` when that was one of :data:`QUESTION_TYPES`, else ``None``.
        message: what is wrong, naming the field (``questions.q1.criteria has 1 option; ...``).
    """

    name: str
    type: str | None
    message: str

    def answer(self) -> dict[str, Any]:
        """The failed answer ``{type, error: "invalid_question", message}``."""
        return failed_answer(self.type, "invalid_question", self.message)


@dataclass(frozen=True)
class StateEntry:
    """One state and the questions asked about it, in request order.

    Attributes:
        state: the state as sent: a string, an object or an array.
        questions: each question, valid or not, in request order.
        where: the JSON path of the entry (``()`` for the top level, ``("states", 0)``).
    """

    state: str | dict[str, Any] | list[Any]
    questions: tuple[Question | InvalidQuestion, ...]
    where: Path = ()

    @property
    def valid(self) -> tuple[Question, ...]:
        """The valid questions, in request order."""
        return tuple(q for q in self.questions if isinstance(q, Question))

    def state_text(self) -> str:
        """The state as the model reads it (see :func:`state_text`)."""
        return state_text(self.state)


@dataclass(frozen=True)
class DecisionsRequest:
    """A validated decisions request.

    Attributes:
        model: the ``model`` field, or ``None``.
        entries: the top-level state first, then each ``states`` entry.
        deadline_ms: ``options.deadline_ms``, or ``None``.
        profile: ``options.profile`` (only ``exact``).
        return_meta: ``options.return_meta``.
        has_states: whether the request carried ``states`` (the response then
            carries ``states`` too).
    """

    model: str | None
    entries: tuple[StateEntry, ...]
    deadline_ms: float | None = None
    profile: str = "exact"
    return_meta: bool = False
    has_states: bool = False
    problems: tuple[str, ...] = field(default=(), compare=False)

    @property
    def questions(self) -> int:
        """Questions in the request, valid or not, over every entry."""
        return sum(len(entry.questions) for entry in self.entries)


def state_text(state: str | Mapping[str, Any] | Sequence[Any]) -> str:
    """A state as the text a model reads.

    A string is returned unchanged; an object or an array is serialised as JSON
    with ``json.dumps(state, ensure_ascii=False, separators=(", ", ": "))``
    (the client's key order kept, non-ASCII text kept as is).
    """
    if isinstance(state, str):
        return state
    return json.dumps(state, ensure_ascii=False, separators=(", ", ": "))


def _finite(number: float) -> bool:
    """Whether ``number`` is a finite float (an integer too large for a float is not)."""
    try:
        return math.isfinite(number)
    except OverflowError:
        return False


BLANK_CATEGORIES = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp"})
"""Unicode categories that show nothing: controls, format characters (zero-width
joiners, invisible operators, the Mongolian vowel separator) and spaces."""


def is_blank(text: str) -> bool:
    """Whether ``text`` shows nothing: every character is whitespace, a control or
    format character (Unicode categories :data:`BLANK_CATEGORIES`), one of
    or one of :data:`INVISIBLE_CHARS`."""
    return all(
        ch.isspace() or ch in INVISIBLE_CHARS or unicodedata.category(ch) in BLANK_CATEGORIES
        for ch in text
    )


def is_encodable(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (a JSON ``\\ud800`` escape is a lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _unencodable(value: Any) -> bool:
    if isinstance(value, str):
        return not is_encodable(value)
    if isinstance(value, dict):
        return any(_unencodable(k) or _unencodable(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_unencodable(v) for v in value)
    return False


class _Invalid(Exception):
    """One question breaks the schema (internal: becomes :class:`InvalidQuestion`)."""


def _text(value: Any, where: str, *, nullable: bool = False) -> str | None:
    if value is None and nullable:
        return None
    if not isinstance(value, str):
        kind = "a string or null" if nullable else "a string"
        raise _Invalid(f"{where} must be {kind}, not {_kind(value)}")
    if is_blank(value):
        hint = " (use null for no description)" if nullable else ""
        raise _Invalid(f"{where} is blank{hint}")
    if not is_encodable(value):
        raise _Invalid(f"{where} holds a lone surrogate (not Unicode text)")
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "an object",
    }.get(type(value), type(value).__name__)


def _choices_list(value: Any, where: str) -> list[Option]:
    if not isinstance(value, list):
        raise _Invalid(f"{where} must be an array of {{key, description}}, not {_kind(value)}")
    options: list[Option] = []
    for index, item in enumerate(value):
        at = f"{where}[{index}]"
        if not isinstance(item, dict):
            raise _Invalid(f"{at} must be an object {{key, description}}, not {_kind(item)}")
        unknown = [k for k in item if k not in CHOICE_FIELDS]
        if unknown:
            raise _Invalid(f"{at}.{unknown[0]} is not a field of a choice (key, description)")
        if "key" not in item:
            raise _Invalid(f"{at}.key is missing")
        key = _text(item["key"], f"{at}.key")
        assert key is not None
        if any(o.key == key for o in options):
            raise _Invalid(f"{where} has the key {key!r} twice")
        options.append(
            Option(key, _text(item.get("description"), f"{at}.description", nullable=True))
        )
    return options


def _criteria_object(value: Any, where: str) -> list[Option]:
    if not isinstance(value, dict):
        raise _Invalid(
            f"{where} must be an object of option keys to descriptions, not {_kind(value)}"
        )
    options = []
    for key, description in value.items():
        if is_blank(key) or not is_encodable(key):
            raise _Invalid(f"{where} has a blank or malformed option key {key!r}")
        options.append(Option(key, _text(description, f"{where}.{key}", nullable=True)))
    return options


def _count(options: Sequence[Any], where: str, low: int, high: int, noun: str) -> None:
    if not low <= len(options) <= high:
        shown = noun if len(options) != 1 else noun.removesuffix("s")
        raise _Invalid(f"{where} has {len(options)} {shown}; a question takes {low} to {high}")


def _question(name: str, raw: Any, where: str, duplicates: Sequence[Path]) -> Question:
    if not isinstance(raw, dict):
        raise _Invalid(f"{where} must be an object, not {_kind(raw)}")
    if duplicates:
        path = describe_path(duplicates[0][:-1]) or where
        raise _Invalid(f"{path} has the key {duplicates[0][-1]!r} more than once")
    unknown = [k for k in raw if k not in QUESTION_FIELDS]
    if unknown:
        raise _Invalid(
            f"{where}.{unknown[0]} is not a field of a question ({', '.join(QUESTION_FIELDS)})"
        )
    kind = raw.get("type")
    if kind not in QUESTION_TYPES:
        shown = "missing" if "type" not in raw else f"{kind!r}"
        raise _Invalid(f"{where}.type must be one of {', '.join(QUESTION_TYPES)}, not {shown}")
    if "instructions" not in raw:
        raise _Invalid(f"{where}.instructions is missing")
    instructions = _text(raw["instructions"], f"{where}.instructions")
    assert instructions is not None
    alternative = {"choice": "choices", "noul": "choices", "score": "levels"}[kind]
    wrong = next(
        (f for f in ("choices", "levels") if f in raw and f != alternative),
        None,
    )
    if wrong is not None:
        raise _Invalid(f"{where}.{wrong} does not apply to a {kind} question; use {alternative}")
    if "criteria" in raw and alternative in raw:
        raise _Invalid(f"{where} takes criteria or {alternative}, not both")
    form = "criteria" if "criteria" in raw else alternative
    at = f"{where}.{form}"
    if kind == "choice":
        if form not in raw:
            raise _Invalid(f"{where} needs criteria (an object of options) or choices")
        options = (
            _criteria_object(raw[form], at) if form == "criteria" else _choices_list(raw[form], at)
        )
        _count(options, at, MIN_CHOICES, MAX_CHOICES, "options")
        return Question(name, kind, instructions, tuple(options))
    if kind == "noul":
        described: dict[str, str | None] = {"false": None, "true": None}
        if form in raw:
            given = (
                _criteria_object(raw[form], at)
                if form == "criteria"
                else _choices_list(raw[form], at)
            )
            keys = sorted(o.key for o in given)
            if keys != sorted(NOUL_KEYS):
                raise _Invalid(
                    f"{at} must have exactly the keys false and true, "
                    f"not {', '.join(keys) or 'none'}"
                )
            described = {o.key: o.description for o in given}
        return Question(name, kind, instructions, tuple(Option(k, described[k]) for k in NOUL_KEYS))
    if form not in raw:
        raise _Invalid(f"{where} needs criteria or levels (a list of level descriptions)")
    levels = raw[form]
    if not isinstance(levels, list):
        raise _Invalid(f"{at} must be an array of level descriptions, not {_kind(levels)}")
    _count(levels, at, MIN_LEVELS, MAX_LEVELS, "levels")
    options = []
    for index, description in enumerate(levels):
        text = _text(description, f"{at}[{index}]")
        options.append(Option(str(index + 1), text))
    return Question(name, kind, instructions, tuple(options))


def _under(duplicates: Iterable[Path], prefix: Path) -> list[Path]:
    return [d for d in duplicates if d[: len(prefix)] == prefix and len(d) > len(prefix)]


def _entry(raw: Mapping[str, Any], where: Path, duplicates: Sequence[Path]) -> StateEntry:
    label = describe_path(where)
    prefix = f"{label}." if label else ""
    state = raw.get("state")
    if "state" not in raw:
        hint = (
            "; give `state` and `questions`, and `states` for further {state, questions} entries"
            if not where and "states" in raw
            else ""
        )
        raise RequestError("invalid_request", f"{prefix}state is missing{hint}")
    if isinstance(state, str):
        if is_blank(state):
            raise RequestError("invalid_request", f"{prefix}state is blank")
    elif isinstance(state, dict | list) and not state:
        raise RequestError(
            "invalid_request",
            f"{prefix}state is an empty {'object' if isinstance(state, dict) else 'array'}: "
            "there is nothing to judge",
        )
    elif not isinstance(state, dict | list):
        raise RequestError(
            "invalid_request",
            f"{prefix}state must be text, an object or an array, not {_kind(state)}",
        )
    if _unencodable(state):
        raise RequestError("invalid_request", f"{prefix}state holds a lone surrogate")
    questions = raw.get("questions")
    if not isinstance(questions, dict) or not questions:
        shown = "missing" if "questions" not in raw else _kind(questions)
        if isinstance(questions, dict):
            shown = "empty"
        raise RequestError(
            "invalid_request",
            f"{prefix}questions must be an object of named questions, not {shown}",
        )
    parsed: list[Question | InvalidQuestion] = []
    for name, body in questions.items():
        where_q = (*where, "questions", name)
        label_q = describe_path(where_q)
        kind = body.get("type") if isinstance(body, dict) else None
        kind = kind if kind in QUESTION_TYPES else None
        try:
            if (*where, "questions", name) in duplicates:
                raise _Invalid(f"{prefix}questions has the question {name!r} more than once")
            if is_blank(name) or not is_encodable(name):
                raise _Invalid(f"{prefix}questions has a blank or malformed question name")
            parsed.append(_question(name, body, label_q, _under(duplicates, where_q)))
        except _Invalid as err:
            parsed.append(InvalidQuestion(name, kind, str(err)))
    return StateEntry(state, tuple(parsed), where)


def _options(raw: Any) -> tuple[float | None, str, bool]:
    if raw is None:
        return None, "exact", False
    if not isinstance(raw, dict):
        raise RequestError("invalid_request", f"options must be an object, not {_kind(raw)}")
    unknown = [k for k in raw if k not in OPTION_FIELDS]
    if unknown:
        raise RequestError(
            "invalid_request",
            f"options.{unknown[0]} is not an option of decisions ({', '.join(OPTION_FIELDS)})",
        )
    deadline = raw.get("deadline_ms")
    if deadline is not None and (
        type(deadline) not in (int, float) or not _finite(deadline) or deadline <= 0
    ):
        raise RequestError(
            "invalid_request", f"options.deadline_ms must be a number above 0, not {deadline!r}"
        )
    profile = raw.get("profile", "exact")
    if profile is None:
        profile = "exact"
    if profile not in PROFILES:
        raise RequestError(
            "invalid_request",
            f"options.profile must be one of {', '.join(PROFILES)}, not {profile!r}",
        )
    meta = raw.get("return_meta", False)
    if meta is None:
        meta = False
    if not isinstance(meta, bool):
        raise RequestError("invalid_request", "options.return_meta must be true or false")
    return deadline, profile, meta


def parse_request(
    body: Mapping[str, Any], duplicates: Iterable[Path] = (), *, extra_fields: Iterable[str] = ()
) -> DecisionsRequest:
    """Validate a decisions request body.

    Args:
        body: the parsed JSON object.
        duplicates: paths of duplicated keys from :func:`loads_checked`,
            relative to ``body`` (a serve layer that parsed a bundle strips the
            task's own prefix first).
        extra_fields: further top-level fields the caller handles itself
            (for example a bundle task's ``surface``); they are ignored here.

    Returns:
        The request; each question is a :class:`Question` or, when it breaks
        the schema, an :class:`InvalidQuestion` whose message names the field.

    Raises:
        RequestError: ``invalid_request`` when the request itself is malformed
            (not an object, an unknown field, a missing or blank ``state``, no
            ``questions``, a bad ``states`` entry or ``options``, a duplicated
            key outside a question) or when no question in it is valid; the
            message then lists every question's reason.
    """
    if not isinstance(body, Mapping):
        raise RequestError("invalid_request", "the request must be a JSON object")
    duplicates = list(duplicates)
    allowed = (*REQUEST_FIELDS, *extra_fields)
    unknown = [k for k in body if k not in allowed]
    if unknown:
        raise RequestError(
            "invalid_request",
            f"{unknown[0]} is not a field of a decisions request ({', '.join(REQUEST_FIELDS)})",
        )
    outside = [
        d
        for d in duplicates
        if not (
            (len(d) >= 2 and d[0] == "questions")
            or (len(d) >= 4 and d[0] == "states" and isinstance(d[1], int) and d[2] == "questions")
        )
    ]
    if outside:
        where = describe_path(outside[0][:-1]) or "the request"
        raise RequestError(
            "invalid_request", f"{where} has the key {outside[0][-1]!r} more than once"
        )
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("invalid_request", f"model must be a string, not {_kind(model)}")
    deadline, profile, meta = _options(body.get("options"))
    entries = [_entry(body, (), duplicates)]
    states = body.get("states")
    if states is not None:
        if not isinstance(states, list):
            raise RequestError(
                "invalid_request",
                f"states must be an array of {{state, questions}}, not {_kind(states)}",
            )
        for index, raw in enumerate(states):
            if not isinstance(raw, dict):
                raise RequestError(
                    "invalid_request",
                    f"states[{index}] must be an object {{state, questions}}, not {_kind(raw)}",
                )
            unknown = [k for k in raw if k not in ENTRY_FIELDS]
            if unknown:
                raise RequestError(
                    "invalid_request",
                    f"states[{index}].{unknown[0]} is not a field of a state entry "
                    "(state, questions)",
                )
            entries.append(_entry(raw, ("states", index), duplicates))
    problems = tuple(
        q.message for entry in entries for q in entry.questions if isinstance(q, InvalidQuestion)
    )
    if not any(entry.valid for entry in entries):
        raise RequestError("invalid_request", "no question is valid: " + "; ".join(problems))
    return DecisionsRequest(
        model=model,
        entries=tuple(entries),
        deadline_ms=deadline,
        profile=profile,
        return_meta=meta,
        has_states=states is not None,
        problems=problems,
    )


def parse_body(raw: bytes | bytearray | str) -> DecisionsRequest:
    """:func:`loads_checked` then :func:`parse_request`: raw body bytes to a validated request.

    Raises:
        RequestError: ``invalid_request`` (see both functions).
    """
    value, duplicates = loads_checked(raw)
    if not isinstance(value, dict):
        raise RequestError("invalid_request", "the request must be a JSON object")
    return parse_request(value, duplicates)


# -- readout maths ----------------------------------------------------------------------------
def softmax(logits: torch.Tensor | Sequence[float], temperature: float = 1.0) -> torch.Tensor:
    """Probabilities over options from one logit per option.

    ``p_i = exp((z_i - max z) / T) / sum_j exp((z_j - max z) / T)``, computed in
    float64 (so the probabilities sum to 1 within 1e-12, well inside the
    surface's 1e-6).

    Args:
        logits: ``[options]`` logits, any float dtype.
        temperature: ``T > 0``; above 1 flattens, below 1 sharpens.

    Returns:
        float64 ``[options]`` probabilities.

    Raises:
        ValueError: a non-positive or non-finite temperature, or fewer than one logit.
    """
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number above 0, not {temperature!r}")
    values = torch.as_tensor(logits, dtype=torch.float64, device="cpu").reshape(-1)
    if values.numel() < 1:
        raise ValueError("softmax needs at least one logit")
    scaled = (values - values.max()) / temperature
    weights = torch.exp(scaled)
    return weights / weights.sum()


def confidence(probabilities: torch.Tensor | Sequence[float]) -> float:
    """One minus the normalised entropy: ``1 - H(p) / ln N``, ``H(p) = -sum p_i ln p_i``.

    1 for a one-hot distribution, 0 for the uniform one (Shannon entropy
    divided by its maximum ``ln N``; ``0 ln 0 = 0``). Clamped to ``[0, 1]``.

    Raises:
        ValueError: fewer than two probabilities.
    """
    p = torch.as_tensor(probabilities, dtype=torch.float64, device="cpu").reshape(-1)
    if p.numel() < 2:
        raise ValueError("confidence needs at least two probabilities")
    terms = torch.where(p > 0, p * torch.log(p.clamp_min(1e-300)), torch.zeros_like(p))
    entropy = float(-terms.sum())
    return min(1.0, max(0.0, 1.0 - entropy / math.log(p.numel())))


def failed_answer(kind: str | None, code: str, message: str) -> dict[str, Any]:
    """A failed question ``{"type", "error", "message"}`` (``code``: :data:`QUESTION_ERRORS`)."""
    return {"type": kind, "error": code, "message": message}


def _checked(logits: torch.Tensor | Sequence[float], count: int) -> torch.Tensor | None:
    values = torch.as_tensor(logits, dtype=torch.float64, device="cpu").reshape(-1)
    if values.numel() != count or not bool(torch.isfinite(values).all()):
        return None
    return values


def _invalid_output(kind: str) -> dict[str, Any]:
    return failed_answer(kind, "invalid_model_output", "the model's logits are not finite")


def choice_answer(
    keys: Sequence[str], logits: torch.Tensor | Sequence[float], temperature: float = 1.0
) -> dict[str, Any]:
    """A Choice answer: the most probable key (the first on a tie), probabilities by key.

    Args:
        keys: the option keys, in the order of ``logits``.
        logits: one logit per option.
        temperature: the softmax temperature (see :func:`softmax`).

    Returns:
        ``{"type": "choice", "choice", "probabilities": {key: p}, "confidence"}``,
        or an ``invalid_model_output`` failure when a logit is not finite.
    """
    values = _checked(logits, len(keys))
    if values is None:
        return _invalid_output("choice")
    p = softmax(values, temperature)
    best = int(torch.argmax(p))
    return {
        "type": "choice",
        "choice": keys[best],
        "probabilities": {key: float(v) for key, v in zip(keys, p.tolist(), strict=True)},
        "confidence": confidence(p),
    }


def noul_answer(logits: torch.Tensor | Sequence[float], temperature: float = 1.0) -> dict[str, Any]:
    """A Noul answer: ``{"type": "noul", "noul": P(true)}``.

    Args:
        logits: ``[false, true]`` logits (the order of :data:`NOUL_KEYS`).
        temperature: the softmax temperature.
    """
    values = _checked(logits, 2)
    if values is None:
        return _invalid_output("noul")
    return {"type": "noul", "noul": float(softmax(values, temperature)[1])}


def score_answer(
    descriptions: Sequence[str | None],
    logits: torch.Tensor | Sequence[float],
    temperature: float = 1.0,
) -> dict[str, Any]:
    """A Score answer over levels ``1..N``.

    ``score = sum_k k * p_k`` (the expected level); ``probabilities`` and
    ``legend`` are keyed ``"1"``..``"N"``.

    Args:
        descriptions: level descriptions, level 1 first.
        logits: one logit per level, level 1 first.
        temperature: the softmax temperature.
    """
    values = _checked(logits, len(descriptions))
    if values is None:
        return _invalid_output("score")
    p = softmax(values, temperature)
    levels = torch.arange(1, len(descriptions) + 1, dtype=torch.float64)
    keys = [str(k) for k in range(1, len(descriptions) + 1)]
    return {
        "type": "score",
        "score": float((p * levels).sum()),
        "probabilities": {k: float(v) for k, v in zip(keys, p.tolist(), strict=True)},
        "confidence": confidence(p),
        "legend": dict(zip(keys, descriptions, strict=True)),
    }


def answer(
    question: Question, logits: torch.Tensor | Sequence[float], temperature: float = 1.0
) -> dict[str, Any]:
    """The answer to ``question`` from one logit per option (in ``question.options`` order)."""
    if question.type == "choice":
        return choice_answer(question.keys, logits, temperature)
    if question.type == "noul":
        return noul_answer(logits, temperature)
    return score_answer([o.description for o in question.options], logits, temperature)


def usage(input_tokens: int, output_tokens: int = 0) -> dict[str, int]:
    """The response's ``usage`` object ``{"input_tokens", "output_tokens"}``."""
    return {"input_tokens": input_tokens, "output_tokens": output_tokens}


def response_body(
    request: DecisionsRequest, answered: Sequence[dict[str, Any]], input_tokens: int
) -> dict[str, Any]:
    """The response body (without ``model`` and ``meta``) from each entry's answers.

    Args:
        request: the validated request.
        answered: one ``{question name: answer}`` per entry, the top-level state first.
        input_tokens: the prompt tokens the answers read.

    Returns:
        ``{"answers", "usage"}``, plus ``"states": [{"index", "answers"}]``
        (``index`` counting the ``states`` entries from 0) when the request had
        ``states``.
    """
    body: dict[str, Any] = {"answers": answered[0], "usage": usage(input_tokens, 0)}
    if request.has_states:
        body["states"] = [
            {"index": i, "answers": answers} for i, answers in enumerate(answered[1:])
        ]
    return body


__all__ = [
    "MAX_CHOICES",
    "MAX_LEVELS",
    "MIN_CHOICES",
    "MIN_LEVELS",
    "NOUL_KEYS",
    "PROFILES",
    "QUESTION_ERRORS",
    "QUESTION_TYPES",
    "DecisionsRequest",
    "InvalidQuestion",
    "Option",
    "Path",
    "Question",
    "StateEntry",
    "answer",
    "choice_answer",
    "confidence",
    "describe_path",
    "failed_answer",
    "is_blank",
    "is_encodable",
    "loads_checked",
    "non_finite",
    "noul_answer",
    "parse_body",
    "parse_request",
    "response_body",
    "score_answer",
    "softmax",
    "state_text",
    "usage",
]
