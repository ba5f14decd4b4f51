"""The ONNX build cache under concurrent starts, killed starts and unwritable caches
(issue 32's review): one build per target, no leftovers, no orphaned export, and
``--engine auto`` told why the cache cannot take an export."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil

from vllm_srun.engines.onnxruntime.export import (
    GRAPH_FILE,
    PARENT_VARIABLE,
    _build_once,
    cache_problem,
    check_build,
)
from vllm_srun.plugins.spec import ModelSpec


def test_two_starts_building_one_target_build_once_and_both_use_it(tmp_path):
    """The second start waits on the lock, finds the first one's verified build and
    never replaces it (it used to move it aside while the first was opening it)."""
    target = tmp_path / "onnx" / "digest" / "feature-extraction"
    started, release = threading.Event(), threading.Event()
    builds: list[Path] = []

    def build(staging: Path) -> None:
        builds.append(staging)
        started.set()
        assert release.wait(10)
        (staging / GRAPH_FILE).write_bytes(b"graph")

    results: list[Path] = []
    first = threading.Thread(
        target=lambda: results.append(_build_once(target, build, "w", "export"))
    )
    first.start()
    assert started.wait(10)
    second = threading.Thread(
        target=lambda: results.append(_build_once(target, build, "w", "export"))
    )
    second.start()
    release.set()
    first.join(10)
    second.join(10)
    assert results == [target / GRAPH_FILE] * 2 and len(builds) == 1
    assert check_build(target, "w", "export") is None
    assert sorted(p.name for p in target.parent.iterdir()) == [
        ".feature-extraction.lock",
        "feature-extraction",
    ]


def test_a_killed_builds_leftovers_are_removed_by_the_next_build(tmp_path):
    target = tmp_path / "feature-extraction"
    for leftover in (".feature-extraction.abc.tmp", ".feature-extraction.def.old"):
        (tmp_path / leftover).mkdir()
        (tmp_path / leftover / "model.onnx_data").write_bytes(b"x" * 1000)
    graph = _build_once(target, lambda s: (s / GRAPH_FILE).write_bytes(b"g"), "w", "export")
    assert graph.read_bytes() == b"g"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".feature-extraction.lock",
        "feature-extraction",
    ]


def test_a_cache_that_cannot_take_an_export_is_a_refusal_naming_the_fix(tmp_path):
    package = tmp_path / "package"
    package.mkdir()
    (package / "model.safetensors").write_bytes(b"w" * 4096)
    spec = ModelSpec(package, "BertModel", "bert", "encoder", weights=("model.safetensors",))
    assert cache_problem(spec, {"VLLM_SRUN_CACHE_DIR": str(tmp_path / "new" / "cache")}) is None
    blocker = tmp_path / "afile"
    blocker.write_text("")
    assert cache_problem(spec, {"VLLM_SRUN_CACHE_DIR": str(blocker)}) == (
        f"the runtime cache {blocker} cannot be written to export the model: set "
        "VLLM_SRUN_CACHE_DIR to a writable folder with room, or serve it with --engine native"
    )
    free = shutil.disk_usage(tmp_path).free  # sparse weights as large as the free space
    os.truncate(package / "model.safetensors", free)
    problem = cache_problem(spec, {"VLLM_SRUN_CACHE_DIR": str(tmp_path / "cache")})
    assert problem is not None and "MiB free; exporting the model needs about" in problem


CHILD = (
    "import sys, time; from vllm_srun.engines.onnxruntime.export import die_with_parent; "
    "die_with_parent(); print('up', flush=True); time.sleep(60)"
)
PARENT = (
    "import os, subprocess, sys, time\n"
    f"env = {{**os.environ, {PARENT_VARIABLE!r}: str(os.getpid())}}\n"
    f"child = subprocess.Popen([sys.executable, '-c', {CHILD!r}], env=env,\n"
    "                         stdout=subprocess.PIPE)\n"
    "child.stdout.readline()\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(60)\n"
)


def test_a_build_child_ends_when_its_server_is_killed():
    """SIGKILL of the process that started an export ends the export too."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = psutil.Process(int(parent.stdout.readline()))
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        child.wait(10)  # psutil.TimeoutExpired if it outlived its parent
    finally:
        parent.kill()


def test_a_build_child_whose_parent_is_already_gone_ends_at_once():
    env = {**os.environ, PARENT_VARIABLE: "1"}  # not this child's parent
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, timeout=60)
    assert (done.returncode, done.stdout) == (1, b"")
