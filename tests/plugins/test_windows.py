import pytest

from vllm_srun.plugins.windows import most_central, plan_windows


def test_short_inputs_are_one_window():
    assert plan_windows(0, 10, 2) == [(0, 0)]
    assert plan_windows(10, 10, 2) == [(0, 10)]


def test_windows_overlap_and_the_last_ends_at_the_input_end():
    assert plan_windows(25, 10, 2) == [(0, 10), (8, 18), (15, 25)]
    assert plan_windows(26, 10, 0) == [(0, 10), (10, 20), (16, 26)]


def test_every_token_is_covered():
    for length in range(1, 60):
        windows = plan_windows(length, 7, 3)
        covered = {i for s, e in windows for i in range(s, e)}
        assert covered == set(range(length))
        assert all(e - s <= 7 for s, e in windows)


def test_bad_sizes():
    with pytest.raises(ValueError, match="window size must be at least 1"):
        plan_windows(5, 0, 0)
    with pytest.raises(ValueError, match="below the size 4, not 4"):
        plan_windows(5, 4, 4)


def test_most_central_picks_the_window_where_a_token_is_furthest_from_an_edge():
    windows = [(0, 10), (8, 18)]
    chosen = most_central(windows, 18)
    assert chosen[:8] == [0] * 8
    assert chosen[8] == 0  # margin 1 in window 0 (8..9 edge), 0 in window 1
    assert chosen[9] == 1  # margin 0 in window 0, 1 in window 1
    assert chosen[17] == 1
    with pytest.raises(ValueError, match="content token 5 is in no window"):
        most_central([(0, 5)], 6)
