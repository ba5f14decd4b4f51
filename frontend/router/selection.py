"""The model a routed request goes to, and the request rewritten for it (ROUTER-SPEC §1.3,
§1.8, §2.7).

For a matched decision, in order: ``system_prompt``; the reasoning fields of the chosen
model's family when its ``modelRefs`` entry sets ``use_reasoning``; ``model`` rewritten to
the chosen model's ``provider_model_id``; ``header_mutation`` on the backend request.
(``fast_response`` and the response cache come before and end the request early: see
:mod:`.chat`.) The ``static`` algorithm takes the first ``modelRefs`` entry; ``weight``
is accepted and unused there. A backend is drawn among the model's ``backend_refs`` by
``weight``.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config.routing import BackendRef, Decision, ModelRef, ProviderModel, Providers


@dataclass
class Rewritten:
    """The backend request of a routed Chat request.

    Attributes:
        body: the request body to send.
        headers: header changes from ``header_mutation``: ``set`` (name to value) and
            ``delete`` (lower-case names).
        model: the logical model chosen (``providers.models[].name``).
        reasoning: whether reasoning was turned on.
        injected_prompt: whether a system prompt was inserted or replaced.
    """

    body: dict[str, Any]
    model: ProviderModel
    set_headers: dict[str, str] = field(default_factory=dict)
    delete_headers: set[str] = field(default_factory=set)
    reasoning: bool = False
    injected_prompt: bool = False


def static_choice(decision: Decision) -> ModelRef | None:
    """The ``static`` algorithm: the first ``modelRefs`` entry (``None`` when empty)."""
    return decision.modelRefs[0] if decision.modelRefs else None


def apply_system_prompt(messages: list[Any], prompt: str, mode: str) -> list[Any]:
    """``messages`` with ``prompt`` as the system message.

    ``insert``: ``prompt + "\\n\\n" +`` the existing first system message's text, or a new
    first system message; ``replace``: the first system message's content becomes
    ``prompt`` (or a new first system message)."""
    updated = list(messages)
    first = next(
        (i for i, m in enumerate(updated) if isinstance(m, Mapping) and m.get("role") == "system"),
        None,
    )
    if first is None:
        return [{"role": "system", "content": prompt}, *updated]
    existing = dict(updated[first])
    if mode == "replace":
        existing["content"] = prompt
    else:
        old = existing.get("content")
        if isinstance(old, list):
            existing["content"] = [{"type": "text", "text": prompt + "\n\n"}, *old]
        else:
            existing["content"] = prompt + "\n\n" + (old if isinstance(old, str) else "")
    updated[first] = existing
    return updated


def reasoning_fields(
    body: dict[str, Any], model: ProviderModel, ref: ModelRef, providers: Providers
) -> bool:
    """Turn reasoning on in ``body`` (in place) for a ``use_reasoning`` model reference
    whose model has a ``reasoning_family``; whether anything was set.

    ``chat_template_kwargs`` sets ``chat_template_kwargs.<parameter> = true``;
    ``reasoning_effort`` sets ``chat_template_kwargs.<parameter> = <effort>``;
    ``top_level_reasoning_effort`` sets ``<parameter> = <effort>``; the effort is the
    reference's ``reasoning_effort``, else ``providers.defaults.default_reasoning_effort``.
    """
    if not ref.use_reasoning or model.reasoning_family is None:
        return False
    family = providers.defaults.reasoning_families[model.reasoning_family]
    effort = ref.reasoning_effort or providers.defaults.default_reasoning_effort
    if family.type == "chat_template_kwargs":
        kwargs = dict(body.get("chat_template_kwargs") or {})
        kwargs[family.parameter] = True
        body["chat_template_kwargs"] = kwargs
    elif family.type == "reasoning_effort":
        kwargs = dict(body.get("chat_template_kwargs") or {})
        kwargs[family.parameter] = effort
        body["chat_template_kwargs"] = kwargs
    else:
        body[family.parameter] = effort
    return True


def rewrite(
    body: Mapping[str, Any],
    decision: Decision | None,
    model: ProviderModel,
    ref: ModelRef | None,
    providers: Providers,
) -> Rewritten:
    """The backend request for ``model``, with ``decision``'s plugins applied (none for the
    default model or a pass-through)."""
    # A shallow copy: every change below replaces a top-level value (messages, the
    # reasoning fields, model) with a new object, never mutating the client's.
    updated = dict(body)
    result = Rewritten(updated, model)
    if decision is not None:
        prompt = decision.plugin("system_prompt")
        if prompt is not None and prompt.configuration.get("enabled", True):
            updated["messages"] = apply_system_prompt(
                list(updated.get("messages") or []),
                str(prompt.configuration["system_prompt"]),
                str(prompt.configuration.get("mode", "insert")),
            )
            result.injected_prompt = True
    if ref is not None:
        result.reasoning = reasoning_fields(updated, model, ref, providers)
    updated["model"] = model.upstream_id
    if decision is not None:
        mutation = decision.plugin("header_mutation")
        if mutation is not None:
            config = mutation.configuration
            for item in [*(config.get("add") or []), *(config.get("update") or [])]:
                result.set_headers[str(item["name"])] = str(item["value"])
            result.delete_headers = {str(n).lower() for n in config.get("delete") or []}
    return result


def choose_backend(refs: Sequence[BackendRef], draw: random.Random | None = None) -> BackendRef:
    """A backend drawn by ``weight`` (the first when every weight is 0)."""
    weights = [ref.weight for ref in refs]
    if sum(weights) <= 0:
        return refs[0]
    return (draw or random).choices(list(refs), weights=weights, k=1)[0]


def backend_credential(ref: BackendRef) -> tuple[str, str] | None:
    """The ``(header, value)`` carrying the backend's own key, or ``None`` without one.

    The key is ``api_key``, or the environment variable ``api_key_env`` (read at each
    request, so a rotated secret is taken up without a restart)."""
    key = ref.api_key if ref.api_key is not None else None
    if key is None and ref.api_key_env is not None:
        key = os.environ.get(ref.api_key_env) or None
    if not key:
        return None
    prefix = f"{ref.auth_prefix} " if ref.auth_prefix else ""
    return ref.auth_header, f"{prefix}{key}"
