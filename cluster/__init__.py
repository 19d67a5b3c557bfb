"""microagent on Ray Serve: engine replicas behind an ingress that keeps KV where it lives.

``build_app(ClusterSettings(...))`` is the Serve application: an ingress
deployment (API keys, quotas, the request's ``RouteHint``) in front of engine
replica deployments, each ``microagent serve``'s whole app over its own engine.
``AffinityRouter`` sends a session to the replica that holds its KV and a shared
prefix to the replica that cached it (rendezvous hashing), falling back to the
less loaded of two replicas when that one is overloaded. ``app`` is the builder
Serve's command line imports; ``python -m microagent.cluster`` starts it. Needs the
``ray`` extra (``pip install 'microagent[ray]'``). See ``docs/scale.md``.
"""

try:
    import ray.serve  # noqa: F401  (the optional extra: say so, not "no module named ray")
except ImportError as _missing:  # pragma: no cover - the suite installs the extra
    raise ImportError(
        "microagent.cluster needs Ray Serve: pip install 'microagent[ray]'"
    ) from _missing

from .._public import publish as _publish
from ._deploy import app as app
from ._deploy import build_app as build_app
from ._route import RouteHint as RouteHint
from ._route import route_of as route_of
from ._router import AffinityRouter as AffinityRouter
from ._router import rendezvous as rendezvous
from ._settings import Autoscaling as Autoscaling
from ._settings import ClusterConfigError as ClusterConfigError
from ._settings import ClusterSettings as ClusterSettings

__all__ = [
    "AffinityRouter",
    "Autoscaling",
    "ClusterConfigError",
    "ClusterSettings",
    "RouteHint",
    "app",
    "build_app",
    "rendezvous",
    "route_of",
]

_publish(globals(), __name__)
