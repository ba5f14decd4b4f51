"""Rendering a question for a decoder, and the labels its answer is read from.

A question becomes one user message::

    State:
    <the state; an object or array as JSON (", " and ": " separators)>

    Question: <instructions>
    Options:
    A. billing: Payments, charges, refunds and invoices
    B. shipping: Delivery, parcels and tracking
    Reply with one of: A, B.

A tokenizer with a chat template renders it with
``apply_chat_template([{"role": "user", "content": message}],
add_generation_prompt=True, enable_thinking=False, date_string=TEMPLATE_DATE,
tokenize=False)`` (the
template's own special tokens, BOS included, come from the template); without
one, the **plain template** is the message followed by ``"\\nAnswer:"``, with
the tokenizer's own special tokens (a BOS) added. Text from the request never
becomes a control token: it is tokenised with special-token parsing off.

The answer is read from the next-token logits of one token per option: the
labels. Each label must be a single token of this tokenizer, so the labels
come from candidate sets tried in order (Choice ``A``..``Z``, ``a``..``z``,
``1``..``N``, letters of both cases, then letters and digits; Noul
``yes``/``no``, ``Yes``/``No``, ``true``/``false``, ``Y``/``N``; Score
``1``..``N``, then letters), each read as the bare label or with a leading
space (the plain template prefers the space, after ``Answer:``; a chat
template the bare label). A question no set fits answers ``unavailable``.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path

from vllm_srun.plugins.decisions import Question
from vllm_srun.plugins.tokenizing import load_fast_tokenizer

CONTENT_MARK = "\ue000\ue001question\ue001\ue000"
"""Placeholder rendered in place of the message, to split a chat template around it."""

TEMPLATE_DATE = "26 Jul 2024"
"""``date_string`` passed to chat templates that print today's date (Llama 3.1 and
later): a fixed date keeps a question's prompt, and so its answer, the same every day."""

PLAIN_SUFFIX = "\nAnswer:"
"""What the plain template appends to the message."""


def _letters(upper: bool, count: int) -> tuple[str, ...] | None:
    alphabet = string.ascii_uppercase if upper else string.ascii_lowercase
    return tuple(alphabet[:count]) if count <= len(alphabet) else None


def _numbers(count: int) -> tuple[str, ...]:
    """Numbered option labels ``1``..``count``, as a prompt shows them to the model (what a
    language model reads most naturally); a Score answer keys its levels from 0 whatever
    the labels the prompt used."""
    return tuple(str(k) for k in range(1, count + 1))


def _pool(pool: str, count: int) -> tuple[str, ...] | None:
    return tuple(pool[:count]) if count <= len(pool) else None


def candidate_labels(kind: str, count: int) -> list[tuple[str, ...]]:
    """Label sets to try, in order, for ``count`` options of a ``kind`` question.

    Noul sets are ordered ``(false label, true label)``.
    """
    both = string.ascii_uppercase + string.ascii_lowercase
    if kind == "noul":
        return [("no", "yes"), ("No", "Yes"), ("false", "true"), ("N", "Y")]
    if kind == "score":
        sets = [_numbers(count), _letters(True, count), _letters(False, count)]
    else:
        sets = [
            _letters(True, count),
            _letters(False, count),
            _numbers(count),
            _pool(both, count),
            _pool(both + string.digits, count),
        ]
    return [s for s in sets if s is not None]


@dataclass(frozen=True)
class Labels:
    """The labels of one question: as shown in the prompt, and the token ids read.

    Attributes:
        shown: each option's label as the prompt lists it (``A``), in option order.
        token_ids: the vocabulary id read for each option, in option order.
        texts: the exact text of each read token (``A`` or `` A``).
    """

    shown: tuple[str, ...]
    token_ids: tuple[int, ...]
    texts: tuple[str, ...]


class Renderer:
    """A package's tokenizer, rendering questions and choosing labels.

    Args:
        package: the package directory (``tokenizer.json`` and friends).

    Attributes:
        chat: whether the tokenizer has a chat template (else the plain template).
        pad_id: the id padding uses: the pad token, else EOS, else 0 (the mask
            hides it, so a model without a pad token still batches).
    """

    def __init__(self, package: Path) -> None:
        from tokenizers import Tokenizer

        tokenizer, control = load_fast_tokenizer(package)
        self.tokenizer = tokenizer
        text = Tokenizer.from_str(control.to_str())
        # Request text that spells a special token ("<|im_end|>") stays text.
        text.encode_special_tokens = True
        self.control = control
        self.text = text
        template = getattr(tokenizer, "chat_template", None)
        self.chat = isinstance(template, str | dict) and bool(
            template.strip() if isinstance(template, str) else template
        )
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = tokenizer.eos_token_id
        self.pad_id = int(pad if pad is not None else 0)
        self._labels: dict[tuple[str, int], Labels | None] = {}
        self._envelope = self._split_template() if self.chat else None
        # The template's text around the message is the same for every question.
        head, tail = self._envelope or ("", "")
        self._head_ids = tuple(self.control.encode(head, add_special_tokens=False).ids)
        self._tail_ids = tuple(self.control.encode(tail, add_special_tokens=False).ids)
        if self.chat and self._envelope is None:
            placed = self.render_chat(CONTENT_MARK).count(CONTENT_MARK)
            raise ValueError(
                f"the chat template places the user message {placed} times; it must place it "
                "exactly once and verbatim (the question would be lost or its text read as "
                "control tokens). Fix the template, or remove chat_template from the package "
                "to use the plain template"
            )

    # -- labels ---------------------------------------------------------------------------
    def _single(self, text: str) -> int | None:
        ids = self.text.encode(text, add_special_tokens=False).ids
        return int(ids[0]) if len(ids) == 1 else None

    def labels(self, kind: str, count: int) -> Labels | None:
        """The first candidate label set whose labels are distinct single tokens, or ``None``."""
        key = (kind, count)
        if key not in self._labels:
            self._labels[key] = self._choose(kind, count)
        return self._labels[key]

    def _choose(self, kind: str, count: int) -> Labels | None:
        forms = ("{}", " {}") if self.chat else (" {}", "{}")
        for shown in candidate_labels(kind, count):
            for form in forms:
                texts = tuple(form.format(label) for label in shown)
                ids = [self._single(t) for t in texts]
                if all(i is not None for i in ids) and len(set(ids)) == len(ids):
                    return Labels(shown, tuple(int(i) for i in ids if i is not None), texts)
        return None

    # -- prompts --------------------------------------------------------------------------
    def _split_template(self) -> tuple[str, str] | None:
        rendered = self.render_chat(CONTENT_MARK)
        if rendered.count(CONTENT_MARK) != 1:
            return None
        head, tail = rendered.split(CONTENT_MARK)
        return head, tail

    def render_chat(self, message: str) -> str:
        """The chat template applied to one user message, with the generation prompt."""
        rendered = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": message}],
            add_generation_prompt=True,
            enable_thinking=False,
            date_string=TEMPLATE_DATE,
            tokenize=False,
        )
        return str(rendered)

    def prompt_text(self, message: str) -> str:
        """The whole prompt as text (chat template, or the message and ``\\nAnswer:``)."""
        return self.render_chat(message) if self.chat else message + PLAIN_SUFFIX

    def encode(self, message: str) -> list[int]:
        """Token ids of the prompt for ``message``.

        Chat: the template's text around the message is tokenised with its
        special tokens, the message with special-token parsing off (a template
        that does not place the message exactly once, verbatim, is refused when
        the renderer is built). Plain: the prompt with the tokenizer's special
        tokens added, parsing off.
        """
        # encode_batch releases the GIL while it works (a plain encode holds it), so a
        # long state tokenising in the planning pool never stalls the event loop.
        if not self.chat:
            [whole] = self.text.encode_batch([message + PLAIN_SUFFIX], add_special_tokens=True)
            return list(whole.ids)
        [content] = self.text.encode_batch([message], add_special_tokens=False)
        return [*self._head_ids, *content.ids, *self._tail_ids]


UNASKED = {
    "choice": "Which option fits the state?",
    "noul": "Which option describes the state?",
    "score": "Which level fits the state?",
}
"""The question a prompt asks when the client gave no instructions (a Noul described by
its criteria; a Jev Choice or Score, whose options say what is asked)."""


def asked(question: Question) -> str:
    """The question's instructions, or :data:`UNASKED` for its type when it has none."""
    return question.instructions or UNASKED[question.type]


def message(state: str, question: Question, shown: tuple[str, ...]) -> str:
    """The user message for ``question`` about ``state`` with option labels ``shown``.

    Noul lists ``yes`` (true) before ``no`` (false); ``shown`` is in option
    order (false, true).
    """
    lines = [f"State:\n{state}", "", f"Question: {asked(question)}", "Options:"]
    pairs = list(zip(shown, question.options, strict=True))
    if question.type == "noul":
        pairs.reverse()
    order = [label for label, _ in pairs]
    for label, option in pairs:
        if question.type == "choice":
            described = f": {option.description}" if option.description is not None else ""
            lines.append(f"{label}. {option.key}{described}")
        elif question.type == "noul":
            lines.append(f"{label}: {option.description or option.key}")
        else:
            lines.append(f"{label}. {option.description}")
    lines.append(f"Reply with one of: {', '.join(order)}.")
    return "\n".join(lines)
