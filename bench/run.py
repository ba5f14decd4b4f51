"""Serving benchmark: what `make bench` runs.

One run, one corpus (bench/corpus.py: distinct generated sentences of 10 to 60
words), the real all-MiniLM-L6-v2 package, the same torch thread count on both
sides (server ``--threads N``, ``torch.set_num_threads(N)`` here):

- in process, ``SentenceTransformer.encode``: throughput in batches of 32 (one
  ``encode`` call per 32 consecutive sentences) and the p50 latency of a single
  text (one ``encode`` call per sentence);
- over HTTP, ``vllm-srun serve`` on a free port: ``POST /v1/embeddings`` with
  one text per request at 1, 8 and 32 concurrent connections, closed loop,
  ``--duration`` seconds each, with ``wrk`` and bench/embed.lua (a Python
  asyncio load generator when wrk is missing; the report says which ran).

The measurements run in ``--rounds`` rounds, in-process and HTTP back to back
(the server idles while the in-process ones run), so that drift in the
machine's speed hits both sides alike; the figures are means over the rounds.
Every HTTP measurement takes its own slice of the corpus and the server never
sees a sentence twice, so its result cache should see only misses: the hit
rate, read from ``/metrics`` before and after each measurement, is reported.
The in-process measurements of a round run on the first sentences of that
round's c32 (batch 32) and c1 (single text) slices, so both sides see the same
sentence lengths. On a shared machine each measurement waits for quiet and is
retried (``--tries``) while other processes take CPU; the report says how much
they took. A short diagnostic pass at the end reads ``Server-Timing`` phases
(parse, tokenize, queue, forward, post) at 1 and 32 connections.

Then the frontend section (bench/frontend_section.py): decisions straight to one worker vs
through ``vllm-sr serve -e`` attached to it (the p50 the frontend adds at c1, the c32
throughput ratio), and embeddings through a ``runtime`` grant over ``-dp 2`` workers of
one thread each vs one worker with ``--threads`` threads. ``--sections`` runs either
part alone.

Writes bench/results/serving.md and serving.json (and frontend.md and frontend.json
for the frontend section) and prints, as the last line, one JSON object with the
figures.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# The run's parts, modules beside this script: machine.py (machine facts, quiet, CPU
# metering, the cleanest try), inprocess.py and server.py (the two sides measured),
# loadgen.py (wrk, the Python generator, Server-Timing), report.py (serving.md).
import corpus  # noqa: E402
import frontend_section  # noqa: E402
from inprocess import InProcess  # noqa: E402
from loadgen import (  # noqa: E402
    PHASES,
    ensure_wrk,
    http_client,
    measure,
    request_bodies,
    run_python,
)
from machine import CpuMeter, cleanest, log, machine  # noqa: E402
from report import TARGETS, markdown  # noqa: E402
from server import Server, default_model_dir, free_port, server_side, snapshot  # noqa: E402

RESULTS = HERE / "results"

Slice = tuple[int, list[str]]
"""A slice of the corpus: the index of its first sentence, and its sentences."""


# -- the options ----------------------------------------------------------------------------
def options(argv: list[str] | None) -> tuple[argparse.Namespace, list[int]]:
    """The command line, and the HTTP concurrencies it asks for (1 and 32 among them)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="model package directory")
    parser.add_argument("--threads", type=int, default=2, help="torch threads, both sides")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of interleaved measurements")
    parser.add_argument("--connections", default="1,8,32")
    parser.add_argument("--load-generator", choices=("auto", "wrk", "python"), default="auto")
    parser.add_argument("--wrk-threads", type=int, default=1, help="wrk -t (CPU is scarce)")
    parser.add_argument("--corpus-size", type=int, default=20000, help="at least this many")
    parser.add_argument("--no-diagnostics", action="store_true", help="skip Server-Timing pass")
    parser.add_argument(
        "--tries", type=int, default=2, help="tries per measurement while other processes are busy"
    )
    parser.add_argument(
        "--sections",
        default="serving,frontend",
        help="what to measure: serving (HTTP vs in process), frontend (vllm-sr serve -e), "
        "or both (default)",
    )
    parser.add_argument(
        "--compare-profile",
        default="batching",
        help="a second server under this --profile, measured at c32 and c1 beside the "
        "default one (exact) in every round; 'none' to skip",
    )
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("server_args", nargs="*", help="extra `vllm-srun serve` options (after --)")
    args = parser.parse_args(argv)
    if args.duration < 8:
        log(f"warning: --duration {args.duration:g} is under the 8 s a measurement should last")
    args.sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    if not args.sections or args.sections - {"serving", "frontend"}:
        parser.error("--sections takes serving, frontend or both")
    connections = [int(c) for c in args.connections.split(",")]
    for needed in (1, 32):
        if needed not in connections:
            parser.error(f"--connections must include {needed}")
    return args, connections


def load_generator(requested: str) -> tuple[str, str | None]:
    """``wrk`` or ``python`` for ``--load-generator``, and wrk's version when it is wrk."""
    generator = requested
    if generator in ("auto", "wrk") and ensure_wrk():
        generator = "wrk"
    elif generator == "wrk":
        raise SystemExit("wrk is not installed and could not be installed")
    else:
        generator = "python"
    wrk_version = None
    if generator == "wrk":
        probe = subprocess.run(["wrk", "--version"], capture_output=True, text=True)
        wrk_version = (probe.stdout + probe.stderr).splitlines()[0].strip()
    log(f"load generator: {generator} {wrk_version or ''}")
    return generator, wrk_version


# -- the corpus -----------------------------------------------------------------------------
@dataclass
class Plan:
    """How the corpus is cut: the slice sizes, and per round one slice per concurrency."""

    slice_size: int
    warm_size: int
    diag_size: int
    rounds: list[dict[int, Slice]]


def plan_corpus(
    texts: corpus.Corpus, inproc: InProcess, args: argparse.Namespace, connections: list[int]
) -> Plan:
    """Warm up the in-process side on the corpus head and cut the corpus from its speed.

    A warm-up head, then per round one slice per HTTP measurement (the in-process
    measurements of that round run on the first sentences of the c32 and c1 slices),
    then spare slices for retries, the HTTP warm-up and the diagnostics.
    """
    rough_tps, rough_ms = inproc.warm_up(texts.take(4 * 32 + 16)[1])
    ceiling_rps = 3 * max(rough_tps, 1000 / rough_ms)
    slice_size = max(2000, math.ceil(ceiling_rps * args.duration))
    warm_size = max(500, math.ceil(ceiling_rps * 3))
    diag_size = max(500, math.ceil(ceiling_rps * 3))
    rounds = [{c: texts.take(slice_size) for c in connections} for _ in range(args.rounds)]
    texts.ensure(
        max(
            args.corpus_size,
            texts.cursor
            + warm_size
            + slice_size * len(connections) * args.rounds * (args.tries - 1)
            + 2 * diag_size,
        )
    )
    log(f"corpus: {len(texts.texts)} distinct sentences; slices of {slice_size}")
    return Plan(slice_size, warm_size, diag_size, rounds)


# -- the measurements -----------------------------------------------------------------------
@dataclass
class Session:
    """The measurements against one running server, and what they share."""

    args: argparse.Namespace
    generator: str
    texts: corpus.Corpus
    plan: Plan
    bodies: list[bytes]
    bodies_file: Path
    server: Server

    def measure(self, first: int, count: int, c: int, duration: float) -> dict[str, Any]:
        """One closed-loop measurement over bodies ``first .. first+count-1``."""
        return measure(self.generator, self.server, self.bodies, self.bodies_file, first,
                       count, c, self.args.wrk_threads, duration)  # fmt: skip

    def warm_up(self) -> None:
        """Sequential, then concurrent requests, on a slice of their own."""
        first, _ = self.texts.take(self.plan.warm_size)
        for body in self.bodies[first : first + 32]:
            conn = http_client(self.server.port)
            conn.request("POST", "/v1/embeddings", body, {"Content-Type": "application/json"})
            conn.getresponse().read()
            conn.close()
        self.measure(first + 32, self.plan.warm_size - 32, 32, 3.0)
        log("warm-up done")

    def http(self, c: int, paired: Slice) -> dict[str, Any]:
        """HTTP at ``c`` connections, the cleanest of up to ``--tries``: the first try on
        ``paired`` (the slice the round's in-process measurement shares), retries on fresh
        slices."""
        fresh = [paired]
        size = self.plan.slice_size

        def once() -> dict[str, Any]:
            first, _ = fresh.pop() if fresh else self.texts.take(size)
            if first + size > len(self.bodies):
                raise RuntimeError("the corpus ran out of unused sentences")
            before = snapshot(self.server)
            meter = CpuMeter(self.server.proc.pid)
            result = self.measure(first, size, c, self.args.duration)
            result.update(meter.stop())
            result.update(server_side(before, snapshot(self.server)))
            result["first_sentence"] = first
            log(
                f"c{c}: {result['rps']:.1f} req/s, p50 {result['p50_ms']:.2f} ms, "
                f"p99 {result['p99_ms']:.2f} ms, hit rate {result['cache_hit_rate']:.4f}, "
                f"mean batch {result['mean_batch_rows'] or 0:.1f} rows, "
                f"CPU % server {result['server_cpu_pct']:.0f} client "
                f"{result['self_cpu_pct'] + result['children_cpu_pct']:.0f} "
                f"others {result['foreign_cpu_pct']:.0f}, errors {result['errors']}"
            )
            if not self.server.alive():
                raise RuntimeError(f"the server died during c{c}:\n{self.server.tail()}")
            return result

        return cleanest(f"c{c}", self.args.tries, once)

    def round(
        self,
        inproc: InProcess,
        slices: dict[int, Slice],
        connections: list[int],
        compare: Session | None = None,
        compare_first: bool = False,
    ) -> dict[str, Any]:
        """One round: in-process batch 32, HTTP c32, in-process single text, HTTP c1, then
        the other concurrencies, back to back, so that the machine's drift over the run
        hits both sides alike; the server idles during the in-process ones. With
        ``compare`` (the server under ``--compare-profile``), its c32 and c1 run beside
        this server's on the same slices (its own process: no cache hits), before them
        when ``compare_first`` (the rounds alternate)."""
        duration, tries = self.args.duration, self.args.tries
        record: dict[str, Any] = {}

        def pair(c: int) -> None:
            ours = lambda: record.__setitem__(f"c{c}", self.http(c, slices[c]))  # noqa: E731
            if compare is None:
                ours()
                return
            theirs = lambda: record.__setitem__(  # noqa: E731
                f"compare_c{c}", compare.http(c, slices[c])
            )
            for measure_one in (theirs, ours) if compare_first else (ours, theirs):
                measure_one()

        record["st_b32"] = inproc.batch_32(slices[32][1], duration, tries)
        pair(32)
        record["st_single"] = inproc.single_text(slices[1][1], duration, tries)
        pair(1)
        for c in connections:
            if c not in (1, 32):
                record[f"c{c}"] = self.http(c, slices[c])
        return record

    def diagnostics(self) -> dict[str, Any]:
        """The p50 of each Server-Timing phase at 1 and 32 connections (Python client)."""
        diagnostics: dict[str, Any] = {}
        size = self.plan.diag_size
        for c in (1, 32):
            first, _ = self.texts.take(size)
            sample = run_python(self.server.port, self.bodies[first : first + size], c, 3.0,
                                timing=True)  # fmt: skip
            phases = sample.pop("server_timing")
            diagnostics[f"c{c}"] = {
                "requests": sample["requests"],
                "client_p50_ms": sample["p50_ms"],
                **{f"{p}_p50_ms": statistics.median(x.get(p, 0.0) for x in phases) for p in PHASES},
            }
        log("Server-Timing p50 (ms): " + json.dumps(diagnostics))
        return diagnostics


# -- the results ----------------------------------------------------------------------------
def summarise(
    rounds: list[dict[str, Any]], args: argparse.Namespace, connections: list[int],
    generator: str, texts: corpus.Corpus,
) -> dict[str, Any]:  # fmt: skip
    """The figures: means over the rounds, the targets and how each round did."""

    def mean(key: str, field: str) -> float:
        return statistics.fmean(r[key][field] for r in rounds)

    every = [t for r in rounds for k, m in r.items() if k.startswith("c") for t in m["tries"]]
    hits = sum(t["cache_hits"] for t in every)
    lookups = hits + sum(t["cache_misses"] for t in every)
    st_tps, st_p50 = mean("st_b32", "tps"), mean("st_single", "p50_ms")
    figures: dict[str, Any] = {
        "tput_ratio_c32": round(mean("c32", "rps") / st_tps, 4),
        "added_p50_ms": round(mean("c1", "p50_ms") - st_p50, 3),
        **{f"http_rps_c{c}": round(mean(f"c{c}", "rps"), 2) for c in connections},
        **{f"http_p50_ms_c{c}": round(mean(f"c{c}", "p50_ms"), 3) for c in connections},
        **{f"http_p99_ms_c{c}": round(mean(f"c{c}", "p99_ms"), 3) for c in connections},
        "st_tps_b32": round(st_tps, 2),
        "st_p50_ms": round(st_p50, 3),
        "cache_hit_rate": round(hits / lookups, 6) if lookups else 0.0,
        "load_generator": generator,
        "threads": args.threads,
        "duration_s": args.duration,
        "rounds": args.rounds,
        "tput_ratio_c32_rounds": [round(r["c32"]["rps"] / r["st_b32"]["tps"], 3) for r in rounds],
        "added_p50_ms_rounds": [
            round(r["c1"]["p50_ms"] - r["st_single"]["p50_ms"], 2) for r in rounds
        ],
        "corpus_sentences": len(texts.texts),
        "repeats": sum(t["wrapped"] for t in every),
        "http_errors": sum(t["errors"] for t in every),
        "noise_other_cpu_pct_max": round(
            max(m["foreign_cpu_pct"] for r in rounds for m in r.values()), 1
        ),
        "mean_batch_rows_c32": round(mean("c32", "mean_batch_rows"), 2),
    }
    figures["targets_met"] = {
        "tput_ratio_c32": figures["tput_ratio_c32"] >= TARGETS["tput_ratio_c32"],
        "added_p50_ms": figures["added_p50_ms"] <= TARGETS["added_p50_ms"],
    }
    if "compare_c32" in rounds[0]:
        figures.update(
            {
                "vs_compare_c32": round(mean("c32", "rps") / mean("compare_c32", "rps"), 4),
                "vs_compare_c32_rounds": [
                    round(r["c32"]["rps"] / r["compare_c32"]["rps"], 3) for r in rounds
                ],
                "compare_http_rps_c32": round(mean("compare_c32", "rps"), 2),
                "compare_http_p50_ms_c1": round(mean("compare_c1", "p50_ms"), 3),
                "c1_p50_ms_minus_compare": round(
                    mean("c1", "p50_ms") - mean("compare_c1", "p50_ms"), 3
                ),
                "mean_batch_rows_compare_c32": round(mean("compare_c32", "mean_batch_rows"), 2),
            }
        )
        figures["targets_met"]["vs_compare_c32"] = (
            figures["vs_compare_c32"] >= TARGETS["vs_compare_c32"]
        )
    return figures


def write_results(results: Path, details: dict[str, Any], connections: list[int]) -> None:
    """serving.json and serving.md (the serving section), frontend.json and frontend.md (the
    frontend section) in ``results``; the reports and the figures on stdout."""
    results.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Any] = {}
    common = {k: details[k] for k in ("date", "machine", "loadavg_after", "wrk")}
    if "serving" in details:
        serving_details = {**common, **details["serving"]}
        (results / "serving.json").write_text(json.dumps(serving_details, indent=2) + "\n")
        report = markdown(serving_details, connections)
        (results / "serving.md").write_text(report)
        print(report)
        figures.update(serving_details["figures"])
    if "frontend" in details:
        section = {**common, **details["frontend"]}
        (results / "frontend.json").write_text(json.dumps(section, indent=2) + "\n")
        report = "\n".join(frontend_section.markdown(section)) + "\n"
        (results / "frontend.md").write_text(report)
        print(report)
        figures["frontend"] = section["figures"]
    print(json.dumps(figures))


# -- the run --------------------------------------------------------------------------------
FRONTEND_MEASUREMENTS = 8
"""HTTP measurements per round of the frontend section (decisions and embeddings, worker
and frontend, c32 and c1)."""


def main(argv: list[str] | None = None) -> int:
    args, connections = options(argv)
    model_dir = args.model or default_model_dir()
    started_at = dt.datetime.now(dt.UTC)
    host = machine()
    generator, wrk_version = load_generator(args.load_generator)

    texts = corpus.Corpus()
    details: dict[str, Any] = {"date": started_at.isoformat(timespec="seconds"), "machine": host}
    slice_size = 3000
    if "serving" in args.sections:
        details["serving"] = serving(args, connections, model_dir, generator, texts)
        slice_size = max(slice_size, details["serving"]["slice_size"])
    if "frontend" in args.sections:
        texts.ensure(texts.cursor + slice_size * FRONTEND_MEASUREMENTS * args.rounds * args.tries)
        bodies = request_bodies(texts.texts)
        bodies_file = Path(tempfile.mkstemp(prefix="vllm-srun-bench-", suffix=".jsonl")[1])
        bodies_file.write_bytes(b"\n".join(bodies) + b"\n")
        try:
            details["frontend"] = frontend_section.run_section(
                args, model_dir, texts.take, texts.texts, slice_size, generator, measure,
                bodies, bodies_file,
            )  # fmt: skip
        finally:
            bodies_file.unlink(missing_ok=True)
        log("frontend section: " + json.dumps(details["frontend"]["figures"]))
    details["loadavg_after"] = os.getloadavg()[0]
    details["wrk"] = wrk_version
    write_results(args.results, details, connections)
    return 0


def serving(
    args: argparse.Namespace, connections: list[int], model_dir: Path, generator: str,
    texts: corpus.Corpus,
) -> dict[str, Any]:  # fmt: skip
    """The serving section: HTTP vs in process."""
    log(f"in process: loading SentenceTransformer, torch threads {args.threads}")
    inproc = InProcess(model_dir, args.threads)
    plan = plan_corpus(texts, inproc, args, connections)
    all_bodies = request_bodies(texts.texts)
    bodies_file = Path(tempfile.mkstemp(prefix="vllm-srun-bench-", suffix=".jsonl")[1])
    bodies_file.write_bytes(b"\n".join(all_bodies) + b"\n")

    server = Server(model_dir, free_port(), args.threads, args.server_args)
    session = Session(args, generator, texts, plan, all_bodies, bodies_file, server)
    compare: Session | None = None
    rounds: list[dict[str, Any]] = []
    diagnostics: dict[str, Any] = {}
    ready_s = math.nan
    try:
        ready_s = server.wait_ready(120)
        log(f"server ready in {ready_s:.1f} s (pid {server.proc.pid})")
        if args.compare_profile != "none":
            extra = [*args.server_args, "--profile", args.compare_profile]
            other = Server(model_dir, free_port(), args.threads, extra)
            compare = Session(args, generator, texts, plan, all_bodies, bodies_file, other)
            log(f"{args.compare_profile} server ready in {other.wait_ready(120):.1f} s")
            compare.warm_up()
        session.warm_up()
        for number, slices in enumerate(plan.rounds, 1):
            log(f"round {number} of {args.rounds}")
            rounds.append(
                session.round(inproc, slices, connections, compare, compare_first=number % 2 == 0)
            )
        if not args.no_diagnostics:
            diagnostics = session.diagnostics()
    finally:
        server.stop()
        if compare is not None:
            compare.server.stop()
        bodies_file.unlink(missing_ok=True)
        log("servers stopped")
    return {
        "figures": summarise(rounds, args, connections, generator, texts),
        "compare_profile": None if compare is None else args.compare_profile,
        "compare_command": None if compare is None else compare.server.cmd,
        "st_attention": inproc.attention,
        "st_torch_threads": inproc.threads,
        "rounds": rounds,
        "server_timing_p50_ms": diagnostics,
        "server_command": server.cmd,
        "server_ready_s": ready_s,
        "tries": args.tries,
        "sentences_used": texts.cursor,
        "slice_size": plan.slice_size,
    }


if __name__ == "__main__":
    raise SystemExit(main())
