"""Discovery: find the plugins of the ``vllm_srun`` entry-point group with stevedore.

Discovery only finds and imports plugin modules; composing their objects into
layers is :mod:`vllm_srun.plugins.host.catalog`'s job. A plugin that fails to import
is recorded with its error and the others still load.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import stevedore

from vllm_srun.plugins.hookspecs import PROJECT_NAME

GROUP = PROJECT_NAME
"""The entry-point group every plugin, built-in or not, is declared in."""

ENV_ONLY = "VLLM_SRUN_PLUGINS"
"""Comma list: load only these plugins (by entry-point name)."""

ENV_DISABLE = "VLLM_SRUN_DISABLE_PLUGINS"
"""Comma list: leave these plugins out."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DiscoveredPlugin:
    """A plugin entry point and the outcome of importing it.

    Attributes:
        name: the entry-point name, which is the plugin's name.
        entry_point: the entry point's target (``vllm_srun.accelerators.cpu``).
        distribution: the distribution that declares it, when known.
        version: that distribution's version, when known.
        obj: the imported module or object; ``None`` when the import failed.
        error: why the import failed (``ModuleNotFoundError: ...``), else ``None``.
    """

    name: str
    entry_point: str
    distribution: str | None
    version: str | None
    obj: Any
    error: str | None = None


class PluginImportError(Exception):
    """A plugin module raised something other than an ``Exception`` while importing."""


class _Loader(stevedore.NamedExtensionManager):  # type: ignore[type-arg]
    """stevedore's named manager, with every failure of one import kept to that plugin.

    stevedore lets ``AssertionError`` and any ``BaseException`` (``SystemExit``
    from a plugin calling ``sys.exit``) escape and end the process; here they
    become :class:`PluginImportError` and reach the failure callback like any
    other import error. ``KeyboardInterrupt`` still stops the process.
    """

    def list_entry_points(self) -> list[importlib.metadata.EntryPoint]:
        """The group's entry points, read afresh, one per ``(name, target)``.

        stevedore's own list comes from a cache file keyed by path mtimes
        packed as 32-bit floats (about two minutes of resolution), so a plugin
        reinstalled in place could stay invisible; the metadata is read here
        instead, and stevedore still does the loading.
        """
        unique: dict[tuple[str, str], importlib.metadata.EntryPoint] = {}
        for ep in importlib.metadata.entry_points(group=self.namespace):
            unique.setdefault((ep.name, ep.value), ep)
        return list(unique.values())

    def _load_one_plugin(self, ep: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return super()._load_one_plugin(ep, *args, **kwargs)
        except (KeyboardInterrupt, MemoryError):
            raise
        except Exception as err:
            if isinstance(err, AssertionError):
                raise PluginImportError(f"AssertionError: {err}") from err
            raise
        except BaseException as err:
            raise PluginImportError(f"{type(err).__name__}: {err}") from err


def parse_plugin_list(value: str | None) -> list[str] | None:
    """Split a comma list such as ``"cpu, host"``; ``None``, blank or only commas give ``None``."""
    names = [part.strip() for part in (value or "").split(",") if part.strip()]
    return names or None


def _distributions_by_entry_point() -> dict[tuple[str, str], list[tuple[str, str]]]:
    """``(name, target)`` of each entry point in the group to its distributions."""
    found: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for ep in importlib.metadata.entry_points(group=GROUP):
        dist = ep.dist
        owner = (dist.name, dist.version) if dist is not None else ("unknown", "unknown")
        found.setdefault((ep.name, ep.value), []).append(owner)
    return found


def discover(
    environ: Mapping[str, str] | None = None, *, only: Collection[str] | None = None
) -> list[DiscoveredPlugin]:
    """Find and import the plugins of the ``vllm_srun`` group.

    Args:
        environ: where ``VLLM_SRUN_PLUGINS`` and ``VLLM_SRUN_DISABLE_PLUGINS``
            are read (``os.environ`` by default).
        only: load only these plugin names, on top of the environment's
            filters (the conformance kit uses it to isolate one plugin).

    Returns:
        One record per selected entry point, sorted by name then distribution.
        Names asked for by ``VLLM_SRUN_PLUGINS`` or ``only`` that no
        distribution declares come back as records whose ``error`` says so.
        Never raises because a plugin is broken.
    """
    environ = os.environ if environ is None else environ
    wanted = parse_plugin_list(environ.get(ENV_ONLY))
    disabled = set(parse_plugin_list(environ.get(ENV_DISABLE)) or ())
    if only is not None:
        wanted = [n for n in only if wanted is None or n in wanted]

    owners = _distributions_by_entry_point()
    names = sorted({name for name, _ in owners})
    selected = [n for n in names if (wanted is None or n in wanted) and n not in disabled]
    for name in sorted(disabled - set(names)):
        log.warning(
            "%s names %r, which no distribution declares in entry-point group %r",
            ENV_DISABLE,
            name,
            GROUP,
        )

    failures: list[tuple[Any, BaseException]] = []

    def on_failure(_manager: Any, ep: Any, err: BaseException) -> None:
        failures.append((ep, err))

    manager = _Loader(
        GROUP,
        names=selected,
        on_load_failure_callback=on_failure,
        on_missing_entrypoints_callback=lambda _missing: None,
    )

    records: list[DiscoveredPlugin] = []
    outcomes: list[tuple[Any, Any, str | None]] = [
        (ext.entry_point, ext.plugin, None) for ext in manager.extensions
    ]
    for ep, err in failures:
        log.warning("plugin %s failed to import: %s", ep.name, err)
        reason = str(err) if isinstance(err, PluginImportError) else f"{type(err).__name__}: {err}"
        outcomes.append((ep, None, reason))
    for ep, obj, error in outcomes:
        # Several distributions may declare the very same entry point; each
        # gets a record, so composition sees the duplicate name and names them.
        declared: list[tuple[str | None, str | None]] = [(None, None)]
        declared = list(owners.pop((ep.name, ep.value), None) or declared)
        for dist, version in declared:
            records.append(DiscoveredPlugin(ep.name, ep.value, dist, version, obj, error))

    known = {record.name for record in records}
    hint = f"install it or remove it from {ENV_ONLY}" if only is None else "install it"
    for name in wanted or ():
        if name not in known and name not in disabled:
            records.append(
                DiscoveredPlugin(
                    name,
                    "",
                    None,
                    None,
                    None,
                    f"no distribution declares a plugin named {name!r} in entry-point group "
                    f"{GROUP!r}; {hint}",
                )
            )
    records.sort(key=lambda r: (r.name, r.distribution or ""))
    return records
