"""Composition: register discovered plugins with pluggy and fill the layers.

Each plugin's hook implementations are called one plugin at a time, so every
object is attributed to the plugin that registered it, and a plugin whose hook
raises loses only its own objects. Objects are checked against their layer's
contract; a name registered by two plugins in one layer is a clash and
neither object is used.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pluggy

from vllm_srun.plugins import hookspecs
from vllm_srun.plugins.host.discovery import DiscoveredPlugin, discover
from vllm_srun.plugins.host.layers import LAYERS, Layer


@dataclass
class Refusal:
    """An object a plugin registered that the runtime does not use.

    Attributes:
        layer: the layer it was registered in (``accelerators``).
        name: its registry name, or its type name when it has none.
        reason: why it is not used.
    """

    layer: str
    name: str
    reason: str

    def to_json(self) -> dict[str, str]:
        """The refusal as JSON."""
        return {"layer": self.layer, "name": self.name, "reason": self.reason}


def _empty_layers() -> dict[str, list[str]]:
    return {layer.name: [] for layer in LAYERS}


@dataclass
class PluginRecord:
    """What one plugin is and what it contributed, as ``vllm-srun plugins`` shows it.

    Attributes:
        name: the plugin (entry-point) name.
        distribution, version: the distribution that declares it.
        entry_point: the entry point's target.
        hooks: the hooks it implements, sorted.
        registered: layer name to the registry names of the objects in use.
        refused: objects it registered that are not used, with the reason.
        error: why the plugin contributes nothing at all (failed import,
            invalid hook implementation, name clash), else ``None``.
    """

    name: str
    distribution: str | None
    version: str | None
    entry_point: str
    hooks: list[str] = field(default_factory=list)
    registered: dict[str, list[str]] = field(default_factory=_empty_layers)
    refused: list[Refusal] = field(default_factory=list)
    error: str | None = None

    @property
    def label(self) -> str:
        """``name (distribution version)``, how messages name a plugin."""
        return f"{self.name} ({self.distribution or 'unknown'} {self.version or ''})".replace(
            " )", ")"
        )

    def to_json(self) -> dict[str, Any]:
        """The record as one entry of ``vllm-srun plugins --json``."""
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "entry_point": self.entry_point,
            "hooks": list(self.hooks),
            "registered": {k: sorted(v) for k, v in self.registered.items()},
            "refused": [r.to_json() for r in self.refused],
            "error": self.error,
        }


@dataclass
class Clash:
    """One name registered in one layer by more than one plugin; none of them is used."""

    layer: str
    name: str
    plugins: list[PluginRecord]

    def to_json(self) -> dict[str, Any]:
        """The clash as JSON, naming every plugin and distribution involved."""
        return {
            "layer": self.layer,
            "name": self.name,
            "plugins": [{"name": p.name, "distribution": p.distribution} for p in self.plugins],
        }


@dataclass
class Catalog:
    """The composed plugin registry of a process.

    Attributes:
        plugins: one record per discovered plugin, sorted by name.
        layers: layer name to registry name to object, holding only the
            objects in use (contract satisfied, no clash).
        clashes: names registered by more than one plugin in one layer.
    """

    plugins: list[PluginRecord]
    layers: dict[str, dict[str, Any]]
    clashes: list[Clash]

    def layer(self, name: str) -> Mapping[str, Any]:
        """The objects in use in a layer (``accelerators``), by registry name.

        Raises:
            KeyError: ``name`` is not a layer.
        """
        return self.layers[name]

    def owner(self, layer: str, name: str) -> PluginRecord | None:
        """The plugin whose object is in use under ``name`` in ``layer``."""
        for plugin in self.plugins:
            if name in plugin.registered.get(layer, ()):
                return plugin
        return None

    def to_json(self) -> dict[str, Any]:
        """The catalog as ``vllm-srun plugins --json`` prints it."""
        return {
            "plugins": [p.to_json() for p in self.plugins],
            "clashes": [c.to_json() for c in self.clashes],
        }


MAX_REFUSALS_SHOWN = 20
"""Refusals listed per plugin and layer; a plugin registering garbage in bulk gets a count."""


def new_plugin_manager() -> pluggy.PluginManager:
    """A pluggy manager for project ``vllm_srun`` with the hookspecs added."""
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    return pm


def _failure(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


class _PluginHooks:
    """Holds one plugin's hook implementations; equal only to itself."""


def _hook_namespace(obj: Any) -> _PluginHooks:
    """The hook implementations of a plugin object, gathered into a namespace of its own.

    pluggy then only ever touches this namespace: a plugin object with a
    hostile ``__eq__``, an object two entry points share, or a non-module
    target (a class, an array) cannot confuse registration.

    Raises:
        Exception: listing the object's attributes raised.
    """
    marker = f"{hookspecs.PROJECT_NAME}_impl"
    hooks: dict[str, Any] = {}
    for attr in dir(obj):
        try:
            value = getattr(obj, attr)
        except Exception:
            continue
        if inspect.isroutine(value) and hasattr(value, marker):
            hooks[attr] = value
    namespace = _PluginHooks()
    for attr, value in hooks.items():
        setattr(namespace, attr, value)
    return namespace


def _hookimpl_problems(pm: pluggy.PluginManager, namespace: Any) -> list[str]:
    """Hook implementations that match no hookspec or that pluggy would run as wrappers."""
    problems = []
    for caller in pm.get_hookcallers(namespace) or ():
        if not caller.has_spec():
            problems.append(
                f"implements unknown hook {caller.name!r}; "
                f"the hooks are {', '.join(layer.hook for layer in LAYERS)}"
            )
            continue
        for impl in caller.get_hookimpls():
            if impl.plugin is not namespace:
                continue
            if impl.hookwrapper or impl.wrapper:
                problems.append(f"{caller.name} is a hook wrapper; implement it as a plain hook")
            elif inspect.isgeneratorfunction(impl.function) or inspect.iscoroutinefunction(
                impl.function
            ):
                problems.append(f"{caller.name} must be a plain function, not a generator or async")
    return problems


def _register_plugins(
    pm: pluggy.PluginManager, discovered: Iterable[DiscoveredPlugin]
) -> list[PluginRecord]:
    """Register every importable plugin with ``pm``; a record per plugin."""
    found = list(discovered)
    records = [
        PluginRecord(d.name, d.distribution, d.version, d.entry_point, error=d.error) for d in found
    ]
    by_name: dict[str, list[PluginRecord]] = {}
    for record in records:
        by_name.setdefault(record.name, []).append(record)
    for record, plugin in zip(records, found, strict=True):
        if record.error is not None:
            continue
        twins = by_name[record.name]
        if len(twins) > 1:
            others = ", ".join(t.label for t in twins if t is not record)
            record.error = (
                f"plugin name {record.name!r} is also declared by {others}; neither is used"
            )
            continue
        try:
            namespace = _hook_namespace(plugin.obj)
            pm.register(namespace, name=record.name)
        except (KeyboardInterrupt, MemoryError):
            raise
        except BaseException as err:  # PluginValidationError, a hostile object, SystemExit
            record.error = _failure(err)
            continue
        problems = _hookimpl_problems(pm, namespace)
        if problems:
            pm.unregister(namespace)
            record.error = "; ".join(problems)
            continue
        record.hooks = sorted(c.name for c in pm.get_hookcallers(namespace) or ())
        if not record.hooks:
            pm.unregister(namespace)
            record.error = (
                f"{record.entry_point or record.name} implements no vllm_srun hook; "
                "mark functions with @hookimpl from vllm_srun.plugins"
            )
    return records


def _display_name(obj: Any) -> str:
    """The object's ``name`` when it has a string one, else its type's name."""
    try:
        name = getattr(obj, "name", None)
    except Exception:
        name = None
    if isinstance(name, str) and name:
        return str.__str__(name)
    return type(obj).__qualname__


def _examine(layer: Layer, obj: Any) -> tuple[str, list[str]]:
    """The object's registry name and the reasons it breaks the layer's contract.

    Never raises: a contract check or a name that raises is itself the reason.
    """
    name = _display_name(obj)
    try:
        problems = layer.check(obj)
        if not problems:
            key = layer.key(obj)
            if type(key) is not str or not key:
                return name, [f"registry name must be a non-empty str, not {type(key).__name__}"]
            name = key
    except Exception as err:
        problems = [f"malformed: checking it raised {_failure(err)}"]
    return name, problems


def _collect(
    pm: pluggy.PluginManager, layer: Layer, records: Mapping[str, PluginRecord]
) -> dict[str, list[tuple[PluginRecord, Any]]]:
    """Call each plugin's implementation of ``layer.hook``; objects that pass, by name."""
    candidates: dict[str, list[tuple[PluginRecord, Any]]] = {}
    for impl in getattr(pm.hook, layer.hook).get_hookimpls():
        record = records[impl.plugin_name]
        objects: list[Any] = []
        try:
            impl.function(**{arg: objects.append for arg in impl.argnames})
        except (KeyboardInterrupt, MemoryError):
            raise
        except BaseException as err:  # SystemExit from a plugin is a plugin failure too
            record.refused.append(Refusal(layer.name, "*", f"{layer.hook} raised {_failure(err)}"))
            continue
        seen: set[str] = set()
        refused = 0
        for obj in objects:
            name, problems = _examine(layer, obj)
            if not problems and name in seen:
                problems = [f"{layer.name} name {name!r} registered twice by this plugin"]
            if problems:
                refused += 1
                if refused <= MAX_REFUSALS_SHOWN:
                    record.refused.append(Refusal(layer.name, name, "; ".join(problems)))
                continue
            seen.add(name)
            candidates.setdefault(name, []).append((record, obj))
        if refused > MAX_REFUSALS_SHOWN:
            hidden = refused - MAX_REFUSALS_SHOWN
            record.refused.append(Refusal(layer.name, "*", f"and {hidden} more refused objects"))
    return candidates


def build_catalog(discovered: Iterable[DiscoveredPlugin]) -> Catalog:
    """Compose discovered plugins into layers with pluggy.

    Args:
        discovered: the outcome of :func:`vllm_srun.plugins.discover` (or
            hand-made records, as the conformance kit and tests do).

    Returns:
        The catalog; a broken plugin, a refused object or a clash is recorded
        in it, never raised.
    """
    pm = new_plugin_manager()
    records = _register_plugins(pm, discovered)
    by_name = {r.name: r for r in records if r.error is None}
    layers: dict[str, dict[str, Any]] = {}
    clashes: list[Clash] = []
    for layer in LAYERS:
        layers[layer.name] = {}
        for name, owners in sorted(_collect(pm, layer, by_name).items()):
            if len(owners) == 1:
                record, obj = owners[0]
                layers[layer.name][name] = obj
                record.registered[layer.name].append(name)
                continue
            clashes.append(Clash(layer.name, name, [r for r, _ in owners]))
            for record, _ in owners:
                others = ", ".join(r.label for r, _ in owners if r is not record)
                record.refused.append(
                    Refusal(
                        layer.name, name, f"clash: also registered by {others}; neither is used"
                    )
                )
    return Catalog(records, layers, clashes)


def load_catalog(environ: Mapping[str, str] | None = None) -> Catalog:
    """Discover the installed plugins and compose them: what a process starts with."""
    return build_catalog(discover(environ))
