"""Per-model engine arguments, defined once; and how a declared option becomes a
command-line option.

:class:`EngineArgs` is the one place an option a model can take is written:
its default, its check and its help. From it come the ``vllm-srun serve``
command-line options (:func:`add_engine_arguments`), the checks of a models
file entry (:func:`check_entry_value`, the same rules and messages as the
command line) and the card's ``engine_args`` (:meth:`EngineArgs.card`). A
models-file entry is an :class:`EngineArgs` plus the model it names
(:class:`vllm_srun.config.ModelConfig`).

The process-wide options (:class:`vllm_srun.config.ServeConfig`) are
declared the same way, with :func:`option`; :func:`add_arguments` and
:func:`namespace_values` turn any such declaration into argparse options and
back.

Why this module is over 400 lines: every per-model option is declared here once,
with its check and help, and the command line, the models file and the card are all
generated from those declarations; split, an option's rules would be written twice.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from vllm_srun.plugins.cards import Scalar

DTYPES = ("auto", "float32", "bfloat16", "float16")
"""``--dtype`` values: ``auto`` is the precision the model was released in."""


@dataclass(frozen=True)
class Rule:
    """How one engine argument is checked and shown.

    Attributes:
        kind: ``text`` (not blank), ``profile`` (a profile name:
            :func:`profile_name_problem`), ``choice``, ``count`` (an int of at least
            1), ``count0`` (an int of 0 or more), ``amount`` (a finite number
            above 0), ``amount0`` (a finite number of 0 or more), ``port`` (an
            int from 0 to 65535), ``switch`` (a bool; ``--x`` / ``--no-x`` on
            the command line), ``flag`` (a bool; ``--x`` only, off by default)
            or ``repeat`` (a tuple of texts; the option may be given several
            times).
        help: the command line's help text.
        flag: the command-line option (``--memory-budget``); by default the
            field name with dashes.
        metavar: the placeholder the help shows for the value.
        choices: the accepted values of a ``choice``.
        on_card: whether the card's ``engine_args`` shows the value in effect.
    """

    kind: str
    help: str
    flag: str | None = None
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    on_card: bool = False


def option(default: Any, **rule: Any) -> Any:
    """A dataclass field declaring one option: its ``default`` and its :class:`Rule`
    (``kind``, ``help``, and optionally ``flag``, ``metavar``, ``choices``, ``on_card``).

    Raises:
        TypeError: a keyword :class:`Rule` does not take.
    """
    return dataclasses.field(default=default, metadata={"rule": Rule(**rule)})


@dataclass(kw_only=True)
class EngineArgs:
    """The options one served model takes; what a models-file entry leaves out takes
    the command line's value, and what the command line leaves out takes these defaults
    (the command reference's)."""

    device: str = option("auto", kind="text", help="auto, or cpu, cuda[:N], rocm[:N], ...")
    engine: str = option(
        "auto",
        kind="text",
        on_card=True,
        help="auto, or an installed engine (see `vllm-srun plugins`)",
    )
    family: str | None = option(None, kind="text", help="force a model-family plugin")
    memory_budget_gib: float | None = option(
        None,
        kind="amount",
        flag="--memory-budget",
        metavar="GIB",
        help="refuse to load a model whose estimated size is above this many GiB",
    )
    max_model_len: int | None = option(
        None,
        kind="count",
        on_card=True,
        help="decision models: most tokens of one question (state, instructions and options); "
        "a longer question answers max_length_exceeded",
    )
    max_num_seqs: int = option(
        8192,
        kind="count",
        on_card=True,
        help="most rows in one forward, across requests (1 runs each row alone)",
    )
    max_num_batched_tokens: int = option(
        65536,
        kind="count",
        on_card=True,
        help="most padded tokens in one forward (rows times the longest row)",
    )
    batch_window_ms: float = option(
        2.0,
        kind="amount0",
        on_card=True,
        help="how long a busy worker waits after the oldest queued request for more",
    )
    dtype: str = option(
        "auto",
        kind="choice",
        choices=DTYPES,
        on_card=True,
        help="auto: the precision the model was released in (under --profile max_speed, "
        "bfloat16 for an embedder on a CPU that computes bfloat16 in hardware; pin float32 "
        "to keep it); "
        "float16 runs on GPUs only",
    )
    enable_shared_context: bool | None = option(
        None,
        kind="switch",
        on_card=True,
        help="decision models: compute a multi-question request's shared state once "
        "(default: by model family)",
    )
    profile: str = option(
        "exact",
        kind="profile",
        metavar="NAME",
        on_card=True,
        help="numeric profile: exact (bit-identical, the default), batching (cross-request "
        "batching within 1e-5), max_speed (fastest, approximate: bfloat16 or a fused ONNX "
        "graph, the card says which), or one an installed engine declares",
    )
    base_path: str | None = option(
        None,
        kind="text",
        metavar="DIR",
        on_card=True,
        help="adapter packages: a local copy of the pinned base model, instead of downloading "
        "it; its files are checked against the hashes the package records",
    )

    def card(self) -> dict[str, Scalar]:
        """The values in effect of the arguments the card shows (``engine_args``)."""
        return {f.name: getattr(self, f.name) for f in engine_fields() if rule(f).on_card}

    def engine_args(self) -> EngineArgs:
        """Only the engine arguments (a models-file entry carries more)."""
        return EngineArgs(**{f.name: getattr(self, f.name) for f in engine_fields()})


def engine_fields() -> tuple[dataclasses.Field[Any], ...]:
    """The fields of :class:`EngineArgs`, in declaration order."""
    return dataclasses.fields(EngineArgs)


def rule(field: dataclasses.Field[Any]) -> Rule:
    """The :class:`Rule` of an :class:`EngineArgs` field."""
    found: Rule = field.metadata["rule"]
    return found


# -- the command line ------------------------------------------------------------------------
def non_blank(text: str) -> str:
    """An argparse type: text that is not empty or only whitespace.

    Raises:
        argparse.ArgumentTypeError: ``must not be blank``.
    """
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be blank")
    return text


def port_number(text: str) -> int:
    """An argparse type: a TCP port, an int from 0 to 65535 (0: any free port).

    Raises:
        argparse.ArgumentTypeError: not an int, or outside 0..65535.
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number, not {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(
            f"must be a port number from 0 to 65535 (0: any free port), not {value}"
        )
    return value


def positive_int(text: str) -> int:
    """An argparse type: an int of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: an int of 0 or more."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number above 0."""
    value = float(text)
    if not value > 0 or value == math.inf:
        raise argparse.ArgumentTypeError(f"must be a number above 0, not {text}")
    return value


def non_negative_float(text: str) -> float:
    """An argparse type: a number of 0 or more."""
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


PROFILE_NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
"""A profile name as ``--profile`` and a models file take it: the plugin API's
:data:`~vllm_srun.plugins.profiles.PROFILE_NAME` (lower-case letters, digits and ``_``,
starting with a letter), at most 64 characters. Written here so that parsing the
command line imports no plugin."""

STANDARD_PROFILE_NAMES = ("exact", "batching", "max_speed")
"""The standard profiles' names (:data:`~vllm_srun.plugins.profiles.STANDARD_PROFILES`)."""


def profile_name_problem(value: str) -> str | None:
    """Why ``value`` is not a profile name, with the fix; ``None`` when it is one.

    A value that becomes a standard name once lower-cased, with ``-`` and spaces
    read as ``_``, gets a "did you mean"; a long value is shortened in the message.
    """
    if PROFILE_NAME_PATTERN.match(value):
        return None
    shown = value if len(value) <= 40 else f"{value[:40]}... ({len(value)} characters)"
    guess = re.sub(r"[-\s]+", "_", value.strip().lower())
    hint = f"did you mean {guess}? " if guess in STANDARD_PROFILE_NAMES else ""
    return (
        f"{shown!r} is not a profile name: {hint}a profile name is lower-case letters, digits "
        "and _, starting with a letter, at most 64 characters, such as "
        + ", ".join(STANDARD_PROFILE_NAMES)
    )


def profile_name(text: str) -> str:
    """An argparse type: a profile name (:func:`profile_name_problem`)."""
    problem = profile_name_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


ARGPARSE_TYPES: dict[str, Callable[[str], Any]] = {
    "profile": profile_name,
    "text": non_blank,
    "port": port_number,
    "count": positive_int,
    "count0": non_negative_int,
    "amount": positive_float,
    "amount0": non_negative_float,
}


def flag(field: dataclasses.Field[Any]) -> str:
    """The command-line option of a field (``--max-num-seqs``)."""
    return rule(field).flag or "--" + field.name.replace("_", "-")


def add_arguments(parser: Any, fields: Iterable[dataclasses.Field[Any]]) -> None:
    """Add one command-line option per declared field (:func:`option`) to ``parser``,
    in the order given: the field's :func:`flag`, its default, its help, and the
    argparse type, action or choices of its kind. The parsed value lands under
    the field's name (:func:`namespace_values` reads it back).

    Raises:
        KeyError: a field declared without a :class:`Rule`.
    """
    for field in fields:
        spec = rule(field)
        options: dict[str, Any] = {"dest": field.name, "default": field.default, "help": spec.help}
        if spec.kind == "switch":
            options["action"] = argparse.BooleanOptionalAction
        elif spec.kind == "flag":
            options["action"] = "store_true"
        elif spec.kind == "repeat":
            options["action"] = "append"
            options["default"] = []  # argparse appends to a copy of a list, never a tuple
        elif spec.kind == "choice":
            options["choices"] = spec.choices
        elif spec.kind in ARGPARSE_TYPES:
            options["type"] = ARGPARSE_TYPES[spec.kind]
        if spec.metavar:
            options["metavar"] = spec.metavar
        parser.add_argument(flag(field), **options)


def namespace_values(
    args: argparse.Namespace, fields: Iterable[dataclasses.Field[Any]]
) -> dict[str, Any]:
    """The values :func:`add_arguments` parsed for ``fields``, by field name (a
    ``repeat`` option as a tuple), ready to pass to the dataclass that declares them."""
    values: dict[str, Any] = {}
    for field in fields:
        value = getattr(args, field.name)
        values[field.name] = tuple(value) if rule(field).kind == "repeat" else value
    return values


def add_engine_arguments(
    parser: argparse.ArgumentParser, only: tuple[str, ...] | None = None
) -> None:
    """Add the engine arguments (every one, or those named in ``only``) to ``parser``
    as options with their defaults and help."""
    add_arguments(parser, [f for f in engine_fields() if only is None or f.name in only])


def from_namespace(args: argparse.Namespace) -> EngineArgs:
    """The :class:`EngineArgs` parsed by :func:`add_engine_arguments`."""
    return EngineArgs(**namespace_values(args, engine_fields()))


# -- a models file ---------------------------------------------------------------------------
TYPES = {
    "profile": (str,),
    "text": (str,),
    "choice": (str,),
    "count": (int,),
    "count0": (int,),
    "amount": (int, float),
    "amount0": (int, float),
    "switch": (bool,),
}
"""The YAML types each kind accepts (a bool is never a number here)."""


class EntryValueError(ValueError):
    """A models-file value of the wrong type or out of range; the message names the key."""


def check_entry_value(key: str, value: Any) -> Any:
    """``value`` for the engine argument ``key`` of a models-file entry, checked as the
    command line checks it.

    Raises:
        EntryValueError: ``KEY must be int`` (or the other types), ``KEY is
            blank; ...`` (a text of only whitespace),
            ``KEY must be at least 1, not V``, ``KEY must be a number above 0,
            not V``, ``KEY must be 0 or more, not V``, ``KEY must be one of
            ..., not V``.
        KeyError: ``key`` is not an engine argument.
    """
    spec = rule({f.name: f for f in engine_fields()}[key])
    types = TYPES[spec.kind]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise EntryValueError(f"{key} must be {' or '.join(t.__name__ for t in types)}")
    if spec.kind == "profile" and (problem := profile_name_problem(cast(str, value))):
        raise EntryValueError(f"{key} {problem}: fix it or leave {key} out")
    if spec.kind == "text" and not cast(str, value).strip():
        raise EntryValueError(
            f"{key} is blank; give a value, or leave {key} out to take the command line's"
        )
    if spec.kind in ("profile", "text", "choice", "switch"):
        if spec.kind == "choice" and value not in spec.choices:
            raise EntryValueError(f"{key} must be one of {', '.join(spec.choices)}, not {value!r}")
        return value
    number = cast(float, value)
    if spec.kind == "count" and number < 1:
        raise EntryValueError(f"{key} must be at least 1, not {value}")
    if spec.kind == "count0" and number < 0:
        raise EntryValueError(f"{key} must be 0 or more, not {value}")
    if spec.kind == "amount" and not 0 < number < math.inf:
        raise EntryValueError(f"{key} must be a number above 0, not {value}")
    if spec.kind == "amount0" and not 0 <= number < math.inf:
        raise EntryValueError(f"{key} must be 0 or more, not {value}")
    return value


__all__ = [
    "DTYPES",
    "EngineArgs",
    "EntryValueError",
    "Rule",
    "add_arguments",
    "add_engine_arguments",
    "check_entry_value",
    "engine_fields",
    "from_namespace",
    "namespace_values",
    "non_blank",
    "non_negative_float",
    "non_negative_int",
    "option",
    "port_number",
    "positive_float",
    "positive_int",
]
