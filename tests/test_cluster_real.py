"""microagent on Ray Serve with the real engine: two replicas of the default model.

A smoke test of the whole path (``tests/test_cluster.py`` has the routing and
failover tests on the ScriptedEngine): a local Ray cluster, two engine replicas of
SmolLM2-135M (vLLM on CPU, half a core each), a collaboration answered on each,
and a session whose second turn reads its first turn's KV on the same replica.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _cluster import Cluster, local_cluster
from microagent.cluster import ClusterSettings


@pytest.fixture(scope="module")
def real_cluster() -> Iterator[Cluster]:
    """Two engine replicas of the default model (vLLM on CPU), each with half the cores."""
    settings = ClusterSettings(
        serve_args=(
            "--model", "default", "--max-num-seqs", "8", "--max-model-len", "2048",
            "--engine-arg", "num_gpu_blocks_override=64",
        ),
        replicas=2, replica_cpus=0.5, ingress_cpus=0.25,
    )  # fmt: skip
    with local_cluster(settings) as running:
        yield running


@pytest.mark.ray
@pytest.mark.engine
def test_two_real_replicas_answer_a_collaboration_each_and_keep_a_session(
    real_cluster: Cluster,
) -> None:
    served: set[str] = set()
    for i in range(8):  # distinct openings: both replicas get some
        r = real_cluster.client.post(
            "/v1/chat/completions",
            json={
                "model": "default",
                "messages": [{"role": "user", "content": f"({i}) Is {7 + 2 * i} a prime number?"}],
                "max_tokens": 8,
                "agents": [{"name": "voter", "count": 2}],
                "collaboration": {"mode": "vote", "answer": {"choices": ["yes", "no"]}},
            },
        )
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] in ("yes", "no")
        served.add(r.headers["x-microagent-replica"])
        if len(served) == 2:
            break
    assert len(served) == 2, "every collaboration went to one replica"
    messages = [
        {"role": "system", "content": "You are a patient tutor. " * 40},
        {"role": "user", "content": "What is 2 + 2?"},
    ]
    first = real_cluster.chat(messages=messages, prompt_cache_key="tutor", max_tokens=8)
    assert first.status_code == 200, first.text
    messages += [first.json()["choices"][0]["message"], {"role": "user", "content": "And 3 + 3?"}]
    second = real_cluster.chat(messages=messages, prompt_cache_key="tutor", max_tokens=8)
    assert second.status_code == 200, second.text
    assert second.headers["x-microagent-replica"] == first.headers["x-microagent-replica"]
    assert second.headers["x-microagent-route"] == "session"
    cached = second.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 256, cached  # the first turn's whole blocks (128 tokens each on CPU)
