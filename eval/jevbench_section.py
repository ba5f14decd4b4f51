"""The coherence sections of ``make eval``: JevBench's ``jevbench-mini`` suite on MiniLM,
and on every decision model available here (:func:`measure` takes the model).

``vllm-srun serve sentence-transformers/all-MiniLM-L6-v2 --offline --systemone-schema jev``
(or the model given) runs in a child process on a free port; ``jevbench check`` and then
``jevbench eval`` (its CLI, in child processes too, so every wait is bounded) send the
suite's frozen requests to ``POST /v1/systemone`` as model ``jev-latest``, one at a time
(jevbench's default, which its published figures use). The server is stopped in every
case. jevbench reaches nothing but that URL: its suites, rewrite banks and test plans ship
inside the package.

JevBench measures coherence (whether answers agree with one another under meaning-preserving
and logically related edits), not accuracy, and uses no gold labels; its README asks for
its scores to be read beside an accuracy evaluation, which the sections above are.

jevbench 0.1.0 ships no per-model figures: its leaderboard of open models is on its website
only. The figures its README (the distribution's METADATA) gives for jevbench-mini are quoted
in :data:`PUBLISHED`, with where they stand; the uniform baseline among them is recomputed
here, in process, as a check that the installed scorer reproduces it.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
ALIAS = "jev-latest"
SUITE = "jevbench-mini"
NAME = "all-MiniLM-L6-v2 (vllm-srun, jev schema)"
REPORT = HERE / "jevbench-minilm.json.gz"
"""The full JevBench report of the last run (``jevbench report <file> --card`` reads it)."""

START_TIMEOUT = 300.0
"""Seconds the server may take to answer ``/health`` 200 (about 10 s on 2 cores)."""
CHECK_TIMEOUT = 120.0
"""Seconds ``jevbench check`` (one request) may take."""
EVAL_TIMEOUT = 1800.0
"""Seconds the suite may take (1,248 requests: about 5 minutes on 2 CPU cores)."""

DIMENSIONS = ("REP", "BAT", "MEA", "LOG", "CHO")

PUBLISHED: dict[str, Any] = {
    "source": "jevbench-0.1.0.dist-info/METADATA (the README), section "
    '"What JevBench does not measure"',
    "tested_low": 56.5,
    "tested_high": 83.9,
    "tested_accuracy": "55.8% to 89.2%",
    "uniform": 89.4,
    "uniform_accuracy": "39.8% (chance)",
    "leaderboard": 'README section "Results": "The leaderboard of 21 openly released models ... '
    'is on the JevBench website" (https://jevbench.github.io)',
}
"""What jevbench 0.1.0 publishes about jevbench-mini scores, quoted from its README."""


def free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def report_path(model_id: str) -> Path:
    """Where the full JevBench report of ``model_id``'s last run is kept: :data:`REPORT` for
    MiniLM, ``eval/jevbench-<owner>--<name>.json.gz`` for another model."""
    if model_id == MODEL_ID:
        return REPORT
    return HERE / f"jevbench-{model_id.replace('/', '--')}.json.gz"


class Server:
    """``vllm-srun serve MODEL`` in the jev schema in a child process; always :meth:`stop` it."""

    def __init__(self, model_id: str = MODEL_ID) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115
            "w+", prefix="vllm-srun-eval-", suffix=".log", delete=False
        )
        self.cmd = [
            str(Path(sys.executable).parent / "vllm-srun"),
            "serve",
            model_id,
            "--offline",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--systemone-schema",
            "jev",
        ]
        self.proc = subprocess.Popen(
            self.cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def wait_ready(self, timeout: float = START_TIMEOUT) -> float:
        """Seconds until ``/health`` answers 200."""
        started = time.perf_counter()
        while time.perf_counter() - started < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}):\n{self.tail()}")
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(self.base + "/health", timeout=2) as resp,
            ):
                if resp.status == 200:
                    return time.perf_counter() - started
            time.sleep(0.25)
        raise RuntimeError(f"/health was not 200 within {timeout:.0f} s:\n{self.tail()}")

    def tail(self, lines: int = 20) -> str:
        """The end of the server's log."""
        self.log.flush()
        return "\n".join(Path(self.log.name).read_text().splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM, then SIGKILL its process group after 15 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # stray children, if any
        self.log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)


def jevbench(args: list[str], timeout: float) -> tuple[int, str]:
    """``jevbench ARGS`` in a child process (its output echoed to stderr as it comes), killed
    after ``timeout`` seconds: (exit status, output)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "jevbench", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []

    def echo() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            print(line, end="", file=sys.stderr, flush=True)

    reader = threading.Thread(target=echo, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
        raise RuntimeError(f"jevbench {args[0]} ran past {timeout:.0f} s") from None
    finally:
        reader.join(timeout=5)
    return proc.returncode, "".join(lines)


def uniform(state: Any, questions: dict[str, Any]) -> dict[str, Any]:
    """Every answer at equal probability: the baseline the README publishes (89.4)."""
    out: dict[str, Any] = {}
    for key, q in questions.items():
        if q["type"] == "noul":
            out[key] = {"type": "noul", "noul": 0.5}
            continue
        options = list(q["criteria"]) if q["type"] == "choice" else range(len(q["criteria"]))
        keys = [str(o) for o in options]
        out[key] = {"type": q["type"], "probabilities": dict.fromkeys(keys, 1 / len(keys))}
    return out


def measure(model_id: str = MODEL_ID, name: str = NAME) -> dict[str, Any]:
    """Serve ``model_id`` (MiniLM by default), check it with jevbench, run the suite: the
    scores and how the run went (the report kept at :func:`report_path`).

    Raises:
        RuntimeError: the server did not come up, jevbench check failed, or the suite ran
            past its time or wrote no report (the server is stopped all the same).
    """
    import jevbench as jb

    server = Server(model_id)
    print("starting: " + " ".join(server.cmd), file=sys.stderr, flush=True)
    try:
        ready = server.wait_ready()
        url = server.base + "/v1/systemone"
        target = ["--url", url, "--model", ALIAS, "--api-key-env", ""]
        status, output = jevbench(["check", *target], CHECK_TIMEOUT)
        if status != 0:
            raise RuntimeError(f"jevbench check failed ({status}):\n{output[-2000:]}")
        with tempfile.TemporaryDirectory(prefix="jevbench-eval-") as scratch:
            out = Path(scratch) / "report.json"
            started = time.perf_counter()
            status, output = jevbench(
                [
                    "eval",
                    *target,
                    "--suite",
                    SUITE,
                    "--name",
                    name,
                    "--cache-dir",
                    str(Path(scratch) / "cache"),  # a fresh cache: every answer asked now
                    "--out",
                    str(out),
                    "--verbose",
                ],
                EVAL_TIMEOUT,
            )
            wall = time.perf_counter() - started
            if not out.exists():
                raise RuntimeError(f"jevbench eval wrote no report ({status}):\n{output[-2000:]}")
            report = jb.Report.load(out)
    finally:
        server.stop()
    report.save(report_path(model_id))
    baseline = jb.evaluate(jb.from_callable(uniform, name="uniform"), suite=SUITE, cache=":memory:")
    return {
        "model": model_id,
        "name": name,
        "report": report,
        "baseline": baseline,
        "status": status,
        "ready_seconds": ready,
        "wall_seconds": wall,
        "version": importlib.metadata.version("jevbench"),
        "date": datetime.datetime.now(datetime.UTC).date().isoformat(),
        "command": " ".join(["vllm-srun", *server.cmd[1:]]),
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def section(
    run: dict[str, Any] | None,
    failure: str | None = None,
    model_id: str = MODEL_ID,
    name: str = NAME,
) -> list[str]:
    """The Markdown section of ``model_id``'s run: the scores, how they were measured, and
    the published figures."""
    title = "" if model_id == MODEL_ID else f" on {model_id}"
    lines = [f"## Coherence: JevBench `jevbench-mini`{title}", ""]
    if run is None:
        first = (failure or "unknown failure").splitlines()[0]
        return [
            *lines,
            f"Not measured in this run: {first} (the full message: `make eval`'s output).",
            "",
        ]
    report, baseline = run["report"], run["baseline"]
    result = report.result
    suite = result["suite"]
    saved = report_path(model_id).name
    ci = report.interval
    interval = f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]" if ci else ""
    lines += [
        f"{model_id} served by `{run['command']}` (port chosen free), asked as model "
        f"`{ALIAS}` on `POST /v1/systemone` by jevbench {run['version']}, suite "
        f"{suite['name']} v{suite['version']}: {report.scores['n_cases']} cases, "
        f"{result['requests']} requests sent one at a time, "
        f"{report.scores['n_checks']} scored relations, tolerance "
        f"{report.settings['tolerance']}; run on {run['date']} in {run['wall_seconds']:.0f} s "
        f"(server ready in {run['ready_seconds']:.0f} s). Scores are out of 100 (100: no "
        "violation); the overall score is the mean of the five dimensions, with its 95% "
        "bootstrap interval over cases. JevBench measures whether answers agree with one "
        "another under meaning-preserving and logically related edits, not whether they are "
        f"right. Full report: eval/{saved} (`jevbench report eval/{saved} --card`).",
        "",
        "| model | overall | " + " | ".join(DIMENSIONS) + " |",
        "| --- | ---: | " + " | ".join("---:" for _ in DIMENSIONS) + " |",
    ]
    rows = ((name, report, interval), ("uniform answers (computed here)", baseline, ""))
    for name, r, extra in rows:
        cells = " | ".join(_pct(r.dimensions.get(d)) for d in DIMENSIONS)
        lines.append(f"| {name} | {_pct(r.overall)}{extra} | {cells} |")
    lines += ["", "| group | " + name + " |", "| --- | ---: |"]
    lines += [f"| {group} | {_pct(value)} |" for group, value in report.groups.items()]
    zero = [name for name, value in report.relations.items() if value == 0]
    if zero:
        named = ", ".join(f"`{n}`" for n in zero)
        lines += ["", f"Relations violated on every test: {named}."]
    if report.errors or result.get("backend_down") or run["status"] != 0:
        down = result.get("backend_down")
        down = f"; the server went down: {down}" if down else ""
        lines += [
            "",
            f"jevbench eval exited {run['status']}: {len(report.errors)} requests refused or "
            f"invalid{down} (see the report); the scores above leave their relations out.",
        ]
    p = PUBLISHED
    lines += [
        "",
        f"Published figures. The only jevbench-mini figures jevbench {run['version']} ships "
        f"are in {p['source']}. It lists no per-model scores: its leaderboard is on its "
        f"website ({p['leaderboard']}), not in the package, and this evaluation does not "
        "reach it.",
        "",
        "| model | jevbench-mini overall | accuracy (JevBench's own, not eval/decisions.jsonl) |",
        "| --- | ---: | ---: |",
        f"| the openly released models its authors tested (no names or per-model figures "
        f"in the package) | {p['tested_low']} to {p['tested_high']} | {p['tested_accuracy']} |",
        f"| every answer at equal probability | {p['uniform']} (recomputed here: "
        f"{_pct(baseline.overall)}) | {p['uniform_accuracy']} |",
        f"| {name}, above | {_pct(report.overall)} | not measured (the suite has no labels) |",
        "",
        "The uniform baseline outscores every model its authors tested: a model that ignores "
        "its input keeps every invariance, so a higher JevBench score is not a better model on "
        "its own; read it beside the accuracy tables above.",
        "",
    ]
    return lines
