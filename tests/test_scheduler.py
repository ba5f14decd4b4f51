"""The per-model scheduler with a fake forward: admission, batching, deadlines, cache.

Nothing here sleeps to let another thread get somewhere: a test holds the
fake forward at its gate (:class:`FakeForward`) and waits on events, and the
tests about time (batch window, deadlines, queue time) move a fake clock
(:class:`FakeClock`).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time

import pytest
import torch

from vllm_srun.plugins.spec import RowError, WorkItem
from vllm_srun.service.scheduler import (
    Job,
    ModelScheduler,
    Overloaded,
    SchedulerLimits,
    SchedulerMetrics,
    Stopped,
    plan_forwards,
    split_by_length,
)

WAIT = 5.0  # seconds any one wait may take before the test fails
EXPIRED = RowError("deadline_exceeded", "the request's deadline passed before this input ran")


def row(key: str, tokens: int = 3) -> WorkItem:
    return WorkItem(tuple(range(tokens)), None, key)


class FakeForward:
    """Records each forward's row keys; answers a row with a tensor of its length.

    Attributes:
        gate: a forward waits for it (set: runs at once).
        entered: set when a forward starts (cleared by the test).
        fail_on: a row key whose forward raises.
        drop_one: answer one output fewer than there are rows.
    """

    def __init__(self, fail_on: str | None = None):
        self.calls: list[list[str]] = []
        self.fail_on = fail_on
        self.drop_one = False
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def __call__(self, items):
        self.calls.append([i.key for i in items])
        self.entered.set()
        assert self.gate.wait(WAIT), "a test left the forward gate closed"
        if self.fail_on and any(i.key == self.fail_on for i in items):
            raise RuntimeError("boom")
        outputs = [torch.full((1,), float(i.tokens)) for i in items]
        return outputs[:-1] if self.drop_one else outputs

    def hold(self) -> None:
        self.gate.clear()
        self.entered.clear()

    def wait_entered(self) -> None:
        assert self.entered.wait(WAIT), "no forward started"


class FakeClock:
    """A monotonic clock that only the test moves.

    ``worker_read`` is set whenever the scheduler's worker thread reads it, so
    a test knows the worker has looked at the time it set.
    """

    def __init__(self, now: float = 100.0):
        self.now = now
        self.worker_read = threading.Event()

    def __call__(self) -> float:
        if threading.current_thread().name.startswith("scheduler:"):
            self.worker_read.set()
        return self.now

    def wait_worker_read(self) -> None:
        assert self.worker_read.wait(WAIT), "the worker did not read the clock"


class Answer:
    def __init__(self):
        self.event = threading.Event()
        self.outputs = None

    def __call__(self, outputs):
        self.outputs = outputs
        self.event.set()

    def wait(self):
        assert self.event.wait(WAIT), "no answer"
        return self.outputs


class Recorder(SchedulerMetrics):
    """Every metric the scheduler reports, in order."""

    def __init__(self):
        self.queued_rows: list[int] = []
        self.queue_seconds: list[float] = []
        self.forwards: list[tuple[int, float]] = []
        self.cache_outcomes: list[str] = []

    def queued(self, rows):
        self.queued_rows.append(rows)

    def dispatched(self, queue_seconds):
        self.queue_seconds.append(queue_seconds)

    def forward(self, rows, seconds):
        self.forwards.append((rows, seconds))

    def cache(self, outcome):
        self.cache_outcomes.append(outcome)


def job(*items, deadline=None, weight=1):
    answer = Answer()
    return Job(list(items), answer, deadline=deadline, weight=weight), answer


def scheduler(forward, metrics=None, clock=None, name="m", **limits):
    if clock is None:
        return ModelScheduler(name, forward, SchedulerLimits(**limits), metrics)
    return ModelScheduler(name, forward, SchedulerLimits(**limits), metrics, clock=clock)


NAMES = itertools.count()


def unique_name(prefix: str) -> str:
    """A model name no other scheduler of this process has (tests may run twice in a process)."""
    return f"{prefix}-{next(NAMES)}"


def worker_of(name):
    """The worker thread of the scheduler called ``name`` (a :func:`unique_name`)."""
    [worker] = [t for t in threading.enumerate() if t.name == f"scheduler:{name}"]
    return worker


def held(forward, sched, key="z", tokens=3):
    """Hold the worker inside a forward of one blocker row; returns the blocker's answer."""
    forward.hold()
    blocker, answer = job(row(key, tokens))
    sched.submit([blocker])
    forward.wait_entered()
    return answer


def values(outputs):
    return [o if isinstance(o, RowError) else float(o[0]) for o in outputs]


def wait_for(predicate, what):
    """Poll ``predicate`` (cheap, no side effects) until true; fail after WAIT seconds."""
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)


# -- dispatch and the batch window -------------------------------------------------------------
def test_a_lone_request_is_dispatched_at_once_and_answered():
    forward = FakeForward()
    clock = FakeClock()  # never moves: a batch window would never end
    sched = scheduler(forward, clock=clock, batch_window_ms=1000)
    j, answer = job(row("a", 4))
    sched.submit([j])
    assert values(answer.wait()) == [4.0]
    assert sched.unanswered == 0


def test_a_busy_worker_waits_the_batch_window_for_company():
    forward = FakeForward()
    clock = FakeClock()
    sched = scheduler(forward, clock=clock, max_num_seqs=2, batch_window_ms=1000)
    blocker = held(forward, sched, "x")
    a, a_answer = job(row("a"))
    sched.submit([a])
    clock.worker_read.clear()
    forward.gate.set()
    blocker.wait()
    clock.wait_worker_read()  # back from "x", the worker looks at the window's clock
    b, b_answer = job(row("b"))
    sched.submit([b])  # two rows: max_num_seqs ends the window early
    a_answer.wait()
    b_answer.wait()
    assert forward.calls == [["x"], ["a", "b"]]


@pytest.mark.parametrize("window_ms", [50.0, 0.5])
def test_the_batch_window_runs_from_the_oldest_queued_request(window_ms):
    forward = FakeForward()
    clock = FakeClock(100.0)
    metrics = Recorder()
    window = window_ms / 1000
    sched = scheduler(forward, metrics, clock, batch_window_ms=window_ms, result_cache_entries=0)
    held(forward, sched, "x")
    a, _ = job(row("a"))
    sched.submit([a])  # enqueued at 100.0
    clock.now = 100.0 + 0.6 * window
    b, b_answer = job(row("b"))
    sched.submit([b])
    clock.worker_read.clear()
    forward.gate.set()
    clock.wait_worker_read()  # the worker is back and waiting: "a" came 0.6 windows ago
    clock.now = 100.0 + window * (1 - 1e-5)  # just short of the end of the window
    clock.worker_read.clear()
    clock.wait_worker_read()
    clock.now = 100.0 + window  # exactly its end
    b_answer.wait()
    assert forward.calls == [["x"], ["a", "b"]]
    # queue time: "x" ran at once; "a" and "b" waited for the window's end
    assert metrics.queue_seconds == pytest.approx([0.0, window, 0.4 * window], abs=1e-9)


def test_a_request_queued_before_a_new_worker_starts_is_dispatched_at_once(monkeypatch):
    deferred = []
    monkeypatch.setattr(threading.Thread, "start", lambda thread: deferred.append(thread))
    forward = FakeForward()
    sched = scheduler(forward, clock=FakeClock(), batch_window_ms=1000)  # the clock never moves
    monkeypatch.undo()
    j, answer = job(row("first"))
    sched.submit([j])  # before the worker has looked at its queue: a new worker is idle
    [worker] = deferred
    worker.start()
    assert values(answer.wait()) == [3.0]


def test_the_worker_never_keeps_the_process_alive():
    name = unique_name("daemonic")
    scheduler(FakeForward(), name=name)
    assert worker_of(name).daemon


def test_without_a_batch_window_a_busy_worker_takes_what_is_queued():
    forward = FakeForward()
    clock = FakeClock()  # never moves
    sched = scheduler(forward, clock=clock, batch_window_ms=0)
    blocker = held(forward, sched, "x")
    a, a_answer = job(row("a"))
    sched.submit([a])
    forward.gate.set()
    blocker.wait()
    assert values(a_answer.wait()) == [3.0]


# -- admission -----------------------------------------------------------------------------
def test_queued_requests_share_one_forward_and_equal_rows_run_once():
    forward = FakeForward()
    sched = scheduler(forward, result_cache_entries=0)
    held(forward, sched, "x")
    second, a2 = job(row("a"), row("b"), row("a"))
    third, a3 = job(row("b"))
    sched.submit([second])
    sched.submit([third])
    forward.gate.set()
    assert len(a2.wait()) == 3 and len(a3.wait()) == 1
    assert forward.calls[0] == ["x"]
    assert sorted(forward.calls[1]) == ["a", "b"]  # duplicates computed once


def test_admission_is_all_or_nothing_and_a_big_request_runs_alone():
    forward = FakeForward()
    forward.hold()
    sched = scheduler(forward, max_queue=2, max_queued_tokens=100)
    big, big_answer = job(*[row(f"r{i}", 50) for i in range(4)])  # 200 tokens > 100
    sched.submit([big])  # nothing else queued: admitted
    second, _ = job(row("s"))
    with pytest.raises(Overloaded, match="retry later"):
        sched.submit([second])
    forward.gate.set()
    assert len(big_answer.wait()) == 4


def test_a_request_over_the_queue_bound_is_refused_whole():
    forward = FakeForward()
    sched = scheduler(forward, max_queue=3)
    held_answer = held(forward, sched, "h")
    tasks = [job(row(f"t{i}")) for i in range(3)]
    with pytest.raises(Overloaded):
        sched.submit([t for t, _ in tasks])
    assert sched.unanswered == 1  # none of the three was admitted
    forward.gate.set()
    held_answer.wait()


def test_the_queue_bound_admits_up_to_and_including_max_queue():
    forward = FakeForward()
    sched = scheduler(forward, max_queue=3)
    held(forward, sched, "h", tokens=4)
    two, _ = job(row("a", 1), row("b", 1))
    sched.submit([two])  # 1 + 1 = 2
    sched.submit([job(row("c", 1))[0]])  # 3: exactly the bound
    assert sched.unanswered == 3
    with pytest.raises(Overloaded) as refused:
        sched.submit([job(row("d", 1))[0]])
    assert str(refused.value) == (
        "model m has 3 requests and 7 tokens queued (limits 3 and 4194304); retry later"
    )
    assert sched.unanswered == 3
    forward.gate.set()


def test_the_token_bound_admits_up_to_and_including_max_queued_tokens():
    forward = FakeForward()
    sched = scheduler(forward, max_queued_tokens=10)
    held(forward, sched, "h", tokens=3)
    sched.submit([job(row("a", 7))[0]])  # 3 + 7 = 10: exactly the bound
    with pytest.raises(Overloaded) as refused:
        sched.submit([job(row("b", 1))[0]])
    assert str(refused.value) == (
        "model m has 2 requests and 10 tokens queued (limits 256 and 10); retry later"
    )
    forward.gate.set()


def test_a_request_counts_its_weight_against_the_queue_bound():
    forward = FakeForward()
    sched = scheduler(forward, max_queue=4)
    held(forward, sched, "h")
    with pytest.raises(Overloaded):
        sched.submit([job(row("four"), weight=4)[0]])  # 1 + 4 > 4
    three, three_answer = job(row("three"), weight=3)
    sched.submit([three])  # 1 + 3 = 4
    assert sched.unanswered == 4
    with pytest.raises(Overloaded, match="model m has 4 requests and 6 tokens queued"):
        sched.submit([job(row("one"))[0]])
    forward.gate.set()
    three_answer.wait()
    assert sched.unanswered == 0


def test_submit_each_admits_or_refuses_each_job_as_its_own_request():
    forward = FakeForward()
    sched = scheduler(forward, max_queue=3)
    jobs = [job(row(f"j{i}"), weight=w)[0] for i, w in enumerate((1, 4, 2, 1))]
    refused = sched.submit_each(jobs)
    # j1 weighs more than the whole queue; j3 finds j0 and j2 queued (3 of 3)
    assert [r is None for r in refused] == [True, False, True, False]
    assert "counts as 4 requests" in str(refused[1])
    assert str(refused[3]).startswith("model m has 3 requests and ")
    assert sched.unanswered == 3
    forward.gate.set()  # j0 and j2 (weights 1 and 2) were admitted: 3 unanswered


def test_a_request_weighing_more_than_the_queue_bound_is_refused_even_alone():
    forward = FakeForward()
    forward.gate.set()
    sched = scheduler(forward, max_queue=4)
    with pytest.raises(Overloaded) as refused:
        sched.submit([job(row("five"), weight=5)[0]])
    assert str(refused.value) == (
        "the request counts as 5 requests (a decisions `states` entry counts as one) against "
        "--max-queue 4 of model m; split it into smaller requests, or raise --max-queue"
    )
    assert sched.unanswered == 0
    four, answer = job(row("four"), weight=4)
    sched.submit([four])  # exactly the bound, alone: admitted
    answer.wait()
    assert sched.unanswered == 0


def test_an_answered_request_frees_its_tokens():
    forward = FakeForward()
    sched = scheduler(forward, max_queued_tokens=10)
    first, first_answer = job(row("a", 8))
    sched.submit([first])
    first_answer.wait()
    held(forward, sched, "h", tokens=2)
    again, again_answer = job(row("b", 8))
    sched.submit([again])  # 2 + 8 = 10: the first request's 8 tokens are free again
    forward.gate.set()
    assert values(again_answer.wait()) == [8.0]


def test_a_request_without_rows_is_answered_at_once_with_nothing():
    forward = FakeForward()
    sched = scheduler(forward)
    empty, empty_answer = job()
    other, other_answer = job(row("a"))
    sched.submit([empty, other])
    assert empty_answer.event.is_set()  # answered inside submit, before any forward
    assert empty_answer.outputs == []
    assert values(other_answer.wait()) == [3.0]
    assert forward.calls == [["a"]]
    assert sched.unanswered == 0


# -- batch bounds --------------------------------------------------------------------------
def test_rows_respect_the_row_and_padded_token_bounds():
    forward = FakeForward()
    sched = scheduler(forward, max_num_seqs=2, max_num_batched_tokens=100, result_cache_entries=0)
    held(forward, sched)
    many, answer = job(*[row(f"k{i}", 10) for i in range(5)])
    sched.submit([many])
    forward.gate.set()
    answer.wait()
    assert [len(c) for c in forward.calls[1:]] == [2, 2, 1]


def test_the_padded_token_bound_counts_the_row_being_added():
    forward = FakeForward()
    sched = scheduler(forward, max_num_batched_tokens=30, result_cache_entries=0)
    held(forward, sched)
    four, answer = job(*[row(f"k{i}", 10) for i in range(4)])
    sched.submit([four])
    forward.gate.set()
    answer.wait()
    # 3 rows x 10 = 30 fits; a 4th would make 40
    assert forward.calls[1:] == [["k0", "k1", "k2"], ["k3"]]


def test_a_longer_row_pads_every_row_of_the_forward_to_its_length():
    forward = FakeForward()
    sched = scheduler(forward, max_num_batched_tokens=60, result_cache_entries=0)
    held(forward, sched)
    mixed, answer = job(row("s1", 10), row("s2", 10), row("long", 30))
    sched.submit([mixed])
    forward.gate.set()
    assert values(answer.wait()) == [10.0, 10.0, 30.0]
    # two short rows are 20 padded tokens; with the long one all three pad to 30: 90 > 60
    assert forward.calls[1:] == [["s1", "s2"], ["long"]]


def test_rows_without_tokens_add_no_padded_tokens():
    forward = FakeForward()
    sched = scheduler(forward, max_num_batched_tokens=2, result_cache_entries=0)
    held(forward, sched)
    empty, answer = job(*[WorkItem((), None, f"e{i}") for i in range(3)])
    sched.submit([empty])
    forward.gate.set()
    assert values(answer.wait()) == [0.0, 0.0, 0.0]
    assert forward.calls[1:] == [["e0", "e1", "e2"]]  # 3 rows x 0 tokens fit a bound of 2


def test_a_row_longer_than_the_token_bound_still_runs_alone():
    forward = FakeForward()
    sched = scheduler(forward, max_num_batched_tokens=100, result_cache_entries=0)
    held(forward, sched)
    huge, answer = job(row("huge", 200), row("small", 1))
    sched.submit([huge])
    forward.gate.set()
    assert values(answer.wait()) == [200.0, 1.0]
    assert forward.calls[1:] == [["huge"], ["small"]]


def test_the_first_row_that_does_not_fit_ends_the_forward():
    forward = FakeForward()
    sched = scheduler(forward, max_num_batched_tokens=130, result_cache_entries=0)
    held(forward, sched)
    a, a_answer = job(row("a0", 40), row("a1", 90))
    b, b_answer = job(row("b0", 10), row("b1", 10))
    sched.submit([a])
    sched.submit([b])
    forward.gate.set()
    a_answer.wait()
    b_answer.wait()
    # round-robin a0, b0 (80 padded tokens); a1 would pad three rows to 90: the forward
    # ends there, and b1 does not jump ahead of a1 although it would fit
    assert forward.calls[1:] == [["a0", "b0"], ["a1"], ["b1"]]


def test_a_short_request_is_not_stuck_behind_a_long_one():
    forward = FakeForward()
    sched = scheduler(forward, max_num_seqs=4, result_cache_entries=0)
    held(forward, sched)
    long_job, _ = job(*[row(f"l{i}") for i in range(12)])
    short_job, short_answer = job(row("s"))
    sched.submit([long_job])
    sched.submit([short_job])
    forward.gate.set()
    short_answer.wait()
    assert forward.calls[1] == ["l0", "s", "l1", "l2"]  # round-robin: "s" rides the first forward


def test_no_cross_request_batching_runs_requests_apart():
    forward = FakeForward()
    sched = scheduler(forward, cross_request_batching=False, result_cache_entries=0)
    held(forward, sched)
    a, a_answer = job(row("a1"), row("a2"))
    b, b_answer = job(row("b1"))
    sched.submit([a])
    sched.submit([b])
    forward.gate.set()
    a_answer.wait()
    b_answer.wait()
    assert forward.calls[1:] == [["a1", "a2"], ["b1"]]


# -- deadlines -----------------------------------------------------------------------------
def test_expired_deadlines_answer_deadline_exceeded_and_a_deadline_not_yet_passed_runs():
    forward = FakeForward()
    clock = FakeClock(100.0)
    metrics = Recorder()
    sched = scheduler(forward, metrics, clock, result_cache_entries=0)
    held(forward, sched, "z")
    late, late_answer = job(row("a"), row("b"), deadline=100.5)
    on_time, on_time_answer = job(row("c"), deadline=101.0)
    sched.submit([late, on_time])
    assert metrics.queued_rows[-1] == 3
    clock.now = 101.0  # past "late"'s deadline, exactly at "on_time"'s
    forward.gate.set()
    assert late_answer.wait() == [EXPIRED, EXPIRED]
    assert values(on_time_answer.wait()) == [3.0]
    assert forward.calls == [["z"], ["c"]]
    assert metrics.queued_rows[-1] == 0  # the expired rows left the queue too
    assert sched.unanswered == 0


def test_a_deadline_that_passes_while_a_row_runs_expires_the_rows_still_queued():
    forward = FakeForward()
    clock = FakeClock(100.0)
    sched = scheduler(forward, clock=clock, max_num_seqs=1, result_cache_entries=0)
    forward.hold()
    three, answer = job(row("a", 4), row("b"), row("c"), deadline=100.5)
    sched.submit([three])
    forward.wait_entered()  # "a" runs (in time)
    clock.now = 101.0
    forward.gate.set()
    assert values(answer.wait()) == [4.0, EXPIRED, EXPIRED]
    assert forward.calls == [["a"]]
    assert sched.unanswered == 0


# -- cancellation ----------------------------------------------------------------------------
def test_a_cancelled_request_leaves_the_queue():
    forward = FakeForward()
    metrics = Recorder()
    sched = scheduler(forward, metrics, result_cache_entries=0)
    held(forward, sched)
    gone, answer = job(row("a"), row("b"))
    sched.submit([gone])
    assert metrics.queued_rows[-1] == 2
    sched.cancel(gone)
    assert metrics.queued_rows[-1] == 0
    assert sched.unanswered == 1
    forward.gate.set()
    after, after_answer = job(row("after"))
    sched.submit([after])
    after_answer.wait()  # one worker, in order: the cancelled request had its turn before
    assert not answer.event.is_set()
    assert forward.calls == [["z"], ["after"]]
    assert sched.unanswered == 0


def test_cancelling_a_running_request_drops_its_queued_rows_and_frees_it_after_the_forward():
    forward = FakeForward()
    metrics = Recorder()
    sched = scheduler(forward, metrics, max_num_seqs=1, result_cache_entries=0)
    forward.hold()
    three, answer = job(row("a"), row("b"), row("c"))
    sched.submit([three])
    forward.wait_entered()  # "a" runs; "b" and "c" are queued
    assert metrics.queued_rows[-1] == 2
    sched.cancel(three)
    assert metrics.queued_rows[-1] == 0
    assert sched.unanswered == 1  # "a" is still in its forward
    sched.cancel(three)  # twice: nothing more to drop
    assert metrics.queued_rows[-1] == 0
    forward.gate.set()
    after, after_answer = job(row("after"))
    sched.submit([after])
    after_answer.wait()
    assert sched.unanswered == 0
    assert not answer.event.is_set()
    assert forward.calls == [["a"], ["after"]]


def test_cancelling_an_answered_request_changes_nothing():
    forward = FakeForward()
    sched = scheduler(forward, max_queue=1)
    done, answer = job(row("a"))
    sched.submit([done])
    answer.wait()
    sched.cancel(done)  # its client went away after the answer
    assert sched.unanswered == 0
    held(forward, sched, "h")
    with pytest.raises(Overloaded):  # the bound still counts from zero
        sched.submit([job(row("b"))[0]])
    forward.gate.set()


# -- the result cache ------------------------------------------------------------------------
def ask(sched, *keys):
    for key in keys:
        j, answer = job(row(key))
        sched.submit([j])
        assert values(answer.wait()) == [3.0]


def test_the_result_cache_serves_repeated_rows():
    forward = FakeForward()
    sched = scheduler(forward, result_cache_entries=2)
    ask(sched, "a", "a", "b", "c", "a")
    assert forward.calls == [["a"], ["b"], ["c"], ["a"]]  # "a" evicted by b and c, then recomputed


def test_the_result_cache_evicts_the_least_recently_used_row():
    forward = FakeForward()
    sched = scheduler(forward, result_cache_entries=2)
    ask(sched, "a", "b", "a", "c")  # "a" was used after "b": "c" evicts "b"
    ask(sched, "a", "b")
    assert forward.calls == [["a"], ["b"], ["c"], ["b"]]  # first in, first out would rerun "a"


def test_the_result_cache_holds_exactly_its_number_of_entries():
    forward = FakeForward()
    metrics = Recorder()
    sched = scheduler(forward, metrics, result_cache_entries=2)
    ask(sched, "a", "b", "a", "b")
    assert forward.calls == [["a"], ["b"]]
    assert metrics.cache_outcomes == ["miss", "miss", "hit", "hit"]
    one = FakeForward()
    ask(scheduler(one, result_cache_entries=1), "a", "a")
    assert one.calls == [["a"]]


def test_a_cache_of_zero_entries_is_off_and_counts_nothing():
    forward = FakeForward()
    metrics = Recorder()
    sched = scheduler(forward, metrics, result_cache_entries=0)
    ask(sched, "a", "a")
    assert forward.calls == [["a"], ["a"]]
    assert metrics.cache_outcomes == []


def test_a_row_served_from_the_cache_spends_no_forward_time():
    forward = FakeForward()
    sched = scheduler(forward)
    ask(sched, "a")
    cached, answer = job(row("a"))
    sched.submit([cached])
    assert values(answer.wait()) == [3.0]
    assert cached.forward_seconds == 0.0
    assert forward.calls == [["a"]]


def test_a_failed_row_is_not_cached():
    forward = FakeForward(fail_on="a")
    sched = scheduler(forward)
    failed, failed_answer = job(row("a"))
    sched.submit([failed])
    assert failed_answer.wait() == [RowError("internal_error", "the forward failed: RuntimeError")]
    forward.fail_on = None
    ask(sched, "a")  # computed again, and now it succeeds
    assert forward.calls == [["a"], ["a"]]


# -- failures and metrics --------------------------------------------------------------------
def test_a_forward_that_raises_fails_only_its_rows():
    forward = FakeForward(fail_on="bad")
    sched = scheduler(forward)
    bad, bad_answer = job(row("bad"))
    sched.submit([bad])
    [out] = bad_answer.wait()
    assert out == RowError("internal_error", "the forward failed: RuntimeError")
    good, good_answer = job(row("good"))
    sched.submit([good])
    assert float(good_answer.wait()[0][0]) == 3.0


def test_a_forward_answering_the_wrong_number_of_rows_fails_them():
    forward = FakeForward()
    forward.drop_one = True
    sched = scheduler(forward)
    two, answer = job(row("a"), row("b"))
    sched.submit([two])
    failure = RowError("internal_error", "the forward failed: RuntimeError")
    assert answer.wait() == [failure, failure]


def test_a_failed_forward_is_logged_with_the_model_and_the_cause(caplog):
    forward = FakeForward()
    forward.drop_one = True
    sched = scheduler(forward)
    two, answer = job(row("a"), row("b"))
    with caplog.at_level(logging.ERROR, logger="vllm_srun.service.scheduler"):
        sched.submit([two])
        answer.wait()
    assert "model m: a forward of 2 rows failed" in caplog.messages
    assert "RuntimeError: 1 outputs for 2 rows" in caplog.text


def test_an_answer_callback_that_raises_is_logged_and_the_model_keeps_serving(caplog):
    forward = FakeForward()
    sched = scheduler(forward)

    def explode(outputs):
        raise RuntimeError("client gone")

    with caplog.at_level(logging.ERROR, logger="vllm_srun.service.scheduler"):
        sched.submit([Job([row("a")], explode)])
        ask(sched, "b")
    assert "model m: answering a request failed" in caplog.messages


def test_metrics_report_queued_rows_queue_time_and_forwards():
    forward = FakeForward()
    clock = FakeClock(100.0)
    metrics = Recorder()
    sched = scheduler(forward, metrics, clock, batch_window_ms=0, result_cache_entries=0)
    held(forward, sched, "x")
    assert metrics.queued_rows == [1, 0]  # "x" queued, then taken
    two, answer = job(row("a", 2), row("b", 5))
    sched.submit([two])
    assert metrics.queued_rows == [1, 0, 2]
    clock.now = 100.25
    started = time.perf_counter()
    forward.gate.set()
    answer.wait()
    wall = time.perf_counter() - started
    assert metrics.queued_rows == [1, 0, 2, 0]
    assert metrics.queue_seconds == pytest.approx([0.0, 0.25], abs=1e-9)
    assert [rows for rows, _ in metrics.forwards] == [1, 2]
    assert 0.0 <= metrics.forwards[1][1] <= wall
    assert two.forward_seconds == metrics.forwards[1][1]


def test_a_request_split_over_two_forwards_adds_up_their_time():
    forward = FakeForward()
    metrics = Recorder()
    sched = scheduler(forward, metrics, result_cache_entries=0, forward_overhead_tokens=0.0)
    held(forward, sched, "x")
    mixed, answer = job(row("s", 2), row("l", 50))
    sched.submit([mixed])
    forward.gate.set()
    assert values(answer.wait()) == [2.0, 50.0]
    assert forward.calls[1:] == [["s"], ["l"]]
    assert mixed.forward_seconds == pytest.approx(metrics.forwards[1][1] + metrics.forwards[2][1])


# -- stopping ---------------------------------------------------------------------------------
def stopping(sched) -> bool:
    try:
        sched.submit([Job([], lambda outputs: None)])  # no rows: answered at once if admitted
    except Stopped:
        return True
    return False


def test_stop_finishes_queued_work_then_refuses_new_work():
    forward = FakeForward()
    sched = scheduler(forward, max_num_seqs=1)
    forward.hold()
    answers = []
    for i in range(3):
        j, answer = job(row(f"q{i}"))
        sched.submit([j])
        answers.append(answer)
    forward.wait_entered()
    result = []
    stopper = threading.Thread(target=lambda: result.append(sched.stop(grace_seconds=WAIT)))
    stopper.start()
    wait_for(lambda: stopping(sched), "stop to begin")
    forward.gate.set()  # the queued work runs while stop waits
    stopper.join(WAIT)
    assert result == [True]
    assert [values(a.wait()) for a in answers] == [[3.0], [3.0], [3.0]]
    with pytest.raises(Stopped, match="model m is shutting down"):
        sched.submit([job(row("late"))[0]])


def test_stop_past_its_grace_fails_what_is_still_queued():
    forward = FakeForward()
    sched = scheduler(forward, max_num_seqs=1, result_cache_entries=0)
    running = held(forward, sched, "running")
    queued_answer = Answer()

    def release_after_answer(outputs):
        queued_answer(outputs)
        forward.gate.set()  # the running forward may finish now

    sched.submit([Job([row("queued")], release_after_answer)])
    assert sched.stop(grace_seconds=0.05) is False
    assert queued_answer.wait() == [RowError("internal_error", "the server shut down")]
    assert values(running.wait()) == [3.0]  # a row already in a forward still finishes
    assert forward.calls == [["running"]]


def test_stop_gives_up_on_a_forward_that_does_not_return():
    forward = FakeForward()
    name = unique_name("stuck")
    sched = scheduler(forward, name=name, max_num_seqs=1, result_cache_entries=0)
    forward.hold()
    two, answer = job(row("a"), row("b"))
    sched.submit([two])
    forward.wait_entered()  # "a" runs and does not return; "b" is queued
    started = time.monotonic()
    assert sched.stop(grace_seconds=0.05) is False
    # the grace, then up to a second for the worker: stop never hangs on a stuck forward
    assert time.monotonic() - started < 1.8
    sched.cancel(two)  # its client leaves during shutdown
    forward.gate.set()
    worker_of(name).join(WAIT)
    assert not answer.event.is_set()
    assert sched.unanswered == 0
    assert forward.calls == [["a"]]


def test_stop_after_a_request_with_a_row_running_was_cancelled():
    forward = FakeForward()
    sched = scheduler(forward, max_num_seqs=1, result_cache_entries=0)
    forward.hold()
    gone, gone_answer = job(row("a"), row("b"))
    sched.submit([gone])
    forward.wait_entered()
    sched.cancel(gone)  # "a" still runs
    queued_answer = Answer()

    def release_after_answer(outputs):
        queued_answer(outputs)
        forward.gate.set()

    sched.submit([Job([row("queued")], release_after_answer)])
    assert sched.stop(grace_seconds=0.05) is False
    assert queued_answer.wait() == [RowError("internal_error", "the server shut down")]
    assert not gone_answer.event.is_set()
    assert sched.unanswered == 0
    assert forward.calls == [["a"]]


def test_stop_with_nothing_queued_is_finished():
    sched = scheduler(FakeForward())
    assert sched.stop(grace_seconds=0.0) is True


# -- the length split -------------------------------------------------------------------------
def lengths_of(groups):
    return [[r.tokens for r in g] for g in groups]


def test_split_by_length_keeps_one_forward_without_a_measured_cost():
    rows = [row("a", 5), row("b", 90), row("c", 7)]
    assert split_by_length(rows, None) == [rows]
    assert split_by_length([], 10.0) == []
    [lone] = [row("lone", 9)]
    assert split_by_length([lone], 10.0) == [[lone]]


def test_split_by_length_separates_short_rows_from_long_ones_when_padding_costs_more():
    rows = [row(f"l{i}", 100) for i in range(4)] + [row(f"s{i}", 10) for i in range(4)]
    # one forward: 8 rows x 100 + 50 = 850 padded tokens; two: 4x10 + 50 + 4x100 + 50 = 540
    assert lengths_of(split_by_length(rows, 50.0)) == [[10] * 4, [100] * 4]
    # a forward that costs more than the padding it saves keeps them together: 850 + 360
    assert lengths_of(split_by_length(rows, 400.0)) == [[10] * 4 + [100] * 4]


def test_split_by_length_prefers_fewer_forwards_on_a_tie():
    rows = [row(f"l{i}", 100) for i in range(4)] + [row(f"s{i}", 10) for i in range(4)]
    # one forward: 800 + 360 = 1160; two: 40 + 360 + 400 + 360 = 1160
    assert lengths_of(split_by_length(rows, 360.0)) == [[10] * 4 + [100] * 4]
    assert lengths_of(split_by_length(rows, 359.0)) == [[10] * 4, [100] * 4]


def test_split_by_length_splits_two_rows_when_that_is_cheaper():
    rows = [row("long", 100), row("short", 10)]
    # together: 2 x 100 + 5 = 205; apart: 10 + 5 + 100 + 5 = 120
    assert lengths_of(split_by_length(rows, 5.0)) == [[10], [100]]


def _cost(groups, overhead):
    return sum(len(g) * max(r.tokens for r in g) + overhead for g in groups)


def _best_by_brute_force(lengths, overhead):
    ordered = sorted(lengths)
    best = float("inf")
    for mask in range(1 << (len(ordered) - 1)):  # every set of cut points
        groups, current = [], [ordered[0]]
        for k, length in enumerate(ordered[1:]):
            if mask >> k & 1:
                groups.append(current)
                current = []
            current.append(length)
        groups.append(current)
        best = min(best, sum(len(g) * max(g) + overhead for g in groups))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_split_by_length_is_optimal_and_keeps_every_row_once(seed):
    import random

    rng = random.Random(seed)
    lengths = [rng.randint(3, 80) for _ in range(11)]
    rows = [row(f"r{i}", n) for i, n in enumerate(lengths)]
    overhead = rng.choice([0.0, 8.0, 60.0, 500.0])
    groups = split_by_length(rows, overhead)
    assert sorted(r.key for g in groups for r in g) == sorted(r.key for r in rows)
    flat = [r.tokens for g in groups for r in g]
    assert flat == sorted(flat)
    assert _cost(groups, overhead) == _best_by_brute_force(lengths, overhead)


def test_a_split_batch_answers_short_requests_before_the_long_forward_runs():
    forward = FakeForward()
    sched = scheduler(forward, result_cache_entries=0, forward_overhead_tokens=4.0)
    held(forward, sched, "x")  # the worker holds "x" at the gate; the next three queue together
    forwards_run_when_answered = {}

    def recording(name):
        answer = Answer()

        def on_done(outputs):
            forwards_run_when_answered[name] = len(forward.calls)
            answer(outputs)

        return on_done, answer

    short_done, short_answer = recording("short")
    long_done, long_answer = recording("long")
    mixed_done, mixed_answer = recording("mixed")
    short = Job([row("s1", 4), row("s2", 5)], short_done)
    long = Job([row("l1", 60)], long_done)
    mixed = Job([row("m1", 4), row("m2", 60)], mixed_done)
    sched.submit([short, long, mixed])
    forward.gate.set()
    assert values(long_answer.wait()) == [60.0]
    assert values(mixed_answer.wait()) == [4.0, 60.0]
    assert values(short_answer.wait()) == [4.0, 5.0]
    assert forward.calls[1:] == [["s1", "m1", "s2"], ["l1", "m2"]]
    # "x", then the short rows: the short request is answered before the long forward runs
    assert forwards_run_when_answered == {"short": 2, "long": 3, "mixed": 3}


def test_split_by_length_keeps_rows_of_one_length_together_at_zero_overhead():
    rows = [row("a", 5), row("b", 5), row("c", 5)]
    assert split_by_length(rows, 0.0) == [rows]


def test_rows_with_different_shared_prefixes_run_as_separate_groups():
    first, second = tuple(range(100, 150)), tuple(range(200, 250))
    rows = [
        WorkItem((*first, 1), None, "f1", prefix=50),
        WorkItem((*second, 1), None, "s1", prefix=50),
        WorkItem((*first, 2, 3), None, "f2", prefix=50),
    ]
    groups = split_by_length(rows, overhead_tokens=1000.0)
    assert [[r.key for r in g] for g in groups] == [["f1", "f2"], ["s1"]]


def test_rows_sharing_a_computed_once_prefix_are_never_split_apart():
    head = tuple(range(100, 300))  # a 200-token state both questions continue
    short = WorkItem((*head, 1, 2), None, "short", prefix=200)
    long = WorkItem((*head, *range(1, 121)), None, "long", prefix=200)
    other = [row(f"o{i}", n) for i, n in enumerate((4, 5, 90))]
    groups = split_by_length([short, *other, long], overhead_tokens=20.0)
    assert [r.key for r in groups[0]] == ["short", "long"]
    assert sorted(r.key for g in groups[1:] for r in g) == ["o0", "o1", "o2"]


# -- the synchronous path's forwards (plan_forwards) -------------------------------------------
def keys_of(forwards: list[list[WorkItem]]) -> list[list[str]]:
    return [[r.key for r in forward] for forward in forwards]


def test_plan_forwards_takes_rows_in_order_within_the_bounds():
    rows = [row("a", 10), row("b", 10), row("c", 10), row("d", 10), row("e", 30)]
    limits = SchedulerLimits(max_num_batched_tokens=30)
    # Three 10-token rows fill 30 padded tokens; the fourth starts a new forward, and
    # the 30-token row cannot join it (2 rows padded to 30 = 60).
    assert keys_of(plan_forwards(rows, limits)) == [["a", "b", "c"], ["d"], ["e"]]
    assert keys_of(plan_forwards(rows, SchedulerLimits(max_num_seqs=2))) == [
        ["a", "b"],
        ["c", "d"],
        ["e"],
    ]
    assert keys_of(plan_forwards(rows, SchedulerLimits())) == [["a", "b", "c", "d", "e"]]
    assert plan_forwards([], SchedulerLimits()) == []


def test_plan_forwards_counts_zero_token_rows_as_no_padding():
    rows = [row("a", 0), row("b", 0), row("c", 0), row("d", 0)]
    assert keys_of(plan_forwards(rows, SchedulerLimits(max_num_batched_tokens=1))) == [
        ["a", "b", "c", "d"]
    ]
    # A new forward starts with no padding either.
    two = SchedulerLimits(max_num_seqs=2, max_num_batched_tokens=1)
    assert keys_of(plan_forwards(rows, two)) == [["a", "b"], ["c", "d"]]


def test_plan_forwards_splits_each_forward_by_length_at_the_forward_cost():
    rows = [row("long", 40), row("s1", 2), row("s2", 2)]
    # Together: 3 x 40 = 120 padded tokens plus one overhead of 10; apart: 40 + 2 x 2
    # = 44 plus two overheads = 64: the split is cheaper.
    split = SchedulerLimits(forward_overhead_tokens=10.0)
    assert keys_of(plan_forwards(rows, split)) == [["s1", "s2"], ["long"]]
    assert keys_of(plan_forwards(rows, SchedulerLimits())) == [["long", "s1", "s2"]]


def test_the_limits_defaults_have_one_source():
    """The batch bounds default to the engine arguments' defaults, and the serve command's
    queue bounds and cache size to the scheduler's: each default is written once."""
    from vllm_srun.config import ServeConfig
    from vllm_srun.engine_args import EngineArgs

    limits, engine, serve = SchedulerLimits(), EngineArgs(), ServeConfig()
    for name in ("max_num_seqs", "max_num_batched_tokens", "batch_window_ms"):
        assert getattr(limits, name) == getattr(engine, name), name
    for name in ("max_queue", "max_queued_tokens", "result_cache_entries"):
        assert getattr(limits, name) == getattr(serve, name), name
