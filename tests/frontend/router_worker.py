"""A steerable ``vllm-srun`` for Router-mode tests: the worker command a test points
``VLLM_SRUN_COMMAND`` (or a :class:`~vllm_sr.frontend.Frontend`'s environment) at, as
``python router_worker.py --script-dir DIR``.

It answers the signals' surfaces the way the real runtime shapes them:
``POST /v1/decisions`` (``answers`` for each question: ``noul``, ``choice`` with
``probabilities``, ``score``; and the same per ``states`` entry), ``POST /v1/classify``
(one ``probabilities`` distribution and ``spans`` per input) and ``POST /v1/embeddings``
(a fixed 8-dimensional vector per text). ``GET /health`` and ``GET /v1/models`` (its card:
a ``sequence`` head ``guard`` and a ``token`` head ``spans``, embeddings) make it ready.

A script steers it, re-read on every request: ``DIR/<deployment>.json`` (all optional)::

    {"health": "ready" | "loading",
     "decisions": {"mode": "answer" | "fail" | "stall", "seconds": 3, "status": 500,
                   "noul": 0.1, "choice": "math"},
     "classify": {"mode": ..., "probabilities": {"benign": 0.9, "jailbreak": 0.1}}}

``fail`` answers ``status`` (500) with an error; ``stall`` waits ``seconds`` (or until
the script no longer says ``stall``) before answering. Every request is appended to
``DIR/<deployment>.log`` (one JSON line: path and body) once it arrives, and each process'
pid to ``DIR/<deployment>.pids`` when it starts. An artifact named ``broken/...`` fails
to load: the process says so and exits 1. Only the
standard library is used, so it starts in a few tens of milliseconds.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socketserver
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

LOCK = threading.Lock()


def option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def card(name: str) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "family": "fake",
        "repo": "fake/router-worker",
        "revision": None,
        "model_sha256": "0" * 64,
        "surfaces": ["decisions", "classify", "embeddings"],
        "heads": [
            {"name": "guard", "kind": "sequence", "labels": ["benign", "jailbreak"]},
            {"name": "spans", "kind": "token", "labels": ["EMAIL", "PHONE"]},
        ],
        "embedding": {"dimensions": [8], "layers": [1], "modalities": ["text"]},
        "rerank": None,
        "limits": {"max_input_tokens": 512},
        "profile": "exact",
        "engine": "fake",
        "device": "cpu",
        "ready": True,
        "status": "ready",
        "reason": None,
    }


def vector(text: str) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [b / 255.0 - 0.5 for b in digest[:8]]


def answer_question(question: dict[str, Any], script: dict[str, Any]) -> dict[str, Any]:
    kind = question.get("type")
    if kind == "noul":
        return {"noul": float(script.get("noul", 0.1))}
    if kind == "score":
        levels = question.get("levels") or question.get("criteria") or [0, 1]
        return {"score": (len(levels) - 1) / 2}
    options = question.get("choices") or question.get("criteria") or []
    keys = (
        list(options)
        if isinstance(options, dict)
        else [o["key"] if isinstance(o, dict) else str(o) for o in options]
    )
    chosen = script.get("choice") if script.get("choice") in keys else keys[0]
    rest = (0.1 / (len(keys) - 1)) if len(keys) > 1 else 0.0
    probabilities = {k: (0.9 if k == chosen else rest) for k in keys}
    return {"choice": chosen, "probabilities": probabilities}


def main(argv: list[str]) -> int:
    script_dir = Path(option(argv, "--script-dir") or ".")
    if "--script-dir" in argv:
        at = argv.index("--script-dir")
        argv = argv[:at] + argv[at + 2 :]
    if argv[:1] == ["devices"]:
        print(json.dumps({"devices": [], "auto": "cpu", "auto_order": ["cpu"]}))
        return 0
    with open(option(argv, "--models") or "") as models_file:
        entries = json.load(models_file)["models"]
    name = entries[0]["name"]
    names = [m["name"] for m in entries]
    if str(entries[0].get("model", "")).startswith("broken/"):
        print(f"cannot load {entries[0]['model']}: no such model", file=sys.stderr, flush=True)
        return 1
    path = option(argv, "--uds") or ""
    if os.path.exists(path):
        os.unlink(path)
    script_file = script_dir / f"{name}.json"
    log_file = script_dir / f"{name}.log"
    print(f"router worker {os.getpid()} serves {name}", flush=True)
    with open(script_dir / f"{name}.pids", "a") as pids:
        pids.write(f"{os.getpid()}\n")

    def script() -> dict[str, Any]:
        try:
            return json.loads(script_file.read_text())
        except (OSError, ValueError):
            return {}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            state = script().get("health", "ready")
            if self.path == "/health":
                models = {n: {"status": state, "reason": None} for n in names}
                self.answer(
                    200 if state == "ready" else 503,
                    {
                        "status": state,
                        "api_version": "2.3.0",
                        "reason": None,
                        "model": name,
                        "models": models,
                    },
                )
            elif self.path == "/v1/models":
                self.answer(
                    200,
                    {
                        "object": "list",
                        "api_version": "2.3.0",
                        "limits": {"max_bundle_tasks": 1024, "max_request_bytes": 67108864},
                        "data": [card(n) for n in names],
                    },
                )
            else:
                self.answer(404, {"error": {"code": "not_found"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            with LOCK, log_file.open("a") as log:
                log.write(json.dumps({"path": self.path, "body": body}) + "\n")
            surface = self.path.rsplit("/", 1)[-1]
            steer = script().get(surface) or {}
            mode = steer.get("mode", "answer")
            if mode == "stall":
                until = time.monotonic() + float(steer.get("seconds", 3))
                while time.monotonic() < until:
                    if (script().get(surface) or {}).get("mode", "answer") != "stall":
                        break
                    time.sleep(0.02)
                steer = script().get(surface) or steer
            elif mode == "fail":
                self.answer(int(steer.get("status", 500)), {"error": {"code": "fake_failure"}})
                return
            model = body.get("model")
            if surface == "decisions":
                answers = {
                    q: answer_question(question, steer)
                    for q, question in (body.get("questions") or {}).items()
                }
                states = {
                    key: {
                        "answers": {
                            q: answer_question(question, steer)
                            for q, question in (entry.get("questions") or {}).items()
                        }
                    }
                    for key, entry in (body.get("states") or {}).items()
                }
                reply: dict[str, Any] = {"model": model, "answers": answers}
                if states:
                    reply["states"] = states
                self.answer(200, reply)
            elif surface == "classify":
                distribution = steer.get("probabilities") or {"benign": 0.9, "jailbreak": 0.1}
                results = [
                    {
                        "probabilities": distribution,
                        "spans": steer.get("spans") or [],
                        "input": {"tokens": len(text.split())},
                    }
                    for text in body.get("input") or []
                ]
                self.answer(200, {"model": model, "results": results})
            elif surface == "embeddings":
                data = [
                    {"object": "embedding", "index": i, "embedding": vector(text)}
                    for i, text in enumerate(body.get("input") or [])
                ]
                self.answer(200, {"object": "list", "model": model, "data": data})
            else:
                self.answer(404, {"error": {"code": "not_found"}})

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True
        request_queue_size = 128  # many held requests at once (socketserver's default: 5)

    def stop(*_: object) -> None:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    with Server(path, Handler) as server:
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
