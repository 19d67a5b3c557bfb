"""``python -m microagent.cluster``: microagent on a Ray cluster (a local one by default).

    python -m microagent.cluster --replicas 2 --port 8000 -- --engine scripted

Everything after ``--`` is ``microagent serve``'s options for each engine replica.
``--address auto`` joins the cluster ``ray start --head`` started; without it a
local cluster starts in this process. Ctrl-C stops the application.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ._settings import Autoscaling, ClusterConfigError, ClusterSettings


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m microagent.cluster",
        description="Serve microagent from engine replicas on Ray Serve, with session- and "
        "prefix-affine routing. Options after `--` are `microagent serve`'s, per replica.",
    )
    p.add_argument("--address", default=None, help="a Ray cluster to join (`auto`: ray start's)")
    p.add_argument("--host", default="127.0.0.1", help="Serve's HTTP address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="Serve's HTTP port (default 8000)")
    p.add_argument("--replicas", type=int, default=2, help="engine replicas (default 2)")
    p.add_argument(
        "--autoscale", metavar="MIN:MAX", default=None, help="scale replicas by load instead"
    )
    p.add_argument("--target-ongoing-requests", type=float, default=16.0)
    p.add_argument("--replica-cpus", type=float, default=1.0)
    p.add_argument("--replica-gpus", type=float, default=0.0)
    p.add_argument("--num-cpus", type=float, default=None, help="a local cluster's CPUs")
    return p


def settings_from(args: argparse.Namespace, serve_args: Sequence[str]) -> ClusterSettings:
    """The ``ClusterSettings`` of the command line (``ClusterConfigError`` names a bad one)."""
    autoscaling = None
    if args.autoscale is not None:
        low, sep, high = args.autoscale.partition(":")
        if not sep or not low.isdigit() or not high.isdigit():
            raise ClusterConfigError(f"--autoscale: MIN:MAX, not {args.autoscale!r}")
        autoscaling = Autoscaling(
            int(low), int(high), target_ongoing_requests=args.target_ongoing_requests
        )
    return ClusterSettings(
        serve_args=tuple(serve_args),
        replicas=args.replicas,
        autoscaling=autoscaling,
        replica_cpus=args.replica_cpus,
        replica_gpus=args.replica_gpus,
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    mine, serve_args = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    args = _parser().parse_args(mine)
    try:
        settings = settings_from(args, serve_args)
        from ._deploy import build_app

        application = build_app(settings)
    except (ClusterConfigError, ValueError) as exc:
        print(f"microagent.cluster: {exc}", file=sys.stderr)
        return 2
    import ray
    from ray import serve

    ray.init(address=args.address, num_cpus=args.num_cpus if args.address is None else None)
    serve.start(http_options={"host": args.host, "port": args.port})
    print(
        f"microagent on Ray Serve: http://{args.host}:{args.port}/v1 "
        f"({settings.replicas if settings.autoscaling is None else args.autoscale} replicas)",
        file=sys.stderr,
        flush=True,
    )
    try:
        serve.run(application, name=settings.name, route_prefix="/", blocking=True)
    except KeyboardInterrupt:
        serve.shutdown()  # type: ignore[no-untyped-call]
    return 0


if __name__ == "__main__":
    sys.exit(main())
