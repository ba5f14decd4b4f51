"""The example third-party family (NanoGuard), installed from source and served.

Installed into a folder of its own with ``--no-deps`` like the accelerator example;
its dependency tiktoken comes from the environment (``make install`` installs it
beside the model packages). The released model is served when ``metatronnanoguard``
is installed, and its answers are compared with that package's own scanner.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ..served import free_port, serving
from ..wire_cards import assert_wire_card
from .test_third_party import BIN, REPO, listed_plugins, pip_install, vllm_srun

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("tiktoken") is None,
        reason="tiktoken, the example's one dependency, is not installed (make install "
        "installs it)",
    ),
]

EXAMPLE = REPO / "examples" / "third_party_family"
START_SECONDS = 300
PROMPTS = json.loads((EXAMPLE / "tests" / "prompts.json").read_text())["prompts"]


def released() -> Path | None:
    """The installed NanoGuard package folder (found by metadata: nothing of it runs)."""
    try:
        found = importlib.metadata.distribution("metatronnanoguard").locate_file("nanoguard/assets")
    except importlib.metadata.PackageNotFoundError:
        return None
    return Path(str(found))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("nanoguard") / "site"
    pip_install(EXAMPLE, target)
    return target


@pytest.fixture(scope="module")
def environ(site: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    cache = tmp_path_factory.mktemp("nanoguard-cache")
    base = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_SRUN_")}
    return {**base, "PYTHONPATH": str(site), "VLLM_SRUN_CACHE_DIR": str(cache)}


def test_installed_example_registers_a_family_and_its_engine(site):
    entry = listed_plugins(site)["nanoguard"]
    assert entry["distribution"] == "vllm-srun-nanoguard"
    assert entry["entry_point"] == "vllm_srun_nanoguard.plugin"
    assert entry["registered"]["families"] == ["nanoguard"]
    assert entry["registered"]["engines"] == ["nanoguard_torch"]
    assert entry["error"] is None and entry["refused"] == []


def test_the_example_passes_the_conformance_kit(site):
    done = vllm_srun(site, "plugins", "check", "nanoguard")
    assert done.returncode == 0, done.stdout
    assert "ok   family nanoguard: classify through nanoguard_torch: as specified" in done.stdout
    assert done.stdout.splitlines()[-1] == "plugin nanoguard: conforms"


def test_the_examples_own_tests_pass(site, environ):
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(EXAMPLE / "tests")],
        capture_output=True,
        text=True,
        env=environ,
        cwd=site,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    expected = "34 passed" if released() is not None else "32 passed, 2 skipped"
    assert expected in done.stdout, done.stdout


@pytest.fixture(scope="module")
def served(
    site: Path, environ: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    """One ``vllm-srun serve`` of the fixture package (``fixture``) and, when installed,
    the released model (``nanoguard``)."""
    folder = tmp_path_factory.mktemp("nanoguard-serve")
    code = (
        "import sys; from pathlib import Path; "
        "from vllm_srun_nanoguard.fixture import write_fixture; write_fixture(Path(sys.argv[1]))"
    )
    fixture = folder / "fixture"
    subprocess.run([sys.executable, "-c", code, str(fixture)], check=True, env=environ)
    lines = ["models:", f"  - model: {fixture}", "    name: fixture"]
    if released() is not None:
        lines += [f"  - model: {released()}", "    name: nanoguard"]
    (folder / "models.yaml").write_text("\n".join(lines) + "\n")
    port = free_port()
    command = [str(BIN / "vllm-srun"), "serve", "--models", str(folder / "models.yaml")]
    command += ["--offline", "--port", str(port), "--log-level", "warning"]
    with serving(command, environ, folder / "serve.log", port, START_SECONDS, 300) as client:
        yield client


def test_the_fixture_is_served_by_the_family_on_its_engine(served):
    cards = {c["id"]: c for c in served.get("/v1/models").json()["data"]}
    card = cards["fixture"]
    assert_wire_card(card)  # a third-party family's card, served as it wrote it
    assert (card["family"], card["engine"], card["device"]) == (
        "nanoguard",
        "nanoguard_torch",
        "cpu",
    )
    assert card["status"] == "ready"
    # Under `exact` (the default) rows share a forward only when that changes no bit.
    probe = card["batch_invariance"]
    assert probe["tolerance"] == 0.0
    assert probe["cross_request_batching"] is (probe["max_abs_deviation"] == 0.0)
    [head] = card["heads"]
    assert (head["name"], head["labels"]) == ("prompt_injection", ["safe", "injection"])
    response = served.post("/v1/classify", json={"model": "fixture", "input": ["hi", "y" * 40]})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["labels"] == ["safe", "injection"]
    first, second = body["results"]
    assert first["input"]["tokens"] == 3 and abs(sum(first["probabilities"]) - 1) < 1e-9
    assert second["error"] == "max_length_exceeded"


@pytest.mark.skipif(
    released() is None,
    reason="metatronnanoguard is not installed (pip install --no-deps metatronnanoguard==0.1.0)",
)
def test_the_released_model_serves_the_scanners_answers(served, environ):
    texts = [p["text"] for p in PROMPTS[::5]]  # 6 of the 30, both labels
    response = served.post("/v1/classify", json={"model": "nanoguard", "input": texts})
    assert response.status_code == 200, response.text
    served_scores = [r["probabilities"][1] for r in response.json()["results"]]
    code = (
        "import json, sys; from nanoguard import NanoGuard; "
        "texts = json.loads(sys.stdin.read()); "
        "print(json.dumps([r.injection_score for r in NanoGuard(device='cpu').scan_batch(texts)]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        env=environ,
        timeout=300,
        check=True,
    )
    scanner = json.loads(done.stdout)
    assert max(abs(a - b) for a, b in zip(served_scores, scanner, strict=True)) <= 1e-3
