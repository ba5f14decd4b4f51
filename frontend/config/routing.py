"""Router mode's part of ``config.yaml``: ``providers`` (the Chat backends) and ``routing``
(signals and decisions), read strictly.

The supported core of the upstream v0.3 document (ROUTER-SPEC §1.3, §1.6-§1.9): every
key outside it is refused with its key path and a sentence saying this router does not
support it (:func:`unsupported`), never ignored. The rules and messages follow upstream
(``pkg/config``) where it has them, so an operator who knows those reads the same here.

Why one module of 800-odd lines: it is Router mode's part of one document, a class per
mapping in the order ROUTER-SPEC §1.3 and §1.6-§1.9 give them and read against that text,
followed by the refusals of the keys it leaves out and the checks across its sections (a
decision's ``modelRefs`` name ``providers.models``); split, one spec would be read across
modules.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from .base import Strict, placeholder, problem

SIGNAL_KINDS = (
    "keywords",
    "embeddings",
    "domains",
    "jailbreak",
    "pii",
    "context",
    "decision",
    "language",
)
"""The ``routing.signals`` lists Router mode supports, in the order messages name them."""

CONDITION_TYPES = {
    "keyword": "keywords",
    "embedding": "embeddings",
    "domain": "domains",
    "jailbreak": "jailbreak",
    "pii": "pii",
    "context": "context",
    "decision": "decision",
    "language": "language",
}
"""A condition's singular ``type`` and the signal list it names."""

PLUGIN_ALIASES = {
    "semantic-cache": "response_cache",
    "semantic_cache": "response_cache",
    "response-cache": "response_cache",
}
"""Other spellings of ``response_cache`` upstream accepts."""

PLUGIN_TYPES = ("system_prompt", "header_mutation", "fast_response", "response_cache")

OPERATORS = ("AND", "OR", "NOT")
LEAF_KEYS = ("type", "name", "label", "predicate", "on_error")
UNKNOWN_POLICIES = ("no_match", "match", "fail_request")

SUPPORTED = "Router mode supports"


def unsupported(path: str, what: str, supported: Sequence[str] | str = "") -> str:
    """The refusal of a key this router leaves out (ROUTER-SPEC §1.9)::

    routing.signals.reasks: reasks signals are not supported by this vllm-sr; Router mode
    supports keywords, embeddings, ...
    """
    told = supported if isinstance(supported, str) else ", ".join(supported)
    tail = f"; {SUPPORTED} {told}" if told else ""
    return f"{path}: {what} not supported by this vllm-sr{tail}"


# -- providers ---------------------------------------------------------------------------


class BackendRef(Strict):
    """One OpenAI-compatible server a provider model is sent to (``backend_refs[]``).

    ``endpoint`` is ``host:port`` (the path ``/v1/chat/completions``), or ``base_url``
    with ``chat_path`` (default ``/chat/completions``). The backend's credential is
    ``api_key`` or the environment variable ``api_key_env``, sent as
    ``<auth_header>: <auth_prefix> <key>``.
    """

    name: str | None = None
    endpoint: str | None = None
    protocol: Literal["http", "https"] = "http"
    base_url: str | None = None
    chat_path: str = "/chat/completions"
    weight: int = Field(default=1, ge=0)
    api_key: str | None = None
    api_key_env: str | None = None
    auth_header: str = "Authorization"
    auth_prefix: str = "Bearer"
    extra_headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is None:
            return value
        host, _, port = value.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536 or "/" in value:
            raise problem("endpoint must be host:port (use base_url for a URL with a path)")
        return value

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise problem("base_url must be an http:// or https:// URL with a host")
        return value

    @field_validator("chat_path")
    @classmethod
    def _chat_path(cls, value: str) -> str:
        if not value.startswith("/"):
            raise problem("chat_path must start with /")
        return value

    @model_validator(mode="after")
    def _key(self) -> BackendRef:
        if self.api_key is not None and self.api_key_env is not None:
            raise problem("give api_key or api_key_env, not both")
        credentials = [("api_key", self.api_key or ""), ("base_url", self.base_url or "")]
        credentials += [(f"extra_headers.{n}", v) for n, v in self.extra_headers.items()]
        for where, value in credentials:
            if (found := placeholder(where, value)) is not None:
                raise found
        if self.endpoint is not None and self.base_url is not None:
            raise problem("give endpoint or base_url, not both")
        return self

    @property
    def url(self) -> str:
        """The chat completions URL."""
        if self.base_url is not None:
            return self.base_url.rstrip("/") + self.chat_path
        return f"{self.protocol}://{self.endpoint}/v1/chat/completions"


class ProviderModel(Strict):
    """A Chat model (``providers.models[]``): its logical ``name`` (what decisions and
    clients use), the ``provider_model_id`` sent upstream (default: ``name``) and its
    backends."""

    name: str
    provider_model_id: str | None = None
    reasoning_family: str | None = None
    backend_refs: list[BackendRef] = Field(default_factory=list)
    api_format: Literal["openai"] = "openai"
    pricing: Any = None
    external_model_ids: Any = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not value or value != value.strip():
            raise problem("name must be a trimmed, non-empty model name")
        return value

    @property
    def upstream_id(self) -> str:
        """The ``model`` sent to the backend."""
        return self.provider_model_id or self.name


class ReasoningFamily(Strict):
    """How a model family turns reasoning on (ROUTER-SPEC §1.3)."""

    type: Literal["chat_template_kwargs", "reasoning_effort", "top_level_reasoning_effort"]
    parameter: str


class ProviderDefaults(Strict):
    """``providers.defaults``: the model when nothing matches, and reasoning defaults."""

    default_model: str | None = None
    model: str | None = None
    default_reasoning_effort: str | None = None
    reasoning_families: dict[str, ReasoningFamily] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_spelling(self) -> ProviderDefaults:
        if self.default_model is not None and self.model is not None:
            raise problem(
                "give providers.defaults.default_model (the v0.3 spelling) or "
                "providers.defaults.model, not both"
            )
        return self

    @property
    def fallback(self) -> str | None:
        """The default model's name, whichever spelling gave it."""
        return self.model if self.model is not None else self.default_model


class Providers(Strict):
    """``providers``: the Chat backends."""

    defaults: ProviderDefaults = Field(default_factory=ProviderDefaults)
    models: list[ProviderModel] = Field(default_factory=list)

    @model_validator(mode="after")
    def _models(self) -> Providers:
        names: set[str] = set()
        for model in self.models:
            if model.name in names:
                raise problem(f"two providers.models are named {model.name}; give each its own")
            names.add(model.name)
            if not model.backend_refs:
                raise problem(
                    f"providers.models[{model.name}].backend_refs requires endpoint or base_url"
                )
            for ref in model.backend_refs:
                if ref.endpoint is None and ref.base_url is None:
                    raise problem(
                        f"providers.models[{model.name}].backend_refs requires endpoint or base_url"
                    )
            family = model.reasoning_family
            if family is not None and family not in self.defaults.reasoning_families:
                raise problem(
                    f"providers.models[{model.name}].reasoning_family {family} is not declared "
                    "under providers.defaults.reasoning_families"
                )
        fallback = self.defaults.fallback
        if fallback is not None and fallback not in names:
            key = "model" if self.defaults.model is not None else "default_model"
            raise problem(
                f"providers.defaults.{key} {_quoted(fallback)} does not reference "
                "providers.models[].name"
            )
        return self

    def find(self, name: str) -> ProviderModel | None:
        """The provider model named ``name``."""
        return next((m for m in self.models if m.name == name), None)


# -- signals -----------------------------------------------------------------------------


class Rule(Strict):
    """What every signal rule has: a ``name`` (unique in its kind) and a description."""

    name: str
    description: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not value or value != value.strip():
            raise problem("name must be a trimmed, non-empty rule name")
        return value


class KeywordRule(Rule):
    """``keywords[]``: literal words (``\\b``-bounded when they hold a word character and
    no Han character) or, with ``method: regex``, regular expressions; ``operator`` OR
    (any), AND (all) or NOR (none)."""

    operator: str = "OR"
    keywords: list[str] = Field(min_length=1)
    case_sensitive: bool = False
    method: str | None = None

    @field_validator("operator")
    @classmethod
    def _operator(cls, value: str) -> str:
        if value.upper() not in ("AND", "OR", "NOR"):
            raise problem(f"operator must be AND, OR or NOR, not {_quoted(value)}")
        return value.upper()

    @field_validator("method")
    @classmethod
    def _method(cls, value: str | None) -> str | None:
        if value is not None and value != "regex":
            raise problem(
                f"method {_quoted(value)} is not supported by this vllm-sr; keywords are "
                "literal (method omitted) or regex"
            )
        return value

    @model_validator(mode="after")
    def _patterns(self) -> KeywordRule:
        if self.method == "regex":
            for keyword in self.keywords:
                try:
                    re.compile(keyword)
                except re.error as err:
                    raise problem(f"keyword {_quoted(keyword)} is not a regex: {err}") from None
        if any(not k.strip() for k in self.keywords):
            raise problem("keywords must be non-blank")
        return self


class EmbeddingRule(Rule):
    """``embeddings[]``: cosine of the evaluation text with each candidate."""

    candidates: list[str] = Field(min_length=1)
    threshold: float = Field(ge=-1.0, le=1.0)
    aggregation_method: Literal["max", "mean", "any"] = "max"


class DomainRule(Rule):
    """``domains[]``: the detected domain label is the name or one of ``mmlu_categories``."""

    mmlu_categories: list[str] = Field(default_factory=list)


class JailbreakRule(Rule):
    """``jailbreak[]``: P(jailbreak) at or above ``threshold`` (the module's by default)."""

    threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    include_history: bool = False
    method: Literal["classifier"] | None = None


class PiiRule(Rule):
    """``pii[]``: a span label at or above ``threshold`` that ``pii_types_allowed`` does
    not allow."""

    threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    pii_types_allowed: list[str] = Field(default_factory=list)
    include_history: bool = False


TOKEN_COUNT = re.compile(r"^(\d+(?:\.\d+)?)\s*([kKmM]?)$")


def token_count(value: int | str, key: str) -> int:
    """A ``context`` bound: an integer, or a number with a ``K`` (1,000) or ``M``
    (1,000,000) suffix (``32K``).

    Raises:
        PydanticCustomError: anything else.
    """
    if isinstance(value, bool):
        raise problem(f"{key} must be a token count such as 4096 or 32K")
    if isinstance(value, int):
        if value < 0:
            raise problem(f"{key} must not be negative")
        return value
    found = TOKEN_COUNT.match(value.strip())
    if not found:
        raise problem(f"{key} must be a token count such as 4096 or 32K, not {_quoted(value)}")
    scale = {"": 1, "k": 1000, "m": 1_000_000}[found[2].lower()]
    return int(float(found[1]) * scale)


class ContextRule(Rule):
    """``context[]``: the whole text's token estimate lies in ``[min_tokens, max_tokens]``."""

    min_tokens: int | str = 0
    max_tokens: int | str | None = None

    @model_validator(mode="after")
    def _bounds(self) -> ContextRule:
        low = token_count(self.min_tokens, "min_tokens")
        high = None if self.max_tokens is None else token_count(self.max_tokens, "max_tokens")
        if high is not None and high < low:
            raise problem("max_tokens must not be below min_tokens")
        self.min_tokens, self.max_tokens = low, high
        return self


class Predicate(Strict):
    """A threshold on a published value: any of ``gt``, ``gte``, ``lt``, ``lte`` (all must hold)."""

    gt: float | None = None
    gte: float | None = None
    lt: float | None = None
    lte: float | None = None

    @model_validator(mode="after")
    def _some(self) -> Predicate:
        bounds = (self.gt, self.gte, self.lt, self.lte)
        if all(b is None for b in bounds):
            raise problem("a predicate needs gt, gte, lt or lte")
        if any(b is not None and not math.isfinite(b) for b in bounds):
            raise problem("predicate bounds must be finite numbers")
        return self

    def holds(self, value: float) -> bool:
        """Whether ``value`` meets every bound given."""
        return (
            (self.gt is None or value > self.gt)
            and (self.gte is None or value >= self.gte)
            and (self.lt is None or value < self.lt)
            and (self.lte is None or value <= self.lte)
        )


QUESTION_TYPES = ("choice", "noul", "score")


class DecisionRule(Rule):
    """``decision[]``: a typed question asked of a decision deployment (``deployment``, else
    ``global.model_catalog.system.decision_model``)."""

    deployment: str | None = None
    question: dict[str, Any]
    predicate: Predicate | None = None
    timeout_ms: int = Field(default=1000, gt=0, le=60000)

    @field_validator("question")
    @classmethod
    def _question(cls, value: dict[str, Any]) -> dict[str, Any]:
        kind = value.get("type")
        if kind in ("set", "span"):
            raise problem(
                f"question.type {kind} is not supported by this vllm-sr; the decision models "
                "here answer choice, noul and score"
            )
        if kind not in QUESTION_TYPES:
            raise problem("question.type must be choice, noul or score")
        for key in ("prior_user_turns",):
            if key in value:
                raise problem(f"question.{key} is not supported by this vllm-sr")
        if kind == "choice":
            options = value.get("choices", value.get("criteria"))
            count = len(options) if isinstance(options, list | dict) else 0
            if not 2 <= count <= 255:
                raise problem("a choice question needs 2..255 choices")
        if kind == "score":
            levels = value.get("levels", value.get("criteria"))
            if not isinstance(levels, list) or not 2 <= len(levels) <= 10:
                raise problem("a score question needs 2..10 levels")
        return value

    @model_validator(mode="after")
    def _score_predicate(self) -> DecisionRule:
        if self.question.get("type") == "score" and self.predicate is None:
            raise problem("a score question needs a predicate (the expected level to meet)")
        return self

    def choice_keys(self) -> list[str]:
        """A Choice question's option keys, in order (empty for other types)."""
        options = self.question.get("choices", self.question.get("criteria"))
        if isinstance(options, dict):
            return list(options)
        if isinstance(options, list):
            return [o["key"] if isinstance(o, dict) else str(o) for o in options]
        return []


class LanguageRule(Rule):
    """``language[]``: the detected ISO 639-1 code is the name, at ``threshold`` or above."""

    threshold: float = Field(default=0.0, ge=0.0, le=1.0)


class Signals(Strict):
    """``routing.signals``: the supported kinds (:data:`SIGNAL_KINDS`)."""

    keywords: list[KeywordRule] = Field(default_factory=list)
    embeddings: list[EmbeddingRule] = Field(default_factory=list)
    domains: list[DomainRule] = Field(default_factory=list)
    jailbreak: list[JailbreakRule] = Field(default_factory=list)
    pii: list[PiiRule] = Field(default_factory=list)
    context: list[ContextRule] = Field(default_factory=list)
    decision: list[DecisionRule] = Field(default_factory=list)
    language: list[LanguageRule] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> Signals:
        for kind in SIGNAL_KINDS:
            seen: set[str] = set()
            for rule in getattr(self, kind):
                if rule.name in seen:
                    raise problem(f"{kind} has two rules named {rule.name}; names are unique")
                seen.add(rule.name)
        return self

    def names(self, kind: str) -> set[str]:
        """The rule names of one list (``keywords``, ...)."""
        return {rule.name for rule in getattr(self, kind)}

    def rule(self, kind: str, name: str) -> Any:
        """The rule ``name`` of list ``kind``, or ``None``."""
        return next((r for r in getattr(self, kind) if r.name == name), None)


# -- decisions ---------------------------------------------------------------------------


class RuleNode(Strict):
    """A node of a decision's rule tree: a combination (``operator`` with ``conditions``)
    or a leaf (``type``, ``name``, ``label``, ``predicate``, ``on_error``).

    ``on_unknown`` is read only at the root (:class:`Decision` checks it).
    """

    operator: str | None = None
    conditions: list[RuleNode] | None = None
    type: str | None = None
    name: str | None = None
    label: str | None = None
    predicate: Predicate | None = None
    on_error: Literal["match", "no_match"] | None = None
    on_unknown: str | None = None

    @property
    def is_leaf(self) -> bool:
        return self.type is not None

    def problems(self, where: str, root: bool) -> Iterator[str]:
        """Each structural problem of the tree under this node, ``where`` naming it
        (``rules.conditions[1]``)."""
        if self.on_unknown is not None and not root:
            yield f"{where}: on_unknown is allowed only on the root rule"
        leaf = [k for k in LEAF_KEYS if getattr(self, k) is not None]
        if leaf and (self.operator is not None or self.conditions is not None):
            yield (
                f"{where}: a condition node cannot mix leaf fields ({', '.join(leaf)}) with "
                "operator or conditions"
            )
            return
        if leaf:
            if self.type is None or self.name is None:
                yield f"{where}: a leaf condition needs type and name"
            elif self.type not in CONDITION_TYPES:
                yield (
                    f"{where}: condition type {self.type} is not supported by this vllm-sr; "
                    f"{SUPPORTED} {', '.join(CONDITION_TYPES)}"
                )
            return
        operator = (self.operator or "AND").upper()
        if operator not in OPERATORS:
            yield f"{where}: unsupported operator {self.operator}; use AND, OR or NOT"
            return
        children = self.conditions or []
        if operator == "NOT" and len(children) != 1:
            yield f"{where}: NOT requires exactly one child condition, got {len(children)}"
        if not children and not (root and operator == "AND"):
            yield f"{where}: {operator} requires at least one child condition"
        for index, child in enumerate(children):
            yield from child.problems(f"{where}.conditions[{index}]", root=False)

    def leaves(self) -> Iterator[RuleNode]:
        """Every leaf under this node."""
        if self.is_leaf:
            yield self
        for child in self.conditions or ():
            yield from child.leaves()

    @property
    def op(self) -> str:
        """The node's operator, upper case (``AND`` when omitted)."""
        return (self.operator or "AND").upper()


class ModelRef(Strict):
    """A model a decision may choose (``modelRefs[]``)."""

    model: str
    use_reasoning: bool = False
    reasoning_effort: str | None = None
    weight: float = Field(default=1.0, ge=0)


class Algorithm(Strict):
    """``algorithm``: only ``static`` (the first model of ``modelRefs``)."""

    type: str = "static"

    @field_validator("type")
    @classmethod
    def _static(cls, value: str) -> str:
        if value != "static":
            raise problem(f"algorithm {value} is not supported by this vllm-sr; {SUPPORTED} static")
        return value


class Plugin(Strict):
    """A decision's plugin: ``{type, configuration}`` (ROUTER-SPEC §1.8)."""

    type: str
    configuration: dict[str, Any] = Field(default_factory=dict)

    @field_validator("type")
    @classmethod
    def _type(cls, value: str) -> str:
        value = PLUGIN_ALIASES.get(value, value)
        if value not in PLUGIN_TYPES:
            raise problem(
                f"plugin {value} is not supported by this vllm-sr; {SUPPORTED} "
                f"{', '.join(PLUGIN_TYPES)}"
            )
        return value

    @model_validator(mode="after")
    def _configuration(self) -> Plugin:
        allowed = {
            "system_prompt": {"enabled", "system_prompt", "mode"},
            "header_mutation": {"add", "update", "delete"},
            "fast_response": {"message"},
            "response_cache": {"enabled", "mode", "semantic", "ttl_seconds"},
        }[self.type]
        for key in self.configuration:
            if key not in allowed:
                raise problem(
                    f"configuration.{key} is not supported by this vllm-sr for a {self.type} "
                    f"plugin; it takes {', '.join(sorted(allowed))}"
                )
        config = self.configuration
        if self.type == "system_prompt":
            if config.get("mode", "insert") not in ("insert", "replace"):
                raise problem("configuration.mode must be insert or replace")
            if config.get("enabled", True) and not isinstance(config.get("system_prompt"), str):
                raise problem("configuration.system_prompt must be text")
        if self.type == "fast_response" and not isinstance(config.get("message"), str):
            raise problem("configuration.message must be text")
        if self.type == "header_mutation":
            for key in ("add", "update"):
                for item in config.get(key) or []:
                    if not (isinstance(item, dict) and set(item) == {"name", "value"}):
                        raise problem(f"configuration.{key} must list {{name, value}} headers")
                    where = f"configuration.{key}.{item['name']}"
                    if (found := placeholder(where, str(item["value"]))) is not None:
                        raise found
            if not all(isinstance(n, str) for n in config.get("delete") or []):
                raise problem("configuration.delete must list header names")
        if self.type == "response_cache":
            mode = config.get("mode", "semantic")
            if mode not in ("semantic", "exact", "exact_then_semantic"):
                raise problem("configuration.mode must be semantic, exact or exact_then_semantic")
            semantic = config.get("semantic") or {}
            if not isinstance(semantic, dict) or set(semantic) - {"similarity_threshold"}:
                raise problem("configuration.semantic takes similarity_threshold only")
        return self


class Decision(Strict):
    """A routing decision (``routing.decisions[]``)."""

    name: str
    description: str | None = None
    priority: int = 0
    rules: RuleNode | None = None
    modelRefs: list[ModelRef] = Field(default_factory=list)
    algorithm: Algorithm = Field(default_factory=Algorithm)
    plugins: list[Plugin] = Field(default_factory=list)

    @property
    def catch_all(self) -> bool:
        """Omitted ``rules``, or an empty root ``AND``: matches everything, ranks last."""
        rules = self.rules
        return rules is None or (
            not rules.is_leaf and rules.op == "AND" and not (rules.conditions or [])
        )

    @property
    def on_unknown(self) -> str | None:
        return self.rules.on_unknown if self.rules is not None else None

    def plugin(self, kind: str) -> Plugin | None:
        """The decision's plugin of ``kind``, or ``None``."""
        return next((p for p in self.plugins if p.type == kind), None)


class Routing(Strict):
    """``routing``: signals, decisions and the ranking strategy."""

    signals: Signals = Field(default_factory=Signals)
    decisions: list[Decision] = Field(default_factory=list)
    strategy: Literal["priority", "confidence"] | None = None
    modelCards: Any = None


def decision_problems(routing: Routing, providers: Providers) -> list[str]:
    """Every problem of ``routing.decisions`` against the signals and models declared, in
    upstream's shape (``decision "billing": rules.conditions[1]: NOT requires ...``)."""
    found: list[str] = []
    names: set[str] = set()
    models = {m.name for m in providers.models}
    for decision in routing.decisions:
        label = f'decision "{decision.name}"'
        if decision.name in names:
            found.append(f"{label}: two decisions share this name; names are unique")
        names.add(decision.name)
        rules = decision.rules
        if rules is not None:
            found += [f"{label}: {p}" for p in rules.problems("rules", root=True)]
            if rules.on_unknown is not None and rules.on_unknown not in UNKNOWN_POLICIES:
                found.append(
                    f"{label}: rules.on_unknown must be no_match, match or fail_request, not "
                    f"{_quoted(rules.on_unknown)}"
                )
            for leaf in rules.leaves():
                kind = CONDITION_TYPES.get(leaf.type or "")
                if kind is None or leaf.name is None:
                    continue
                if leaf.name not in routing.signals.names(kind):
                    found.append(
                        f"{label}: condition {leaf.type}:{leaf.name} references an undeclared "
                        f"signal; declare it under routing.signals.{kind}"
                    )
        for ref in decision.modelRefs:
            if ref.model not in models:
                found.append(
                    f"{label}: modelRefs model {ref.model} is not declared under providers.models"
                )
        only_fast = [p.type for p in decision.plugins] == ["fast_response"]
        if not decision.modelRefs and not only_fast:
            found.append(
                f"{label}: modelRefs is empty; name a providers.models entry, or answer with a "
                "fast_response plugin alone"
            )
    return found


def decision_warnings(routing: Routing) -> list[str]:
    """Upstream's warning for a ``decision`` condition that neither the root's
    ``on_unknown`` nor its own ``on_error`` resolves when its model fails."""
    warned = []
    for decision in routing.decisions:
        if decision.rules is None or decision.on_unknown is not None:
            continue
        for leaf in decision.rules.leaves():
            if leaf.type == "decision" and leaf.on_error is None:
                warned.append(
                    f"decision '{decision.name}': condition {_quoted(leaf.name or '')} evaluates "
                    "as unknown when its model backend fails; set rules.on_unknown or the "
                    "condition's on_error"
                )
    return warned


def _quoted(value: str) -> str:
    """``value`` in double quotes, as Go's ``%q`` writes a plain string."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def refused_routing_keys(document: Mapping[str, Any]) -> list[str]:
    """The left-out parts of a v0.3 document's ``routing`` (ROUTER-SPEC §1.9), each with
    its key path and what the core supports; checked before the schema so the operator
    reads why, not only "unknown key"."""
    found: list[str] = []
    routing = document.get("routing")
    if not isinstance(routing, Mapping):
        return found
    for key in routing:
        if key in ("projections", "entrypoints", "recipes", "evaluation"):
            found.append(
                unsupported(
                    f"routing.{key}", f"routing.{key} is", "signals, decisions and strategy"
                )
            )
    signals = routing.get("signals")
    if isinstance(signals, Mapping):
        for kind in signals:
            if kind not in SIGNAL_KINDS:
                found.append(
                    unsupported(f"routing.signals.{kind}", f"{kind} signals are", SIGNAL_KINDS)
                )
    decisions = routing.get("decisions")
    if isinstance(decisions, list):
        for index, decision in enumerate(decisions):
            if not isinstance(decision, Mapping):
                continue
            for key in ("tier", "action", "candidateIterations", "emits", "annotations"):
                if key in decision:
                    found.append(unsupported(f"routing.decisions[{index}].{key}", f"{key} is", ""))
            for key in decision:
                if str(key).startswith("output_contract") or key == "adaptations":
                    found.append(unsupported(f"routing.decisions[{index}].{key}", f"{key} is", ""))
            for ref_index, ref in enumerate(decision.get("modelRefs") or []):
                if isinstance(ref, Mapping) and "lora_name" in ref:
                    found.append(
                        unsupported(
                            f"routing.decisions[{index}].modelRefs[{ref_index}].lora_name",
                            "LoRA adapters are",
                        )
                    )
            for plugin_index, plugin in enumerate(decision.get("plugins") or []):
                config = plugin.get("configuration") if isinstance(plugin, Mapping) else None
                if isinstance(config, Mapping):
                    for key in ("scope", "request_controls", "personalized", "revision"):
                        if key in config:
                            found.append(
                                unsupported(
                                    f"routing.decisions[{index}].plugins[{plugin_index}]"
                                    f".configuration.{key}",
                                    f"response_cache {key} is",
                                )
                            )
    return found


def refused_provider_keys(document: Mapping[str, Any]) -> list[str]:
    """The left-out parts of ``providers`` (ROUTER-SPEC §1.3): ``reliability``, an
    ``api_format`` other than openai, and the backend keys of other provider kinds."""
    found: list[str] = []
    providers = document.get("providers")
    if not isinstance(providers, Mapping):
        return found
    for key in providers:
        if key == "reliability":
            found.append(unsupported("providers.reliability", "retries and fallback chains are"))
    for index, model in enumerate(providers.get("models") or []):
        if not isinstance(model, Mapping):
            continue
        fmt = model.get("api_format")
        if fmt is not None and fmt != "openai":
            found.append(
                unsupported(
                    f"providers.models[{index}].api_format", f"api_format {fmt} is", "openai"
                )
            )
        if "reliability" in model:
            found.append(
                unsupported(
                    f"providers.models[{index}].reliability", "retries and fallback chains are"
                )
            )
        for ref_index, ref in enumerate(model.get("backend_refs") or []):
            if not isinstance(ref, Mapping):
                continue
            for key in ref:
                if key in ("provider", "type", "api_version", "backend_id", "engine_kind") or str(
                    key
                ).startswith("metrics_"):
                    found.append(
                        unsupported(
                            f"providers.models[{index}].backend_refs[{ref_index}].{key}",
                            f"backend_refs {key} is",
                            "OpenAI-compatible backends (endpoint or base_url)",
                        )
                    )
    return found
