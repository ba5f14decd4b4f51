"""Configuration generations: what one validated configuration serves with.

A :class:`Generation` holds one configuration's deployments in use (each a
:class:`~.startup.DeploymentView`: its :class:`~.pool.ReplicaPool` and the supervisors of
its managed workers), the attached workers' health pollers, and, in Router mode, its
:class:`~.router.route.Router`. The frontend serves one active generation; a reload
(:mod:`.reload`) builds the next one beside it with :func:`compose_generation`.

Workers are shared between generations by identity: a managed worker whose plan has the
same identity (:attr:`~.workers.plan.ReplicaPlan.identity`: artifact, revision, device,
profile, engine arguments, command, threads; never bindings or routes) is the same
process, its :class:`~.workers.worker.Worker` and :class:`~.workers.supervisor.Supervisor`
carried over; an attached one is the same when its deployment, replica id, endpoint and
served name are. A deployment whose workers and pool settings are all unchanged keeps its
pool object; otherwise the new pool shares the kept workers' bookkeeping with the old one
(:class:`~.pool.ReplicaPool` ``previous``) so requests of both generations count together.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from .config.in_use import deployments_in_use
from .config.schema import Config, Deployment
from .metrics import Metrics
from .pool import ReplicaPool
from .router.route import Router
from .startup import DeploymentView
from .workers.environment import RuntimeEnvironment
from .workers.health import HealthPoller
from .workers.plan import ReplicaPlan, plan_workers
from .workers.supervisor import Clock, Supervisor
from .workers.worker import Worker


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


@dataclass
class Attached:
    """An attached worker and the task of its health poller."""

    worker: Worker
    poller: asyncio.Task[None] | None = None


@dataclass
class Generation:
    """One configuration and what serves it.

    Attributes:
        version: the activation counter (``config_version``): 1 for the configuration
            the frontend started with, one more for each activation since.
        config: the validated configuration.
        views: the deployments in use, in order.
        supervisors: every managed worker's supervisor, by plan identity.
        attached: every attached worker, by :func:`attached_key`.
        started: the supervisors and attached workers this generation added (what a
            failed activation stops).
        router: the routes (Router mode), once composed.
    """

    version: int
    config: Config
    views: list[DeploymentView]
    supervisors: dict[str, Supervisor]
    attached: dict[str, Attached]
    started: list[Supervisor | Attached] = field(default_factory=list)
    router: Router | None = None

    @property
    def pools(self) -> dict[str, ReplicaPool]:
        """Each deployment's pool, by deployment name."""
        return {view.name: view.pool for view in self.views}

    def pools_by_public_id(self) -> dict[str, ReplicaPool]:
        """Each deployment's pool by its public model id (deployments without one left
        out)."""
        deployments = self.config.catalog.deployments
        found = {}
        for view in self.views:
            public = deployments[view.name].public_id()
            if public:
                found[public] = view.pool
        return found

    def workers(self) -> list[Worker]:
        """Every worker of every deployment in use."""
        return [w for view in self.views for w in view.workers]

    def start(self) -> None:
        """Start what this generation added: each new supervisor, each new attached
        worker's health poller."""
        for added in self.started:
            if isinstance(added, Supervisor):
                added.start()
            elif added.poller is None:
                poller = HealthPoller(added.worker)
                added.poller = asyncio.create_task(
                    poller.run(), name=f"health {added.worker.deployment}"
                )

    async def stop(self, items: list[Supervisor | Attached]) -> None:
        """Stop ``items`` (supervisors: SIGTERM, SIGKILL after the grace; attached
        workers: their poller and connections)."""
        pollers = [a.poller for a in items if isinstance(a, Attached) and a.poller is not None]
        for poller in pollers:
            poller.cancel()
        await asyncio.gather(*pollers, return_exceptions=True)
        await asyncio.gather(*(s.stop() for s in items if isinstance(s, Supervisor)))
        for item in items:
            if isinstance(item, Attached):
                await item.worker.aclose()

    def everything(self) -> list[Supervisor | Attached]:
        """Every supervisor and attached worker (what a shutdown stops)."""
        return [*self.supervisors.values(), *self.attached.values()]


def attached_key(plan: ReplicaPlan) -> str:
    """What makes an attached worker the same one across generations."""
    return "\0".join((plan.deployment, plan.replica_id, plan.endpoint, plan.served_name))


def compose_generation(
    config: Config,
    env: RuntimeEnvironment,
    metrics: Metrics,
    *,
    version: int,
    previous: Generation | None = None,
    auto_device: str | None = None,
    clock: Clock | None = None,
    supervisor_options: dict[str, Any] | None = None,
    result_cache: int | None = None,
) -> Generation:
    """Plan ``config``'s workers and pools, reusing what ``previous`` already runs.

    Nothing is started: :meth:`Generation.start` starts what is new. The pools of a new
    generation beside an active one do not show their gauges yet (the reload calls
    :meth:`~vllm_sr.metrics.Metrics.watch` when it publishes them).

    Raises:
        PlanError: a worker cannot be planned (its socket directory is not ours).
    """
    names = deployments_in_use(config)
    plans = plan_workers(config, names, env, auto_device)
    deployments = config.catalog.deployments
    old_supervisors = previous.supervisors if previous is not None else {}
    old_attached = previous.attached if previous is not None else {}
    old_pools = previous.pools if previous is not None else {}
    supervisors: dict[str, Supervisor] = {}
    attached: dict[str, Attached] = {}
    started: list[Supervisor | Attached] = []
    views: list[DeploymentView] = []
    for name in names:
        deployment = deployments[name]
        workers: list[Worker] = []
        own: list[Supervisor] = []
        for plan in (p for p in plans if p.deployment == name):
            if plan.managed:
                supervisor = old_supervisors.get(plan.identity)
                if supervisor is None:
                    worker = _worker(plan)
                    supervisor = Supervisor(plan, worker, clock=clock, **(supervisor_options or {}))
                    started.append(supervisor)
                supervisors[plan.identity] = supervisor
                own.append(supervisor)
                workers.append(supervisor.worker)
            else:
                key = attached_key(plan)
                entry = old_attached.get(key)
                if entry is None:
                    entry = Attached(_worker(plan))
                    started.append(entry)
                attached[key] = entry
                workers.append(entry.worker)
        settings = _pool_settings(name, deployment)
        old = old_pools.get(name)
        if (
            old is not None
            and list(old.workers) == workers
            and _settings_of(old) == settings
            and old.metrics is metrics
        ):
            pool = old
        else:
            pool = ReplicaPool(
                name,
                workers,
                metrics,
                cache_entries=result_cache,
                previous=old,
                watch=previous is None,
                **settings,
            )
        views.append(
            DeploymentView(
                name=name,
                artifact=deployment.artifact or "",
                managed=deployment.managed,
                pool=pool,
                supervisors=own,
            )
        )
    return Generation(version, config, views, supervisors, attached, started)


def _worker(plan: ReplicaPlan) -> Worker:
    return Worker(
        deployment=plan.deployment,
        replica_id=plan.replica_id,
        managed=plan.managed,
        endpoint=plan.endpoint,
        served_name=plan.served_name,
        process=plan.process,
        device=plan.device,
    )


def _pool_settings(name: str, deployment: Deployment) -> dict[str, Any]:
    return {
        "public_name": deployment.public_id() or name,
        "artifact": deployment.artifact,
        "revision": deployment.revision,
        "profile": deployment.profile,
        "input_defaults": input_defaults(deployment),
    }


def _settings_of(pool: ReplicaPool) -> dict[str, Any]:
    return {
        "public_name": pool.public_name,
        "artifact": pool.artifact,
        "revision": pool.revision,
        "profile": pool.profile,
        "input_defaults": pool.input_defaults,
    }
