"""The public plugin API of vllm-srun: the only module a third-party plugin imports.

- :mod:`~vllm_srun.plugins.hookspecs`: the hooks, and :data:`hookimpl` to mark
  implementations;
- contracts: :class:`Accelerator` and :class:`DeviceInfo`, :class:`Engine`,
  :class:`Family`, :class:`SurfaceExtension`, :class:`Kernel`,
  :class:`GoldenReference`, :class:`ModelEntry`;
- what flows between them: :class:`ModelSpec` (a family's description of a
  package), the engine models (:class:`EncoderModel`, :class:`DecoderModel`
  and their batches), :class:`LoadedModel` and :class:`Plan` (a family's
  loaded model and its planned requests), :class:`WorkItem` (one row),
  :class:`RowError` and :class:`RequestError`, :class:`FamilyCard` (what a family
  writes on its model card) and :class:`ModelCard` (the card served);
- discovery and composition: :func:`discover`, :func:`build_catalog`,
  :func:`load_catalog`;
- the conformance kit: :mod:`vllm_srun.plugins.testing`.

Importing it does not import torch: the torch types appear in annotations only,
and ``RowOutput`` (``torch.Tensor | RowError``) is built at first use.
"""

from typing import TYPE_CHECKING, Any

from vllm_srun.plugins.accelerator import (
    DTYPES,
    Accelerator,
    DeviceInfo,
    ExecutionProvider,
    slug,
    torch_devices,
    torch_memory_info,
)
from vllm_srun.plugins.cache import intact_build, runtime_cache_dir, write_json_atomically
from vllm_srun.plugins.cards import (
    EmbeddingCard,
    FamilyCard,
    HeadCard,
    ModelCard,
    RerankCard,
    RerankExit,
    Window,
)
from vllm_srun.plugins.discovery import ENV_DISABLE, ENV_ONLY, GROUP, DiscoveredPlugin, discover
from vllm_srun.plugins.engine import Engine
from vllm_srun.plugins.extension import SurfaceExtension, SurfaceModel
from vllm_srun.plugins.family import EngineModel, Family
from vllm_srun.plugins.golden import (
    GoldenReference,
    ReferenceFileError,
    read_reference_file,
    write_reference_answers,
)
from vllm_srun.plugins.hookspecs import (
    RegisterAccelerator,
    RegisterEngine,
    RegisterFamily,
    RegisterGoldenReference,
    RegisterKernel,
    RegisterModel,
    RegisterSurfaceExtension,
    hookimpl,
    hookspec,
)
from vllm_srun.plugins.kernel import Kernel, select_kernel
from vllm_srun.plugins.layers import LAYERS, Layer
from vllm_srun.plugins.loaded import Answer, Answered, LoadedModel, Plan
from vllm_srun.plugins.manager import (
    Catalog,
    Clash,
    PluginRecord,
    Refusal,
    build_catalog,
    load_catalog,
)
from vllm_srun.plugins.models import Mirror, ModelEntry
from vllm_srun.plugins.package import PackageError, read_config, read_json, sha256_file
from vllm_srun.plugins.profiles import (
    BATCHING,
    EXACT,
    MAX_SPEED,
    STANDARD_PROFILES,
    Profile,
)
from vllm_srun.plugins.requests import (
    OVERFLOW_MODES,
    ClassifyRequest,
    EmbeddingsRequest,
    Overflow,
    RerankRequest,
    SurfaceRequest,
    TextPair,
    read_request,
)
from vllm_srun.plugins.responses import (
    ClassifyAnswer,
    ClassifyResult,
    ClassifyWindow,
    Embedding,
    EmbeddingError,
    EmbeddingsAnswer,
    InputUsage,
    ItemError,
    RerankAnswer,
    RerankResult,
    ResponseMeta,
    Span,
    SurfaceAnswer,
    TokenProbabilities,
    embedding_error,
    embedding_item,
    embeddings_usage,
    input_usage,
    item_error,
    usage,
)
from vllm_srun.plugins.spec import (
    ITEM_ERRORS,
    REQUEST_ERRORS,
    DecoderBatch,
    DecoderModel,
    EncoderBatch,
    EncoderModel,
    ItemErrorCode,
    ModelSpec,
    RequestError,
    RequestErrorCode,
    RowError,
    WorkItem,
    decoder_positions,
    weight_files,
)

if TYPE_CHECKING:
    from vllm_srun.plugins.spec import RowOutput


def __getattr__(name: str) -> Any:
    """``RowOutput`` from :mod:`vllm_srun.plugins.spec`, at first use: it names
    ``torch.Tensor``, and importing the plugin API does not import torch (PEP 562)."""
    if name == "RowOutput":
        from vllm_srun.plugins import spec

        return spec.RowOutput
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BATCHING",
    "DTYPES",
    "ENV_DISABLE",
    "ENV_ONLY",
    "EXACT",
    "GROUP",
    "ITEM_ERRORS",
    "LAYERS",
    "MAX_SPEED",
    "OVERFLOW_MODES",
    "REQUEST_ERRORS",
    "STANDARD_PROFILES",
    "Accelerator",
    "Answer",
    "Answered",
    "Catalog",
    "Clash",
    "ClassifyAnswer",
    "ClassifyRequest",
    "ClassifyResult",
    "ClassifyWindow",
    "DecoderBatch",
    "DecoderModel",
    "DeviceInfo",
    "DiscoveredPlugin",
    "Embedding",
    "EmbeddingCard",
    "EmbeddingError",
    "EmbeddingsAnswer",
    "EmbeddingsRequest",
    "EncoderBatch",
    "EncoderModel",
    "Engine",
    "EngineModel",
    "ExecutionProvider",
    "Family",
    "FamilyCard",
    "GoldenReference",
    "HeadCard",
    "InputUsage",
    "ItemError",
    "ItemErrorCode",
    "Kernel",
    "Layer",
    "LoadedModel",
    "Mirror",
    "ModelCard",
    "ModelEntry",
    "ModelSpec",
    "Overflow",
    "PackageError",
    "Plan",
    "PluginRecord",
    "Profile",
    "ReferenceFileError",
    "Refusal",
    "RegisterAccelerator",
    "RegisterEngine",
    "RegisterFamily",
    "RegisterGoldenReference",
    "RegisterKernel",
    "RegisterModel",
    "RegisterSurfaceExtension",
    "RequestError",
    "RequestErrorCode",
    "RerankAnswer",
    "RerankCard",
    "RerankExit",
    "RerankRequest",
    "RerankResult",
    "ResponseMeta",
    "RowError",
    "RowOutput",
    "Span",
    "SurfaceAnswer",
    "SurfaceExtension",
    "SurfaceModel",
    "SurfaceRequest",
    "TextPair",
    "TokenProbabilities",
    "Window",
    "WorkItem",
    "build_catalog",
    "decoder_positions",
    "discover",
    "embedding_error",
    "embedding_item",
    "embeddings_usage",
    "hookimpl",
    "hookspec",
    "input_usage",
    "intact_build",
    "item_error",
    "load_catalog",
    "read_config",
    "read_json",
    "read_reference_file",
    "read_request",
    "runtime_cache_dir",
    "select_kernel",
    "sha256_file",
    "slug",
    "torch_devices",
    "torch_memory_info",
    "usage",
    "weight_files",
    "write_json_atomically",
    "write_reference_answers",
]
