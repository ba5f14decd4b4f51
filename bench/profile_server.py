"""Where the server's time goes under load: py-spy on ``vllm-srun serve`` during a wrk run.

    .venv/bin/python bench/profile_server.py [--connections 32] [--seconds 15] [--hot]

Starts the server as bench/run.py does (real MiniLM, ``--threads 2``), warms it
up, drives ``POST /v1/embeddings`` with wrk at ``--connections`` (fresh corpus
sentences; ``--hot`` sends one sentence over and over, so that every request is a
result-cache hit and only the serving path is left), records the server with
``py-spy record --threads --idle`` and prints, per thread, the share of samples
in each part of the serving path, then the heaviest frames. The raw profile
(collapsed stacks) goes to ``--out`` (default: profile-c<N>[-hot].txt in /tmp).

py-spy is not a project dependency: ``pip install py-spy`` (any environment; the
binary is found on PATH or next to this Python).
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import corpus  # noqa: E402
from loadgen import ensure_wrk, measure, request_bodies  # noqa: E402
from server import Server, default_model_dir, free_port, server_side, snapshot  # noqa: E402

# (thread name prefix, frame that marks a part, part) in priority order
PARTS = (
    ("scheduler", "TaskModel.run", "forward"),
    ("scheduler", "Condition.wait", "idle / batch window"),
    ("finish", "TaskModel.finish", "finish (pool, normalise, response body)"),
    ("finish", "_worker", "idle"),
    ("plan", "TextEncoder.encode", "tokenize"),
    ("plan", "_worker", "idle"),
    ("MainThread", "build_app.<locals>.answer", "endpoint (plan, admit, answer, respond)"),
    ("MainThread", "get_request_handler.<locals>.app", "FastAPI body parsing + validation"),
    ("MainThread", "RequestResponseCycle.run_asgi", "uvicorn/Starlette middleware + routing"),
    ("MainThread", "HttpToolsProtocol", "uvicorn HTTP protocol"),
    ("MainThread", "Runner.run", "idle (event loop waiting)"),
)


def part_of(thread: str, frames: list[str]) -> str:
    """The serving-path part a sample belongs to."""
    names = [f.split(" (")[0] for f in frames]
    leaf = names[-1] if names else ""
    for prefix, marker, part in PARTS:
        if not thread.startswith(prefix):
            continue
        if marker in ("Condition.wait", "_worker", "Runner.run"):
            if leaf == marker:
                return part
        elif any(n.startswith(marker) for n in names):
            return part
    return "other: " + leaf


def summarise(raw: Path, top: int) -> str:
    """Per-thread shares and the heaviest leaf frames of a collapsed-stack profile."""
    per_thread: collections.Counter[str] = collections.Counter()
    parts: collections.Counter[tuple[str, str]] = collections.Counter()
    leaves: collections.Counter[tuple[str, str]] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        thread = frames[0].split(": ", 1)[-1]
        thread = "plan" if thread.startswith("plan_") else thread
        thread = "scheduler" if thread.startswith("scheduler:") else thread
        n = int(count)
        per_thread[thread] += n
        parts[(thread, part_of(thread, frames[1:]))] += n
        leaves[(thread, frames[-1])] += n
    out = []
    for thread, total in per_thread.most_common():
        out.append(f"{thread} ({total} samples)")
        for (t, part), n in parts.most_common():
            if t == thread and n / total >= 0.005:
                out.append(f"  {100 * n / total:5.1f}%  {part}")
    out.append(f"\nheaviest frames (samples, thread, frame), idle excluded, top {top}:")
    idle = ("Condition.wait", "_worker", "Runner.run")
    busy = [(k, n) for k, n in leaves.most_common() if not k[1].startswith(idle)]
    out += [f"  {n:6d}  {t:10s} {frame}" for (t, frame), n in busy[:top]]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=15.0, help="profile length")
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument("--hot", action="store_true", help="every request a cache hit")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", type=Path, help="where the raw profile goes (default: /tmp)")
    parser.add_argument("server_args", nargs="*", help="extra `vllm-srun serve` options")
    args = parser.parse_args()
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        raise SystemExit("py-spy is missing: pip install py-spy")
    if not ensure_wrk():
        raise SystemExit("wrk is missing (apt-get install -y wrk)")
    count = 200 * int(args.seconds + 10) * max(1, args.connections // 8)
    if args.hot:
        texts = ["One sentence that the result cache answers after its first forward."] * count
    else:
        texts = corpus.sentences(count, seed=corpus.SEED + 1)
    bodies = request_bodies(texts)
    bodies_file = Path(tempfile.mkstemp(prefix="vllm-srun-profile-", suffix=".jsonl")[1])
    bodies_file.write_bytes(b"\n".join(bodies) + b"\n")
    name = f"profile-c{args.connections}{'-hot' if args.hot else ''}.txt"
    raw = args.out or Path(tempfile.gettempdir()) / name
    server = Server(default_model_dir(), free_port(), 2, args.server_args)
    try:
        server.wait_ready(120)
        measure("wrk", server, bodies, bodies_file, 0, 1000, args.connections, 1, 3.0)
        results: dict[str, dict] = {}
        span = (1000, len(bodies) - 1000, args.connections, 1, args.seconds + 4)
        load = threading.Thread(
            target=lambda: results.update(wrk=measure("wrk", server, bodies, bodies_file, *span))
        )
        before = snapshot(server)
        load.start()
        time.sleep(2)
        subprocess.run(
            [py_spy, "record", "-p", str(server.proc.pid), "-r", str(args.rate),
             "-d", str(int(args.seconds)), "--threads", "--idle", "--format", "raw",
             "-o", str(raw)],
            check=True, capture_output=True,
        )  # fmt: skip
        load.join()
        side = server_side(before, snapshot(server))
    finally:
        server.stop()
        bodies_file.unlink(missing_ok=True)
    w = results["wrk"]
    print(
        f"c{args.connections}{' hot' if args.hot else ''}: {w['rps']:.1f} req/s, "
        f"p50 {w['p50_ms']:.1f} ms, cache hit rate {side['cache_hit_rate']:.3f}, "
        f"mean rows/forward {side['mean_batch_rows'] or 0:.1f}, "
        f"mean forward {side['mean_forward_ms'] or 0:.1f} ms; profile in {raw}"
    )
    print(summarise(raw, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
