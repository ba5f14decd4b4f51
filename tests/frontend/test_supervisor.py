"""Supervision and health (§1.5) with a misbehaving worker command: back-off timings on
a fake clock, the conditions that end a readiness wait, recycling, SIGTERM then
SIGKILL, stale sockets, output re-logged, health states and the early probe."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time

import pytest

from vllm_sr.pool import ReplicaPool
from vllm_sr.startup import DeploymentView, StartupFailed, wait_for_deployments
from vllm_sr.workers.client import ExchangeBroken
from vllm_sr.workers.health import HealthPoller
from vllm_sr.workers.supervisor import Supervisor, clear_socket, worker_line
from vllm_sr.workers.worker import Worker

from .conftest import FakeClock, fake_environ, one_worker, run

pytestmark = pytest.mark.slow


def supervised(rundir, mode, clock=None, **options):
    plan, worker = one_worker(rundir)
    supervisor = Supervisor(
        plan,
        worker,
        clock=clock or FakeClock(),
        environ=fake_environ(mode, **options.pop("environ", {})),
        poller={"fast": 0.05, "timeout": 1.0},
        **options,
    )
    return plan, worker, supervisor


def deployment_view(worker, supervisor):
    """The startup wait's view of a one-worker ``primary`` (its pool keeps no cache)."""
    pool = ReplicaPool("primary", [worker], public_name="fake/model", cache_entries=0)
    return DeploymentView("primary", "fake/model", True, pool, [supervisor])


async def until(predicate, timeout=20.0):
    """Wait (on worker changes and short sleeps) until ``predicate()`` is true."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.02)


def test_back_off_doubles_to_a_minute_and_quick_exits_end_the_wait(rundir, clock, caplog):
    caplog.set_level(logging.INFO)
    _, worker, supervisor = supervised(rundir, "exit", clock)

    async def scenario():
        supervisor.start()
        await until(lambda: len(clock.sleeps) >= 8)
        await supervisor.stop()

    run(scenario())
    assert clock.sleeps[:8] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert supervisor.fatal == (
        "runtime process exited 3 times before it was ready: exit status 3: "
        "fake worker: cannot start"
    )
    assert worker.restarts >= 8  # what the inventory and the restarts metric read
    assert worker.state == "stopped"
    # Every line the worker wrote is logged under its process name.
    assert f"{worker.process}: fake worker: cannot start" in caplog.text
    assert "runtime_process_exited" in caplog.text and "restarting in 60 s" in caplog.text


def test_two_stable_minutes_reset_the_back_off(rundir, clock):
    clock.run_lengths = [0, 0, 130, 0]
    _, _, supervisor = supervised(rundir, "exit", clock)

    async def scenario():
        supervisor.start()
        await until(lambda: len(clock.sleeps) >= 4)
        await supervisor.stop()

    run(scenario())
    assert clock.sleeps[:4] == [1, 2, 1, 2]


def test_a_command_that_cannot_run(rundir, clock):
    plan, worker = one_worker(rundir)
    plan.argv[0] = str(rundir / "no-such-vllm-srun")
    supervisor = Supervisor(plan, worker, clock=clock)

    async def scenario():
        supervisor.start()
        await until(lambda: supervisor.fatal is not None)
        view = deployment_view(worker, supervisor)
        with pytest.raises(StartupFailed) as caught:
            await wait_for_deployments([view], timeout=30)
        await supervisor.stop()
        return str(caught.value)

    message = run(scenario())
    assert message == (
        f'model_runtime deployment "primary": runtime command cannot run: '
        f"{rundir / 'no-such-vllm-srun'}: No such file or directory (set VLLM_SRUN_COMMAND "
        "to the vllm-srun command)"
    )


def test_every_model_failed_recycles_then_ends_the_wait(rundir, caplog):
    caplog.set_level(logging.INFO)
    clock = FakeClock()
    log = rundir / "starts.jsonl"
    _, worker, supervisor = supervised(
        rundir, "failed", clock, environ={"FAKE_WORKER_LOG": str(log)}
    )

    async def scenario():
        supervisor.start()
        view = deployment_view(worker, supervisor)
        lines: list[str] = []
        with pytest.raises(StartupFailed) as caught:
            await wait_for_deployments([view], timeout=60, report=lines.append)
        await supervisor.stop()
        return str(caught.value), lines

    message, lines = run(scenario())
    assert message == (
        'model_runtime deployment "primary": every model failed to load 3 times in a row: '
        "{primary: fake: the weights are missing}"
    )
    assert len(log.read_text().splitlines()) >= 3  # each recycle started a new process
    assert clock.sleeps[:3] == [1, 2, 4]
    assert "runtime_process_recycled" in caplog.text
    assert lines[0].startswith("Waiting for Router-managed model deployments, 0 of 1 ready: ")


def test_a_failed_model_ends_the_wait_at_once_without_recycling(rundir):
    _, worker, supervisor = supervised(rundir, "failed", recycle=False)

    async def scenario():
        supervisor.start()
        view = deployment_view(worker, supervisor)
        with pytest.raises(StartupFailed) as caught:
            await wait_for_deployments([view], timeout=30)
        await supervisor.stop()
        return str(caught.value)

    assert run(scenario()) == (
        'model_runtime deployment "primary": model runtime is not ready: model primary failed '
        "to load: fake: the weights are missing"
    )


def test_an_incompatible_worker_ends_the_wait(rundir):
    _, worker, supervisor = supervised(rundir, "incompatible")

    async def scenario():
        supervisor.start()
        view = deployment_view(worker, supervisor)
        with pytest.raises(StartupFailed) as caught:
            await wait_for_deployments([view], timeout=30)
        state = worker.state
        await supervisor.stop()
        return str(caught.value), state

    message, state = run(scenario())
    assert state == "incompatible"
    assert message == (
        'model_runtime deployment "primary": model runtime is incompatible: the runtime speaks '
        "contract 3.0.0; this frontend speaks 2.x: run a vllm-srun of contract 2"
    )


def test_the_readiness_timeout(rundir):
    _, worker, supervisor = supervised(rundir, "never")

    async def scenario():
        supervisor.start()
        view = deployment_view(worker, supervisor)
        lines: list[str] = []
        with pytest.raises(StartupFailed) as caught:
            await wait_for_deployments([view], timeout=1.5, report=lines.append)
        await supervisor.stop()
        return str(caught.value), lines

    message, lines = run(scenario())
    assert message == (
        'model_runtime deployment "primary" did not become ready within 1.5s '
        "(VLLM_SRUN_READY_TIMEOUT): loading"
    )
    assert (
        "Waiting for Router-managed model deployments, 0 of 1 ready: primary (fake/model) loading"
        in lines
    )


def test_sigterm_then_sigkill_after_the_grace(rundir, caplog):
    caplog.set_level(logging.INFO)
    _, worker, supervisor = supervised(rundir, "stubborn", kill_grace=0.5)

    async def scenario():
        supervisor.start()
        await until(lambda: worker.ready)
        pid = supervisor.pid
        started = time.monotonic()
        await supervisor.stop()
        return pid, time.monotonic() - started

    pid, took = run(scenario())
    assert 0.5 <= took < 5
    assert "runtime_process_killed" in caplog.text and "within 0.5 s of SIGTERM" in caplog.text
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_restarted_worker_reports_its_card_again(rundir):
    """Dies mid-request: the supervisor restarts it after its back-off; the card is read
    again before it counts as ready."""
    _, worker, supervisor = supervised(rundir, "crash")

    async def scenario():
        supervisor.start()
        await until(lambda: worker.ready)
        first = supervisor.pid
        assert worker.card is not None and worker.limits["max_bundle_tasks"] == 1024
        with pytest.raises(ExchangeBroken):  # the worker dies mid-request
            await worker.client.post("/v1/systemone", b'{"model": "primary"}')
        await until(lambda: worker.restarts == 1)
        await until(lambda: worker.ready and supervisor.pid != first)
        await supervisor.stop()

    run(scenario())


def test_stale_sockets(rundir):
    stale = rundir / "stale.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(stale))
    listener.close()  # the file stays, nobody listens
    clear_socket(stale)
    assert not stale.exists()
    live = rundir / "live.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(live))
    server.listen()
    try:
        with pytest.raises(OSError, match="another process listens on"):
            clear_socket(live)
        assert live.exists()
    finally:
        server.close()
    plain = rundir / "plain.sock"
    plain.write_text("")
    with pytest.raises(OSError, match="exists and is not a socket"):
        clear_socket(plain)
    clear_socket(rundir / "absent.sock")


def test_a_non_socket_in_the_way_ends_the_wait(rundir, clock):
    plan, worker = one_worker(rundir)
    assert plan.socket is not None
    plan.socket.write_text("not a socket")
    supervisor = Supervisor(plan, worker, clock=clock, environ=fake_environ("ready"))

    async def scenario():
        supervisor.start()
        await until(lambda: supervisor.fatal is not None)
        await supervisor.stop()

    run(scenario())
    expected = (
        f"{plan.socket} exists and is not a socket; remove it, or give VLLM_SRUN_DIR a "
        "directory of its own"
    )
    assert supervisor.fatal == expected
    assert plan.models_file is not None and not plan.models_file.exists()  # nothing written


def test_attached_workers_are_probed_and_unreachable_while_down(rundir):
    """An attached runtime is never started: it is ``unreachable`` until something answers
    at its endpoint, and ready (with its card) once it does."""
    managed_plan, managed = one_worker(rundir)
    attached = Worker("remote", "r-000000000000", False, managed.endpoint, "primary")
    poller = HealthPoller(attached, fast=0.05, timeout=1.0)
    supervisor = Supervisor(managed_plan, managed, environ=fake_environ("ready"))

    async def scenario():
        await poller.probe()
        assert attached.state == "unreachable"
        assert attached.reason == "nothing accepts connections at the endpoint"
        probing = asyncio.create_task(poller.run())
        supervisor.start()
        await until(lambda: attached.ready)
        assert attached.card is not None and attached.card["id"] == "primary"
        await supervisor.stop()
        attached.request_probe()  # what the pool does after a transport failure
        await until(lambda: attached.state == "unreachable", timeout=5)
        assert attached.card is None
        probing.cancel()
        await attached.aclose()

    run(scenario())


def test_health_states(rundir):
    """``missing`` when the runtime does not serve the model."""
    plan, managed = one_worker(rundir)
    other = Worker("primary", "r-1", False, managed.endpoint, "another-model")
    supervisor = Supervisor(plan, managed, environ=fake_environ("ready"))

    async def scenario():
        supervisor.start()
        await until(lambda: managed.ready)
        await HealthPoller(other).probe()
        await supervisor.stop()
        await other.aclose()

    run(scenario())
    assert (other.state, other.reason) == ("missing", "the runtime does not serve this model")


def test_a_poller_stopped_as_a_probe_is_asked_for_stops():
    """A cancellation that comes with a probe request is not lost (Python 3.11's
    ``asyncio.wait_for`` returns the result then): during a burst, failed dispatches ask
    for probes all the time, and a poller that polled on kept its supervisor from ever
    seeing its process exit."""
    worker = Worker("primary", "r-000000000000", True, "unix:///tmp/vsrt-nobody.sock", "p")

    async def scenario():
        waiting = asyncio.create_task(worker.probe_requested(10))
        await asyncio.sleep(0)
        worker.request_probe()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        poller = asyncio.create_task(HealthPoller(worker, fast=10, timeout=0.5).run())
        await worker.changed()  # its first probe found nothing listening
        worker.request_probe()
        poller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await poller
        await worker.aclose()

    run(scenario(), timeout=10)


def test_a_worker_log_line_is_relogged_with_one_time_at_its_level():
    assert worker_line("2026-12-01 09:30:00,123 WARNING vllm_srun.serve: model a is slow") == (
        logging.WARNING,
        "vllm_srun.serve: model a is slow",
    )
    assert worker_line("2026-12-01 09:30:00,123 INFO vllm_srun: ready") == (
        logging.INFO,
        "vllm_srun: ready",
    )
    # Anything else (a traceback, a print) stays as it is, at INFO.
    assert worker_line("Traceback (most recent call last):") == (
        logging.INFO,
        "Traceback (most recent call last):",
    )
    assert worker_line("2026-12-01 09:30:00 WARNING no milliseconds") == (
        logging.INFO,
        "2026-12-01 09:30:00 WARNING no milliseconds",
    )


def test_a_runtime_that_exits_after_every_model_failed_counts_as_a_failed_load(rundir):
    """A ``vllm-srun`` whose every model failed for good exits 1 (issue 29 item 6); once
    its ``/health`` said so, the exit counts as a failed load, three in a row end the
    wait with the models' reasons (not a count of quick exits that resets the other)."""
    clock = FakeClock()
    _, worker, supervisor = supervised(rundir, "failed-exit", clock)

    async def scenario():
        supervisor.start()
        view = deployment_view(worker, supervisor)
        with pytest.raises(StartupFailed) as caught:
            await wait_for_deployments([view], timeout=60)
        await supervisor.stop()
        return str(caught.value)

    assert run(scenario()) == (
        'model_runtime deployment "primary": every model failed to load 3 times in a row: '
        "{primary: fake: the weights are missing}"
    )
    assert clock.sleeps[:3] == [1, 2, 4]
