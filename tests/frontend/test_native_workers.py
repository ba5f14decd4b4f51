"""The data plane against real ``vllm-srun serve --uds`` workers on tiny fixture packages:
two replicas of one pooled model (under different served names) and a sequence
classifier, started once for the module; a tiny health refresher keeps their
:class:`Worker` state and cards as the frontend's poller would."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from vllm_sr.api.native import Listener
from vllm_sr.api.published import Grant
from vllm_sr.metrics import Metrics
from vllm_sr.pool.pool import DIFFERENT, ReplicaPool
from vllm_sr.workers.worker import Worker

from ..fixtures import write_task_package
from .pool_support import RealWorker, close_all, refresh, run, value, wait_ready

pytestmark = pytest.mark.slow

EMB = "vllm-sr/emb-test"
SEQ = "vllm-sr/seq-test"
QUESTION = {
    "state": {"ticket": "charged twice"},
    "questions": {
        "team": {
            "type": "choice",
            "instructions": "Which team?",
            "criteria": {"billing": "refunds", "shipping": "parcels"},
        },
        "urgent": {"type": "noul", "instructions": "Is it urgent?"},
    },
}


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RealWorker]:
    root = tmp_path_factory.mktemp("fe-workers")
    pooled = write_task_package(root, "bert", "pooled")
    sequence = write_task_package(root, "bert", "sequence")
    started = {
        "emb-1": RealWorker(pooled, "emb-1", root),
        "emb-2": RealWorker(pooled, "emb-2", root),
        "seq": RealWorker(sequence, "seq", root),
    }
    try:
        wait_ready(list(started.values()))
        yield started
    finally:
        for worker in started.values():
            worker.stop()


def worker_for(real: dict[str, RealWorker], name: str, deployment: str, replica: str) -> Worker:
    return Worker(deployment, replica, True, real[name].endpoint, name, process=f"{deployment}-x")


async def pools_over(real, metrics=None, cache_entries=0):
    """Pool ``emb`` of two replicas (emb-1, emb-2) and pool ``seq`` of one, refreshed."""
    emb = [
        worker_for(real, "emb-1", "emb", "r-000000000001"),
        worker_for(real, "emb-2", "emb", "r-000000000002"),
    ]
    seq = [worker_for(real, "seq", "seq", "r-000000000003")]
    for worker in (*emb, *seq):
        await refresh(worker)
        assert worker.ready, (worker.state, worker.reason)
    pools = {
        EMB: ReplicaPool("emb", emb, metrics, public_name=EMB, cache_entries=cache_entries),
        SEQ: ReplicaPool("seq", seq, metrics, public_name=SEQ, cache_entries=cache_entries),
    }
    return pools, (*emb, *seq)


def listener_client(pools, grant=None):
    grant = grant or Grant("http", systemone=(EMB,), runtime=(EMB, SEQ))
    listener = Listener(grant, pools)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=listener.app), base_url="http://l")


def direct(real: RealWorker, path: str, body: dict) -> httpx.Response:
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(real.socket)), timeout=60) as c:
        return c.post(f"http://w{path}", json=body)


def test_decisions_spread_over_two_real_replicas_under_the_public_id(real):
    async def scenario():
        metrics = Metrics()
        pools, workers = await pools_over(real, metrics)
        assert pools[EMB].state == "ready"  # two replicas of one package are compatible
        async with listener_client(pools) as client:
            answers = []
            for path in ("/v1/systemone", "/v1/decisions", "/v1/systemone", "/v1/decisions"):
                response = await client.post(path, json={"model": EMB, **QUESTION})
                assert response.status_code == 200, response.text
                assert response.headers["cache-control"] == "no-store"
                answers.append(response.json())
        assert {a["model"] for a in answers} == {EMB}
        alone = direct(real["emb-2"], "/v1/decisions", {"model": "emb-2", **QUESTION}).json()
        assert alone["model"] == "emb-2"
        for answer in answers:
            assert answer["answers"] == alone["answers"]
        for replica in ("r-000000000001", "r-000000000002"):
            sent = value(
                metrics,
                "vsr_model_runtime_replica_requests_total",
                deployment="emb",
                replica=replica,
                outcome="ok",
            )
            assert sent == 2
        labels = {"deployment": "emb", "surface": "decisions"}
        assert value(metrics, "vsr_model_runtime_transport_seconds_count", **labels) == 4
        forward = value(metrics, "vsr_model_runtime_server_seconds_sum", phase="forward", **labels)
        assert forward > 0
        entry = pools[EMB].inventory()
        assert (entry["desired_replicas"], entry["ready_replicas"], entry["state"]) == (
            2,
            2,
            "ready",
        )
        assert entry["family"] == "task_heads" and "decisions" in entry["surfaces"]
        assert entry["endpoint"] == "unix" and ".sock" not in json.dumps(entry)
        await close_all(*workers)

    run(scenario(), timeout=120)


def test_a_systemone_batch_answers_each_state_under_the_public_id(real):
    async def scenario():
        pools, workers = await pools_over(real)
        batch = {
            "model": EMB,
            "states": ["a refund", "a parcel"],
            "questions": QUESTION["questions"],
        }
        async with listener_client(pools) as client:
            response = await client.post("/v1/systemone/batch", json=batch)
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["model"] == EMB
        assert [r["index"] for r in body["results"]] == [0, 1]
        await close_all(*workers)

    run(scenario(), timeout=120)


def test_a_worker_refusal_keeps_its_status_and_hides_its_text(real):
    async def scenario():
        pools, workers = await pools_over(real)
        bad = {
            "model": EMB,
            "state": "x",
            "questions": {"q": {"type": "bogus", "instructions": "?"}},
        }
        worker_text = direct(real["emb-1"], "/v1/decisions", {**bad, "model": "emb-1"})
        assert worker_text.status_code == 400
        async with listener_client(pools) as client:
            response = await client.post("/v1/decisions", json=bad)
        assert response.status_code == 400
        assert response.json() == {
            "error": {
                "code": "systemone_request_failed",
                "type": "systemone_error",
                "message": "systemone request failed",
                "param": None,
            }
        }
        assert worker_text.json()["error"]["message"] not in response.text
        await close_all(*workers)

    run(scenario(), timeout=120)


def test_runtime_routes_and_a_bundle_across_two_pools(real):
    async def scenario():
        pools, workers = await pools_over(real)
        async with listener_client(pools) as client:
            embedded = await client.post("/v1/embeddings", json={"model": EMB, "input": ["hello"]})
            assert embedded.status_code == 200, embedded.text
            assert embedded.json()["model"] == EMB
            alone = direct(real["emb-1"], "/v1/embeddings", {"model": "emb-1", "input": ["hello"]})
            assert embedded.json()["data"] == alone.json()["data"]
            classified = await client.post("/v1/classify", json={"model": SEQ, "input": ["hi"]})
            assert classified.status_code == 200, classified.text
            assert classified.json()["model"] == SEQ
            tasks = [
                {"id": "e", "embeddings": {"model": EMB, "input": ["hello"]}},
                {"id": "c", "classify": {"model": SEQ, "input": ["hi"]}},
                {"id": "d", "decisions": {"model": EMB, **QUESTION}},
                {"id": "bad", "classify": {"model": EMB, "input": ["hi"], "head": "nope"}},
            ]
            response = await client.post("/v1/bundle", json={"tasks": tasks})
        assert response.status_code == 200, response.text
        results = response.json()["results"]
        assert [(r["id"], r["status"]) for r in results] == [
            ("e", 200),
            ("c", 200),
            ("d", 200),
            ("bad", results[3]["status"]),
        ]
        assert results[3]["status"] >= 400
        assert set(results[3]["error"]) == {"code", "type", "message", "param"}
        assert results[0]["embeddings"]["model"] == EMB
        assert results[0]["embeddings"]["data"] == alone.json()["data"]
        assert results[1]["classify"]["model"] == SEQ
        assert results[1]["classify"]["results"] == classified.json()["results"]
        assert results[2]["decisions"]["model"] == EMB
        await close_all(*workers)

    run(scenario(), timeout=120)


def test_real_cards_of_another_model_are_refused_from_the_pool(real):
    async def scenario():
        mixed = [
            worker_for(real, "emb-1", "mixed", "r-00000000000a"),
            worker_for(real, "seq", "mixed", "r-00000000000b"),
        ]
        for worker in mixed:
            await refresh(worker)
        pool = ReplicaPool("mixed", mixed, public_name="mixed", cache_entries=0)
        assert pool.refusal(mixed[0]) == ""
        assert pool.refusal(mixed[1]) == DIFFERENT
        assert pool.state == "degraded"
        raw = json.dumps({"model": "mixed", "input": ["x"]}).encode()
        for _ in range(3):
            reply = await pool.exchange("embeddings", "/v1/embeddings", raw, timeout=30)
            assert reply.status == 200
        await close_all(*mixed)

    run(scenario(), timeout=120)


def test_a_single_real_worker_answers_repeats_from_the_cache(real):
    async def scenario():
        metrics = Metrics()
        worker = worker_for(real, "seq", "seq", "r-000000000003")
        await refresh(worker)
        pool = ReplicaPool("seq", [worker], metrics, public_name=SEQ, cache_entries=16)
        raw = json.dumps({"model": SEQ, "input": ["hello there"]}).encode()
        first = await pool.exchange("classify", "/v1/classify", raw, timeout=30)
        second = await pool.exchange("classify", "/v1/classify", raw, timeout=30)
        assert (first.cached, second.cached) == (False, True)
        assert second.content == first.content
        hits = value(
            metrics, "vsr_model_runtime_result_cache_total", deployment="seq", result="hit"
        )
        assert hits == 1
        await worker.aclose()

    run(scenario(), timeout=120)


def test_a_deployments_input_settings_reach_a_real_worker(real):
    """``input: {max_tokens: 4, overflow: truncate}``: a long input the worker would
    refuse on its own is truncated as if the client had asked for it."""
    long_text = " ".join(["word"] * 400)

    async def scenario():
        worker = worker_for(real, "emb-1", "emb", "r-000000000001")
        await refresh(worker)
        settings = {"max_tokens": 4, "overflow": "truncate"}
        pool = ReplicaPool(
            "emb", [worker], public_name=EMB, input_defaults=settings, cache_entries=0
        )
        raw = json.dumps({"model": EMB, "input": [long_text]}).encode()
        reply = await pool.exchange("embeddings", "/v1/embeddings", raw, timeout=60)
        await worker.aclose()
        return reply, settings

    reply, settings = run(scenario(), timeout=120)
    assert reply.status == 200, reply.content
    answer = json.loads(reply.content)
    assert answer["model"] == EMB
    asked = {"model": "emb-1", "input": [long_text], "options": settings}
    explicit = direct(real["emb-1"], "/v1/embeddings", asked)
    assert explicit.status_code == 200
    assert answer["data"] == explicit.json()["data"]
    assert answer["usage"] == explicit.json()["usage"]
    plain = direct(real["emb-1"], "/v1/embeddings", {"model": "emb-1", "input": [long_text]})
    assert plain.status_code == 400  # the worker's own default refuses it


def test_module_layout_keeps_the_frontend_off_the_runtime():
    """The frontend reaches workers only over the wire: no module imports vllm_srun."""
    folder = Path(__file__).resolve().parents[2] / "frontend"
    for source in folder.rglob("*.py"):
        text = source.read_text()
        assert "import vllm_srun" not in text and "from vllm_srun" not in text, source


def test_classify_on_a_model_that_cannot_classify_says_why(real):
    """The worker's own ``unsupported_surface`` explanation reaches the client, as the
    worker words it."""

    async def scenario():
        pools, workers = await pools_over(real)
        async with listener_client(pools) as client:
            response = await client.post("/v1/classify", json={"model": EMB, "input": ["hi"]})
        await close_all(*workers)
        return response

    response = run(scenario(), timeout=120)
    worker = direct(real["emb-1"], "/v1/classify", {"model": "emb-1", "input": ["hi"]})
    assert worker.status_code == 422
    message = worker.json()["error"]["message"]
    assert message.startswith("this model serves ") and message.endswith(", not classify")
    assert response.status_code == 422
    assert response.headers["cache-control"] == "no-store"
    assert response.json() == {
        "error": {
            "code": "unsupported_surface",
            "type": "runtime_error",
            "message": message,
            "param": None,
        }
    }


def test_an_openai_sdk_client_is_told_how_to_send_overflow(real):
    """A plain OpenAI embeddings request with a too-long input, through the listener: the
    worker's 400 reaches the SDK with ``param`` ``input`` and the ``extra_body`` to send,
    and that ``extra_body`` answers."""
    import httpx2
    import openai

    long_text = " ".join(["word"] * 400)

    async def scenario():
        pools, workers = await pools_over(real)
        listener = Listener(Grant("http", runtime=(EMB,)), pools)
        http = httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=listener.app), base_url="http://l/v1", timeout=60
        )
        async with openai.AsyncOpenAI(
            base_url="http://l/v1", api_key="k", max_retries=0, http_client=http
        ) as sdk:
            with pytest.raises(openai.BadRequestError) as raised:
                await sdk.embeddings.create(model=EMB, input=[long_text], encoding_format="float")
            fixed = await sdk.embeddings.create(
                model=EMB,
                input=[long_text],
                encoding_format="float",
                extra_body={"options": {"overflow": "truncate"}},
            )
        await close_all(*workers)
        return raised.value, fixed

    refused, fixed = run(scenario(), timeout=120)
    alone = direct(real["emb-1"], "/v1/embeddings", {"model": "emb-1", "input": [long_text]})
    assert alone.status_code == 400
    message = alone.json()["error"]["message"]
    assert message.endswith(
        '; from the OpenAI SDK, send options as extra_body={"options": {"overflow": "truncate"}}'
    )
    assert (refused.status_code, refused.code, refused.type, refused.param) == (
        400,
        "invalid_request",
        "runtime_error",
        "input",
    )
    assert refused.body == {
        "code": "invalid_request",
        "type": "runtime_error",
        "message": message,
        "param": "input",
    }
    assert fixed.model == EMB and len(fixed.data) == 1 and fixed.data[0].embedding
