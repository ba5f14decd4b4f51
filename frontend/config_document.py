"""The configuration document as the configuration API reads, shows and checks it
(ROUTER-SPEC §3.2): functions of a document or a validated :class:`Config`, no state.

:func:`safe_yaml` parses a document, refusing one whose aliases expand past
:data:`MAX_NODES`; :func:`sha256` hashes the file's bytes (the ``ETag``,
``source_config_hash``) and :func:`runtime_hash` the validated configuration as canonical
JSON; :func:`redacted` is what ``GET /api/v1/config`` shows (no credential);
:func:`unredacted` puts the persisted credentials back into a document written with
the placeholders it was read with; :func:`merge_patch` is a ``PATCH``'s RFC 7396 merge;
:func:`restart_problems` says what in a candidate needs a restart and
:func:`unset_credentials` which backend keys are not set; :class:`ConfigRefused` is a
refused configuration request and :func:`problem_reasons` its ``reasons``. Applying and
activating a document is :mod:`vllm_sr.reload`'s.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
from typing import Any

import yaml

from .config.base import REDACTED
from .config.schema import Config
from .router.compose import router_mode

MAX_NODES = 500_000
"""The most YAML nodes a configuration document may expand to (its aliases followed): a
few kilobytes of nested anchors can otherwise stand for billions of nodes."""

MAX_DEPTH = 64
"""The deepest a configuration document may nest (mappings and lists, its aliases
followed): the schema's deepest value is a dozen levels down, and a checker, redaction or
YAML writer walking a value a few hundred levels deep would hit the interpreter's
recursion limit."""


def safe_yaml(text: str) -> Any:
    """``yaml.safe_load(text)``, refusing a document that expands to more than
    :data:`MAX_NODES` nodes or nests deeper than :data:`MAX_DEPTH` (counted on the
    composed graph, before any value is built).

    Raises:
        yaml.YAMLError: not YAML, too large once expanded, or nested too deeply.
    """
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()  # composing recurses once per level of nesting
        if node is None:
            return None
        size, depth = _expanded(node, {})
        if depth > MAX_DEPTH:
            raise yaml.YAMLError(
                f"the document nests more than {MAX_DEPTH} levels deep (its aliases followed)"
            )
        if size > MAX_NODES:
            raise yaml.YAMLError(
                f"the document expands to more than {MAX_NODES} values (its aliases "
                "followed); write it out without nested anchors"
            )
        return loader.construct_document(node)
    except RecursionError:
        raise yaml.YAMLError(f"the document nests more than {MAX_DEPTH} levels deep") from None
    finally:
        loader.dispose()


def _expanded(node: yaml.Node, memo: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """How many nodes ``node`` stands for with every alias followed, and how deep it nests
    (a scalar: 1); memoised: a shared node is counted once per reference, without walking
    it again."""
    known = memo.get(id(node))
    if known is not None:
        return known
    size, depth = 1, 0
    children: list[yaml.Node] = []
    if isinstance(node, yaml.MappingNode):
        children = [part for pair in node.value for part in pair]
    elif isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    for child in children:
        child_size, child_depth = _expanded(child, memo)
        size += child_size
        depth = max(depth, child_depth)
    memo[id(node)] = found = (size, depth + 1)
    return found


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def runtime_hash(config: Config) -> str:
    """``sha256:<hex>`` of the validated configuration as canonical JSON."""
    document = config.model_dump(mode="json", by_alias=True)
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + sha256(text.encode())


SECRET_NAME = re.compile(
    r"(^|[-_])(authorization|cookie|api[-_]?key|token|secret|password|credential)s?($|[-_])",
    re.IGNORECASE,
)
"""A header name that carries a credential (its value is never shown)."""


def redacted(document: Any) -> Any:
    """``document`` as ``GET /api/v1/config`` shows it: every ``api_keys`` entry, every
    ``api_key``, every ``extra_headers`` value, a ``header_mutation`` value of a
    credential header (``Authorization``, ``*-api-key``, ``*-token``, ``Cookie``, ...)
    and the password of a URL replaced by :data:`REDACTED` (the management API never
    shows a credential)."""
    if isinstance(document, dict):
        out: dict[str, Any] = {}
        for key, value in document.items():
            if key == "api_keys" and isinstance(value, list):
                out[key] = [REDACTED for _ in value]
            elif key == "api_key" and value is not None:
                out[key] = REDACTED
            elif key == "extra_headers" and isinstance(value, dict):
                out[key] = {name: REDACTED for name in value}
            elif (
                set(document) == {"name", "value"}
                and key == "value"
                and SECRET_NAME.search(str(document.get("name", "")))
            ):
                out[key] = REDACTED
            elif isinstance(value, str) and "://" in value and "@" in value:
                out[key] = _without_password(value)
            else:
                out[key] = redacted(value)
        return out
    if isinstance(document, list):
        return [redacted(item) for item in document]
    return document


def _without_password(url: str) -> str:
    """``url`` with the password of its user information redacted."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.partition("@")
    if not at or "/" in userinfo:
        return url
    user, colon, _ = userinfo.partition(":")
    return f"{scheme}{sep}{user}{':' + REDACTED if colon else ''}@{host}"


class RedactedUnknown(ValueError):
    """A written document keeps a :data:`REDACTED` placeholder where the persisted one has
    no credential to put back (the message names the path and the fix)."""


DESTINATION = ("endpoint", "base_url", "protocol")
"""The keys that say where a mapping's credentials are sent (a backend's ``endpoint``,
``base_url`` and ``protocol``): a placeholder stays only where they are unchanged."""


def unredacted(given: Any, persisted: Any, *, patch: bool = False) -> Any:
    """``given`` with every :data:`REDACTED` placeholder that :func:`redacted` would have
    written for ``persisted`` at the same place replaced by the persisted credential, so
    that a document read from ``GET /api/v1/config``, edited and written back keeps its
    keys. In a list, an item with a ``name`` is matched to the saved item of that name, a
    mapping without one to the saved one sent to the same :data:`DESTINATION`
    (``endpoint``, ``base_url``, ``protocol``), anything else by position among such
    items (``api_keys``); the n-th of a repeated name or destination to the n-th saved
    one. A credential stays with where it is sent: in a named mapping whose destination
    changed, no placeholder is put back. With ``patch``, ``given`` is a ``PATCH``'s merge
    patch: a mapping that does not write a destination key keeps it.

    Raises:
        RedactedUnknown: a placeholder where the persisted document has nothing it could
            stand for (a new listener or key written as ``<redacted>``), or whose
            credential was sent elsewhere (a backend moved to another endpoint).
    """
    return _unredacted(given, persisted, redacted(persisted), "", None, patch)


def _moved(given: dict[str, Any], shown: dict[str, Any], patch: bool) -> str | None:
    """What of :data:`DESTINATION` differs between a written mapping and the one shown
    (``protocol`` defaults to ``http``; with ``patch``, a key not written is kept), as
    ``key old -> new``; ``None``: the same."""
    for key in DESTINATION:
        if patch and key not in given:
            continue
        default = "http" if key == "protocol" else None
        old, new = shown.get(key, default), given.get(key, default)
        if old != new:
            return f"{key} {old} -> {new}"
    return None


def _identity(item: Any) -> tuple[Any, ...]:
    """What a list item is matched by: its ``name``; without one, a mapping's
    :data:`DESTINATION` (as shown, ``protocol`` defaulting to ``http``); anything else,
    nothing (its order among such items)."""
    name = item.get("name") if isinstance(item, dict) else None
    if isinstance(name, str):
        return ("name", name)
    if isinstance(item, dict):  # repr: a value written as a list or mapping is no key
        return (
            "destination",
            *(repr(item.get(k, "http" if k == "protocol" else None)) for k in DESTINATION),
        )
    return ("position",)


def _matched(given: list[Any], shown: list[Any]) -> list[int | None]:
    """For each item of ``given``, the index of the saved item it stands for (``shown``
    is the saved list as ``GET /api/v1/config`` showed it; ``None``: none): the n-th
    item of an :func:`_identity` to the n-th saved item of that identity."""
    saved: dict[tuple[Any, ...], list[int]] = {}
    for index, item in enumerate(shown):
        saved.setdefault(_identity(item), []).append(index)
    seen: dict[tuple[Any, ...], int] = {}
    found: list[int | None] = []
    for item in given:
        identity = _identity(item)
        nth = seen.get(identity, 0)
        seen[identity] = nth + 1
        candidates = saved.get(identity, [])
        found.append(candidates[nth] if nth < len(candidates) else None)
    return found


def _unredacted(
    given: Any, persisted: Any, shown: Any, path: str, moved: str | None, patch: bool
) -> Any:
    """:func:`unredacted` of the value at ``path``, with its persisted form and the form
    ``GET /api/v1/config`` showed (both ``None`` where the persisted document has none);
    ``moved``: the destination change of an enclosing mapping (no placeholder inside it
    is put back); ``patch``: ``given`` is a merge patch there (a mapping keeps what it does
    not write; a list, inside which nothing is a patch, is written whole)."""
    if isinstance(given, dict):
        known = persisted if isinstance(persisted, dict) else {}
        view = shown if isinstance(shown, dict) else {}
        if moved is None and view:
            moved = _moved(given, view, patch)
        return {
            key: _unredacted(
                value,
                known.get(key),
                view.get(key),
                f"{path}.{key}" if path else str(key),
                moved,
                patch,
            )
            for key, value in given.items()
        }
    if isinstance(given, list):
        known_list = persisted if isinstance(persisted, list) else []
        view_list = shown if isinstance(shown, list) else []
        out = []
        for index, (item, at) in enumerate(zip(given, _matched(given, view_list), strict=True)):
            saved, seen = (known_list[at], view_list[at]) if at is not None else (None, None)
            out.append(_unredacted(item, saved, seen, f"{path}[{index}]", moved, False))
        return out
    if isinstance(given, str) and REDACTED in given:
        if given == shown and moved is None:
            return persisted
        if given == shown:
            raise RedactedUnknown(
                f"{path} is {given!r}: the saved credential there is not sent to a new "
                f"destination ({moved}); write the credential itself"
            )
        raise RedactedUnknown(
            f"{path or 'the document'} is {given!r}: {REDACTED} stands for a credential the "
            "saved configuration does not have there; write the credential itself"
        )
    return given


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7396 JSON merge patch: mappings merge key by key, ``null`` removes a key,
    anything else (lists included) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def restart_problems(
    active: Config, candidate: Config, document: dict[str, Any] | None = None
) -> list[str]:
    """What in ``candidate`` needs a restart: the listeners' set, an address, port or
    timeout, or the mode (``global.router.enabled``, also when the serve flags would
    override what ``document``, the candidate as written, says)."""
    problems = []
    glob = (document or {}).get("global")
    router = glob.get("router") if isinstance(glob, dict) else None
    written = router.get("enabled") if isinstance(router, dict) else None
    if isinstance(written, bool) and written != active.router_enabled:
        problems.append(
            f"global.router.enabled: {str(written).lower()} asks for "
            f"{'Router' if written else 'Engine'} mode; the mode is chosen when vllm-sr "
            "starts: restart it to change modes"
        )
    elif active.router_enabled != candidate.router_enabled:
        problems.append(
            "global.router.enabled: the mode is chosen when vllm-sr starts; restart it to "
            "change between Engine and Router mode"
        )
    elif router_mode(active) != router_mode(candidate):
        problems.append(
            "providers.models: Router mode routes to the provider models; a configuration "
            "without them is Engine mode, and the mode is chosen when vllm-sr starts"
        )
    before = {item.name: item for item in active.listeners}
    after = {item.name: item for item in candidate.listeners}
    if set(before) != set(after):
        problems.append(
            "listeners: adding, removing or renaming a listener needs a restart "
            f"(running: {', '.join(sorted(before)) or 'none'}; "
            f"new: {', '.join(sorted(after)) or 'none'})"
        )
    for name in sorted(set(before) & set(after)):
        for key in ("address", "port", "timeout"):
            old, new = getattr(before[name], key), getattr(after[name], key)
            if old != new:
                problems.append(
                    f"listeners.{name}.{key}: changing it needs a restart ({old} -> {new})"
                )
    return problems


def unset_credentials(config: Config) -> list[str]:
    """A warning per backend whose ``api_key_env`` is not set in this process'
    environment (that backend would get no credential)."""
    warnings = []
    for index, model in enumerate(config.providers.models):
        for ref_index, ref in enumerate(model.backend_refs):
            name = ref.api_key_env
            if name and not os.environ.get(name):
                warnings.append(
                    f"providers.models[{index}].backend_refs[{ref_index}].api_key_env: "
                    f"{name} is not set in vllm-sr's environment, so this backend gets no "
                    "credential (set it and restart vllm-sr)"
                )
    return warnings


class ConfigRefused(Exception):
    """A configuration request answered with an error (status, code, message)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        reasons: list[dict[str, str]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.reasons = reasons
        self.headers = headers or {}


def problem_reasons(problems: list[str], code: str) -> list[dict[str, str]]:
    """``[{"code", "path", "message"}]`` of ``<key path>: <message>`` lines."""
    reasons = []
    for line in problems:
        path, sep, message = line.partition(": ")
        if not sep or " " in path:
            path, message = "", line
        reasons.append({"code": code, "path": path, "message": message})
    return reasons
