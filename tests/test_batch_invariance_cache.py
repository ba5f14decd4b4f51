"""The batch-invariance verdict is probed once per machine and key, then read from the
runtime cache (as the forward cost is)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from tests.fixtures import write_task_package
from vllm_srun.compose import loader
from vllm_srun.compose.loader import LoadOptions, load_model
from vllm_srun.compose.probe_cache import INVARIANCE_FOLDER


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_task_package(tmp_path_factory.mktemp("bert"), "bert", "sequence")


@pytest.fixture
def probed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[object]:
    """A fresh runtime cache, and the real probe, counting its calls."""
    monkeypatch.setenv("VLLM_SRUN_CACHE_DIR", str(tmp_path / "cache"))
    calls: list[object] = []
    real = loader.measure_batch_invariance

    def probe(*args: object, **kwargs: object) -> dict[str, object]:
        calls.append(args[1] if len(args) > 1 else None)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(loader, "measure_batch_invariance", probe)
    return calls


def files(root: Path) -> list[Path]:
    return sorted((root / "cache" / INVARIANCE_FOLDER).glob("*.json"))


def test_a_second_load_reads_the_verdict_and_says_so(bert, probed, tmp_path):
    first = load_model(str(bert), LoadOptions(engine="native"))
    second = load_model(str(bert), LoadOptions(engine="native"))
    assert len(probed) == 1
    assert first.batch_invariance["source"] == "measured"
    assert second.batch_invariance["source"] == "cache"
    strip = lambda verdict: {k: v for k, v in verdict.items() if k != "source"}  # noqa: E731
    assert strip(second.batch_invariance) == json.loads(json.dumps(strip(first.batch_invariance)))
    assert second.limits() == first.limits()
    [file] = files(tmp_path)
    document = json.loads(file.read_text())
    assert document["key"]["tolerance"] == 0.0 and document["key"]["family"] == "task_heads"
    assert document["key"]["models"][0] == "vllm_srun.engines.native.NativeEncoder"


def test_another_profile_or_engine_probes_again(bert, probed, tmp_path):
    load_model(str(bert), LoadOptions(engine="native"))
    batching = load_model(str(bert), LoadOptions(engine="native", profile="batching"))
    assert batching.batch_invariance["source"] == "measured"
    assert batching.batch_invariance["tolerance"] == 1e-5
    assert probed == [0.0, 1e-5]
    assert len(files(tmp_path)) == 2
    again = load_model(str(bert), LoadOptions(engine="native", profile="batching"))
    assert again.batch_invariance["source"] == "cache" and len(probed) == 2


def test_a_corrupt_file_is_probed_again_and_rewritten(bert, probed, tmp_path, caplog):
    first = load_model(str(bert), LoadOptions(engine="native"))
    [file] = files(tmp_path)
    document = json.loads(file.read_text())
    document["batch_invariance"].pop("method")
    file.write_text(json.dumps(document))
    with caplog.at_level(logging.WARNING, logger="vllm_srun.compose.probe_cache"):
        again = load_model(str(bert), LoadOptions(engine="native"))
    assert again.batch_invariance["source"] == "measured" and len(probed) == 2
    assert "batch-invariance cache file" in caplog.text and "has no method" in caplog.text
    method = first.batch_invariance["method"]
    assert json.loads(file.read_text())["batch_invariance"]["method"] == method
