"""Numeric profiles: what an engine offers a model, and what the runtime promises for each.

A profile is declared by the engine that runs it (:attr:`vllm_srun.plugins.Engine.profiles`),
with what it changes on that engine; a family may refuse one for a model it describes
(:meth:`vllm_srun.plugins.Family.refuse_profile`). A third party adds a profile by
declaring it on its engine (or on a subclass of a built-in one): nothing else needs to
know its name. The runtime reads two fields: :attr:`Profile.numerics` (what the card
and every ``meta`` say) and :attr:`Profile.batch_tolerance` (how rows may share a forward).

The three standard profiles (upstream's names):

- ``exact``: a row's answer is the same bits alone or in any batch, at any position.
  Rows share a forward only with rows of their own length (no padding, so no kernel
  sees another row's shape); a model whose load-time probe still finds a difference
  answers its rows one by one.
- ``batching``: rows of any length and any request share a forward; a row's answer is
  within 1e-5 of its answer alone (DESIGN §6), else the probe turns cross-request
  batching off. Reference kernels, as ``exact``.
- ``max_speed``: the fastest path the engine has (fused or quantised graphs, fused
  attention kernels); answers are approximate and the deviation from ``exact`` is
  measured at load on the golden questions.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Annotated, Literal

from pydantic import Field
from typing_extensions import TypedDict  # pydantic reads typing's TypedDict only from 3.12

from vllm_srun.plugins.responses import opened

Numerics = Literal["exact", "approximate"]
"""What a profile's answers are: ``exact`` (the reference bits) or ``approximate``."""

KernelPolicy = Literal["bit_exact", "fastest"]
"""Which kernels a profile admits: only bit-exact ones, or the fastest registered."""

PROFILE_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
"""A profile's name: lower-case letters, digits and ``_``, starting with a letter."""

DEFAULT_PROFILE = "exact"
"""The profile a model is loaded under when none is named."""


# A card's ``profiles`` entry (:meth:`Profile.card`), here beside the profile rather than in
# vllm_srun.plugins.cards (which re-exports it): the cards name Numerics, so this module
# cannot import them.
@opened
class ProfileInfo(TypedDict):
    """A numeric profile the model may be served or asked under."""

    name: str
    numerics: Numerics
    description: Annotated[
        str, Field(description="What the profile promises and what it changes on the engine.")
    ]


@dataclass(frozen=True)
class Profile:
    """One numeric profile as an engine offers it.

    Attributes:
        name: the profile's name (``--profile NAME``, models-file ``profile``,
            ``options.profile``), matching :data:`PROFILE_NAME`.
        numerics: ``exact`` or ``approximate`` (the card's ``numerics`` and ``meta``).
        description: what the profile promises and what it changes on this engine.
        batch_tolerance: the largest absolute difference allowed between a row
            alone and inside a batch. ``0.0``: rows share a forward only with rows
            of their own length, and a model whose probe finds any difference
            answers rows one by one. A positive number: rows of any length share
            forwards while the probe stays within it, else cross-request batching
            is off. ``None``: rows always share forwards; the deviation is only
            reported (a quantised graph rounds with the batch).
        kernels: ``bit_exact`` (only kernels equal to their slot's reference) or
            ``fastest`` (the fastest registered implementation per slot).
        auto_priority: where ``--engine auto`` tries this engine under this
            profile (ascending); ``None``: the engine's own ``auto_priority``.
    """

    name: str
    numerics: Numerics
    description: str
    batch_tolerance: float | None = 0.0
    kernels: KernelPolicy = "bit_exact"
    auto_priority: int | None = None

    def described(self, description: str, **changes: object) -> Profile:
        """A copy with another ``description`` (what it changes on another engine) and
        optionally other fields: how an engine declares a standard profile its own way."""
        return replace(self, description=description, **changes)  # type: ignore[arg-type]

    def card(self) -> ProfileInfo:
        """The card's ``profiles`` entry (wire contract 2.3 ``ProfileInfo``)."""
        return {"name": self.name, "numerics": self.numerics, "description": self.description}


EXACT = Profile(
    "exact",
    "exact",
    "Bit-identical: a row's answer is the same bits alone or in any batch, at any position "
    "(each row is padded to a fixed edge of its own length, so rows of many lengths share "
    "a forward; where the load-time probe finds a difference, rows share forwards only "
    "within their edge, only with rows of their own length, or run one by one: the card's "
    "batch_invariance.method says which). Reference kernels only.",
)
BATCHING = Profile(
    "batching",
    "approximate",
    "Cross-request batching: rows of any length share forwards (padded, split by length); "
    "a row's answer is within 1e-5 of its answer alone. Reference kernels only.",
    batch_tolerance=1e-5,
)
MAX_SPEED = Profile(
    "max_speed",
    "approximate",
    "The fastest path the engine has (fused attention and optimised graphs); answers are "
    "approximate, their deviation from exact measured at load on the golden questions.",
    batch_tolerance=None,
    kernels="fastest",
)
STANDARD_PROFILES = (EXACT, BATCHING, MAX_SPEED)
"""The standard profiles, in the order a card lists them."""


def not_a_profile_name(location: str, value: object) -> str:
    """The message for a request's profile (at ``location``, such as
    ``options.profile``) that is not a profile name: every surface says the same."""
    from vllm_srun.plugins.spec import clip

    return (
        f"{location} must be a profile name (lower-case letters, digits and _, such as "
        f"exact, batching or max_speed), not {clip(repr(value))}"
    )


def profile_violations(profile: object) -> list[str]:
    """Reasons ``profile`` breaks the profile contract (empty when it conforms)."""
    if not isinstance(profile, Profile):
        return [f"{type(profile).__qualname__} is not a vllm_srun.plugins.Profile"]
    problems = []
    if type(profile.name) is not str or not PROFILE_NAME.match(profile.name):
        problems.append(f"profile name {profile.name!r} must match {PROFILE_NAME.pattern}")
    if profile.numerics not in ("exact", "approximate"):
        problems.append(f"profile {profile.name}: numerics must be exact or approximate")
    if profile.kernels not in ("bit_exact", "fastest"):
        problems.append(f"profile {profile.name}: kernels must be bit_exact or fastest")
    tolerance = profile.batch_tolerance
    if tolerance is not None and (
        not isinstance(tolerance, int | float) or not 0 <= tolerance < math.inf
    ):
        problems.append(f"profile {profile.name}: batch_tolerance must be None or a number >= 0")
    if profile.numerics == "exact" and (tolerance != 0.0 or profile.kernels != "bit_exact"):
        problems.append(
            f"profile {profile.name}: exact numerics need batch_tolerance 0.0 and bit_exact kernels"
        )
    return problems


__all__ = [
    "BATCHING",
    "DEFAULT_PROFILE",
    "EXACT",
    "MAX_SPEED",
    "PROFILE_NAME",
    "STANDARD_PROFILES",
    "KernelPolicy",
    "Numerics",
    "Profile",
    "ProfileInfo",
    "not_a_profile_name",
    "profile_violations",
]
