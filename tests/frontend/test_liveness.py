"""A worker that stops answering without dying is noticed from its silence; a busy one,
or one slow probe, never takes a healthy replica out (issue 29, items 1 and 2).

Fake workers on Unix sockets (tests/frontend/pool_support.py) play the cases: ``hang``
(accepts requests, never answers, ``/health`` still 200), ``frozen`` (``/health`` never
answers either: a stopped process) and ``health_delays`` (one slow ``/health``).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import pytest

from vllm_sr.metrics import Metrics
from vllm_sr.pool.pool import STALLED, ReplicaPool
from vllm_sr.workers.health import HealthPoller
from vllm_sr.workers.liveness import (
    STALL_DEFAULT_S,
    STALL_FLOOR_S,
    SUSPECT_PROBE_TIMEOUT,
    Liveness,
)

from .loop_lag import watching
from .pool_support import Clock, close_all, fake_workers, run, value

BODY = b'{"model": "dep", "input": "a"}'


def make_pool(workers: list[Any], metrics: Metrics | None = None) -> ReplicaPool:
    return ReplicaPool("dep", workers, metrics, public_name="dep", cache_entries=0)


def test_silence_with_work_outstanding_is_the_evidence_and_an_answer_clears_it():
    clock = Clock()
    liveness = Liveness(clock)
    clock.advance(60)
    assert not liveness.suspect()  # idle: never suspect, however long
    token = liveness.sent()
    clock.advance(STALL_DEFAULT_S - 0.01)
    assert not liveness.suspect()
    clock.advance(0.02)
    assert liveness.suspect()  # no answer known yet: the default allowance
    assert liveness.why().startswith("no answer for 1.0 s with 1 request outstanding")
    liveness.answered(token)
    assert not liveness.suspect()
    for _ in range(100):  # answers of 0.4 s (the last 100 count): allowed 2 x p99 = 0.8 s
        token = liveness.sent()
        clock.advance(0.4)
        liveness.answered(token)
    assert liveness.stall_after() == pytest.approx(0.8)
    first, second = liveness.sent(), liveness.sent()
    clock.advance(0.7)
    liveness.answered(first)  # it answers one of two: silence counts from then
    clock.advance(0.7)
    assert not liveness.suspect() and liveness.until_suspect() > 0
    clock.advance(0.2)
    assert liveness.suspect()
    liveness.abandoned(second)
    assert not liveness.suspect()  # nothing outstanding: not silent
    for _ in range(100):  # very fast answers: the floor holds
        token = liveness.sent()
        clock.advance(0.001)
        liveness.answered(token)
    assert liveness.stall_after() == STALL_FLOOR_S


async def load(
    pool: ReplicaPool, clients: int, until: asyncio.Event
) -> list[tuple[float, float, int]]:
    """``clients`` closed-loop clients until ``until``: ``(sent, seconds, status)`` each."""
    done: list[tuple[float, float, int]] = []

    async def client() -> None:
        while not until.is_set():
            sent = time.monotonic()
            reply = await pool.exchange("embeddings", "/v1/embeddings", BODY, timeout=30)
            done.append((sent, time.monotonic() - sent, reply.status))

    await asyncio.gather(*(client() for _ in range(clients)))
    return done


def test_a_replica_that_stops_answering_is_left_within_a_second_and_its_requests_resent():
    """The issue's replay: 8 clients over two replicas; one stops answering (its /health
    still 200). No request sent after that waits more than 1.5 s longer than the healthy
    replica's p99, and the stopped replica reads not ready within 2 s (each bound plus
    the worst lateness of this process's event loop meanwhile: :mod:`.loop_lag`)."""

    async def scenario() -> None:
        async with fake_workers("a", "b") as (a, b), watching() as lag:
            workers = [a.worker(served_name="x"), b.worker(served_name="x")]
            metrics = Metrics()
            pool = make_pool(workers, metrics)
            stop = asyncio.Event()
            clients = asyncio.create_task(load(pool, 8, stop))
            await a.wait_received(50)
            await b.wait_received(50)
            a.mode = "hang"
            frozen_at = time.monotonic()
            while pool.sample().replicas[0].ready:
                assert time.monotonic() - frozen_at < 2.0 + lag.worst, (
                    f"the stopped replica still ready (loop late by {lag.worst:.3f} s at worst)"
                )
                await asyncio.sleep(0.02)
            noticed = time.monotonic() - frozen_at
            [entry] = [r for r in pool.inventory()["replicas"] if r["id"] == workers[0].replica_id]
            assert (entry["ready"], entry["state"]) == (False, STALLED)
            assert entry["reason"].startswith("no answer for")
            assert entry["reason"].endswith("new requests go to the other replicas")
            assert pool.ready  # b answers
            await b.wait_received(len(b.received) + 200)
            stop.set()
            done = await clients
            after = [(sent, s) for sent, s, status in done if sent >= frozen_at]
            healthy = [s for sent, s, _ in done if sent < frozen_at]
            assert all(status == 200 for _, _, status in done)
            p99 = statistics.quantiles(healthy, n=100)[98]
            # The bounds, plus how late the machine ran this loop (2 shared cores).
            assert max(s for _, s in after) <= p99 + 1.5 + lag.worst, (
                max(s for _, s in after),
                p99,
                lag.worst,
            )
            assert noticed <= 2.0 + lag.worst
            assert value(metrics, "vsr_model_runtime_replica_ready", deployment="dep",
                         replica=workers[0].replica_id) == 0.0  # fmt: skip
            await close_all(*workers)

    run(scenario())


def test_a_busy_single_replica_holding_a_long_request_stays_ready():
    """Silence with work outstanding, but no other replica to take it and /health
    answering: busy, not stopped. Nothing is refused; everything is answered."""

    async def scenario() -> None:
        async with fake_workers("a") as (a,):
            worker = a.worker(served_name="x")
            pool = make_pool([worker])
            a.mode = "hang"
            poller = HealthPoller(worker)
            asks = [
                asyncio.create_task(pool.exchange("embeddings", "/v1/embeddings", BODY, timeout=30))
                for _ in range(3)
            ]
            await a.wait_received(3)
            await asyncio.sleep(STALL_DEFAULT_S + 0.2)  # the time under test: past suspicion
            assert worker.liveness.suspect()
            assert await poller.probe() == "ready"  # its /health answers: busy
            assert pool.ready and pool.sample().replicas[0].ready
            late = asyncio.create_task(
                pool.exchange("embeddings", "/v1/embeddings", BODY, timeout=30)
            )
            await a.wait_received(4)  # still sent to it: nowhere else to go
            a.gate.set()
            replies = await asyncio.gather(*asks, late)
            assert [r.status for r in replies] == [200] * 4
            assert not worker.liveness.suspect()
            await worker.aclose()

    run(scenario())


def test_one_slow_health_answer_never_takes_a_serving_replica_out():
    """/health answers in 3 s once (the probe waits 2 s) while the replica answers
    requests: it stays ready and no client sees a 503."""

    async def scenario() -> None:
        async with fake_workers("a") as (a,):
            worker = a.worker(served_name="x")
            pool = make_pool([worker])
            poller = HealthPoller(worker, timeout=2.0)
            a.health_delays = [3.0]
            stop = asyncio.Event()
            clients = asyncio.create_task(load(pool, 2, stop))
            state = await poller.probe()
            assert (state, poller.slow_probes) == ("ready", 1)
            assert worker.ready and pool.ready
            stop.set()
            assert {status for _, _, status in await clients} == {200}
            assert await poller.probe() == "ready" and poller.slow_probes == 0
            await worker.aclose()

    run(scenario())


def test_an_idle_replica_whose_health_times_out_is_unreachable():
    async def scenario() -> None:
        async with fake_workers("a") as (a,):
            worker = a.worker(served_name="x")
            poller = HealthPoller(worker, timeout=0.3)
            a.frozen = True
            assert await poller.probe() == "unreachable"
            assert worker.reason == "the runtime did not answer within 0.3 s"
            await worker.aclose()

    run(scenario())


def test_every_replica_stopped_makes_the_pool_unready_within_two_seconds():
    """Both replicas stop (no answers, no /health) under load: the pool's pollers probe
    each as soon as it is suspect, with a short timeout, and the pool reads not ready."""

    async def scenario() -> None:
        async with fake_workers("a", "b") as (a, b), watching() as lag:
            workers = [a.worker(served_name="x"), b.worker(served_name="x")]
            pool = make_pool(workers)
            pollers = [asyncio.create_task(HealthPoller(w).run()) for w in workers]
            stop = asyncio.Event()
            clients = asyncio.create_task(load(pool, 8, stop))
            await a.wait_received(30)
            await b.wait_received(30)
            for fake in (a, b):
                fake.frozen = True
                fake.mode = "hang"
            frozen_at = time.monotonic()
            while pool.ready:
                assert time.monotonic() - frozen_at < 2.0 + lag.worst, (
                    lag.worst,
                    pool.inventory()["replicas"],
                )
                await asyncio.sleep(0.02)
            assert {w.state for w in workers} == {"unreachable"}
            # the requests already waiting on them end now (503), not at their deadline
            stop.set()
            started = time.monotonic()
            try:
                await asyncio.wait_for(asyncio.shield(clients), 3.0)
            except Exception as err:  # the clients end on the pool's Unavailable
                assert type(err).__name__ == "Unavailable", repr(err)
            assert time.monotonic() - started < 3.0
            reason = workers[0].reason
            assert reason.startswith(
                f"the runtime did not answer within {SUSPECT_PROBE_TIMEOUT:g} s; no answer for"
            )
            for poller in pollers:
                poller.cancel()
            clients.cancel()
            await asyncio.gather(clients, *pollers, return_exceptions=True)
            await close_all(*workers)

    run(scenario())


def test_a_probe_waiting_when_its_replica_stops_gives_up_once_the_replica_is_suspect():
    """A routine probe (timeout 5 s here) goes out just as a single busy replica stops
    answering anything: it is marked unreachable ``SUSPECT_PROBE_TIMEOUT`` after the
    probe was sent or once it turns suspect, whichever is later, not when the 5 s run
    out (then the silence would be read as busy and the replica kept)."""

    async def scenario() -> None:
        async with fake_workers("a") as (a,), watching() as lag:
            worker = a.worker(served_name="x")
            pool = make_pool([worker])
            poller = HealthPoller(worker, timeout=5.0)
            stop = asyncio.Event()
            clients = asyncio.create_task(load(pool, 2, stop))
            await a.wait_received(30)
            a.frozen = True
            a.mode = "hang"
            frozen_at = time.monotonic()
            assert await poller.probe() == "unreachable"
            took = time.monotonic() - frozen_at
            bound = worker.liveness.stall_after() + SUSPECT_PROBE_TIMEOUT + 0.3 + lag.worst
            assert took <= bound, (took, bound)
            assert worker.reason.startswith(
                f"the runtime did not answer within {SUSPECT_PROBE_TIMEOUT:g} s; no answer for"
            )
            stop.set()
            clients.cancel()
            await asyncio.gather(clients, return_exceptions=True)
            await worker.aclose()

    run(scenario())
