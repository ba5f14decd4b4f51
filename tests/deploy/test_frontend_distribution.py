"""The frontend's own distribution, ``vllm-sr`` (frontend/pyproject.toml): it declares what
``vllm_sr`` imports and nothing of the runtime, its wheel builds from the frontend folder
and the Kubernetes bases alone and holds every module and base, and installed into a fresh
virtual environment where torch, transformers, onnxruntime and ``vllm_srun`` cannot be
imported, its command answers ``--help``, ``config validate`` and ``serve --target
kubernetes``."""

from __future__ import annotations

import ast
import email
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from importlib.metadata import packages_distributions
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from .conftest import MANIFESTS, ROOT, by_kind, render, validate

FRONTEND = ROOT / "frontend"
PROJECT = tomllib.loads((FRONTEND / "pyproject.toml").read_text())["project"]
HEAVY = {"torch", "transformers", "onnxruntime", "optimum", "safetensors", "tokenizers"}
"""The runtime's heavy libraries: the frontend needs none of them."""

BLOCKED = (*sorted(HEAVY), "vllm_srun")
"""What the fresh environment refuses to import."""

BROUGHT = {"pydantic-core": "pydantic", "uvloop": "uvicorn"}
"""Imported distributions that a declared one brings (pydantic pins its core; uvicorn's
``standard`` extra brings uvloop, used where it is installed)."""

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
ROUTER_CONFIG = ROOT / "examples" / "router" / "config.yaml"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> dict[str, str | None]:
    """Each distribution frontend/pyproject.toml declares, canonical, with its extra
    (``None``: always)."""
    found: dict[str, str | None] = {
        canonical(Requirement(r).name): None for r in PROJECT["dependencies"]
    }
    for extra, requirements in PROJECT["optional-dependencies"].items():
        for requirement in requirements:
            found[canonical(Requirement(requirement).name)] = extra
    return found


def imported_modules() -> set[str]:
    """The top-level names ``vllm_sr`` imports absolutely (anywhere, conditional or not),
    less the standard library and ``vllm_sr`` itself."""
    names: set[str] = set()
    for path in FRONTEND.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {alias.name.partition(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.partition(".")[0])
    return names - set(sys.stdlib_module_names) - {"__future__", "vllm_sr"}


def test_it_declares_what_vllm_sr_imports_and_nothing_of_the_runtime():
    wanted = declared()
    assert not HEAVY & set(wanted)
    assert "vllm-srun" not in wanted
    owners = packages_distributions()
    needed = {canonical(owners[module][0]) for module in imported_modules()}
    assert {BROUGHT.get(n, n) for n in needed} == set(wanted)
    assert wanted["lingua-language-detector"] == "language"  # optional: Router mode's signals
    assert PROJECT["scripts"] == {"vllm-sr": "vllm_sr.cli:main"}


def test_the_runtimes_distribution_no_longer_ships_the_frontend():
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = root["tool"]["setuptools"]["packages"]
    assert packages and all(p.split(".")[0] == "vllm_srun" for p in packages)
    assert "vllm-sr" not in root["project"]["scripts"]
    assert "language" not in root["project"]["optional-dependencies"]


def test_the_frontend_and_the_runtime_carry_one_version():
    """The image installs both from one checkout; a release bumps them together."""
    import vllm_sr
    import vllm_srun

    assert vllm_sr.__version__ == vllm_srun.__version__


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip wheel --no-deps --no-build-isolation`` over a copy of frontend/ and
    deploy/kubernetes only: none of the runtime's folders is there."""
    root = tmp_path_factory.mktemp("vllm-sr-wheel")
    leftovers = shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
    shutil.copytree(FRONTEND, root / "source" / "frontend", ignore=leftovers)
    shutil.copytree(MANIFESTS, root / "source" / "deploy" / "kubernetes", ignore=leftovers)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         str(root / "source" / "frontend"), "-w", str(root / "wheel")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (found,) = (root / "wheel").glob("vllm_sr-*.whl")
    return found


@pytest.mark.slow
def test_the_wheel_holds_every_module_and_base_and_nothing_of_the_runtime(wheel: Path):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (metadata,) = (n for n in names if n.endswith(".dist-info/METADATA"))
        message = email.message_from_bytes(archive.read(metadata))
        (entry_points,) = (n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = archive.read(entry_points).decode()
    modules = {
        f"vllm_sr/{p.relative_to(FRONTEND).as_posix()}"
        for p in FRONTEND.rglob("*.py")
        if "build" not in p.relative_to(FRONTEND).parts
    }
    bases = {
        f"vllm_sr/deploy/kubernetes/manifests/{p.relative_to(MANIFESTS).as_posix()}"
        for p in MANIFESTS.rglob("*.yaml")
    }
    dashboard = {
        f"vllm_sr/{p.relative_to(FRONTEND).as_posix()}"
        for p in (FRONTEND / "dashboard" / "static").iterdir()
    }
    assert {Path(n).name for n in dashboard} == {"index.html", "dashboard.js", "dashboard.css"}
    packaged = {n for n in names if ".dist-info/" not in n}
    assert packaged == modules | bases | dashboard | {"vllm_sr/py.typed"}
    assert "vllm_sr/deploy/kubernetes/manifests/frontend/pvc.yaml" in packaged
    assert message["Name"] == "vllm-sr"
    requires = [Requirement(r) for r in message.get_all("Requires-Dist") or []]
    assert not {canonical(r.name) for r in requires} & (HEAVY | {"vllm-srun"})
    assert {canonical(r.name) for r in requires if r.marker is None} == {
        n for n, extra in declared().items() if extra is None
    }
    assert "vllm-sr = vllm_sr.cli:main" in scripts


NO_RUNTIME = f'''"""Refuses {", ".join(BLOCKED)} (a test's fresh environment), and logs each try."""
import importlib.abc
import os
import sys

BLOCKED = {set(BLOCKED)!r}


class NoRuntime(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] not in BLOCKED:
            return None
        log = os.environ.get("NO_RUNTIME_LOG")
        if log:
            with open(log, "a", encoding="utf-8") as out:
                out.write(name + "\\n")
        raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)


sys.meta_path.insert(0, NoRuntime())
'''


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A fresh virtual environment with the wheel installed ``--no-deps``; the test
    environment's site-packages behind it for the declared dependencies (a path line of a
    ``.pth``: its own ``.pth`` files, the editable installs among them, are not read), and
    :data:`NO_RUNTIME` in front of every import."""
    root = tmp_path_factory.mktemp("vllm-sr-venv")
    venv = root / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = venv / "bin" / "python"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
         "--no-index", "--no-compile", str(wheel)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout.strip()
    )  # fmt: skip
    (site / "_no_runtime.py").write_text(NO_RUNTIME)
    ours = sysconfig.get_paths()["purelib"]
    (site / "_no_runtime.pth").write_text(f"{ours}\nimport _no_runtime\n")
    log = root / "tried.log"
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")},
        "NO_RUNTIME_LOG": str(log),
    }
    return {"bin": venv / "bin", "site": site, "env": env, "log": log, "root": root}


def run(
    installed: dict[str, Any], *argv: str, cwd: Path, logged: bool = True
) -> subprocess.CompletedProcess[str]:
    """``argv[0]`` from the environment's ``bin``; ``logged``: its import tries land in
    the log (else nowhere)."""
    env = dict(installed["env"])
    if not logged:
        del env["NO_RUNTIME_LOG"]
    return subprocess.run(
        [str(installed["bin"] / argv[0]), *argv[1:]],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.slow
def test_installed_alone_it_imports_its_dependencies_but_not_the_runtime(installed):
    script = (
        "import importlib, sys\n"
        f"for name in {BLOCKED!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError as err:\n"
        "        print(name, 'refused:', err)\n"
        "import aiohttp, fastapi, prometheus_client, pydantic, starlette, uvicorn, yaml\n"
        "import vllm_sr\n"
        "print(vllm_sr.__file__)\n"
    )
    done = run(installed, "python", "-c", script, cwd=installed["root"], logged=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:-1] == [f"{name} refused: No module named '{name}' (blocked)" for name in BLOCKED]
    assert lines[-1] == str(installed["site"] / "vllm_sr" / "__init__.py")


@pytest.mark.slow
def test_installed_alone_its_command_answers(installed, tmp_path):
    import vllm_sr

    helped = run(installed, "vllm-sr", "--help", cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: vllm-sr ")
    assert {"serve", "config", "instance"} <= set(re.findall(r"\b[a-z]+\b", helped.stdout))
    version = run(installed, "vllm-sr", "--version", cwd=tmp_path)
    assert version.stdout == f"vllm-sr {vllm_sr.__version__}\n"

    config = tmp_path / "config.yaml"
    shutil.copy(ROUTER_CONFIG, config)
    valid = run(installed, "vllm-sr", "config", "validate", "--config", str(config), cwd=tmp_path)
    assert (valid.returncode, valid.stderr) == (0, ""), valid.stderr
    assert valid.stdout == (
        f"{config}: valid: 2 deployment(s), 1 listener(s); in use: primary, pii\n"
    )
    config.write_text(ROUTER_CONFIG.read_text().replace("port: 8899", "port: 99999"))
    refused = run(installed, "vllm-sr", "config", "validate", "--config", str(config), cwd=tmp_path)
    assert (refused.returncode, refused.stdout) == (1, "")
    assert refused.stderr == (
        f"vllm-sr: {config}: listeners[0].port: Input should be less than or equal to 65535\n"
    )

    # From an empty directory, the overlay from the bases the wheel carries.
    empty = tmp_path / "empty"
    empty.mkdir()
    done = run(installed, "vllm-sr", "serve", "--target", "kubernetes", "--platform", "cuda",
               MINILM, cwd=empty)  # fmt: skip
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert done.stdout.splitlines()[0] == "wrote vllm-sr-kubernetes/kustomization.yaml"
    assert done.stdout.splitlines()[-1] == "next: kubectl apply -k vllm-sr-kubernetes"
    overlay = empty / "vllm-sr-kubernetes"
    carried = installed["site"] / "vllm_sr" / "deploy" / "kubernetes" / "manifests"
    for path in (carried / "frontend").iterdir():
        assert (overlay / "base" / "frontend" / path.name).read_bytes() == path.read_bytes()
    documents = render(overlay)
    assert validate(documents) == []
    spec = by_kind(documents, "Deployment", "vllm-sr")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["args"][:2] == ["serve", "-e"]

    # Nothing it ran even tried to import the runtime or its libraries.
    tried = installed["log"].read_text() if installed["log"].exists() else ""
    assert tried == ""
