"""Throughput of the served NanoGuard against the package's own scanner, side by side.

Run from the vllm-srun checkout, with the example installed (or on ``PYTHONPATH``)
and ``metatronnanoguard`` installed::

    python examples/third_party_family/bench.py [--rounds 3] [--copies 2]

One process, the same texts (the shipped prompt set; ``--copies`` more times with
a number appended, so that no two are equal), the
same torch threads, the two in turn for ``--rounds`` rounds; the fastest round of
each counts (the others met a busy core). It times:

- ``scanner``: ``NanoGuard(device="cpu").scan_batch(texts)``, the package's own
  batched call (every row padded to 512, one forward);
- ``served``: ``load_model(package).answer("classify", {"input": texts})``, the
  runtime's synchronous path: tokenise, dedupe, batch within ``--max-num-seqs``,
  forward, finish;
- ``masked``: the same network with padding masked out of attention and rows
  padded to the batch's longest, run directly: what dropping the model's
  512-token context would buy, and how far its answers move from the scanner's.

It prints a Markdown table and writes it to ``BENCH.md`` beside this file.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def seconds(function: Callable[[], object]) -> float:
    """Wall seconds of one call."""
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def main() -> None:
    """Measure and print the table (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--copies", type=int, default=1)
    args = parser.parse_args()

    from nanoguard import NanoGuard  # the reference; never imported by the plugin
    from vllm_srun_nanoguard.locate import package_folder

    # the runtime's own loader: this benchmark measures the host, it is not part of the plugin
    from vllm_srun.compose.loader import LoadOptions, load_model

    prompts = json.loads((HERE / "tests" / "prompts.json").read_text())["prompts"]
    # Copies after the first get their number appended: the runtime computes equal rows
    # once, which would flatter it against the scanner.
    texts = [p["text"] + (f" ({k})" if k else "") for k in range(args.copies) for p in prompts]
    package = package_folder()
    assert package is not None, "install metatronnanoguard first"

    scanner = NanoGuard(device="cpu")
    served = load_model(package, LoadOptions(name="nanoguard"))
    loaded = served.loaded
    network = loaded.engine_model.network  # type: ignore[attr-defined]
    tokenizer = loaded.tokenizer  # type: ignore[attr-defined]

    def masked() -> torch.Tensor:
        rows = tokenizer.encode(texts)
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), tokenizer.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
        with torch.inference_mode():
            return torch.softmax(network(ids, mask, mask_keys=True), dim=-1)[:, 1]

    def served_answer() -> dict[str, object]:
        return served.answer("classify", {"input": texts})

    reference = [r.injection_score for r in scanner.scan_batch(texts)]
    answer = served_answer()
    served_scores = [r["probabilities"][1] for r in answer["results"]]  # type: ignore[index]
    masked_scores = masked().tolist()
    sides: dict[str, Callable[[], object]] = {
        "scanner": lambda: scanner.scan_batch(texts),
        "served": served_answer,
        "masked": masked,
    }
    times = {name: float("inf") for name in sides}
    for _ in range(args.rounds):  # in turn, so a burst of noise hits every side
        for name, side in sides.items():
            times[name] = min(times[name], seconds(side))

    def gap(scores: list[float]) -> float:
        return max(abs(a - b) for a, b in zip(scores, reference, strict=True))

    rows = [
        ("scanner `scan_batch`", times["scanner"], 0.0),
        ("served (`load_model(...).answer`)", times["served"], gap(served_scores)),
        ("masked, padded to longest (not served)", times["masked"], gap(masked_scores)),
    ]
    lines = [
        f"NanoGuard, {len(texts)} distinct texts ({args.copies} x the shipped prompt set), "
        f"{torch.get_num_threads()} torch threads, {platform.machine()}, fastest of "
        f"{args.rounds} rounds taken in turn.",
        "",
        "| path | seconds | texts/s | vs scanner | max abs P(injection) - scanner's |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, took, difference in rows:
        lines.append(
            f"| {name} | {took:.2f} | {len(texts) / took:.1f} | "
            f"{times['scanner'] / took:.2f}x | {difference:.2e} |"
        )
    table = "\n".join(lines) + "\n"
    print(table)
    (HERE / "BENCH.md").write_text("# Measured by bench.py\n\n" + table)


if __name__ == "__main__":
    main()
