"""The ``exact`` profile: a row's answer is the same bits alone and in any batch.

Each model answers a short input alone, then inside batches with long rows before
and after it, at several positions; the answers must be equal as Python floats
(bit for bit: no tolerance), on MiniLM (native and onnxruntime), Rampart (its own
ONNX graph) and the causal_readout fixture decoder. Both serving paths are used:
the synchronous :meth:`ServedModel.answer` and the scheduler's worker, which puts
rows of different requests into one forward.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from vllm_srun.batching import fill_forward, split_by_length
from vllm_srun.families.causal_readout.fixture import FIXTURE_REQUEST, write_fixture
from vllm_srun.loader import LoadOptions, ServedModel, load_model
from vllm_srun.plugins.spec import WorkItem
from vllm_srun.scheduler import Job, ModelScheduler

LONG = (
    "Dear support team, my name is Jane Doe and I live at 42 Harbour Street in Springfield; "
    "you can reach me at jane.doe@example.org or on 212-555-0147 about the order I placed "
    "last Tuesday, which was charged twice and never arrived at my door."
)
SHORTER = "Please forward the invoice to accounts@example.com before Friday."
SHORT = "Call John Smith tomorrow."
POSITIONS = (
    [SHORT, LONG],
    [LONG, SHORT],
    [LONG, SHORTER, SHORT, LONG],
    [SHORTER, LONG, LONG, SHORT, SHORTER],
)
"""Batches holding ``SHORT`` at the start, the end and in the middle of longer rows."""


def _without_index(results: list[dict[str, Any]], position: int) -> dict[str, Any]:
    return {k: v for k, v in results[position].items() if k != "index"}


@pytest.fixture(scope="module")
def minilm() -> ServedModel:
    return load_model("sentence-transformers/all-MiniLM-L6-v2", LoadOptions(offline=True))


@pytest.fixture(scope="module")
def minilm_onnx(tmp_path_factory: pytest.TempPathFactory) -> ServedModel:
    cache = tmp_path_factory.mktemp("export-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_SRUN_CACHE_DIR", str(cache))
        return load_model(
            "sentence-transformers/all-MiniLM-L6-v2",
            LoadOptions(offline=True, engine="onnxruntime"),
        )


@pytest.fixture(scope="module")
def rampart() -> ServedModel:
    return load_model("arcjet/rampart-pii", LoadOptions(offline=True))


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> ServedModel:
    package = write_fixture(tmp_path_factory.mktemp("decoder"))
    return load_model(str(package), LoadOptions(offline=True))


def test_an_exact_card_says_how_rows_are_batched(minilm, minilm_onnx, rampart, decoder):
    """MiniLM and Rampart pass the equal-length probe; the fixture decoder's tiny
    matmuls round with the row's position, so it answers one row at a time."""
    for served, method, engine in (
        (minilm, "equal_length", "native"),
        (minilm_onnx, "equal_length", "onnxruntime"),
        (rampart, "equal_length", "onnxruntime"),
        (decoder, "one_by_one", "native"),
    ):
        card = served.card()
        assert (card["engine"], card["profile"], card["numerics"]) == (engine, "exact", "exact")
        assert card["batch_invariance"]["method"] == method
        assert card["batch_invariance"]["tolerance"] == 0.0
    assert minilm.card()["batch_invariance"]["max_abs_deviation"] == 0.0
    assert decoder.limits().max_num_seqs == 1
    assert minilm.limits().equal_length_forwards is True


@pytest.mark.parametrize("engine", ["native", "onnxruntime"])
def test_minilm_embeddings_and_rerank_are_the_same_bits_in_any_batch(engine, minilm, minilm_onnx):
    served = minilm if engine == "native" else minilm_onnx
    alone = served.answer("embeddings", {"input": [SHORT]})["data"][0]["embedding"]
    for batch in POSITIONS:
        data = served.answer("embeddings", {"input": batch})["data"]
        assert data[batch.index(SHORT)]["embedding"] == alone, batch
    scored = served.answer("rerank", {"query": "phone call", "documents": [SHORT]})["results"]
    for batch in POSITIONS:
        results = served.answer("rerank", {"query": "phone call", "documents": batch})["results"]
        mine = next(r for r in results if r["index"] == batch.index(SHORT))
        assert (mine["relevance_score"], mine["logit"]) == (
            scored[0]["relevance_score"],
            scored[0]["logit"],
        )


def test_rampart_spans_and_probabilities_are_the_same_bits_in_any_batch(rampart):
    alone = rampart.answer("classify", {"input": [SHORT]})["results"]
    assert [s["label"] for s in alone[0]["spans"]] == ["GIVEN_NAME", "SURNAME"]
    for batch in POSITIONS:
        results = rampart.answer("classify", {"input": batch})["results"]
        assert _without_index(results, batch.index(SHORT)) == _without_index(alone, 0), batch


def test_decoder_answers_are_the_same_bits_alone_and_beside_a_long_state(decoder):
    alone = decoder.answer("decisions", dict(FIXTURE_REQUEST))["answers"]
    long_state = {"state": LONG, "questions": FIXTURE_REQUEST["questions"]}
    mine = {"state": FIXTURE_REQUEST["state"], "questions": FIXTURE_REQUEST["questions"]}
    for entries in ([mine, long_state], [long_state, mine], [long_state, mine, long_state]):
        body = decoder.answer("decisions", {**entries[0], "states": entries[1:]})
        answers = [body["answers"], *(state["answers"] for state in body["states"])]
        assert answers[entries.index(mine)] == alone, entries


def test_rows_of_other_requests_in_one_scheduler_forward_leave_the_bits_alone(minilm):
    """Through the worker: two requests queued together share its forwards."""
    host = minilm.loaded
    short_plan = host.plan("embeddings", _request(SHORT))
    [alone] = minilm.run_rows(short_plan.items)
    done = threading.Event()
    outputs: dict[str, Any] = {}
    scheduler = ModelScheduler("minilm", minilm.run_rows, minilm.limits())
    try:
        long_plan = host.plan("embeddings", _request(LONG))
        jobs = [
            Job(long_plan.items, lambda out: outputs.__setitem__("long", out)),
            Job(short_plan.items, lambda out: (outputs.__setitem__("short", out), done.set())),
        ]
        scheduler.submit(jobs)
        assert done.wait(timeout=60)
    finally:
        scheduler.stop(grace_seconds=10)
    assert outputs["short"][0].numpy().tobytes() == alone.numpy().tobytes()


def _request(text: str) -> Any:
    from vllm_srun.plugins.requests import read_request

    return read_request("embeddings", {"input": [text]})


def test_exact_forwards_hold_one_length_and_are_filled_to_the_shape_a_lone_row_gets():
    rows = [WorkItem((1,) * n, None, f"k{n}-{i}") for i, n in enumerate([3, 9, 3, 40, 9])]
    groups = split_by_length(rows, overhead_tokens=1000.0, equal_length=True)
    assert [[r.key for r in g] for g in groups] == [["k3-0", "k3-2"], ["k9-1", "k9-4"], ["k40-3"]]
    seen: list[list[str]] = []

    def run(batch: list[WorkItem]) -> list[str]:
        seen.append([r.key for r in batch])
        return [r.key for r in batch]

    assert fill_forward(run, 32)(groups[0]) == ["k3-0", "k3-2"]
    assert fill_forward(run, 32)(groups[2]) == ["k40-3"]
    # 2 rows of 3 tokens are filled with 9 copies of the last row: 11 rows, 33 tokens
    assert seen == [["k3-0", "k3-2"] + ["k3-2"] * 9, ["k40-3"]]


def test_exact_answers_do_not_depend_on_the_fill(minilm: ServedModel, tmp_path: Path):
    """A short row run as a filled forward answers what it answers among equals."""
    host = minilm.loaded
    [row] = host.plan("embeddings", _request("a")).items
    [filled] = minilm.run_rows([row])
    for copies in (2, 5, 17):
        for output in minilm.run_rows([row] * copies):
            assert output.numpy().tobytes() == filled.numpy().tobytes()
