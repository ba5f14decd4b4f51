"""What a listener publishes: its grant, and what one configuration generation gives it
(the pools its public ids name, its Chat settings in Router mode).

A :class:`Published` is never changed once made; a reload hands each listener a new one
(:meth:`~vllm_sr.api.native.Listener.publish`). A request reads its listener's
:class:`Published` once, when it arrives, so it is authorised, routed and answered
entirely by the generation that admitted it, never by a mix of two.
"""

from __future__ import annotations

import asyncio
import hmac
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from ..pool.pool import ReplicaPool
from ..router.chat import ListenerChat
from .refusals import SYSTEMONE, Refusal, not_allowed, validation_entry

JEV_ALIAS = "jev-latest"
"""The model name the Jev SDKs send by default."""

UNKNOWN_RELEASE_DATE = "1970-01-01"
"""The ``release_date`` the model list gives a model whose worker says none (the Unix
epoch: the date is not known)."""

RELEASE_DATE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")


@dataclass(frozen=True)
class Grant:
    """What one listener publishes, and to whom.

    Attributes:
        listener: the listener's name (for logs).
        api_keys: the keys a client must present (none: open).
        systemone: public ids published on the System One routes.
        runtime: public ids published on the runtime routes.
        jev: the ids of ``systemone`` whose deployment serves the Jev schema.
    """

    listener: str = ""
    api_keys: tuple[str, ...] = ()
    systemone: tuple[str, ...] = ()
    runtime: tuple[str, ...] = ()
    jev: tuple[str, ...] = ()


class Published:
    """One listener's grant over one generation's pools.

    Args:
        grant: what the listener publishes, and to whom.
        pools: the generation's pools by public id.
        chat: the listener's Chat routes (Router mode), else ``None``.
    """

    def __init__(
        self,
        grant: Grant,
        pools: Mapping[str, ReplicaPool],
        chat: ListenerChat | None = None,
    ) -> None:
        self.grant = grant
        self.pools = pools
        self.chat = chat
        self._keys = tuple(key.encode() for key in grant.api_keys)
        self.admitted = 0
        """Requests admitted under this publication and not answered yet."""
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> None:
        """A request was admitted under this publication."""
        self.admitted += 1
        self._idle.clear()

    def leave(self) -> None:
        """A request admitted under this publication was answered."""
        self.admitted -= 1
        if self.admitted == 0:
            self._idle.set()

    async def idle(self) -> None:
        """Wait until no request admitted under this publication is in flight."""
        await self._idle.wait()

    def systemone_models(self) -> list[str]:
        """The System One ids of the grant that name a deployment, in grant order, once."""
        return [m for m in dict.fromkeys(self.grant.systemone) if m in self.pools]

    @property
    def jev(self) -> bool:
        """Whether this is a Jev listener: it publishes System One models and every one of
        them serves the Jev schema."""
        published = self.systemone_models()
        return bool(published) and all(m in self.grant.jev for m in published)

    def alias_target(self) -> str | None:
        """The public id ``jev-latest`` names here: the grant's one System One model, or,
        of several, the one serving the Jev schema; ``None`` when that is not one model
        (or the grant publishes ``jev-latest`` itself)."""
        if JEV_ALIAS in self.grant.systemone:
            return None
        published = self.systemone_models()
        if len(published) == 1:
            return published[0]
        jev = [m for m in published if m in self.grant.jev]
        return jev[0] if len(jev) == 1 else None

    def authorized(self, request: Request) -> bool:
        """Whether the request presents one of the listener's keys (always, with none).

        Every presented key is compared with every listener key in constant time, with no
        early exit, so the time taken says nothing of which key came close.
        """
        if not self._keys:
            return True
        presented: list[bytes] = []
        scheme, _, token = request.headers.get("authorization", "").strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            presented.append(token.strip().encode())
        api_key = request.headers.get("api-key", "").strip()
        if api_key:
            presented.append(api_key.encode())
        matched = False
        for candidate in presented:
            for key in self._keys:
                matched |= hmac.compare_digest(candidate, key)
        return matched

    def pool(self, model: Any, granted: Sequence[str], kind: str) -> ReplicaPool:
        if not isinstance(model, str) or not model.strip():
            if model is None:
                entries = validation_entry(["body", "model"], "model is required", "missing")
            elif not isinstance(model, str):
                entries = validation_entry(["body", "model"], "model must be text", "string_type")
            else:
                entries = validation_entry(
                    ["body", "model"], "model must not be blank", "value_error"
                )
            raise Refusal(400, "model_required", kind, param="model", invalid=entries)
        if kind == SYSTEMONE and model == JEV_ALIAS and model not in granted:
            model = self.alias_target() or model
        if model not in granted:
            raise not_allowed(kind, model, self.usable(granted, kind))
        pool = self.pools.get(model)
        if pool is None:
            raise Refusal(404, "model_not_found", kind, param="model")
        return pool

    def usable(self, granted: Sequence[str], kind: str) -> list[str]:
        """The model names a client of this listener may send on ``kind``'s routes: the
        granted ids that name a deployment (all granted ids, when none does), and on the
        System One routes ``jev-latest`` when it names one of them."""
        named = [m for m in dict.fromkeys(granted) if m in self.pools] or list(
            dict.fromkeys(granted)
        )
        if kind == SYSTEMONE and self.alias_target() is not None:
            named.append(JEV_ALIAS)
        return named

    def model_list(self) -> list[dict[str, str]]:
        """Jev's model list: each System One id of the grant that names a deployment, then
        ``jev-latest`` when it names one of them (with that model's description and
        date)."""
        listed = [{"name": m, **self._listing(m)} for m in self.systemone_models()]
        target = self.alias_target()
        if target is not None:
            listed.append({"name": JEV_ALIAS, **self._listing(target)})
        return listed

    def _listing(self, model: str) -> dict[str, str]:
        """A model's ``description`` and ``release_date``: from a worker's Jev model list
        (a ready worker's first), else from its card, else ``System One model <id>`` and
        :data:`UNKNOWN_RELEASE_DATE`."""
        pool = self.pools[model]
        workers = sorted(pool.workers, key=lambda w: not w.ready)
        found: dict[str, str] = {}
        for source in [w.listing for w in workers] + [w.card for w in workers]:
            for key in ("description", "release_date"):
                value = (source or {}).get(key)
                if key not in found and isinstance(value, str) and value.strip():
                    if key == "release_date" and not RELEASE_DATE.match(value):
                        continue
                    found[key] = value
        return {
            "description": found.get("description", f"System One model {model}"),
            "release_date": found.get("release_date", UNKNOWN_RELEASE_DATE),
        }

    def runtime_cards(self) -> list[dict[str, Any]]:
        """The model cards of the runtime grant, in grant order, each under its public id:
        the card a ready replica reported (its ``id`` the public one, ``ready`` true), or,
        while no replica is ready, ``{"id", "object": "model", "ready": false}``. A granted
        id with no deployment behind it is left out."""
        cards = []
        for model in self.grant.runtime:
            pool = self.pools.get(model)
            if pool is None:
                continue
            card = next((w.card for w in pool.workers if w.ready and w.card is not None), None)
            if card is None:
                cards.append({"id": model, "object": "model", "ready": False})
            else:
                cards.append({**card, "id": model, "ready": True})
        return cards
