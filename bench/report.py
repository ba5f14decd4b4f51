"""The report of the serving benchmark: bench/results/serving.md from the run's details.

The targets the run is judged against, how the figures were measured (machine,
threads, load generator, rounds, corpus, noise), the target and mean figures,
every measurement with its server-side counters and CPU, and the Server-Timing
phases of the diagnostic pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import corpus
from loadgen import PHASES
from machine import CLEAN_PCT

TARGETS = {"tput_ratio_c32": 0.9, "added_p50_ms": 2.0, "vs_compare_c32": 0.95}
"""HTTP req/s at c32 over in-process texts/s at batch 32 (at least); HTTP p50 at c1 less
in-process single-text p50, in ms (at most); the default profile's (``exact``) HTTP req/s
at c32 over the ``--compare-profile`` server's (``batching``) in the same rounds (at least)."""


def _compare_rows(d: dict[str, Any], met: Any) -> list[str]:
    """The target row and the figures of the ``--compare-profile`` server, when one ran."""
    f, profile = d["figures"], d.get("compare_profile")
    if not profile:
        return []
    command = " ".join(Path(a).name if "/" in a else a for a in d["compare_command"])
    return [
        f"| vs_compare_c32 (HTTP req/s at c32, default profile / `{profile}`, same rounds) "
        f"| {f['vs_compare_c32']:.3f} | {', '.join(map(str, f['vs_compare_c32_rounds']))} "
        f"| >= {TARGETS['vs_compare_c32']} | {met('vs_compare_c32')} |",
        "",
        f"`{profile}` beside it (`{command}`): "
        f"c32 {f['compare_http_rps_c32']:.1f} req/s ({f['mean_batch_rows_compare_c32']:.2f} rows "
        f"per forward; the default profile {f['mean_batch_rows_c32']:.2f}); c1 p50 "
        f"{f['compare_http_p50_ms_c1']:.2f} ms, the default profile's "
        f"{f['c1_p50_ms_minus_compare']:+.2f} ms from it.",
    ]


def markdown(d: dict[str, Any], connections: list[int]) -> str:
    """bench/results/serving.md."""
    f, m, rounds = d["figures"], d["machine"], d["rounds"]

    def met(key: str) -> str:
        return "**met**" if f["targets_met"][key] else "**not met**"

    def num(value: Any, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    gen = f["load_generator"]
    gen_text = f"`{d['wrk']}` with bench/embed.lua" if gen == "wrk" else "the Python asyncio "
    if gen != "wrk":
        gen_text += "load generator in bench/run.py (wrk was not available)"
    lines = [
        "# Serving: all-MiniLM-L6-v2 over HTTP vs in process",
        "",
        f"- date: {d['date']}",
        f"- machine: {m['cpu']}, {m['cores']} cores ({m['affinity']} usable), "
        f"Linux {m['kernel']}, Python {m['python']}, torch {m['torch']}; "
        f"load average {m['loadavg_before']:.2f} before, {d['loadavg_after']:.2f} after",
        f"- torch threads: {f['threads']} on both sides (server `--threads {f['threads']}`, "
        f"`torch.set_num_threads({f['threads']})` in process); the load generator runs on "
        "the same cores",
        f"- load generator: {gen_text}; closed loop, one text per request",
        f"- {f['rounds']} rounds of {f['duration_s']:g} s measurements, each round in the order "
        "in-process batch 32, HTTP c32, in-process single text, HTTP c1, then the other "
        "concurrencies; figures are the means over the rounds",
        f"- corpus: {f['corpus_sentences']} distinct generated sentences of 10-60 words "
        f"(bench/corpus.py, seed {corpus.SEED}); every HTTP measurement (and retry) has its "
        "own slice, so the server never sees a sentence twice; the in-process measurements "
        "of a round use the first sentences of that round's c32 slice (batch 32) and c1 "
        f"slice (single text). Sentences repeated: {f['repeats']}; result cache hit rate over "
        f"every HTTP measurement: {f['cache_hit_rate']:.4f}",
        f"- noise: each measurement waits for a quiet machine and is tried up to {d['tries']} "
        f"times, stopping at the first try during which other processes used under "
        f"{CLEAN_PCT:g}% of a core; the try with the least such CPU is kept (chosen on noise, "
        f"never on its figures). Most CPU other processes took in a kept measurement: "
        f"{f['noise_other_cpu_pct_max']:.0f}% of a core",
        f"- server: `{' '.join(Path(a).name if '/' in a else a for a in d['server_command'])}`",
        "",
        "## Targets",
        "",
        "| target | value | per round | goal | |",
        "| --- | --- | --- | --- | --- |",
        f"| tput_ratio_c32 (HTTP req/s at c32 / in-process texts/s at batch 32) "
        f"| {f['tput_ratio_c32']:.3f} | {', '.join(map(str, f['tput_ratio_c32_rounds']))} "
        f"| >= {TARGETS['tput_ratio_c32']} | {met('tput_ratio_c32')} |",
        f"| added_p50_ms (HTTP p50 at c1 - in-process single-text p50) "
        f"| {f['added_p50_ms']:.2f} | {', '.join(map(str, f['added_p50_ms_rounds']))} "
        f"| <= {TARGETS['added_p50_ms']} | {met('added_p50_ms')} |",
        *_compare_rows(d, met),
        "",
        "## Figures (means over the rounds)",
        "",
        "| measure | value |",
        "| --- | --- |",
        f"| in process, batch 32 (one `encode` call per 32 sentences) | {f['st_tps_b32']:.1f} "
        "texts/s |",
        "| in process, single text p50 (one `encode` call per sentence) "
        f"| {f['st_p50_ms']:.2f} ms |",
        *(
            f"| HTTP c{c} | {f[f'http_rps_c{c}']:.1f} req/s, p50 {f[f'http_p50_ms_c{c}']:.2f} ms, "
            f"p99 {f[f'http_p99_ms_c{c}']:.2f} ms |"
            for c in connections
        ),
        "",
        f"In-process attention implementation: {d['st_attention']} (the server's native engine "
        "runs eager attention, its bit-exact kernel).",
        "",
        "## Every measurement",
        "",
        "| round | measure | texts/s or req/s | p50 ms | p99 ms | errors | cache hit rate "
        "| forwards | mean rows/forward | mean forward ms | mean queue ms "
        "| CPU % server / client / others | try |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for number, r in enumerate(rounds, 1):
        for key, row in r.items():
            tries = f"{row['try']} of {len(row['tries'])}"
            if key == "st_b32":
                lines.append(
                    f"| {number} | in process, batch 32 | {row['tps']:.1f} | | | | | | | | "
                    f"| - / {row['self_cpu_pct']:.0f} / {row['foreign_cpu_pct']:.0f} | {tries} |"
                )
            elif key == "st_single":
                lines.append(
                    f"| {number} | in process, single text | | {row['p50_ms']:.2f} | | | | | | "
                    f"| | - / {row['self_cpu_pct']:.0f} / {row['foreign_cpu_pct']:.0f} "
                    f"| {tries} |"
                )
            else:
                lines.append(
                    f"| {number} | HTTP {key.replace('compare_', '')}"
                    f"{' (' + d['compare_profile'] + ')' if key.startswith('compare_') else ''} "
                    f"| {row['rps']:.1f} | {row['p50_ms']:.2f} "
                    f"| {row['p99_ms']:.2f} | {row['errors']} | {row['cache_hit_rate']:.4f} "
                    f"| {row['forwards']} | {num(row['mean_batch_rows'], '.2f')} "
                    f"| {num(row['mean_forward_ms'], '.2f')} | {num(row['mean_queue_ms'], '.2f')} "
                    f"| {row['server_cpu_pct']:.0f} / "
                    f"{row['self_cpu_pct'] + row['children_cpu_pct']:.0f} "
                    f"/ {row['foreign_cpu_pct']:.0f} | {tries} |"
                )
    histogram: dict[str, int] = {}
    for r in rounds:
        for bucket, count in r["c32"]["batch_rows_histogram"].items():
            histogram[bucket] = histogram.get(bucket, 0) + count
    lines += [
        "",
        "Forward and queue times are means from the `/metrics` histograms (differences "
        "before/after each measurement). CPU % is of one core (the machine has "
        f"{100 * m['affinity']}); 'others' is CPU that neither the server nor the load "
        "generator nor this process used: other tenants of the machine, i.e. noise.",
        "",
        f"Forwards by rows at c32, all rounds: {histogram}",
    ]
    if d["server_timing_p50_ms"]:
        lines += [
            "",
            "## Server-Timing (diagnostic pass, Python client, 3 s, p50 of each phase in ms)",
            "",
            "| connections | client p50 | " + " | ".join(PHASES) + " |",
            "| --- | --- | " + " | ".join("---" for _ in PHASES) + " |",
        ]
        for key, row in d["server_timing_p50_ms"].items():
            lines.append(
                f"| {key[1:]} | {row['client_p50_ms']:.2f} | "
                + " | ".join(f"{row[f'{p}_p50_ms']:.2f}" for p in PHASES)
                + " |"
            )
    lines.append("")
    return "\n".join(lines)
