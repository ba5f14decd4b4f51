"""The import rules of DESIGN §2, checked on the source tree."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PLUGIN_FOLDERS = {
    "families": "vllm_srun.families",
    "engines": "vllm_srun.engines",
    "accelerators": "vllm_srun.accelerators",
    "extensions": "vllm_srun.extensions",
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def sources(folder: str) -> list[Path]:
    return sorted((REPO / folder).rglob("*.py"))


def core_modules() -> set[str]:
    return {f"vllm_srun.{p.stem}" for p in sources("core") if p.stem != "__init__"} | {"vllm_srun"}


def test_layout_folders_exist():
    for folder in (
        "core",
        "plugins",
        "families",
        "engines",
        "accelerators",
        "extensions",
        "tests",
        "examples",
        "docs",
        "bench",
    ):
        assert (REPO / folder).is_dir(), folder


@pytest.mark.parametrize("path", sources("plugins"), ids=lambda p: p.name)
def test_plugin_api_imports_no_runtime_or_builtin_plugin(path):
    forbidden = core_modules() | set(PLUGIN_FOLDERS.values())
    bad = {
        m
        for m in imported_modules(path)
        if m in forbidden or m.startswith(tuple(f"{f}." for f in PLUGIN_FOLDERS.values()))
    }
    assert not bad, f"{path.name} imports {bad}"


PLUGIN_SOURCES = [(f, p) for f in PLUGIN_FOLDERS for p in sources(f)]


@pytest.mark.parametrize(
    ("folder", "path"),
    PLUGIN_SOURCES,
    ids=[str(p.relative_to(REPO)) for _, p in PLUGIN_SOURCES],
)
def test_builtin_plugins_import_only_the_plugin_api(folder, path):
    """A plugin (a module or a subpackage of its folder) imports the plugin API and itself."""
    first = path.relative_to(REPO / folder).parts[0].removesuffix(".py")
    own = f"{PLUGIN_FOLDERS[folder]}.{first}"
    bad = {
        m
        for m in imported_modules(path)
        if m.startswith("vllm_srun")
        and m != "vllm_srun.plugins"
        and not m.startswith("vllm_srun.plugins.")
        and m != own
        and not m.startswith(own + ".")
    }
    assert not bad, f"{path} imports {bad}"


@pytest.mark.parametrize("path", sources("core"), ids=lambda p: p.name)
def test_core_never_names_a_builtin_plugin(path):
    bad = {m for m in imported_modules(path) if m.startswith(tuple(PLUGIN_FOLDERS.values()))}
    assert not bad, f"{path.name} imports {bad}"
    text = path.read_text()
    for folder in PLUGIN_FOLDERS.values():
        assert folder not in text, f"{path.name} names {folder}"
