"""Shared fixtures of the example's tests: a cache folder, the fixture package, its model."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from vllm_srun_nanoguard.engine import NanoGuardEngine
from vllm_srun_nanoguard.family import NanoGuardFamily
from vllm_srun_nanoguard.fixture import write_fixture
from vllm_srun_nanoguard.model import NanoGuardModel

from vllm_srun.plugins import DeviceInfo

CPU = DeviceInfo("cpu", None, "cpu", None, None, {})


@pytest.fixture(autouse=True)
def cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Tokenizer conversions go to a folder of the session, never the user's cache."""
    folder = tmp_path_factory.getbasetemp() / "cache"
    monkeypatch.setenv("VLLM_SRUN_CACHE_DIR", str(folder))
    return folder


@pytest.fixture(scope="session")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fixture(tmp_path_factory.mktemp("fixture") / "nanoguard-fixture")


def load(package: Path) -> NanoGuardModel:
    """Detect, verify, describe and load ``package`` on the CPU as the runtime does."""
    family, engine = NanoGuardFamily(), NanoGuardEngine()
    assert family.detect(package)
    family.verify(package)
    spec = family.describe(package)
    assert engine.supports(spec, CPU) is None
    return family.load(package, spec, engine.load(spec, CPU, {}))


@pytest.fixture
def load_package(cache: Path) -> Callable[[Path], NanoGuardModel]:
    """:func:`load`, with conversions in the session's cache."""
    return load


@pytest.fixture
def model(package: Path, cache: Path) -> Iterator[NanoGuardModel]:
    yield load(package)
