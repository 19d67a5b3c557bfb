"""How a microagent Ray Serve application is laid out: replicas, their resources, scaling.

One frozen attrs class checks every bound when it is made, so a bad value fails
with the field's name before Ray starts anything (``ClusterConfigError``).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

import attrs

__all__ = ["Autoscaling", "ClusterConfigError", "ClusterSettings"]

#: ``ClusterSettings.routing``'s values.
ROUTINGS = ("affinity", "serve")


class ClusterConfigError(ValueError):
    """A cluster setting is out of bounds; the message names the field."""


def _check(condition: bool, field: str, message: str) -> None:
    if not condition:
        raise ClusterConfigError(f"{field}: {message}")


@attrs.frozen
class Autoscaling:
    """Serve's autoscaler on the engine replicas, by ongoing requests per replica.

    Attributes:
        min_replicas: never fewer (at least 1: an engine takes minutes to start, so a
            deployment scaled to zero would answer its next request that late).
        max_replicas: never more (each replica is one engine and its KV cache).
        target_ongoing_requests: the requests a replica should have in flight; Serve adds
            replicas above it and removes them below. A batching engine wants many (at
            least its ``max_num_seqs`` to keep the batch full), and it must stay below
            ``ClusterSettings.max_ongoing_requests`` or the autoscaler never sees load.
        upscale_delay_s: how long load must stay high before a replica is added.
        downscale_delay_s: how long it must stay low before one is removed (long: a
            removed replica takes its sessions' KV with it).
    """

    min_replicas: int = 1
    max_replicas: int = 2
    target_ongoing_requests: float = 16.0
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0

    def __attrs_post_init__(self) -> None:
        _check(
            self.min_replicas >= 1, "min_replicas", f"must be at least 1, not {self.min_replicas}"
        )
        _check(
            self.max_replicas >= self.min_replicas,
            "max_replicas",
            f"must be at least min_replicas ({self.min_replicas}), not {self.max_replicas}",
        )
        _check(
            self.target_ongoing_requests > 0,
            "target_ongoing_requests",
            f"must be positive, not {self.target_ongoing_requests}",
        )
        for name in ("upscale_delay_s", "downscale_delay_s"):
            value = getattr(self, name)
            _check(value >= 0, name, f"must not be negative, not {value}")

    def to_serve(self) -> dict[str, float | int]:
        """Serve's ``autoscaling_config``."""
        return {
            "min_replicas": self.min_replicas,
            "initial_replicas": self.min_replicas,
            "max_replicas": self.max_replicas,
            "target_ongoing_requests": self.target_ongoing_requests,
            "upscale_delay_s": self.upscale_delay_s,
            "downscale_delay_s": self.downscale_delay_s,
        }


@attrs.frozen
class ClusterSettings:
    """A microagent application on Ray Serve: an ingress and engine replicas.

    Attributes:
        serve_args: ``microagent serve``'s options for each engine replica (the model,
            ``--engine``, ``--api-key``s, sessions, tools...); the ingress reads the same
            keys and quotas from them. ``--host``/``--port`` are Serve's, not these.
        replicas: engine replicas when not autoscaling.
        autoscaling: scale the engine replicas by load instead (then ``replicas`` is
            ignored).
        replica_cpus: CPUs Ray reserves per engine replica (fractions share a node's
            cores, as tests and this machine do).
        replica_gpus: GPUs per engine replica (tensor parallelism: pass
            ``--engine-arg tensor_parallel_size=N`` in ``serve_args`` with ``N`` here).
        ingress_cpus: CPUs per ingress replica.
        ingress_replicas: ingress replicas (one counts quotas exactly; several each
            count their own share).
        max_ongoing_requests: requests Serve lets a replica hold (Serve's default, 5, would
            starve a batching engine).
        affinity_max_queue: a session's or prefix's replica with this many requests in
            flight is overloaded: the request goes to the less loaded of two others
            (power of two choices) and its response says ``fallback``.
        retry_deadline: seconds after its arrival by which a non-streaming request whose
            replica died may run again on another.
        routing: ``"affinity"`` (``AffinityRouter``: sessions and prefixes stay where
            their KV is) or ``"serve"`` (Serve's own power of two choices, which ignores
            the KV; ``bench/replicas.py`` compares them).
        name: the Serve application's name.
    """

    serve_args: tuple[str, ...] = ()
    replicas: int = 2
    autoscaling: Autoscaling | None = None
    replica_cpus: float = 1.0
    replica_gpus: float = 0.0
    ingress_cpus: float = 0.25
    ingress_replicas: int = 1
    max_ongoing_requests: int = 64
    affinity_max_queue: int = 32
    retry_deadline: float = 120.0
    routing: str = "affinity"
    name: str = "microagent"

    def __attrs_post_init__(self) -> None:
        _check(self.replicas >= 1, "replicas", f"must be at least 1, not {self.replicas}")
        _check(self.replica_cpus > 0, "replica_cpus", f"must be positive, not {self.replica_cpus}")
        _check(
            self.replica_gpus >= 0, "replica_gpus", f"must not be negative, not {self.replica_gpus}"
        )
        _check(self.ingress_cpus > 0, "ingress_cpus", f"must be positive, not {self.ingress_cpus}")
        _check(
            self.ingress_replicas >= 1,
            "ingress_replicas",
            f"must be at least 1, not {self.ingress_replicas}",
        )
        _check(
            self.max_ongoing_requests >= 1,
            "max_ongoing_requests",
            f"must be at least 1, not {self.max_ongoing_requests}",
        )
        _check(
            1 <= self.affinity_max_queue <= self.max_ongoing_requests,
            "affinity_max_queue",
            f"must be between 1 and max_ongoing_requests ({self.max_ongoing_requests}), "
            f"not {self.affinity_max_queue}",
        )
        _check(
            self.retry_deadline >= 0,
            "retry_deadline",
            f"must not be negative, not {self.retry_deadline}",
        )
        _check(
            self.routing in ROUTINGS,
            "routing",
            f"one of {', '.join(ROUTINGS)}, not {self.routing!r}",
        )
        scaling = self.autoscaling
        if scaling is not None:
            _check(
                scaling.target_ongoing_requests <= self.max_ongoing_requests,
                "autoscaling.target_ongoing_requests",
                f"must not exceed max_ongoing_requests ({self.max_ongoing_requests}), "
                f"not {scaling.target_ongoing_requests}",
            )
        for option in ("--host", "--port"):
            _check(
                option not in self.serve_args,
                "serve_args",
                f"{option} is Serve's (its http_options), not a replica's",
            )

    @classmethod
    def from_options(cls, options: Mapping[str, object]) -> ClusterSettings:
        """From ``serve run microagent.cluster:app key=value ...`` or a config file's ``args``.

        Values may be strings (Serve's command line passes them so); ``serve_args`` may be
        one shell-quoted string; ``autoscaling`` a mapping of ``Autoscaling``'s fields.
        """
        fields = {f.name: f for f in attrs.fields(cls)}
        unknown = sorted(set(options) - set(fields))
        if unknown:
            raise ClusterConfigError(
                f"{unknown[0]}: not a setting (the settings are {', '.join(sorted(fields))})"
            )
        values: dict[str, object] = {}
        for key, raw in options.items():
            if key == "serve_args":
                values[key] = tuple(shlex.split(raw) if isinstance(raw, str) else _strings(raw))
            elif key == "autoscaling":
                values[key] = _autoscaling(raw)
            elif key in ("name", "routing"):
                values[key] = str(raw)
            else:
                values[key] = _number(key, raw, fields[key].type)
        return cls(**values)  # type: ignore[arg-type]


def _strings(raw: object) -> Sequence[str]:
    if not isinstance(raw, (list, tuple)) or not all(isinstance(a, str) for a in raw):
        raise ClusterConfigError("serve_args: a string or a list of strings")
    return raw


def _autoscaling(raw: object) -> Autoscaling | None:
    if raw is None or isinstance(raw, Autoscaling):
        return raw
    if not isinstance(raw, Mapping):
        raise ClusterConfigError("autoscaling: a mapping of min_replicas, max_replicas, ...")
    names = {f.name: f for f in attrs.fields(Autoscaling)}
    unknown = sorted(set(raw) - set(names))
    if unknown:
        raise ClusterConfigError(f"autoscaling.{unknown[0]}: not a setting")
    return Autoscaling(
        **{k: _number(f"autoscaling.{k}", v, names[k].type) for k, v in raw.items()}  # type: ignore[arg-type]
    )


def _number(field: str, raw: object, kind: object) -> int | float:
    want_int = kind in (int, "int")
    try:
        if isinstance(raw, bool):
            raise ValueError
        if want_int:
            value = int(raw) if isinstance(raw, (int, str)) else None
            if value is None or (isinstance(raw, str) and not raw.strip().lstrip("-").isdigit()):
                raise ValueError
            return value
        if isinstance(raw, (int, float, str)):
            return float(raw)
        raise ValueError
    except ValueError:
        kind_name = "an integer" if want_int else "a number"
        raise ClusterConfigError(f"{field}: must be {kind_name}, not {raw!r}") from None
