"""Surface extensions attached to a loaded model: the composite that routes their surfaces.

After a family loads a model, every installed
:class:`~vllm_srun.plugins.SurfaceExtension` whose ``qualifies`` accepts the
model's card, and that adds a surface the model does not serve yet, is
attached in name order; so is one that augments a surface the host serves
(``augments``), the first in name order per surface. :class:`ExtendedModel`
then routes each surface to whoever serves or augments it; every row still
runs through the host model's ``run``, so the scheduler batches an
extension's rows with the host's own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from vllm_srun.plugins.cards import ExtensionCard, FamilyCard
from vllm_srun.plugins.extension import SurfaceExtension, SurfaceModel
from vllm_srun.plugins.host import Catalog
from vllm_srun.plugins.loaded import Answer, LoadedModel, Plan
from vllm_srun.plugins.requests import SurfaceRequest
from vllm_srun.plugins.spec import RowOutput, WorkItem

log = logging.getLogger(__name__)


@dataclass
class RoutedPlan(Plan):
    """A plan made by an attached extension, remembered with the extension that finishes it."""

    owner: SurfaceModel[Any]
    inner: Plan

    def __post_init__(self) -> None:
        self.items = list(self.inner.items)  # the rows the host runs for this plan

    @property
    def queue_entries(self) -> int:
        """Requests the plan counts as against ``--max-queue`` (the inner plan's say)."""
        return self.inner.queue_entries

    def read_end(self, index: int) -> int | None:
        """Where input ``index``'s reading stopped (the inner plan's say)."""
        return self.inner.read_end(index)


class ExtendedModel(LoadedModel[Plan]):
    """A loaded model plus the surfaces extensions added to it (the loaded-model protocol).

    Args:
        host: the family's loaded model.
        attached: ``(extension, its loaded model, the surfaces it adds)``, in
            attachment order; a surface the host (or an earlier extension)
            serves is never listed as added, except one it augments.

    Attributes:
        host: the family's loaded model, which runs every row.
        augmented: the surfaces the host serves whose answers an extension rewrites
            (the golden self-check compares those on :attr:`host` alone).
    """

    host: LoadedModel[Any]
    augmented: frozenset[str]

    def __init__(
        self,
        host: LoadedModel[Any],
        attached: list[tuple[SurfaceExtension, SurfaceModel[Any], tuple[str, ...]]],
    ) -> None:
        self.host = host
        self.pads_to_width = host.pads_to_width
        self.attached = attached
        self.by_surface = {s: model for _, model, added in attached for s in added}
        self.surfaces = tuple(host.surfaces) + tuple(
            s for s in self.by_surface if s not in host.surfaces
        )
        # surfaces the host serves whose answers an extension rewrites
        self.augmented = frozenset(s for s in self.by_surface if s in host.surfaces)

    def plan(self, surface: str, request: SurfaceRequest) -> Plan:
        """Plan on the extension that added ``surface``, else on the host.

        Raises:
            RequestError: as the planner raises (``unsupported_surface`` from the host
                for a surface nobody serves).
        """
        owner = self.by_surface.get(surface)
        if owner is None:
            plan: Plan = self.host.plan(surface, request)
            return plan
        return RoutedPlan(owner, owner.plan(surface, request))

    def run(self, items: list[WorkItem], width: int | None = None) -> list[npt.NDArray[np.float32]]:
        """The host's forward: every row is the host's (``width`` as the host takes it)."""
        if width is not None and self.host.pads_to_width:
            return list(self.host.run(items, width=width))  # type: ignore[call-arg]
        return list(self.host.run(items))

    def probe_items(self) -> list[WorkItem]:
        """The host's probe rows (its forward is the only one)."""
        return self.host.probe_items()

    def warm(self) -> None:
        """Warm the host, then each attached extension (one that raises is logged and
        skipped: the model serves, that extension warms on its first request).

        Raises:
            Exception: whatever the host's ``warm`` raises.
        """
        self.host.warm()
        for ext, model, _ in self.attached:
            try:
                model.warm()
            except Exception:
                log.exception("extension %s failed to warm up; it warms on first use", ext.name)

    def finish(self, plan: Plan, outputs: list[RowOutput]) -> Answer:
        """The answer, from whoever planned it."""
        if isinstance(plan, RoutedPlan):
            return plan.owner.finish(plan.inner, outputs)
        return self.host.finish(plan, outputs)

    def card(self) -> FamilyCard:
        """The host's card with the added surfaces, question types and ``extensions``."""
        card = self.host.card().copy()
        card["surfaces"] = list(self.surfaces)
        extensions = []
        for ext, model, added in self.attached:
            extra = dict(model.card())
            question_types = extra.pop("question_types", None)
            if isinstance(question_types, list):
                card["question_types"] = [str(kind) for kind in question_types]
            entry: dict[str, object] = {
                "name": ext.name,
                "surfaces": list(added),
                "numerics": ext.numerics,
                "method": ext.method,
                **extra,
            }
            # the four typed keys, then the extension's own, free-form (ExtensionCard)
            extensions.append(cast(ExtensionCard, entry))
        card["extensions"] = extensions
        return card

    def __getattr__(self, name: str) -> Any:
        # Everything else (the family's own attributes: encoder, heads, limits) is
        # the host's; what the host lacks stays missing.
        return getattr(self.host, name)


def attach_extensions(catalog: Catalog, loaded: LoadedModel[Any]) -> LoadedModel[Any]:
    """``loaded`` with every qualifying extension attached (``loaded`` itself when none).

    An extension that raises while qualifying or attaching is skipped and
    logged: it never fails the model its family loaded.
    """
    extensions = catalog.layer("surface_extensions")
    if not extensions:
        return loaded
    card = loaded.card()
    served = set(loaded.surfaces)
    attached: list[tuple[SurfaceExtension, SurfaceModel[Any], tuple[str, ...]]] = []
    augmented: set[str] = set()
    for name in sorted(extensions):
        ext = extensions[name]
        new = tuple(s for s in ext.surfaces if s not in served)
        wrapped = tuple(s for s in ext.augments if s in loaded.surfaces and s not in augmented)
        if not new and not wrapped:
            continue
        try:
            reason = ext.qualifies(card)
            if reason is not None:
                log.debug("extension %s does not apply: %s", name, reason)
                continue
            attached.append((ext, ext.attach(loaded, card), new + wrapped))
        except Exception:
            log.exception("extension %s failed to attach; the model serves without it", name)
            continue
        served.update(new)
        augmented.update(wrapped)
    if not attached:
        return loaded
    return ExtendedModel(loaded, attached)
