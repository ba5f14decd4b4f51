"""The texts a Chat request gives its signals (ROUTER-SPEC §2.3).

A message's text is its string ``content``, or its text parts joined by spaces (a
content array is read in every role and on streaming requests alike, so a guard never
skips a request because of its shape).

- **evaluation text**: the last non-empty user message, else the system, developer and
  assistant texts joined (keywords, embeddings, domains, questions with a
  ``deployment``, language, jailbreak, PII, the response cache);
- **whole text**: the system, developer and assistant texts, then the current user
  message (context; questions without a ``deployment``);
- **history**: the non-user texts (tool messages included) and the earlier user
  messages, each once (jailbreak and PII pieces under ``include_history``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

CONTEXT_ROLES = ("system", "developer", "assistant")
"""Roles whose texts stand in for a missing user message, and lead the whole text."""


def message_text(message: Mapping[str, Any]) -> str:
    """The text of one message: a string ``content`` as it is, or the ``text`` of each
    text part joined by single spaces; anything else reads as empty."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            part["text"]
            for part in content
            if isinstance(part, Mapping)
            and part.get("type", "text") == "text"
            and isinstance(part.get("text"), str)
        ]
        return " ".join(parts)
    return ""


@dataclass(frozen=True)
class Texts:
    """What the signals read from one request.

    Attributes:
        evaluation: the evaluation text.
        whole: the whole text.
        history: earlier pieces, in order, without repeats and without the evaluation text.
    """

    evaluation: str
    whole: str
    history: tuple[str, ...] = ()

    def pieces(self, include_history: bool) -> tuple[str, ...]:
        """The evaluation text, then the history when asked for (empty pieces left out)."""
        found = [self.evaluation] if self.evaluation.strip() else []
        if include_history:  # the history holds no repeats and never the evaluation text
            found += [p for p in self.history if p.strip()]
        return tuple(found)


def request_texts(messages: Sequence[Mapping[str, Any]]) -> Texts:
    """The :class:`Texts` of a Chat request's ``messages`` (malformed entries read empty)."""
    roles = [(str(m.get("role", "")), message_text(m)) for m in messages if isinstance(m, Mapping)]
    last_user = next(
        (i for i in range(len(roles) - 1, -1, -1) if roles[i][0] == "user" and roles[i][1].strip()),
        None,
    )
    context = [text for role, text in roles if role in CONTEXT_ROLES and text.strip()]
    if last_user is None:
        evaluation = " ".join(context)
        whole = evaluation
    else:
        evaluation = roles[last_user][1]
        whole = " ".join([*context, evaluation])
    history: list[str] = []
    seen = {evaluation}  # a set: a request of many messages stays linear
    for index, (role, text) in enumerate(roles):
        if index == last_user or not text.strip():
            continue
        known = role == "user" or role in (*CONTEXT_ROLES, "tool")
        if known and text not in seen:
            seen.add(text)
            history.append(text)
    return Texts(evaluation, whole, tuple(history))


LONE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
"""A JSON escape of a UTF-16 surrogate half (checked further only when present)."""


def lone_surrogate(raw: bytes, body: Any) -> bool:
    """Whether the JSON ``raw`` (parsed: ``body``) holds a ``\\uD800``-style escape of
    half a UTF-16 pair without its other half: a string Python holds but no UTF-8 text
    can carry (it would fail wherever the text is sent on)."""
    if not LONE_SURROGATE.search(raw):
        return False
    try:
        json.dumps(body, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return True
    return False
