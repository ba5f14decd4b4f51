"""The ``laya`` package as the reference for the laya family's tests.

- :func:`write_reference_checkpoint` builds a tiny random checkpoint through the package
  itself (its ``DecisionModel`` around a small ModernBERT, its ``save_checkpoint``), from the
  family fixture's tokenizer and configurations; never committed, written per test session.
- :func:`reference` answers questions through the package's own ``Agent`` (``system_one``
  for one state, ``predict_batch`` for several), with its 4-decimal rounding of
  probabilities turned off so that they compare within 1e-5.
- :func:`as_laya` turns a decisions request's question into the package's question form.

The ``parallel`` option layout needs transformers 5 in the package (ModernBERT's
per-layer-type attention masks); with transformers 4 the tests run the package's own
layout and masks through :func:`transformers4_masks`, which hands them to transformers 4's
ModernBERT the way transformers 5 takes them (the full-attention mask in its global layers,
the sliding one in its local layers).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from vllm_srun.families.laya.fixture import (
    QKV_SCALE,
    agent_config,
    encoder_config,
    head_tensors,
    write_tokenizer,
)


def write_reference_checkpoint(root: Path, layout: str = "sequential", seed: int = 2) -> Path:
    """A random checkpoint of the family fixture's shapes, built and saved by the ``laya``
    package (``laya.common.DecisionModel``, ``laya.train.save_checkpoint``: weights in
    float16, encoder config, tokenizer, ``rl_agent_config.json``); its head's weights are
    drawn at the fixture's scales (:func:`~vllm_srun.families.laya.fixture.head_tensors`,
    ``seed``) so that answers are far from uniform."""
    import torch
    from laya.common import DecisionModel
    from laya.train import save_checkpoint
    from transformers import ModernBertModel

    target = root / f"laya-reference-{layout}"
    tokenizer = write_tokenizer(root / f"tokenizer-{layout}")
    config = encoder_config(len(tokenizer))
    torch.manual_seed(seed)
    model = DecisionModel(ModernBertModel(config), head_layers=2, n_act=2)
    with torch.no_grad():  # as the family fixture: attention sharp enough that options differ
        for name, parameter in model.encoder.named_parameters():
            if name.endswith("attn.Wqkv.weight"):
                parameter.mul_(QKV_SCALE)
    # the head's initial weights answer within 0.01 of uniform: the fixture's scales instead
    missing, _ = model.load_state_dict(head_tensors(config.hidden_size, 2, 2, seed), strict=False)
    assert all(name.startswith("encoder.") for name in missing), missing
    save_checkpoint(model, tokenizer, agent_config(layout), str(target))
    return target


def as_laya(question: Mapping[str, Any]) -> dict[str, Any]:
    """A decisions request's question (``criteria``, ``choices`` or ``levels``) in the
    package's form: Choice ``criteria`` ``{key: description or None}``, Noul ``criteria``
    ``{"false", "true"}`` (the sides described), Score ``criteria`` a list of levels."""
    kind = question["type"]
    laid: dict[str, Any] = {"type": kind, "instructions": question["instructions"]}
    if kind == "choice":
        if "choices" in question:
            laid["criteria"] = {c["key"]: c.get("description") for c in question["choices"]}
        else:
            laid["criteria"] = dict(question["criteria"])
    elif kind == "score":
        laid["criteria"] = list(question.get("levels") or question["criteria"])
    elif question.get("criteria"):
        laid["criteria"] = {k: v for k, v in question["criteria"].items() if v is not None}
    return laid


def _unrounded(value: Any, digits: int | None = None) -> Any:
    return value


@contextlib.contextmanager
def unrounded() -> Iterator[None]:
    """The package's answers without their 4-decimal rounding (its ``round`` is looked up
    in ``laya.agent``'s globals before the built-in one)."""
    import laya.agent

    laya.agent.round = _unrounded  # type: ignore[attr-defined]
    try:
        yield
    finally:
        del laya.agent.round  # type: ignore[attr-defined]


def load_agent(package: Path) -> Any:
    """The package's ``Agent`` for ``package`` on the CPU (float32, eager)."""
    import warnings

    import laya

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the fixture's clamped temperature
        return laya.load(str(package), device="cpu")


def reference(
    agent: Any, states: list[Any], questions: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The package's answers (unrounded) to ``questions`` about each state: ``system_one``
    for a single state, one ``predict_batch`` forward for several."""
    laid = {name: as_laya(q) for name, q in questions.items()}
    with unrounded():
        if len(states) == 1:
            return [agent.system_one(states[0], laid)["answers"]]
        return [result["answers"] for result in agent.predict_batch(states, laid)]


def probabilities(answer: Mapping[str, Any]) -> dict[str, float]:
    """An answer's probabilities by option key (Noul: ``{"true": noul}``)."""
    if answer["type"] == "noul":
        return {"true": float(answer["noul"])}
    return {str(k): float(v) for k, v in answer["probabilities"].items()}


def largest_difference(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> float:
    """The largest difference between two answers' probabilities (same keys required)."""
    a, b = probabilities(ours), probabilities(theirs)
    assert list(a) == list(b), (a, b)
    return max(abs(a[k] - b[k]) for k in a)


def transformers4_masks(agent: Any) -> None:
    """Let the package run a ``parallel`` checkpoint with transformers 4 (see the module):
    its encoder's call with the ``{"full_attention", "sliding_attention"}`` boolean masks
    and position ids it builds (``laya.common.parallel_option_masks``) runs transformers 4's
    ModernBERT with those masks as its global and sliding-window masks."""
    import torch

    encoder = agent.model.encoder
    # transformers 5's ModernBertConfig has sliding_window, half of local_attention (the
    # package builds the sliding mask only when the config has it)
    encoder.config.sliding_window = encoder.config.local_attention // 2
    plain = encoder.forward

    def forward(
        input_ids: Any, attention_mask: Any = None, position_ids: Any = None, **kw: Any
    ) -> Any:
        if not isinstance(attention_mask, dict):
            return plain(input_ids=input_ids, attention_mask=attention_mask, **kw)
        dtype = encoder.dtype
        lowest = torch.finfo(dtype).min

        def additive(allowed: Any) -> Any:
            return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, lowest)

        full = additive(attention_mask["full_attention"])
        sliding = additive(attention_mask["sliding_attention"])
        encoder._update_attention_mask = lambda mask, output_attentions: (full, sliding)
        try:
            keep = torch.ones(input_ids.shape, dtype=torch.long)
            return plain(input_ids=input_ids, attention_mask=keep, position_ids=position_ids, **kw)
        finally:
            del encoder._update_attention_mask

    encoder.forward = forward
    agent.parallel_options = True


def load_parallel_agent(package: Path) -> Any:
    """The package's ``Agent`` for a ``parallel`` checkpoint under transformers 4: loaded as
    ``sequential`` (the package refuses the layout below transformers 5), then switched to
    the parallel layout with :func:`transformers4_masks`."""
    import laya.agent

    original = laya.agent.uses_parallel_layout
    laya.agent.uses_parallel_layout = lambda config: False  # type: ignore[assignment]
    try:
        agent = load_agent(package)
    finally:
        laya.agent.uses_parallel_layout = original  # type: ignore[assignment]
    settings = json.loads((package / "rl_agent_config.json").read_text())
    assert settings["option_layout"] == "parallel"
    transformers4_masks(agent)
    return agent
