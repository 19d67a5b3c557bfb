"""A microagent application on a local Ray cluster, seen from its HTTP side (the tests').

``Cluster`` talks to Serve's proxy: chat requests with a key, one replica's own
``/metrics`` (pinned with ``x-microagent-replica``), a wait until a replica has
requests in flight (read from those metrics, not slept for), and killing a
replica's actor the way a node failure would. ``local_cluster`` starts one.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
from microagent.cluster import ClusterSettings, build_app

KEYS = ("alpha-key", "beta-key")
#: The key that reads /metrics (an API key gets 403 there).
ADMIN_KEY = "ops-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    def __init__(self, url: str) -> None:
        self.url = url
        self.client = httpx.Client(base_url=url, timeout=120.0)

    def chat(self, key: str = KEYS[0], **body: Any) -> httpx.Response:
        payload = {"model": "default", "max_tokens": 16, **body}
        return self.client.post(
            "/v1/chat/completions", json=payload, headers={"authorization": f"Bearer {key}"}
        )

    def replica_metric(self, replica: str, name: str) -> float:
        r = self.client.get(
            "/metrics",
            headers={"authorization": f"Bearer {ADMIN_KEY}", "x-microagent-replica": replica},
        )
        assert r.status_code == 200 and r.headers["x-microagent-replica"] == replica
        for line in r.text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def wait_running(
        self, replica: str, count: int, within: float = 60.0, *, above: bool = True
    ) -> None:
        """Until ``replica`` has at least (``above``) or at most ``count`` requests in flight,
        as its own /metrics says (a pinned request, which is not itself counted there)."""
        deadline = time.monotonic() + within
        while True:
            running = self.replica_metric(replica, "microagent:requests_running")
            if (running >= count) if above else (running <= count):
                return
            assert time.monotonic() < deadline, f"{replica} stayed at {running} requests"

    def kill(self, replica: str) -> None:
        import ray

        actor = ray.get_actor(f"SERVE_REPLICA::microagent#EngineReplica#{replica}", "serve")
        ray.kill(actor, no_restart=True)


@contextlib.contextmanager
def local_cluster(settings: ClusterSettings) -> Iterator[Cluster]:
    """A local Ray cluster (2 CPUs) running ``settings``' application behind Serve's proxy on
    a free port; Serve and Ray are shut down on the way out."""
    import ray
    from ray import serve

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    port = free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(settings), name="microagent", route_prefix="/")
        yield Cluster(f"http://127.0.0.1:{port}")
    finally:
        serve.shutdown()
        ray.shutdown()
