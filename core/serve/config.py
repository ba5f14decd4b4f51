"""``vllm-srun serve`` options and the models file (``--models FILE``)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_srun.errors import LoadError
from vllm_srun.registry import check_revision as registry_check

ENGINE_ARGUMENTS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "batch_window_ms",
    "dtype",
    "enable_shared_context",
)
ENTRY_KEYS = (
    "model",
    "revision",
    "name",
    "device",
    "engine",
    "family",
    "memory_budget_gib",
    "options",
    "max_model_len",
    *ENGINE_ARGUMENTS,
)
"""Keys a models-file entry may have (the command reference's list)."""


class ConfigError(Exception):
    """A command line or models file that cannot be served; the message names the problem."""


@dataclass
class ModelConfig:
    """One model to serve and its own options (missing ones take the command line's)."""

    model: str
    name: str | None = None
    revision: str | None = None
    device: str = "auto"
    engine: str = "auto"
    family: str | None = None
    memory_budget_gib: float | None = None
    options: dict[str, Any] = field(default_factory=dict)
    max_model_len: int | None = None
    max_num_seqs: int = 8192
    max_num_batched_tokens: int = 65536
    batch_window_ms: float = 2.0
    dtype: str = "auto"
    enable_shared_context: bool | None = None

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


def _type_check(entry: dict[str, Any], key: str, where: str) -> Any:
    value = entry[key]
    expected: dict[str, tuple[type, ...]] = {
        "model": (str,),
        "revision": (str,),
        "name": (str,),
        "device": (str,),
        "engine": (str,),
        "family": (str,),
        "memory_budget_gib": (int, float),
        "options": (dict,),
        "max_model_len": (int,),
        "max_num_seqs": (int,),
        "max_num_batched_tokens": (int,),
        "batch_window_ms": (int, float),
        "dtype": (str,),
        "enable_shared_context": (bool,),
    }
    types = expected[key]
    if isinstance(value, bool) and bool not in types:
        raise ConfigError(f"{where}: {key} must be {' or '.join(t.__name__ for t in types)}")
    if not isinstance(value, types):
        raise ConfigError(f"{where}: {key} must be {' or '.join(t.__name__ for t in types)}")
    if key in AT_LEAST_ONE and value < 1:
        raise ConfigError(f"{where}: {key} must be at least 1, not {value}")
    if key in ABOVE_ZERO and not (0 < value < float("inf")):
        raise ConfigError(f"{where}: {key} must be a number above 0, not {value}")
    if key == "batch_window_ms" and not (0 <= value < float("inf")):
        raise ConfigError(f"{where}: batch_window_ms must be 0 or more, not {value}")
    return value


AT_LEAST_ONE = frozenset({"max_model_len", "max_num_seqs", "max_num_batched_tokens"})
"""Models-file keys that count something, as the matching command-line options require."""

ABOVE_ZERO = frozenset({"memory_budget_gib"})
"""Models-file keys that must be a finite number above 0."""


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
        values = {key: _type_check(entry, key, where) for key in entry}
        if "revision" in values:
            values["revision"] = check_revision(values["revision"], where)
        configs.append(dataclasses.replace(defaults, **values))
    return configs
