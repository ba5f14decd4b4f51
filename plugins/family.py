"""The model-family contract: recognise a package, describe it, serve its surfaces.

A family reads package formats (configs, tokenizers, heads) and never imports
an engine: it describes the model as a spec, lets the runtime pick an engine,
and turns surface requests into work items and engine outputs into answers.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from vllm_srun.plugins.loaded import LoadedModel
from vllm_srun.plugins.spec import DecoderModel, EncoderModel, ModelSpec

EngineModel = EncoderModel | DecoderModel
"""What an engine's ``load`` returns: ``encode`` for encoders, ``forward`` for decoders."""


class Family(abc.ABC):
    """Base class of model-family plugins.

    Class attributes:
        name: the family's name, as ``--family NAME`` forces it.
        surfaces: the HTTP surfaces its models can serve (``embeddings``,
            ``classify``, ``rerank``, ``decisions``).
        options: the family options a models-file entry's ``options`` may set,
            each key with what it does (shown in errors and docs). A family
            that declares any receives them as ``load(..., options=...)``
            after :meth:`check_options`; one that declares none never does.
    """

    name: ClassVar[str]
    surfaces: ClassVar[tuple[str, ...]] = ()
    options: ClassVar[Mapping[str, str]] = {}

    def check_options(self, options: Mapping[str, Any]) -> None:
        """Refuse family options this family cannot honour (before anything loads).

        The default refuses keys :attr:`options` does not declare; override to
        check the values too (call this first).

        Raises:
            ValueError: what is wrong and what the family takes.
        """
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            takes = ", ".join(self.options) if self.options else "no options"
            raise ValueError(
                f"family {self.name} has no option {', '.join(unknown)}; it takes {takes}"
            )

    @abc.abstractmethod
    def detect(self, package: Path) -> bool:
        """Whether this family recognises the package; cheap (reads configs only)."""

    @abc.abstractmethod
    def verify(self, package: Path) -> None:
        """Check the package's files before any weight loads; raise with the reason."""

    @abc.abstractmethod
    def describe(self, package: Path) -> ModelSpec:
        """The model spec: architecture, heads, labels, limits, files, dtype policy."""

    @abc.abstractmethod
    def load(self, package: Path, spec: ModelSpec, engine_model: EngineModel) -> LoadedModel[Any]:
        """A loaded model that plans, runs and finishes surface requests.

        Args:
            package: the package directory.
            spec: what :meth:`describe` returned, with the load options filled
                in (``dtype``, ``max_model_len``, ``shared_context``).
            engine_model: the chosen engine's model for ``spec``.
        """

    def fixture(self, root: Path) -> tuple[Path, str, dict[str, Any]] | None:
        """A package this family serves, written under ``root``, with a request for it.

        Returns ``(package, surface, request)``; the conformance kit detects,
        describes and loads the package with an installed engine on the CPU,
        then plans, runs and finishes the request. ``None`` (the default)
        skips that check.
        """
        return None

    def refuse_profile(self, profile: str, spec: ModelSpec) -> str | None:
        """Why this family will not serve the model ``spec`` describes under ``profile``
        (a numeric profile its engine offers), or ``None`` when it will (the default).

        A family refuses a profile whose numerics its heads were measured not to
        tolerate (``max_speed`` for a head whose answers would change); the message
        says which head and which profile to use instead.
        """
        return None

    def golden(self, package: Path) -> Sequence[Mapping[str, Any]]:
        """Golden requests the family runs during warming; none by default.

        Each is ``{"surface": ..., "body": {...}}``: a package that is not
        built in must answer them well formed and the same twice.
        """
        return ()
