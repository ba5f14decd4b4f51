"""The load-time measurement of a forward's fixed cost, which the length split uses."""

from __future__ import annotations

import time

import pytest

from vllm_srun.compose import probes
from vllm_srun.compose.probes import measure_forward_cost
from vllm_srun.plugins.spec import WorkItem


class Timed:
    """A model whose forward sleeps ``fixed`` plus ``per_token`` per padded token (seconds)."""

    def __init__(self, fixed: float, per_token: float):
        self.fixed, self.per_token = fixed, per_token

    def probe_items(self):
        return [WorkItem(tuple(range(n)), None, f"r{n}") for n in (2, 9, 16, 30)]

    def run(self, rows):
        padded = len(rows) * max(r.tokens for r in rows)
        time.sleep(self.fixed + self.per_token * padded)
        return [None] * len(rows)


def test_the_fixed_cost_and_the_cost_per_token_are_read_off_two_shapes():
    cost = measure_forward_cost(Timed(fixed=0.004, per_token=0.00004))
    assert cost["fixed_ms"] == pytest.approx(4.0, abs=1.5)
    assert cost["per_padded_token_ms"] == pytest.approx(0.04, rel=0.25)
    assert cost["overhead_tokens"] == pytest.approx(100, rel=0.5)


def test_a_forward_whose_time_does_not_grow_with_tokens_is_never_split():
    cost = measure_forward_cost(Timed(fixed=0.003, per_token=0.0))
    assert cost == {"fixed_ms": None, "per_padded_token_ms": None, "overhead_tokens": None} or (
        cost["overhead_tokens"] > 1000  # sleep jitter may make the larger forward a hair slower
    )


def test_a_model_without_probe_rows_reports_nothing():
    class Bare:
        def run(self, rows):
            raise AssertionError("nothing to time: no forward runs")

        def probe_items(self):
            return []  # LoadedModel's default

    assert measure_forward_cost(Bare()) == {
        "fixed_ms": None,
        "per_padded_token_ms": None,
        "overhead_tokens": None,
    }


class Clocked:
    """A model whose forward advances a fake clock by ``fixed + per_token * padded`` ms,
    recording the padded size of every forward."""

    def __init__(self, fixed_ms: float, per_token_ms: float, lengths=(2, 9, 16, 30)):
        self.fixed, self.per_token, self.lengths = fixed_ms, per_token_ms, lengths
        self.now = 0.0
        self.padded: list[int] = []

    def perf_counter(self) -> float:
        return self.now / 1000

    def probe_items(self):
        return [WorkItem(tuple(range(n)), None, f"r{n}") for n in self.lengths]

    def run(self, rows):
        padded = len(rows) * max(r.tokens for r in rows)
        self.padded.append(padded)
        self.now += self.fixed + self.per_token * padded
        return [None] * len(rows)


def clocked(monkeypatch, model: Clocked) -> dict:
    monkeypatch.setattr(probes, "time", model)
    return measure_forward_cost(model)


def test_the_larger_forward_grows_only_until_it_takes_long_enough(monkeypatch):
    # 4 rows padded to 30 = 120 tokens: 4 + 0.04 * 120 = 8.8 ms; doubled: 13.6, 23.2,
    # 42.4 ms (960 tokens): below 50 ms, but one more doubling would pass 1024 tokens.
    model = Clocked(fixed_ms=4.0, per_token_ms=0.04)
    cost = clocked(monkeypatch, model)
    assert model.padded == [2, 120, 240, 480, 960] + [2, 960] * probes.FORWARD_COST_REPEATS
    assert cost == {"fixed_ms": 4.0, "per_padded_token_ms": 0.04, "overhead_tokens": 100.0}


def test_a_slow_forward_is_timed_on_the_probe_rows_alone(monkeypatch):
    # 120 tokens take 4 + 0.5 * 120 = 64 ms >= FORWARD_COST_MIN_MS: no doubling.
    model = Clocked(fixed_ms=4.0, per_token_ms=0.5)
    cost = clocked(monkeypatch, model)
    assert probes.FORWARD_COST_MIN_MS == 50.0
    assert model.padded == [2, 120] + [2, 120] * probes.FORWARD_COST_REPEATS
    assert cost == {"fixed_ms": 4.0, "per_padded_token_ms": 0.5, "overhead_tokens": 8.0}
