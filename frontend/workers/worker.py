"""One replica of a logical deployment, as the frontend sees it over the wire.

A :class:`Worker` is the seam between the parts that keep a worker alive and
observed (supervision, health polling) and the parts that send it requests
(the replica pool): the first write its state and card, the second read them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from .client import WorkerClient
from .liveness import Liveness

STATES = (
    "starting",
    "loading",
    "warming",
    "ready",
    "degraded",
    "failed",
    "restarting",
    "unreachable",
    "missing",
    "incompatible",
    "stopped",
)
"""Every state a worker's model can be in: the runtime's own (``starting`` ..
``failed``) and the frontend's observations of the process (``restarting``,
``unreachable``, ``missing``, ``incompatible``, ``stopped``)."""


def shown_endpoint(endpoint: str) -> str:
    """What operators see of an endpoint: ``unix`` for a socket (never its path), else
    ``scheme://host[:port]`` (never a path, query or credentials)."""
    parts = urlsplit(endpoint)
    if parts.scheme == "unix":
        return "unix"
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}"


@dataclass(eq=False)
class Worker:
    """One replica: where it is, what state its model is in and the card it reported.

    Attributes:
        deployment: the logical deployment this replica serves.
        replica_id: ``"r-"`` and 12 hex digits, stable for the same placement.
        managed: started and supervised by this frontend (else attached).
        endpoint: ``unix:///abs.sock`` or ``http(s)://host:port``; internal, never shown.
        served_name: the model's name on the worker (its models-file ``name``).
        process: the managed process name (``<deployment>-<replica_id>``), ``""`` attached.
        device: the placement's device, or ``None`` (attached, or ``auto`` unresolved).
        state: one of :data:`STATES`.
        reason: why the state is not ``ready`` (``""`` when nothing to say).
        card: the worker's ``/v1/models`` card for ``served_name``, once seen.
        limits: the worker's process ``limits`` (``max_bundle_tasks``, ``max_request_bytes``).
        listing: what the worker's ``/v1/models`` says of ``served_name`` in its Jev
            model list (``models``): ``description`` and ``release_date``, each only when
            it is text; ``None`` when the list has no entry for it.
        restarts: how many times the managed process was restarted.
        changes: how many :meth:`update` calls changed something (a cheap way to tell
            that the state, reason or card moved since last looked at).
        liveness: what its exchanges show of whether it answers (kept by the pools
            that send it requests, read by its health poller).
    """

    deployment: str
    replica_id: str
    managed: bool
    endpoint: str
    served_name: str
    process: str = ""
    device: str | None = None
    state: str = "starting"
    reason: str = ""
    card: dict[str, Any] | None = None
    limits: dict[str, Any] = field(default_factory=dict)
    listing: dict[str, str] | None = None
    restarts: int = 0
    changes: int = 0
    liveness: Liveness = field(default_factory=Liveness, repr=False)
    _changed: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _probe: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _client: WorkerClient | None = field(default=None, repr=False)

    @property
    def ready(self) -> bool:
        """Its model answers: state ``ready`` and a card seen."""
        return self.state == "ready" and self.card is not None

    @property
    def client(self) -> WorkerClient:
        """The worker's HTTP client (made on first use; no timeout of its own).

        Raises:
            ValueError: the endpoint's scheme or socket path is not one a client can use.
        """
        if self._client is None:
            self._client = WorkerClient(self.endpoint)
        return self._client

    def shown_endpoint(self) -> str:
        """:func:`shown_endpoint` of this worker."""
        return shown_endpoint(self.endpoint)

    def update(self, state: str, reason: str = "", card: dict[str, Any] | None = None) -> bool:
        """Set the state, reason and (when given) card; wake the waiters if anything
        changed. Returns whether it did.

        Raises:
            ValueError: a state outside :data:`STATES`.
        """
        if state not in STATES:
            raise ValueError(f"unknown worker state {state!r}; one of {', '.join(STATES)}")
        changed = (state, reason) != (self.state, self.reason) or (
            card is not None and card != self.card
        )
        self.state, self.reason = state, reason
        if card is not None:
            self.card = card
        if changed:
            self.changes += 1
            self._changed.set()
            self._changed = asyncio.Event()
        return changed

    def forget_card(self) -> None:
        """Drop the card, the limits and the listing (a restarted or replaced worker must
        report them again before it counts as ready); wakes the waiters."""
        if self.card is None and not self.limits and self.listing is None:
            return
        self.card = None
        self.limits = {}
        self.listing = None
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self) -> None:
        """Wait for the next :meth:`update` that changes something."""
        await self._changed.wait()

    def request_probe(self) -> None:
        """Ask the health poller for a probe now (after a transport failure)."""
        self._probe.set()

    async def probe_requested(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for :meth:`request_probe`; clears the request.

        A cancellation is never lost, not even one that comes with a probe request
        (``asyncio.wait_for`` of Python 3.11 returns the result then, and a poller being
        stopped would poll on).
        """
        try:
            async with asyncio.timeout(timeout):
                await self._probe.wait()
        except TimeoutError:
            return False
        self._probe.clear()
        return True

    async def aclose(self) -> None:
        """Close the HTTP client."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None
