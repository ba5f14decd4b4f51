"""Helpers of the deploy tests: the fake container CLI, kubectl rendering and the
offline Kubernetes schema check."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "kubernetes"
FAKE_RUNTIME = Path(__file__).with_name("fake_runtime.py")

KUBERNETES_VERSION = "1.32.0"
"""The Kubernetes version the manifests are validated against: kubectl's here (1.32),
whose schemas kubernetes-validate ships (strict: unknown fields are errors)."""

KUSTOMIZE_TIMEOUT_S = 60


class FakeRuntime:
    """A directory holding fake ``docker`` and ``podman`` commands and their call log.

    Attributes:
        bin: the directory to put first on ``PATH``.
        log: the JSON-lines file each call is appended to.
    """

    def __init__(self, root: Path) -> None:
        self.bin = root / "bin"
        self.bin.mkdir()
        self.log = root / "calls.jsonl"
        source = FAKE_RUNTIME.read_text(encoding="utf-8")
        for name in ("docker", "podman"):
            script = self.bin / name
            script.write_text(f"#!{sys.executable}\n{source}", encoding="utf-8")
            script.chmod(script.stat().st_mode | stat.S_IXUSR)

    def env(self, **extra: str) -> dict[str, str]:
        """The variables a test sets: ``PATH`` with the fakes first, the log, ``extra``."""
        return {
            "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
            "FAKE_RUNTIME_LOG": str(self.log),
            **extra,
        }

    def entries(self) -> list[dict[str, Any]]:
        """Every recorded line, in order."""
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def calls(self) -> list[list[str]]:
        """Every recorded argv, in order."""
        return [e["argv"] for e in self.entries() if "argv" in e]


@pytest.fixture
def fake_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeRuntime:
    """The fake container CLIs first on ``PATH``; ``CONTAINER_RUNTIME``, the GPU
    switches and ``HF_*`` cleared, the engine cache under ``tmp_path``."""
    fake = FakeRuntime(tmp_path)
    for name in (
        "CONTAINER_RUNTIME",
        "HF_TOKEN",
        "HF_ENDPOINT",
        "HF_HUB_OFFLINE",
        "VLLM_SR_DNS",
        "VLLM_SR_AMD_GPU_PASSTHROUGH",
        "VLLM_SR_NVIDIA_GPU_PASSTHROUGH",
        "FAKE_IMAGE_PRESENT",
        "FAKE_CONTAINER",
        "FAKE_DOCKER_IS_PODMAN",
        "FAKE_PULL_EXIT",
        "FAKE_PULL_ERROR",
        "FAKE_DAEMON_ERROR",
        "DOCKER_HOST",
        "DOCKER_CONTEXT",
        "CONTAINER_HOST",
        "FAKE_RUN_EXIT",
    ):
        monkeypatch.delenv(name, raising=False)
    env = fake.env(VLLM_SR_ENGINE_CACHE_DIR=str(tmp_path / "cache"), FAKE_RUN_EXIT="0")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return fake


def kubectl() -> str:
    """The ``kubectl`` command; skips the test where there is none."""
    found = shutil.which("kubectl")
    if found is None:
        pytest.skip(
            "kubectl is not on PATH: the manifests cannot be rendered with kustomize here "
            "(every machine of this project has it; install kubectl to run these tests)"
        )
    return found


def render(directory: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize DIRECTORY`` as documents (skips without kubectl).

    Raises:
        AssertionError: kustomize refused the directory (its message included).
    """
    done = subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=KUSTOMIZE_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def validate(documents: list[dict[str, Any]]) -> list[str]:
    """Each document checked offline against the Kubernetes schemas of
    :data:`KUBERNETES_VERSION` (the schemas ship inside kubernetes-validate; strict);
    the problems found, ``[]`` when every document is valid."""
    import kubernetes_validate

    problems = []
    for document in documents:
        try:
            kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            problems.append(f"{document['kind']}/{document['metadata']['name']}: {err}")
    return problems


def by_kind(documents: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The one rendered ``kind`` named ``name``."""
    found = [d for d in documents if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]
