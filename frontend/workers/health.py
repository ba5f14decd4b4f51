"""Health polling: what state a worker's model is in, and its card once it is ready.

A poller asks ``GET /health`` every 500 ms while the model is not ready and every
5 s once it is, each call bounded by 2 s; a caller that saw a transport failure, or a
pool that finds the worker suspect (:mod:`.liveness`), asks for an early probe
(:meth:`~.worker.Worker.request_probe`). A probe of a suspect worker waits
:data:`~.liveness.SUSPECT_PROBE_TIMEOUT` only, and its failure makes the worker
``unreachable`` at once, and so does a probe already waiting when its worker turns
suspect, :data:`~.liveness.SUSPECT_PROBE_TIMEOUT` after it was sent. A slow answer
alone never does where the worker shows other signs of life: a ready worker that
answered a request while the probe waited stays ready, and one busy with requests
(outstanding, not suspect) is marked only after a second consecutive probe fails. A
ready model's card comes from ``GET /v1/models`` (with the model's entry in its Jev
model list, when the runtime gives one). A worker whose ``api_version`` major is not
the frontend's is ``incompatible``; one that does not list the model is ``missing``;
one that does not answer is ``unreachable`` (a managed worker that never answered
yet is still ``starting``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from .. import API_MAJOR
from .client import ConnectFailed, ExchangeBroken, ExchangeTimedOut, WireReply
from .liveness import SUSPECT_PROBE_TIMEOUT
from .worker import STATES, Worker

log = logging.getLogger("vllm_sr.workers")

FAST_INTERVAL = 0.5
"""Seconds between probes while the model is not ready."""

SLOW_INTERVAL = 5.0
"""Seconds between probes once it is."""

PROBE_TIMEOUT = 2.0
"""Longest wait for one ``/health`` or ``/v1/models`` answer, in seconds."""

SUSPECT_RECHECK_S = 0.05
"""The least wait between two checks of whether a probed worker turned suspect, in
seconds (a worker exactly at its threshold is not suspect yet)."""

HealthHook = Callable[[dict[str, Any]], None]


LISTING_KEYS = ("description", "release_date")
"""What the frontend keeps of a model's entry in a worker's Jev model list."""

MAX_LISTING_TEXT = 1000
"""The longest ``description`` or ``release_date`` kept (a longer one is left out)."""


def model_listing(document: Any, name: str) -> dict[str, str] | None:
    """The entry named ``name`` in the ``models`` list of a ``/v1/models`` document (the
    Jev model list a runtime serving the Jev schema adds), as its ``description`` and
    ``release_date`` when they are text of at most :data:`MAX_LISTING_TEXT` characters;
    ``None`` when there is no such entry."""
    models = document.get("models") if isinstance(document, dict) else None
    for entry in models if isinstance(models, list) else ():
        if isinstance(entry, dict) and entry.get("name") == name:
            return {
                key: entry[key]
                for key in LISTING_KEYS
                if isinstance(entry.get(key), str) and len(entry[key]) <= MAX_LISTING_TEXT
            }
    return None


def unreachable_reason(err: Exception, timeout: float = PROBE_TIMEOUT) -> str:
    """Why a worker did not answer, without its address (a socket path is never shown)."""
    if isinstance(err, ExchangeTimedOut):
        return f"the runtime did not answer within {timeout:g} s"
    if isinstance(err, ConnectFailed):
        return "nothing accepts connections at the endpoint"
    return f"the connection to the runtime failed ({type(err).__name__})"


class HealthPoller:
    """Keeps one worker's ``state``, ``reason``, ``card`` and ``limits`` current.

    Args:
        worker: the worker observed.
        fast: seconds between probes while not ready.
        slow: seconds between probes once ready.
        timeout: seconds one call may take.
        on_health: called with every ``/health`` document received (the supervisor
            recycles a process whose every model failed).
        starting: the worker is a managed process that has not answered yet: a
            connection failure leaves it ``starting`` until it first answers.
    """

    def __init__(
        self,
        worker: Worker,
        *,
        fast: float = FAST_INTERVAL,
        slow: float = SLOW_INTERVAL,
        timeout: float = PROBE_TIMEOUT,
        on_health: HealthHook | None = None,
        starting: bool = False,
    ) -> None:
        self.worker = worker
        self.fast = fast
        self.slow = slow
        self.timeout = timeout
        self.on_health = on_health
        self.answered = not starting
        self._was_ready = False
        self.slow_probes = 0

    async def run(self) -> None:
        """Probe until cancelled."""
        while True:
            await self.probe()
            interval = self.slow if self.worker.ready else self.fast
            await self.worker.probe_requested(interval)

    async def probe(self) -> str:
        """One probe: update the worker; returns its state."""
        worker = self.worker
        liveness = worker.liveness
        suspect = liveness.suspect()
        timeout = min(self.timeout, SUSPECT_PROBE_TIMEOUT) if suspect else self.timeout
        sent = liveness.clock()
        try:
            response = await self._health(timeout, sent, suspect)
            document = response.json()
        except ExchangeTimedOut as err:
            if liveness.suspect():  # suspect now, if not when it was sent
                timeout = min(timeout, SUSPECT_PROBE_TIMEOUT)
            elif self._alive_meanwhile(sent):
                return worker.state
            return self._no_answer(err, timeout)
        except (ConnectFailed, ExchangeBroken) as err:
            return self._no_answer(err, timeout)
        except ValueError:
            return self._set("unreachable", "the runtime answered /health without its JSON")
        self.slow_probes = 0
        self.answered = True
        if not isinstance(document, dict):
            return self._set("unreachable", "the runtime answered /health without its JSON")
        version = str(document.get("api_version") or "")
        if version.split(".", 1)[0] != API_MAJOR:
            return self._set(
                "incompatible",
                f"the runtime speaks contract {version or 'of no version'}; this frontend "
                f"speaks {API_MAJOR}.x: run a vllm-srun of contract {API_MAJOR}",
            )
        if self.on_health is not None:
            self.on_health(document)
        state, reason = self._model_state(document)
        card = None
        if state == "ready" and (worker.card is None or not self._was_ready):
            card, problem = await self._card()
            if card is None:
                state, reason = problem
        self._was_ready = state == "ready"
        if state != "ready" and worker.card is not None and not worker.managed:
            worker.forget_card()  # an attached runtime may come back as another model
        return self._set(state, reason, card)

    async def _health(self, timeout: float, sent: float, suspect: bool) -> WireReply:
        """``GET /health`` within ``timeout`` seconds. A worker that turns suspect while
        the probe waits gets no longer than :data:`~.liveness.SUSPECT_PROBE_TIMEOUT` from
        ``sent``: a probe sent just before a worker stopped would otherwise hold its
        verdict for the whole ``timeout``. The wait wakes when suspicion would begin
        (:meth:`~.liveness.Liveness.until_suspect`), not on a timer.

        Raises:
            ExchangeTimedOut: no answer in time; ConnectFailed, ExchangeBroken as
                :meth:`~.client.WorkerClient.request`.
        """
        liveness = self.worker.liveness
        call = asyncio.ensure_future(self.worker.client.get("/health", timeout=timeout))
        try:
            while not suspect:
                wake = max(liveness.until_suspect(), SUSPECT_RECHECK_S)
                done, _ = await asyncio.wait({call}, timeout=wake)
                if done:
                    return call.result()
                suspect = liveness.suspect()
            left = sent + SUSPECT_PROBE_TIMEOUT - liveness.clock()
            if left > 0:
                await asyncio.wait({call}, timeout=left)
            if call.done():
                return call.result()
            raise ExchangeTimedOut(f"no answer within {SUSPECT_PROBE_TIMEOUT:g} s")
        finally:
            call.cancel()

    def _model_state(self, document: dict[str, Any]) -> tuple[str, str]:
        served = self.worker.served_name
        models = document.get("models")
        entry = models.get(served) if isinstance(models, dict) else None
        if document.get("status") == "failed" and document.get("reason") == "shutting down":
            return "stopped", "the runtime is shutting down"
        if isinstance(entry, dict):
            state, reason = entry.get("status"), entry.get("reason")
        elif document.get("model") == served:
            state, reason = document.get("status"), document.get("reason")
        else:
            return "missing", "the runtime does not serve this model"
        if state not in STATES:
            return "failed", f"the runtime reports an unknown state {state!r}"
        return str(state), str(reason or "")

    async def _card(self) -> tuple[dict[str, Any] | None, tuple[str, str]]:
        """The worker's card for its model (and its limits), or why there is none."""
        worker = self.worker
        try:
            response = await worker.client.get("/v1/models", timeout=self.timeout)
            document = response.json()
        except (ConnectFailed, ExchangeBroken, ExchangeTimedOut) as err:
            return None, ("unreachable", unreachable_reason(err, self.timeout))
        except ValueError:
            return None, ("unreachable", "the runtime answered /v1/models without its JSON")
        cards = document.get("data") if isinstance(document, dict) else None
        for card in cards if isinstance(cards, list) else ():
            if isinstance(card, dict) and card.get("id") == worker.served_name:
                limits = document.get("limits")
                worker.limits = dict(limits) if isinstance(limits, dict) else {}
                worker.listing = model_listing(document, worker.served_name)
                return card, ("ready", "")
        return None, ("missing", "the runtime does not serve this model")

    def _alive_meanwhile(self, sent: float) -> bool:
        """A ready worker whose ``/health`` timed out, but that answered a request while
        the probe waited, or holds requests without being suspect the first time: busy,
        not gone (the probe is counted in :attr:`slow_probes` and logged)."""
        worker, liveness = self.worker, self.worker.liveness
        if not worker.ready:
            return False
        busy = liveness.outstanding > 0 and self.slow_probes == 0
        if not (liveness.answered_since(sent) or busy):
            return False
        self.slow_probes += 1
        name = worker.process or f"{worker.deployment} {worker.replica_id}"
        log.info(
            "%s: /health did not answer within %g s; kept ready: it %s",
            name,
            self.timeout,
            "answered requests meanwhile"
            if liveness.answered_since(sent)
            else f"holds {liveness.outstanding} requests (marked if the next probe fails too)",
        )
        return True

    def _no_answer(self, err: Exception, timeout: float) -> str:
        self._was_ready = False
        self.slow_probes = 0
        if self.worker.card is not None and not self.worker.managed:
            self.worker.forget_card()
        if not self.answered:
            return self._set("starting", "")
        reason = unreachable_reason(err, timeout)
        if self.worker.liveness.suspect():
            reason = f"{reason}; {self.worker.liveness.why()}"
        return self._set("unreachable", reason)

    def _set(self, state: str, reason: str, card: dict[str, Any] | None = None) -> str:
        before = self.worker.state
        if self.worker.update(state, reason, card) and before != state:
            name = self.worker.process or f"{self.worker.deployment} {self.worker.replica_id}"
            log.info("%s: %s%s", name, state, f": {reason}" if reason else "")
        return state
