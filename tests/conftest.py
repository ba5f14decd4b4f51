"""Shared test helpers: fake distributions on disk for discovery tests."""

from __future__ import annotations

import importlib
import logging
import os
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# As `vllm-srun` does for itself (vllm_srun.cli.use_default_wait_policy), before any
# test imports torch: idle OpenMP threads sleep instead of spinning on shared cores.
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

MakeDistribution = Callable[..., str]


LOGGERS_CLIS_CONFIGURE = ("", "vllm_sr", "vllm_srun")
"""The loggers a CLI run in process may give handlers (the root logger, as a command does)."""


def drop_foreign_handlers() -> None:
    """Take off :data:`LOGGERS_CLIS_CONFIGURE` every handler that is not pytest's."""
    for name in LOGGERS_CLIS_CONFIGURE:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            if not type(handler).__module__.startswith("_pytest"):
                logger.removeHandler(handler)


@pytest.fixture(autouse=True)
def root_logging_left_as_found() -> Iterator[None]:
    """No test inherits a logging handler another test's in-process CLI put on the root.

    ``vllm-srun serve`` and ``vllm-sr serve`` configure the root logger for the process's
    stderr, as a command should. Run in process by a test (or by a thread that outlives
    it), that handler writes to that test's captured stderr and outlives it: a later test
    in the same worker then reads a logging error (a closed or deleted capture) in its
    own stderr. Such handlers are dropped before and after every test; pytest's own are
    left to pytest.
    """
    root = logging.getLogger()
    level = root.level
    drop_foreign_handlers()
    yield
    drop_foreign_handlers()
    root.setLevel(level)


@pytest.fixture
def make_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> MakeDistribution:
    """Write an installed-looking distribution (dist-info + module) and put it on sys.path.

    ``make_distribution(dist, plugin, source, version="1.0")`` declares entry
    point ``plugin`` in group ``vllm_srun`` pointing at a fresh module holding
    ``source`` (or, with ``source=None, target=...``, at an existing module);
    returns the module name. Modules are removed from
    ``sys.modules`` after the test.
    """
    root = tmp_path / f"site-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    created: list[str] = []

    def make(
        dist: str, plugin: str, source: str | None, version: str = "1.0", target: str = ""
    ) -> str:
        if not created:  # a path joins sys.path once it holds a distribution
            monkeypatch.syspath_prepend(str(root))
        module = target or f"fake_{dist.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
        if source is not None:
            (root / f"{module}.py").write_text(textwrap.dedent(source))
        info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        entry_points = info / "entry_points.txt"
        previous = entry_points.read_text() if entry_points.exists() else "[vllm_srun]\n"
        entry_points.write_text(previous + f"{plugin} = {module}\n")
        importlib.invalidate_caches()
        created.append(module)
        return module

    yield make
    for module in created:
        if module.startswith("fake_"):
            sys.modules.pop(module, None)


ACCELERATOR_SOURCE = """
    import torch
    from vllm_srun.plugins import Accelerator, DeviceInfo, hookimpl

    class Fake(Accelerator):
        name = {name!r}
        auto_priority = {priority!r}

        def available(self):
            return True

        def devices(self):
            return [DeviceInfo({name!r}, None, "fake", 100, 50, {{}})]

        def torch_device(self, index):
            return torch.device("cpu")

        def hardware_keys(self, device):
            return [{name!r} + ":fake", {name!r}]

        def onnx_providers(self, device):
            return [("CPUExecutionProvider", {{}})]

    @hookimpl
    def register_accelerators(register):
        register(Fake())
"""


def accelerator_source(name: str, priority: int | None = None) -> str:
    """Source of a plugin module registering one conforming CPU-backed accelerator."""
    return ACCELERATOR_SOURCE.format(name=name, priority=priority)
