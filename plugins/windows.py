"""Windowing: cover a long token sequence with overlapping windows, and merge back.

Pure helpers for families that read inputs longer than a model's limit. All
positions are content-token indices (special tokens excluded), end exclusive.
"""

from __future__ import annotations

DEFAULT_OVERLAP = 64
"""Content tokens two neighbouring windows share unless a request says otherwise."""

DEFAULT_SCAN_BUDGET = 32768
"""Content tokens a windowed input may have unless ``max_tokens`` says otherwise."""


def plan_windows(length: int, size: int, overlap: int) -> list[tuple[int, int]]:
    """``[start, end)`` content ranges of at most ``size`` tokens covering ``length`` tokens.

    Neighbours overlap by ``overlap`` tokens; the last window ends at
    ``length`` (it may then overlap its neighbour by more). An empty input is
    one empty window.

    Raises:
        ValueError: ``size < 1`` or ``overlap`` not in ``[0, size)``.
    """
    if size < 1:
        raise ValueError(f"window size must be at least 1 content token, not {size}")
    if not 0 <= overlap < size:
        raise ValueError(
            f"window overlap must be at least 0 and below the size {size}, not {overlap}"
        )
    if length <= size:
        return [(0, length)]
    step = size - overlap
    windows = []
    start = 0
    while True:
        end = start + size
        if end >= length:
            windows.append((length - size, length))
            return windows
        windows.append((start, end))
        start += step


def most_central(windows: list[tuple[int, int]], length: int) -> list[int]:
    """For each content token, the index of the window in which it sits most centrally.

    Centrality is the distance to the nearer window edge (``min(i - start,
    end - 1 - i)``); ties go to the earlier window. Every token of
    ``range(length)`` must be covered.

    Raises:
        ValueError: a token is in no window.
    """
    chosen = [-1] * length
    margins = [-1] * length
    for w, (start, end) in enumerate(windows):  # linear in the tokens the windows cover
        for i in range(max(start, 0), min(end, length)):
            margin = min(i - start, end - 1 - i)
            if margin > margins[i]:
                chosen[i], margins[i] = w, margin
    if -1 in chosen:
        raise ValueError(f"content token {chosen.index(-1)} is in no window")
    return chosen
