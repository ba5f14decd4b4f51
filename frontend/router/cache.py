"""The in-memory response cache of the ``response_cache`` plugin (ROUTER-SPEC §2.7).

Entries are kept per decision and model, for non-streaming requests only, and only for
complete 2xx JSON answers. A lookup is:

- **exact**: the same request (every field but ``stream``, canonical JSON), decision,
  model and caller;
- **semantic**: the cosine of the evaluation text's embedding with an entry's at or above
  the threshold, **and** everything else about the request the same: the system and
  developer messages, the earlier turns, the generation parameters, the decision, the
  model, the caller (entries are scoped to the listener API key that made them) and the
  embedding model (an entry embedded by another model is never compared). Keying on the
  last user message alone would answer one persona's question for another.

Entries expire after ``ttl_seconds``; past ``max_entries`` the oldest (``fifo``) or the
least recently used (``lru``) goes.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..config.routing import Plugin
from .signals.calls import Unanswered, call

if TYPE_CHECKING:
    from .route import Routed, Router

DEFAULT_THRESHOLD = 0.5
"""The semantic threshold when neither the plugin nor ``global.stores.response_cache`` sets one."""


@dataclass
class Hit:
    """A cached answer: its body, and the similarity of a semantic hit (``None``: exact)."""

    body: bytes
    similarity: float | None = None


@dataclass
class _Entry:
    body: bytes
    expires: float
    group: str
    exact: str
    vector: list[float] | None


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _keys(body: Mapping[str, Any], routed: Routed, scope: str, embedder: str) -> tuple[str, str]:
    """(the group an entry may answer in semantically, the exact request key)."""
    request = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    messages = list(request.pop("messages", []))
    last_user = max(
        (i for i, m in enumerate(messages) if isinstance(m, Mapping) and m.get("role") == "user"),
        default=len(messages),
    )
    context = messages[:last_user] + messages[last_user + 1 :]
    decision = routed.decision.name if routed.decision is not None else ""
    model = routed.model.name if routed.model is not None else ""
    group = _digest([scope, decision, model, embedder, request, context])
    exact = _digest([scope, decision, model, request, messages])
    return group, exact


class ResponseCache:
    """Entries of every decision's ``response_cache`` (see the module docstring).

    Args:
        max_entries: entries kept at most.
        ttl_seconds: default lifetime of an entry (a plugin's ``ttl_seconds`` wins).
        eviction: ``fifo`` or ``lru``.
        threshold: the default semantic similarity threshold.
        clock: seconds, monotonic.
    """

    def __init__(
        self,
        max_entries: int = 1000,
        ttl_seconds: float = 3600.0,
        eviction: str = "fifo",
        threshold: float = DEFAULT_THRESHOLD,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_entries = max_entries
        self.ttl_seconds = ttl_seconds
        self.eviction = eviction
        self.threshold = threshold
        self.clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def _expire(self) -> None:
        now = self.clock()
        for key in [k for k, e in self._entries.items() if e.expires <= now]:
            del self._entries[key]

    async def _embedding(self, router: Router, routed: Routed) -> tuple[str, list[float]] | None:
        """The evaluation text's unit embedding and the embedder's identity, computed once
        per request (the lookup's is reused by the store)."""
        memo = routed.results.labels.get("cache_embedding")
        if memo is not None:
            return memo  # type: ignore[no-any-return]
        found = await self._embed(router, routed.texts.evaluation)
        routed.results.labels["cache_embedding"] = found
        return found

    async def _embed(self, router: Router, text: str) -> tuple[str, list[float]] | None:
        binding = router.setup.bindings.get("embedding")
        if binding is None or not text.strip():
            return None
        pool = router.setup.pools.get(binding.deployment)
        if pool is None:
            return None
        try:
            answer = await call(
                pool, "embeddings", "/v1/embeddings", {"input": [text]}, time.monotonic() + 5.0
            )
            vector = [float(v) for v in answer["data"][0]["embedding"]]
        except (Unanswered, KeyError, IndexError, TypeError, ValueError):
            return None
        norm = math.sqrt(sum(v * v for v in vector)) or 1.0
        identity = f"{binding.deployment}/{pool.public_name}/{answer.get('model', '')}"
        return identity, [v / norm for v in vector]

    @staticmethod
    def _mode(plugin: Plugin) -> str:
        return str(plugin.configuration.get("mode", "semantic"))

    async def lookup(
        self, router: Router, routed: Routed, body: Mapping[str, Any], scope: str, plugin: Plugin
    ) -> Hit | None:
        """The cached answer for this request, or ``None``."""
        self._expire()
        mode = self._mode(plugin)
        group, exact = _keys(body, routed, scope, "")
        if mode in ("exact", "exact_then_semantic"):
            for key, entry in self._entries.items():
                if entry.exact == exact:
                    self._touch(key)
                    return Hit(entry.body)
        if mode == "exact":
            return None
        embedded = await self._embedding(router, routed)
        if embedded is None:
            return None
        embedder, vector = embedded
        group, _ = _keys(body, routed, scope, embedder)
        semantic = plugin.configuration.get("semantic") or {}
        threshold = float(semantic.get("similarity_threshold", self.threshold))
        best: tuple[float, str] | None = None
        for key, entry in self._entries.items():
            if entry.group != group or entry.vector is None:
                continue
            similarity = sum(a * b for a, b in zip(vector, entry.vector, strict=True))
            if similarity >= threshold and (best is None or similarity > best[0]):
                best = (similarity, key)
        if best is None:
            return None
        self._touch(best[1])
        return Hit(self._entries[best[1]].body, best[0])

    def _touch(self, key: str) -> None:
        if self.eviction == "lru":
            self._entries.move_to_end(key)

    async def store(
        self,
        router: Router,
        routed: Routed,
        body: Mapping[str, Any],
        scope: str,
        plugin: Plugin,
        answer: bytes,
    ) -> None:
        """Keep a complete 2xx JSON answer (anything that is not a JSON object is not kept)."""
        try:
            if not isinstance(json.loads(answer), dict):
                return
        except ValueError:
            return
        vector = None
        embedder = ""
        if self._mode(plugin) != "exact":
            embedded = await self._embedding(router, routed)
            if embedded is not None:
                embedder, vector = embedded
        group, exact = _keys(body, routed, scope, embedder)
        ttl = float(plugin.configuration.get("ttl_seconds", self.ttl_seconds))
        key = hashlib.sha256(f"{exact}\x00{embedder}".encode()).hexdigest()
        self._entries.pop(key, None)
        self._entries[key] = _Entry(answer, self.clock() + ttl, group, exact, vector)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
