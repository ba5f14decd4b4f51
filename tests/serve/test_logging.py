"""The runtime's log setup (``vllm_srun.serve.main.configure_logging``): a Python warning a
library emits is one line in the log's own format, not raw text on stderr (urllib3's
SOCKS warning, printed by a worker importing requests, broke the one-format promise)."""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Iterator

import pytest

from vllm_srun.serve.main import TEXT_FORMAT, configure_logging

LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING py\.warnings: ")


@pytest.fixture
def restored() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    # An earlier in-process server of this test process may have left the capture on,
    # over a showwarning pytest has since restored: start from it off.
    logging.captureWarnings(False)
    try:
        yield
    finally:
        logging.captureWarnings(False)
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)


def test_a_library_warning_is_one_line_in_the_log_format(restored, capsys) -> None:
    assert TEXT_FORMAT == "%(asctime)s %(levelname)s %(name)s: %(message)s"
    configure_logging("info", "text")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("SOCKS support needs an optional dependency", DeprecationWarning, 1)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert LINE.match(lines[0]), lines
    assert re.search(
        r"test_logging\.py:\d+: DeprecationWarning: SOCKS support needs an optional dependency$",
        lines[0],
    ), lines
