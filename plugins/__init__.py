"""The plugin-author API of vllm-srun: what a third-party plugin imports.

Everything here is for writing a plugin; what the runtime uses to find and compose
plugins lives in :mod:`vllm_srun.plugins.host` (discovery, the plugin manager, the
catalog, the layer checks), which a plugin never needs.

- hooks: :data:`hookimpl` marks an implementation; the callback types are in
  :mod:`~vllm_srun.plugins.hookspecs` (``RegisterFamily``, ...);
- contracts: :class:`Accelerator` and :class:`DeviceInfo`, :class:`Engine`,
  :class:`Family`, :class:`SurfaceExtension` and :class:`SurfaceModel`,
  :class:`Kernel`, :class:`GoldenReference`, :class:`ModelEntry` and :class:`Mirror`;
- what flows between them: :class:`ModelSpec` (a family's description of a
  package), the engine models (:class:`EncoderModel`, :class:`DecoderModel` and
  their batches, built with :func:`right_padded` and :func:`left_padded` and split
  back with :func:`split_rows`), :class:`LoadedModel` and :class:`Plan`,
  :class:`WorkItem` (one row), :class:`RowError` and :class:`RequestError`;
- the wire contract: the typed requests a ``plan`` receives, the answers a
  ``finish`` returns (:data:`SurfaceAnswer`; decisions in
  :mod:`vllm_srun.plugins.decisions`) with their builders (:func:`embedding_item`,
  :func:`item_error`, :func:`input_usage`, ...), and the card a ``card()`` returns
  (:class:`FamilyCard` and its parts);
- package and cache helpers; the conformance kit is :mod:`vllm_srun.plugins.testing`.

Importing it does not import torch: encoder batches and every row output are numpy
arrays (``RowOutput`` is ``numpy.ndarray | RowError``), and the torch types of the
decoder contract appear in annotations only.
"""

from vllm_srun.plugins.accelerator import (
    DTYPES,
    Accelerator,
    DeviceInfo,
    ExecutionProvider,
    slug,
    torch_devices,
    torch_memory_info,
)
from vllm_srun.plugins.cache import intact_build, runtime_cache_dir
from vllm_srun.plugins.cards import (
    EmbeddingCard,
    FamilyCard,
    HeadCard,
    RerankCard,
)
from vllm_srun.plugins.collate import left_padded, right_padded, split_rows
from vllm_srun.plugins.engine import Engine
from vllm_srun.plugins.extension import SurfaceExtension, SurfaceModel
from vllm_srun.plugins.family import EngineModel, Family
from vllm_srun.plugins.golden import (
    GoldenReference,
    ReferenceFileError,
    read_reference_file,
    write_reference_answers,
)
from vllm_srun.plugins.hookspecs import hookimpl
from vllm_srun.plugins.kernel import Kernel, select_kernel
from vllm_srun.plugins.loaded import Answer, LoadedModel, Plan
from vllm_srun.plugins.models import Mirror, ModelEntry
from vllm_srun.plugins.package import (
    PackageError,
    read_config,
    read_json,
    remembered_sha256,
    sha256_file,
)
from vllm_srun.plugins.profiles import BATCHING, EXACT, MAX_SPEED, Profile
from vllm_srun.plugins.requests import (
    OVERFLOW_MODES,
    ClassifyRequest,
    EmbeddingsRequest,
    Overflow,
    RerankRequest,
    SurfaceRequest,
    read_request,
)
from vllm_srun.plugins.responses import (
    ClassifyAnswer,
    ClassifyResult,
    ClassifyWindow,
    EmbeddingsAnswer,
    InputUsage,
    ItemError,
    RerankAnswer,
    RerankResult,
    Span,
    SurfaceAnswer,
    TokenProbabilities,
    Usage,
    embedding_error,
    embedding_item,
    embeddings_answer,
    embeddings_usage,
    input_usage,
    item_error,
    usage,
)
from vllm_srun.plugins.spec import (
    DecoderBatch,
    DecoderModel,
    EncoderBatch,
    EncoderModel,
    ItemErrorCode,
    ModelSpec,
    RequestError,
    RequestErrorCode,
    RowError,
    RowOutput,
    WorkItem,
    clip,
    decoder_positions,
    weight_files,
)

__all__ = [
    "BATCHING",
    "DTYPES",
    "EXACT",
    "MAX_SPEED",
    "OVERFLOW_MODES",
    "Accelerator",
    "Answer",
    "ClassifyAnswer",
    "ClassifyRequest",
    "ClassifyResult",
    "ClassifyWindow",
    "DecoderBatch",
    "DecoderModel",
    "DeviceInfo",
    "EmbeddingCard",
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
    "LoadedModel",
    "Mirror",
    "ModelEntry",
    "ModelSpec",
    "Overflow",
    "PackageError",
    "Plan",
    "Profile",
    "ReferenceFileError",
    "RequestError",
    "RequestErrorCode",
    "RerankAnswer",
    "RerankCard",
    "RerankRequest",
    "RerankResult",
    "RowError",
    "RowOutput",
    "Span",
    "SurfaceAnswer",
    "SurfaceExtension",
    "SurfaceModel",
    "SurfaceRequest",
    "TokenProbabilities",
    "Usage",
    "WorkItem",
    "clip",
    "decoder_positions",
    "embedding_error",
    "embedding_item",
    "embeddings_answer",
    "embeddings_usage",
    "hookimpl",
    "input_usage",
    "intact_build",
    "item_error",
    "left_padded",
    "read_config",
    "read_json",
    "read_reference_file",
    "read_request",
    "remembered_sha256",
    "right_padded",
    "runtime_cache_dir",
    "select_kernel",
    "sha256_file",
    "slug",
    "split_rows",
    "torch_devices",
    "torch_memory_info",
    "usage",
    "weight_files",
    "write_reference_answers",
]
