"""``vllm-srun serve`` options and the models file (``--models FILE``).

:class:`ServeConfig` declares every process-wide option once (its default,
check and help, with :func:`vllm_srun.engine_args.option`); the command line
is generated from it (:mod:`.command`). :func:`read_models_file` reads a
models file and refuses what YAML would otherwise accept silently: a key
given twice, a second ``models:`` list, a blank text.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm_srun.compose.batching import SchedulerLimits
from vllm_srun.engine_args import (
    EngineArgs,
    EntryValueError,
    check_entry_value,
    engine_fields,
    option,
)

if TYPE_CHECKING:
    import yaml

ENTRY_KEYS = (
    "model",
    "revision",
    "name",
    "options",
    "systemone_schema",
    *(f.name for f in engine_fields()),
)
"""Keys a models-file entry may have: the model, and every engine argument."""

ENTRY_TYPES: dict[str, type] = {
    "model": str,
    "revision": str,
    "name": str,
    "options": dict,
    "systemone_schema": str,
}
"""The types of the entry keys that are not engine arguments."""


BLANK_FIXES = {
    "model": "give a built-in model name, owner/name@COMMIT or a package directory",
    "name": "give the model ID requests use, or leave name out to serve the model "
    "under its `model`",
    "revision": "give the 40-hex commit, or leave revision out",
    "systemone_schema": "give one of vllm-sr/5.0, vllm-sr/4.0, jev, or leave systemone_schema "
    "out for the process's --systemone-schema",
}

SYSTEMONE_SCHEMAS = ("vllm-sr/5.0", "vllm-sr/4.0", "jev")
"""The System One schemas (``--systemone-schema``, a models-file entry's
``systemone_schema``); the first is the default. ``jev`` is TypeSafe's Jev API
(typesafe-sdk 0.7.5, jevcompat SPEC 0.1): see :mod:`vllm_srun.serve.jev`."""
"""What to do about a blank value of an entry key that is not an engine argument."""


class ConfigError(Exception):
    """A command line or models file that cannot be served; the message names the problem."""


@dataclass(kw_only=True)
class ModelConfig(EngineArgs):
    """One model to serve: what it is, its ID, and its engine arguments (those a
    models-file entry leaves out take the command line's).

    Attributes:
        model: a built-in model name, ``owner/name@COMMIT`` or a package directory.
        name: the model ID requests use (default: ``model`` as given).
        revision: the 40-hex commit of a Hub repository.
        options: family options (the family that loads the model checks them).
        systemone_schema: the System One schema its ``/v1/systemone`` answers follow
            (one of :data:`SYSTEMONE_SCHEMAS`); ``None`` for the process's.

    Its ``profile`` (an engine argument, ``--profile``) is the numeric profile it is
    served under; the router writes it for the workers it manages.
    """

    model: str
    name: str | None = None
    revision: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    systemone_schema: str | None = None

    @property
    def served_name(self) -> str:
        """The ID the API reports: ``name``, else the MODEL argument as given
        (without an ``@REVISION`` suffix of a model name: ``owner/name@abc...``
        serves as ``owner/name``)."""
        if self.name:
            return self.name
        if not self.model.startswith(("/", ".", "~")) and "@" in self.model:
            return self.model.partition("@")[0]
        return self.model


@dataclass
class ServeConfig:
    """Process-wide options of ``vllm-srun serve`` (defaults as the command reference gives).

    Every field but ``models`` is a command-line option, declared here once
    (:func:`~vllm_srun.engine_args.option`): :func:`process_fields` lists them in
    the order ``vllm-srun serve --help`` shows them.
    """

    models: list[ModelConfig] = field(default_factory=list)
    host: str = option("127.0.0.1", kind="text", help="listen address")
    port: int = option(8100, kind="port", help="listen port")
    uds: str | None = option(
        None, kind="text", metavar="PATH", help="listen on a Unix socket instead of TCP"
    )
    cache_dir: str | None = option(
        None,
        kind="text",
        metavar="DIR",
        help="Hugging Face cache directory (default: HF_HUB_CACHE)",
    )
    offline: bool = option(
        False,
        kind="flag",
        help="use only files already in the cache or installed mirrors; never download",
    )
    accept_licences: tuple[str, ...] = option(
        (),
        kind="repeat",
        flag="--accept-licence",
        metavar="ID",
        help="accept a restricted licence (repeatable)",
    )
    threads: int | None = option(
        None, kind="count", help="CPU threads of the process (default: all cores)"
    )
    max_queue: int = option(
        SchedulerLimits.max_queue,
        kind="count",
        help="requests queued per model before 429 (a decisions `states` entry counts as one)",
    )
    max_queued_tokens: int = option(
        SchedulerLimits.max_queued_tokens, kind="count", help="tokens queued per model before 429"
    )
    max_request_bytes: int = option(
        33_554_432, kind="count", help="request body limit (413 above it)"
    )
    max_bundle_tasks: int = option(64, kind="count", help="most tasks in one /v1/bundle request")
    max_inputs: int = option(
        2048,
        kind="count",
        help="most inputs (rerank: documents) in one classify, embeddings or rerank request; "
        "the card's limits.max_inputs (OpenAI's embeddings take 2,048)",
    )
    result_cache_entries: int = option(
        SchedulerLimits.result_cache_entries,
        kind="count0",
        help="recent row results kept per model, by content (0 disables the cache)",
    )
    shutdown_grace_seconds: float = option(
        30.0,
        kind="amount0",
        help="after SIGTERM, how long queued work may take to finish",
    )
    log_level: str = option(
        "info",
        kind="choice",
        choices=("debug", "info", "warning", "error"),
        help="log verbosity (request text is never logged)",
    )
    log_format: str = option(
        "text",
        kind="choice",
        choices=("text", "json"),
        help="log lines as text, or as one JSON object each (time, level, logger, message "
        "and the access line's fields)",
    )
    load_attempts: int = option(
        5,
        kind="count",
        help="loads of a model before it counts as failed; final causes are not retried",
    )
    load_retry_seconds: float = option(
        5.0,
        kind="amount0",
        help="wait before the first reload of a model, then doubling, at most 300 s",
    )
    systemone_schema: str = option(
        "vllm-sr/5.0",
        kind="choice",
        choices=SYSTEMONE_SCHEMAS,
        help="the System One schema of /v1/systemone and /v1/systemone/batch; vllm-sr/4.0 "
        "also accepts the older request forms; jev answers as TypeSafe's Jev API (its "
        "SDKs' model alias jev-latest, Jev answer and error shapes); a models-file entry's "
        "systemone_schema overrides it for that model",
    )
    autotune_cache: str | None = option(
        None,
        kind="text",
        metavar="DIR",
        help="keep compiled GPU kernels and kernel tuning across runs in DIR "
        "(default: $VLLM_SRUN_AUTOTUNE_CACHE)",
    )


def process_fields() -> tuple[dataclasses.Field[Any], ...]:
    """The fields of :class:`ServeConfig` that are command-line options, in declaration order."""
    return tuple(f for f in dataclasses.fields(ServeConfig) if "rule" in f.metadata)


def _checked(entry: dict[str, Any], key: str, where: str) -> Any:
    """A models-file value, checked like the command-line option of the same name.

    Raises:
        ConfigError: the wrong type, a blank text, or a value out of range,
            prefixed with ``where``.
    """
    value = entry[key]
    if key in ENTRY_TYPES:
        expected = ENTRY_TYPES[key]
        if not isinstance(value, expected):
            raise ConfigError(f"{where}: {key} must be {expected.__name__}")
        if isinstance(value, str) and not value.strip():
            raise ConfigError(f"{where}: {key} is blank; {BLANK_FIXES[key]}")
        if key == "systemone_schema" and value not in SYSTEMONE_SCHEMAS:
            raise ConfigError(
                f"{where}: systemone_schema {value!r} is not a System One schema; "
                f"{BLANK_FIXES[key]}"
            )
        return value
    try:
        return check_entry_value(key, value)
    except EntryValueError as err:
        raise ConfigError(f"{where}: {err}") from err


def check_revision(revision: str, where: str) -> str:
    """``revision`` as a lower-case 40-hex commit
    (:func:`vllm_srun.compose.registry.check_revision`).

    Raises:
        ConfigError: ``revision must be a 40-hex commit`` (a branch, tag or
            short hash), prefixed with ``where``.
    """
    # Imported here: the registry imports torch, which `vllm-srun --help` must not wait for.
    from vllm_srun.compose.registry import check_revision as registry_check
    from vllm_srun.errors import LoadError

    try:
        return registry_check(revision)
    except LoadError as err:
        raise ConfigError(f"{where}: {err}") from err


def read_models_file(path: str | os.PathLike[str], defaults: ModelConfig) -> list[ModelConfig]:
    """Parse a models file: ``models:`` entries, each overriding ``defaults``.

    Raises:
        ConfigError: unreadable YAML; a key given twice in one mapping (a
            second ``models:`` list included: YAML would keep only the last);
            no ``models`` list; an entry without ``model``; an unknown key
            (``options`` belongs to the family, checked when it loads); a wrong
            type; a blank text; a value out of
            range; a ``profile`` that is not a profile name. The message names the
            entry (its number and ``model``), the key and what to do.
    """
    import yaml

    try:
        document = _load_yaml(Path(path).read_text(encoding="utf-8"), str(path))
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"models file {path} cannot be read: {err}") from err
    entries = document.get("models") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"models file {path} needs a non-empty `models:` list")
    configs = []
    for index, entry in enumerate(entries):
        where = f"models file {path}, entry {index + 1}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: an entry must be a mapping with `model`")
        if "model" in entry:
            where += f" ({entry['model']})"
        unknown = sorted(set(entry) - set(ENTRY_KEYS), key=str)
        if unknown:
            raise ConfigError(
                f"{where}: unknown key {', '.join(map(str, unknown))}; "
                f"an entry takes {', '.join(ENTRY_KEYS)}"
            )
        if "model" not in entry:
            raise ConfigError(f"{where}: `model` is required")
        values = {key: _checked(entry, key, where) for key in entry}
        if "revision" in values:
            values["revision"] = check_revision(values["revision"], where)
        configs.append(dataclasses.replace(defaults, **values))
    return configs


def _load_yaml(text: str, path: str) -> Any:
    """The YAML document in ``text`` (safe types only), refusing a key given twice.

    PyYAML keeps the last of two equal keys without a word (``model:`` twice
    serves the second; a second ``models:`` list drops the first), so the node
    tree is checked before it is turned into Python objects.

    Raises:
        yaml.YAMLError: malformed YAML.
        ConfigError: a key given twice in one mapping, named with its entry,
            its lines and the fix.
    """
    import yaml

    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        for problem in _duplicate_keys(node, path):
            raise ConfigError(problem)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _duplicate_keys(root: yaml.Node, path: str) -> Iterator[str]:
    """A message for each key given twice in one mapping of the tree under ``root``.

    The top-level ``models`` list and its entries get messages that name the
    entry; any other mapping is named by its line. Merge keys (``<<``) are
    YAML's own way to override and are not counted.
    """
    import yaml

    entries: dict[int, str] = {}
    if isinstance(root, yaml.MappingNode):
        for key_node, value_node in root.value:
            if key_node.value == "models" and isinstance(value_node, yaml.SequenceNode):
                for index, entry in enumerate(value_node.value):
                    entries[id(entry)] = f"models file {path}, entry {index + 1}{_model_of(entry)}"
    seen: set[int] = set()
    stack: list[yaml.Node] = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:  # an alias refers to a node already checked
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend(reversed(node.value))
            continue
        if not isinstance(node, yaml.MappingNode):
            continue
        first_line: dict[tuple[str, str], int] = {}
        for key_node, value_node in node.value:
            stack.append(value_node)
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue
            key = (key_node.tag, key_node.value)
            line = key_node.start_mark.line + 1
            if key not in first_line:
                first_line[key] = line
                continue
            name, lines = key_node.value, f"lines {first_line[key]} and {line}"
            if node is root and name == "models":
                yield (
                    f"models file {path}: `models:` is given twice ({lines}); YAML would keep "
                    "only the last list: put every entry under one `models:`"
                )
            elif id(node) in entries:
                yield (
                    f"{entries[id(node)]}: `{name}` is given twice ({lines}); YAML would keep "
                    f"only the last: give each key once in an entry"
                )
            else:
                yield (
                    f"models file {path}: `{name}` is given twice in one mapping ({lines}); "
                    "YAML would keep only the last: give it once"
                )


def _model_of(entry: yaml.Node) -> str:
    """`` (MODEL)`` for an entry node whose first ``model`` key has a text value, else ``""``."""
    import yaml

    if isinstance(entry, yaml.MappingNode):
        for key_node, value_node in entry.value:
            if key_node.value == "model" and isinstance(value_node, yaml.ScalarNode):
                return f" ({value_node.value})"
    return ""
