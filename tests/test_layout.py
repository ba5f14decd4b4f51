"""The import rules of DESIGN §2: import-linter's contracts in pyproject.toml, run on the
package in its import layout, and the checks those contracts cannot express."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PLUGIN_FOLDERS = {
    "plugins": "vllm_srun.plugins",
    "families": "vllm_srun.families",
    "engines": "vllm_srun.engines",
    "accelerators": "vllm_srun.accelerators",
    "extensions": "vllm_srun.extensions",
}
BUILTIN_PACKAGES = [p for f, p in PLUGIN_FOLDERS.items() if f != "plugins"]
CONTRACTS = {
    c["id"]: c
    for c in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"
    ]
}


def typed_tree(root: Path) -> Path:
    """The package in its import layout under ``root``: real folders, files linked to the
    repository's (what ``make typed-tree`` builds for mypy and lint-imports)."""
    package = root / "vllm_srun"

    def link_tree(source: Path, target: Path) -> None:
        for folder, dirs, files in os.walk(source):
            # what an in-place build leaves (pip wheel ./frontend) is not the package's
            dirs[:] = [
                d for d in dirs if d not in ("__pycache__", "build") and not d.endswith(".egg-info")
            ]
            here = target / Path(folder).relative_to(source)
            here.mkdir(parents=True, exist_ok=True)
            for name in files:
                if name.endswith(".py"):
                    (here / name).symlink_to(Path(folder) / name)

    link_tree(REPO / "core", package)
    link_tree(REPO / "frontend", root / "vllm_sr")
    for folder, name in PLUGIN_FOLDERS.items():
        link_tree(REPO / folder, root / name.replace(".", "/"))
    return root


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    command = [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"]
    return subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def core_modules() -> set[str]:
    """``vllm_srun.X`` for every module and subpackage directly in core/."""
    found = {f"vllm_srun.{p.stem}" for p in (REPO / "core").glob("*.py") if p.stem != "__init__"}
    found |= {f"vllm_srun.{p.parent.name}" for p in (REPO / "core").glob("*/__init__.py")}
    return found


def test_layout_folders_exist():
    for folder in (*PLUGIN_FOLDERS, "core", "frontend", "tests", "examples", "docs", "bench"):
        assert (REPO / folder).is_dir(), folder


def test_the_contracts_list_every_core_module():
    """A new core module must join the contracts, or the plugin API could import it."""
    listed_by = {
        "plugin-api": set(CONTRACTS["plugin-api"]["forbidden_modules"]) - set(BUILTIN_PACKAGES),
        "builtins-use-plugin-api": set(CONTRACTS["builtins-use-plugin-api"]["forbidden_modules"]),
        "core-names-no-builtin": set(CONTRACTS["core-names-no-builtin"]["source_modules"]),
    }
    for contract, listed in listed_by.items():
        assert listed == core_modules(), contract


def test_the_contracts_list_every_builtin_plugin():
    plugins = {
        f"{package}.{path.stem if path.suffix else path.name}"
        for package in BUILTIN_PACKAGES
        for path in (REPO / package.split(".")[1]).iterdir()
        if path.name != "__init__.py" and (path.suffix == ".py" or (path / "__init__.py").exists())
    }
    assert set(CONTRACTS["builtins-independent"]["modules"]) == plugins


@pytest.mark.slow
def test_the_import_contracts_hold(tmp_path):
    result = lint_imports(typed_tree(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "7 kept, 0 broken" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("where", "source", "contract"),
    [
        # The hand-written rule this replaces flattened subpackage names and let this pass.
        ("plugins/_leak.py", "import vllm_srun.serve.app\n", "imports nothing else"),
        ("engines/_leak.py", "from vllm_srun.service import scheduler\n", "never the core"),
        (
            "families/task_heads/_leak.py",
            "import vllm_srun.engines.native\n",
            "never import each other",
        ),
        ("core/serve/_leak.py", "import vllm_srun.engines.native\n", "never by import"),
        ("core/compose/registry/_leak.py", "import vllm_srun.compose.loader\n", "No import cycles"),
        ("core/compose/_leak.py", "import vllm_srun.service.scheduler\n", "compose -> service"),
        ("core/service/_leak.py", "from vllm_srun.serve import requests\n", "compose -> service"),
        ("frontend/workers/_leak.py", "import vllm_srun.serve.app\n", "nothing of the runtime"),
        ("frontend/_leak.py", "from vllm_srun import errors\n", "nothing of the runtime"),
    ],
)
def test_a_broken_rule_is_caught(tmp_path, where, source, contract):
    tree = typed_tree(tmp_path)
    top, _, rest = where.partition("/")
    package = {"frontend": "vllm_sr", **PLUGIN_FOLDERS}.get(top, "vllm_srun")
    target = tree / package.replace(".", "/") / rest
    target.write_text(source)
    result = lint_imports(tree)
    assert result.returncode == 1
    broken = result.stdout.split("Broken contracts")[1]
    assert contract in broken, result.stdout


BUILTIN_NAMES = re.compile(
    r"\b(native|onnxruntime|task_heads|causal_readout|laya|similarity_readout|pii_patterns)\b"
)
"""The built-in families, engines and extensions by their entry-point names."""


@pytest.mark.parametrize("path", sorted((REPO / "core").rglob("*.py")), ids=lambda p: p.name)
def test_core_never_names_a_builtin_plugin(path):
    """Not even in a string, a message or help: the core finds plugins through entry
    points, and must read the same without the built-in ones installed."""
    text = path.read_text()
    for package in BUILTIN_PACKAGES:
        assert package not in text, f"{path.name} names {package}"
    assert not BUILTIN_NAMES.findall(text), f"{path.name} names {BUILTIN_NAMES.findall(text)}"


def test_typed_tree_matches_the_makefile(tmp_path):
    """``make typed-tree`` and :func:`typed_tree` build the same file set."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    made = tmp_path / "made"
    subprocess.run(["make", "-s", "typed-tree", f"TYPED={made}"], cwd=REPO, check=True, timeout=60)
    ours = typed_tree(tmp_path / "ours")

    def files(root: Path) -> set[str]:
        return {str(p.relative_to(root)) for p in root.rglob("*.py")}

    assert files(made) == files(ours)
