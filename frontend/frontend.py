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
10 s later), the servers close and the process exits 0. SIGHUP never stops it: it reloads
the configuration file as ``vllm-sr config apply`` would
(:meth:`~.reload.Reloads.reread`), or, without one, is logged and ignored.

Why one module of 500-odd lines: :class:`Frontend` is one process's life, start,
activation (at start and on each reload) and shutdown over the same servers, generations
and listeners, each step leaving what a later one closes; the parts it composes (the plan,
the supervisors, the pools, the reloads, the routes) already live in modules of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable, Generator
from typing import Any

import uvicorn

from .api.management import build_management_app, is_loopback
from .api.native import Listener
from .api.published import Grant, Published
from .config.bindings import binding_problem
from .config.in_use import deployments_in_use
from .config.schema import JEV_SCHEMA, Config
from .generation import Generation, compose_generation
from .metrics import Metrics, metrics_app
from .pool import ReplicaPool
from .reload import ConfigSource, Reloads
from .router.chat import ListenerChat
from .router.compose import RouterUnready, compose, prepare, response_cache, router_mode
from .router.forward import Backends
from .router.metrics import RoutingMetrics
from .router.preview import Preview
from .router.route import Router
from .startup import DeploymentView, StartupFailed, StartupStatus, wait_for_deployments
from .workers.devices import Devices
from .workers.environment import PlanError, RuntimeEnvironment
from .workers.plan import needs_auto
from .workers.supervisor import Clock, RealClock

log = logging.getLogger("vllm_sr")

MANAGEMENT_PORT = 8080
METRICS_PORT = 9190
LOOPBACK = "127.0.0.1"

DEFAULT_READY_TIMEOUT = 600.0
"""``VLLM_SRUN_READY_TIMEOUT`` when unset: 10 minutes."""

DRAIN_TIMEOUT = 30.0
"""After SIGTERM, how long requests in flight may take before the workers stop."""

ASGIApp = Callable[..., Any]

PORT_OFFSET_HINT = (
    "or set VLLM_SR_PORT_OFFSET=N to move every port of this frontend up by N (the "
    "management API from 8080, the metrics from 9190, the listeners from their configured "
    "ports or 8899)"
)
"""How a port in use is moved (the end of the message that says it is in use)."""


def stamped(line: str) -> str:
    """``line`` after the time, written as the log lines write theirs
    (``2026-12-01 09:30:00,123 ...``)."""
    now = time.time()
    clock = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    return f"{clock},{int(now % 1 * 1000):03d} {line}"


def _print_stamped(line: str) -> None:
    print(stamped(line), flush=True)


class _BindErrors(logging.Filter):
    """Drops uvicorn's own record of an address it could not bind (``[Errno 98] ...``):
    the frontend says what is wrong and how to fix it instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not isinstance(record.msg, OSError)


logging.getLogger("uvicorn.error").addFilter(_BindErrors())


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


def bind_problem(host: str, port: int, fix: str) -> str:
    """Why ``host:port`` cannot be bound (asked again after uvicorn could not): a port in
    use says so and how to move it (``fix``, before :data:`PORT_OFFSET_HINT`)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                return f"port {port} is in use; {fix}, {PORT_OFFSET_HINT}"
            return str(err.strerror or err)
    return "the address could not be bound"


class Frontend:
    """One frontend run: :meth:`run` until a signal, or until startup fails.

    Args:
        config: the validated configuration (serve flags applied).
        env: the managed workers' environment.
        management: host and port of the management API.
        metrics_address: host and port of the metrics, or ``None`` for none.
        ready_timeout: seconds the readiness wait may take (at start and per reload).
        timeout_source: what set it (the timeout message names it).
        devices: the worker command's ``devices`` answer (``auto`` resolution).
        clock: time of the supervisors' back-off and of the wait.
        out: where the progress lines go.
        result_cache: entries of a single-worker deployment's result cache (``None``:
            ``VLLM_SRUN_RESULT_CACHE``; 0 disables it).
        request_timeout: seconds a listener request waits for its worker.
        supervisor_options: further :class:`~.workers.supervisor.Supervisor` arguments.
        source: the configuration as read, and how a new document becomes a
            :class:`Config` (``vllm-sr config apply``); ``None``: the configuration
            is kept in memory only (:class:`~.reload.ConfigSource` of ``config``).
        management_token: the bearer token the configuration API asks for (``None``:
            none; the API listens on loopback).
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
        source: ConfigSource | None = None,
        management_token: str | None = None,
    ) -> None:
        self.config = config
        self.env = env
        self.management = management
        self.metrics_address = metrics_address
        self.ready_timeout = ready_timeout
        self.timeout_source = timeout_source
        self.devices = devices or Devices(env.command)
        self.clock = clock or RealClock()
        self.out = out or _print_stamped
        self.result_cache = result_cache
        self.request_timeout = request_timeout
        self.supervisor_options = supervisor_options or {}
        self.metrics = Metrics()
        self.status = StartupStatus([])
        self.active: Generation | None = None
        """The generation serving (the one starting, until the listeners open)."""
        self.preparing: Generation | None = None
        """A reload's generation while it prepares beside the active one."""
        self.listeners: dict[str, Listener] = {}
        self.servers: list[tuple[Server, asyncio.Task[None]]] = []
        self.stopping = asyncio.Event()
        self.forced = asyncio.Event()
        self._draining = False
        self._hangups: set[asyncio.Task[None]] = set()
        self._auto_device: str | None = None
        self.cache = response_cache(config)
        self.backends = Backends()
        self.routing_metrics = (
            RoutingMetrics(self.metrics.registry) if router_mode(config) else None
        )
        preview = config.global_.services.api.routing_preview
        self.preview = Preview(
            lambda: self.router, preview.max_concurrency, float(preview.request_timeout_seconds)
        )
        self.reloads = Reloads(self, source or ConfigSource.of(config), management_token)

    # -- what the management API reads ------------------------------------------------------------
    @property
    def mode(self) -> str:
        """``Router`` or ``Engine``, as messages name this frontend."""
        return "Router" if router_mode(self.config) else "Engine"

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def views(self) -> list[DeploymentView]:
        """The active generation's deployments in use."""
        return self.active.views if self.active is not None else []

    @property
    def pools(self) -> dict[str, ReplicaPool]:
        """The active generation's pools, by deployment."""
        return self.active.pools if self.active is not None else {}

    @property
    def router(self) -> Router | None:
        """The active generation's routes (Router mode, once composed)."""
        return self.active.router if self.active is not None else None

    def inventory(self) -> list[dict[str, Any]]:
        """Each deployment in use: its pool's inventory entry, with the generation it
        serves in (``active``), and, while a reload prepares, the preparing
        generation's pools that differ (``preparing``)."""
        entries = []
        shown: set[int] = set()
        for generation, role in ((self.active, "active"), (self.preparing, "preparing")):
            if generation is None:
                continue
            for pool in generation.pools.values():
                if id(pool) in shown:
                    continue
                shown.add(id(pool))
                entries.append(
                    {**pool.inventory(), "generation": role, "config_version": generation.version}
                )
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
            "config_version": self.active.version if self.active is not None else 0,
        }

    # -- composing -----------------------------------------------------------------------------
    async def compose(self, config: Config, previous: Generation | None) -> Generation:
        """``config``'s generation, reusing ``previous``'s workers (nothing started).

        Raises:
            PlanError: a worker cannot be planned.
        """
        if needs_auto(config, deployments_in_use(config)) and self._auto_device is None:
            log.info(
                "choosing the device for device: auto (asks the worker command's `devices`, "
                "which imports torch: a few seconds, once)"
            )
            self._auto_device = await asyncio.to_thread(self.devices.auto)  # asked once
            log.info(
                "device: auto is %s", self._auto_device or "unknown: each worker picks its own"
            )
        return compose_generation(
            config,
            self.env,
            self.metrics,
            version=previous.version + 1 if previous is not None else 1,
            previous=previous,
            auto_device=self._auto_device,
            clock=self.clock,
            supervisor_options=self.supervisor_options,
            result_cache=self.result_cache,
        )

    async def _serve(
        self,
        app: ASGIApp,
        host: str,
        port: int,
        what: str,
        fix: str = "stop what listens there",
    ) -> None:
        """Serve ``app`` on ``host:port`` once it is bound.

        Raises:
            StartupFailed: the address is in use (the message says how to move it: ``fix``,
                or ``VLLM_SR_PORT_OFFSET``) or cannot be bound (``what`` names the server).
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
            problem = bind_problem(host, port, fix)
            raise StartupFailed(f"{what} cannot listen on {host}:{port}: {problem}")
        self.servers.append((server, task))

    @staticmethod
    def binding_problems(generation: Generation) -> list[str]:
        """What is wrong with ``generation``'s bindings, checked against the cards of its
        ready deployments (an attached one not ready yet is checked once it is)."""
        catalog = generation.config.catalog
        in_use = {v.name: v for v in generation.views}
        problems = []
        for name, binding in catalog.bindings.items():
            view = in_use.get(binding.deployment)
            if view is None:
                continue
            card = view.pool.card
            if card is None:
                continue
            problem = binding_problem(name, binding, catalog.deployments[view.name], card)
            if problem:
                problems.append(problem)
        return problems

    async def compose_router(self, generation: Generation) -> None:
        """Compose ``generation``'s routes over its pools and embed its candidates.

        Raises:
            RouterUnready: a binding the routes need is missing, or its model did not answer.
        """
        cards = {name: pool.card for name, pool in generation.pools.items()}
        router = compose(generation.config, generation.pools, cards, self.metrics.unknown_answer)
        await prepare(router)
        generation.router = router

    def _jev(self, config: Config, public_ids: list[str]) -> tuple[str, ...]:
        """The ones of ``public_ids`` whose deployment serves the Jev schema."""
        deployments = config.catalog.deployments
        found = []
        for public_id in public_ids:
            name = config.deployment_for_public_id(public_id)
            if name is not None and deployments[name].served_systemone_schema == JEV_SCHEMA:
                found.append(public_id)
        return tuple(found)

    def published(self, generation: Generation) -> dict[str, Published]:
        """What each listener publishes under ``generation``, by listener name."""
        pools = generation.pools_by_public_id()
        found = {}
        for config in generation.config.listeners:
            grant = Grant(
                listener=config.name,
                api_keys=tuple(config.api_keys),
                systemone=tuple(config.systemone.models),
                runtime=tuple(config.runtime.models),
                jev=self._jev(generation.config, config.systemone.models),
            )
            chat = None
            if generation.router is not None:
                router = generation.router
                chat = ListenerChat(
                    name=config.name,
                    allowed=tuple(config.models),
                    timeout=config.timeout_seconds,
                    router=lambda router=router: router,  # type: ignore[misc]
                    backends=self.backends,
                    cache=self.cache,
                    metrics=self.routing_metrics,
                )
            found[config.name] = Published(grant, pools, chat)
        return found

    def activate(self, generation: Generation) -> None:
        """Serve ``generation`` from the next request on: every listener's published
        grant and pools, the gauges of its pools, the preview's routes, the startup
        status' deployments. Requests in flight finish on the generation that admitted
        them.

        Raises:
            ValueError: a listener cannot take it (nothing was published).
        """
        stores = generation.config.global_.stores.response_cache
        if stores != self.config.global_.stores.response_cache:
            self.cache = response_cache(generation.config)  # new sizes: a new, empty cache
        published = self.published(generation)
        for name, listener in self.listeners.items():
            if name not in published or (published[name].chat is not None) != listener.router_mode:
                raise ValueError(
                    f"listener {name} cannot take this configuration without a restart"
                )
        for name, listener in self.listeners.items():  # cannot fail now: all or none
            listener.publish(published[name])
        for pool in generation.pools.values():
            self.metrics.watch(pool)
        self.active = generation
        self.config = generation.config
        self.status.views = list(generation.views)

    # -- the run -------------------------------------------------------------------------------
    def request_shutdown(self) -> None:
        """Start the shutdown (a second call skips the wait for requests in flight)."""
        if self.stopping.is_set():
            self.forced.set()
        self.stopping.set()

    def request_reload(self) -> None:
        """SIGHUP: reload the configuration file in a task of its own (its outcome is
        logged); ignored once the shutdown started."""
        if self.stopping.is_set():
            log.info("SIGHUP ignored: shutting down")
            return
        task = asyncio.create_task(self.reloads.reread(), name="reload on SIGHUP")
        self._hangups.add(task)
        task.add_done_callback(self._hangups.discard)

    async def run(self) -> int:
        """Serve until SIGTERM or SIGINT (0), or fail startup (1, the message on stderr);
        SIGHUP reloads the configuration."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_shutdown)
        loop.add_signal_handler(signal.SIGHUP, self.request_reload)
        try:
            return await self._run()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)

    async def _run(self) -> int:
        try:
            host, port = self.management
            app = build_management_app(self, loopback_only=is_loopback(host))
            await self._serve(app, host, port, "the management API")
            log.info(
                "management API on http://%s:%d (/ready, /startup-status; the Dashboard at "
                "/dashboard)",
                host,
                port,
            )
            generation = await self.compose(self.config, None)
            self.active = generation
            self.status = StartupStatus(generation.views)
            if self.metrics_address is not None:
                host, port = self.metrics_address
                await self._serve(metrics_app(self.metrics), host, port, "the metrics endpoint")
                log.info("metrics on http://%s:%d/metrics", host, port)
            generation.start()
            waited = asyncio.create_task(
                wait_for_deployments(
                    generation.views,
                    timeout=self.ready_timeout,
                    source=self.timeout_source,
                    clock=self.clock,
                    report=self.out,
                    status=self.status,
                    mode=self.mode,
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
            problems = self.binding_problems(generation)
            if problems:
                raise StartupFailed(problems[0])
            if router_mode(self.config):
                self.status.set("initializing_models", "preparing the routes")
                await self.compose_router(generation)
            await self._open_listeners(generation)
            self.reloads.started(generation)
        except (StartupFailed, PlanError, RouterUnready) as err:
            message = str(err)
            self.status.set("error", message)
            print(f"{self.mode} startup failed: {message}", file=sys.stderr, flush=True)
            log.error("startup failed: %s", message)
            await self._shutdown()
            return 1
        self.status.set("ready", "serving")
        await self.stopping.wait()
        await self._shutdown()
        return 0

    async def _open_listeners(self, generation: Generation) -> None:
        options: dict[str, Any] = {}
        if self.request_timeout is not None:
            options["timeout"] = self.request_timeout
        published = self.published(generation)
        for config in generation.config.listeners:
            given = published[config.name]
            listener = Listener(given.grant, given.pools, chat=given.chat, **options)
            await self._serve(
                listener.app,
                config.address,
                config.port,
                f"listener {config.name}",
                "stop what listens there, change the listener's port in the configuration",
            )
            self.listeners[config.name] = listener
            log.info("listener %s serves on %s:%d", config.name, config.address, config.port)

    async def _drained(self) -> None:
        for listener in self.listeners.values():
            await listener.drained()

    async def _shutdown(self) -> None:
        """Drain the listeners, stop the workers, close the servers."""
        self._draining = True
        listeners = list(self.listeners.values())
        inflight = sum(listener.inflight for listener in listeners)
        log.info(
            "shutting down: new requests get 503; %d in flight finish first, then the workers stop",
            inflight,
        )
        for listener in listeners:
            listener.stop()
        if listeners and not self.forced.is_set():
            drained = asyncio.ensure_future(self._drained())
            forced = asyncio.ensure_future(self.forced.wait())
            await asyncio.wait(
                {drained, forced}, timeout=DRAIN_TIMEOUT, return_when=asyncio.FIRST_COMPLETED
            )
            for waiter in (drained, forced):
                waiter.cancel()
            await asyncio.gather(drained, forced, return_exceptions=True)
        for task in list(self._hangups):
            task.cancel()
        await asyncio.gather(*self._hangups, return_exceptions=True)
        await self.reloads.close()
        await self.backends.close()
        for generation in (self.preparing, self.active):
            if generation is None:
                continue
            await generation.stop(generation.everything())
            for pool in generation.pools.values():
                self.metrics.forget(pool)
        for server, _ in self.servers:
            server.should_exit = True
        await asyncio.gather(*(task for _, task in self.servers), return_exceptions=True)
        if self.env.created:
            shutil.rmtree(self.env.directory, ignore_errors=True)
        log.info("stopped")
