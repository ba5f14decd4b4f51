"""Support of the Router-mode tests on real processes (``test_router_real_*.py``).

- :class:`RouterServed`: ``vllm-sr serve --config FILE --offline`` (Router mode, no
  ``-e``) with real ``vllm-srun`` workers for its managed deployments, on a free port
  offset (management ``8080+o``, Chat listener ``8899+o``, metrics ``9190+o``);
- :class:`AttachedPii`: a steerable attached PII worker (``token`` head) on a TCP port,
  whose ``/v1/classify`` answers what the test scripts (spans, an item error such as
  ``scan_budget_exceeded``, a delay);
- :func:`build_tiny_lm` and :class:`TransformersServe`: a random-weight one-layer Llama
  with a WordLevel tokenizer and a chat template, served by ``transformers serve``.

Every wait is bounded; the timeouts are generous for a shared 2-core machine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .conftest import unshift_file
from .stub_backend import Running, free_port
from .test_serve import VLLM_SR, VLLM_SRUN, port_offset, wait_for

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
RAMPART = "arcjet/rampart-pii"

READY_TIMEOUT = 240.0
"""How long a Router-mode start with real models may take (MiniLM and Rampart load and
self-check in parallel on 2 shared cores: ~40 s measured; the margin is for a busy box)."""

REQUEST_TIMEOUT = 60.0
"""One HTTP request to the router (signals on CPU answer in well under a second)."""


class RouterServed:
    """A ``vllm-sr serve --config FILE --offline`` process in Router mode.

    Args:
        folder: where the config, stdout and stderr go.
        config: the YAML text, or a function of this server that returns it (the ports
            are known by then); ``{chat_port}`` in the text is replaced by the Chat
            listener's port (``8899`` plus the offset, so the seeds' commands map by
            offset). The listeners bind the ports the text names: the file has them
            less the offset, which ``vllm-sr`` adds back.
        env: extra environment.
        serve_args: further ``serve`` options (``-e`` starts Engine mode).
    """

    def __init__(
        self,
        folder: Path,
        config: str | Callable[[RouterServed], str],
        env: dict[str, str] | None = None,
        serve_args: tuple[str, ...] = (),
    ) -> None:
        self.offset = port_offset()
        self.chat_port = 8899 + self.offset
        self.mgmt_port = 8080 + self.offset
        self.metrics_port = 9190 + self.offset
        self.rundir = Path(tempfile.mkdtemp(prefix="vsrt-", dir="/tmp"))
        self.config = folder / "config.yaml"
        text = config if isinstance(config, str) else config(self)
        self.config.write_text(text.replace("{chat_port}", str(self.chat_port)))
        unshift_file(self.config, self.offset)
        self.env = {
            **os.environ,
            "VLLM_SR_PORT_OFFSET": str(self.offset),
            "VLLM_SRUN_DIR": str(self.rundir),
            "VLLM_SRUN_COMMAND": VLLM_SRUN,
            "HF_HUB_OFFLINE": "1",
            **(env or {}),
        }
        self.out = folder / "stdout.txt"
        self.err = folder / "stderr.txt"
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.process = subprocess.Popen(
                [*VLLM_SR, "serve", *serve_args, "--config", str(self.config), "--offline"],
                stdout=out,
                stderr=err,
                env=self.env,
            )
        self.chat = httpx.Client(
            base_url=f"http://127.0.0.1:{self.chat_port}", timeout=REQUEST_TIMEOUT
        )
        self.mgmt = httpx.Client(
            base_url=f"http://127.0.0.1:{self.mgmt_port}", timeout=REQUEST_TIMEOUT
        )
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"

    def output(self) -> str:
        return self.out.read_text() + self.err.read_text()[-8000:]

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> float:
        """Wait for ``/ready`` 200; returns the seconds it took."""
        started = time.monotonic()

        def ready() -> bool:
            assert self.process.poll() is None, f"vllm-sr exited:\n{self.output()}"
            try:
                return self.mgmt.get("/ready", timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        try:
            wait_for(ready, timeout, "/ready 200")
        except AssertionError as err:
            raise AssertionError(f"{err}\n--- vllm-sr output ---\n{self.output()}") from None
        return time.monotonic() - started

    def workers(self) -> list[psutil.Process]:
        """The managed ``vllm-srun serve --uds`` children (a child that ends while they
        are listed, such as a device probe, is left out)."""
        found = []
        for child in psutil.Process(self.process.pid).children():
            try:
                argv = child.cmdline()
            except psutil.NoSuchProcess:
                continue
            if "serve" in argv and "--uds" in argv:
                found.append(child)
        return found

    def worker_of(self, artifact: str) -> psutil.Process:
        """The worker serving ``artifact`` (its models file names it)."""
        for proc in self.workers():
            argv = proc.cmdline()
            models = argv[argv.index("--models") + 1] if "--models" in argv else ""
            try:
                entries = json.loads(Path(models).read_text())["models"]
            except (OSError, ValueError, KeyError):
                continue
            if any(artifact in json.dumps(e) for e in entries):
                return proc
        running = [p.cmdline() for p in self.workers()]
        raise AssertionError(f"no worker serves {artifact}: {running}")

    def ask(
        self,
        content: str | list[dict[str, Any]],
        *,
        key: str | None = None,
        debug: bool = True,
        model: str = "vllm-sr/auto",
        port: int | None = None,
        **extra: Any,
    ) -> httpx.Response:
        """POST a Chat request (a user text, or whole ``messages``) to the listener."""
        messages = [{"role": "user", "content": content}] if isinstance(content, str) else content
        headers = {"x-vsr-debug": "true"} if debug else {}
        if key is not None:
            headers["authorization"] = f"Bearer {key}"
        url = f"http://127.0.0.1:{port or self.chat_port}/v1/chat/completions"
        return self.chat.post(
            url, json={"model": model, "messages": messages, **extra}, headers=headers
        )

    def preview(self, text: str | None = None, **body: Any) -> dict[str, Any]:
        """``POST /api/v1/routing/preview?trace=true``: the 200 body."""
        if text is not None:
            body["text"] = text
        answer = self.mgmt.post("/api/v1/routing/preview?trace=true", json=body)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def metrics(self) -> str:
        return httpx.get(self.metrics_url, timeout=10).text

    def close(self) -> None:
        self.chat.close()
        self.mgmt.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        shutil.rmtree(self.rundir, ignore_errors=True)


def metric_value(text: str, name: str, **labels: str) -> float:
    """The value of series ``name{labels}`` in a Prometheus exposition (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and line.split(" ")[0] != name:
            continue
        series, _, value = line.rpartition(" ")
        found = dict(re.findall(r'(\w+)="([^"]*)"', series))
        if series.split("{")[0] == name and all(found.get(k) == v for k, v in labels.items()):
            return float(value)
    return 0.0


# -- an attached, steerable PII worker ---------------------------------------------------------

ATTACHED_NAME = "fake-pii"
PII_LABELS = ["EMAIL", "PHONE"]


@dataclass
class AttachedPii:
    """A PII worker attached by ``endpoint`` (``http://127.0.0.1:PORT``): ready at once, a
    ``token`` head, and ``/v1/classify`` answering per :attr:`answer`.

    Attributes:
        answer: for each input text, its result: ``{"spans": [...]}`` or ``{"error":
            code}``; called with the text and the request's ``options``.
        delay: seconds before each classify answer.
        seen: every classify body received.
    """

    answer: Callable[[str, dict[str, Any]], dict[str, Any]] = lambda text, options: {"spans": []}
    delay: float = 0.0
    seen: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def card(self) -> dict[str, Any]:
        return {
            "id": ATTACHED_NAME,
            "object": "model",
            "family": "fake",
            "repo": "fake/pii",
            "revision": None,
            "model_sha256": "0" * 64,
            "surfaces": ["classify"],
            "heads": [{"name": "token", "kind": "token", "labels": PII_LABELS}],
            "embedding": None,
            "rerank": None,
            "limits": {"max_input_tokens": 512},
            "profile": "exact",
            "engine": "fake",
            "device": "cpu",
            "ready": True,
            "status": "ready",
            "reason": None,
        }

    async def _health(self, request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "status": "ready",
                "api_version": "2.3.0",
                "reason": None,
                "model": ATTACHED_NAME,
                "models": {ATTACHED_NAME: {"status": "ready", "reason": None}},
            }
        )

    async def _models(self, request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "object": "list",
                "api_version": "2.3.0",
                "limits": {"max_bundle_tasks": 1024, "max_request_bytes": 67108864},
                "data": [self.card()],
            }
        )

    async def _classify(self, request: Request) -> JSONResponse:
        import asyncio

        body = await request.json()
        self.seen.append(body)
        if self.delay:
            await asyncio.sleep(self.delay)
        texts = body.get("input")
        texts = [texts] if isinstance(texts, str) else list(texts or [])
        options = body.get("options") or {}
        results = []
        for index, text in enumerate(texts):
            found = self.answer(text, options)
            item: dict[str, Any] = {"index": index, **found}
            if "error" not in found:
                item.setdefault(
                    "input",
                    {"tokens": 8, "processed_tokens": 8, "truncated": False, "windows": 1},
                )
            results.append(item)
        return JSONResponse(
            {
                "model": body.get("model"),
                "head": "token",
                "kind": "token",
                "labels": PII_LABELS,
                "results": results,
                "usage": {"input_tokens": 8, "output_tokens": 0},
            }
        )

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/health", self._health, methods=["GET"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/v1/classify", self._classify, methods=["POST"]),
            ]
        )


class Threaded:
    """An ASGI app served by uvicorn in a thread on a free port until :meth:`stop`."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="error", lifespan="off"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started, 10, "the attached worker to listen")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


# -- a real OpenAI-compatible backend: transformers serve over a tiny random LM ---------------

TINY_WORDS = [
    *("hello", "world", "the", "a", "an", "is", "are", "you", "me", "how", "what", "why"),
    *("when", "where", "who", "yes", "no", "ok", "good", "bad", "math", "weather", "paris"),
    *("say", "something", "answer", "question", "please", "thanks"),
]
TINY_SPECIALS = [
    "<unk>",
    "<s>",
    "</s>",
    "<pad>",
    "<|im_start|>",
    "<|im_end|>",
    "system",
    "user",
    "assistant",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
    "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


def build_tiny_lm(folder: Path) -> Path:
    """A one-layer random-weight Llama (hidden 32, vocab ~45) with a whitespace
    WordLevel tokenizer and a ChatML-like ``chat_template``, saved with
    ``save_pretrained`` into ``folder`` (built in a subprocess: a second or two of
    torch import stays out of the test process)."""
    script = f"""
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
vocab = {{t: i for i, t in enumerate({TINY_SPECIALS!r} + {TINY_WORDS!r})}}
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece(prefix="##")
fast = PreTrainedTokenizerFast(
    tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
    pad_token="<pad>", model_input_names=["input_ids", "attention_mask"],
)
fast.chat_template = {CHAT_TEMPLATE!r}
torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
    bos_token_id=1, eos_token_id=2, pad_token_id=3, tie_word_embeddings=True,
)
model = LlamaForCausalLM(config)
model.generation_config.max_new_tokens = 16
model.save_pretrained({str(folder)!r})
fast.save_pretrained({str(folder)!r})
"""
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


TRANSFORMERS = str(Path(sys.executable).with_name("transformers"))


class TransformersServe:
    """``HF_HUB_OFFLINE=1 transformers serve --force_model DIR --port N`` on 127.0.0.1."""

    def __init__(self, model: Path, folder: Path) -> None:
        self.port = free_port()
        self.log = folder / "transformers-serve.txt"
        self.command = [
            TRANSFORMERS,
            "serve",
            "--force_model",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--device",
            "cpu",
        ]
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                self.command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "HF_HUB_OFFLINE": "1"},
            )

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text()[-6000:]

    def wait_ready(self, timeout: float = 180.0) -> float:
        started = time.monotonic()

        def up() -> bool:
            assert self.process.poll() is None, f"transformers serve exited:\n{self.output()}"
            try:
                return httpx.get(f"http://{self.endpoint}/health", timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(up, timeout, "transformers serve /health")
        return time.monotonic() - started

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def served_in(factory: Callable[[], RouterServed]) -> Iterator[RouterServed]:
    """Start a router, wait until ready, yield it, close it (a fixture's body)."""
    server = factory()
    try:
        seconds = server.wait_ready()
        print(f"\nrouter ready in {seconds:.1f} s")
        yield server
    finally:
        server.close()


def running_backend() -> Iterator[Running]:
    """The stub backend until the block ends (a module fixture's body)."""
    running = Running()
    try:
        yield running
    finally:
        running.stop()
