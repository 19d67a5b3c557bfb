"""Every issue-14 strategy end to end over HTTP (the openai SDK) on the real default model.

Also the published configuration (``bench/results/quality_best.json``, and the free
file), sent as it is through the SDK's ``extra_body`` with only ``answer.choices``
added, to a server started with the files' ``serve_args``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from _engine import RealEngine
from microagent.collab import calculator_tool
from microagent.server import ServerLimits, serve_options
from test_server_helpers import LiveServer, live_server

pytestmark = pytest.mark.engine

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
BEST = RESULTS / "quality_best.json"
BEST_FREE = RESULTS / "quality_best_free.json"
QUESTION = [{"role": "user", "content": "Is a dog an animal or a fruit?"}]
CHOICES = ["animal", "fruit"]
#: strategy -> (agents, collaboration without answer.choices, what details must show)
STRATEGIES: dict[str, tuple[list[dict[str, Any]], dict[str, Any], str]] = {
    "debias order": (
        [{"name": "voter", "count": 2}],
        {"mode": "vote", "style": "direct", "debias": "order"},
        "debias",
    ),
    "debias labels": (
        [{"name": "voter", "count": 2}],
        {"mode": "vote", "style": "direct", "debias": "labels"},
        "debias",
    ),
    "soft": (
        [{"name": "voter", "count": 2}],
        {"mode": "vote", "style": "direct", "soft": True},
        "soft",
    ),
    "soft calibrated": (
        [{"name": "voter", "count": 2}],
        {
            "mode": "vote",
            "style": "direct",
            "soft": True,
            "debias": "order",
            "calibrate": "position",
        },
        "soft",
    ),
    "soft content-calibrated": (
        [{"name": "voter", "count": 2}],
        {
            "mode": "vote",
            "style": "direct",
            "soft": True,
            "debias": "order",
            "calibrate": "content",
        },
        "soft",
    ),
    "adaptive": (
        [{"name": "voter", "count": 4}],
        {"mode": "vote", "style": "direct", "adaptive": "beta", "wave": 2},
        "samples",
    ),
    "best_of self": (
        [{"name": "candidate", "count": 2}],
        {"mode": "best_of", "judge": "self"},
        "candidates",
    ),
    "best_of likelihood": (
        [{"name": "candidate", "count": 2}],
        {"mode": "best_of", "judge": "likelihood"},
        "candidates",
    ),
    "best_of likelihood adaptive": (
        [{"name": "greedy", "count": 1, "temperature": 0.0}, {"name": "sampled", "count": 2}],
        {"mode": "best_of", "judge": "likelihood", "adaptive": True},
        "candidates",
    ),
    "auto": ([{"name": "agent", "count": 2}], {"mode": "auto"}, "strategy"),
}


@pytest.fixture(scope="module")
def server(real_engine: RealEngine) -> Iterator[LiveServer]:
    bridge = real_engine.bridge
    with live_server(
        lambda: {bridge.model: bridge}, portal=real_engine.portal, open_engines=False
    ) as srv:
        yield srv


def client(srv: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=300)


def ask(srv: LiveServer, body: dict[str, Any], max_tokens: int = 8) -> dict[str, Any]:
    done = client(srv).chat.completions.create(
        model="default",
        messages=QUESTION,  # type: ignore[arg-type]
        max_tokens=max_tokens,
        extra_body=body,
    )
    collab: dict[str, Any] = done.model_extra["collaboration"]  # type: ignore[index]
    assert done.choices[0].message.content == collab["answer"]
    return collab


@pytest.fixture(scope="module")
def published_server(real_engine: RealEngine) -> Iterator[LiveServer]:
    """A server started with the published files' ``serve_args`` (``--calculator``)."""
    args = serve_options(
        sorted({a for f in (BEST, BEST_FREE) for a in json.loads(f.read_text())["serve_args"]})
    )
    bridge = real_engine.bridge
    with live_server(
        lambda: {bridge.model: bridge},
        portal=real_engine.portal,
        open_engines=False,
        limits=ServerLimits(allow_calculator=args.calculator),
        tools=[calculator_tool()] if args.calculator else [],
    ) as srv:
        yield srv


@pytest.mark.parametrize(
    ("path", "question", "choices", "path_taken"),
    [
        (BEST, "What is 37 + 48?", ["83", "85", "87"], "computed"),
        (BEST, "Is a dog an animal or a fruit?", CHOICES, "direct"),
        (BEST_FREE, "What is 12 + 9? Reply with the number only.", None, "computed"),
    ],
)
def test_the_published_configuration_works_as_it_is_through_extra_body(
    path: Path,
    question: str,
    choices: list[str] | None,
    path_taken: str,
    published_server: LiveServer,
    real_engine: RealEngine,
) -> None:
    best = json.loads(path.read_text())
    body = {k: v for k, v in best.items() if k != "serve_args"}
    if choices is not None:
        body["collaboration"] = {**best["collaboration"], "answer": {"choices": choices}}
    done = client(published_server).chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": question}],
        max_tokens=12,
        extra_body=body,
    )
    collab: dict[str, Any] = done.model_extra["collaboration"]  # type: ignore[index]
    details = collab["details"]
    assert done.choices[0].message.content == collab["answer"]
    assert details["path"] == path_taken
    if choices is not None:
        assert collab["answer"] in choices
    if path_taken == "computed":  # the answer is the value of what the model wrote
        (entry,) = details["expressions"]
        assert entry["answer"] == collab["answer"] and "value" in entry
    real_engine.assert_idle()


def test_a_server_without_the_calculator_refuses_the_published_configuration(
    server: LiveServer,
) -> None:
    best = json.loads(BEST.read_text())
    body = {k: v for k, v in best.items() if k != "serve_args"}
    with pytest.raises(openai.BadRequestError, match="--calculator"):
        client(server).chat.completions.create(
            model="default", messages=QUESTION, max_tokens=8, extra_body=body
        )


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_each_strategy_runs_over_http(
    name: str, server: LiveServer, real_engine: RealEngine
) -> None:
    agents, collaboration, shown = STRATEGIES[name]
    body = {"agents": agents, "collaboration": {**collaboration, "answer": {"choices": CHOICES}}}
    collab = ask(server, body)
    assert collab["answer"] in CHOICES
    assert shown in collab["details"]
    real_engine.assert_idle()


def test_best_of_with_a_validator_runs_over_http(
    server: LiveServer, real_engine: RealEngine
) -> None:
    body = {
        "agents": [{"name": "candidate", "count": 2}],
        "collaboration": {"mode": "best_of", "validator": {"type": "json"}},
    }
    collab = ask(server, body, 24)
    assert "validator" in collab["details"]["scored_by"]
    assert isinstance(collab["details"]["valid"], bool)
    real_engine.assert_idle()


def test_vote_on_the_extracted_number_runs_over_http(
    server: LiveServer, real_engine: RealEngine
) -> None:
    done = client(server).chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "What is 3 + 4? Reply with the number only."}],
        max_tokens=12,
        extra_body={
            "agents": [{"name": "voter", "count": 3}],
            "collaboration": {
                "mode": "vote",
                "style": "direct",
                "early_stop": False,
                "answer": {"extract": "number"},
            },
        },
    )
    collab: dict[str, Any] = done.model_extra["collaboration"]  # type: ignore[index]
    votes: dict[str, int] = collab["votes"]
    # every vote is a bare number (or the reply named none and abstained)
    assert all(key.lstrip("-").replace(".", "").isdigit() for key in votes), votes
    assert sum(votes.values()) <= 3
    assert collab["answer"] == (max(votes, key=lambda k: votes[k]) if votes else "")
    real_engine.assert_idle()
