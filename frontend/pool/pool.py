"""A logical deployment's replicas as one pool: admission, choice, back-off, compatibility.

The dispatch unit is one HTTP exchange (a surface request, a fused batch, a bundle);
what it costs is its body's bytes. A replica is eligible while its worker is ready,
its card is compatible with the pool, it is not in back-off and it holds fewer than
:data:`MAX_INFLIGHT` exchanges; the eligible replica with the fewest outstanding bytes
takes the exchange, ties to the one assigned least recently (one sequence for the
whole process). There is no pool queue: when no replica is eligible the caller hears
at once, :class:`Overloaded` when some replica is ready (all of them full),
:class:`Unavailable` when none is.

A dispatch that fails (a 5xx, an answer that breaks off or cannot be read, a timeout
while the caller still waited) puts its replica in back-off, 100 ms doubling per
consecutive failure up to 3.2 s, and asks the health poller for a probe; an ``ok``
ends the back-off.

A replica that holds exchanges and has answered none for far longer than its answers
usually take is **suspect** (:mod:`vllm_sr.workers.liveness`): while another replica is
not, it takes no new exchange, counts as not ready (``stalled``), and every exchange
waiting on it is sent again to another replica (inference is idempotent; the first
exchange is left to finish, and its answer, if it ever comes, clears the suspicion).
Becoming suspect asks the health poller for a short probe; a suspect replica whose
probe fails is ``unreachable`` even when every replica is suspect. A suspect replica
whose probe answers, with no other replica to take its work, keeps its exchanges (busy
on a long request, not stopped).

Why one module of 700-odd lines: :class:`ReplicaPool` is one piece of state (each
replica's exchanges, outstanding bytes, back-off and suspicion) that the choice, the
dispatch, the compatibility check and the states it reports all read; apart, each would
keep its own idea of which replica may take work. The transport, the result cache and the
liveness rule already live in modules of their own.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..metrics import Metrics, PoolSample, ReplicaSample
from ..workers.worker import Worker
from . import transport
from .cache import CACHED_SURFACES, ResultCache, entries_from_environment
from .transport import Reply

MAX_INFLIGHT = 32
"""Exchanges one replica may hold at once (not its forward concurrency)."""

MAX_REQUEST_BYTES = 64 * 1024 * 1024
"""The largest request body a pool sends (what the frontend gives managed workers)."""

BACKOFF_BASE = 0.1
BACKOFF_DOUBLINGS = 5
"""Back-off after ``n`` consecutive failures: ``BACKOFF_BASE * 2 ** min(n - 1, 5)`` s."""

RETRY_AFTER_SECONDS = 1
"""``Retry-After`` of an overloaded or unavailable pool (a back-off says its own)."""

DEFAULT_BUNDLE_TASKS = 64
"""A worker's bundle cap when it has not said its own (``limits.max_bundle_tasks``)."""

IGNORED_CARD_KEYS = frozenset(
    {"id", "device", "accelerator", "engine", "dtype", "status", "reason", "ready"}
    # Beyond the digest's list: what differs between two workers of the same model by
    # the clock or by the hardware they run on (``forward_cost`` is measured at load),
    # never by what they answer.
    | {"created", "accelerator_validated", "golden", "plugins", "forward_cost"}
    # Measured at load on the worker's own hardware and threads (the batched-vs-alone
    # deviation of the load-time probe): two replicas of one build differ in the last
    # digits.
    | {"batch_invariance"}
)
"""Card keys two replicas of one pool may differ in."""

FAILED_OUTCOMES = ("failed", "timeout")
"""Outcomes that put a replica in back-off."""

# Reasons a ready replica is kept out of its pool.
WRONG_ARTIFACT = "replica artifact does not match deployment"
WRONG_REVISION = "replica revision does not match deployment"
WRONG_PROFILE = "replica profile does not match deployment"
NO_IDENTITY = "replica does not report model identity"
DIFFERENT = "replica identity or capabilities differ from pool"
IN_BACKOFF = "replica is in health backoff"
STALLED = "stalled"
"""The state a suspect replica shows while another replica takes its work."""

STALL_RECHECK_S = 0.25
"""How often an exchange waiting on a suspect replica looks again for another replica."""

_sequence = itertools.count(1)


def next_assignment() -> int:
    """The next number of the process-wide dispatch sequence (shared by every pool,
    so a new pool over the same workers keeps rotating)."""
    return next(_sequence)


def backoff_seconds(failures: int) -> float:
    """The back-off after ``failures`` consecutive failed dispatches (at least one)."""
    return BACKOFF_BASE * (1 << min(max(failures, 1) - 1, BACKOFF_DOUBLINGS))


class PoolError(Exception):
    """A request the pool did not answer with a worker's reply.

    Attributes:
        status: the HTTP status that says it.
        code: a short machine-readable name.
        retry_after: seconds a client should wait (``Retry-After``), or ``None``.
    """

    status = 503
    code = "unavailable"

    def __init__(self, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Overloaded(PoolError):
    """Every ready replica holds :data:`MAX_INFLIGHT` exchanges (429)."""

    status = 429
    code = "overloaded"


class Unavailable(PoolError):
    """No replica is ready, or the one chosen could not be reached or answer (503)."""

    status = 503
    code = "unavailable"


class TimedOut(Unavailable):
    """The replica chosen gave no whole answer in time (503)."""

    code = "timeout"


class TooLarge(PoolError):
    """A body over :data:`MAX_REQUEST_BYTES` (413)."""

    status = 413
    code = "request_too_large"


class BadReply(PoolError):
    """The worker answered 2xx with something that is not a JSON object (502)."""

    status = 502
    code = "invalid_runtime_response"


@dataclass(eq=False)
class _Replica:
    """The pool's bookkeeping of one worker."""

    worker: Worker
    inflight: int = 0
    outstanding: int = 0
    assigned: int = 0
    failures: int = 0
    backoff_until: float = 0.0
    seen_card: dict[str, Any] | None = None
    refusal: str = ""
    retiring: bool = False
    idle: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class _Exchange:
    """One exchange sent to a replica: what its end settles."""

    replica: _Replica
    cost: int
    surface: str
    token: int = 0
    started: float = field(default_factory=time.perf_counter)


def _status_outcome(status: int) -> str:
    """An answered exchange's outcome by its HTTP status."""
    return "ok" if status < 400 else "rejected" if status < 500 else "failed"


def _ended_as(send: asyncio.Future[Reply]) -> tuple[str, Reply | None, bool]:
    """How an ended exchange went: its outcome, its reply, and whether the worker answered
    (any status, or an answer that could not be read)."""
    if send.cancelled():
        return "canceled", None, False
    error = send.exception()
    if error is None:
        reply = send.result()
        return _status_outcome(reply.status), reply, True
    if isinstance(error, transport.ExchangeTimeout):
        return "timeout", None, False
    return "failed", None, isinstance(error, transport.InvalidReply)


def _comparable(card: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in card.items() if k not in IGNORED_CARD_KEYS}


class ReplicaPool:
    """The replicas of one logical deployment, answering as one.

    Args:
        deployment: the logical deployment's name (the metrics' and inventory's).
        workers: its replicas (at least one), kept up to date by someone else.
        metrics: where exchanges are counted (``None``: nowhere).
        public_name: the id clients name it by (the native API's ``model``).
        served_name: the deployment-level served name the inventory shows (default:
            the first worker's).
        artifact: the declared artifact; an attached replica's card ``repo`` must equal it.
        revision: the declared revision, if any; every replica's card must report it.
        profile: the declared profile; every replica's card must report it.
        input_defaults: the deployment's ``input`` (``max_tokens``, ``overflow``): the
            ``options`` a classify, embeddings or rerank request (or bundle task) gets
            when it chooses neither (:func:`.transport.request_for`).
        cache_entries: the result cache's size for a single worker (``None``: from
            ``VLLM_SRUN_RESULT_CACHE``; 0 disables it). Pools of several bypass it.
        clock: monotonic seconds (back-off); tests inject their own.
        previous: the pool this one succeeds (a reload): the workers both hold keep
            one bookkeeping (requests in flight, back-off), shared by the two pools
            while the old one finishes its requests.
        watch: show the pool's gauges now (a reload shows them once it publishes it,
            :meth:`~vllm_sr.metrics.Metrics.watch`).

    Raises:
        ValueError: no workers, a worker of another deployment, or a bad
            ``VLLM_SRUN_RESULT_CACHE``.
    """

    def __init__(
        self,
        deployment: str,
        workers: Sequence[Worker],
        metrics: Metrics | None = None,
        *,
        public_name: str,
        served_name: str | None = None,
        artifact: str | None = None,
        revision: str | None = None,
        profile: str = "exact",
        input_defaults: Mapping[str, Any] | None = None,
        cache_entries: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        previous: ReplicaPool | None = None,
        watch: bool = True,
    ) -> None:
        if not workers:
            raise ValueError(f"deployment {deployment!r}: a pool needs at least one worker")
        strangers = [w.replica_id for w in workers if w.deployment != deployment]
        if strangers:
            raise ValueError(f"deployment {deployment!r}: replicas {strangers} serve another one")
        self._deployment = deployment
        self.public_name = public_name
        self.served_name = served_name if served_name is not None else workers[0].served_name
        self.artifact = artifact
        self.revision = revision
        self.profile = profile
        self.input_defaults = dict(input_defaults or {})
        self.metrics = metrics
        self.clock = clock
        kept: dict[int, _Replica] = {}
        if previous is not None:
            kept = {id(r.worker): r for r in previous.replicas()}
        self._replicas: list[_Replica] = [kept.get(id(w)) or _Replica(w) for w in workers]
        for replica in self._replicas:
            if replica.inflight == 0:
                replica.idle.set()
        self._baseline: dict[str, Any] | None = None
        self._baseline_card: dict[str, Any] | None = None
        entries = entries_from_environment() if cache_entries is None else cache_entries
        self._cache = ResultCache(entries) if len(workers) == 1 and entries > 0 else None
        self._cache_seen = -1
        if metrics is not None and watch:
            metrics.watch(self)

    # -- what it is ------------------------------------------------------------------------
    @property
    def deployment(self) -> str:
        return self._deployment

    @property
    def workers(self) -> tuple[Worker, ...]:
        return tuple(r.worker for r in self._replicas)

    @property
    def card(self) -> dict[str, Any] | None:
        """The pool's baseline card (the first compatible replica's), once one was ready."""
        self._check()
        return self._baseline_card

    @property
    def bundle_limit(self) -> int:
        """The most tasks one bundle exchange may carry: the smallest ``max_bundle_tasks``
        of the replicas that take exchanges now (of all of them when none does)."""
        now = self.clock()
        usable = self._usable(now) or self._replicas
        return min(
            int(r.worker.limits.get("max_bundle_tasks") or DEFAULT_BUNDLE_TASKS) for r in usable
        )

    # -- compatibility and readiness ----------------------------------------------------------
    def _check(self) -> None:
        """Refresh each ready replica's compatibility with the pool (cards seen once)."""
        several = len(self._replicas) > 1
        if self._baseline_card is not None and not any(
            r.worker.ready and r.worker.card is self._baseline_card for r in self._replicas
        ):
            # The replica the others were compared with is gone (or reloaded): judge every
            # ready replica again, against the first compatible one.
            self._baseline = self._baseline_card = None
            for replica in self._replicas:
                replica.seen_card = None
        for replica in self._replicas:
            card = replica.worker.card
            if not replica.worker.ready or card is None:
                replica.refusal, replica.seen_card = "", None
                continue
            if card is replica.seen_card and (replica.refusal or self._baseline is not None):
                continue
            replica.seen_card = card
            replica.refusal = self._refusal(replica.worker, card) if several else ""
            if replica.refusal:
                continue
            comparable = _comparable(card)
            if self._baseline is None or not several:
                self._baseline, self._baseline_card = comparable, card
            elif comparable != self._baseline:
                replica.refusal = DIFFERENT

    def _refusal(self, worker: Worker, card: Mapping[str, Any]) -> str:
        if not worker.managed and self.artifact is not None and card.get("repo") != self.artifact:
            return WRONG_ARTIFACT
        if self.revision and card.get("revision") != self.revision:
            return WRONG_REVISION
        if (card.get("profile") or "exact") != self.profile:
            return WRONG_PROFILE
        if not card.get("model_sha256"):
            return NO_IDENTITY
        return ""

    def _compatible(self, replica: _Replica) -> bool:
        return replica.worker.ready and not replica.refusal

    def _usable(self, now: float) -> list[_Replica]:
        """Ready, compatible replicas not in back-off, and not suspect while another one
        is not (what "ready" means to the pool)."""
        self._check()
        usable = [r for r in self._replicas if self._compatible(r) and r.backoff_until <= now]
        answering = [r for r in usable if not r.worker.liveness.suspect()]
        return answering or usable

    def _stalled(self, replica: _Replica, now: float) -> bool:
        """Suspect while another usable replica is not: it takes no new exchange."""
        if not replica.worker.liveness.suspect():
            return False
        return any(
            r is not replica
            and self._compatible(r)
            and r.backoff_until <= now
            and not r.worker.liveness.suspect()
            for r in self._replicas
        )

    def refusal(self, worker: Worker) -> str:
        """Why a ready ``worker`` is kept out of the pool now (``""`` when it is not).

        Raises:
            ValueError: ``worker`` is not in this pool.
        """
        self._check()
        replica = self._replica_of(worker)
        if replica.refusal:
            return replica.refusal
        if self._compatible(replica) and replica.backoff_until > self.clock():
            return IN_BACKOFF
        if self._compatible(replica) and self._stalled(replica, self.clock()):
            return replica.worker.liveness.why()
        return ""

    @property
    def ready(self) -> bool:
        """At least one replica takes exchanges."""
        return bool(self._usable(self.clock()))

    def _replica_states(self) -> list[dict[str, Any]]:
        now = self.clock()
        self._check()
        entries = []
        for r in self._replicas:
            w = r.worker
            state, reason = w.state, w.reason
            ready = self._compatible(r)
            if ready and r.backoff_until > now:
                ready, state, reason = False, "backoff", IN_BACKOFF
            elif ready and self._stalled(r, now):
                reason = w.liveness.why() + "; new requests go to the other replicas"
                ready, state = False, STALLED
            elif r.refusal:
                state, reason = "incompatible", r.refusal
            device = (w.card or {}).get("device") or w.device or ""
            entries.append(
                {
                    "id": w.replica_id,
                    "managed": w.managed,
                    "device": device,
                    "ready": ready,
                    "state": state,
                    "reason": reason,
                    "inflight": r.inflight,
                    "estimated_work": r.outstanding,
                    "restarts": w.restarts,
                }
            )
        return entries

    @staticmethod
    def _summary(replicas: list[dict[str, Any]]) -> tuple[str, str]:
        ready = sum(1 for r in replicas if r["ready"])
        if ready == len(replicas):
            return "ready", ""
        missing = "; ".join(
            f"{r['id']} {r['state']}" + (f": {r['reason']}" if r["reason"] else "")
            for r in replicas
            if not r["ready"]
        )
        if ready:
            return "degraded", f"{ready} of {len(replicas)} replicas ready; {missing}"
        states = {r["state"] for r in replicas}
        if len(states) == 1:  # one replica, or all of them in the same state
            reason = next((r["reason"] for r in replicas if r["reason"]), "")
            return str(replicas[0]["state"]), str(reason)
        return "unavailable", f"no replica is ready; {missing}"

    @property
    def state(self) -> str:
        """``ready`` (every replica), ``degraded`` (some), else the state every replica
        is in (the single replica's own), or ``unavailable``."""
        return self._summary(self._replica_states())[0]

    @property
    def reason(self) -> str:
        """Why the pool is not ``ready`` (``""`` when it is)."""
        return self._summary(self._replica_states())[1]

    def sample(self) -> PoolSample:
        """The pool's gauges (for :class:`~vllm_sr.metrics.Metrics`)."""
        replicas = self._replica_states()
        return PoolSample(
            deployment=self.deployment,
            ready=any(r["ready"] for r in replicas),
            restarts=sum(int(r["restarts"]) for r in replicas),
            replicas=tuple(
                ReplicaSample(r["id"], bool(r["ready"]), r["inflight"], r["estimated_work"])
                for r in replicas
            ),
        )

    def inventory(self) -> dict[str, Any]:
        """The deployment's inventory entry (``GET /api/v1/inventory/model-runtime``): no
        socket path, no credential; the card fields empty until a replica is ready."""
        replicas = self._replica_states()
        state, reason = self._summary(replicas)
        first = self._replicas[0].worker
        card = self._baseline_card or {}
        entry: dict[str, Any] = {
            "name": self.deployment,
            "managed": any(r.worker.managed for r in self._replicas),
            "process": first.process,
            "served_name": self.served_name,
            "endpoint": first.shown_endpoint(),
            "ready": any(r["ready"] for r in replicas),
            "state": state,
            "reason": reason,
            "restarts": sum(int(r["restarts"]) for r in replicas),
            "desired_replicas": len(replicas),
            "ready_replicas": sum(1 for r in replicas if r["ready"]),
            "family": card.get("family") or "",
            "repo": card.get("repo") or "",
            "revision": card.get("revision") or "",
            "surfaces": list(card.get("surfaces") or []),
            "heads": [
                {"name": h.get("name"), "kind": h.get("kind"), "labels": h.get("labels") or []}
                for h in card.get("heads") or []
                if isinstance(h, dict)
            ],
            "device": replicas[0]["device"] if len(replicas) == 1 else first.device or "",
            "profile": card.get("profile") or "",
            "engine": card.get("engine") or "",
        }
        embedding = card.get("embedding")
        if isinstance(embedding, dict):
            entry["embedding"] = {
                k: list(embedding.get(k) or []) for k in ("dimensions", "layers", "modalities")
            }
        rerank = card.get("rerank")
        if isinstance(rerank, dict):
            exits = [e for e in rerank.get("exits") or [] if isinstance(e, dict)]
            default = rerank.get("default") if isinstance(rerank.get("default"), dict) else {}
            entry["rerank"] = {
                "default_layer": (default or {}).get("layer"),
                "layers": [e.get("layer") for e in exits],
            }
        if replicas:
            entry["replicas"] = replicas
        return entry

    # -- reloads -----------------------------------------------------------------------------
    def retire(self, worker: Worker) -> None:
        """Send ``worker`` no new exchange while another replica can take it (a reload
        removed it; the requests this pool already admitted still finish)."""
        self._replica_of(worker).retiring = True

    async def drained(self, worker: Worker) -> None:
        """Wait until ``worker`` holds no exchange of this pool (nor of a pool sharing its
        bookkeeping)."""
        await self._replica_of(worker).idle.wait()

    def replicas(self) -> tuple[_Replica, ...]:
        """The pool's bookkeeping of each worker (a successor pool shares it)."""
        return tuple(self._replicas)

    def _replica_of(self, worker: Worker) -> _Replica:
        for replica in self._replicas:
            if replica.worker is worker:
                return replica
        raise ValueError(f"worker {worker.replica_id} is not in pool {self.deployment!r}")

    # -- dispatch ----------------------------------------------------------------------------
    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.request(self.deployment, outcome)

    def _choose(self) -> _Replica:
        now = self.clock()
        self._check()
        compatible = [r for r in self._replicas if self._compatible(r)]
        staying = [r for r in compatible if not r.retiring]
        if staying:  # a retiring replica takes an exchange only when nothing else can
            compatible = staying
        usable = [r for r in compatible if r.backoff_until <= now]
        answering = [r for r in usable if not r.worker.liveness.suspect()]
        usable = answering or usable
        if not usable:
            self._count("unavailable")
            waits = [r.backoff_until - now for r in compatible]
            retry = max(RETRY_AFTER_SECONDS, math.ceil(min(waits))) if waits else None
            message = "every ready replica is in back-off" if waits else "no replica is ready"
            raise Unavailable(message, retry or RETRY_AFTER_SECONDS)
        best: _Replica | None = None
        for r in usable:
            if r.inflight >= MAX_INFLIGHT:
                continue
            if best is None or (r.outstanding, r.assigned) < (best.outstanding, best.assigned):
                best = r
        if best is None:
            self._count("overloaded")
            raise Overloaded(
                f"every ready replica holds {MAX_INFLIGHT} requests", RETRY_AFTER_SECONDS
            )
        return best

    def _release(self, replica: _Replica, cost: int, outcome: str) -> None:
        replica.inflight -= 1
        replica.outstanding -= cost
        if replica.inflight == 0:
            replica.idle.set()
        if outcome == "ok":
            replica.failures, replica.backoff_until = 0, 0.0
        elif outcome in FAILED_OUTCOMES:
            replica.failures += 1
            replica.backoff_until = self.clock() + backoff_seconds(replica.failures)
            replica.worker.request_probe()

    def _cache_for(self, surface: str) -> ResultCache | None:
        if self._cache is None or surface not in CACHED_SURFACES:
            return None
        worker = self._replicas[0].worker
        if worker.changes != self._cache_seen:
            self._cache.clear()
            self._cache_seen = worker.changes
        return self._cache

    async def exchange(self, surface: str, path: str, raw: bytes, *, timeout: float) -> Reply:
        """Send one request to the replica chosen for it; its reply, ``model`` rewritten
        to :attr:`public_name`.

        Args:
            surface: ``decisions``, ``classify``, ``embeddings``, ``rerank`` or ``bundle``.
            path: the worker route (``/v1/systemone``, ``/v1/bundle``, ...).
            raw: the request, a JSON object as the client sent it (only its ``model``
                selectors change, per worker); its length is the exchange's cost.
            timeout: seconds the caller waits for the whole answer.

        Raises:
            TooLarge: a body over :data:`MAX_REQUEST_BYTES`.
            Overloaded: every ready replica is full.
            Unavailable: no replica is ready, or the one chosen could not be reached or
                broke off (:class:`TimedOut`: gave no answer in time).
            BadReply: a 2xx answer that is not a JSON object.
            ValueError: ``raw`` is not a JSON object.
        """
        cost = max(1, len(raw))
        if cost > MAX_REQUEST_BYTES:
            self._count("rejected")
            raise TooLarge(f"a request body is at most {MAX_REQUEST_BYTES} bytes, not {cost}")
        cache = self._cache_for(surface)
        key = cache.key(path, raw) if cache is not None else b""
        if cache is not None and self.ready:
            hit = cache.get(key)
            if self.metrics is not None:
                self.metrics.cache_lookup(self.deployment, hit is not None)
            if hit is not None:
                self._count("ok")
                return Reply(hit.status, hit.content, dict(hit.headers), cached=True)
        deadline = time.perf_counter() + timeout
        for attempt in itertools.count(1):
            replica = self._choose()
            reply = await self._dispatch(replica, cost, surface, path, raw, deadline, attempt)
            if reply is not None:
                if cache is not None and reply.status == 200:
                    cache.put(key, reply)
                return reply
        raise AssertionError("unreachable")  # pragma: no cover

    async def _dispatch(
        self,
        replica: _Replica,
        cost: int,
        surface: str,
        path: str,
        raw: bytes,
        deadline: float,
        attempt: int,
    ) -> Reply | None:
        """One exchange with ``replica``; ``None`` when another replica may take it: it
        never reached the worker, or the replica stalled (the exchange is left to finish).

        Raises:
            ValueError: ``raw`` is not a JSON object (before anything is admitted).
        """
        payload = transport.request_for(
            surface, raw, replica.worker.served_name, self.input_defaults
        )
        replica.inflight += 1
        replica.idle.clear()
        replica.outstanding += cost
        replica.assigned = next_assignment()
        exchange = _Exchange(replica, cost, surface, replica.worker.liveness.sent())
        send = asyncio.ensure_future(
            transport.send(
                replica.worker,
                surface,
                path,
                payload,
                public_name=self.public_name,
                timeout=max(0.0, deadline - time.perf_counter()),
            )
        )
        resent = retried = cancelled = False
        try:
            if not await self._answered_or_stalled(replica, send, attempt):
                resent = True  # the first exchange finishes on its own
                send.add_done_callback(lambda done: self._ended(exchange, *_ended_as(done)))
                return None
            return send.result()
        except transport.ExchangeTimeout as err:
            raise TimedOut(str(err), RETRY_AFTER_SECONDS) from err
        except transport.TransportError as err:
            others = [r for r in self._usable(self.clock()) if r is not replica]
            if not err.sent and others and attempt < len(self._replicas):
                retried = True  # counted as failed for this replica, not for the request
                return None
            raise Unavailable(str(err), RETRY_AFTER_SECONDS) from err
        except transport.InvalidReply as err:
            raise BadReply(str(err)) from err
        except asyncio.CancelledError:
            cancelled = True
            send.cancel()
            raise
        finally:
            if not resent:
                ended = ("canceled", None, False) if cancelled else _ended_as(send)
                self._ended(exchange, *ended)
                if self.metrics is not None and not retried:
                    outcome = ended[0]
                    self.metrics.request(
                        self.deployment, "cancelled" if outcome == "canceled" else outcome
                    )

    async def _answered_or_stalled(
        self, replica: _Replica, send: asyncio.Future[Reply], attempt: int
    ) -> bool:
        """Wait for ``send`` to end (``True``), or until ``replica`` is stalled while
        another replica answers and the exchange may go there, or is suspect and its
        probe failed (``False``: another replica takes it, or the caller hears 503 now
        rather than at its deadline). Becoming suspect asks the health poller for a
        probe."""
        liveness, asked = replica.worker.liveness, False
        while True:
            wait = liveness.until_suspect()
            done, _ = await asyncio.wait({send}, timeout=wait or STALL_RECHECK_S)
            if done:
                return True
            if not liveness.suspect():
                continue
            if not asked:
                replica.worker.request_probe()
                asked = True
            if replica.worker.state == "unreachable":
                return False  # its probe failed too: another replica, or 503 at once
            if attempt < 2 * len(self._replicas) and self._stalled(replica, self.clock()):
                return False

    def _ended(
        self, exchange: _Exchange, outcome: str, reply: Reply | None, answered: bool
    ) -> None:
        """One exchange's end, awaited or left to finish after a resend: the replica's
        bookkeeping and liveness (``answered``: the worker sent an answer, whatever its
        status), back-off and the exchange's metrics."""
        replica, started = exchange.replica, exchange.started
        if answered:
            replica.worker.liveness.answered(exchange.token)
        else:
            replica.worker.liveness.abandoned(exchange.token)
        self._release(replica, exchange.cost, outcome)
        if self.metrics is not None:
            self.metrics.exchanged(
                self.deployment,
                replica.worker.replica_id,
                exchange.surface,
                outcome,
                reply.seconds if reply is not None else time.perf_counter() - started,
                reply.server_ms if reply is not None else None,
            )
