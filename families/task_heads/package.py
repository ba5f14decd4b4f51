"""Reading an encoder package: what it is, which heads it answers, what its limits are.

Only configuration files are read here (``config.json``, the
sentence-transformers files, the tokenizer's config); no weights load.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_srun.plugins.package import PackageError, read_config, read_json
from vllm_srun.plugins.spec import ModelSpec, weight_files

ENCODER_MODEL_TYPES = frozenset(
    {
        "albert",
        "bert",
        "camembert",
        "deberta",
        "deberta-v2",
        "distilbert",
        "electra",
        "modernbert",
        "mpnet",
        "roberta",
        "xlm-roberta",
    }
)
"""transformers model types this family serves (encoders without remote code)."""

POSITION_OFFSET_MODEL_TYPES = frozenset({"camembert", "mpnet", "roberta", "xlm-roberta"})
"""Model types whose position ids start at ``pad_token_id + 1`` (fairseq's RoBERTa
convention, ``create_position_ids_from_input_ids`` in transformers), so that many
fewer positions are usable than ``max_position_embeddings``."""

LARGE_MODEL_MAX_LENGTH = 1_000_000
"""transformers writes ``model_max_length`` of about 1e30 when a tokenizer has no limit."""

POOLING_MODES = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_lasttoken": "lasttoken",
}
"""sentence-transformers Pooling config keys, to this family's pooling names."""

THRESHOLDS_FILE = "thresholds.json"
"""Optional per-label thresholds of a multi-label head: ``{"label": 0.5, ...}``."""

MATRYOSHKA_KEY = "matryoshka_dimensions"
"""The ``config.json`` key (vLLM's and the Jina/Qwen embedders' spelling) listing the
shorter sizes a Matryoshka-trained embedder was trained to answer at."""

LAYER_KEYS = ("num_hidden_layers", "n_layers")
"""``config.json`` keys of an encoder's number of hidden layers (DistilBERT says ``n_layers``)."""


@dataclass(frozen=True)
class Head:
    """One head of a task model, as ``/v1/models`` lists it.

    Attributes:
        name: the head's name (``classify`` requests select it with ``head``).
        kind: ``sequence`` (softmax label distribution), ``scores`` (sigmoid per
            label), ``token`` (BIO spans), ``pooled`` (embeddings) or
            ``relevance`` (cross-encoder score of a text pair).
        labels: label names in ``id2label`` order (token heads: entity types
            without B-/I-, and the raw BIO tags stay in ``tags``).
        tags: the raw ``id2label`` list.
        thresholds: per-label thresholds of a ``scores`` head, when the package has them.
        thresholds_sha256: the SHA-256 (hex) of the package's ``thresholds.json``
            those thresholds come from, else ``None``.
    """

    name: str
    kind: str
    labels: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    thresholds: tuple[float, ...] | None = None
    thresholds_sha256: str | None = None

    @property
    def surface(self) -> str:
        """The surface that answers this head."""
        return {"pooled": "embeddings", "relevance": "rerank"}.get(self.kind, "classify")


@dataclass(frozen=True)
class Pooling:
    """How hidden states become one embedding (sentence-transformers' Pooling + Normalize).

    Attributes:
        mode: ``mean``, ``cls``, ``max`` or ``lasttoken``.
        normalize: whether vectors are scaled to unit L2 norm.
        dimensions: floats per vector (the encoder's hidden size).
        matryoshka: the shorter sizes the package declares it was trained to
            answer at (``config.json`` ``matryoshka_dimensions``), largest first;
            empty when it declares none.
    """

    mode: str
    normalize: bool
    dimensions: int
    matryoshka: tuple[int, ...] = ()


@dataclass(frozen=True)
class Description:
    """Everything the family knows about a package before loading it.

    Attributes:
        spec: what engines load.
        heads: the heads it answers.
        pooling: how its embeddings are pooled (an embedder), else ``None``.
        max_tokens: its input limit in tokens, special tokens included.
        config: ``config.json``.
        layers: its number of hidden layers (the last layer's number).
        hidden_size: floats per token in its last hidden states.
    """

    spec: ModelSpec
    heads: tuple[Head, ...]
    pooling: Pooling | None
    max_tokens: int
    config: dict[str, Any]
    layers: int
    hidden_size: int


def embedding_dimensions(pooling: Pooling) -> tuple[int, ...]:
    """The vector sizes an embedder declares (the card's ``embedding.dimensions``): its
    full size, then the Matryoshka sizes its package declares, largest first."""
    return (pooling.dimensions, *(d for d in pooling.matryoshka if d != pooling.dimensions))


def sentence_transformers_modules(package: Path) -> list[str]:
    """The module types of ``modules.json`` (``sentence_transformers.models.Pooling``, ...)."""
    path = package / "modules.json"
    if not path.is_file():
        return []
    return [str(m.get("type", "")) for m in read_json(path) if isinstance(m, dict)]


def detect(package: Path) -> bool:
    """Whether ``package`` is an encoder this family serves; reads ``config.json`` only."""
    config = read_config(package)
    return config is not None and config.get("model_type") in ENCODER_MODEL_TYPES


def _task(architecture: str) -> str:
    if architecture.endswith("ForSequenceClassification"):
        return "sequence_classification"
    if architecture.endswith("ForTokenClassification"):
        return "token_classification"
    return "encoder"


def _id2label(config: dict[str, Any]) -> tuple[str, ...]:
    raw = config.get("id2label") or {}
    try:
        return tuple(str(raw[k]) for k in sorted(raw, key=int))
    except (TypeError, ValueError) as err:
        raise PackageError(f"config.json id2label must be keyed by integers: {err}") from err


def _entity_types(tags: tuple[str, ...]) -> tuple[str, ...]:
    types: list[str] = []
    for tag in tags:
        if tag == "O":
            continue
        if len(tag) < 3 or tag[:2] not in ("B-", "I-"):
            raise PackageError(f"token label {tag!r} is not a BIO tag (O, B-TYPE or I-TYPE)")
        if tag[2:] not in types:
            types.append(tag[2:])
    return tuple(types)


def _thresholds(
    package: Path, labels: tuple[str, ...]
) -> tuple[tuple[float, ...] | None, str | None]:
    """The per-label thresholds of ``thresholds.json`` and the file's SHA-256, or ``None``s."""
    path = package / THRESHOLDS_FILE
    if not path.is_file():
        return None, None
    table = read_json(path)
    missing = [label for label in labels if label not in table]
    if missing:
        raise PackageError(f"{THRESHOLDS_FILE} has no threshold for {', '.join(missing)}")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return tuple(float(table[label]) for label in labels), digest


def _positive_int(value: Any) -> int | None:
    """``value`` when it is a JSON integer above 0 (never a boolean), else ``None``."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _layers(config: dict[str, Any]) -> int:
    """The encoder's number of hidden layers.

    Raises:
        PackageError: ``config.json`` states none.
    """
    for key in LAYER_KEYS:
        found = _positive_int(config.get(key))
        if found is not None:
            return found
    raise PackageError(
        "config.json states no number of hidden layers (num_hidden_layers); add it to the "
        "package's config.json"
    )


def _matryoshka(config: dict[str, Any], dimensions: int) -> tuple[int, ...]:
    """The Matryoshka sizes ``config.json`` declares, largest first (empty when none).

    Raises:
        PackageError: the key is not a list of integers from 1 to ``dimensions``.
    """
    raw = config.get(MATRYOSHKA_KEY)
    if raw is None:
        return ()
    sizes = {_positive_int(v) for v in raw} if isinstance(raw, list) and raw else {None}
    valid = {size for size in sizes if size is not None and size <= dimensions}
    if valid != sizes:
        raise PackageError(
            f"config.json {MATRYOSHKA_KEY} must be a list of integers from 1 to the "
            f"embedding size {dimensions}, not {raw!r}; fix it or remove the key"
        )
    return tuple(sorted(valid, reverse=True))


def _pooling(package: Path, config: dict[str, Any]) -> Pooling:
    modules = sentence_transformers_modules(package)
    mode = "mean"
    path = package / "1_Pooling" / "config.json"
    pooling_dirs = [p for p in package.glob("*_Pooling") if p.is_dir()]
    if pooling_dirs and not path.is_file():
        path = pooling_dirs[0] / "config.json"
    if path.is_file():
        settings = read_json(path)
        chosen = [name for key, name in POOLING_MODES.items() if settings.get(key)]
        if len(chosen) != 1:
            raise PackageError(
                f"{path.parent.name}/config.json must enable exactly one pooling mode "
                f"({', '.join(POOLING_MODES)}), not {chosen or 'none'}"
            )
        mode = chosen[0]
    normalize = any(t.endswith(".Normalize") for t in modules)
    dimensions = _hidden_size(config)
    return Pooling(mode, normalize, dimensions, _matryoshka(config, dimensions))


def _hidden_size(config: dict[str, Any]) -> int:
    """Floats per token in the encoder's hidden states (DistilBERT says ``dim``)."""
    return int(config.get("hidden_size") or config.get("dim") or 0)


def _max_tokens(package: Path, config: dict[str, Any]) -> int:
    """The smallest of the model's limits; never the tokenizer file's truncation setting."""
    limits = []
    st = package / "sentence_bert_config.json"
    if st.is_file():
        value = read_json(st).get("max_seq_length")
        if isinstance(value, int) and value > 0:
            limits.append(value)
    tok = package / "tokenizer_config.json"
    if tok.is_file():
        value = read_json(tok).get("model_max_length")
        if isinstance(value, int | float) and 0 < value < LARGE_MODEL_MAX_LENGTH:
            limits.append(int(value))
    positions = config.get("max_position_embeddings")
    if isinstance(positions, int) and positions > 0:
        offset = 0
        if config.get("model_type") in POSITION_OFFSET_MODEL_TYPES:
            offset = int(config.get("pad_token_id") or 0) + 1
        limits.append(positions - offset)
    if not limits:
        raise PackageError("the package states no input limit (max_position_embeddings)")
    return min(limits)


def _onnx_graph(package: Path) -> str | None:
    for candidate in ("onnx/model.onnx", "model.onnx"):
        if (package / candidate).is_file():
            return candidate
    graphs = sorted(p.relative_to(package).as_posix() for p in package.glob("onnx/*.onnx"))
    return graphs[0] if graphs else None


BF16_TOLERANT_TASKS = ("encoder",)
"""Tasks whose heads keep their quality computed in bfloat16 (``ModelSpec.bf16_tolerant``):
the pooled embedding, measured on MiniLM against ``exact`` (least cosine 0.9999, top-10
neighbour overlap 0.98; ``tests/families/test_profiles_quality.py`` holds the held-out
bar of 0.999 and 0.95). Classifier and token-tagger heads are not measured on a real
model here, so they stay float32 under ``max_speed``: an argmax or a span edge may
turn on a difference bfloat16 makes."""


def describe(package: Path) -> Description:
    """Describe an encoder package: its spec for engines, its heads, pooling and limit.

    Raises:
        PackageError: the package is not a servable encoder (the message says why).
    """
    config = read_json(package / "config.json")
    model_type = str(config.get("model_type", ""))
    if model_type not in ENCODER_MODEL_TYPES:
        raise PackageError(f"model type {model_type!r} is not an encoder this family serves")
    architectures = config.get("architectures") or ["AutoModel"]
    architecture = str(architectures[0])
    task = _task(architecture)
    tags = _id2label(config)
    heads: list[Head] = []
    pooling = None
    if task == "token_classification":
        heads.append(Head("token", "token", _entity_types(tags), tags))
    elif task == "sequence_classification":
        if len(tags) == 1 or config.get("num_labels") == 1:
            heads.append(Head("relevance", "relevance", tags, tags))
        elif config.get("problem_type") == "multi_label_classification":
            thresholds, digest = _thresholds(package, tags)
            heads.append(Head("scores", "scores", tags, tags, thresholds, digest))
        else:
            heads.append(Head("sequence", "sequence", tags, tags))
    else:
        pooling = _pooling(package, config)
        heads.append(Head("pooled", "pooled"))
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    max_tokens = _max_tokens(package, config)
    spec = ModelSpec(
        package=package,
        architecture=architecture,
        model_type=model_type,
        task=task,
        weights=weight_files(package),
        onnx=_onnx_graph(package),
        released_dtype=dtype if dtype in ("float32", "bfloat16", "float16") else "float32",
        bf16_tolerant=task in BF16_TOLERANT_TASKS,
        token_limit=max_tokens,
    )
    return Description(
        spec,
        tuple(heads),
        pooling,
        max_tokens,
        config,
        layers=_layers(config),
        hidden_size=_hidden_size(config),
    )
