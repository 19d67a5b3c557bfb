"""The Serve application: an ingress deployment in front of engine replica deployments.

``build_app(settings)`` binds the two tiers; ``app`` is the builder Serve's own
command line and config files import (``serve run microagent.cluster:app
replicas=2 serve_args='--engine scripted'``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle

from ..server import Guard
from ._ingress import IngressApp
from ._replica import EngineReplica, replica_options
from ._router import AffinityRouter
from ._settings import ClusterSettings

__all__ = ["Ingress", "app", "build_app"]

#: The deployments' names (a replica's actor is ``SERVE_REPLICA::<app>#<name>#<id>``).
INGRESS, ENGINE = "Ingress", "EngineReplica"


class Ingress:
    """The ingress deployment's class: its ASGI app forwards to the engine replicas."""

    def __init__(self, settings: ClusterSettings, replicas: DeploymentHandle[Any]) -> None:
        self.settings = settings
        self.replicas = replicas

    def __serve_build_asgi_app__(self) -> Guard:
        return IngressApp.build(self.settings, self.replicas)


def build_app(settings: ClusterSettings) -> Application:
    """The bound Serve application of ``settings`` (``serve.run`` it, or return it from
    a builder).

    Raises:
        ValueError: ``serve_args`` that ``microagent serve`` would refuse.
    """
    replica_options(settings.serve_args)  # a bad option fails here, not in every replica
    engine_options: dict[str, Any] = {
        "name": ENGINE,
        "max_ongoing_requests": settings.max_ongoing_requests,
        "ray_actor_options": {
            "num_cpus": settings.replica_cpus,
            "num_gpus": settings.replica_gpus,
        },
        "health_check_period_s": 5.0,
        "graceful_shutdown_timeout_s": 30.0,
    }
    if settings.routing == "affinity":
        engine_options["request_router_config"] = RequestRouterConfig(
            request_router_class=AffinityRouter,  # type: ignore[arg-type]
            request_router_kwargs={"affinity_max_queue": settings.affinity_max_queue},
        )
    if settings.autoscaling is not None:
        engine_options["autoscaling_config"] = settings.autoscaling.to_serve()
    else:
        engine_options["num_replicas"] = settings.replicas
    engines = serve.deployment(**engine_options)(EngineReplica)
    ingress = serve.deployment(
        name=INGRESS,
        num_replicas=settings.ingress_replicas,
        max_ongoing_requests=max(1000, settings.max_ongoing_requests * 8),
        ray_actor_options={"num_cpus": settings.ingress_cpus},
    )(serve.ingress()(Ingress))
    return ingress.bind(settings, engines.bind(list(settings.serve_args)))


def app(args: Mapping[str, object]) -> Application:
    """Serve's application builder: ``serve run microagent.cluster:app key=value ...`` or
    a config file's ``args`` (``ClusterSettings.from_options``)."""
    return build_app(ClusterSettings.from_options(args))
