"""``vllm-srun serve`` options and the models file (``--models FILE``)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_srun.engine_args import EngineArgs, EntryValueError, check_entry_value, engine_fields
from vllm_srun.errors import LoadError
from vllm_srun.registry import check_revision as registry_check

ENTRY_KEYS = ("model", "revision", "name", *(f.name for f in engine_fields()), "options")
"""Keys a models-file entry may have: the model, and every engine argument."""

ENTRY_TYPES: dict[str, type] = {"model": str, "revision": str, "name": str, "options": dict}
"""The types of the entry keys that are not engine arguments."""


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
        options: request options the model applies by default.
    """

    model: str
    name: str | None = None
    revision: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

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
    """Process-wide options of ``vllm-srun serve`` (defaults as the command reference gives)."""

    models: list[ModelConfig] = field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = 8100
    uds: str | None = None
    threads: int | None = None
    max_queue: int = 256
    max_queued_tokens: int = 4_194_304
    max_request_bytes: int = 33_554_432
    max_bundle_tasks: int = 64
    result_cache_entries: int = 16384
    shutdown_grace_seconds: float = 30.0
    log_level: str = "info"
    cache_dir: str | None = None
    offline: bool = False
    accept_licences: tuple[str, ...] = ()
    load_attempts: int = 5
    load_retry_seconds: float = 5.0
    systemone_schema: str = "vllm-sr/5.0"
    autotune_cache: str | None = None


def _checked(entry: dict[str, Any], key: str, where: str) -> Any:
    """A models-file value, checked like the command-line option of the same name."""
    value = entry[key]
    if key in ENTRY_TYPES:
        expected = ENTRY_TYPES[key]
        if not isinstance(value, expected):
            raise ConfigError(f"{where}: {key} must be {expected.__name__}")
        return value
    try:
        return check_entry_value(key, value)
    except EntryValueError as err:
        raise ConfigError(f"{where}: {err}") from err


def check_revision(revision: str, where: str) -> str:
    """``revision`` as a lower-case 40-hex commit (:func:`vllm_srun.registry.check_revision`).

    Raises:
        ConfigError: ``revision must be a 40-hex commit`` (a branch, tag or
            short hash), prefixed with ``where``.
    """
    try:
        return registry_check(revision)
    except LoadError as err:
        raise ConfigError(f"{where}: {err}") from err


def read_models_file(path: str | os.PathLike[str], defaults: ModelConfig) -> list[ModelConfig]:
    """Parse a models file: ``models:`` entries, each overriding ``defaults``.

    Raises:
        ConfigError: unreadable YAML, no ``models`` list, an entry without
            ``model``, an unknown key (named with its entry), a wrong type.
    """
    import yaml

    try:
        document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
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
        unknown = sorted(set(entry) - set(ENTRY_KEYS))
        if unknown:
            raise ConfigError(
                f"{where}: unknown key {', '.join(unknown)}; an entry takes {', '.join(ENTRY_KEYS)}"
            )
        if "model" not in entry:
            raise ConfigError(f"{where}: `model` is required")
        values = {key: _checked(entry, key, where) for key in entry}
        if "revision" in values:
            values["revision"] = check_revision(values["revision"], where)
        configs.append(dataclasses.replace(defaults, **values))
    return configs
