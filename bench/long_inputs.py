"""Where the time goes on long inputs (100 to 150 tokens): one process, no HTTP.

The same 32 long texts (bench/corpus.py ``long_texts``) run, in turn and repeatedly, as:

- ``SentenceTransformer.encode`` (batch 32; SDPA attention, as it loads by default);
- MiniLM through the runtime's synchronous path (:meth:`ServedModel.answer`,
  ``embeddings``) under ``exact`` (eager attention, equal-length forwards), ``batching``
  (eager, one padded forward), ``max_speed`` as ``--engine auto`` picks it (native
  SDPA in bfloat16 on a CPU with native bfloat16, else the fused ONNX graph) and
  ``max_speed`` pinned to ``onnxruntime`` (the fused ONNX graph);
- the native engine's forward alone on the padded batch, with eager and with SDPA
  attention (what attention costs at this length).

The fastest of ``--repeats`` runs of each counts (a shared machine: the others met a busy
core); the report gives each as a ratio to ``encode``. Prints one JSON object and writes
bench/results/long_inputs.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import corpus  # noqa: E402
from server import default_model_dir  # noqa: E402

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def fastest(run: Callable[[], Any], repeats: int) -> float:
    """The fastest of ``repeats`` timed calls of ``run``, in seconds (after one warm call)."""
    run()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--results", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    import torch
    from sentence_transformers import SentenceTransformer

    from vllm_srun.compose.loader import LoadOptions, load_model
    from vllm_srun.plugins.spec import EncoderBatch

    torch.set_num_threads(args.threads)
    st = SentenceTransformer(str(default_model_dir()), device="cpu")
    tokens = lambda text: len(st.tokenizer(text)["input_ids"])  # noqa: E731
    texts = corpus.long_texts(32, tokens)
    served = {
        profile: load_model(MODEL, LoadOptions(offline=True, profile=profile, threads=args.threads))
        for profile in ("exact", "batching", "max_speed")
    }
    served["max_speed_onnxruntime"] = load_model(
        MODEL,
        LoadOptions(offline=True, profile="max_speed", engine="onnxruntime", threads=args.threads),
    )
    engine = served["exact"].loaded.host.engine_model
    encoded = served["exact"].loaded.host
    rows = encoded.plan("embeddings", _request(texts)).items
    width = max(r.tokens for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : row.tokens] = torch.tensor(row.input_ids)
        mask[i, : row.tokens] = 1
    batch = EncoderBatch(ids.numpy(), mask.numpy())  # the encoder contract: numpy in
    model = engine.model

    def forward_with(attention: str) -> Callable[[], Any]:
        def run() -> Any:
            model.config._attn_implementation = attention
            return engine.encode(batch)

        return run

    timings = {
        "encode": lambda: st.encode(texts, batch_size=32),
        "exact": lambda: served["exact"].answer("embeddings", {"input": texts}),
        "batching": lambda: served["batching"].answer("embeddings", {"input": texts}),
        "max_speed": lambda: served["max_speed"].answer("embeddings", {"input": texts}),
        "max_speed_onnxruntime": lambda: served["max_speed_onnxruntime"].answer(
            "embeddings", {"input": texts}
        ),
        "forward_eager": forward_with("eager"),
        "forward_sdpa": forward_with("sdpa"),
    }
    seconds = {name: fastest(run, args.repeats) for name, run in timings.items()}
    model.config._attn_implementation = "eager"
    base = seconds["encode"]
    figures = {
        "mean_tokens": round(sum(r.tokens for r in rows) / len(rows), 1),
        "distinct_lengths": len({r.tokens for r in rows}),
        "seconds": {k: round(v, 4) for k, v in seconds.items()},
        "throughput_vs_encode": {k: round(base / v, 3) for k, v in seconds.items()},
        "loadavg": os.getloadavg()[0],
    }
    args.results.mkdir(parents=True, exist_ok=True)
    fast = served["max_speed"].card()
    lines = [
        "# Long inputs (100-150 tokens), 32 texts, in process",
        "",
        f"max_speed under --engine auto: {fast['engine']}, {fast['dtype']}, "
        f"{fast.get('attention') or 'graph'}.",
        "",
        f"Mean {figures['mean_tokens']} tokens, {figures['distinct_lengths']} distinct lengths; "
        f"{args.threads} threads; fastest of {args.repeats}; load average "
        f"{figures['loadavg']:.1f} (a shared machine: read the ratios).",
        "",
        "| path | seconds | throughput vs encode |",
        "| --- | ---: | ---: |",
    ]
    for name, value in seconds.items():
        lines.append(f"| {name} | {value:.4f} | {base / value:.2f}x |")
    (args.results / "long_inputs.md").write_text("\n".join(lines) + "\n")
    print(json.dumps(figures))
    return 0


def _request(texts: list[str]) -> Any:
    from vllm_srun.plugins.requests import read_request

    return read_request("embeddings", {"input": texts})


if __name__ == "__main__":
    raise SystemExit(main())
