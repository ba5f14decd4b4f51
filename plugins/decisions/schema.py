"""The decisions request schema: every rule a body must follow, and the parsers.

:func:`parse_request` validates a parsed body into a
:class:`~.questions.DecisionsRequest`; :func:`parse_body` reads raw bytes with
:func:`~.body.loads_checked` first. Two kinds of failure, kept apart:

- a question that breaks the schema (unknown field, wrong ``type``, blank
  instructions, too few or too many options, a duplicated key inside it, ...)
  becomes an :class:`~.questions.InvalidQuestion` in its place, whose message
  names the field (``questions.q1.criteria has 1 option; a question takes 2 to
  255``); its siblings are still answered;
- a malformed request (not an object, an unknown top-level field, a missing or
  blank ``state``, no ``questions``, bad ``states`` or ``options``, a
  non-empty ``images``, a duplicated key outside a question), or one with no
  valid question at all, raises :class:`~vllm_srun.plugins.spec.RequestError`
  ``invalid_request``.

``states`` holds further ``{state, questions, images?}`` entries, each answered
as its own request would be: an array (messages name ``states[0]``) or, as the
router's contract sends it, an object of named entries (messages name
``states.alpha``; a name must show something). ``images`` (on the request or an
entry) may be left out, null or empty: no decision model here reads images.

Text fields must show something (:func:`is_blank`) and be real Unicode
(:func:`is_encodable`: a JSON ``\\ud800`` escape is a lone surrogate).

Why this module is over 400 lines: it is one schema, every rule next to the
message that names the field it checks; the parsed objects (:mod:`.questions`)
and the JSON reader (:mod:`.body`) already live apart, and cutting the rules
further would part the question rules from the request rules that call them.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vllm_srun.plugins.profiles import PROFILE_NAME, not_a_profile_name
from vllm_srun.plugins.spec import RequestError, clip, listed

from .body import Path, describe_path, loads_checked
from .questions import (
    NOUL_KEYS,
    QUESTION_TYPES,
    DecisionsRequest,
    InvalidQuestion,
    Option,
    Question,
    StateEntry,
    state_text,
)

REQUEST_FIELDS = ("model", "state", "questions", "states", "images", "options")
ENTRY_FIELDS = ("state", "questions", "images")
OPTION_FIELDS = ("deadline_ms", "profile", "return_meta")
QUESTION_FIELDS = ("type", "instructions", "criteria", "choices", "levels")
CHOICE_FIELDS = ("key", "description")

MIN_CHOICES, MAX_CHOICES = 2, 255
"""A Choice question has 2..255 options."""

MIN_LEVELS, MAX_LEVELS = 2, 10
"""A Score question has 2..10 levels."""

INVISIBLE_CHARS = frozenset("\u200b\u200c\u200d\u2060\ufeff\u00ad\u034f\u115f\u1160\u3164")
"""Characters that render empty whatever their category: zero-width ones, the soft
hyphen, the combining grapheme joiner and the Hangul fillers."""


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
    format character (Unicode categories :data:`BLANK_CATEGORIES`) or one of
    :data:`INVISIBLE_CHARS`."""
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


class InvalidQuestions(RequestError):
    """A request refused whole because questions in it break the schema
    (:func:`parse_request` with ``refuse_invalid``).

    Attributes:
        questions: ``(path, message)`` of each invalid question, in request order; the
            path locates the question in the body (``("questions", "q1")``,
            ``("states", 0, "questions", "q1")``).
    """

    def __init__(self, questions: Sequence[tuple[Path, str]]) -> None:
        super().__init__(
            "invalid_request", f"questions break the schema: {listed([m for _, m in questions])}"
        )
        self.questions = tuple(questions)


class _Invalid(Exception):
    """One question breaks the schema (internal: becomes :class:`InvalidQuestion`)."""


def _text(value: Any, where: str, *, nullable: bool = False, structured: bool = True) -> str | None:
    """A text field as the model reads it.

    A string is kept as sent; with ``structured``, an object or an array (structured text,
    as the Jev SDKs send it) reads as its JSON (:func:`~.questions.state_text`). Keys stay
    strings (``structured=False``).
    """
    if value is None and nullable:
        return None
    if structured and isinstance(value, dict | list):
        if not value or _blank_structure(value):
            raise _Invalid(
                f"{where} is an empty {'object' if isinstance(value, dict) else 'array'}"
            )
        if _unencodable(value):
            raise _Invalid(f"{where} holds a lone surrogate (not Unicode text)")
        return state_text(value)
    if not isinstance(value, str):
        kind = "a string" if not structured else "text, an object or an array"
        kind += ", or null" if nullable else ""
        raise _Invalid(f"{where} must be {kind}, not {_kind(value)}")
    if is_blank(value):
        hint = " (use null for no description)" if nullable else ""
        raise _Invalid(f"{where} is blank{hint}")
    if not is_encodable(value):
        raise _Invalid(f"{where} holds a lone surrogate (not Unicode text)")
    return value


def _blank_structure(value: Any) -> bool:
    """Whether structured text holds nothing to read: no value anywhere but blank
    strings, nulls and empty containers."""
    if isinstance(value, dict):
        return all(_blank_structure(v) for v in value.values())
    if isinstance(value, list):
        return all(_blank_structure(v) for v in value)
    if isinstance(value, str):
        return is_blank(value)
    return value is None


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
            raise _Invalid(f"{at}.{clip(unknown[0])} is not a field of a choice (key, description)")
        if "key" not in item:
            raise _Invalid(f"{at}.key is missing")
        key = _text(item["key"], f"{at}.key", structured=False)
        assert key is not None
        if any(o.key == key for o in options):
            raise _Invalid(f"{where} has the key {clip(key)!r} twice")
        description = item.get("description")
        if description == "":
            description = None  # the router's Go client sends a missing description as ""
        options.append(Option(key, _text(description, f"{at}.description", nullable=True)))
    return options


def _criteria_object(value: Any, where: str) -> list[Option]:
    if not isinstance(value, dict):
        raise _Invalid(
            f"{where} must be an object of option keys to descriptions, not {_kind(value)}"
        )
    options = []
    for key, description in value.items():
        if is_blank(key) or not is_encodable(key):
            raise _Invalid(f"{where} has a blank or malformed option key {clip(key)!r}")
        options.append(Option(key, _text(description, f"{where}.{key}", nullable=True)))
    return options


def _count(options: Sequence[Any], where: str, low: int, high: int, noun: str) -> None:
    if not low <= len(options) <= high:
        shown = noun if len(options) != 1 else noun.removesuffix("s")
        raise _Invalid(f"{where} has {len(options)} {shown}; a question takes {low} to {high}")


def _noul_options(raw: dict[str, Any], form: str, at: str) -> tuple[Option, ...]:
    """A Noul question's ``false`` and ``true`` options from its ``criteria`` or ``choices``:
    absent, null or empty leaves both undescribed; one side alone describes that side."""
    described: dict[str, str | None] = {"false": None, "true": None}
    value = raw.get(form)
    if value is not None:
        given = _criteria_object(value, at) if form == "criteria" else _choices_list(value, at)
        keys = [o.key for o in given]
        if any(key not in NOUL_KEYS for key in keys):
            raise _Invalid(
                f"{at} takes the keys false and true (either or both), "
                f"not {', '.join(sorted(keys))}"
            )
        described |= {o.key: o.description for o in given}
    return tuple(Option(k, described[k]) for k in NOUL_KEYS)


def _question(
    name: str,
    raw: Any,
    where: str,
    duplicates: Sequence[Path],
    *,
    instructions_optional: bool = False,
) -> Question:
    if not isinstance(raw, dict):
        raise _Invalid(f"{where} must be an object, not {_kind(raw)}")
    if duplicates:
        path = describe_path(duplicates[0][:-1]) or where
        raise _Invalid(f"{path} has the key {duplicates[0][-1]!r} more than once")
    unknown = [k for k in raw if k not in QUESTION_FIELDS]
    if unknown:
        raise _Invalid(
            f"{where}.{clip(unknown[0])} is not a field of a question "
            f"({', '.join(QUESTION_FIELDS)})"
        )
    kind = raw.get("type")
    if kind not in QUESTION_TYPES:
        shown = "missing" if "type" not in raw else f"{kind!r}"
        raise _Invalid(f"{where}.type must be one of {', '.join(QUESTION_TYPES)}, not {shown}")
    given = raw.get("instructions")
    instructions = None if given is None else _text(given, f"{where}.instructions")
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
    if kind == "noul":
        noul = _noul_options(raw, form, at)
        if instructions is None and all(o.description is None for o in noul):
            # (criteria describing true or false would do instead: the Jev SDKs' rule)
            raise _Invalid(f"{where}.instructions is missing")
        return Question(name, kind, instructions or "", noul)
    if instructions is None and not instructions_optional:
        raise _Invalid(f"{where}.instructions is missing")
    instructions = instructions or ""
    if kind == "choice":
        if form not in raw:
            raise _Invalid(f"{where} needs criteria (an object of options) or choices")
        options = (
            _criteria_object(raw[form], at) if form == "criteria" else _choices_list(raw[form], at)
        )
        _count(options, at, MIN_CHOICES, MAX_CHOICES, "options")
        return Question(name, kind, instructions, tuple(options))
    if form not in raw:
        raise _Invalid(f"{where} needs criteria or levels (a list of level descriptions)")
    levels = raw[form]
    if not isinstance(levels, list):
        raise _Invalid(f"{at} must be an array of level descriptions, not {_kind(levels)}")
    _count(levels, at, MIN_LEVELS, MAX_LEVELS, "levels")
    options = []
    for index, description in enumerate(levels):
        text = _text(description, f"{at}[{index}]")
        options.append(Option(str(index), text))
    return Question(name, kind, instructions, tuple(options))


def _under(duplicates: Iterable[Path], prefix: Path) -> list[Path]:
    return [d for d in duplicates if d[: len(prefix)] == prefix and len(d) > len(prefix)]


def _entry(
    raw: Mapping[str, Any],
    where: Path,
    duplicates: Sequence[Path],
    *,
    instructions_optional: bool = False,
) -> StateEntry:
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
    _images(raw.get("images"), prefix)
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
                raise _Invalid(f"{prefix}questions has the question {clip(name)!r} more than once")
            if is_blank(name) or not is_encodable(name):
                raise _Invalid(f"{prefix}questions has a blank or malformed question name")
            parsed.append(
                _question(
                    name,
                    body,
                    label_q,
                    _under(duplicates, where_q),
                    instructions_optional=instructions_optional,
                )
            )
        except _Invalid as err:
            parsed.append(InvalidQuestion(name, kind, str(err)))
    return StateEntry(state, tuple(parsed), where)


def _images(images: Any, prefix: str) -> None:
    """``images`` of the request or of a ``states`` entry: absent, null or an empty array.

    No decision model served here reads images (their cards list the ``text``
    modality only), so a non-empty array is refused rather than ignored: the
    answers would not have looked at the pictures.
    """
    if images is None:
        return
    if not isinstance(images, list):
        raise RequestError(
            "invalid_request", f"{prefix}images must be an array, not {_kind(images)}"
        )
    if images:
        shown = "1 image" if len(images) == 1 else f"{len(images)} images"
        raise RequestError(
            "invalid_request",
            f"{prefix}images holds {shown}, but this model has no image modality; "
            "describe the images in the state as text, and send images as [] or leave it out",
        )


def _state_entries(
    states: Any, duplicates: Sequence[Path], *, instructions_optional: bool = False
) -> list[StateEntry]:
    """The ``states`` entries: an array (``states[0]``, ...) or an object of named
    entries (``states.alpha``, ...), each ``{state, questions, images?}``."""
    if isinstance(states, list):
        pairs: list[tuple[str | int, Any]] = list(enumerate(states))
    elif isinstance(states, dict):
        pairs = list(states.items())
        for name, _ in pairs:
            if not isinstance(name, str) or is_blank(name) or not is_encodable(name):
                raise RequestError(
                    "invalid_request",
                    f"states has a blank or malformed state name {clip(str(name))!r}; name each "
                    "entry with visible text",
                )
    else:
        raise RequestError(
            "invalid_request",
            "states must be an object of named {state, questions} entries or an array of "
            f"them, not {_kind(states)}",
        )
    entries = []
    for key, raw in pairs:
        where: Path = ("states", key)
        label = describe_path(where)
        if not isinstance(raw, dict):
            raise RequestError(
                "invalid_request",
                f"{label} must be an object {{state, questions}}, not {_kind(raw)}",
            )
        unknown = [k for k in raw if k not in ENTRY_FIELDS]
        if unknown:
            raise RequestError(
                "invalid_request",
                f"{label}.{clip(unknown[0])} is not a field of a state entry "
                f"({', '.join(ENTRY_FIELDS)})",
            )
        entries.append(_entry(raw, where, duplicates, instructions_optional=instructions_optional))
    return entries


def _options(raw: Any) -> tuple[float | None, str | None, bool]:
    if raw is None:
        return None, None, False
    if not isinstance(raw, dict):
        raise RequestError("invalid_request", f"options must be an object, not {_kind(raw)}")
    unknown = [k for k in raw if k not in OPTION_FIELDS]
    if unknown:
        raise RequestError(
            "invalid_request",
            f"options.{clip(unknown[0])} is not an option of decisions "
            f"({', '.join(OPTION_FIELDS)})",
        )
    deadline = raw.get("deadline_ms")
    if deadline is not None and (
        type(deadline) not in (int, float) or not _finite(deadline) or deadline <= 0
    ):
        raise RequestError(
            "invalid_request", f"options.deadline_ms must be a number above 0, not {deadline!r}"
        )
    profile = raw.get("profile")
    if profile is not None and (not isinstance(profile, str) or not PROFILE_NAME.match(profile)):
        raise RequestError("invalid_request", not_a_profile_name("options.profile", profile))
    meta = raw.get("return_meta", False)
    if meta is None:
        meta = False
    if not isinstance(meta, bool):
        raise RequestError("invalid_request", "options.return_meta must be true or false")
    return deadline, profile, meta


def parse_request(
    body: Mapping[str, Any],
    duplicates: Iterable[Path] = (),
    *,
    extra_fields: Iterable[str] = (),
    instructions_optional: bool = False,
    refuse_invalid: bool = False,
) -> DecisionsRequest:
    """Validate a decisions request body.

    Args:
        body: the parsed JSON object.
        duplicates: paths of duplicated keys from :func:`loads_checked`,
            relative to ``body`` (a serve layer that parsed a bundle strips the
            task's own prefix first).
        extra_fields: further top-level fields the caller handles itself
            (for example a bundle task's ``surface``); they are ignored here.
        instructions_optional: a Choice or Score question may leave ``instructions``
            out (the Jev schema's rule: its options say what is asked); a Noul question
            may in every schema, when its criteria describe true or false.
        refuse_invalid: refuse the whole request when any question is invalid
            (:class:`InvalidQuestions`) instead of answering it ``invalid_question``
            in its place.

    Returns:
        The request; each question is a :class:`Question` or, when it breaks
        the schema, an :class:`InvalidQuestion` whose message names the field.

    Raises:
        RequestError: ``invalid_request`` when the request itself is malformed
            (not an object, an unknown field, a missing or blank ``state``, no
            ``questions``, a bad ``states`` entry or name, a bad ``options``, a
            non-empty ``images``, a duplicated key outside a question) or when
            no question in it is valid; the message then lists every
            question's reason.
        InvalidQuestions: with ``refuse_invalid``, a question is invalid.
    """
    if not isinstance(body, Mapping):
        raise RequestError("invalid_request", "the request must be a JSON object")
    duplicates = list(duplicates)
    allowed = (*REQUEST_FIELDS, *extra_fields)
    unknown = [k for k in body if k not in allowed]
    if unknown:
        raise RequestError(
            "invalid_request",
            f"{clip(unknown[0])} is not a field of a decisions request "
            f"({', '.join(REQUEST_FIELDS)})",
        )
    outside = [
        d
        for d in duplicates
        if not (
            (len(d) >= 2 and d[0] == "questions")
            or (len(d) >= 4 and d[0] == "states" and d[2] == "questions")
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
    optional = instructions_optional
    entries = [_entry(body, (), duplicates, instructions_optional=optional)]
    states = body.get("states")
    if states is not None:
        entries += _state_entries(states, duplicates, instructions_optional=optional)
    problems = tuple(
        q.message for entry in entries for q in entry.questions if isinstance(q, InvalidQuestion)
    )
    if refuse_invalid and problems:
        raise InvalidQuestions(
            [
                ((*entry.where, "questions", q.name), q.message)
                for entry in entries
                for q in entry.questions
                if isinstance(q, InvalidQuestion)
            ]
        )
    if not any(entry.valid for entry in entries):
        raise RequestError("invalid_request", f"no question is valid: {listed(problems)}")
    return DecisionsRequest(
        model=model,
        entries=tuple(entries),
        deadline_ms=deadline,
        profile=profile,
        return_meta=meta,
        has_states=states is not None,
        named_states=isinstance(states, dict),
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
