"""One model call of a signal: a JSON request to a deployment's pool, and why it went
unanswered when it did.

A signal never waits on a model that cannot answer: each call is bounded by the signals'
deadline, and every way it can fail maps to one of the reasons
``vsr_model_runtime_unknown_answers_total`` counts (``timeout``, ``unavailable``,
``overloaded``, ``rejected``, ``failed``).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Protocol

from ...pool.pool import BadReply, Overloaded, PoolError, TimedOut, TooLarge
from ...pool.transport import Reply


class Pool(Protocol):
    """What a signal needs of a deployment's pool (:class:`~vllm_sr.pool.ReplicaPool`)."""

    public_name: str

    @property
    def deployment(self) -> str: ...  # read-only on ReplicaPool

    async def exchange(self, surface: str, path: str, raw: bytes, *, timeout: float) -> Reply: ...


class Unanswered(Exception):
    """A model call that gave no usable answer.

    Attributes:
        reason: ``timeout``, ``unavailable``, ``overloaded``, ``rejected`` or ``failed``.
        deployment: the deployment called.
    """

    def __init__(self, deployment: str, reason: str, message: str = "") -> None:
        super().__init__(message or reason)
        self.deployment = deployment
        self.reason = reason


STATUS_REASONS = {429: "overloaded", 503: "unavailable", 504: "timeout", 413: "rejected"}
"""A worker's non-200 status and the reason it counts as."""


async def call(
    pool: Pool, surface: str, path: str, body: dict[str, Any], deadline: float
) -> dict[str, Any]:
    """Send ``body`` (its ``model`` set to the pool's public id) and return the answer.

    Args:
        pool: the deployment's pool.
        surface: ``decisions``, ``classify`` or ``embeddings``.
        path: the worker route.
        body: the request, without ``model``.
        deadline: ``time.monotonic()`` by which the answer must be in.

    Raises:
        Unanswered: no 200 JSON object in time, with the reason.
    """
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise Unanswered(pool.deployment, "timeout", "the signal deadline had passed")
    raw = json.dumps({"model": pool.public_name, **body}, ensure_ascii=False).encode()
    try:
        async with asyncio.timeout(remaining):
            reply = await pool.exchange(surface, path, raw, timeout=remaining)
    except (TimeoutError, TimedOut) as err:
        raise Unanswered(pool.deployment, "timeout", str(err)) from err
    except Overloaded as err:
        raise Unanswered(pool.deployment, "overloaded", str(err)) from err
    except TooLarge as err:
        raise Unanswered(pool.deployment, "rejected", str(err)) from err
    except BadReply as err:
        raise Unanswered(pool.deployment, "failed", str(err)) from err
    except PoolError as err:
        raise Unanswered(pool.deployment, "unavailable", str(err)) from err
    if reply.status != 200:
        reason = STATUS_REASONS.get(reply.status)
        if reason is None:
            reason = "rejected" if 400 <= reply.status < 500 else "failed"
        raise Unanswered(pool.deployment, reason, f"the worker answered {reply.status}")
    answer = reply.json()
    if not isinstance(answer, dict):
        raise Unanswered(pool.deployment, "failed", "the worker's answer is not a JSON object")
    return answer
