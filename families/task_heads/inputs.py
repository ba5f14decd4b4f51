"""Input policy: tokenise a text (or text pair) and fit it to the model's limit.

``overflow`` decides what happens to an input longer than the limit:
``reject`` (an item error naming both counts), ``truncate`` (keep the
beginning, inside the special-token envelope) or ``window`` (overlapping
windows of the limit, merged back by the head). Nothing is cut silently: every
encoded input reports its token counts, whether it was truncated and how many
windows ran.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_srun.plugins.requests import InputOptions, Overflow
from vllm_srun.plugins.responses import InputUsage, input_usage
from vllm_srun.plugins.spec import ItemErrorCode, RequestError, WorkItem
from vllm_srun.plugins.tokenizing import load_encoder_tokenizer
from vllm_srun.plugins.windows import DEFAULT_OVERLAP, DEFAULT_SCAN_BUDGET, plan_windows


@dataclass(frozen=True)
class InputPolicy:
    """A request's ``options`` that shape its inputs.

    Attributes:
        overflow: ``reject`` (default), ``truncate`` or ``window``.
        max_tokens: ``reject``/``truncate``: lowers the limit; ``window``: the
            scan budget in content tokens (default 32768).
        window_tokens: window length in tokens, special tokens included
            (default: the model's limit).
        window_overlap: content tokens neighbouring windows share (default 64,
            or half a window's content tokens when a window holds fewer than 128).
    """

    overflow: Overflow = "reject"
    max_tokens: int | None = None
    window_tokens: int | None = None
    window_overlap: int | None = None

    @classmethod
    def from_options(cls, options: InputOptions) -> InputPolicy:
        """The policy of a request's (already validated) ``options``."""
        window = options.window
        return cls(
            options.overflow,
            options.max_tokens,
            None if window is None else window.tokens,
            None if window is None else window.overlap,
        )


@dataclass
class EncodedInput:
    """One input after the policy.

    Attributes:
        rows: the work items to run (one, or one per window).
        windows: the content-token range ``[start, end)`` each row covers.
        row_content: per row, the row positions of its content tokens, in order.
        offsets: code-point ``(start, end)`` of each content token of the first
            text (what token heads map back to words).
        content_tokens: content tokens of the whole input (pair included).
        tokens: tokens of the whole input as one row (special tokens once).
        processed_tokens: tokens actually run: special tokens of every row,
            each content token once.
        truncated: whether content was cut.
        error: ``(code, message)`` when the input cannot run.
    """

    rows: list[WorkItem] = field(default_factory=list)
    windows: list[tuple[int, int]] = field(default_factory=list)
    row_content: list[list[int]] = field(default_factory=list)
    offsets: list[tuple[int, int]] = field(default_factory=list)
    content_tokens: int = 0
    tokens: int = 0
    processed_tokens: int = 0
    truncated: bool = False
    error: tuple[ItemErrorCode, str] | None = None

    def usage(self) -> InputUsage:
        """The ``input`` object every result reports."""
        return input_usage(self.tokens, self.processed_tokens, self.truncated, len(self.rows))


PREFIX_CHARS_PER_TOKEN = 16
"""Characters per budget token read of a huge input under ``overflow: reject`` before
deciding it is over (:meth:`TextEncoder._over_budget`); English averages about 4
characters per token, so a prefix this long almost always holds more tokens than
the budget."""


def row_key(ids: list[int], type_ids: list[int] | None) -> str:
    """Content key of a row: BLAKE2b over its token ids and segment ids."""
    digest = hashlib.blake2b(array("q", ids).tobytes(), digest_size=16)
    if type_ids is not None:
        digest.update(b"|")
        digest.update(array("q", type_ids).tobytes())
    return digest.hexdigest()


class TextEncoder:
    """A model's fast tokenizer with the tokenizer file's own truncation and padding off.

    The model's limit (``max_tokens`` of the package description) is what
    counts; the tokenizer file's settings never cut or pad anything.
    """

    def __init__(self, package: Path, limit: int) -> None:
        # tokenizers alone where it reads the package as transformers would (BERT-style
        # tokenizers: MiniLM, Rampart), so a model on ONNX Runtime never imports transformers
        loaded = load_encoder_tokenizer(package)
        backend = loaded.backend
        # Text that spells a special token ("[SEP]", "<s>") is read as text, never
        # as a control token: a user cannot inject structure into a row.
        backend.encode_special_tokens = True
        self.backend = backend
        self.prefix, self.suffix = _envelope(backend)
        self.limit = limit
        self.pad_id = int(loaded.pad_id if loaded.pad_id is not None else 0)
        self.specials = (
            backend.num_special_tokens_to_add(False),
            backend.num_special_tokens_to_add(True),
        )

    def _item(self, encoding: Any, pairs: bool) -> WorkItem:
        ids = list(encoding.ids)
        types = list(encoding.type_ids) if pairs else None
        return WorkItem(
            tuple(ids), tuple(types) if types is not None else None, row_key(ids, types)
        )

    @property
    def vocabulary(self) -> int:
        """Token ids the tokenizer knows (added tokens included): valid ids are below this."""
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def encode_ids(self, ids: list[int], policy: InputPolicy) -> EncodedInput:
        """One input given as token ids: the whole row as given, special tokens included.

        ``truncate`` keeps the first ids up to the limit; ``window`` cannot cut a row
        whose special tokens it does not know, so a longer row is an item error then.
        The caller checks the ids against :attr:`vocabulary`.
        """
        limit = self.limit if policy.max_tokens is None else min(self.limit, policy.max_tokens)
        result = EncodedInput(content_tokens=len(ids), tokens=len(ids))
        if len(ids) > limit:
            if policy.overflow != "truncate":
                result.error = (
                    "max_length_exceeded" if policy.overflow == "reject" else "invalid_input",
                    f"input has {len(ids)} token ids; the limit is {limit}. Send fewer ids, or "
                    "options.overflow truncate (keep the first ids); windows read texts only",
                )
                return result
            ids = ids[:limit]
            result.truncated = True
        result.rows = [WorkItem(tuple(ids), None, row_key(ids, None))]
        result.windows = [(0, len(ids))]
        result.row_content = [list(range(len(ids)))]
        result.processed_tokens = len(ids)
        return result

    def encode(self, text: str, pair: str | None, policy: InputPolicy) -> EncodedInput:
        """Tokenise one input under ``policy``; a failure is ``error``, never an exception.

        Raises:
            RequestError: ``invalid_request`` when the window settings cannot
                work with this model (too large, or no room for content).
        """
        special = self.specials[1 if pair is not None else 0]
        bad = invalid_text(text) or (invalid_text(pair) if pair is not None else None)
        if bad is not None:
            return EncodedInput(error=("invalid_input", bad))
        if (
            policy.overflow == "truncate"
            and policy.max_tokens is not None
            and policy.max_tokens - special < 1
        ):
            raise RequestError(
                "invalid_request",
                f"options.max_tokens {policy.max_tokens} leaves no room beside {special} "
                "special tokens",
                "options.max_tokens",
            )
        limit = self.limit if policy.max_tokens is None else min(self.limit, policy.max_tokens)
        if policy.overflow == "reject" and pair is None:
            over = self._over_budget(text, limit - special)
            if over is not None:
                return EncodedInput(
                    content_tokens=over,
                    tokens=over + special,
                    error=(
                        "max_length_exceeded",
                        f"input has at least {over + special} tokens (read as far as the "
                        f"limit needs); the limit is {limit}. Shorten it, or send "
                        "options.overflow truncate (keep the beginning) or window",
                    ),
                )
        # encode_batch releases the GIL while it works (a plain encode holds it), so a
        # huge input tokenising in the planning pool never stalls the event loop.
        texts = [text] if pair is None else [text, pair]
        encoded = self.backend.encode_batch(texts, add_special_tokens=False)
        first = encoded[0]
        second = encoded[1] if pair is not None else None
        content = len(first) + (len(second) if second is not None else 0)
        result = EncodedInput(content_tokens=content, tokens=content + special)
        if policy.overflow == "window":
            return self._windows(first, second, special, policy, result)
        if result.tokens > limit:
            if policy.overflow == "reject":
                result.error = (
                    "max_length_exceeded",
                    f"input has {result.tokens} tokens; the limit is {limit}. Shorten it, or send "
                    "options.overflow truncate (keep the beginning) or window",
                )
                return result
            self._truncate(first, second, limit - special)
            result.truncated = True
        result.offsets = [tuple(o) for o in first.offsets]
        encoding = self.backend.post_process(first, second, add_special_tokens=True)
        kept = len(first) + (len(second) if second is not None else 0)
        result.rows = [self._item(encoding, second is not None)]
        result.windows = [(0, len(first))]
        result.row_content = [[i for i, s in enumerate(encoding.special_tokens_mask) if not s]]
        result.processed_tokens = kept + special
        return result

    def _over_budget(self, text: str, budget: int) -> int | None:
        """The content tokens of a prefix of ``text`` when that prefix alone is over
        ``budget`` (so the whole text is too), else ``None``.

        A text many times longer than the budget in characters is tokenised only up
        to the last white space before :data:`PREFIX_CHARS_PER_TOKEN` characters per
        budget token: the pre-tokenisers of these models split at white space, so the
        prefix's tokens are the first tokens of the whole text, and a huge input that
        is refused anyway costs what its budget does, not its length.
        """
        cut = PREFIX_CHARS_PER_TOKEN * (budget + 1)
        if len(text) <= cut:
            return None
        end = max(text.rfind(" ", 0, cut), text.rfind("\n", 0, cut))
        if end <= 0:
            return None
        tokens = len(self.backend.encode_batch([text[:end]], add_special_tokens=False)[0])
        return tokens if tokens > budget else None

    @staticmethod
    def _truncate(first: Any, second: Any, budget: int) -> None:
        """Cut content to ``budget`` tokens, the longer text first (longest-first)."""
        if second is None:
            first.truncate(budget)
            return
        a, b = len(first), len(second)
        while a + b > budget:
            if a >= b:
                a -= 1
            else:
                b -= 1
        first.truncate(a)
        second.truncate(b)

    def _windows(
        self, first: Any, second: Any, special: int, policy: InputPolicy, result: EncodedInput
    ) -> EncodedInput:
        if second is not None:
            result.error = (
                "invalid_input",
                "overflow window reads single texts only; send text pairs with reject or truncate",
            )
            return result
        size = policy.window_tokens or self.limit
        if size > self.limit:
            raise RequestError(
                "invalid_request",
                f"options.window.tokens {size} is above the model's limit {self.limit}",
                "options.window.tokens",
            )
        room = size - special
        if room < 1:
            raise RequestError(
                "invalid_request",
                f"a window of {size} tokens has no room for content beside {special} special "
                "tokens; raise options.window.tokens",
                "options.window.tokens",
            )
        overlap = policy.window_overlap
        if overlap is None:
            overlap = min(DEFAULT_OVERLAP, room // 2)
        if room <= overlap:
            raise RequestError(
                "invalid_request",
                f"a window of {size} tokens holds {room} content tokens beside {special} special "
                f"tokens, which must be more than the overlap {overlap}",
                "options.window",
            )
        budget = policy.max_tokens or DEFAULT_SCAN_BUDGET
        if result.content_tokens > budget:
            result.error = (
                "scan_budget_exceeded",
                f"input has {result.content_tokens} content tokens; the scan budget is {budget}. "
                "Raise options.max_tokens or shorten the input",
            )
            return result
        result.offsets = [tuple(o) for o in first.offsets]
        ids = list(first.ids)
        head = len(self.prefix)
        for start, end in plan_windows(len(ids), room, overlap):
            row = [*self.prefix, *ids[start:end], *self.suffix]
            result.rows.append(WorkItem(tuple(row), None, row_key(row, None)))
            result.windows.append((start, end))
            result.row_content.append(list(range(head, head + end - start)))
        result.processed_tokens = result.content_tokens + special * len(result.rows)
        return result


def _envelope(backend: Any) -> tuple[list[int], list[int]]:
    """The special token ids a single text is wrapped in: ``([CLS]), ([SEP])``.

    Read once from the tokenizer's post-processor on a probe text, so windows
    are cut on token ids without re-encoding (linear in the input length).
    """
    encoding = backend.post_process(
        backend.encode("a", add_special_tokens=False), None, add_special_tokens=True
    )
    mask = list(encoding.special_tokens_mask)
    ids = list(encoding.ids)
    if 0 not in mask:
        return ids, []
    first = mask.index(0)
    last = len(mask) - 1 - mask[::-1].index(0)
    return ids[:first], ids[last + 1 :]


def invalid_text(text: str) -> str | None:
    """Why ``text`` cannot be tokenised (a lone surrogate), else ``None``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        bad = text[err.start]
        return (
            f"the text has a lone surrogate U+{ord(bad):04X} at code point {err.start}; "
            "send valid Unicode (UTF-8)"
        )
    return None
