"""The runtime's side of the plugin framework: finding plugins and composing them.

A plugin never imports this package (:mod:`vllm_srun.plugins` is the author's
API); the runtime, the CLI and the conformance kit do.

- :mod:`.discovery`: :func:`~.discovery.discover` reads the entry-point group
  :data:`~.discovery.GROUP` (filtered by :data:`~.discovery.ENV_ONLY` and
  :data:`~.discovery.ENV_DISABLE`) and imports each plugin
  (:class:`~.discovery.DiscoveredPlugin`);
- :mod:`.layers`: the layers (:data:`~.layers.LAYERS`) and the contract checks an
  object must pass to enter one;
- :mod:`.catalog`: pluggy's plugin manager, one plugin at a time, and the
  :class:`~.catalog.Catalog` it fills (:func:`~.catalog.build_catalog`,
  :func:`~.catalog.load_catalog`), with every refusal and name clash.
"""

from vllm_srun.plugins.host.catalog import (
    Catalog,
    Clash,
    PluginRecord,
    Refusal,
    build_catalog,
    load_catalog,
)
from vllm_srun.plugins.host.discovery import (
    ENV_DISABLE,
    ENV_ONLY,
    GROUP,
    DiscoveredPlugin,
    discover,
)
from vllm_srun.plugins.host.layers import LAYERS, Layer

__all__ = [
    "ENV_DISABLE",
    "ENV_ONLY",
    "GROUP",
    "LAYERS",
    "Catalog",
    "Clash",
    "DiscoveredPlugin",
    "Layer",
    "PluginRecord",
    "Refusal",
    "build_catalog",
    "discover",
    "load_catalog",
]
