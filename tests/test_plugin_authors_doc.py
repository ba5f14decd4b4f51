"""docs/plugin-authors.md runs as printed.

The ``cls_embed`` walk-through is rebuilt from the guide's own blocks (the
pyproject, ``plugin.py`` from steps 2 to 5, the conformance test), then each
printed step runs and its output is compared with the one printed: the kit
before install (step 6), ``vllm-srun plugins check`` and ``plugins --json``
after a ``pip install --target`` (step 7), and ``vllm-srun serve`` answering
the printed ``curl`` with the printed vectors and card (step 8). The guide's
doctests run, every Python block compiles, and the NanoGuard and accelerator
excerpts are the tested examples' own code.
"""

from __future__ import annotations

import doctest
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .served import free_port, serving

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "plugin-authors.md"
BIN = Path(sys.executable).parent
PLUGIN_HEADER = "# vllm_srun_cls_embed/plugin.py"
START_SECONDS = 240
"""How long ``vllm-srun serve`` may take to report ready (a 2-core machine under load)."""


def blocks() -> list[tuple[int, str, str]]:
    """Every fenced block of the guide: ``(line, language, body)``."""
    found, lines, index = [], GUIDE.read_text(encoding="utf-8").split("\n"), 0
    while index < len(lines):
        match = re.match(r"^```(\w*)$", lines[index])
        if match:
            end = lines.index("```", index + 1)
            found.append((index + 1, match.group(1), "\n".join(lines[index + 1 : end])))
            index = end
        index += 1
    return found


def block_after(marker: str, language: str = "", skip: int = 0) -> str:
    """The body of the first block of ``language`` after the line holding ``marker``
    (``skip`` such blocks passed first)."""
    start = next(i for i, line in enumerate(GUIDE.read_text("utf-8").split("\n")) if marker in line)
    following = [body for line, lang, body in blocks() if line > start and lang == language]
    return following[skip]


def plugin_source() -> str:
    """``plugin.py`` as steps 2 to 5 print it, in order."""
    parts = [body for _, lang, body in blocks() if body.startswith(PLUGIN_HEADER)]
    return "\n\n\n".join(parts) + "\n"


@pytest.fixture(scope="module")
def distribution(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``vllm-srun-cls-embed`` folder of step 1, from the guide's blocks."""
    root = tmp_path_factory.mktemp("guide") / "vllm-srun-cls-embed"
    (root / "vllm_srun_cls_embed").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "pyproject.toml").write_text(block_after("### Step 1", "toml") + "\n")
    (root / "vllm_srun_cls_embed" / "__init__.py").write_text("")
    (root / "vllm_srun_cls_embed" / "plugin.py").write_text(plugin_source())
    test = next(b for _, lang, b in blocks() if "def test_module_conforms_before_install" in b)
    (root / "tests" / "test_conformance.py").write_text(test + "\n")
    return root


def environ(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_SRUN_")}
    return {**env, "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", **extra}


def run(command: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_minimal_family_stays_minimal():
    """The family and its loaded model (steps 3 and 4) take under a hundred lines of code
    (blank lines, the imports of step 2 and the fixture of step 5 not counted): collation
    and the answer builders are the API's. The whole module, as printed, stays under 190."""
    source = plugin_source()
    start = source.index(f"{PLUGIN_HEADER}, continued\nclass ClsEmbedFamily")
    end = source.index(f"{PLUGIN_HEADER}, continued\ndef write_fixture")
    code = [line for line in source[start:end].split("\n") if line.strip()]
    assert len([line for line in code if PLUGIN_HEADER not in line]) <= 100
    assert len(source.strip().split("\n")) <= 190


@pytest.mark.slow
def test_step_6_the_kit_prints_what_the_guide_shows(distribution):
    command = block_after("Before installing anything", "sh")
    code = re.search(r'python -c "(.*)"', command, re.S)
    assert code is not None, command
    out = run([sys.executable, "-c", code.group(1)], distribution, environ(PYTHONPATH="."))
    assert out == block_after("Before installing anything", "", skip=0) + "\n"


@pytest.fixture(scope="module")
def site(distribution: Path) -> Path:
    """Step 7's scratch install, as printed (``pip install --target``)."""
    command = block_after("The outputs below come from an install", "sh").split("\n")[0]
    target = distribution.parent / "site"
    argv = shlex.split(command.replace("/tmp/site", str(target)))
    assert argv[:2] == ["pip", "install"], command
    run([sys.executable, "-m", *argv], distribution.parent, environ())
    return target


@pytest.mark.slow
def test_step_7_plugins_check_and_json_print_what_the_guide_shows(site):
    env = environ(PYTHONPATH=str(site))
    printed = block_after("`vllm-srun plugins check NAME` runs the kit", "")
    command, *expected = printed.split("\n")
    assert command == "$ vllm-srun plugins check cls_embed"
    out = run(shlex.split(command[2:]), site, env)
    assert out.rstrip("\n").split("\n") == expected
    listed = json.loads(run(["vllm-srun", "plugins", "--json"], site, env))
    entry = next(p for p in listed["plugins"] if p["name"] == "cls_embed")
    assert entry == json.loads(block_after("the entry for this plugin", "json"))


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[httpx.Client]:
    """Step 8: the fixture written and served as printed (on a free port)."""
    env = environ(PYTHONPATH=str(site))
    write, serve = block_after("### Step 8", "sh").split("\n")
    package = site.parent / "cls-pkg"
    run(shlex.split(write.replace("/tmp/cls-pkg", str(package))), site, env)
    port = free_port()
    argv = shlex.split(serve.replace("/tmp/cls-pkg", str(package)))
    argv += ["--port", str(port), "--log-level", "warning"]
    with serving(argv, env, site.parent / "serve.log", port, START_SECONDS, 60) as client:
        yield client


def close(got: Any, want: Any, path: str = "") -> None:
    """``got`` equals ``want``, floats within 1e-6 (another CPU may round differently)."""
    if isinstance(want, float) and isinstance(got, float):
        assert abs(got - want) <= 1e-6, (path, got, want)
    elif isinstance(want, dict):
        assert isinstance(got, dict), (path, got)
        for key, value in want.items():
            close(got.get(key), value, f"{path}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (path, got, want)
        for index, (a, b) in enumerate(zip(got, want, strict=True)):
            close(a, b, f"{path}[{index}]")
    else:
        assert got == want, (path, got, want)


@pytest.mark.slow
def test_step_8_the_served_model_answers_what_the_guide_shows(served):
    printed = block_after("Once `/health` says `ready`", "")
    request = json.loads(re.search(r"-d '(\{.*\})'", printed).group(1))
    answer = json.loads(printed.split("\n")[-1])
    got = served.post("/v1/embeddings", json=request)
    assert got.status_code == 200, got.text
    assert list(got.json()) == list(answer)
    close(got.json(), answer)
    card = served.get("/v1/models/cls").json()
    shown = json.loads(block_after("Parts of its `/v1/models` card", "json"))
    deviation = shown.pop("batch_invariance")
    close(card, shown)
    assert card["batch_invariance"]["cross_request_batching"] is True
    assert card["batch_invariance"]["max_abs_deviation"] <= deviation["tolerance"]


def test_the_guides_doctests_run():
    parser, runner = doctest.DocTestParser(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    ran = 0
    for line, lang, body in blocks():
        if lang == "python" and body.lstrip().startswith(">>>"):
            test = parser.get_doctest(body, {}, f"plugin-authors.md:{line}", str(GUIDE), line)
            result = runner.run(test, out=lambda text: None)
            assert result.failed == 0, f"the doctest at line {line} fails"
            ran += 1
    assert ran == 2


def test_every_python_block_compiles():
    for line, lang, body in blocks():
        if lang == "python" and not body.lstrip().startswith(">>>"):
            compile(body.replace("\n...\n", "\n"), f"plugin-authors.md:{line}", "exec")


@pytest.mark.parametrize(
    ("section", "example"),
    [
        ("## Worked example: a family transformers cannot load", "third_party_family"),
        ("## Accelerators", "third_party_accelerator"),
    ],
)
def test_the_excerpts_are_the_tested_examples_code(section, example):
    """An excerpt (``...`` marks what it leaves out) is code of the example its section
    walks through, which tests/examples installs and runs."""
    text = GUIDE.read_text("utf-8")
    start = next(i for i, line in enumerate(text.split("\n")) if line.startswith(section))
    end = next(
        (i for i, line in enumerate(text.split("\n")) if i > start and line.startswith("## ")),
        len(text.split("\n")),
    )
    sources = "\n".join(
        path.read_text("utf-8") for path in (REPO / "examples" / example).rglob("*.py")
    )
    excerpts = [b for line, lang, b in blocks() if start < line < end and lang == "python"]
    assert excerpts
    for excerpt in excerpts:
        for chunk in excerpt.split("\n...\n"):
            assert chunk.strip() in sources, chunk
