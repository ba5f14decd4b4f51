"""The ``exact`` profile: a row's answer is the same bits alone and in any batch.

Each model answers a short input alone, then inside batches with long rows before
and after it, at several positions; the answers must be equal as Python floats
(bit for bit: no tolerance), on MiniLM (native and onnxruntime), Rampart (its own
ONNX graph) and the causal_readout fixture decoder. Both serving paths are used:
the synchronous :meth:`ServedModel.answer` and the scheduler's worker, which puts
rows of different requests, of many lengths, into one forward padded to a fixed edge.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from vllm_srun.compose.batching import ExactShapes, LengthEdges, exact_forward
from vllm_srun.compose.loader import LoadOptions, ServedModel, load_model
from vllm_srun.families.causal_readout.fixture import FIXTURE_REQUEST, write_fixture
from vllm_srun.plugins.spec import WorkItem
from vllm_srun.service.scheduler import Job, ModelScheduler

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
    # pinned: --engine auto takes onnxruntime where the reference declares it at parity
    return load_model(
        "sentence-transformers/all-MiniLM-L6-v2", LoadOptions(offline=True, engine="native")
    )


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
    """MiniLM and Rampart pass the padded probe (rows of any length share a forward padded
    to a fixed edge); the fixture decoder's tiny matmuls round with the row's position,
    so it answers one row at a time."""
    for served, method, engine in (
        (minilm, "padded_to_edge", "native"),
        (minilm_onnx, "padded_to_edge", "onnxruntime"),
        (rampart, "padded_to_edge", "onnxruntime"),
        (decoder, "one_by_one", "native"),
    ):
        card = served.card()
        assert (card["engine"], card["profile"], card["numerics"]) == (engine, "exact", "exact")
        assert card["batch_invariance"]["method"] == method
        assert card["batch_invariance"]["tolerance"] == 0.0
    invariance = minilm.card()["batch_invariance"]
    assert invariance["max_abs_deviation"] == 0.0
    assert invariance["min_forward_tokens"] == 32
    assert invariance["padded_up_to"] == 128  # padded across edges only up to 128 tokens
    # MiniLM reads 256 tokens: edges 16 apart up to its limit
    assert invariance["edges"] == list(range(16, 257, 16))
    assert decoder.limits().max_num_seqs == 1
    assert minilm.limits().exact == ExactShapes(
        "padded_to_edge", LengthEdges(256), padded_up_to=128
    )


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
    short_plan = host.plan("embeddings", _read("embeddings", [SHORT]))
    [alone] = minilm.run_rows(short_plan.items)
    done = threading.Event()
    outputs: dict[str, Any] = {}
    scheduler = ModelScheduler("minilm", minilm.run_rows, minilm.limits())
    try:
        long_plan = host.plan("embeddings", _read("embeddings", [LONG]))
        jobs = [
            Job(long_plan.items, lambda out: outputs.__setitem__("long", out)),
            Job(short_plan.items, lambda out: (outputs.__setitem__("short", out), done.set())),
        ]
        scheduler.submit(jobs)
        assert done.wait(timeout=60)
    finally:
        scheduler.stop(grace_seconds=10)
    assert outputs["short"][0].tobytes() == alone.tobytes()


def test_equal_length_forwards_hold_one_length_and_are_filled_to_the_shape_a_lone_row_gets():
    rows = [WorkItem((1,) * n, None, f"k{n}-{i}") for i, n in enumerate([3, 9, 3, 40, 9])]
    shapes = ExactShapes("equal_length")
    groups = shapes.groups(rows, overhead_tokens=1000.0)
    assert [[r.key for r in g] for g in groups] == [["k3-0", "k3-2"], ["k9-1", "k9-4"], ["k40-3"]]
    seen: list[list[str]] = []

    def run(batch: list[WorkItem]) -> list[str]:
        seen.append([r.key for r in batch])
        return [r.key for r in batch]

    assert exact_forward(run, shapes)(groups[0]) == ["k3-0", "k3-2"]
    assert exact_forward(run, shapes)(groups[2]) == ["k40-3"]
    # 2 rows of 3 tokens are filled with 9 copies of the last row: 11 rows, 33 tokens
    assert seen == [["k3-0", "k3-2"] + ["k3-2"] * 9, ["k40-3"]]


def test_padded_forwards_run_at_the_edge_of_their_longest_row():
    rows = [WorkItem((1,) * n, None, f"k{n}") for n in (3, 17, 20, 33, 300)]
    seen: list[tuple[list[str], int]] = []

    def run(batch: list[WorkItem], width: int) -> list[str]:
        seen.append(([r.key for r in batch], width))
        return [r.key for r in batch]

    padded = ExactShapes("padded_to_edge", LengthEdges(512), padded_up_to=512)
    # no measured forward cost: one forward, at the edge of its longest row (300 -> 320)
    assert padded.groups(rows, None) == [rows]
    # rows whose edge is above padded_up_to share forwards with their own edge only
    capped = ExactShapes("padded_to_edge", LengthEdges(512), padded_up_to=32)
    assert [[r.tokens for r in g] for g in capped.groups(rows, None)] == [
        [3, 17, 20],
        [33],
        [300],
    ]
    assert exact_forward(run, padded)(rows[:4]) == ["k3", "k17", "k20", "k33"]
    assert exact_forward(run, padded)(rows[:1]) == ["k3"]  # 16 wide, 2 rows: 32 tokens
    assert seen == [(["k3", "k17", "k20", "k33"], 48), (["k3", "k3"], 16)]
    # a costly forward keeps lengths together; padding 3 to 320 costs more than a forward
    cut = padded.groups(rows, overhead_tokens=100.0)
    assert [[r.tokens for r in g] for g in cut] == [[3, 17, 20, 33], [300]]
    # same_bucket: only rows of one edge share a forward
    bucket = ExactShapes("same_bucket", LengthEdges(512))
    assert [[r.tokens for r in g] for g in bucket.groups(rows, 0.0)] == [[3], [17, 20], [33], [300]]


def test_length_edges_are_a_grid_of_the_row_alone_and_stop_at_the_limit():
    edges = LengthEdges(512)
    assert [edges.edge(n) for n in (1, 16, 17, 256, 257, 288, 289, 500, 512)] == [
        16, 16, 32, 256, 288, 288, 320, 512, 512,
    ]  # fmt: skip
    assert LengthEdges(300).edge(290) == 300  # never wider than the model reads
    assert LengthEdges(None).edge(3000) == 3072  # past 1024: 128 apart
    assert LengthEdges(100).listed() == [16, 32, 48, 64, 80, 96, 100]


def test_exact_answers_do_not_depend_on_the_fill(minilm: ServedModel, tmp_path: Path):
    """A short row run as a filled forward answers what it answers among equals."""
    host = minilm.loaded
    [row] = host.plan("embeddings", _read("embeddings", ["a"])).items
    [filled] = minilm.run_rows([row])
    for copies in (2, 5, 17):
        for output in minilm.run_rows([row] * copies):
            assert output.tobytes() == filled.tobytes()


MANY_LENGTHS = [
    "Hi.",
    SHORT,
    SHORTER,
    "Our quarterly report is attached; the numbers for March are still provisional.",
    LONG,
    "The committee meets on Thursday at noon in the library's second-floor reading room, "
    "and the agenda covers the budget, the new shelving and the volunteers' rota.",
    "Refund requested.",
    "Can you confirm whether the parcel left the warehouse in Rotterdam yesterday evening?",
]
"""Inputs of 4 to 60 tokens: several edges, several lengths within one edge."""


@pytest.mark.parametrize("name", ["minilm", "rampart"])
def test_rows_of_many_lengths_in_one_request_are_the_bits_each_gets_alone(name, request):
    served: ServedModel = request.getfixturevalue(name)
    surface = "embeddings" if name == "minilm" else "classify"
    together = served.answer(surface, {"input": MANY_LENGTHS})
    key = "data" if name == "minilm" else "results"
    lengths = {
        row.tokens for row in served.loaded.plan(surface, _read(surface, MANY_LENGTHS)).items
    }
    assert len(lengths) >= 6 and len({(n + 15) // 16 for n in lengths}) >= 3  # edges 16 apart
    for index, text in enumerate(MANY_LENGTHS):
        [alone] = served.answer(surface, {"input": [text]})[key]
        mine = together[key][index]
        assert {k: v for k, v in mine.items() if k != "index"} == {
            k: v for k, v in alone.items() if k != "index"
        }, text


@pytest.mark.parametrize("name", ["minilm", "rampart"])
def test_concurrent_requests_of_many_lengths_share_padded_forwards_and_keep_the_bits(name, request):
    """Through the worker: one request per text, queued together, so that rows of many
    lengths and requests share forwards (checked: some forward holds several lengths)."""
    served: ServedModel = request.getfixturevalue(name)
    surface = "embeddings" if name == "minilm" else "classify"
    plans = [served.loaded.plan(surface, _read(surface, [text])) for text in MANY_LENGTHS]
    alone = [served.run_rows(plan.items)[0] for plan in plans]
    forwards: list[list[int]] = []

    def recorded(rows: list[WorkItem]) -> list[Any]:
        forwards.append([row.tokens for row in rows])
        return served.run_rows(rows)

    outputs: dict[int, Any] = {}
    done = threading.Event()

    def answered(index: int) -> Any:
        def store(out: list[Any]) -> None:
            outputs[index] = out[0]
            if len(outputs) == len(plans):
                done.set()

        return store

    limits = served.limits()
    scheduler = ModelScheduler(name, recorded, limits)
    try:
        scheduler.submit([Job(plan.items, answered(i)) for i, plan in enumerate(plans)])
        assert done.wait(timeout=60)
    finally:
        scheduler.stop(grace_seconds=10)
    assert max(len(set(lengths)) for lengths in forwards) > 1, forwards
    for index, text in enumerate(MANY_LENGTHS):
        assert outputs[index].tobytes() == alone[index].tobytes(), text


def _read(surface: str, texts: list[str]) -> Any:
    from vllm_srun.plugins.requests import read_request

    return read_request(surface, {"input": texts})


def test_long_rows_beside_longer_ones_keep_their_bits(minilm):
    """Rows of 210 to 240 tokens beside rows of 256 (a breaker's find: padded across edges
    at these widths, oneDNN rounds them differently); above ``padded_up_to`` a row
    shares forwards only with rows of its own edge."""
    words = "the picks a model for each request and answers with scores spans decisions"
    text = lambda n: " ".join((words.split() * 40)[:n])  # noqa: E731  one token a word
    for length in (200, 214, 230, 238):
        alone = minilm.answer("embeddings", {"input": [text(length)]})["data"][0]["embedding"]
        for beside in (254, 230):
            together = minilm.answer("embeddings", {"input": [text(length), text(beside)]})
            assert together["data"][0]["embedding"] == alone, (length, beside)
