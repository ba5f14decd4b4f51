"""The per-model scheduler with a fake forward: admission, batching, deadlines, cache."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from vllm_srun.plugins.spec import RowError, WorkItem
from vllm_srun.scheduler import (
    Job,
    ModelScheduler,
    Overloaded,
    SchedulerLimits,
    Stopped,
    split_by_length,
)


def row(key: str, tokens: int = 3) -> WorkItem:
    return WorkItem(tuple(range(tokens)), None, key)


class FakeForward:
    """Records each forward's row keys; answers a row with a tensor of its length."""

    def __init__(self, delay: float = 0.0, fail_on: str | None = None):
        self.calls: list[list[str]] = []
        self.delay = delay
        self.fail_on = fail_on
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, items):
        self.gate.wait(5)
        self.calls.append([i.key for i in items])
        if self.fail_on and any(i.key == self.fail_on for i in items):
            raise RuntimeError("boom")
        time.sleep(self.delay)
        return [torch.full((1,), float(i.tokens)) for i in items]


class Answer:
    def __init__(self):
        self.event = threading.Event()
        self.outputs = None

    def __call__(self, outputs):
        self.outputs = outputs
        self.event.set()

    def wait(self):
        assert self.event.wait(5), "no answer"
        return self.outputs


def job(*items, deadline=None):
    answer = Answer()
    return Job(list(items), answer, deadline=deadline), answer


def scheduler(forward, **limits):
    return ModelScheduler("m", forward, SchedulerLimits(**limits))


def test_a_lone_request_is_dispatched_at_once_and_answered():
    forward = FakeForward()
    sched = scheduler(forward, batch_window_ms=1000)
    started = time.monotonic()
    j, answer = job(row("a", 4))
    sched.submit([j])
    [out] = answer.wait()
    assert time.monotonic() - started < 0.5  # no batch window for an idle worker
    assert float(out[0]) == 4.0
    assert sched.unanswered == 0


def test_queued_requests_share_one_forward_and_equal_rows_run_once():
    forward = FakeForward()
    forward.gate.clear()
    sched = scheduler(forward, result_cache_entries=0)
    first, _ = job(row("x"))
    sched.submit([first])
    time.sleep(0.05)  # the worker holds "x" at the gate
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
    forward.gate.clear()
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
    forward.gate.clear()
    sched = scheduler(forward, max_queue=3)
    held, held_answer = job(row("h"))
    sched.submit([held])
    tasks = [job(row(f"t{i}")) for i in range(3)]
    with pytest.raises(Overloaded):
        sched.submit([t for t, _ in tasks])
    assert sched.unanswered == 1  # none of the three was admitted
    forward.gate.set()
    held_answer.wait()


def test_rows_respect_the_row_and_padded_token_bounds():
    forward = FakeForward()
    forward.gate.clear()
    sched = scheduler(forward, max_num_seqs=2, max_num_batched_tokens=100, result_cache_entries=0)
    blocker, _ = job(row("z"))
    sched.submit([blocker])
    time.sleep(0.05)
    many, answer = job(*[row(f"k{i}", 10) for i in range(5)])
    sched.submit([many])
    forward.gate.set()
    answer.wait()
    assert [len(c) for c in forward.calls[1:]] == [2, 2, 1]


def test_a_short_request_is_not_stuck_behind_a_long_one():
    forward = FakeForward()
    forward.gate.clear()
    sched = scheduler(forward, max_num_seqs=4, result_cache_entries=0)
    blocker, _ = job(row("z"))
    sched.submit([blocker])
    time.sleep(0.05)
    long_job, _ = job(*[row(f"l{i}") for i in range(12)])
    short_job, short_answer = job(row("s"))
    sched.submit([long_job])
    sched.submit([short_job])
    forward.gate.set()
    short_answer.wait()
    first_batch = forward.calls[1]
    assert "s" in first_batch  # round-robin: the short request rides the first forward


def test_expired_deadlines_answer_deadline_exceeded():
    forward = FakeForward()
    forward.gate.clear()
    sched = scheduler(forward)
    blocker, _ = job(row("z"))
    sched.submit([blocker])
    time.sleep(0.05)
    late, answer = job(row("a"), deadline=time.monotonic() + 0.01)
    sched.submit([late])
    time.sleep(0.05)
    forward.gate.set()
    [out] = answer.wait()
    assert out == RowError(
        "deadline_exceeded", "the request's deadline passed before this input ran"
    )


def test_a_cancelled_request_leaves_the_queue():
    forward = FakeForward()
    forward.gate.clear()
    sched = scheduler(forward, result_cache_entries=0)
    blocker, _ = job(row("z"))
    sched.submit([blocker])
    time.sleep(0.05)
    gone, answer = job(row("a"), row("b"))
    sched.submit([gone])
    sched.cancel(gone)
    assert sched.unanswered == 1
    forward.gate.set()
    time.sleep(0.1)
    assert not answer.event.is_set()
    assert all("a" not in call for call in forward.calls)


def test_the_result_cache_serves_repeated_rows():
    forward = FakeForward()
    sched = scheduler(forward, result_cache_entries=2)
    for key in ("a", "a", "b", "c", "a"):
        j, answer = job(row(key))
        sched.submit([j])
        answer.wait()
    assert forward.calls == [["a"], ["b"], ["c"], ["a"]]  # "a" evicted by b and c, then recomputed


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


def test_stop_finishes_queued_work_then_refuses_new_work():
    forward = FakeForward(delay=0.05)
    sched = scheduler(forward, max_num_seqs=1)
    answers = []
    for i in range(3):
        j, answer = job(row(f"q{i}"))
        sched.submit([j])
        answers.append(answer)
    assert sched.stop(grace_seconds=5) is True
    assert all(a.event.is_set() for a in answers)
    with pytest.raises(Stopped):
        sched.submit([job(row("late"))[0]])


def test_no_cross_request_batching_runs_requests_apart():
    forward = FakeForward()
    forward.gate.clear()
    sched = scheduler(forward, cross_request_batching=False, result_cache_entries=0)
    blocker, _ = job(row("z"))
    sched.submit([blocker])
    time.sleep(0.05)
    a, a_answer = job(row("a1"), row("a2"))
    b, b_answer = job(row("b1"))
    sched.submit([a])
    sched.submit([b])
    forward.gate.set()
    a_answer.wait()
    b_answer.wait()
    assert forward.calls[1:] == [["a1", "a2"], ["b1"]]


# -- the length split -------------------------------------------------------------------------
def lengths_of(groups):
    return [[r.tokens for r in g] for g in groups]


def test_split_by_length_keeps_one_forward_without_a_measured_cost():
    rows = [row("a", 5), row("b", 90), row("c", 7)]
    assert split_by_length(rows, None) == [rows]
    assert split_by_length([], 10.0) == []


def test_split_by_length_separates_short_rows_from_long_ones_when_padding_costs_more():
    rows = [row(f"l{i}", 100) for i in range(4)] + [row(f"s{i}", 10) for i in range(4)]
    # one forward: 8 rows x 100 + 50 = 850 padded tokens; two: 4x10 + 50 + 4x100 + 50 = 540
    assert lengths_of(split_by_length(rows, 50.0)) == [[10] * 4, [100] * 4]
    # a forward that costs more than the padding it saves keeps them together: 850 + 360
    assert lengths_of(split_by_length(rows, 400.0)) == [[10] * 4 + [100] * 4]


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
    forward.gate.clear()
    sched = scheduler(forward, result_cache_entries=0, forward_overhead_tokens=4.0)
    blocker, _ = job(row("x"))
    sched.submit([blocker])
    time.sleep(0.05)  # the worker holds "x" at the gate; the next three queue together
    short, short_answer = job(row("s1", 4), row("s2", 5))
    long, long_answer = job(row("l1", 60))
    mixed, mixed_answer = job(row("m1", 4), row("m2", 60))
    sched.submit([short, long, mixed])
    answered_early = []

    def watch():
        # the short request is answered while the worker has not yet run the long rows
        answered_early.append(short_answer.event.wait(5) and not long_answer.event.is_set())

    forward.delay = 0.2
    watcher = threading.Thread(target=watch)
    watcher.start()
    forward.gate.set()
    assert [float(o[0]) for o in long_answer.wait()] == [60.0]
    assert [float(o[0]) for o in mixed_answer.wait()] == [4.0, 60.0]
    assert [float(o[0]) for o in short_answer.wait()] == [4.0, 5.0]
    watcher.join()
    assert forward.calls[1:] == [["s1", "m1", "s2"], ["l1", "m2"]]
    assert answered_early == [True]


def test_rows_sharing_a_computed_once_prefix_are_never_split_apart():
    head = tuple(range(100, 300))  # a 200-token state both questions continue
    short = WorkItem((*head, 1, 2), None, "short", prefix=200)
    long = WorkItem((*head, *range(1, 121)), None, "long", prefix=200)
    other = [row(f"o{i}", n) for i, n in enumerate((4, 5, 90))]
    groups = split_by_length([short, *other, long], overhead_tokens=20.0)
    assert [r.key for r in groups[0]] == ["short", "long"]
    assert sorted(r.key for g in groups[1:] for r in g) == ["o0", "o1", "o2"]
