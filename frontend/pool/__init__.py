"""Replica pools: one per logical deployment, spreading exchanges over its workers
(:mod:`.pool`), one exchange through one worker (:mod:`.transport`) and the result
cache of a single-worker deployment (:mod:`.cache`)."""

from .pool import (
    BadReply,
    Overloaded,
    PoolError,
    ReplicaPool,
    TimedOut,
    TooLarge,
    Unavailable,
)
from .transport import Reply

__all__ = [
    "BadReply",
    "Overloaded",
    "PoolError",
    "ReplicaPool",
    "Reply",
    "TimedOut",
    "TooLarge",
    "Unavailable",
]
