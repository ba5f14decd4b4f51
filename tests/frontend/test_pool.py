"""The replica pool (§1.7) against fake workers on Unix sockets: choice and ties, the
32-exchange admission bound, overload and unavailability, back-off on a fake clock,
compatibility refusals, pool state and the inventory entry, the result cache."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from vllm_sr.metrics import Metrics
from vllm_sr.pool import pool as pool_module
from vllm_sr.pool.pool import (
    MAX_INFLIGHT,
    BadReply,
    Overloaded,
    ReplicaPool,
    TimedOut,
    TooLarge,
    Unavailable,
    backoff_seconds,
)
from vllm_sr.workers.worker import Worker

from .pool_support import SHA, Clock, card, close_all, fake_workers, refresh, run, value

QUESTION = b'{"model":"pub","state":"x","questions":{"q":{"type":"noul","instructions":"?"}}}'


def make_pool(workers, clock=None, metrics=None, **options):
    return ReplicaPool(
        "dep",
        workers,
        metrics,
        public_name="pub",
        artifact=options.pop("artifact", "org/model"),
        clock=clock or Clock(),
        cache_entries=options.pop("cache_entries", 0),
        **options,
    )


def ask(pool, raw=QUESTION, path="/v1/decisions", surface="decisions", timeout=10.0):
    return pool.exchange(surface, path, raw, timeout=timeout)


def test_backoff_doubles_from_100_ms_to_3_2_s():
    assert [backoff_seconds(n) for n in range(1, 9)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 3.2, 3.2]
    )


def test_equal_load_rotates_to_the_least_recently_assigned():
    async def scenario():
        async with fake_workers("a", "b", "c") as fakes:
            workers = [f.worker() for f in fakes]
            pool = make_pool(workers)
            for _ in range(6):
                reply = await ask(pool)
                assert reply.status == 200
            served = [json.loads(body)["model"] for f in fakes for _, body in f.received]
            assert [len(f.received) for f in fakes] == [2, 2, 2]
            assert sorted(set(served)) == ["served-a", "served-b", "served-c"]
            # The order: a, b, c, a, b, c (each time the least recently assigned).
            order = []
            for _ in range(3):
                reply = await ask(pool)
                order.append(json.loads(reply.content)["worker"])
            assert order == ["a", "b", "c"]
            await close_all(*workers)

    run(scenario())


def test_the_sequence_is_process_wide():
    first = pool_module.next_assignment()
    assert pool_module.next_assignment() == first + 1


def test_least_outstanding_bytes_wins_over_rotation():
    async def scenario():
        async with fake_workers("a", "b") as (a, b):
            workers = [a.worker(), b.worker()]
            pool = make_pool(workers)
            a.mode = "hang"
            big = json.dumps({"model": "pub", "state": "x" * 5000}).encode()
            held = asyncio.create_task(ask(pool, big))
            await a.wait_received(1)
            # a holds 5 kB outstanding: every small request goes to b, even though b was
            # assigned more recently each time.
            for _ in range(3):
                reply = await ask(pool)
                assert json.loads(reply.content)["worker"] == "b"
            entry = pool.inventory()
            work = {r["id"]: (r["inflight"], r["estimated_work"]) for r in entry["replicas"]}
            assert work == {workers[0].replica_id: (1, len(big)), workers[1].replica_id: (0, 0)}
            a.gate.set()
            assert (await held).status == 200
            await close_all(*workers)

    run(scenario())


def test_32_in_flight_then_overloaded_with_retry_after():
    async def scenario():
        async with fake_workers("a") as (a,):
            worker = a.worker()
            metrics = Metrics()
            pool = make_pool([worker], metrics=metrics)
            a.mode = "hang"
            held = [asyncio.create_task(ask(pool)) for _ in range(MAX_INFLIGHT)]
            await a.wait_received(MAX_INFLIGHT)
            with pytest.raises(Overloaded) as refused:
                await ask(pool)
            assert (refused.value.status, refused.value.code) == (429, "overloaded")
            assert refused.value.retry_after == 1
            [replica] = pool.inventory()["replicas"]
            assert replica["inflight"] == MAX_INFLIGHT
            assert replica["estimated_work"] == MAX_INFLIGHT * len(QUESTION)
            assert pool.state == "ready"  # full is not unready
            a.gate.set()
            assert all(r.status == 200 for r in await asyncio.gather(*held))
            assert pool.inventory()["replicas"][0]["inflight"] == 0
            assert (
                value(
                    metrics,
                    "vsr_model_runtime_requests_total",
                    deployment="dep",
                    outcome="overloaded",
                )
                == 1
            )
            assert (
                value(metrics, "vsr_model_runtime_requests_total", deployment="dep", outcome="ok")
                == MAX_INFLIGHT
            )
            await worker.aclose()

    run(scenario())


def test_none_ready_is_unavailable_with_retry_after():
    async def scenario():
        async with fake_workers("a", "b") as (a, b):
            workers = [a.worker(), b.worker()]
            pool = make_pool(workers)
            workers[0].update("loading", "reading weights")
            workers[1].update("restarting", "exited")
            with pytest.raises(Unavailable) as refused:
                await ask(pool)
            assert (refused.value.status, refused.value.retry_after) == (503, 1)
            assert a.received == b.received == []
            assert (pool.state, pool.ready) == ("unavailable", False)
            assert pool.reason == (
                f"no replica is ready; {workers[0].replica_id} loading: reading weights; "
                f"{workers[1].replica_id} restarting: exited"
            )
            workers[1].update("loading", "")
            assert (pool.state, pool.reason) == ("loading", "reading weights")  # all alike
            workers[1].update("ready", "")
            assert (await ask(pool)).status == 200
            assert pool.state == "degraded"
            await close_all(*workers)

    run(scenario())


def test_a_5xx_backs_off_100_ms_doubling_to_3_2_s_and_asks_for_a_probe():
    async def scenario():
        async with fake_workers("a") as (a,):
            worker = a.worker()
            clock = Clock()
            pool = make_pool([worker], clock=clock)
            a.mode = "500"
            for failures in range(1, 8):
                failed_at = clock.now
                reply = await ask(pool)
                assert reply.status == 500  # the worker's status comes back
                assert await worker.probe_requested(0.01)
                wait = backoff_seconds(failures)
                assert pool.refusal(worker) == "replica is in health backoff"
                assert (pool.state, pool.reason) == ("backoff", "replica is in health backoff")
                with pytest.raises(Unavailable) as refused:
                    await ask(pool)
                assert refused.value.retry_after == max(1, math.ceil(wait))
                clock.now = failed_at + wait - 0.001
                with pytest.raises(Unavailable):
                    await ask(pool)
                clock.now = failed_at + wait
            assert wait == pytest.approx(3.2)
            a.mode = "ok"
            assert (await ask(pool)).status == 200
            a.mode = "500"
            failed_at = clock.now
            await ask(pool)
            # ok reset the count: the next failure waits 100 ms again.
            clock.now = failed_at + 0.099
            with pytest.raises(Unavailable):
                await ask(pool)
            clock.now = failed_at + 0.1
            assert pool.state == "ready"
            await worker.aclose()

    run(scenario())


def test_4xx_is_rejected_without_backoff():
    async def scenario():
        async with fake_workers("a") as (a,):
            worker = a.worker()
            metrics = Metrics()
            pool = make_pool([worker], metrics=metrics)
            for mode in ("400", "429"):
                a.mode = mode
                reply = await ask(pool)
                assert reply.status == int(mode)
                assert pool.refusal(worker) == ""
            assert not await worker.probe_requested(0.01)
            rid = worker.replica_id
            assert (
                value(
                    metrics,
                    "vsr_model_runtime_replica_requests_total",
                    deployment="dep",
                    replica=rid,
                    outcome="rejected",
                )
                == 2
            )
            await worker.aclose()

    run(scenario())


@pytest.mark.parametrize(
    ("mode", "error", "outcome"),
    [
        ("broken", Unavailable, "failed"),
        ("garbage", BadReply, "failed"),
        ("hang", TimedOut, "timeout"),
    ],
)
def test_a_broken_answer_or_a_timeout_backs_off(mode, error, outcome):
    async def scenario():
        async with fake_workers("a", "b") as (a, b):
            workers = [a.worker(), b.worker()]
            clock = Clock()
            metrics = Metrics()
            pool = make_pool(workers, clock=clock, metrics=metrics)
            a.mode = mode
            with pytest.raises(error) as failed:
                await ask(pool, timeout=0.3)
            assert failed.value.status == {"broken": 503, "garbage": 502, "hang": 503}[mode]
            assert pool.refusal(workers[0]) == "replica is in health backoff"
            assert await workers[0].probe_requested(0.01)
            rid = workers[0].replica_id
            assert (
                value(
                    metrics,
                    "vsr_model_runtime_replica_requests_total",
                    deployment="dep",
                    replica=rid,
                    outcome=outcome,
                )
                == 1
            )
            # The pool keeps serving on b while a cools down.
            assert pool.state == "degraded"
            assert json.loads((await ask(pool)).content)["worker"] == "b"
            await close_all(*workers)

    run(scenario())


def test_a_worker_not_reached_hands_the_request_to_another():
    async def scenario():
        async with fake_workers("b") as (b,):
            gone = Worker("dep", "r-000000000000", True, "unix:///nonexistent/x.sock", "gone")
            gone.update("ready", "", card(id="gone"))
            workers = [gone, b.worker()]
            metrics = Metrics()
            pool = make_pool(workers, metrics=metrics)
            reply = await ask(pool)
            assert json.loads(reply.content)["worker"] == "b"
            assert pool.refusal(gone) == "replica is in health backoff"
            assert (
                value(
                    metrics,
                    "vsr_model_runtime_replica_requests_total",
                    deployment="dep",
                    replica=gone.replica_id,
                    outcome="failed",
                )
                == 1
            )
            assert (
                value(metrics, "vsr_model_runtime_requests_total", deployment="dep", outcome="ok")
                == 1
            )
            assert (
                value(
                    metrics, "vsr_model_runtime_requests_total", deployment="dep", outcome="failed"
                )
                == 0
            )
            await close_all(*workers)

    run(scenario())


def test_a_caller_that_goes_away_is_canceled_without_backoff():
    async def scenario():
        async with fake_workers("a") as (a,):
            worker = a.worker()
            metrics = Metrics()
            pool = make_pool([worker], metrics=metrics)
            a.mode = "hang"
            task = asyncio.create_task(ask(pool))
            await a.wait_received(1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            rid = worker.replica_id
            assert (
                value(
                    metrics,
                    "vsr_model_runtime_replica_requests_total",
                    deployment="dep",
                    replica=rid,
                    outcome="canceled",
                )
                == 1
            )
            assert (
                value(
                    metrics,
                    "vsr_model_runtime_requests_total",
                    deployment="dep",
                    outcome="cancelled",
                )
                == 1
            )
            assert pool.refusal(worker) == ""
            assert pool.inventory()["replicas"][0]["inflight"] == 0
            await worker.aclose()

    run(scenario())


def test_a_body_over_64_mib_is_refused_before_any_worker():
    async def scenario():
        async with fake_workers("a") as (a,):
            worker = a.worker()
            pool = make_pool([worker])
            with pytest.raises(TooLarge) as refused:
                await ask(pool, b"{" + b" " * (64 * 1024 * 1024) + b"}")
            assert refused.value.status == 413
            assert a.received == []
            await worker.aclose()

    run(scenario())


# -- compatibility -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("changes", "managed", "reason"),
    [
        ({"repo": "org/other"}, False, "replica artifact does not match deployment"),
        ({"revision": "b" * 40}, True, "replica revision does not match deployment"),
        ({"profile": "batching"}, True, "replica profile does not match deployment"),
        ({"model_sha256": ""}, True, "replica does not report model identity"),
        ({"surfaces": ["embeddings"]}, True, "replica identity or capabilities differ from pool"),
        ({"heads": []}, True, "replica identity or capabilities differ from pool"),
    ],
)
def test_a_replica_unlike_its_pool_is_kept_out_with_its_reason(changes, managed, reason):
    async def scenario():
        async with fake_workers("a", "b") as (a, b):
            declared = "a" * 40 if "revision" in changes else None
            good = a.worker()
            good.update("ready", "", card(id=good.served_name, revision=declared))
            odd = b.worker(managed=managed)
            odd.update("ready", "", card(id=odd.served_name, **changes))
            pool = make_pool([good, odd], revision=declared)
            assert pool.refusal(odd) == reason
            assert pool.refusal(good) == ""
            for _ in range(3):
                assert json.loads((await ask(pool)).content)["worker"] == "a"
            entry = pool.inventory()
            assert entry["state"] == "degraded" and entry["ready_replicas"] == 1
            refused = entry["replicas"][1]
            assert (refused["ready"], refused["state"], refused["reason"]) == (
                False,
                "incompatible",
                reason,
            )
            assert b.received == []
            await close_all(good, odd)

    run(scenario())


def test_hardware_and_clock_fields_may_differ_between_replicas():
    async def scenario():
        async with fake_workers("a", "b") as (a, b):
            workers = [a.worker(), b.worker()]
            other = card(
                id="other",
                device="cuda:1",
                accelerator="cuda",
                engine="onnxruntime",
                created=99,
                forward_cost={"fixed_ms": 0.8},
                batch_invariance={"max_abs_deviation": 1.788e-06},
            )
            workers[1].update("ready", "", other)
            pool = make_pool(workers)
            assert [pool.refusal(w) for w in workers] == ["", ""]
            assert pool.state == "ready"
            await close_all(*workers)

    run(scenario())


def test_when_the_first_replica_leaves_the_others_are_judged_again():
    async def scenario():
        async with fake_workers("a", "b") as (a, b):
            first, second = a.worker(managed=False), b.worker()
            first.update("ready", "", card(id=first.served_name, heads=[]))
            pool = make_pool([first, second])
            assert pool.refusal(second) == "replica identity or capabilities differ from pool"
            first.update("unreachable", "nothing accepts connections at the endpoint")
            assert pool.refusal(second) == ""
            assert pool.state == "degraded"
            assert json.loads((await ask(pool)).content)["worker"] == "b"
            first.update("ready", "", card(id=first.served_name, heads=[]))
            assert pool.refusal(first) == "replica identity or capabilities differ from pool"
            assert pool.refusal(second) == ""
            await close_all(first, second)

    run(scenario())


def test_a_single_worker_is_never_compared():
    async def scenario():
        async with fake_workers("a") as (a,):
            worker = a.worker(managed=False)
            worker.update("ready", "", card(id=worker.served_name, repo="x/y", model_sha256=""))
            pool = make_pool([worker])
            assert pool.refusal(worker) == "" and pool.state == "ready"
            await worker.aclose()

    run(scenario())


def test_a_worker_reporting_another_contract_major_is_not_used():
    async def scenario():
        async with fake_workers("a") as (a,):
            a.api_version = "3.0.0"
            worker = a.worker()
            pool = make_pool([worker])
            await refresh(worker)
            assert worker.state == "incompatible"
            with pytest.raises(Unavailable):
                await ask(pool)
            assert pool.state == "incompatible"
            await worker.aclose()

    run(scenario())


# -- state and inventory -----------------------------------------------------------------------
def test_inventory_entry_shape_and_no_socket_path():
    async def scenario():
        async with fake_workers("a", "b") as (a, b):
            workers = [a.worker(device="cpu"), b.worker(device="cpu")]
            workers[0].restarts = 2
            workers[1].update("loading", "reading weights")
            pool = make_pool(workers)
            entry = pool.inventory()
            assert set(entry) >= {
                "name",
                "managed",
                "process",
                "served_name",
                "endpoint",
                "ready",
                "state",
                "reason",
                "restarts",
                "desired_replicas",
                "ready_replicas",
                "replicas",
                "family",
                "repo",
                "revision",
                "surfaces",
                "heads",
                "embedding",
                "rerank",
                "device",
                "profile",
                "engine",
            }
            assert (entry["desired_replicas"], entry["ready_replicas"]) == (2, 1)
            assert (entry["state"], entry["restarts"], entry["endpoint"]) == ("degraded", 2, "unix")
            assert entry["reason"].startswith("1 of 2 replicas ready; ")
            assert "loading: reading weights" in entry["reason"]
            assert entry["replicas"][1] == {
                "id": workers[1].replica_id,
                "managed": True,
                "device": "cpu",
                "ready": False,
                "state": "loading",
                "reason": "reading weights",
                "inflight": 0,
                "estimated_work": 0,
                "restarts": 0,
            }
            assert entry["embedding"] == {"dimensions": [32], "layers": [2], "modalities": ["text"]}
            assert entry["rerank"] == {"default_layer": 2, "layers": [2]}
            assert entry["heads"] == [{"name": "pooled", "kind": "pooled", "labels": []}]
            assert (entry["repo"], entry["family"], entry["profile"]) == (
                "org/model",
                "task_heads",
                "exact",
            )
            text = json.dumps(entry)
            assert str(a.path) not in text and ".sock" not in text
            await close_all(*workers)

    run(scenario())


def test_a_single_worker_pool_reads_its_workers_state_and_card_fields_empty_until_ready():
    async def scenario():
        async with fake_workers("a") as (a,):
            worker = Worker("dep", "r-0123456789ab", True, a.endpoint, "served-a", process="p")
            worker.update("loading", "downloading")
            pool = make_pool([worker])
            entry = pool.inventory()
            assert (entry["state"], entry["reason"], entry["ready"]) == (
                "loading",
                "downloading",
                False,
            )
            assert (entry["desired_replicas"], entry["ready_replicas"]) == (1, 0)
            assert (entry["family"], entry["surfaces"], entry["heads"]) == ("", [], [])
            assert "embedding" not in entry and "rerank" not in entry
            assert pool.card is None
            worker.update("ready", "", card(id="served-a"))
            assert pool.inventory()["state"] == "ready"
            assert pool.card is not None and pool.card["model_sha256"] == SHA
            await worker.aclose()

    run(scenario())


def test_bundle_limit_is_the_smallest_worker_cap():
    async def scenario():
        async with fake_workers("a", "b") as (a, b):
            workers = [a.worker(), b.worker()]
            workers[0].limits = {"max_bundle_tasks": 1024}
            pool = make_pool(workers)
            assert pool.bundle_limit == 64  # b said nothing: the contract's default
            workers[1].limits = {"max_bundle_tasks": 512}
            assert pool.bundle_limit == 512
            await close_all(*workers)

    run(scenario())


# -- result cache ------------------------------------------------------------------------------
def test_a_single_worker_caches_decisions_until_its_readiness_changes():
    async def scenario():
        async with fake_workers("a") as (a,):
            worker = a.worker()
            metrics = Metrics()
            pool = make_pool([worker], metrics=metrics, cache_entries=2)
            first = await ask(pool)
            again = await ask(pool)
            assert again.cached and again.content == first.content
            assert len(a.received) == 1
            assert (
                value(
                    metrics, "vsr_model_runtime_result_cache_total", deployment="dep", result="hit"
                )
                == 1
            )
            assert (
                value(
                    metrics, "vsr_model_runtime_result_cache_total", deployment="dep", result="miss"
                )
                == 1
            )
            # Embeddings are not cached.
            emb = b'{"model":"pub","input":"x"}'
            await ask(pool, emb, "/v1/embeddings", "embeddings")
            await ask(pool, emb, "/v1/embeddings", "embeddings")
            assert len(a.received) == 3
            # Readiness changes: the cache is cleared.
            worker.update("restarting", "exited")
            worker.update("ready", "")
            await ask(pool)
            assert len(a.received) == 4
            # Least recently used out first (2 entries).
            other = QUESTION.replace(b'"x"', b'"y"')
            third = QUESTION.replace(b'"x"', b'"z"')
            await ask(pool, other)
            await ask(pool, third)
            await ask(pool)
            assert len(a.received) == 7
            await worker.aclose()

    run(scenario())


def test_the_cache_size_comes_from_the_environment(monkeypatch):
    async def scenario():
        async with fake_workers("a", "b") as (a, b):
            monkeypatch.setenv("VLLM_SRUN_RESULT_CACHE", "0")
            single = a.worker()
            pool = ReplicaPool("dep", [single], public_name="pub")
            await ask(pool)
            await ask(pool)
            assert len(a.received) == 2
            monkeypatch.delenv("VLLM_SRUN_RESULT_CACHE")
            two = [single, b.worker()]
            pool = ReplicaPool("dep", two, public_name="pub")
            for _ in range(4):
                await ask(pool)
            assert len(a.received) + len(b.received) == 6  # several workers bypass it
            monkeypatch.setenv("VLLM_SRUN_RESULT_CACHE", "lots")
            with pytest.raises(ValueError, match="VLLM_SRUN_RESULT_CACHE must be a non-negative"):
                ReplicaPool("dep", [single], public_name="pub")
            await close_all(*two)

    run(scenario())


def test_a_pool_refuses_workers_of_another_deployment():
    worker = Worker("other", "r-0", True, "unix:///x.sock", "x")
    with pytest.raises(ValueError, match="serve another one"):
        ReplicaPool("dep", [worker], public_name="pub")
    with pytest.raises(ValueError, match="at least one worker"):
        ReplicaPool("dep", [], public_name="pub")


# -- a deployment's input settings -----------------------------------------------------------
INPUT = {"max_tokens": 8, "overflow": "truncate"}


@pytest.mark.parametrize(
    ("surface", "raw", "options"),
    [
        # No choice of its own: the deployment's input settings.
        ("embeddings", b'{"model":"pub","input":["a"]}', INPUT),
        ("classify", b'{"input":["a"],"options":{"threshold":0.5}}', {"threshold": 0.5, **INPUT}),
        ("rerank", b'{"query":"q","documents":["d"],"options":null}', INPUT),
        # A request that chooses either keeps its own (max_tokens means another thing
        # under another overflow), as does one saying TEI's truncate.
        ("embeddings", b'{"input":["a"],"options":{"overflow":"window"}}', {"overflow": "window"}),
        ("classify", b'{"input":["a"],"options":{"max_tokens":3}}', {"max_tokens": 3}),
        ("embeddings", b'{"input":["a"],"truncate":false}', None),
        # Decisions take no input options.
        ("decisions", QUESTION, None),
    ],
)
def test_input_settings_are_the_options_of_requests_that_choose_none(surface, raw, options):
    sent = json.loads(pool_module.transport.request_for(surface, raw, "served", INPUT))
    assert sent["model"] == "served"
    assert sent.get("options") == options
    # Nothing else of the request changes.
    rest = {k: v for k, v in json.loads(raw).items() if k not in ("model", "options")}
    assert {k: v for k, v in sent.items() if k not in ("model", "options")} == rest


def test_a_bundles_text_tasks_get_the_input_settings():
    raw = json.dumps(
        {
            "tasks": [
                {"id": "e", "embeddings": {"model": "pub", "input": ["a"]}},
                {"id": "c", "classify": {"input": ["a"], "options": {"overflow": "reject"}}},
                {"id": "d", "decisions": {"model": "pub", "state": "x", "questions": {}}},
            ]
        }
    ).encode()
    sent = json.loads(pool_module.transport.request_for("bundle", raw, "served", INPUT))
    e, c, d = (
        task[key]
        for task, key in zip(sent["tasks"], ("embeddings", "classify", "decisions"), strict=True)
    )
    assert e == {"model": "served", "input": ["a"], "options": INPUT}
    assert c == {"model": "served", "input": ["a"], "options": {"overflow": "reject"}}
    assert "options" not in d and d["model"] == "served"


def test_a_pool_sends_its_input_settings_to_every_replica():
    async def scenario():
        async with fake_workers("a", "b") as fakes:
            workers = [f.worker() for f in fakes]
            pool = make_pool(workers, input_defaults=INPUT)
            raw = b'{"model":"pub","input":["a long text"]}'
            for _ in range(2):
                reply = await ask(pool, raw, "/v1/embeddings", "embeddings")
                assert reply.status == 200
            assert [f.bodies() for f in fakes] == [
                [{"model": f"served-{f.name}", "input": ["a long text"], "options": INPUT}]
                for f in fakes
            ]
            await close_all(*workers)

    run(scenario())


def test_model_rewriting_keeps_every_other_byte_and_refuses_deep_nesting():
    padding = " \n\t\r" * 2_000_000  # 8 MB of JSON whitespace between two members
    raw = ('{"model":"pub",' + padding + '"state":"s","n":1.50}').encode()
    sent = pool_module.transport.request_for("decisions", raw, "served")
    assert sent == ('{"model":"served",' + padding + '"state":"s","n":1.50}').encode()
    nested = b'{"model":"pub","state":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(ValueError, match="nested too deeply"):
        pool_module.transport.request_for("decisions", nested, "served")
