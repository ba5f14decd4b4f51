"""Shared fixtures of the HTTP tests: tiny packages, runtimes with a controllable forward,
in-process clients and live uvicorn servers (TCP and a Unix socket).

Every runtime serves the tiny ``bert`` packages of :func:`tests.fixtures.write_task_package`
under the name of their head (``sequence``, ``scores``, ``token``, ``pooled``,
``relevance``). Each package is loaded once per session; a runtime wraps the loaded
model in :class:`Controlled`, so a test can hold, slow down or break its forward
without touching other runtimes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import socket
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import uvicorn

with warnings.catch_warnings():  # starlette's notice about httpx2 is not ours to act on
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from vllm_srun.compose.loader import LoadOptions, ServedModel, load_model
from vllm_srun.config import ModelConfig, ServeConfig
from vllm_srun.plugins.host import Catalog, load_catalog
from vllm_srun.serve.app import build_app
from vllm_srun.service.runtime import Runtime

from ..fixtures import write_task_package

HEADS = ("sequence", "scores", "token", "pooled", "relevance")
SNAPSHOT = Path(__file__).with_name("openapi.json")
MODEL_OPTIONS = {f.name for f in dataclasses.fields(ModelConfig)} - {"model", "name"}
PHASES = ("parse", "tokenize", "queue", "forward", "post", "serialize", "total")


# -- packages and loaded models -------------------------------------------------------------
@pytest.fixture(scope="session")
def catalog() -> Catalog:
    return load_catalog({})


@pytest.fixture(scope="session")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("serve-packages")
    return {head: write_task_package(root, "bert", head) for head in HEADS}


class Controlled:
    """A loaded model whose ``plan``, ``run`` and ``finish`` a test can hold, slow or break.

    Attributes:
        gate: a forward waits for it (set: runs at once).
        entered: set when a forward starts (the worker is busy).
        delay: seconds each forward sleeps before running.
        fail_run, fail_plan, fail_finish: an exception to raise there instead.
        forwards: the row keys of every forward, in order.
    """

    def __init__(self, loaded: Any) -> None:
        self.loaded = loaded
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.delay = 0.0
        self.fail_run: BaseException | None = None
        self.fail_plan: BaseException | None = None
        self.fail_finish: BaseException | None = None
        self.forwards: list[list[str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loaded, name)

    def plan(self, surface: str, request: dict[str, Any]) -> Any:
        if self.fail_plan is not None:
            raise self.fail_plan
        return self.loaded.plan(surface, request)

    def run(self, items: list[Any], **options: Any) -> list[Any]:
        """The model's forward (``options``: what the scheduler passes, as ``width=``)."""
        self.forwards.append([item.key for item in items])
        self.entered.set()
        assert self.gate.wait(30), "a test left a forward gate closed"
        if self.delay:
            time.sleep(self.delay)
        if self.fail_run is not None:
            raise self.fail_run
        return self.loaded.run(items, **options)

    def finish(self, plan: Any, outputs: list[Any]) -> Any:
        if self.fail_finish is not None:
            raise self.fail_finish
        return self.loaded.finish(plan, outputs)

    def hold(self) -> None:
        """Close the gate: the next forward waits in :meth:`run` until :meth:`release`."""
        self.entered.clear()
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    @contextlib.contextmanager
    def held(self) -> Iterator[Controlled]:
        """Forwards wait inside the block; released on the way out, even on failure."""
        self.hold()
        try:
            yield self
        finally:
            self.release()


@pytest.fixture(scope="session")
def loaded_models() -> dict[str, ServedModel]:
    """Each package's :class:`ServedModel`, loaded once (by package path)."""
    return {}


@pytest.fixture(scope="session")
def controlled_loader(
    catalog: Catalog, loaded_models: dict[str, ServedModel]
) -> Callable[..., ServedModel]:
    """A ``Runtime`` loader: the session's model for a path behind a fresh :class:`Controlled`."""

    def loader(model: str, options: LoadOptions, **kwargs: Any) -> ServedModel:
        key = model if options.profile == "exact" else f"{model} ({options.profile})"
        if key not in loaded_models:
            loaded_models[key] = load_model(
                model, LoadOptions(profile=options.profile), catalog=catalog
            )
        served = loaded_models[key]
        return dataclasses.replace(
            served, name=options.name or served.name, loaded=Controlled(served.loaded)
        )

    return loader


@pytest.fixture(scope="session")
def caching_loader() -> Callable[..., ServedModel]:
    """A ``Runtime`` loader that is the real :func:`load_model` (``--offline`` and every
    other option honoured), each model loaded once per session: a later load of the same
    model with the same options, by any runtime under any name, gets the model already
    loaded under its own name. Real models (MiniLM) load in seconds, not milliseconds."""
    loaded: dict[str, ServedModel] = {}
    lock = threading.Lock()

    def loader(model: str, options: LoadOptions, **kwargs: Any) -> ServedModel:
        key = repr((model, dataclasses.replace(options, name=None), sorted(kwargs)))
        with lock:
            if key not in loaded:
                loaded[key] = load_model(model, options, **kwargs)
        return dataclasses.replace(loaded[key], name=options.name or loaded[key].name)

    return loader


# -- runtimes -------------------------------------------------------------------------------
MakeRuntime = Callable[..., Runtime]


@pytest.fixture
def make_runtime(
    catalog: Catalog,
    packages: dict[str, Path],
    controlled_loader: Callable[..., ServedModel],
) -> Iterator[MakeRuntime]:
    """``make_runtime(heads=HEADS, load=True, loader=None, models=None, **serve_options)``.

    Serves the packages of ``heads`` (named by head) with ``serve_options``
    (``ServeConfig`` fields, or ``ModelConfig`` ones for every model); ``load``
    loads them all before returning (:meth:`Runtime.start_loading`, joined).
    """
    made: list[Runtime] = []

    def make(
        heads: tuple[str, ...] = HEADS,
        *,
        load: bool = True,
        loader: Callable[..., ServedModel] | None = None,
        models: list[ModelConfig] | None = None,
        **options: Any,
    ) -> Runtime:
        per_model = {k: options.pop(k) for k in list(options) if k in MODEL_OPTIONS}
        if models is None:
            models = [ModelConfig(model=str(packages[h]), name=h, **per_model) for h in heads]
        runtime = Runtime(
            ServeConfig(models=models, **options),
            catalog=catalog,
            loader=loader or controlled_loader,
        )
        made.append(runtime)
        if load:
            runtime.start_loading().join(60)
            for state in runtime.models.values():  # forget the golden self-check's forwards
                if state.served is not None and isinstance(state.served.loaded, Controlled):
                    state.served.loaded.forwards.clear()
                    state.served.loaded.entered.clear()
        return runtime

    yield make
    for runtime in made:
        for state in runtime.models.values():
            if state.served is not None and isinstance(state.served.loaded, Controlled):
                state.served.loaded.release()
        runtime.config.shutdown_grace_seconds = 5
        runtime.stop()


@pytest.fixture
def runtime(make_runtime: MakeRuntime) -> Runtime:
    """A runtime serving every head, loaded."""
    return make_runtime()


def control(runtime: Runtime, name: str) -> Controlled:
    """The :class:`Controlled` forward of ``runtime``'s model ``name``."""
    served = runtime.models[name].served
    assert served is not None, f"model {name} is not loaded"
    assert isinstance(served.loaded, Controlled)
    return served.loaded


def unanswered(runtime: Runtime, name: str) -> int:
    service = runtime.models[name].service
    assert service is not None
    return service.scheduler.unanswered


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "") -> None:
    """Poll ``predicate`` until true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(0.005)


@pytest.fixture
def client(runtime: Runtime) -> TestClient:
    return make_client(runtime)


def make_client(runtime: Runtime) -> TestClient:
    """An in-process client of ``runtime``'s app that checks every answer against the snapshot."""
    return checked(TestClient(build_app(runtime), raise_server_exceptions=False))


def checked(client: Any) -> Any:
    """Every response ``client`` gets on a documented route must match the snapshot."""

    def hook(response: httpx.Response) -> None:
        path = response.request.url.path
        method = response.request.method
        if method.lower() in CONTRACT.document["paths"].get(path, {}):
            response.read()
            CONTRACT.validate(method, path, response)

    client.event_hooks["response"] = [hook]
    return client


# -- live servers ---------------------------------------------------------------------------
class LiveServer:
    """``build_app(runtime)`` on real uvicorn servers: TCP on a free port and a Unix socket."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        app = build_app(runtime)
        self.socket_dir = tempfile.mkdtemp(prefix="srun-")  # short: a UDS path is <= 107 bytes
        self.uds = str(Path(self.socket_dir) / "serve.sock")
        self.servers = [
            uvicorn.Server(self._config(app, port=0)),
            uvicorn.Server(self._config(app, uds=self.uds)),
        ]
        self.threads = [
            threading.Thread(target=s.run, name="uvicorn", daemon=True) for s in self.servers
        ]
        for thread in self.threads:
            thread.start()
        wait_until(lambda: all(s.started for s in self.servers), 20, "uvicorn to start")
        tcp = self.servers[0].servers[0].sockets[0].getsockname()
        self.host, self.port = tcp[0], tcp[1]
        self.url = f"http://{self.host}:{self.port}"

    @staticmethod
    def _config(app: Any, **where: Any) -> uvicorn.Config:
        return uvicorn.Config(
            app,
            host="127.0.0.1",
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=2,
            **where,
        )

    def client(self, transport: str = "tcp", timeout: float = 30.0) -> httpx.Client:
        """An httpx client over ``tcp`` or ``uds`` (answers checked against the snapshot)."""
        if transport == "uds":
            client = httpx.Client(
                transport=httpx.HTTPTransport(uds=self.uds), base_url="http://srun", timeout=timeout
            )
        else:
            client = httpx.Client(base_url=self.url, timeout=timeout)
        return checked(client)

    def connect(self) -> socket.socket:
        """A raw TCP connection to the server."""
        return socket.create_connection((self.host, self.port), timeout=10)

    def close(self) -> None:
        for server in self.servers:
            server.should_exit = True
        for thread in self.threads:
            thread.join(10)
        shutil.rmtree(self.socket_dir, ignore_errors=True)


@pytest.fixture
def live_server() -> Iterator[Callable[[Runtime], LiveServer]]:
    """``live_server(runtime)``: start servers for ``runtime``; stopped after the test."""
    started: list[LiveServer] = []

    def start(runtime: Runtime) -> LiveServer:
        server = LiveServer(runtime)
        started.append(server)
        return server

    yield start
    for runtime_server in started:
        for state in runtime_server.runtime.models.values():
            if state.served is not None and isinstance(state.served.loaded, Controlled):
                state.served.loaded.release()
        runtime_server.close()


# -- the OpenAPI snapshot and its schemas ---------------------------------------------------
def snapshot() -> dict[str, Any]:
    return json.loads(SNAPSHOT.read_text(encoding="utf-8"))


class Contract:
    """Validates response bodies against the snapshot's response schemas (route + status)."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.checked: set[tuple[str, str, int]] = set()

    def response(self, method: str, path: str, status: int) -> dict[str, Any]:
        operation = self.document["paths"][path][method.lower()]
        responses = operation["responses"]
        assert str(status) in responses, (
            f"{method} {path} answered {status}, which the snapshot does not document "
            f"(documented: {', '.join(responses)})"
        )
        return responses[str(status)]  # type: ignore[no-any-return]

    def validate(self, method: str, path: str, response: httpx.Response) -> None:
        """Fail unless ``response`` matches the snapshot for its route and status."""
        documented = self.response(method, path, response.status_code)
        content = documented.get("content", {})
        media = response.headers.get("content-type", "").split(";")[0]
        assert media in content, (
            f"{method} {path} {response.status_code}: content-type {media!r}, "
            f"documented {list(content)}"
        )
        schema = content[media].get("schema")
        if media == "application/json":
            assert schema, f"{method} {path} {response.status_code} has no documented schema"
            root = {**schema, "components": self.document["components"]}
            validator = jsonschema.Draft202012Validator(root)
            errors = sorted(validator.iter_errors(response.json()), key=str)
            assert not errors, (
                f"{method} {path} {response.status_code} does not match the snapshot: "
                + "; ".join(f"{list(e.absolute_path)}: {e.message}" for e in errors[:5])
            )
        self.checked.add((method.upper(), path, response.status_code))


CONTRACT = Contract(snapshot())
"""Checks what :func:`make_client` and :meth:`LiveServer.client` clients receive."""


def server_timing(response: httpx.Response) -> dict[str, float]:
    """``Server-Timing`` as ``{phase: milliseconds}``, in header order."""
    header = response.headers.get("server-timing")
    assert header, f"no Server-Timing on {response.request.url} ({response.status_code})"
    phases: dict[str, float] = {}
    for part in header.split(","):
        name, _, duration = part.strip().partition(";dur=")
        phases[name] = float(duration)
    return phases


ROUNDING_MS = 0.004
"""How far the phases may sum above ``total``: each of the seven numbers is rounded to
0.001 ms in the header (0.0005 each at most)."""


def timed_phases(response: httpx.Response) -> dict[str, float]:
    """``Server-Timing`` of a response, checked: every phase of :data:`PHASES` in order,
    none negative, and together never more than ``total`` (within rounding)."""
    timing = server_timing(response)
    where = f"{response.request.url.path} {response.status_code}"
    assert tuple(timing) == PHASES, where
    assert all(value >= 0 for value in timing.values()), (where, timing)
    phases = sum(value for name, value in timing.items() if name != "total")
    assert phases <= timing["total"] + ROUNDING_MS, (where, timing)
    return timing
