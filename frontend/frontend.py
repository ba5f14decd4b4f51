"""The frontend process: configuration in, workers started, APIs served, clean exit.

:class:`Frontend` composes the parts. It plans the workers of the deployments in
use, starts a :class:`~.workers.supervisor.Supervisor` per managed worker and a
health poller per attached one, serves the management API at once (``/health``
answers while models load) and the metrics, waits for every managed deployment
(printing the progress line on each change, bounded by ``VLLM_SRUN_READY_TIMEOUT``),
checks the bindings against the cards, then serves the listeners.

SIGTERM or SIGINT starts the shutdown: new listener requests get 503 and
``/ready`` says 503, requests in flight finish, every worker gets SIGTERM (SIGKILL
10 s later), the servers close and the process exits 0.

The replica pools, the listeners' native API and the metrics are built by
factories (:class:`Parts`); by default they are imported from
:mod:`vllm_sr.pool`, :mod:`vllm_sr.api.native` and :mod:`vllm_sr.metrics`, and
where one is not there the frontend runs without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import shutil
import signal
import socket
import sys
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any

import uvicorn

from .api.management import build_management_app, inventory_entry
from .config.bindings import binding_problem
from .config.in_use import deployments_in_use
from .config.schema import Config, Listener
from .startup import DeploymentView, StartupFailed, StartupStatus, wait_for_deployments
from .workers.devices import Devices
from .workers.health import HealthPoller
from .workers.plan import PlanError, RuntimeEnvironment, needs_auto, plan_workers
from .workers.supervisor import Clock, RealClock, Supervisor
from .workers.worker import Worker

log = logging.getLogger("vllm_sr")

MANAGEMENT_PORT = 8080
METRICS_PORT = 9190
LOOPBACK = "127.0.0.1"

DEFAULT_READY_TIMEOUT = 600.0
"""``VLLM_SRUN_READY_TIMEOUT`` when unset: 10 minutes."""

DRAIN_TIMEOUT = 30.0
"""After SIGTERM, how long requests in flight may take before the workers stop."""

ASGIApp = Callable[..., Any]


class Server(uvicorn.Server):
    """A uvicorn server inside the frontend's event loop: the frontend takes the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def bind(host: str, port: int, what: str) -> socket.socket:
    """A listening TCP socket on ``host:port``.

    Raises:
        StartupFailed: the address is in use or cannot be bound (``what`` names the
            server in the message).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as err:
        sock.close()
        raise StartupFailed(
            f"{what} cannot listen on {host}:{port}: {err.strerror or err}"
        ) from None
    sock.setblocking(False)
    return sock


class Gate:
    """An ASGI wrapper that counts requests in flight and, once closed, answers new ones
    503 (the native API's ``systemone_unavailable``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.closed = False
        self.inflight = 0
        self.idle = asyncio.Event()
        self.idle.set()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.closed:
            body = json.dumps(
                {
                    "error": {
                        "code": "systemone_unavailable",
                        "type": "systemone_error",
                        "message": "systemone unavailable",
                    }
                }
            ).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 503,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"retry-after", b"1"),
                        (b"connection", b"close"),
                        (b"cache-control", b"no-store"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        self.inflight += 1
        self.idle.clear()
        try:
            await self.app(scope, receive, send)
        finally:
            self.inflight -= 1
            if self.inflight == 0:
                self.idle.set()


class FallbackMetrics:
    """The restarts counter alone, on its own registry: what the frontend exports when
    :mod:`vllm_sr.metrics` is not there."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter

        self.registry = CollectorRegistry()
        self._restarts = Counter(
            "vsr_model_runtime_restarts",
            "Managed runtime process restarts.",
            ["deployment"],
            registry=self.registry,
        )

    def restarted(self, deployment: str) -> None:
        self._restarts.labels(deployment).inc()


def _optional(module: str, name: str) -> Any:
    """``module.name``, or ``None`` when that module is not part of this build."""
    try:
        found = importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is not None and module.startswith(err.name):
            return None
        raise
    return getattr(found, name)


@dataclass
class Parts:
    """What the frontend builds on the workers; each ``None`` is imported by default.

    Attributes:
        metrics: the metrics object: ``registry`` and ``restarted(deployment)``.
        pool_factory: ``ReplicaPool(deployment, workers, metrics, *, public_name,
            served_name)``.
        listener_app: ``build_listener_app(listener, pools)``: an ASGI app for one
            listener, given the pools by public model id.
    """

    metrics: Any = None
    pool_factory: Callable[..., Any] | None = None
    listener_app: Callable[[Listener, Mapping[str, Any]], ASGIApp] | None = None
    imported: bool = field(default=False, repr=False)

    def resolve(self) -> None:
        if self.imported:
            return
        self.imported = True
        if self.metrics is None:
            factory = _optional("vllm_sr.metrics", "Metrics")
            self.metrics = factory() if factory is not None else FallbackMetrics()
        if self.pool_factory is None:
            self.pool_factory = _optional("vllm_sr.pool", "ReplicaPool")
        if self.listener_app is None:
            self.listener_app = _optional("vllm_sr.api.native", "build_listener_app")


class Frontend:
    """One frontend run: :meth:`run` until a signal, or until startup fails.

    Args:
        config: the validated configuration (serve flags applied).
        env: the managed workers' environment.
        management: host and port of the management API.
        metrics_address: host and port of the metrics, or ``None`` for none.
        ready_timeout: seconds the readiness wait may take.
        timeout_source: what set it (the timeout message names it).
        devices: the worker command's ``devices`` answer (``auto`` resolution).
        clock: time of the supervisors' back-off and of the wait.
        out: where the progress lines go.
        parts: the pools, listeners' app and metrics.
        supervisor_options: further :class:`~.workers.supervisor.Supervisor` arguments.
    """

    def __init__(
        self,
        config: Config,
        env: RuntimeEnvironment,
        *,
        management: tuple[str, int] = (LOOPBACK, MANAGEMENT_PORT),
        metrics_address: tuple[str, int] | None = (LOOPBACK, METRICS_PORT),
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
        timeout_source: str = "VLLM_SRUN_READY_TIMEOUT",
        devices: Devices | None = None,
        clock: Clock | None = None,
        out: Callable[[str], None] | None = None,
        parts: Parts | None = None,
        supervisor_options: dict[str, Any] | None = None,
    ) -> None:
        self.config = config
        self.env = env
        self.management = management
        self.metrics_address = metrics_address
        self.ready_timeout = ready_timeout
        self.timeout_source = timeout_source
        self.devices = devices or Devices(env.command)
        self.clock = clock or RealClock()
        self.out = out or (lambda line: print(line, flush=True))
        self.parts = parts or Parts()
        self.supervisor_options = supervisor_options or {}
        self.views: list[DeploymentView] = []
        self.status = StartupStatus([])
        self.pools: dict[str, Any] = {}
        self.gates: list[Gate] = []
        self.servers: list[tuple[Server, asyncio.Task[None]]] = []
        self.pollers: list[asyncio.Task[None]] = []
        self.stopping = asyncio.Event()
        self.forced = asyncio.Event()
        self._draining = False

    # -- what the management API reads ------------------------------------------------------------
    @property
    def draining(self) -> bool:
        return self._draining

    def inventory(self) -> list[dict[str, Any]]:
        entries = []
        deployments = self.config.catalog.deployments
        for view in self.views:
            pool = self.pools.get(view.name)
            if pool is not None and hasattr(pool, "inventory"):
                entries.append(pool.inventory())
            else:
                entries.append(inventory_entry(view, deployments[view.name]))
        return entries

    def instance_status(self) -> dict[str, Any]:
        catalog = self.config.catalog
        return {
            "mode": "router" if self.config.router_enabled else "engine",
            "router_enabled": self.config.router_enabled,
            "decision_deployment": catalog.decision_deployment,
            "phase": "draining" if self._draining else self.status.phase,
            "ready": self.status.ready and not self._draining,
            "message": self.status.message,
            "deployments": [v.name for v in self.views],
        }

    # -- composing -----------------------------------------------------------------------------
    async def _plan(self) -> None:
        names = deployments_in_use(self.config)
        auto = None
        if needs_auto(self.config, names):  # asked once; /health answers meanwhile
            auto = await asyncio.to_thread(self.devices.auto)
        plans = plan_workers(self.config, names, self.env, auto)
        metrics = self.parts.metrics
        on_restart = getattr(metrics, "restarted", None)
        deployments = self.config.catalog.deployments
        for name in names:
            view = DeploymentView(
                name=name,
                artifact=deployments[name].artifact or "",
                managed=deployments[name].managed,
                workers=[],
            )
            for plan in (p for p in plans if p.deployment == name):
                worker = Worker(
                    deployment=name,
                    replica_id=plan.replica_id,
                    managed=plan.managed,
                    endpoint=plan.endpoint,
                    served_name=plan.served_name,
                    process=plan.process,
                    device=plan.device,
                )
                view.workers.append(worker)
                if plan.managed:
                    view.supervisors.append(
                        Supervisor(
                            plan,
                            worker,
                            clock=self.clock,
                            on_restart=on_restart,
                            **self.supervisor_options,
                        )
                    )
            self.views.append(view)
        self.status = StartupStatus(self.views)
        if self.parts.pool_factory is not None:
            for view in self.views:
                self.pools[view.name] = self.parts.pool_factory(
                    view.name,
                    view.workers,
                    metrics,
                    public_name=deployments[view.name].public_id(),
                    served_name=view.name,
                )

    def _start_workers(self) -> None:
        for view in self.views:
            for supervisor in view.supervisors:
                supervisor.start()
            for worker in view.workers:
                if not worker.managed:
                    poller = HealthPoller(worker)
                    self.pollers.append(
                        asyncio.create_task(poller.run(), name=f"health {worker.deployment}")
                    )

    def _serve(self, app: ASGIApp, sock: socket.socket, name: str) -> None:
        config = uvicorn.Config(
            app, log_level="warning", lifespan="off", access_log=False, timeout_keep_alive=5
        )
        server = Server(config)
        task = asyncio.create_task(server.serve(sockets=[sock]), name=f"serve {name}")
        self.servers.append((server, task))

    def _check_bindings(self) -> None:
        catalog = self.config.catalog
        in_use = {v.name: v for v in self.views}
        for name, binding in catalog.bindings.items():
            view = in_use.get(binding.deployment)
            if view is None:
                continue
            card = next((w.card for w in view.workers if w.ready and w.card), None)
            if card is None:
                continue  # an attached runtime not ready yet: checked once its card is seen
            problem = binding_problem(name, binding, catalog.deployments[view.name], card)
            if problem:
                raise StartupFailed(problem)

    def _pools_by_public_id(self) -> dict[str, Any]:
        deployments = self.config.catalog.deployments
        found = {}
        for name, pool in self.pools.items():
            public = deployments[name].public_id()
            if public:
                found[public] = pool
        return found

    # -- the run -------------------------------------------------------------------------------
    def request_shutdown(self) -> None:
        """Start the shutdown (a second call skips the wait for requests in flight)."""
        if self.stopping.is_set():
            self.forced.set()
        self.stopping.set()

    async def run(self) -> int:
        """Serve until a signal (0), or fail startup (1, the message on stderr)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_shutdown)
        try:
            return await self._run()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    async def _run(self) -> int:
        try:
            self.parts.resolve()
            host, port = self.management
            self._serve(build_management_app(self), bind(host, port, "the management API"), "mgmt")
            await self._plan()
            if self.metrics_address is not None:
                from prometheus_client import make_asgi_app

                host, port = self.metrics_address
                app = make_asgi_app(self.parts.metrics.registry)
                self._serve(app, bind(host, port, "the metrics endpoint"), "metrics")
            self._start_workers()
            waited = asyncio.create_task(
                wait_for_deployments(
                    self.views,
                    timeout=self.ready_timeout,
                    source=self.timeout_source,
                    clock=self.clock,
                    report=self.out,
                    status=self.status,
                )
            )
            stop = asyncio.create_task(self.stopping.wait())
            await asyncio.wait({waited, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not waited.done():
                waited.cancel()
                await asyncio.gather(waited, return_exceptions=True)
                await self._shutdown()
                return 0
            stop.cancel()
            waited.result()
            self.status.set("initializing_models", "checking bindings and opening the listeners")
            self._check_bindings()
            self._open_listeners()
        except (StartupFailed, PlanError) as err:
            message = str(err)
            self.status.set("error", message)
            print(f"Router startup failed: {message}", file=sys.stderr, flush=True)
            log.error("startup failed: %s", message)
            await self._shutdown()
            return 1
        self.status.set("ready", "serving")
        await self.stopping.wait()
        await self._shutdown()
        return 0

    def _open_listeners(self) -> None:
        factory = self.parts.listener_app
        if factory is None:
            if self.config.listeners:
                log.warning("this build has no native API: the listeners are not opened")
            return
        pools = self._pools_by_public_id()
        sockets = [
            (li, bind(li.address, li.port, f"listener {li.name}")) for li in self.config.listeners
        ]
        for listener, sock in sockets:
            gate = Gate(factory(listener, pools))
            self.gates.append(gate)
            self._serve(gate, sock, f"listener {listener.name}")
            log.info("listener %s serves on %s:%d", listener.name, listener.address, listener.port)

    async def _drained(self) -> None:
        for gate in self.gates:
            await gate.idle.wait()

    async def _shutdown(self) -> None:
        """Drain the listeners, stop the workers, close the servers."""
        self._draining = True
        for gate in self.gates:
            gate.closed = True
        if self.gates and not self.forced.is_set():
            drained = asyncio.ensure_future(self._drained())
            forced = asyncio.ensure_future(self.forced.wait())
            await asyncio.wait(
                {drained, forced}, timeout=DRAIN_TIMEOUT, return_when=asyncio.FIRST_COMPLETED
            )
            for waiter in (drained, forced):
                waiter.cancel()
            await asyncio.gather(drained, forced, return_exceptions=True)
        for poller in self.pollers:
            poller.cancel()
        await asyncio.gather(*self.pollers, return_exceptions=True)
        await asyncio.gather(*(s.stop() for v in self.views for s in v.supervisors))
        for pool in self.pools.values():
            closing = getattr(pool, "aclose", None)
            if closing is not None:
                with contextlib.suppress(Exception):
                    await closing()
        for view in self.views:
            for worker in view.workers:
                await worker.aclose()
        for server, _ in self.servers:
            server.should_exit = True
        await asyncio.gather(*(task for _, task in self.servers), return_exceptions=True)
        if self.env.created:
            shutil.rmtree(self.env.directory, ignore_errors=True)
