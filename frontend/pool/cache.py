"""The result cache of a single-worker deployment: decisions and classify answers by
their exact request, least recently used out first.

Only a deployment served by one worker keeps one (a pool of several relies on its
workers' own caches); the pool clears it whenever the deployment's readiness changes,
so an answer never outlives the model that gave it.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Mapping

from .transport import Reply

ENVIRONMENT = "VLLM_SRUN_RESULT_CACHE"
DEFAULT_ENTRIES = 4096
CACHED_SURFACES = ("decisions", "classify")
"""The surfaces whose answers are cached (a model's answer to the same request is the same)."""


def entries_from_environment(environ: Mapping[str, str] | None = None) -> int:
    """:data:`ENVIRONMENT` as a number of entries (``0`` disables the cache).

    Raises:
        ValueError: not a non-negative integer.
    """
    value = (os.environ if environ is None else environ).get(ENVIRONMENT, "").strip()
    if not value:
        return DEFAULT_ENTRIES
    try:
        entries = int(value)
    except ValueError:
        entries = -1
    if entries < 0:
        raise ValueError(
            f"{ENVIRONMENT} must be a non-negative number of entries (0 disables the cache), "
            f"not {value!r}"
        )
    return entries


class ResultCache:
    """At most ``entries`` answers (status 200) by ``(path, request body)``."""

    def __init__(self, entries: int) -> None:
        self.entries = entries
        self._answers: OrderedDict[bytes, Reply] = OrderedDict()

    def __len__(self) -> int:
        return len(self._answers)

    @staticmethod
    def key(path: str, raw: bytes) -> bytes:
        """The key of a request: its path and its body's bytes."""
        return path.encode() + b"\n" + raw

    def get(self, key: bytes) -> Reply | None:
        """The answer stored under ``key`` (now the most recently used), or ``None``."""
        reply = self._answers.get(key)
        if reply is not None:
            self._answers.move_to_end(key)
        return reply

    def put(self, key: bytes, reply: Reply) -> None:
        """Store a 200 answer (others are not kept), evicting the least recently used."""
        if self.entries <= 0 or reply.status != 200:
            return
        self._answers[key] = reply
        self._answers.move_to_end(key)
        while len(self._answers) > self.entries:
            self._answers.popitem(last=False)

    def clear(self) -> None:
        self._answers.clear()
