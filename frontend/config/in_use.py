"""Which deployments a configuration uses: only those start a worker.

A deployment is in use when a listener publishes it (a native ``systemone`` grant,
or this project's ``runtime`` grant, both by public model id) or when Engine mode
needs it as the default decision deployment. In Router mode the deployments the
task bindings name are in use as well. Any other declaration starts nothing and
never holds up startup.
"""

from __future__ import annotations

from .schema import Config


def deployments_in_use(config: Config) -> list[str]:
    """The deployments to run, in declaration order.

    A public id no deployment answers to is skipped: publishing a name does not
    create a deployment (the native API lists only ids that resolve).
    """
    wanted: set[str] = set()
    for listener in config.listeners:
        for public_id in (*listener.systemone.models, *listener.runtime.models):
            name = config.deployment_for_public_id(public_id)
            if name is not None:
                wanted.add(name)
    catalog = config.catalog
    if catalog.decision_deployment in catalog.deployments and not config.router_enabled:
        wanted.add(catalog.decision_deployment)
    if config.router_enabled:
        wanted.update(binding.deployment for binding in catalog.bindings.values())
    return [name for name in catalog.deployments if name in wanted]


def managed_in_use(config: Config) -> list[str]:
    """The deployments in use that have at least one managed worker: the ones startup
    waits for."""
    deployments = config.catalog.deployments
    return [name for name in deployments_in_use(config) if deployments[name].managed]
