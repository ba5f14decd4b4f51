"""How ``exact`` forms its forwards, in process: the grid of length edges, chosen here.

MiniLM's forwards under ``exact`` on batches of 32 corpus sentences (bench/corpus.py,
13 to 73 tokens), the way the scheduler takes them at 32 concurrent requests, each
batch run as:

- ``batching``: the ``batching`` profile's groups (:func:`split_by_length` at the
  forward cost measured at load), padded to each group's longest row;
- ``padded_to_edge``: ``exact``'s groups, cut at edges of the grid, each padded to the
  edge of its longest row, for grids 8, 16 and 32 tokens apart (to 256 tokens);
- ``same_bucket``: rows share a forward only with rows of their own edge (16 apart);
- ``equal_length``: rows share a forward only with rows of their own length.

Every ``exact`` forward runs as the runtime runs it (:func:`exact_forward`: filled to
32 tokens). The fastest of ``--repeats`` runs of each batch counts; the figure to read
is each way's time as a ratio to ``batching`` (more than 1: slower).

Then what one concurrent client costs: ``--lone`` sentences, each run alone the three
ways (``batching``: its own length; ``equal_length``, the ``exact`` of before length
edges: its own length, filled with copies to 32 tokens; ``padded_to_edge``: padded to its
edge, filled to 32 tokens), the mean of the fastest of ``--repeats`` per sentence.

Prints one JSON object and writes bench/results/exact_shapes.md.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import corpus  # noqa: E402
import long_inputs  # noqa: E402
from machine import machine  # noqa: E402

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def fastest_ms(run: Callable[[], Any], repeats: int) -> float:
    """:func:`long_inputs.fastest` in milliseconds."""
    return long_inputs.fastest(run, repeats) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", type=int, default=8, help="batches of 32 sentences")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lone", type=int, default=64, help="sentences run alone")
    parser.add_argument("--results", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    import torch

    from vllm_srun.compose.batching import ExactShapes, LengthEdges, exact_forward, split_by_length
    from vllm_srun.compose.loader import LoadOptions, load_model
    from vllm_srun.plugins.requests import read_request

    torch.set_num_threads(args.threads)
    served = load_model(MODEL, LoadOptions(offline=True, threads=args.threads))
    loaded, overhead = served.loaded, served.forward_cost.get("overhead_tokens")
    rows = loaded.plan("embeddings", read_request("embeddings", {"input": corpus.sentences(4000)}))
    rng = random.Random(20261201)
    batches = [rng.sample(rows.items, 32) for _ in range(args.batches)]
    limit = served.spec.token_limit

    def grid(step: int) -> LengthEdges:
        return LengthEdges(limit, ((256, step), (512, 32), (1024, 64), (None, 128)))

    ways: dict[str, tuple[ExactShapes | None, Callable[[list[Any]], list[list[Any]]]]] = {
        "batching": (None, lambda batch: split_by_length(batch, overhead)),
    }
    for name, shapes in (
        ("padded_to_edge, edges 8 apart", ExactShapes("padded_to_edge", grid(8))),
        ("padded_to_edge, edges 16 apart (the default)", ExactShapes("padded_to_edge", grid(16))),
        ("padded_to_edge, edges 32 apart", ExactShapes("padded_to_edge", grid(32))),
        ("same_bucket, edges 16 apart", ExactShapes("same_bucket", grid(16))),
        ("equal_length", ExactShapes("equal_length")),
    ):
        ways[name] = (shapes, lambda batch, s=shapes: s.groups(batch, overhead))
    totals = dict.fromkeys(ways, 0.0)
    forwards = dict.fromkeys(ways, 0)
    for batch in batches:
        for name, (shapes, groups) in ways.items():
            run = loaded.run if shapes is None else exact_forward(loaded.run, shapes)
            planned = groups(batch)
            totals[name] += fastest_ms(lambda p=planned, r=run: [r(g) for g in p], args.repeats)
            forwards[name] += len(planned)
    lone_rows = rng.sample(rows.items, args.lone)
    lone = {}
    for name, shapes in (
        ("batching", None),
        ("equal_length (exact before edges)", ExactShapes("equal_length")),
        ("padded_to_edge (exact)", ExactShapes("padded_to_edge", grid(16))),
    ):
        run = loaded.run if shapes is None else exact_forward(loaded.run, shapes)
        times = [fastest_ms(lambda r=row, f=run: f([r]), args.repeats) for row in lone_rows]
        lone[name] = round(sum(times) / len(times), 2)
    base = totals["batching"]
    figures = {
        name: {
            "ms_per_batch": round(totals[name] / len(batches), 1),
            "forwards_per_batch": round(forwards[name] / len(batches), 2),
            "time_vs_batching": round(totals[name] / base, 3),
        }
        for name in ways
    }
    host = machine()
    lines = [
        "# exact: forward shapes, MiniLM in process",
        "",
        f"- machine: {host['cpu']}, {host['cores']} cores; torch threads {args.threads}",
        f"- {args.batches} batches of 32 corpus sentences; forward cost at load: "
        f"{served.forward_cost}",
        f"- load-time probe under exact: {served.card()['batch_invariance']['method']}",
        "",
        "| forwards formed as | ms per batch | forwards per batch | time vs batching |",
        "| --- | ---: | ---: | ---: |",
        *(
            f"| {name} | {f['ms_per_batch']} | {f['forwards_per_batch']} | "
            f"{f['time_vs_batching']:.3f}x |"
            for name, f in figures.items()
        ),
        "",
        f"One row alone ({args.lone} sentences, mean ms of the fastest of {args.repeats}):",
        "",
        "| a lone row run as | ms | vs batching |",
        "| --- | ---: | ---: |",
        *(f"| {name} | {ms} | {ms / lone['batching']:.3f}x |" for name, ms in lone.items()),
        "",
    ]
    figures["lone_row_ms"] = lone  # type: ignore[assignment]
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "exact_shapes.md").write_text("\n".join(lines))
    print("\n".join(lines))
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
