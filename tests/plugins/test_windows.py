"""Window plans over long inputs and the window each token is read from."""

from __future__ import annotations

import sys
from types import FrameType

import pytest

import vllm_srun.plugins.windows as windows_module
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


def test_one_token_past_the_size_gives_a_second_window_ending_at_the_input_end():
    assert plan_windows(11, 10, 2) == [(0, 10), (1, 11)]
    assert plan_windows(1, 1, 0) == [(0, 1)]
    assert plan_windows(3, 1, 0) == [(0, 1), (1, 2), (2, 3)]


# Hand-worked margins, min(i - start, end - 1 - i), one row per window (. = not covered).


def test_a_tie_between_equal_windows_goes_to_the_earlier_window():
    # token:  0 1 2 3 4 5 6 7 8 9 10 11 12 13 14
    # (0,10): 0 1 2 3 4 4 3 2 1 0  .  .  .  .  .
    # (5,15): . . . . . 0 1 2 3 4  4  3  2  1  0
    # token 7 ties at 2 -> window 0; token 8: 1 < 3 -> window 1.
    assert most_central([(0, 10), (5, 15)], 15) == [0] * 8 + [1] * 7


def test_a_tie_between_windows_of_unequal_length_goes_to_the_earlier_window():
    # token: 0 1 2 3 4 5 6
    # (0,6): 0 1 2 2 1 0 .
    # (3,7): . . . 0 1 1 0
    # token 4 ties at 1 -> window 0; token 5: 0 < 1 -> window 1.
    assert most_central([(0, 6), (3, 7)], 7) == [0, 0, 0, 0, 0, 1, 1]


def test_earlier_means_earlier_in_the_list_not_the_earlier_start():
    # The same two windows listed the other way round: token 4's tie goes to (3,7), now 0.
    # (3,7): . . . 0 1 1 0
    # (0,6): 0 1 2 2 1 0 .
    assert most_central([(3, 7), (0, 6)], 7) == [1, 1, 1, 1, 0, 0, 0]


def test_windows_past_the_ends_count_their_margin_from_their_own_edges():
    # length 8; (-2,6) starts before token 0 and (1,9) ends after token 7.
    # token:   0 1 2 3 4 5 6 7
    # (-2,6):  2 3 3 2 1 0 . .
    # (1,9):   . 0 1 2 3 3 2 1
    # token 3 ties at 2 -> window 0; token 4: 1 < 3 -> window 1.
    assert most_central([(-2, 6), (1, 9)], 8) == [0, 0, 0, 0, 1, 1, 1, 1]
    # (0,8):   0 1 2 3 3 2 1 0
    # (-4,4):  3 2 1 0 . . . .
    # Tokens 0 and 1 go to (-4,4); clipped to (0,4) its margins would be 0 1 1 0, ties
    # that the earlier window (0,8) would win.
    assert most_central([(0, 8), (-4, 4)], 8) == [1, 1, 0, 0, 0, 0, 0, 0]


def test_a_shorter_window_nested_at_the_start_wins_only_its_ties_by_coming_first():
    # token:  0 1 2 3 4 5 6 7 8 9
    # (0,4):  0 1 1 0 . . . . . .
    # (0,10): 0 1 2 3 4 4 3 2 1 0
    # tokens 0 and 1 tie -> window 0; from token 2 the long window is more central.
    assert most_central([(0, 4), (0, 10)], 10) == [0, 0] + [1] * 8
    assert most_central([(0, 10), (0, 4)], 10) == [0] * 10


def test_most_central_work_is_linear_in_the_tokens_the_windows_cover():
    # 200 one-token windows cover 200 tokens. Walking each window's own tokens runs the
    # loop body 200 times; walking every token from 0 to a window's end would run it
    # 200 * 201 / 2 = 20100 times, which on a 32768-token input costs seconds per request.
    windows = [(i, i + 1) for i in range(200)]
    source = windows_module.__file__
    lines = 0

    def local(frame: FrameType, event: str, arg: object) -> object:
        nonlocal lines
        if event == "line":
            lines += 1
        return local

    def trace(frame: FrameType, event: str, arg: object) -> object:
        return local if frame.f_code.co_filename == source else None

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        chosen = most_central(windows, 200)
    finally:
        sys.settrace(previous)
    assert chosen == list(range(200))
    assert 0 < lines < 20 * 200
