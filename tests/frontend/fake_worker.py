"""A misbehaving ``vllm-srun``: the worker command the frontend tests point
``VLLM_SRUN_COMMAND`` at (``python fake_worker.py``).

It takes the managed worker's command line (``serve --models FILE --uds SOCK ...``)
and ``devices``; what it does is chosen by ``FAKE_WORKER_MODE``:

- ``exit``: print a line and exit 3 at once;
- ``bound-exit``: listen on its socket, then exit 3 at once, leaving the socket behind
  (a worker that crashes while it starts);
- ``never``: serve ``/health`` as ``loading`` forever;
- ``failed``: serve ``/health`` with every model ``failed``;
- ``failed-exit``: as ``failed``, then exit 1 once ``/health`` was answered (what a
  ``vllm-srun`` whose every model failed for good does);
- ``incompatible``: a ready model under wire contract 3.0.0;
- ``ready``: a ready model with a card (``/v1/models``), answering ``POST`` with 200
  (``{"model", "ok", "echo"}``: the model it was asked for and the body's ``echo``); a
  body with ``"hold": true`` is answered only after a ``POST /release``; a models-file
  entry with ``systemone_schema: jev`` is listed in ``/v1/models``' Jev ``models`` too
  (:data:`JEV_DESCRIPTION`, :data:`JEV_RELEASE_DATE`), with ``jev-latest``;
- ``crash``: ready, but exits (status 9) on the first ``POST``;
- ``stubborn``: ready, and ignores SIGTERM.

``FAKE_WORKER_LOG`` (a file) gets one line per start: the pid and the argv. Only the
standard library is used, so it starts in a few tens of milliseconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socketserver
import sys
import threading
from http.server import BaseHTTPRequestHandler

MODE = os.environ.get("FAKE_WORKER_MODE", "ready")

JEV_DESCRIPTION = "A fake decision model"
JEV_RELEASE_DATE = "2026-01-02"


def option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def card(name: str) -> dict:
    return {
        "id": name,
        "object": "model",
        "family": "fake",
        "repo": "fake/model",
        "revision": None,
        "model_sha256": "0" * 64,
        "surfaces": ["decisions", "embeddings"],
        "heads": [{"name": "spans", "kind": "token", "labels": ["EMAIL"]}],
        "embedding": {"dimensions": [8], "layers": [1], "modalities": ["text"]},
        "rerank": None,
        "limits": {"max_input_tokens": 128},
        "profile": "exact",
        "engine": "fake",
        "device": "cpu",
        "ready": True,
        "status": "ready",
        "reason": None,
    }


def main(argv: list[str]) -> int:
    if argv[:1] == ["devices"]:
        print(json.dumps({"devices": [], "auto": "cpu", "auto_order": ["cpu"]}))
        return 0
    log = os.environ.get("FAKE_WORKER_LOG")
    if log:
        with open(log, "a") as out:
            out.write(json.dumps({"pid": os.getpid(), "argv": argv}) + "\n")
    print(f"fake worker {os.getpid()} in mode {MODE}", flush=True)
    if MODE == "exit":
        print("fake worker: cannot start", flush=True)
        return 3
    with open(option(argv, "--models") or "") as models_file:
        entries = json.load(models_file)["models"]
    names = [m["name"] for m in entries]
    jev = [m["name"] for m in entries if m.get("systemone_schema") == "jev"]
    path = option(argv, "--uds")
    if MODE == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if path and os.path.exists(path):
        os.unlink(path)
    if MODE == "bound-exit":
        socketserver.UnixStreamServer(path or "", BaseHTTPRequestHandler)
        print(f"fake worker: crashed after binding its socket {path}", flush=True)
        os._exit(3)

    released = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def answer(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            state = {"never": "loading", "failed": "failed", "failed-exit": "failed"}.get(
                MODE, "ready"
            )
            reason = "fake: the weights are missing" if state == "failed" else None
            version = "3.0.0" if MODE == "incompatible" else "2.3.0"
            if self.path == "/health":
                models = {n: {"status": state, "reason": reason} for n in names}
                status = 200 if state == "ready" else 503
                self.answer(
                    status,
                    {
                        "status": state,
                        "api_version": version,
                        "reason": reason,
                        "model": names[0] if len(names) == 1 else None,
                        "models": models,
                    },
                )
                if MODE == "failed-exit":
                    self.wfile.flush()
                    print("fake worker: exiting with status 1: no model can be served", flush=True)
                    os._exit(1)
            elif self.path == "/v1/models":
                document = {
                    "object": "list",
                    "api_version": version,
                    "limits": {"max_bundle_tasks": 1024, "max_request_bytes": 67108864},
                    "data": [card(n) for n in names],
                }
                if jev:
                    document["models"] = [
                        {
                            "name": n,
                            "description": JEV_DESCRIPTION,
                            "release_date": JEV_RELEASE_DATE,
                        }
                        for n in [*jev, "jev-latest"]
                    ]
                self.answer(200, document)
            else:
                self.answer(404, {"error": {"code": "not_found"}})

        def do_POST(self) -> None:
            if MODE == "crash":
                os._exit(9)
            length = int(self.headers.get("content-length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path == "/release":
                released.set()
            elif body.get("hold"):
                released.wait(60)
            self.answer(200, {"model": body.get("model"), "ok": True, "echo": body.get("echo")})

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

    def stop(*_: object) -> None:
        with contextlib.suppress(OSError):
            os.unlink(path or "")
        os._exit(0)

    if MODE != "stubborn":
        signal.signal(signal.SIGTERM, stop)
    with Server(path, Handler) as server:
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
