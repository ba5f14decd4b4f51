"""A model on ONNX Runtime is served without torch, transformers or optimum.

``vllm-srun serve MODEL --engine onnxruntime`` runs twice per model, on one runtime cache
of its own: the first start (MiniLM: its export, in a child process; both: the digests
and the probes' results cached), then a warm start. Each runs under a probe
(:data:`PROBE`: the CLI, which at exit writes the modules of ``torch``, ``transformers``
and ``optimum`` found in ``sys.modules``), and neither serving process may hold one. The
warm start reads the export, the batch-invariance verdict and the forward cost from the
cache, and its answers over HTTP equal the model's golden reference (the answers
recorded on this machine's reference key, within its tolerance).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from vllm_srun.compose.golden import difference
from vllm_srun.plugins import read_reference_file

from ..served import free_port, serving

FAMILY_GOLDEN = Path(__file__).parents[2] / "families" / "task_heads" / "golden"
PROBE = """
import atexit, json, os, sys
from vllm_srun.cli import main

def written():
    held = sorted(
        name for name, module in sys.modules.items()
        if module is not None and name.split(".")[0] in ("torch", "transformers", "optimum")
    )
    with open(os.environ["IMPORT_PROBE"], "w") as out:
        json.dump({"forbidden": held, "onnxruntime": "onnxruntime" in sys.modules}, out)

atexit.register(written)
sys.exit(main(sys.argv[1:]))
"""
"""``python -c PROBE serve ...``: the CLI (``python -m vllm_srun``), then at exit (the serve
command's end runs the atexit functions) the forbidden modules it holds."""
pytestmark = pytest.mark.slow


@dataclass
class Served:
    """A warm start while it runs: its client; ``stop`` ends it (the probe then writes);
    what the first start held at exit; the warm start's probe file and log."""

    client: httpx.Client
    model: str
    stop: Callable[[], None]
    first: dict[str, Any]
    probe: Path
    log: Path


def _served(model: str, tmp: Path) -> Iterator[Served]:
    env = {**os.environ, "VLLM_SRUN_CACHE_DIR": str(tmp / "cache")}
    with contextlib.ExitStack() as stack:
        for start in ("first", "warm"):
            port = free_port()
            argv = [sys.executable, "-c", PROBE, "serve", model, "--offline"]
            argv += ["--engine", "onnxruntime", "--port", str(port)]
            env["IMPORT_PROBE"] = str(tmp / f"{start}.json")
            running = serving(argv, env, tmp / f"{start}.log", port, 240, 60)
            if start == "first":  # the cache is filled: export, digests, probes' results
                with running:
                    pass
                continue
            client = stack.enter_context(running)
            first = json.loads((tmp / "first.json").read_text())
            yield Served(client, model, stack.close, first, tmp / "warm.json", tmp / "warm.log")


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from _served("sentence-transformers/all-MiniLM-L6-v2", tmp_path_factory.mktemp("m"))


@pytest.fixture(scope="module")
def rampart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from _served("arcjet/rampart-pii", tmp_path_factory.mktemp("r"))


def _reference_answers(name: str, client: httpx.Client) -> tuple[list[Any], list[Any], float]:
    reference = read_reference_file(FAMILY_GOLDEN / name)
    card = client.get("/v1/models").json()["data"][0]
    key = card["golden"]["reference"]
    assert card["golden"]["status"] == "matched" and key in reference.answers
    return list(reference.requests), list(reference.answers[key]), reference.tolerances["cpu"]


def _model_spans(answer: dict[str, Any]) -> dict[str, Any]:
    """A classify answer as the family writes it: the spans the model found, without the
    pattern extension's spans and the keys it adds."""
    results = [
        {
            **result,
            "spans": [
                {k: v for k, v in span.items() if k not in ("source", "recognizer")}
                for span in result["spans"]
                if span.get("source", "model") == "model"
            ],
        }
        for result in answer["results"]
    ]
    return {**answer, "results": results}


def test_minilm_answers_its_golden_reference_over_http(minilm):
    requests, recorded, tolerance = _reference_answers("all-minilm-l6-v2.json", minilm.client)
    card = minilm.client.get("/v1/models").json()["data"][0]
    assert card["engine"] == "onnxruntime"
    assert card["batch_invariance"]["source"] == "cache"
    assert card["forward_cost"]["source"] == "cache"
    for request, expected in zip(requests, recorded, strict=True):
        assert request["surface"] == "embeddings"
        answer = minilm.client.post(
            "/v1/embeddings", json={"model": minilm.model, **request["body"]}
        )
        assert answer.status_code == 200
        body = {k: v for k, v in answer.json().items() if k != "model"}
        assert difference(body, expected, tolerance) is None


def test_rampart_answers_its_golden_reference_over_http(rampart):
    requests, recorded, tolerance = _reference_answers("rampart-pii.json", rampart.client)
    card = rampart.client.get("/v1/models").json()["data"][0]
    assert card["batch_invariance"]["source"] == "cache"
    for request, expected in zip(requests, recorded, strict=True):
        assert request["surface"] == "classify"
        answer = rampart.client.post(
            "/v1/classify", json={"model": rampart.model, **request["body"]}
        )
        assert answer.status_code == 200
        body = _model_spans({k: v for k, v in answer.json().items() if k != "model"})
        assert difference(body, expected, tolerance) is None


@pytest.mark.parametrize("name", ["minilm", "rampart"])
def test_no_start_imports_torch_transformers_or_optimum(name, request):
    """Run after the model's HTTP tests (this file's order): it stops the warm start, so
    what its answers imported counts too."""
    served: Served = request.getfixturevalue(name)
    served.stop()
    warm = json.loads(served.probe.read_text())
    assert served.first == {"forbidden": [], "onnxruntime": True}
    assert warm == {"forbidden": [], "onnxruntime": True}
    log = served.log.read_text(errors="replace")
    assert "is ready on cpu (onnxruntime), golden matched" in log
    assert "building it again" not in log
