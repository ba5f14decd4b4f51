"""Context signals: the whole text's token estimate within a rule's bounds.

The estimate is ``ceil(UTF-8 bytes / 4)`` (upstream ``pkg/classification``'s
``CharactersPerToken = 4``): no tokenizer is loaded for it, and it is the same whatever
model later reads the text.
"""

from __future__ import annotations

from ...config.routing import ContextRule

BYTES_PER_TOKEN = 4


def token_estimate(text: str) -> int:
    """``ceil(len(text.encode("utf-8")) / 4)``."""
    return -(-len(text.encode("utf-8")) // BYTES_PER_TOKEN)


def context_matches(rule: ContextRule, tokens: int) -> bool:
    """Whether ``min_tokens <= tokens <= max_tokens`` (no upper bound when unset)."""
    low = int(rule.min_tokens)
    high = None if rule.max_tokens is None else int(rule.max_tokens)
    return tokens >= low and (high is None or tokens <= high)
