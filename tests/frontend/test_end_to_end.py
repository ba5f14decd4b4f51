"""Issue 14's end-to-end story with real processes: ``vllm-sr serve -e --config ... -dp 2``
starts two managed ``vllm-srun serve --uds`` workers (a tiny fixture package stands in
for MiniLM, which is too slow to start twice here), a Choice question is answered on the
listener under the public id, one worker is SIGKILLed during a burst of requests (the pool
reads ``degraded``; every request is answered 200, 429 or 503, each 200 with its own
request's answer), the worker comes back after its back-off (the inventory and
``vsr_model_runtime_restarts_total`` say 1 restart), and SIGTERM ends ``vllm-sr`` with
exit 0 and no worker left."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from vllm_sr.workers.liveness import (
    STALL_DEFAULT_S,
    STALL_FACTOR,
    STALL_FLOOR_S,
    SUSPECT_PROBE_TIMEOUT,
)

from ..fixtures import write_task_package
from .loop_lag import watching
from .test_serve import VLLM_SRUN, Served, config_file

pytestmark = pytest.mark.slow

PUBLIC = "tiny"
CONCURRENCY = 8


def question(index: int) -> dict[str, Any]:
    """A Choice question only request ``index`` asks: its own question and option names."""
    return {
        "model": PUBLIC,
        "state": f"charged twice {index}",
        "questions": {
            f"team{index}": {
                "type": "choice",
                "instructions": "Which team?",
                "criteria": {f"billing{index}": "refunds", f"shipping{index}": "parcels"},
            }
        },
    }


def its_own(index: int, answer: dict[str, Any]) -> bool:
    """Whether ``answer`` answers request ``index`` (and no other)."""
    answers = answer.get("answers") or {}
    choice = (answers.get(f"team{index}") or {}).get("choice")
    return (
        answer.get("model") == PUBLIC
        and list(answers) == [f"team{index}"]
        and choice in (f"billing{index}", f"shipping{index}")
    )


class Burst:
    """``CONCURRENCY`` clients asking one question after another until stopped; every
    outcome kept by request number (an exception counts as a lost request)."""

    def __init__(self, listener: str) -> None:
        self.listener = listener
        self.outcomes: dict[int, tuple[int, Any]] = {}
        self.lost: dict[int, str] = {}
        self.stopped = asyncio.Event()
        self.answered = asyncio.Condition()
        self._next = 0

    async def client(self) -> None:
        async with httpx.AsyncClient(base_url=self.listener, timeout=30) as client:
            while not self.stopped.is_set():
                index = self._next
                self._next += 1
                try:
                    response = await client.post("/v1/systemone", json=question(index))
                    self.outcomes[index] = (response.status_code, response.json())
                except (httpx.HTTPError, ValueError) as err:
                    self.lost[index] = repr(err)
                async with self.answered:
                    self.answered.notify_all()

    async def until_answered(self, count: int) -> None:
        async with self.answered:
            await asyncio.wait_for(
                self.answered.wait_for(lambda: len(self.outcomes) + len(self.lost) >= count),
                60,
            )


@contextlib.contextmanager
def two_workers(package: Path, tmp_path: Path) -> Iterator[tuple[Served, str, Path]]:
    """``vllm-sr serve -e --config ... -dp 2`` over ``package`` with a socket directory of
    its own: the frontend, its listener's URL and the directory; both gone afterwards."""
    config = config_file(tmp_path, package)
    rundir = Path(tempfile.mkdtemp(prefix="vsrt-", dir="/tmp"))
    server = Served(
        tmp_path,
        ["--config", str(config), "-dp", "2"],
        {"VLLM_SRUN_DIR": str(rundir), "VLLM_SRUN_COMMAND": VLLM_SRUN},
    )
    try:
        yield server, f"http://127.0.0.1:{8899 + server.offset}", rundir
    finally:
        server.close()
        for path in rundir.iterdir():
            path.unlink()
        rundir.rmdir()


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_task_package(tmp_path_factory.mktemp("e2e-packages"), "bert", "pooled")


def test_a_worker_killed_during_a_burst(package: Path, tmp_path: Path) -> None:
    with two_workers(package, tmp_path) as (server, listener, rundir):
        server.wait_ready()
        # What a curl to the listener gets: the Choice question answered under the public id.
        asked = httpx.post(f"{listener}/v1/systemone", json=question(0), timeout=30)
        assert asked.status_code == 200, asked.text
        assert its_own(0, asked.json()), asked.text
        [before] = server.inventory()["deployments"]
        assert (before["state"], before["ready_replicas"], before["restarts"]) == ("ready", 2, 0)
        started = server.workers()
        assert len(started) == 2
        victim = started[0]

        async def burst_through_a_kill() -> tuple[Burst, set[str]]:
            burst = Burst(listener)
            clients = [asyncio.create_task(burst.client()) for _ in range(CONCURRENCY)]
            seen: set[str] = set()
            try:
                await burst.until_answered(32)
                victim.send_signal(signal.SIGKILL)
                async with httpx.AsyncClient(base_url=server.mgmt.base_url, timeout=5) as mgmt:

                    async def entry() -> dict[str, Any]:
                        inventory = await mgmt.get("/api/v1/inventory/model-runtime")
                        [found] = inventory.json()["deployments"]
                        seen.add(found["state"])
                        return found

                    loop = asyncio.get_running_loop()
                    deadline = loop.time() + 45
                    while True:
                        found = await entry()
                        if found["restarts"] == 1 and found["ready_replicas"] == 2:
                            break
                        assert loop.time() < deadline, f"not back: {found}"
                        await asyncio.sleep(0.1)
                # A few more answers from the two of them again.
                await burst.until_answered(len(burst.outcomes) + len(burst.lost) + 32)
            finally:
                burst.stopped.set()
                await asyncio.gather(*clients)
            return burst, seen

        burst, seen = asyncio.run(burst_through_a_kill())
        assert not burst.lost, f"requests without an answer: {burst.lost}"
        statuses = {status for status, _ in burst.outcomes.values()}
        assert statuses <= {200, 429, 503}, statuses
        mixed = [
            i
            for i, (status, body) in burst.outcomes.items()
            if status == 200 and not its_own(i, body)
        ]
        assert not mixed, f"answers to another request: {mixed[:5]}"
        refused = {
            body["error"]["code"] for status, body in burst.outcomes.values() if status != 200
        }
        assert refused <= {"overloaded", "systemone_unavailable"}, refused
        assert "degraded" in seen  # the pool kept serving on one worker meanwhile

        [after] = server.inventory()["deployments"]
        assert (after["state"], after["ready_replicas"], after["restarts"]) == ("ready", 2, 1)
        assert sorted(r["restarts"] for r in after["replicas"]) == [0, 1]
        metrics = httpx.get(server.metrics_url, timeout=5).text
        assert 'vsr_model_runtime_restarts_total{deployment="primary"} 1.0' in metrics
        assert "killed by SIGKILL" in server.err.read_text()  # the exit, logged

        # SIGTERM: exit 0, and no worker left behind.
        workers = server.workers()
        assert len(workers) == 2 and victim.pid not in {w.pid for w in workers}
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(30) == 0, server.output()
        _, alive = psutil.wait_procs(workers, timeout=15)
        assert not alive, f"workers outlived vllm-sr: {[w.pid for w in alive]}"
        assert not list(rundir.glob("*.sock"))
        print(
            f"\nburst: {len(burst.outcomes)} requests; "
            + ", ".join(
                f"{s}: {sum(1 for st, _ in burst.outcomes.values() if st == s)}"
                for s in sorted(statuses)
            )
            + f"; states seen {sorted(seen)}"
        )


def test_the_builtin_minilm_answers_a_choice_question(tmp_path: Path, rundir: Path) -> None:
    """``vllm-sr serve -e`` with nothing else: the built-in MiniLM from its installed
    mirror (``--offline``), published on ``http-8899`` under its Hub id."""
    server = Served(tmp_path, [], {"VLLM_SRUN_DIR": str(rundir), "VLLM_SRUN_COMMAND": VLLM_SRUN})
    listener = f"http://127.0.0.1:{8899 + server.offset}"
    minilm = "sentence-transformers/all-MiniLM-L6-v2"
    try:
        server.wait_ready(120)
        [worker] = server.workers()
        assert "--offline" in worker.cmdline()
        models = httpx.get(f"{listener}/v1/systemone/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == [minilm]
        asked = httpx.post(
            f"{listener}/v1/systemone",
            json={
                "model": minilm,
                "state": "My card was charged twice",
                "questions": {
                    "team": {
                        "type": "choice",
                        "instructions": "Which team should handle this?",
                        "criteria": {
                            "billing": "Payments, charges and refunds",
                            "shipping": "Parcels and delivery",
                        },
                    }
                },
            },
            timeout=30,
        )
        assert asked.status_code == 200, asked.text
        assert asked.json()["model"] == minilm
        assert asked.json()["answers"]["team"]["choice"] == "billing"
        [entry] = server.inventory()["deployments"]
        assert (entry["name"], entry["repo"], entry["state"]) == ("primary", minilm, "ready")
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(30) == 0, server.output()
        _, alive = psutil.wait_procs([worker], timeout=15)
        assert not alive
    finally:
        server.close()


def test_workers_stopped_during_a_burst_are_left_then_make_ready_503(
    package: Path, tmp_path: Path
) -> None:
    """Issue 29's replay: one of two workers is SIGSTOPped under 8 clients. No request sent
    after the stop waits more than 1.5 s longer than the p99 before it; the replica reads
    not ready within 2 s. Then the other stops too: ``/ready`` is 503 within 2 s. Both
    continue (SIGCONT) and the deployment is ready again."""
    stopped: list[psutil.Process] = []
    with two_workers(package, tmp_path) as (server, listener, _):
        try:
            server.wait_ready()
            first, second = server.workers()

            async def scenario() -> dict[str, Any]:
                times: list[tuple[float, float, int]] = []
                done = asyncio.Event()
                loop = asyncio.get_running_loop()

                async def client(number: int) -> None:
                    async with httpx.AsyncClient(base_url=listener, timeout=30) as http:
                        index = number * 100_000
                        while not done.is_set():
                            sent = loop.time()
                            response = await http.post("/v1/systemone", json=question(index))
                            times.append((sent, loop.time() - sent, response.status_code))
                            index += 1

                clients = [asyncio.create_task(client(n)) for n in range(CONCURRENCY)]
                async with (
                    httpx.AsyncClient(base_url=server.mgmt.base_url, timeout=5) as mgmt,
                    watching() as lag,  # the bounds allow for a machine too busy to run us
                ):
                    while len(times) < 64:
                        await asyncio.sleep(0.05)
                    first.suspend()
                    stopped.append(first)
                    frozen_at = loop.time()
                    while await _every_replica_ready(mgmt):
                        assert loop.time() - frozen_at < 2.0 + lag.worst, (
                            f"the stopped replica still reads ready (loop late {lag.worst:.3f} s)"
                        )
                        await asyncio.sleep(0.05)
                    noticed = loop.time() - frozen_at
                    while loop.time() - frozen_at < 4:  # requests after the stop, on the other
                        await asyncio.sleep(0.1)
                    second.suspend()
                    stopped.append(second)
                    both_at = loop.time()
                    while (await mgmt.get("/ready")).status_code == 200:
                        assert loop.time() - both_at < 4.0 + lag.worst, (
                            f"/ready still 200 with both stopped (loop late {lag.worst:.3f} s)"
                        )
                        await asyncio.sleep(0.05)
                    unready = loop.time() - both_at
                    ready_body = (await mgmt.get("/ready")).json()
                    replicas = await _replicas(mgmt)
                    done.set()
                    for process in stopped:
                        process.resume()
                    stopped.clear()
                    await asyncio.gather(*clients)
                    back_at = loop.time()
                    while (await mgmt.get("/ready")).status_code != 200:
                        assert loop.time() - back_at < 30, "not ready again after SIGCONT"
                        await asyncio.sleep(0.1)
                return {
                    "times": times,
                    "frozen_at": frozen_at,
                    "both_at": both_at,
                    "noticed": noticed,
                    "unready": unready,
                    "ready_body": ready_body,
                    "replicas": replicas,
                    "lag": lag.worst,
                }

            found = asyncio.run(scenario())
            before = [s for sent, s, status in found["times"] if sent < found["frozen_at"]]
            after = [
                s
                for sent, s, status in found["times"]
                if found["frozen_at"] <= sent < found["both_at"] - 2.0
            ]
            p99 = sorted(before)[int(0.99 * (len(before) - 1))]
            lag = found["lag"]  # how late the machine ran the test's loop, at worst
            assert after and max(after) <= p99 + 1.5 + lag, (max(after), p99, len(after), lag)
            assert found["noticed"] <= 2.0 + lag, (found["noticed"], lag)
            # Both stopped: the second is left once silent for twice its p99 answer time
            # (at least 0.5 s), then its probe waits 0.75 s (vllm_sr.workers.liveness). Its
            # p99, alone under 8 clients, stays under 0.5 s on a quiet machine (2 s met with
            # room: 1.3 s measured); a machine this loaded can lengthen it, and the rule's
            # own bound is then what holds.
            stall = max(_stall_after(r["reason"]) for r in found["replicas"])
            allowed = max(2.0, stall + SUSPECT_PROBE_TIMEOUT + 0.25) + lag
            assert found["unready"] <= allowed, (found["unready"], stall, lag)
            assert found["ready_body"]["message"].startswith(
                'model_runtime deployment "primary" has no ready replica'
            )
            print(
                f"\nstopped replica left after {found['noticed']:.2f} s; requests after it: "
                f"{len(after)}, slowest {max(after):.2f} s (p99 before {p99:.2f} s); "
                f"/ready 503 {found['unready']:.2f} s after both stopped; loop late "
                f"{lag:.3f} s at worst"
            )
        finally:
            for process in stopped:
                process.resume()


async def _replicas(mgmt: httpx.AsyncClient) -> list[dict[str, Any]]:
    """The deployment's replicas as the inventory lists them."""
    inventory = (await mgmt.get("/api/v1/inventory/model-runtime")).json()
    [entry] = inventory["deployments"]
    return list(entry["replicas"])


async def _every_replica_ready(mgmt: httpx.AsyncClient) -> bool:
    """Whether every replica of the deployment still reads ready in the inventory."""
    return all(r["ready"] for r in await _replicas(mgmt))


def _stall_after(reason: str) -> float:
    """The silence that made a replica suspect, from its unreachable reason (``… its
    answers take up to 0.06 s (p99)``): ``max(STALL_FLOOR_S, STALL_FACTOR * p99)``."""
    if "not answered enough requests yet" in reason:
        return STALL_DEFAULT_S
    found = re.search(r"take up to ([0-9.]+) s \(p99\)", reason)
    assert found, reason
    return max(STALL_FLOOR_S, STALL_FACTOR * float(found.group(1)))
