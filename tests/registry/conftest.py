"""Shared fixtures of the registry tests: a generated package, built-in entries for it,
a fake Hugging Face cache and a fake mirror distribution. Nothing touches the network."""

from __future__ import annotations

import hashlib
import importlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fixtures import write_task_package
from vllm_srun.compose.registry.verify import is_loadable
from vllm_srun.plugins import Mirror, ModelEntry

REVISION = "0123456789abcdef0123456789abcdef01234567"
NAME = "acme/tiny-ner"


def digests(package: Path) -> dict[str, str]:
    """SHA-256 of every loadable file of ``package`` (what a built-in table would list)."""
    found = {}
    for path in sorted(package.rglob("*")):
        relative = path.relative_to(package).as_posix()
        if path.is_file() and is_loadable(relative):
            found[relative] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@pytest.fixture(scope="session")
def tiny_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated BERT token classifier (weights, tokenizer, config): read it, never change it."""
    return write_task_package(tmp_path_factory.mktemp("registry"), "bert", "token")


@pytest.fixture
def package(tiny_package: Path, tmp_path: Path) -> Path:
    """A private copy of :func:`tiny_package` a test may damage."""
    return Path(shutil.copytree(tiny_package, tmp_path / "package"))


@pytest.fixture
def entry(tiny_package: Path) -> ModelEntry:
    """A built-in entry pinning :func:`tiny_package`'s files at :data:`REVISION`."""
    return ModelEntry(NAME, "task_heads", REVISION, digests(tiny_package), "apache-2.0", 1234)


def write_cache(cache: Path, repo: str, revision: str, package: Path) -> Path:
    """Lay ``package`` out like the Hugging Face cache: content-addressed ``blobs/`` and a
    ``snapshots/<revision>/`` tree of relative links into them; returns the snapshot."""
    folder = cache / ("models--" + repo.replace("/", "--"))
    blobs = folder / "blobs"
    snapshot = folder / "snapshots" / revision
    blobs.mkdir(parents=True, exist_ok=True)
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / "main").write_text(revision)
    for path in sorted(package.rglob("*")):
        if not path.is_file():
            continue
        data = path.read_bytes()
        blob = blobs / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / path.relative_to(package)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot


@pytest.fixture
def make_mirror(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[[str, str, Path], Mirror]:
    """``make_mirror(distribution, version, package)``: an installed-looking distribution
    (``dist-info`` on ``sys.path``) whose ``<module>/model`` folder is a copy of ``package``."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))

    def make(distribution: str, version: str, package: Path) -> Mirror:
        module = distribution.replace("-", "_")
        info = site / f"{module}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n"
        )
        shutil.copytree(package, site / module / "model")
        importlib.invalidate_caches()
        return Mirror(distribution, version, f"{module}/model")

    return make
