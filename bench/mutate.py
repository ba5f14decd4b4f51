"""Mutation testing: does the suite notice a wrong answer? (`make mutate`)

The kept tool is mutmut 3. It plants one small bug at a time (an operator
swapped, a constant moved by one, a string changed, an argument dropped) into
the modules that compute answers or enforce limits, runs the tests that cover
the mutated function, and counts the mutants the tests kill.

mutmut names a mutant after the module it lives in and expects the package to
sit under ``src/`` in the directory it runs from. Our top-level folders map
onto ``vllm_srun.*`` through setuptools ``package-dir``, so this script stages
a copy with that layout under ``build/mutate/`` (``src/vllm_srun/...`` plus
``tests/``), writes mutmut's settings there, and runs ``mutmut run``. The
tests import the staged, mutated copy first (the editable install's finder
comes after the path entries mutmut puts in front); entry points resolve by
module name, so plugins load from the staged copy too. Tests that start a
second Python process would load the unmutated editable install; they are
left out of the selection (marker ``slow``).

A module may span several files (``decisions`` is the package
``plugins/decisions/``); mutmut mutates them all in one run.

Surviving mutants that cannot change behaviour (equivalent mutants) are
listed with the reason in ``bench/mutation-equivalents/MODULE.toml``; the report
counts them apart. The score of a module is
``killed / (mutants - equivalent)``.

Usage::

    python bench/mutate.py                 # every module below, then the report
    python bench/mutate.py spans windows   # some modules (names from MODULES)
    python bench/mutate.py --report-only   # rewrite the report from the last run
    python bench/mutate.py --survivors spans   # print the surviving mutants' diffs

Each module runs in its own stage ``build/mutate/MODULE`` (its log is
``mutmut.log`` there). The report goes to ``bench/results/mutation.md``.

The report's state column compares a fingerprint of the source mutated with
the repository's: a SHA-256 of each file's syntax tree with comments and
docstrings left out (:func:`fingerprint`), so a reason or a note added to a
docstring leaves a module ``current``, while any change to code marks it stale.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
STAGE = REPO / "build" / "mutate"
REPORT = REPO / "bench" / "results" / "mutation.md"
EQUIVALENTS = REPO / "bench" / "mutation-equivalents"
# Exit codes of every module's last run and the fingerprint of the source it mutated,
# kept between runs of single modules.
RESULTS = REPO / "build" / "mutation-results.json"

# Top-level folder -> import package (pyproject's [tool.setuptools.package-dir]).
PACKAGE_DIRS = {
    "core": "vllm_srun",
    "plugins": "vllm_srun/plugins",
    "families": "vllm_srun/families",
    "engines": "vllm_srun/engines",
    "accelerators": "vllm_srun/accelerators",
    "extensions": "vllm_srun/extensions",
}

# What each module computes or enforces, the files it lives in, and the tests mutmut
# may choose from for it (it runs only those that cover the mutated function).
MODULES: dict[str, tuple[tuple[str, ...], str, list[str]]] = {
    "spans": (
        ("plugins/words.py", "plugins/spans.py"),
        "span decoding (words, BIO tags to code-point spans)",
        ["tests/plugins/test_spans.py", "tests/families"],
    ),
    "windows": (
        ("plugins/windows.py",),
        "sliding windows over long inputs",
        ["tests/plugins/test_windows.py", "tests/families"],
    ),
    "task_readouts": (
        ("families/task_heads/readouts.py",),
        "pooling and head readouts",
        ["tests/families", "tests/engines/test_native.py"],
    ),
    "task_model": (
        ("families/task_heads/model.py",),
        "task heads: planning each surface, padding rows, the card",
        ["tests/families", "tests/engines/test_native.py"],
    ),
    "task_answers": (
        ("families/task_heads/answers.py",),
        "task heads: window merging, rerank, responses",
        ["tests/families", "tests/engines/test_native.py", "tests/serve/test_surfaces.py"],
    ),
    "overflow": (
        ("families/task_heads/inputs.py",),
        "inputs, limits and overflow policies",
        ["tests/families", "tests/serve"],
    ),
    "similarity_readout": (
        ("extensions/similarity_readout/readout.py",),
        "zero-shot decisions from embeddings",
        ["tests/extensions", "tests/serve/test_decisions.py"],
    ),
    "decisions": (
        (
            "plugins/decisions/body.py",
            "plugins/decisions/questions.py",
            "plugins/decisions/schema.py",
            "plugins/decisions/readout.py",
        ),
        "System One schema and readout maths",
        [
            "tests/plugins/test_decisions.py",
            "tests/families/test_causal_readout.py",
            "tests/extensions",
            "tests/serve/test_decisions.py",
        ],
    ),
    "causal_readout": (
        ("families/causal_readout/model.py",),
        "decoder decisions: rows, shared prefix, label logits",
        ["tests/families/test_causal_readout.py", "tests/engines/test_native_decoder.py"],
    ),
    "scheduler": (
        ("core/compose/batching.py", "core/service/scheduler.py"),
        "admission, batching, deadlines, result cache",
        ["tests/test_scheduler.py", "tests/serve/test_scheduling.py"],
    ),
    "registry_verify": (
        ("core/compose/registry/verify.py",),
        "registry verification (digests, links)",
        ["tests/registry"],
    ),
    "golden": (
        ("core/compose/golden.py",),
        "golden self-checks and tolerances",
        [
            "tests/test_golden.py",
            "tests/plugins/test_golden.py",
            "tests/serve/test_lifecycle.py",
            "tests/serve/test_decision_golden.py",
        ],
    ),
    "plugin_conflicts": (
        ("plugins/host/catalog.py",),
        "plugin registration and name clashes",
        ["tests/plugins"],
    ),
}

TARGET = (
    "spans",
    "windows",
    "task_readouts",
    "overflow",
    "similarity_readout",
    "decisions",
    "scheduler",
    "registry_verify",
    "golden",
    "plugin_conflicts",
)
"""The modules `make mutate` runs by default and the report always lists (issue 10's
list: span decoding, windows, readouts and pooling, the decisions maths, the scheduler
and result cache, registry verification, golden checks, overflow, plugin conflicts).
The other MODULES (the task-heads and causal-readout models) run when named."""

# Tests that start a second Python process load the unmutated editable
# install, so they can never kill a mutant: left out.
PYTEST_ARGS = ["-p", "no:cacheprovider", "-m", "not gpu", "-x", "-q"]
SUBPROCESS_TESTS = [
    "tests/test_cli.py",
    "tests/test_layout.py",
    "tests/serve/test_shutdown.py",
    "tests/examples",
]

STATUS = {
    1: "killed",
    3: "killed",
    0: "survived",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    36: "timeout",
    24: "timeout",
    -24: "timeout",
    152: "timeout",
    255: "timeout",
    -11: "segfault",
    -9: "segfault",
    None: "not checked",
}


# A mutant that makes the covering tests fail, hang past their time limit or
# crash the test process has been noticed.
DETECTED = {"killed", "timeout", "segfault"}


def fingerprint(files: dict[str, bytes]) -> str:
    """SHA-256 of the code of ``files`` (source path -> bytes), blind to comments and
    docstrings: each file's syntax tree, every bare string statement removed (module,
    class and function docstrings, and the attribute docstrings under constants),
    dumped without line numbers, keyed by its path so moving code to another file
    (which renames its mutants) changes it. Prefixed ``ast:`` to tell it from the
    older byte digests."""
    digest = hashlib.sha256()
    for source, text in sorted(files.items()):
        tree = ast.parse(text)
        for node in ast.walk(tree):
            for name in ("body", "orelse", "finalbody"):
                block = getattr(node, name, None)
                if isinstance(block, list):
                    block[:] = [
                        s
                        for s in block
                        if not (
                            isinstance(s, ast.Expr)
                            and isinstance(s.value, ast.Constant)
                            and isinstance(s.value.value, str)
                        )
                    ]
        digest.update(f"{source}\0{ast.dump(tree)}\0".encode())
    return "ast:" + digest.hexdigest()


def staged_path(source: str) -> Path:
    """``plugins/spans.py`` -> ``src/vllm_srun/plugins/spans.py`` (relative to the stage)."""
    top, _, rest = source.partition("/")
    return Path("src") / PACKAGE_DIRS[top] / rest


def mutant_module(source: str) -> str:
    return ".".join(staged_path(source).with_suffix("").parts[1:])


def stage_of(name: str) -> Path:
    return STAGE / name


def stage(name: str) -> Path:
    """Copy the package in its import layout, the tests and mutmut's settings into
    this module's own stage (so runs of different modules never share files)."""
    sources, _, tests = MODULES[name]
    root = stage_of(name)
    shutil.rmtree(root, ignore_errors=True)
    (root / "src").mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    # The core folder is the root package; the others nest inside it.
    shutil.copytree(REPO / "core", root / "src" / "vllm_srun", ignore=ignore)
    for top, package in PACKAGE_DIRS.items():
        if top != "core":
            shutil.copytree(REPO / top, root / "src" / package, ignore=ignore)
    shutil.copytree(REPO / "tests", root / "tests", ignore=ignore)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    pytest_ini = project["tool"]["pytest"]["ini_options"]
    settings = {
        "source_paths": ["src"],
        "only_mutate": [str(staged_path(source)) for source in sources],
        "pytest_add_cli_args": PYTEST_ARGS + [f"--ignore={p}" for p in SUBPROCESS_TESTS],
        "pytest_add_cli_args_test_selection": tests,
        # Our tests load small models: a mutant that loops is stopped at
        # 15x the covering tests' time plus 10 s.
        "timeout_constant": 10.0,
        "use_git_change_detection": False,
    }
    lines = ["[tool.mutmut]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in settings.items()]
    lines += ["", "[tool.pytest.ini_options]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in pytest_ini.items()]
    (root / "pyproject.toml").write_text("\n".join(lines) + "\n")
    return root


def run_mutmut(root: Path, max_children: int) -> int:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", TOKENIZERS_PARALLELISM="false")
    # One thread per forked child: libgomp is not fork-safe once it has run.
    env.setdefault("OMP_NUM_THREADS", "1")
    command = [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children)]
    # mutmut redraws a progress line many times a second: keep its log, not the terminal's.
    with open(root / "mutmut.log", "w") as log:
        return subprocess.call(command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)


def source_fingerprint(name: str) -> str:
    """:func:`fingerprint` of a module's files as they are in the repository now."""
    return fingerprint({source: (REPO / source).read_bytes() for source in MODULES[name][0]})


def staged_fingerprint(name: str) -> str | None:
    """:func:`fingerprint` of a module's files as its stage kept them (the source
    mutmut mutated), or ``None`` when the stage lacks one of them."""
    staged = {source: stage_of(name) / staged_path(source) for source in MODULES[name][0]}
    if not all(path.is_file() for path in staged.values()):
        return None
    return fingerprint({source: path.read_bytes() for source, path in staged.items()})


def upgraded(name: str, result: dict[str, Any]) -> dict[str, Any]:
    """A kept result in the current format: ``codes`` and ``fingerprint``.

    Older results kept the codes alone, or a ``source_sha256`` of one file's bytes.
    Their fingerprint is recomputed from the module's stage when it is there; else,
    when the kept digest is that of the file in the repository now, the source is
    unchanged and its fingerprint is the current one; else it is unknown (stale).
    """
    if "codes" not in result:
        result = {"codes": result}
    if "fingerprint" in result:
        return result
    found = staged_fingerprint(name) if name in MODULES else None
    if found is None and name in MODULES and result.get("source_sha256"):
        files = MODULES[name][0]
        if len(files) == 1 and (REPO / files[0]).is_file():
            now = hashlib.sha256((REPO / files[0]).read_bytes()).hexdigest()
            if now == result["source_sha256"]:
                found = source_fingerprint(name)
    return {"codes": result["codes"], "fingerprint": found}


def load_results() -> dict[str, dict[str, Any]]:
    """Per module: ``codes`` (exit code per mutant name) and ``fingerprint`` (of the
    source as it was mutated), the kept results updated by the modules of the last run
    (mutmut's ``.meta`` files, one per mutated file)."""
    results: dict[str, dict[str, Any]] = {}
    if RESULTS.exists():
        kept = json.loads(RESULTS.read_text())
        results = {n: upgraded(n, r) for n, r in kept.items()}
    for name, (sources, _, _) in MODULES.items():
        metas = [
            stage_of(name) / "mutants" / (str(staged_path(source)) + ".meta") for source in sources
        ]
        if any(meta.exists() for meta in metas):
            codes: dict[str, Any] = {}
            for meta in metas:
                if meta.exists():
                    codes.update(json.loads(meta.read_text())["exit_code_by_key"])
            # The stage keeps the module as it was mutated (mutmut writes its
            # mutants beside it, under mutants/).
            results[name] = {"codes": codes, "fingerprint": staged_fingerprint(name)}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1))
    return results


def load_equivalents() -> dict[str, str]:
    """Mutant name -> why it cannot change behaviour, from ``bench/mutation-equivalents/*.toml``
    (one file per module: ``[mutant."NAME"]`` tables with a ``reason``)."""
    reasons: dict[str, str] = {}
    for path in sorted(EQUIVALENTS.glob("*.toml")):
        table = tomllib.loads(path.read_text())
        reasons.update({key: entry["reason"] for key, entry in table.get("mutant", {}).items()})
    return reasons


def show(name: str, mutant: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "mutmut", "show", mutant],
        cwd=stage_of(name),
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip()


def write_report() -> list[str]:
    """Write the per-module table; returns the survivors not listed as equivalent."""
    results = load_results()
    equivalents = load_equivalents()
    rows, unexplained, listed = [], [], []
    for name, (sources, what, _) in MODULES.items():
        files = ", ".join(f"`{source}`" for source in sources)
        if name not in results:
            if name in TARGET:
                rows.append(f"| `{name}` | {files} | {what} | not run | | | | | |")
            continue
        codes = results[name]["codes"]
        if any(code is None for code in codes.values()):
            state = "incomplete"
        elif results[name]["fingerprint"] != source_fingerprint(name):
            state = "stale (changed since)"
        else:
            state = "current"
        counts = Counter(STATUS.get(code, "suspicious") for code in codes.values())
        killed = sum(counts[status] for status in DETECTED)
        survivors = [k for k, c in codes.items() if STATUS.get(c, "suspicious") not in DETECTED]
        equivalent = [k for k in survivors if k in equivalents]
        unexplained += [k for k in survivors if k not in equivalents]
        listed += equivalent
        total = len(codes)
        scored = total - len(equivalent)
        score = killed / scored if scored else 1.0
        rows.append(
            f"| `{name}` | {files} | {what} | {total} | {killed} | "
            f"{len(equivalent)} | {len(survivors) - len(equivalent)} | **{score:.0%}** | {state} |"
        )
    header = textwrap.dedent(
        """\
        # Mutation score

        `make mutate` (`bench/mutate.py`, mutmut 3) plants one bug at a time in the
        modules that compute answers or enforce limits and runs the tests that
        cover the mutated function. Score = killed / (mutants - equivalent), where
        killed counts every mutant the tests noticed (a failure, a test stopped
        at its time limit, a crashed test process).
        A mutant the tests do not kill is either listed below as equivalent
        (it cannot change any observable behaviour; the reason is given) or
        counted against the score.

        The last column says whether the module's code is still the one
        mutated (``current``; comments and docstrings do not count), has
        changed since (``stale``: its mutant names and equivalents need a new
        run) or whether the run did not finish.

        | module | file | what it does | mutants | killed | equivalent | survived | score | state |
        | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |
        """
    )
    body = "\n".join(rows) + "\n"
    if listed:
        body += "\n## Equivalent mutants\n\n"
        for key in sorted(listed):
            body += f"- `{key}`: {equivalents[key]}\n"
    if unexplained:
        body += "\n## Surviving mutants\n\n"
        body += "".join(f"- `{key}`\n" for key in sorted(unexplained))
    REPORT.write_text(header + body)
    return unexplained


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", metavar="MODULE", help=", ".join(MODULES))
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--survivors", action="store_true", help="print survivors' diffs")
    args = parser.parse_args(argv)
    selected = args.modules or list(TARGET)
    unknown = sorted(set(selected) - set(MODULES))
    if unknown:
        parser.error(f"unknown module {', '.join(unknown)}: choose from {', '.join(MODULES)}")
    if args.survivors:
        equivalents = load_equivalents()
        for name in selected:
            for key, code in load_results().get(name, {"codes": {}})["codes"].items():
                if STATUS.get(code, "suspicious") not in DETECTED and key not in equivalents:
                    print(f"## {key} ({STATUS.get(code, 'suspicious')})\n{show(name, key)}\n")
        return 0
    if not args.report_only:
        for name in selected:
            load_results()  # keep what the last run measured before the stage is replaced
            root = stage(name)
            files = ", ".join(MODULES[name][0])
            print(f"mutating {name} ({files}); log: {root / 'mutmut.log'}", flush=True)
            status = run_mutmut(root, args.max_children)
            if status not in (0, 1):
                print(f"mutmut exited with {status}: see {root / 'mutmut.log'}", file=sys.stderr)
                return status
    unexplained = write_report()
    print(REPORT.read_text())
    return 1 if unexplained else 0


if __name__ == "__main__":
    raise SystemExit(main())
