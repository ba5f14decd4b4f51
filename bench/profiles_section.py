"""Profiles benchmark: HTTP c32 throughput of MiniLM under each numeric profile, against
in-process ``SentenceTransformer.encode`` of the same texts, on short and long inputs.

Two corpora: the serving benchmark's sentences (10 to 60 words, about 15 to 80 tokens)
and a long-input corpus (:func:`corpus.long_texts`: 100 to 150 tokens each). For each
profile (``exact``, ``batching``, ``max_speed``, and ``max_speed`` pinned to the engine
``--engine auto`` leaves out) one ``vllm-srun serve --profile NAME`` runs, and its card's
engine, dtype and attention are reported; for each corpus, an in-process ``encode``
measurement (batches of 32) and the HTTP measurement (``POST /v1/embeddings``, one text
per request, 32 connections, closed loop, the Python load generator) run back to back,
so drift in the machine's speed hits both.
Every measurement takes texts no earlier one used (the result cache only misses).

Run alone (`python bench/profiles_section.py --duration 8`) or through `make bench`.
Writes bench/results/profiles.md and profiles.json; the last line printed is the
figures as one JSON object. Ratios are the figures to read: on a shared machine the
absolute texts/s move with the other processes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import corpus  # noqa: E402
from inprocess import InProcess  # noqa: E402
from loadgen import request_bodies, run_python  # noqa: E402
from machine import log, machine  # noqa: E402
from server import Server, default_model_dir, free_port  # noqa: E402

PROFILES = ("exact", "batching", "max_speed", "max_speed:onnxruntime")
"""What runs, in order: a profile's name, or ``NAME:ENGINE`` to pin ``--engine`` (the
``max_speed`` of the engine ``--engine auto`` does not pick, for comparison)."""
CONNECTIONS = 32
RESULTS = HERE / "results"


def options(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="model package directory")
    parser.add_argument("--threads", type=int, default=2, help="torch threads, both sides")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per measurement")
    parser.add_argument("--profiles", default=",".join(PROFILES))
    parser.add_argument("--results", type=Path, default=RESULTS)
    return parser.parse_args(argv)


class Texts:
    """A corpus handed out in slices that never repeat."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.cursor = 0

    def take(self, count: int) -> list[str]:
        """The next ``count`` texts (wrapping around, with a marker so none repeats)."""
        out = []
        for _ in range(count):
            lap, index = divmod(self.cursor, len(self.texts))
            text = self.texts[index]
            out.append(text if lap == 0 else f"{text} ({lap})")
            self.cursor += 1
        return out


def measure_pair(
    inproc: InProcess, server: Server, texts: Texts, duration: float, expected_tps: float
) -> dict[str, Any]:
    """In-process batches of 32, then HTTP c32, on fresh slices of ``texts``."""
    size = int(expected_tps * duration * 3) + 64 * CONNECTIONS
    local = inproc.batches(texts.take(size), duration)
    remote = run_python(server.port, request_bodies(texts.take(size)), CONNECTIONS, duration)
    remote.pop("server_timing", None)
    return {
        "inprocess_tps": round(local["tps"], 1),
        "http_c32_tps": round(remote["rps"], 1),
        "ratio": round(remote["rps"] / local["tps"], 3),
        "errors": remote.get("errors", 0),
    }


def main(argv: list[str] | None = None) -> int:
    args = options(argv)
    model_dir = args.model or default_model_dir()
    started = dt.datetime.now(dt.UTC)
    inproc = InProcess(model_dir, args.threads)
    tokenizer = inproc.model.tokenizer
    count_tokens = lambda text: len(tokenizer(text)["input_ids"])  # noqa: E731
    corpora = {
        "short": Texts(corpus.sentences(20000)),
        "long": Texts(corpus.long_texts(3000, count_tokens)),
    }
    lengths = {
        name: round(sum(count_tokens(t) for t in c.texts[:200]) / 200, 1)
        for name, c in corpora.items()
    }
    log(f"mean tokens: {lengths}")
    rough = {name: inproc.warm_up(c.texts[:160])[0] for name, c in corpora.items()}
    figures: dict[str, Any] = {}
    served: dict[str, str] = {}
    for profile in [p.strip() for p in args.profiles.split(",") if p.strip()]:
        name, _, engine = profile.partition(":")
        extra = ["--profile", name] + (["--engine", engine] if engine else [])
        server = Server(model_dir, free_port(), args.threads, extra)
        try:
            ready = server.wait_ready(300)
            served[profile] = what_runs(server.port)
            log(f"{profile}: ready in {ready:.1f} s ({served[profile]})")
            run_python(server.port, request_bodies(corpora["short"].take(256)), CONNECTIONS, 2.0)
            figures[profile] = {
                name: measure_pair(inproc, server, texts, args.duration, rough[name])
                for name, texts in corpora.items()
            }
            log(f"{profile}: {json.dumps(figures[profile])}")
        finally:
            server.stop()
    details = {
        "date": started.isoformat(timespec="seconds"),
        "machine": machine(),
        "mean_tokens": lengths,
        "duration_s": args.duration,
        "threads": args.threads,
        "figures": figures,
        "served": served,
        "loadavg_after": os.getloadavg()[0],
    }
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "profiles.json").write_text(json.dumps(details, indent=2) + "\n")
    (args.results / "profiles.md").write_text(markdown(details))
    print(json.dumps(figures))
    return 0


def what_runs(port: int) -> str:
    """``engine, dtype, attention`` from the served model's card (``GET /v1/models``)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as answer:
        card = json.load(answer)["data"][0]
    return f"{card['engine']}, {card['dtype']}, {card.get('attention') or 'graph'}"


def markdown(details: dict[str, Any]) -> str:
    """The report: one row per profile and corpus."""
    lines = [
        "# Profiles: HTTP c32 vs in-process encode, MiniLM",
        "",
        f"Run {details['date']}, {details['threads']} threads both sides, "
        f"{details['duration_s']:g} s per measurement, mean tokens {details['mean_tokens']}; "
        f"load average after: {details['loadavg_after']:.1f}. A shared machine: read the ratios "
        "(each pair measured back to back), not the absolute texts/s.",
        "",
        "| profile | served as (engine, dtype, attention) | corpus | in-process texts/s "
        "| HTTP c32 texts/s | HTTP / in-process |",
        "| --- | --- | --- | ---: | ---: | ---: |",
    ]
    served = details.get("served", {})
    for profile, corpora in details["figures"].items():
        for name, row in corpora.items():
            lines.append(
                f"| {profile} | {served.get(profile, '?')} | {name} | {row['inprocess_tps']} | "
                f"{row['http_c32_tps']} | {row['ratio']:.2f}x |"
            )
    figures = details["figures"]
    if "exact" in figures and "batching" in figures:
        lines += ["", "exact / batching HTTP c32 throughput:"]
        for name in figures["exact"]:
            ratio = (
                figures["exact"][name]["http_c32_tps"] / figures["batching"][name]["http_c32_tps"]
            )
            lines.append(f"- {name}: {ratio:.2f}x")
    for other in [p for p in figures if p.startswith("max_speed:")]:
        if "max_speed" in figures:
            lines += ["", f"max_speed ({served.get('max_speed', '?')}) / {other} HTTP c32:"]
            for name in figures["max_speed"]:
                ratio = (
                    figures["max_speed"][name]["http_c32_tps"]
                    / figures[other][name]["http_c32_tps"]
                )
                lines.append(f"- {name}: {ratio:.2f}x")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
