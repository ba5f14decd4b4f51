"""Option scores of a decision question for a weak decoder: the readouts measured.

The family's default readout (:mod:`.model`) reads the next-token logit of one
label per option (``A``, ``B``, ...). A small instruction-tuned model such as
SmolLM2-135M leans on position: the first label wins far more often than the
questions warrant. The readouts here score the same question otherwise, each
returning one float per option (in ``question.options`` order) whose softmax
is the answer's distribution:

- ``letters``: the label logits, as the default readout reads them.
- ``letters_cf``: contextual calibration (Zhao et al. 2021, "Calibrate Before
  Use: Improving Few-Shot Performance of Language Models", ICML): the label
  log-probabilities less those the same question gets about a content-free
  state (:data:`CONTENT_FREE`).
- ``option_sum``: the log-probability of each option's own text as the
  assistant's reply (:func:`option_message` lists the options without labels
  and asks for one), summed over its tokens.
- ``option_mean``: the same, divided by the option's token count.

Every score comes from the engine's ``forward`` (next-token logits of
left-padded rows continuing a shared prefix), so no engine change is needed.
The logits come back as float32 torch tensors; they are read here, and by the
family's model, as numpy arrays (:func:`log_softmax`), so torch is imported only
where a decoder runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from vllm_srun.plugins.decisions import Question
from vllm_srun.plugins.spec import DecoderBatch

from .prompts import asked, message

METHODS = ("letters", "letters_cf", "option_sum", "option_mean")
"""The readouts :func:`option_scores` computes."""

CONTENT_FREE = ("N/A",)
"""The content-free state of contextual calibration (Zhao et al. 2021's main one)."""

NOUL_REPLIES = ("no", "yes")
"""A Noul question's reply texts, false first (the order of its options)."""


def option_texts(question: Question) -> tuple[str, ...]:
    """What the reply of each option says: Choice its key, Noul ``no``/``yes``, Score its
    level's description (the level number when it has none)."""
    if question.type == "noul":
        return NOUL_REPLIES
    if question.type == "score":
        return tuple(o.description if o.description else o.key for o in question.options)
    return tuple(o.key for o in question.options)


def option_message(state: str, question: Question) -> str:
    """The user message asking for an option's own text as the reply (no labels)::

    State:
    <state>

    Question: <instructions>
    Options:
    - billing: Payments, charges, refunds and invoices
    - shipping
    Reply with one of: billing, shipping.
    """
    texts = option_texts(question)
    lines = [f"State:\n{state}", "", f"Question: {asked(question)}", "Options:"]
    for option, text in zip(question.options, texts, strict=True):
        if question.type in ("choice", "noul") and option.description is not None:
            lines.append(f"- {text}: {option.description}")
        else:
            lines.append(f"- {text}")
    shown = list(reversed(texts)) if question.type == "noul" else list(texts)
    lines.append(f"Reply with one of: {', '.join(shown)}.")
    return "\n".join(lines)


def log_softmax(values: ArrayLike, axis: int = -1) -> NDArray[np.float64]:
    """``z - max z - ln sum exp(z - max z)`` along ``axis``, in float64 (the formula and
    order of ``torch.log_softmax``).

    Args:
        values: scores of any float dtype, read as float64; every slice along ``axis``
            is normalised on its own data alone.
        axis: the axis normalised over.

    Returns:
        float64 log-probabilities, ``values``' shape.
    """
    z = np.asarray(values, dtype=np.float64)
    shifted = z - z.max(axis=axis, keepdims=True)
    out: NDArray[np.float64] = shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
    return out


def host_logits(logits: Any) -> NDArray[np.float32]:
    """A decoder's ``forward`` output (a torch tensor, any device and float dtype) as a
    float32, C-contiguous numpy array in host memory (the shape kept)."""
    return np.ascontiguousarray(logits.detach().float().cpu().numpy(), dtype=np.float32)


def _forward(engine_model: Any, rows: Sequence[Sequence[int]], prefix: int) -> NDArray[np.float64]:
    """Full-vocabulary next-token logits ``[rows, vocab]`` (float64) of rows sharing
    ``prefix`` tokens."""
    import torch  # a decoder runs on the native engine's torch

    width = max(len(r) - prefix for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, row in enumerate(rows):
        suffix = list(row[prefix:])
        ids[r, width - len(suffix) :] = torch.tensor(suffix, dtype=torch.long)
        mask[r, width - len(suffix) :] = 1
    prefix_ids = torch.tensor(list(rows[0][:prefix]), dtype=torch.long) if prefix else None
    logits = host_logits(engine_model.forward(DecoderBatch(ids, mask, prefix_ids=prefix_ids)))
    return logits.astype(np.float64)


def letter_logprobs(loaded: Any, state: str, question: Question) -> NDArray[np.float64]:
    """float64 ``[options]`` label log-probabilities (renormalised over the labels)."""
    labels = loaded.renderer.labels(question.type, len(question.options))
    if labels is None:
        raise ValueError(f"no single-token labels for {len(question.options)} options")
    ids = loaded.renderer.encode(message(state, question, labels.shown))
    logits = _forward(loaded.engine_model, [ids], 0)[0, list(labels.token_ids)]
    return log_softmax(logits)


def option_logprobs(
    loaded: Any, state: str, question: Question
) -> tuple[NDArray[np.float64], list[int]]:
    """float64 ``[options]`` summed log-probabilities of each option's text as the reply,
    and each text's token count."""
    renderer = loaded.renderer
    prompt = renderer.encode(option_message(state, question))
    replies = [
        list(renderer.text.encode(t, add_special_tokens=False).ids) for t in option_texts(question)
    ]
    rows, reads, owners = [], [], []
    for k, reply in enumerate(replies):
        for j, token in enumerate(reply):
            rows.append(prompt + reply[:j])
            reads.append(token)
            owners.append(k)
    logprobs = log_softmax(_forward(loaded.engine_model, rows, len(prompt) - 1), 1)
    sums = np.zeros(len(replies), dtype=np.float64)
    for row, (token, owner) in enumerate(zip(reads, owners, strict=True)):
        sums[owner] += logprobs[row, token]
    return sums, [len(r) for r in replies]


_FREE: dict[tuple[int, str, Question], NDArray[np.float64]] = {}


def _content_free(loaded: Any, question: Question) -> NDArray[np.float64]:
    """The content-free states' label log-probabilities (of their mean probability), once
    per question and model."""
    key = (id(loaded), "letters", question)
    if key not in _FREE:
        free = [np.exp(letter_logprobs(loaded, s, question)) for s in CONTENT_FREE]
        _FREE[key] = np.log(np.stack(free).mean(0))
    return _FREE[key]


def option_scores(loaded: Any, state: str, question: Question, method: str) -> list[float]:
    """One score per option of ``question`` about ``state`` under readout ``method``.

    Args:
        loaded: the family's loaded model (its ``renderer`` and ``engine_model``).
        state: the state as the prompt shows it.
        question: a valid question.
        method: one of :data:`METHODS`.

    Raises:
        ValueError: an unknown method, or no single-token labels for the question.
    """
    if method == "letters":
        return [float(v) for v in letter_logprobs(loaded, state, question)]
    if method == "letters_cf":
        own = letter_logprobs(loaded, state, question)
        return [float(v) for v in own - _content_free(loaded, question)]
    if method in ("option_sum", "option_mean"):
        sums, lengths = option_logprobs(loaded, state, question)
        if method == "option_mean":
            return [float(v) for v in sums / np.asarray(lengths, dtype=np.float64)]
        return [float(v) for v in sums]
    raise ValueError(f"unknown readout {method!r}: choose one of {', '.join(METHODS)}")
