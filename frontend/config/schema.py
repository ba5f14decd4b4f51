"""The schema of ``config.yaml``: pydantic v2 models that refuse what they do not know.

Every model forbids extra keys, and every problem is reported with the key path
it was found at (``global.model_catalog.deployments.primary.replicas[1].device:
...``), so an operator can find it in the file. The deployment rules and their
messages are upstream's (``pkg/config``): an operator who knows those messages
reads the same ones here. :func:`load_config` reads a file, :func:`parse_config`
a document already read; both raise :class:`ConfigError` listing every problem.

Why one module of a thousand lines: it is the schema of one document, a class per mapping
read top to bottom against ``config.yaml`` and upstream's messages, and the reading at its
end walks those classes to name each problem's key path and what its mapping takes; Router
mode's sections already live in :mod:`.routing`, and splitting the rest would scatter one
document.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from .base import Strict, placeholder, problem
from .durations import parse_duration
from .routing import (
    Providers,
    Routing,
    decision_problems,
    refused_provider_keys,
    refused_routing_keys,
)

DEFAULT_DECISION_DEPLOYMENT = "primary"
"""The key of the default decision deployment when ``system.decision_model`` names none."""

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
"""The artifact of a default decision deployment nobody configured: the runtime's
built-in MiniLM, which answers System One questions through its similarity readout."""

MAX_REPLICAS = 64
"""Most worker placements of one deployment."""

CONTRACTS = (
    "decision.v1",
    "label_distribution.v1",
    "label_scores.v1",
    "token_spans.v1",
    "embedding.v1",
    "relevance_scores.v1",
)
"""The answer kinds a binding may ask a deployment for."""

BINDINGS = (
    "domain_classifier",
    "pii_classifier",
    "prompt_guard",
    "fact_check_classifier",
    "feedback_detector",
    "modality_detector",
    "hallucination_detector",
    "embedding",
    "rag.reranker",
)
"""The features a binding may connect, besides ``safety.<rule>`` and ``classifier.<rule>``."""

BINDING_PREFIXES = ("safety.", "classifier.")
"""Binding names that carry a rule name after the prefix."""

OVERFLOW = ("reject", "truncate", "window")
"""What a task deployment does with an input longer than ``input.max_tokens``."""

REMOVED_FIELDS = (
    "candle",
    "ort",
    "openvino",
    "precision",
    "variant",
    "use_mmbert_32k",
    "use_nli",
    "polarity_guard",
)
"""Model execution fields older configurations carried; ``vllm-sr config migrate``
removes them."""

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
REVISION = re.compile(r"^[0-9a-f]{40}$")
DEVICE = re.compile(r"^[a-z][a-z0-9_]*(:[0-9]+)?$")
PROFILE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
"""A numeric profile's name, as the runtime takes it: lower-case letters, digits and ``_``,
starting with a letter, at most 64 characters."""

PROFILE_MESSAGE = (
    "profile must be a profile name (lower-case letters, digits and _, starting with a "
    "letter, at most 64 characters), such as exact, batching or max_speed"
)

DEVICE_MESSAGE = (
    "device must be an accelerator name with an optional index, such as cpu, cuda:0 or rocm:1"
)

SYSTEMONE_SCHEMAS = ("vllm-sr/5.0", "vllm-sr/4.0", "jev")
"""The System One schemas a worker can answer ``/v1/systemone`` and ``/v1/systemone/batch``
in (the runtime's ``--systemone-schema``); the first is the default."""

DEFAULT_SYSTEMONE_SCHEMA = SYSTEMONE_SCHEMAS[0]

JEV_SCHEMA = "jev"
"""TypeSafe's Jev API (``typesafe-sdk``): a listener whose System One deployments all
answer in it speaks Jev's error shapes too."""

SYSTEMONE_SCHEMA_MESSAGE = f"systemone_schema must be one of {', '.join(SYSTEMONE_SCHEMAS)}"


class ConfigError(Exception):
    """A configuration that cannot be served.

    Attributes:
        problems: one line per problem, each ``<key path>: <what is wrong>`` (or
            only the message when it concerns the whole file).
    """

    def __init__(self, problems: list[str], source: str = "") -> None:
        self.problems = problems
        self.source = source
        where = f"{source}: " if source else ""
        if len(problems) == 1:
            text = f"{where}{problems[0]}"
        else:
            text = f"{where}{len(problems)} problems:\n" + "\n".join(f"  {p}" for p in problems)
        super().__init__(text)


_problem = problem


def endpoint_problem(endpoint: str) -> str | None:
    """What is wrong with an attached ``endpoint``, or ``None``.

    ``http://host:port``, ``https://host:port`` or ``unix:///absolute/socket``.
    """
    try:
        parts = urlsplit(endpoint)
    except ValueError:
        return "endpoint must use unix://, http:// or https://"
    if parts.scheme not in ("unix", "http", "https"):
        return "endpoint must use unix://, http:// or https://"
    if (found := placeholder("endpoint", endpoint)) is not None:
        return found.message()
    if parts.scheme == "unix":
        if parts.netloc or not parts.path.startswith("/") or parts.path == "/":
            return (
                "endpoint unix:// needs an absolute socket path (unix:///run/vllm-sr/runtime.sock)"
            )
        return None
    try:
        parts.port  # noqa: B018 - a malformed port raises here
    except ValueError:
        return "endpoint needs a host"
    if not parts.hostname:
        return "endpoint needs a host"
    return None


def is_local_artifact(artifact: str) -> bool:
    """Whether ``artifact`` is a local package (an absolute path), not a Hub repository."""
    return artifact.startswith("/")


class Input(Strict):
    """A task deployment's input limit: the longest input and what to do past it."""

    max_tokens: int | None = None
    overflow: str | None = None

    @field_validator("max_tokens")
    @classmethod
    def _max_tokens(cls, value: int | None) -> int | None:
        if value is not None and value < 0:
            raise _problem("input.max_tokens must not be negative")
        return value

    @field_validator("overflow")
    @classmethod
    def _overflow(cls, value: str | None) -> str | None:
        if value is not None and value not in OVERFLOW:
            quoted = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
            raise _problem(f"unsupported input.overflow {quoted}")
        return value


class Replica(Strict):
    """One worker placement: a managed ``device``, or an attached ``endpoint`` (with the
    ``served_name`` of the model on it). Both empty: a managed worker on ``auto``."""

    device: str | None = None
    endpoint: str | None = None
    served_name: str | None = None

    @property
    def attached(self) -> bool:
        return bool(self.endpoint)

    def key(self) -> dict[str, str]:
        """The placement as the replica id hashes it: only the keys given, in schema order."""
        return {
            k: v
            for k, v in (
                ("device", self.device),
                ("endpoint", self.endpoint),
                ("served_name", self.served_name),
            )
            if v
        }


ENGINE_ARGS = (
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "batch_window_ms",
    "dtype",
    "enable_shared_context",
)
"""Deployment keys that become the managed worker's engine arguments (models-file keys)."""


class Deployment(Strict):
    """A named model under ``global.model_catalog.deployments`` (see the deployments guide)."""

    provider: Literal["model_runtime"]
    artifact: str | None = None
    revision: str | None = None
    public_name: str | None = None
    device: str | None = None
    profile: str = "exact"
    input: Input | None = None
    endpoint: str | None = None
    served_name: str | None = None
    replicas: list[Replica] = Field(default_factory=list)
    max_model_len: int | None = Field(default=None, gt=0)
    max_num_seqs: int | None = Field(default=None, gt=0)
    max_num_batched_tokens: int | None = Field(default=None, gt=0)
    batch_window_ms: float | None = Field(default=None, ge=0)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = None
    enable_shared_context: bool | None = None
    systemone_schema: str | None = None

    @field_validator("artifact")
    @classmethod
    def _artifact(cls, value: str | None) -> str | None:
        if value is not None and not (HUB_ID.match(value) or is_local_artifact(value)):
            raise _problem("artifact must be a Hub repository ID or an absolute package path")
        return value

    @field_validator("revision")
    @classmethod
    def _revision(cls, value: str | None) -> str | None:
        if value is not None and not REVISION.match(value):
            raise _problem("revision must be a 40-hex commit")
        return value

    @field_validator("public_name")
    @classmethod
    def _public_name(cls, value: str | None) -> str | None:
        if value is not None and (not value or value != value.strip()):
            raise _problem("public_name must be a trimmed, non-empty model ID")
        return value

    @field_validator("device")
    @classmethod
    def _device(cls, value: str | None) -> str | None:
        if value is not None and not DEVICE.match(value):
            raise _problem(DEVICE_MESSAGE)
        return value

    @field_validator("profile")
    @classmethod
    def _profile(cls, value: str) -> str:
        if not PROFILE.match(value):
            raise _problem(PROFILE_MESSAGE)
        return value

    @field_validator("systemone_schema")
    @classmethod
    def _systemone_schema(cls, value: str | None) -> str | None:
        if value is not None and value not in SYSTEMONE_SCHEMAS:
            quoted = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
            raise _problem(f"{SYSTEMONE_SCHEMA_MESSAGE}, not {quoted}")
        return value

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None:
            problem = endpoint_problem(value)
            if problem:
                raise _problem(problem)
        return value

    @model_validator(mode="after")
    def _placements(self) -> Deployment:
        if self.replicas:
            if self.device or self.endpoint or self.served_name:
                raise _problem(
                    "replicas cannot be combined with deployment device, endpoint or served_name"
                )
            if len(self.replicas) > MAX_REPLICAS:
                raise _problem(f"replicas must contain at most {MAX_REPLICAS} worker placements")
            seen: set[tuple[str, str]] = set()
            for index, replica in enumerate(self.replicas):
                problem = self._replica_problem(replica, seen)
                if problem:
                    raise _problem(f"replica {index}: {problem}")
        else:
            if self.endpoint and self.device:
                raise _problem("an attached endpoint cannot set device")
            if self.served_name is not None and not self.endpoint:
                raise _problem(
                    "served_name selects a model on an attached endpoint; a managed deployment "
                    "is served under its own name"
                )
            if self.served_name is not None and not _trimmed(self.served_name):
                raise _problem("served_name must be a trimmed model name")
        if self.artifact is None and self.managed_placements():
            raise _problem(
                "a managed model_runtime deployment requires artifact "
                "(a Hub repository or an absolute package path)"
            )
        if self.revision is not None and self.artifact and is_local_artifact(self.artifact):
            raise _problem("revision applies only to Hub repositories")
        if self.max_model_len is not None and (self.endpoint or self.replicas):
            raise _problem("max_model_len applies only to a managed worker")
        given = [k for k in ENGINE_ARGS if getattr(self, k) is not None]
        if given and not self.managed_placements():
            raise _problem(
                f"{given[0]} applies only to a managed worker; an attached runtime takes its "
                "engine arguments on its own command line"
            )
        return self

    @staticmethod
    def _replica_problem(replica: Replica, seen: set[tuple[str, str]]) -> str | None:
        if replica.endpoint:
            if replica.device:
                return "an attached endpoint cannot set device"
            problem = endpoint_problem(replica.endpoint)
            if problem:
                return problem
            if replica.served_name is not None and not _trimmed(replica.served_name):
                return "served_name must be a trimmed model name"
            key = (replica.endpoint, replica.served_name or "")
            if key in seen:
                return "duplicate attached worker"
            seen.add(key)
            return None
        if replica.served_name is not None:
            if not _trimmed(replica.served_name):
                return "served_name must be a trimmed model name"
            return "served_name requires an attached endpoint"
        if replica.device is not None and not DEVICE.match(replica.device):
            return DEVICE_MESSAGE
        return None

    def placements(self) -> list[Replica]:
        """The worker placements: ``replicas``, or the one the deployment-level fields make
        (an empty device and endpoint mean a managed worker on ``auto``)."""
        if self.replicas:
            return [
                r if (r.device or r.endpoint) else r.model_copy(update={"device": "auto"})
                for r in self.replicas
            ]
        if self.endpoint:
            return [Replica(endpoint=self.endpoint, served_name=self.served_name)]
        return [Replica(device=self.device or "auto")]

    def managed_placements(self) -> list[Replica]:
        return [p for p in self.placements() if not p.attached]

    @property
    def managed(self) -> bool:
        """Whether any worker of this deployment is started by the frontend."""
        return bool(self.managed_placements())

    def public_id(self) -> str | None:
        """The native API id: ``public_name``, else the Hub artifact id (a local artifact
        has none without ``public_name``)."""
        if self.public_name:
            return self.public_name
        if self.artifact and not is_local_artifact(self.artifact):
            return self.artifact
        return None

    def engine_args(self) -> dict[str, Any]:
        """The engine arguments given, as models-file keys."""
        return {k: getattr(self, k) for k in ENGINE_ARGS if getattr(self, k) is not None}

    @property
    def served_systemone_schema(self) -> str:
        """The System One schema its workers answer in: ``systemone_schema``, else
        :data:`DEFAULT_SYSTEMONE_SCHEMA`. A managed worker gets it in its models file; an
        attached one was started with it (the key declares it, the frontend cannot set it)."""
        return self.systemone_schema or DEFAULT_SYSTEMONE_SCHEMA


def _trimmed(name: str) -> bool:
    return bool(name) and name == name.strip()


class Binding(Strict):
    """A feature's deployment and the kind of answer it reads from it."""

    deployment: str
    contract: str
    head: str | None = None

    @field_validator("contract")
    @classmethod
    def _contract(cls, value: str) -> str:
        if value not in CONTRACTS:
            raise _problem(f"contract must be one of {', '.join(CONTRACTS)}")
        return value


class DecisionModel(Strict):
    deployment: str


class System(Strict):
    decision_model: DecisionModel | None = None

    @model_validator(mode="before")
    @classmethod
    def _shape(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "decision_model" in data:
            value = data["decision_model"]
            if not (
                isinstance(value, Mapping)
                and list(value) == ["deployment"]
                and isinstance(value["deployment"], str)
                and value["deployment"]
            ):
                raise _problem("decision_model must be {deployment: <declared deployment key>}")
        return data


GUARD_ACTIONS = ("allow", "block")
"""What a guard module does on a failure (``on_error``) or an input it could not read in
full (``on_unscanned``)."""


def _action(value: str, key: str) -> str:
    if value not in GUARD_ACTIONS:
        raise _problem(f"{key} must be allow or block, not {value!r}")
    return value


class GuardModule(Strict):
    """A safety module (``modules.prompt_guard``, ``modules.classifier.pii``)."""

    threshold: float = Field(default=0.7, ge=0.0, le=1.0)
    on_error: str = "allow"
    on_unscanned: str = "block"

    @field_validator("on_error")
    @classmethod
    def _on_error(cls, value: str) -> str:
        return _action(value, "on_error")

    @field_validator("on_unscanned")
    @classmethod
    def _on_unscanned(cls, value: str) -> str:
        return _action(value, "on_unscanned")


class PiiModule(GuardModule):
    threshold: float = Field(default=0.9, ge=0.0, le=1.0)


class DomainModule(Strict):
    threshold: float = Field(default=0.5, ge=0.0, le=1.0)
    on_error: str = "allow"

    @field_validator("on_error")
    @classmethod
    def _on_error(cls, value: str) -> str:
        return _action(value, "on_error")


class ClassifierModules(Strict):
    domain: DomainModule = Field(default_factory=DomainModule)
    pii: PiiModule = Field(default_factory=PiiModule)


class Modules(Strict):
    """``global.model_catalog.modules``: the guards' and the domain classifier's settings."""

    prompt_guard: GuardModule = Field(default_factory=GuardModule)
    classifier: ClassifierModules = Field(default_factory=ClassifierModules)


class EmbeddingConfig(Strict):
    top_k: int = Field(default=1, ge=0)


class SemanticEmbeddings(Strict):
    embedding_config: EmbeddingConfig = Field(default_factory=EmbeddingConfig)


class EmbeddingsCatalog(Strict):
    """``global.model_catalog.embeddings``: ``semantic.embedding_config.top_k`` (how many
    matching embedding rules are emitted; 0: every one)."""

    semantic: SemanticEmbeddings = Field(default_factory=SemanticEmbeddings)


MAX_SIGNAL_TIMEOUT_MS = 3_600_000


class ModelCatalog(Strict):
    signal_timeout_ms: int | None = None
    modules: Modules = Field(default_factory=Modules)
    embeddings: EmbeddingsCatalog = Field(default_factory=EmbeddingsCatalog)
    deployments: dict[str, Deployment] = Field(default_factory=dict)
    bindings: dict[str, Binding] = Field(default_factory=dict)
    system: System = Field(default_factory=System)

    @field_validator("signal_timeout_ms")
    @classmethod
    def _signal_timeout(cls, value: int | None) -> int | None:
        if value is not None and not 0 <= value <= MAX_SIGNAL_TIMEOUT_MS:
            raise _problem(
                f"global.model_catalog.signal_timeout_ms must be between 0 and "
                f"{MAX_SIGNAL_TIMEOUT_MS}"
            )
        return value

    @field_validator("deployments")
    @classmethod
    def _names(cls, value: dict[str, Deployment]) -> dict[str, Deployment]:
        for name in value:
            if not _trimmed(name):
                raise _problem(f"deployment name {name!r} must be a trimmed, non-empty key")
        return value

    @field_validator("bindings")
    @classmethod
    def _binding_names(cls, value: dict[str, Binding]) -> dict[str, Binding]:
        for name in value:
            if name in BINDINGS:
                continue
            if name.startswith(BINDING_PREFIXES) and name.split(".", 1)[1]:
                continue
            raise _problem(
                f"unknown binding {name}; bindings are {', '.join(BINDINGS)}, "
                "safety.<rule> and classifier.<rule>"
            )
        return value

    @model_validator(mode="after")
    def _references(self) -> ModelCatalog:
        chosen = self.system.decision_model
        if chosen is not None and chosen.deployment not in self.deployments:
            raise _problem("decision_model must be {deployment: <declared deployment key>}")
        for name, binding in self.bindings.items():
            if binding.deployment not in self.deployments:
                raise _problem(
                    f"binding {name} names deployment {binding.deployment}, which is not "
                    "declared under deployments"
                )
        public: dict[str, str] = {}
        for name, deployment in self.deployments.items():
            public_id = deployment.public_id()
            if public_id is None:
                continue
            if public_id in public:
                raise _problem(
                    f"deployments {public[public_id]} and {name} share the public name "
                    f"{public_id}; give one of them another public_name"
                )
            public[public_id] = name
        return self

    @property
    def decision_deployment(self) -> str:
        """The default decision deployment's key (``primary`` unless configured)."""
        chosen = self.system.decision_model
        return chosen.deployment if chosen is not None else DEFAULT_DECISION_DEPLOYMENT


class Router(Strict):
    """``global.router``: the mode (``enabled``: Router mode) and the auto model names."""

    enabled: bool = True
    auto_model_name: str | None = None
    auto_model_names: list[str] | None = None
    include_config_models_in_list: bool = False
    strategy: Literal["priority", "confidence"] | None = None

    @field_validator("auto_model_names")
    @classmethod
    def _names(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (not value or any(not _trimmed(n) for n in value)):
            raise _problem("auto_model_names must list trimmed, non-empty model names")
        return value


class ResponseCacheStore(Strict):
    """``global.stores.response_cache``: the in-memory store every ``response_cache``
    plugin uses."""

    enabled: bool = True
    backend_type: Literal["memory"] = "memory"
    max_entries: int = Field(default=1000, gt=0)
    ttl_seconds: float = Field(default=3600, gt=0)
    eviction_policy: Literal["fifo", "lru"] = "fifo"
    similarity_threshold: float | None = Field(default=None, ge=-1.0, le=1.0)

    @field_validator("backend_type", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> Any:
        if value != "memory":
            raise _problem(
                f"backend_type {value} is not supported by this vllm-sr; Router mode supports "
                "memory"
            )
        return value


class Stores(Strict):
    response_cache: ResponseCacheStore = Field(default_factory=ResponseCacheStore)


class RoutingPreviewService(Strict):
    request_timeout_seconds: int = Field(default=120, ge=1, le=3600)
    max_concurrency: int = Field(default=16, ge=1)


class ApiService(Strict):
    routing_preview: RoutingPreviewService = Field(default_factory=RoutingPreviewService)


class Services(Strict):
    """``global.services``: only ``api.routing_preview`` (every other service is refused)."""

    api: ApiService = Field(default_factory=ApiService)


class Global(Strict):
    router: Router = Field(default_factory=Router)
    model_catalog: ModelCatalog = Field(default_factory=ModelCatalog)
    stores: Stores = Field(default_factory=Stores)
    services: Services = Field(default_factory=Services)


class Grant(Strict):
    """A listener's grant: the public model ids it publishes."""

    models: list[str] = Field(default_factory=list)

    @field_validator("models")
    @classmethod
    def _ids(cls, value: list[str]) -> list[str]:
        for model in value:
            if not _trimmed(model):
                raise _problem("models must list trimmed, non-empty public model IDs")
        return value


WILDCARD_ADDRESSES = frozenset({"0.0.0.0", "::", "[::]"})
"""Addresses that bind every interface: a port bound there is taken on all of them."""


class Listener(Strict):
    """An API listener: where it binds, who may call it and what it publishes.

    ``systemone`` publishes the native System One API; ``runtime`` (this project's
    extension) publishes the worker surfaces (embeddings, classify, rerank, bundle).
    ``models`` is the Chat allow-list, which never grants native access.
    """

    name: str
    address: str = "127.0.0.1"
    port: int = Field(ge=1, le=65535)
    api_keys: list[str] = Field(default_factory=list)
    models: list[str] = Field(default_factory=list)
    systemone: Grant = Field(default_factory=Grant)
    runtime: Grant = Field(default_factory=Grant)
    timeout: str | None = None

    @field_validator("timeout")
    @classmethod
    def _timeout(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            seconds = parse_duration(value)
        except ValueError as err:
            raise _problem(f"timeout must be a Go duration such as 300s or 5m: {err}") from None
        if seconds <= 0:
            raise _problem("timeout must be above 0 (leave it out for no request deadline)")
        return value

    @property
    def timeout_seconds(self) -> float | None:
        """``timeout`` in seconds, or ``None``."""
        return parse_duration(self.timeout) if self.timeout is not None else None

    @field_validator("name", "address")
    @classmethod
    def _text(cls, value: str) -> str:
        if not _trimmed(value):
            raise _problem("must be a trimmed, non-empty text")
        return value

    @field_validator("api_keys")
    @classmethod
    def _keys(cls, value: list[str]) -> list[str]:
        if any(not key or key != key.strip() for key in value):
            raise _problem("api_keys must be trimmed, non-empty keys")
        for index, key in enumerate(value):
            if (found := placeholder(f"api_keys[{index}]", key)) is not None:
                raise found
        if any(not all("!" <= char <= "~" for char in key) for key in value):
            raise _problem(
                "api_keys must be printable ASCII without spaces (what an Authorization or "
                "Api-Key header carries byte for byte); generate keys from letters, digits "
                "and punctuation"
            )
        return value


class Config(Strict):
    """The whole ``config.yaml``."""

    version: str | None = None
    global_: Global = Field(default_factory=Global, alias="global")
    listeners: list[Listener] = Field(default_factory=list)
    providers: Providers = Field(default_factory=Providers)
    routing: Routing = Field(default_factory=Routing)

    @field_validator("version")
    @classmethod
    def _version(cls, value: str | None) -> str | None:
        if value is not None and value != "v0.3":
            raise _problem(
                f"version must be v0.3 (the configuration this vllm-sr reads), not {value}"
            )
        return value

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    @model_validator(mode="after")
    def _listeners(self) -> Config:
        names: set[str] = set()
        binds: dict[tuple[str, int], str] = {}
        for listener in self.listeners:
            if listener.name in names:
                raise _problem(f"two listeners are named {listener.name}; give each its own name")
            names.add(listener.name)
            for (address, port), other in binds.items():
                wildcard = {address, listener.address} & WILDCARD_ADDRESSES
                if port == listener.port and (address == listener.address or wildcard):
                    raise _problem(
                        f"listeners {other} and {listener.name} both bind port {port} "
                        f"({address} and {listener.address}); give each its own port"
                    )
            binds[(listener.address, listener.port)] = listener.name
        return self

    @property
    def strategy(self) -> str:
        """The ranking strategy: ``routing.strategy``, else ``global.router.strategy``, else
        ``priority``."""
        return self.routing.strategy or self.global_.router.strategy or "priority"

    @property
    def catalog(self) -> ModelCatalog:
        return self.global_.model_catalog

    @property
    def router_enabled(self) -> bool:
        return self.global_.router.enabled

    def deployment_for_public_id(self, public_id: str) -> str | None:
        """The deployment a public model id names, or ``None``."""
        for name, deployment in self.catalog.deployments.items():
            if deployment.public_id() == public_id:
                return name
        return None

    def document(self) -> dict[str, Any]:
        """The configuration as a YAML-ready mapping (defaults left out)."""
        return self.model_dump(by_alias=True, exclude_defaults=True, mode="json")


def routing_problems(config: Config) -> list[str]:
    """Every problem of ``routing`` against the rest of the document: decision trees and
    references (upstream's messages), PII signals without their binding, question
    deployments not declared, bindings read under another contract."""
    problems = decision_problems(config.routing, config.providers)
    catalog = config.global_.model_catalog
    signals = config.routing.signals
    if signals.pii and "pii_classifier" not in catalog.bindings:
        problems.append(
            "pii signals need global.model_catalog.bindings.pii_classifier "
            "(contract token_spans.v1)"
        )
    for rule in signals.decision:
        if rule.deployment is not None and rule.deployment not in catalog.deployments:
            problems.append(
                f"routing.signals.decision {rule.name}: deployment {rule.deployment} is not "
                "declared under global.model_catalog.deployments"
            )
    if signals.language and importlib.util.find_spec("lingua") is None:
        problems.append(
            "routing.signals.language: language signals need the lingua-language-detector "
            "package; install it with pip install 'vllm-sr[language]', or remove them"
        )
    router = config.router_enabled and bool(config.providers.models)
    for name, contract in ROUTER_BINDINGS.items() if router else ():
        binding = catalog.bindings.get(name)
        if binding is not None and binding.contract != contract:
            problems.append(
                f"global.model_catalog.bindings.{name}: Router mode reads it as {contract}, "
                f"not {binding.contract}"
            )
    return problems


ROUTER_BINDINGS = {
    "pii_classifier": "token_spans.v1",
    "prompt_guard": "label_distribution.v1",
    "domain_classifier": "label_distribution.v1",
    "embedding": "embedding.v1",
}
"""The bindings Router mode's signals read, and the contract each is read under."""


# -- reading -----------------------------------------------------------------------------------
def key_path(loc: tuple[int | str, ...]) -> str:
    """``global.model_catalog.deployments.primary.replicas[1].device`` from a pydantic loc."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += ("." if text else "") + ("global" if part == "global_" else str(part))
    return text


def _allowed_keys(model: type[BaseModel]) -> tuple[str, ...]:
    return tuple(f.alias or name for name, f in model.model_fields.items())


def _walk(model: Any, parts: list[int | str]) -> Any:
    """The schema type at the path ``parts`` below ``model`` (lists and dicts stepped over)."""
    for part in parts:
        origin = getattr(model, "__origin__", None)
        args: tuple[Any, ...] = getattr(model, "__args__", ())
        if origin in (list, dict):
            model = args[-1]
            continue
        if isinstance(model, type) and issubclass(model, BaseModel):
            fields = {f.alias or n: f for n, f in model.model_fields.items()}
            if str(part) not in fields:
                return None
            model = fields[str(part)].annotation
            if getattr(model, "__args__", None) and type(None) in model.__args__:
                model = next(a for a in model.__args__ if a is not type(None))
            continue
        return None
    return model


def _problems(err: ValidationError) -> list[str]:
    problems = []
    for item in err.errors():
        loc = tuple(item["loc"])
        if item["type"] == "extra_forbidden":
            parent = _walk(Config, list(loc[:-1]))
            allowed = _allowed_keys(parent) if isinstance(parent, type) else ()
            message = f"unknown key {loc[-1]}"
            if allowed:
                message += f"; this mapping takes {', '.join(allowed)}"
            problems.append(f"{key_path(loc)}: {message}")
            continue
        message = item["msg"]
        if item["type"] == "literal_error" and loc and loc[-1] == "provider":
            message = "provider must be model_runtime"
        path = key_path(loc)
        problems.append(f"{path}: {message}" if path else message)
    return problems


def _not_refused(problems: list[str], refused: list[str]) -> list[str]:
    """``problems`` less those at or under a key path a refusal names (the refusal says
    it better than ``unknown key``), including a mapping's own problem that names the
    refused key first (``plugins[0]: configuration.scope is not supported ...``)."""
    paths = [r.split(": ", 1)[0] for r in refused]

    def refused_at(where: str) -> bool:
        return any(where == path or where.startswith((f"{path}.", f"{path}[")) for path in paths)

    kept = []
    for found in problems:
        where, _, message = found.partition(": ")
        named = message.split(" ", 1)[0]
        if refused_at(where) or (named and refused_at(f"{where}.{named}")):
            continue
        kept.append(found)
    return kept


def _removed_fields(document: Any) -> Iterator[str]:
    """A problem for each removed model execution field under a deployment."""
    if not isinstance(document, Mapping):
        return
    catalog = (document.get("global") or {}) if isinstance(document.get("global"), Mapping) else {}
    catalog = catalog.get("model_catalog") if isinstance(catalog, Mapping) else None
    deployments = catalog.get("deployments") if isinstance(catalog, Mapping) else None
    if not isinstance(deployments, Mapping):
        return
    for name, deployment in deployments.items():
        if not isinstance(deployment, Mapping):
            continue
        found = [key for key in deployment if key in REMOVED_FIELDS]
        if found:
            yield (
                f"global.model_catalog.deployments.{name}: removed model execution fields "
                f"{', '.join(found)} (candle, ort, openvino, precision, variant, use_mmbert_32k, "
                "use_nli and polarity_guard are gone); run `vllm-sr config migrate FILE`"
            )


def parse_config(document: Any, source: str = "") -> Config:
    """Validate a configuration document (the YAML already read).

    Raises:
        ConfigError: every problem found, each with its key path.
    """
    if document is None:
        document = {}
    if not isinstance(document, Mapping):
        raise ConfigError(["the configuration must be a mapping (global:, listeners:)"], source)
    removed = list(_removed_fields(document))
    if removed:
        raise ConfigError(removed, source)
    refused = refused_routing_keys(document) + refused_provider_keys(document)
    try:
        config = Config.model_validate(dict(document))
    except ValidationError as err:
        # Every problem at once: the refusals (which say why), then the schema's problems
        # at paths no refusal already names.
        raise ConfigError(refused + _not_refused(_problems(err), refused), source) from None
    if refused:
        raise ConfigError(refused, source)
    problems = routing_problems(config)
    if problems:
        raise ConfigError(problems, source)
    return config


def read_document(path: str | Path) -> dict[str, Any]:
    """The YAML mapping in ``path`` (an empty file is an empty mapping).

    Raises:
        ConfigError: the file cannot be read, is not YAML, or is not a mapping.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError([f"cannot be read: {err.strerror or err}"], str(path)) from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            [f"is not UTF-8 text (byte {err.start}): save it as UTF-8 YAML"], str(path)
        ) from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError([f"is not valid YAML: {err}"], str(path)) from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ConfigError(["the configuration must be a mapping (global:, listeners:)"], str(path))
    return document


def load_config(path: str | Path) -> Config:
    """Read and validate ``path``.

    Raises:
        ConfigError: unreadable, not YAML, or invalid (every problem with its key path).
    """
    return parse_config(read_document(path), str(path))


def migrate_document(document: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``document`` without the removed model execution fields, and what was removed
    (``deployments.<name>.<field>``)."""
    removed: list[str] = []
    glob = document.get("global") if isinstance(document, dict) else None
    catalog = glob.get("model_catalog") if isinstance(glob, dict) else None
    deployments = catalog.get("deployments") if isinstance(catalog, dict) else None
    if isinstance(deployments, dict):
        for name, deployment in deployments.items():
            if isinstance(deployment, dict):
                for key in [k for k in deployment if k in REMOVED_FIELDS]:
                    del deployment[key]
                    removed.append(f"global.model_catalog.deployments.{name}.{key}")
    return document, removed
