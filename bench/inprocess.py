"""The in-process side of the serving benchmark: ``SentenceTransformer.encode``.

Throughput in batches of 32 (one ``encode`` call per 32 consecutive sentences)
and the latency of a single text (one ``encode`` call per sentence), torch
pinned to the thread count the server gets, each measurement metered for CPU
and taken as the cleanest of its tries.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from machine import CpuMeter, cleanest, log, percentile


class InProcess:
    """``SentenceTransformer.encode`` in this process, torch pinned to ``threads`` threads."""

    def __init__(self, model_dir: Path, threads: int) -> None:
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads)
        self.model = SentenceTransformer(str(model_dir), device="cpu")
        self.attention = getattr(self.model[0].auto_model.config, "_attn_implementation", "?")
        self.threads = torch.get_num_threads()

    def encode(self, texts: list[str] | str) -> None:
        """One ``encode`` call (a batch of up to 32 texts, or one text)."""
        self.model.encode(texts, batch_size=32, show_progress_bar=False)

    def warm_up(self, texts: list[str]) -> tuple[float, float]:
        """Warm up on ``texts`` (at least 4 * 32 + 16); a rough texts/s at batch 32 and
        single-text ms, to size the corpus slices."""
        for i in range(2):
            self.encode(texts[32 * i : 32 * i + 32])
        started = time.perf_counter()
        for i in range(2, 4):
            self.encode(texts[32 * i : 32 * i + 32])
        tps = 64 / (time.perf_counter() - started)
        started = time.perf_counter()
        for text in texts[128:144]:
            self.encode(text)
        return tps, (time.perf_counter() - started) * 1000 / 16

    def batches(self, texts: list[str], duration: float) -> dict[str, Any]:
        """Texts/s over ``duration`` s: one call per 32 consecutive texts from the start."""
        meter = CpuMeter()
        done = 0
        started = time.perf_counter()
        while (elapsed := time.perf_counter() - started) < duration:
            if done + 32 > len(texts):
                raise RuntimeError("the corpus slice ran out; it is sized from the warm-up")
            self.encode(texts[done : done + 32])
            done += 32
        return {"tps": done / elapsed, "texts": done, **meter.stop()}

    def singles(self, texts: list[str], duration: float) -> dict[str, Any]:
        """Latency of one call per text, texts from the start, for ``duration`` s."""
        meter = CpuMeter()
        latencies: list[float] = []
        started = time.perf_counter()
        while time.perf_counter() - started < duration or len(latencies) < 200:
            if len(latencies) >= len(texts):
                raise RuntimeError("the corpus slice ran out; it is sized from the warm-up")
            t0 = time.perf_counter()
            self.encode(texts[len(latencies)])
            latencies.append((time.perf_counter() - t0) * 1000)
        return {
            "p50_ms": statistics.median(latencies),
            "p90_ms": percentile(latencies, 90),
            "texts": len(latencies),
            **meter.stop(),
        }

    def batch_32(self, texts: list[str], duration: float, tries: int) -> dict[str, Any]:
        """:meth:`batches`, the cleanest of up to ``tries``."""
        result = cleanest("in process, batch 32", tries, lambda: self.batches(texts, duration))
        log(f"in process: {result['tps']:.1f} texts/s at batch 32")
        return result

    def single_text(self, texts: list[str], duration: float, tries: int) -> dict[str, Any]:
        """:meth:`singles`, the cleanest of up to ``tries``."""
        result = cleanest("in process, single text", tries, lambda: self.singles(texts, duration))
        log(f"in process: single-text p50 {result['p50_ms']:.2f} ms")
        return result
