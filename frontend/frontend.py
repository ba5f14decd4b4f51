"""The frontend process: configuration in, workers started, APIs served, clean exit.

:class:`Frontend` composes the parts. It plans the workers of the deployments in
use, starts a :class:`~.workers.supervisor.Supervisor` per managed worker and a
health poller per attached one, puts each deployment's workers in a
:class:`~.pool.ReplicaPool`, serves the management API at once (``/health``
answers while models load) and the metrics, waits for every managed deployment
(printing the progress line on each change, bounded by ``VLLM_SRUN_READY_TIMEOUT``),
checks the bindings against the cards, then opens the listeners (one
:class:`~.api.native.Listener` each, over the pools by public model id).

SIGTERM or SIGINT starts the shutdown: the listeners answer new requests 503 and
``/ready`` says 503, requests in flight finish, every worker gets SIGTERM (SIGKILL
10 s later), the servers close and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import signal
import socket
import sys
from collections.abc import Callable, Generator
from typing import Any

import uvicorn

from .api.management import build_management_app
from .api.native import Listener
from .api.published import Grant
from .config.bindings import binding_problem
from .config.in_use import deployments_in_use
from .config.schema import JEV_SCHEMA, Config, Deployment
from .metrics import Metrics, metrics_app
from .pool import ReplicaPool
from .router.chat import ListenerChat
from .router.compose import RouterUnready, compose, prepare, response_cache, router_mode
from .router.forward import Backends
from .router.metrics import RoutingMetrics
from .router.preview import Preview
from .router.route import Router
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
    """A uvicorn server inside the frontend's event loop. It binds its own address
    (uvicorn's sockets get ``TCP_NODELAY`` on every event loop), the frontend takes the
    signals, and a failed bind is kept in :attr:`failed` instead of ending the process.
    """

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.bound = asyncio.Event()
        self.failed = False

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets=sockets)
        except SystemExit:  # uvicorn's answer to an address it cannot bind
            self.failed = True
            self.should_exit = True
        finally:
            self.bound.set()


def bind_problem(host: str, port: int) -> str:
    """Why ``host:port`` cannot be bound (asked again after uvicorn could not)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            return str(err.strerror or err)
    return "the address could not be bound"


def input_defaults(deployment: Deployment) -> dict[str, Any]:
    """A deployment's ``input`` as the ``options`` its pool gives requests that choose
    none (``max_tokens: 0`` leaves the model's own limit)."""
    given = deployment.input
    if given is None:
        return {}
    defaults: dict[str, Any] = {}
    if given.max_tokens:
        defaults["max_tokens"] = given.max_tokens
    if given.overflow is not None:
        defaults["overflow"] = given.overflow
    return defaults


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
        result_cache: entries of a single-worker deployment's result cache (``None``:
            ``VLLM_SRUN_RESULT_CACHE``; 0 disables it).
        request_timeout: seconds a listener request waits for its worker.
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
        result_cache: int | None = None,
        request_timeout: float | None = None,
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
        self.result_cache = result_cache
        self.request_timeout = request_timeout
        self.supervisor_options = supervisor_options or {}
        self.metrics = Metrics()
        self.views: list[DeploymentView] = []
        self.status = StartupStatus([])
        self.pools: dict[str, ReplicaPool] = {}
        self.listeners: list[Listener] = []
        self.servers: list[tuple[Server, asyncio.Task[None]]] = []
        self.pollers: list[asyncio.Task[None]] = []
        self.stopping = asyncio.Event()
        self.forced = asyncio.Event()
        self._draining = False
        self.router: Router | None = None
        self.cache = response_cache(config)
        self.backends = Backends()
        self.routing_metrics = (
            RoutingMetrics(self.metrics.registry) if router_mode(config) else None
        )
        preview = config.global_.services.api.routing_preview
        self.preview = Preview(
            lambda: self.router, preview.max_concurrency, float(preview.request_timeout_seconds)
        )

    # -- what the management API reads ------------------------------------------------------------
    @property
    def draining(self) -> bool:
        return self._draining

    def inventory(self) -> list[dict[str, Any]]:
        """Each deployment in use: its pool's inventory entry."""
        return [pool.inventory() for pool in self.pools.values()]

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
        deployments = self.config.catalog.deployments
        for name in names:
            deployment = deployments[name]
            workers: list[Worker] = []
            supervisors: list[Supervisor] = []
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
                workers.append(worker)
                if plan.managed:
                    supervisors.append(
                        Supervisor(plan, worker, clock=self.clock, **self.supervisor_options)
                    )
            pool = ReplicaPool(
                name,
                workers,
                self.metrics,
                public_name=deployment.public_id() or name,
                artifact=deployment.artifact,
                revision=deployment.revision,
                profile=deployment.profile,
                input_defaults=input_defaults(deployment),
                cache_entries=self.result_cache,
            )
            self.pools[name] = pool
            self.views.append(
                DeploymentView(
                    name=name,
                    artifact=deployment.artifact or "",
                    managed=deployment.managed,
                    pool=pool,
                    supervisors=supervisors,
                )
            )
        self.status = StartupStatus(self.views)

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

    async def _serve(self, app: ASGIApp, host: str, port: int, what: str) -> None:
        """Serve ``app`` on ``host:port`` once it is bound.

        Raises:
            StartupFailed: the address is in use or cannot be bound (``what`` names the
                server in the message).
        """
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            lifespan="off",
            access_log=False,
            timeout_keep_alive=5,
            backlog=2048,
        )
        server = Server(config)
        task = asyncio.create_task(server.serve(), name=f"serve {what}")
        await server.bound.wait()
        if server.failed:
            await asyncio.gather(task, return_exceptions=True)
            problem = bind_problem(host, port)
            raise StartupFailed(f"{what} cannot listen on {host}:{port}: {problem}")
        self.servers.append((server, task))

    def _check_bindings(self) -> None:
        catalog = self.config.catalog
        in_use = {v.name: v for v in self.views}
        for name, binding in catalog.bindings.items():
            view = in_use.get(binding.deployment)
            if view is None:
                continue
            card = view.pool.card
            if card is None:
                continue  # an attached runtime not ready yet: checked once its card is seen
            problem = binding_problem(name, binding, catalog.deployments[view.name], card)
            if problem:
                raise StartupFailed(problem)

    def _pools_by_public_id(self) -> dict[str, ReplicaPool]:
        deployments = self.config.catalog.deployments
        found = {}
        for name, pool in self.pools.items():
            public = deployments[name].public_id()
            if public:
                found[public] = pool
        return found

    def _jev(self, public_ids: list[str]) -> tuple[str, ...]:
        """The ones of ``public_ids`` whose deployment serves the Jev schema."""
        deployments = self.config.catalog.deployments
        found = []
        for public_id in public_ids:
            name = self.config.deployment_for_public_id(public_id)
            if name is not None and deployments[name].served_systemone_schema == JEV_SCHEMA:
                found.append(public_id)
        return tuple(found)

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
            host, port = self.management
            await self._serve(build_management_app(self), host, port, "the management API")
            log.info("management API on http://%s:%d (/ready, /startup-status)", host, port)
            await self._plan()
            if self.metrics_address is not None:
                host, port = self.metrics_address
                await self._serve(metrics_app(self.metrics), host, port, "the metrics endpoint")
                log.info("metrics on http://%s:%d/metrics", host, port)
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
            if router_mode(self.config):
                self.status.set("initializing_models", "preparing the routes")
                await self._start_router()
            await self._open_listeners()
        except (StartupFailed, PlanError, RouterUnready) as err:
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

    async def _start_router(self) -> None:
        """Compose the router over the pools and embed its candidates before Chat opens.

        Raises:
            RouterUnready: a binding the routes need is missing, or its model did not answer.
        """
        cards = {name: pool.card for name, pool in self.pools.items()}
        router = compose(self.config, self.pools, cards, self.metrics.unknown_answer)
        await prepare(router)
        self.router = router

    async def _open_listeners(self) -> None:
        pools = self._pools_by_public_id()
        options: dict[str, Any] = {}
        if self.request_timeout is not None:
            options["timeout"] = self.request_timeout
        for config in self.config.listeners:
            grant = Grant(
                listener=config.name,
                api_keys=tuple(config.api_keys),
                systemone=tuple(config.systemone.models),
                runtime=tuple(config.runtime.models),
                jev=self._jev(config.systemone.models),
            )
            chat = None
            if self.router is not None:
                chat = ListenerChat(
                    name=config.name,
                    allowed=tuple(config.models),
                    timeout=config.timeout_seconds,
                    router=lambda: self.router,
                    backends=self.backends,
                    cache=self.cache,
                    metrics=self.routing_metrics,
                )
            listener = Listener(grant, pools, chat=chat, **options)
            await self._serve(listener.app, config.address, config.port, f"listener {config.name}")
            self.listeners.append(listener)
            log.info("listener %s serves on %s:%d", config.name, config.address, config.port)

    async def _drained(self) -> None:
        for listener in self.listeners:
            await listener.drained()

    async def _shutdown(self) -> None:
        """Drain the listeners, stop the workers, close the servers."""
        self._draining = True
        inflight = sum(listener.inflight for listener in self.listeners)
        log.info(
            "shutting down: new requests get 503; %d in flight finish first, then the workers stop",
            inflight,
        )
        for listener in self.listeners:
            listener.stop()
        if self.listeners and not self.forced.is_set():
            drained = asyncio.ensure_future(self._drained())
            forced = asyncio.ensure_future(self.forced.wait())
            await asyncio.wait(
                {drained, forced}, timeout=DRAIN_TIMEOUT, return_when=asyncio.FIRST_COMPLETED
            )
            for waiter in (drained, forced):
                waiter.cancel()
            await asyncio.gather(drained, forced, return_exceptions=True)
        await self.backends.close()
        for poller in self.pollers:
            poller.cancel()
        await asyncio.gather(*self.pollers, return_exceptions=True)
        await asyncio.gather(*(s.stop() for v in self.views for s in v.supervisors))
        for pool in self.pools.values():
            self.metrics.forget(pool)
            for worker in pool.workers:
                await worker.aclose()
        for server, _ in self.servers:
            server.should_exit = True
        await asyncio.gather(*(task for _, task in self.servers), return_exceptions=True)
        if self.env.created:
            shutil.rmtree(self.env.directory, ignore_errors=True)
        log.info("stopped")
