"""microagent on Ray Serve: routing keys, settings, and a real local Ray cluster.

The cluster tests start Ray in this process (``num_cpus=2``, fractional CPUs per
replica) with two engine replicas on the ScriptedEngine, behind the ingress,
and talk HTTP to Serve's proxy. They show that both replicas serve, that a
session sticks to its replica and reports cached tokens there, that sessions
spread, that a replica killed under 8 requests loses none of them, and that a
stream it was serving ends with the error event.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from _cluster import ADMIN_KEY, KEYS, Cluster, local_cluster
from microagent.cluster import (
    Autoscaling,
    ClusterConfigError,
    ClusterSettings,
    RouteHint,
    build_app,
    rendezvous,
    route_of,
)

TOKENS_PER_MINUTE = 20_000


# -- routing keys and settings (no cluster) -------------------------------------------------


def _chat(*messages: tuple[str, str], **extra: Any) -> bytes:
    body = {"model": "default", "messages": [{"role": r, "content": c} for r, c in messages]}
    return json.dumps({**body, **extra}).encode()


def test_every_turn_of_a_conversation_has_one_routing_key() -> None:
    first = _chat(("system", "You review code."), ("user", "Read this diff: ..."))
    later = _chat(
        ("system", "You review code."),
        ("user", "Read this diff: ..."),
        ("assistant", "It renames a field."),
        ("user", "Is that safe?"),
    )
    a, b = (
        route_of("/v1/chat/completions", first, "t1"),
        route_of("/v1/chat/completions", later, "t1"),
    )
    assert a.kind == b.kind == "prefix" and a.key == b.key
    other = route_of(
        "/v1/chat/completions", _chat(("system", "You review code."), ("user", "Another")), "t1"
    )
    assert other.key != a.key  # a different opening: another key
    assert route_of("/v1/chat/completions", first, "t2").key != a.key  # tenants never share


def test_a_prompt_cache_key_is_a_session_scoped_by_the_api_key() -> None:
    one = route_of("/v1/chat/completions", _chat(("user", "x"), prompt_cache_key="s1"), "t1")
    two = route_of("/v1/chat/completions", _chat(("user", "y"), prompt_cache_key="s1"), "t1")
    assert one.kind == "session" and one.key == two.key
    assert (
        route_of("/v1/chat/completions", _chat(("user", "x"), prompt_cache_key="s1"), "t2").key
        != one.key
    )
    responses = json.dumps({"model": "default", "input": "hi", "prompt_cache_key": "s1"}).encode()
    assert route_of("/v1/responses", responses, "t1").key == one.key


def test_requests_without_a_key_go_anywhere() -> None:
    assert route_of("/v1/chat/completions", b"{not json", "t").kind == "any"
    assert route_of("/v1/models", b"", "t").kind == "any"
    assert route_of("/metrics", b"", "t", pinned="r1") == RouteHint("replica", "r1")


def test_rendezvous_moves_only_the_keys_of_a_replica_that_leaves() -> None:
    replicas = ["r1", "r2", "r3"]
    keys = [f"k{i}" for i in range(600)]
    home = {k: rendezvous(k, replicas)[0] for k in keys}
    counts = {r: sum(1 for h in home.values() if h == r) for r in replicas}
    assert all(150 < c < 250 for c in counts.values()), counts  # spread evenly
    after = {k: rendezvous(k, ["r1", "r3"])[0] for k in keys}
    assert all(after[k] == home[k] for k in keys if home[k] != "r2")
    assert rendezvous("k1", replicas) == rendezvous("k1", list(reversed(replicas)))


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: ClusterSettings(replicas=0), "replicas"),
        (lambda: ClusterSettings(replica_cpus=0), "replica_cpus"),
        (
            lambda: ClusterSettings(max_ongoing_requests=8, affinity_max_queue=9),
            "affinity_max_queue",
        ),
        (lambda: ClusterSettings(serve_args=("--port", "9000")), "serve_args"),
        (lambda: Autoscaling(min_replicas=0), "min_replicas"),
        (lambda: Autoscaling(min_replicas=3, max_replicas=2), "max_replicas"),
        (lambda: Autoscaling(target_ongoing_requests=0), "target_ongoing_requests"),
        (
            lambda: ClusterSettings(
                max_ongoing_requests=8,
                affinity_max_queue=4,
                autoscaling=Autoscaling(target_ongoing_requests=16),
            ),
            "autoscaling.target_ongoing_requests",
        ),
        (lambda: ClusterSettings.from_options({"replica": 2}), "replica"),  # a typo
        (lambda: ClusterSettings.from_options({"replicas": "two"}), "replicas"),
        (lambda: ClusterSettings.from_options({"autoscaling": {"max": 3}}), "autoscaling.max"),
    ],
)
def test_a_bad_setting_is_refused_by_name(make: Any, field: str) -> None:
    with pytest.raises(ClusterConfigError, match=f"^{field}:"):
        make()


def test_settings_from_serves_command_line_strings() -> None:
    s = ClusterSettings.from_options(
        {"replicas": "3", "replica_cpus": "0.5", "serve_args": "--engine scripted --api-key 'a b'",
         "autoscaling": {"min_replicas": "1", "max_replicas": "4"}}
    )  # fmt: skip
    assert s.replicas == 3 and s.replica_cpus == 0.5
    assert s.serve_args == ("--engine", "scripted", "--api-key", "a b")
    assert s.autoscaling is not None and s.autoscaling.to_serve()["max_replicas"] == 4


def test_bad_serve_args_fail_before_ray_starts_anything() -> None:
    with pytest.raises(ValueError, match=r"serve_args: .*--no-such-option"):
        build_app(ClusterSettings(serve_args=("--no-such-option",)))


# -- a local Ray cluster ------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    settings = ClusterSettings(
        serve_args=(
            "--engine", "scripted",
            "--engine-arg", "decode_time_per_token=0.05",
            "--api-key", KEYS[0], "--api-key", KEYS[1], "--admin-key", ADMIN_KEY,
            "--key-tokens-per-minute", str(TOKENS_PER_MINUTE),
        ),
        replicas=2, replica_cpus=0.5, ingress_cpus=0.25, retry_deadline=60.0,
    )  # fmt: skip
    with local_cluster(settings) as running:
        yield running


def _question(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Question {i}: what is {i} plus {i}?"}]


@pytest.mark.ray
def test_two_replicas_serve_the_api_and_say_which(cluster: Cluster) -> None:
    seen = set()
    for i in range(12):
        r = cluster.chat(messages=_question(i))
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"]
        assert r.headers["x-microagent-route"] == "prefix"
        seen.add(r.headers["x-microagent-replica"])
    assert len(seen) == 2
    assert cluster.client.get("/v1/models").status_code == 401  # keys at the ingress
    models = cluster.client.get("/v1/models", headers={"authorization": f"Bearer {KEYS[1]}"})
    assert models.status_code == 200 and models.json()["data"][0]["id"]


@pytest.mark.ray
def test_a_session_stays_on_its_replica_and_hits_its_cache_there(cluster: Cluster) -> None:
    messages: list[dict[str, str]] = [
        {"role": "system", "content": "You keep a running tally. " * 20},
        {"role": "user", "content": "Start at 1."},
    ]
    replicas, cached = set(), []
    for turn in range(20):
        r = cluster.chat(messages=messages, prompt_cache_key="tally-1")
        assert r.status_code == 200, r.text
        assert r.headers["x-microagent-route"] == "session"
        replicas.add(r.headers["x-microagent-replica"])
        body = r.json()
        cached.append(body["usage"]["prompt_tokens_details"]["cached_tokens"])
        messages += [body["choices"][0]["message"], {"role": "user", "content": f"Add {turn}."}]
    assert len(replicas) == 1
    assert all(c > 0 for c in cached[1:]), cached  # each later turn reads its retained KV


@pytest.mark.ray
def test_sessions_spread_across_replicas(cluster: Cluster) -> None:
    homes: dict[str, set[str]] = {}
    for i in range(16):
        for _ in range(2):
            r = cluster.chat(messages=_question(100 + i), prompt_cache_key=f"s{i}")
            assert r.status_code == 200, r.text
            homes.setdefault(f"s{i}", set()).add(r.headers["x-microagent-replica"])
    assert all(len(h) == 1 for h in homes.values())
    assert len(set().union(*homes.values())) == 2


@pytest.mark.ray
def test_a_client_that_leaves_stops_its_replicas_request(cluster: Cluster) -> None:
    """Cancellation crosses both tiers: the client gives up on a 20-second request, and its
    replica's request ends long before it would have finished."""
    home = cluster.chat(messages=_question(400), prompt_cache_key="leaver").headers[
        "x-microagent-replica"
    ]
    impatient = httpx.Client(base_url=cluster.url, timeout=httpx.Timeout(60.0, read=2.0))
    body = {"model": "default", "messages": _question(401), "max_tokens": 400,
            "prompt_cache_key": "leaver"}  # fmt: skip
    started = time.monotonic()
    with contextlib.suppress(httpx.ReadTimeout):
        impatient.post("/v1/chat/completions", json=body,
                       headers={"authorization": f"Bearer {KEYS[0]}"})  # fmt: skip
    impatient.close()
    cluster.wait_running(home, 0, above=False)
    assert time.monotonic() - started < 15.0  # 400 tokens at 0.05 s each would take 20 s


@pytest.mark.ray
def test_the_ingress_counts_each_keys_tokens_from_its_replicas_usage(cluster: Cluster) -> None:
    """Quotas are the ingress's: it settles what each request used, as its replica reports.
    Key beta spends until its tokens per minute are gone (the 429 comes once the
    responses' own usage reaches the limit, not before); key alpha is unaffected."""
    document = " ".join(f"word{i}" for i in range(1500))
    spent, answers = 0, 0
    while True:
        r = cluster.chat(key=KEYS[1], messages=[{"role": "user", "content": document}])
        if r.status_code == 429:
            break
        assert r.status_code == 200, r.text
        spent += r.json()["usage"]["total_tokens"]
        answers += 1
        assert answers < 40, "the key's tokens per minute were never counted"
    assert spent >= TOKENS_PER_MINUTE, spent  # refused only once its use reached the limit
    assert r.json()["error"]["code"] == "tokens_per_minute_limit" and r.headers["retry-after"]
    assert cluster.chat(messages=_question(7)).status_code == 200  # another key's account
    bad = cluster.chat(key="gamma-key", messages=_question(7))
    assert bad.status_code == 401 and "API key" in bad.json()["error"]["message"]


@pytest.mark.ray
def test_a_replica_killed_under_eight_requests_loses_none(cluster: Cluster) -> None:
    first = cluster.chat(messages=_question(1), prompt_cache_key="victim")
    home = first.headers["x-microagent-replica"]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [
            pool.submit(
                cluster.chat, messages=_question(200 + i), prompt_cache_key="victim", max_tokens=120
            )
            for i in range(8)
        ]
        cluster.wait_running(home, 8)
        cluster.kill(home)
        answers = [f.result() for f in futures]
    assert [a.status_code for a in answers] == [200] * 8, [a.text for a in answers]
    assert {a.headers["x-microagent-replica"] for a in answers}.isdisjoint({home})
    assert all(a.json()["choices"][0]["message"]["content"] for a in answers)


@pytest.mark.ray
def test_a_stream_whose_replica_dies_ends_with_the_error_event(cluster: Cluster) -> None:
    payload = {
        "model": "default",
        "messages": _question(300),
        "max_tokens": 400,
        "stream": True,
        "prompt_cache_key": "streamed",
    }
    headers = {"authorization": f"Bearer {KEYS[0]}"}
    with cluster.client.stream("POST", "/v1/chat/completions", json=payload, headers=headers) as r:
        assert r.status_code == 200
        home = r.headers["x-microagent-replica"]
        lines = r.iter_lines()
        data: list[str] = []
        for line in lines:
            if line.startswith("data: ") and '"content"' in line:
                data.append(line)
                break
        cluster.kill(home)
        data += [line for line in lines if line.startswith("data: ")]
    assert data[-1] == "data: [DONE]"
    error = json.loads(data[-2][len("data: ") :])
    assert error["error"]["code"] == "replica_lost", data[-3:]


def test_the_command_line_builds_its_settings_and_refuses_bad_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``python -m microagent.cluster``: its own options before ``--``, ``microagent serve``'s
    after; a bad value exits 2 with the field's name before Ray starts."""
    from microagent.cluster.__main__ import _parser, main, settings_from

    args = _parser().parse_args(["--replicas", "3", "--autoscale", "1:4", "--replica-cpus", "0.5"])
    settings = settings_from(args, ["--engine", "scripted"])
    assert settings.serve_args == ("--engine", "scripted") and settings.replica_cpus == 0.5
    assert settings.autoscaling is not None and settings.autoscaling.max_replicas == 4
    assert main(["--autoscale", "4:1", "--", "--engine", "scripted"]) == 2
    assert "max_replicas" in capsys.readouterr().err
    assert main(["--replicas", "2", "--", "--no-such-option"]) == 2
    assert "serve_args" in capsys.readouterr().err
