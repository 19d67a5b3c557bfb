"""vote's agreement gate: greedy, abstain or escalate below it, and the abstention over HTTP."""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from microagent.collab import AgentSpec, InvalidCollaboration, collaborate, prepare_collaboration
from microagent.collab.modes import NO_CONFIDENT_ANSWER
from microagent.engine_bridge import EngineRequest
from microagent.testing import ScriptedEngine
from test_server_helpers import LiveServer, live_server

QUESTION = "Is the answer yes, no or maybe?"
CHOICES = {"choices": ["yes", "no", "maybe"]}
_VOTER = re.compile(r"voter number (\d+)")


def by_voter(answers: list[str], greedy: str = "maybe") -> Any:
    """Voter ``i`` (its instructions name its number) answers ``answers[i]``; a
    temperature-0 answer step (the greedy call below the gate) answers ``greedy``."""

    def script(prompt: tuple[int, ...], request: EngineRequest) -> str | None:
        if request.sampling.temperature == 0:
            return greedy
        found = _VOTER.findall(request.prompt.text)
        return answers[int(found[-1])] if found else greedy

    return script


def voters(n: int) -> list[AgentSpec]:
    return [AgentSpec(f"v{i}", instructions=f"You are voter number {i}.") for i in range(n)]


async def run_vote(answers: list[str], **options: Any) -> tuple[Any, ScriptedEngine]:
    async with ScriptedEngine(script=by_voter(answers)) as engine:
        outcome = await collaborate(
            engine,
            "vote",
            QUESTION,
            voters(len(answers)),
            answer=CHOICES,
            style="direct",
            **options,
        )
        assert engine.live_requests() == frozenset()
    return outcome, engine


@pytest.mark.anyio
async def test_a_reached_gate_answers_the_majority_without_another_call() -> None:
    outcome, engine = await run_vote(["yes", "yes", "no", "yes", "no"], gate=0.6, early_stop=False)
    assert outcome.answer == "yes"
    assert outcome.details["agreement"] == 0.6 and outcome.details["abstained"] is False
    assert "below_gate" not in outcome.details
    assert len(engine.history) == 5  # no greedy call
    assert all(r.sampling.temperature != 0 for r in engine.history)


@pytest.mark.anyio
async def test_below_the_gate_greedy_answers_as_the_single_greedy_call_does() -> None:
    async with ScriptedEngine(script=by_voter(["yes", "no", "yes", "no", "maybe"])) as engine:
        outcome = await collaborate(
            engine,
            "vote",
            QUESTION,
            voters(5),
            answer=CHOICES,
            style="direct",
            gate=0.5,
            early_stop=False,  # the full vote: its agreement does not hang on arrival order
        )
        greedy_call = engine.history[-1]
        # the reference: a one-voter direct vote of the first voter's spec at temperature 0
        single = await collaborate(
            engine,
            "vote",
            QUESTION,
            voters(1),
            answer=CHOICES,
            style="direct",
            temperature=0.0,
        )
        reference = engine.history[-1]
    assert outcome.details["agreement"] == 0.4 and outcome.details["below_gate"] == "greedy"
    assert outcome.votes == {"yes": 2, "no": 2, "maybe": 1}
    assert outcome.answer == single.answer == "maybe"  # greedy's, not the leader "yes"
    assert len(engine.history) == 7  # 5 votes, the greedy call, the reference
    assert greedy_call.prompt.token_ids == reference.prompt.token_ids
    assert greedy_call.sampling.temperature == reference.sampling.temperature == 0
    assert greedy_call.sampling.choices == reference.sampling.choices
    assert greedy_call.sampling.max_tokens == reference.sampling.max_tokens


@pytest.mark.anyio
async def test_a_free_answer_is_gated_on_its_normalised_form() -> None:
    # "Paris." and "paris" normalise alike: 3 of 4 agree, above a 0.7 gate
    answers = ["Paris.", "paris", "Lyon", "PARIS"]

    def script(prompt: tuple[int, ...], request: EngineRequest) -> str | None:
        return answers[int(_VOTER.findall(request.prompt.text)[-1])]

    async with ScriptedEngine(script=script) as engine:
        outcome = await collaborate(
            engine,
            "vote",
            "Capital of France?",
            voters(4),
            style="direct",
            gate=0.7,
            early_stop=False,
        )
    assert outcome.answer == "paris" and outcome.details["agreement"] == 0.75
    async with ScriptedEngine(script=script) as engine:
        gated = await collaborate(
            engine,
            "vote",
            "Capital of France?",
            voters(4),
            style="direct",
            gate=0.8,
            below="abstain",
            early_stop=False,
        )
    assert gated.answer == NO_CONFIDENT_ANSWER and gated.details["abstained"] is True


@pytest.mark.anyio
async def test_abstain_answers_the_fixed_content_with_the_flag_and_agreement() -> None:
    outcome, engine = await run_vote(
        ["yes", "no", "yes", "no", "maybe"], gate=0.5, below="abstain", early_stop=False
    )
    assert outcome.answer == NO_CONFIDENT_ANSWER == "No confident answer."
    assert outcome.details["abstained"] is True and outcome.details["agreement"] == 0.4
    assert outcome.details["below_gate"] == "abstain"
    assert len(engine.history) == 5  # no greedy call


@pytest.mark.anyio
async def test_escalate_adds_waves_until_the_gate_is_reached() -> None:
    # waves of 3: (no yes maybe) 1/3 < 0.6, (no no no) 4/6 = 0.67: stop, 3 never started
    # ("yes" could still tie "no" and wins ties as the first choice: no exact stop)
    answers = ["no", "yes", "maybe", "no", "no", "no", "yes", "yes", "yes"]
    outcome, engine = await run_vote(answers, gate=0.6, below="escalate", wave=3)
    assert outcome.answer == "no" and outcome.details["waves"] == 2
    assert outcome.details["stopped_by"] == "gate" and outcome.details["samples"] == 6
    assert outcome.details["agreement"] == pytest.approx(0.6667, abs=1e-4)
    assert len(engine.history) == 6 and "below_gate" not in outcome.details
    # the same votes under a 0.9 gate: every wave runs, then greedy answers
    outcome, engine = await run_vote(answers, gate=0.9, below="escalate", wave=3)
    assert outcome.details["waves"] == 3 and outcome.details["samples"] == 9
    assert outcome.details["agreement"] == pytest.approx(4 / 9, abs=1e-4)
    assert outcome.details["below_gate"] == "greedy" and outcome.answer == "maybe"
    assert len(engine.history) == 10 and engine.history[-1].sampling.temperature == 0


@pytest.mark.anyio
async def test_escalate_waits_for_the_gate_before_an_adaptive_stop() -> None:
    # window rule alone stops after wave 2 (no no); the gate (0.7) needs wave 3 as well
    answers = ["yes", "no", "no", "no", "no", "no"]
    plain, _ = await run_vote(answers, adaptive="window", wave=2)
    assert plain.details["samples"] == 4 and plain.details["stopped_by"] == "window"
    gated, _ = await run_vote(answers, adaptive="window", wave=2, gate=0.8, below="escalate")
    assert gated.details["samples"] == 6 and gated.details["agreement"] == pytest.approx(
        5 / 6, abs=1e-4
    )
    assert gated.answer == "no"


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"gate": 0}, "collaboration.gate"),
        ({"gate": 1.5}, "collaboration.gate"),
        ({"gate": True}, "collaboration.gate"),
        ({"gate": "high"}, "collaboration.gate"),
        ({"gate": 0.6, "below": "guess"}, "collaboration.below"),
        ({"below": "abstain"}, "collaboration.below"),  # no gate to be below
    ],
)
def test_bad_gate_options_name_their_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidCollaboration) as info:
        prepare_collaboration("vote", None, options)
    assert info.value.field == field


# --- over HTTP: the abstention is never silently dropped ------------------------------

_ABSTAIN = {
    "agents": [{"name": "v", "count": 3}],
    "collaboration": {
        "mode": "vote",
        "style": "direct",
        "answer": CHOICES,
        "gate": 0.9,
        "below": "abstain",
    },
}


_ANSWERED = itertools.count()


def _split(ids: Any, request: EngineRequest) -> str | None:
    """Every three answers in a row disagree (yes, no, maybe, in arrival order)."""
    return ("yes", "no", "maybe")[next(_ANSWERED) % 3]


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(lambda: {"scripted": ScriptedEngine(script=_split)}) as srv:
        yield srv


def _chat(srv: LiveServer, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{srv.url}/v1/chat/completions", json=body, headers=srv.headers, timeout=30)


def test_chat_renders_the_abstention_with_its_flag(server: LiveServer) -> None:
    r = _chat(server, {"messages": [{"role": "user", "content": QUESTION}], **_ABSTAIN})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["message"]["content"] == NO_CONFIDENT_ANSWER
    details = body["collaboration"]["details"]
    assert details["abstained"] is True and details["agreement"] == pytest.approx(1 / 3, 1e-3)


def test_a_streamed_chat_carries_the_flag_on_its_last_chunk(server: LiveServer) -> None:
    body = {"messages": [{"role": "user", "content": QUESTION}], "stream": True, **_ABSTAIN}
    r = _chat(server, body)
    assert r.status_code == 200, r.text
    chunks = [
        json.loads(line[len("data: ") :])
        for line in r.text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    content = "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices")
    )
    assert content == NO_CONFIDENT_ANSWER
    (last,) = [c for c in chunks if "collaboration" in c]
    assert last["collaboration"]["details"]["abstained"] is True
    assert last["collaboration"]["details"]["agreement"] == pytest.approx(1 / 3, 1e-3)


def test_responses_render_the_abstention_with_its_flag(server: LiveServer) -> None:
    api = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    done = api.responses.create(model="scripted", input=QUESTION, extra_body=_ABSTAIN)
    assert done.output_text == NO_CONFIDENT_ANSWER
    details = (done.model_extra or {})["collaboration"]["details"]
    assert details["abstained"] is True and details["agreement"] == pytest.approx(1 / 3, 1e-3)


def test_a_streamed_response_carries_the_flag_on_its_completed_event(server: LiveServer) -> None:
    body = {"model": "scripted", "input": QUESTION, "stream": True, **_ABSTAIN}
    r = httpx.post(f"{server.url}/v1/responses", json=body, headers=server.headers, timeout=30)
    assert r.status_code == 200, r.text
    events = [
        json.loads(line[len("data: ") :])
        for line in r.text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    (done,) = [e for e in events if e["type"] == "response.completed"]
    response = done["response"]
    assert response["output"][0]["content"][0]["text"] == NO_CONFIDENT_ANSWER
    details = response["collaboration"]["details"]
    assert details["abstained"] is True and details["agreement"] == pytest.approx(1 / 3, 1e-3)


@pytest.mark.parametrize(
    ("options", "param"),
    [({"gate": 2}, "collaboration.gate"), ({"gate": 0.5, "below": "x"}, "collaboration.below")],
)
def test_bad_gate_options_get_a_400_naming_the_field(
    server: LiveServer, options: dict[str, Any], param: str
) -> None:
    collaboration = {**_ABSTAIN["collaboration"], **options}  # type: ignore[dict-item]
    body = {
        "messages": [{"role": "user", "content": QUESTION}],
        "agents": _ABSTAIN["agents"],
        "collaboration": collaboration,
    }
    r = _chat(server, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


@pytest.mark.anyio
async def test_logprob_records_the_greedy_answers_summed_token_logprob() -> None:
    async with ScriptedEngine(script=by_voter([], greedy="maybe")) as engine:
        closed = await collaborate(
            engine,
            "vote",
            QUESTION,
            voters(1),
            answer=CHOICES,
            style="direct",
            temperature=0.0,
            logprob=True,
        )
        (call,) = engine.history
        free = await collaborate(
            engine, "auto", QUESTION, [AgentSpec("agent")], temperature=0.0, logprob=True
        )
        plain = await collaborate(engine, "auto", QUESTION, [AgentSpec("agent")], temperature=0.0)
        n = len(engine.tokenize("maybe"))
    assert call.sampling.logprobs == 0
    score = closed.details["answer_logprob"]
    # the made-up logprobs: each sampled token has p in [0.5, 0.95]; the end-of-turn token
    # is left out, so the sum covers the answer's n tokens only
    assert isinstance(score, float) and n * math.log(0.5) <= score <= n * math.log(0.95)
    assert free.details["strategy"] == "single" and free.details["answer_logprob"] < 0
    assert "answer_logprob" not in plain.details and engine.history[-1].sampling.logprobs is None


def test_the_openapi_document_lists_the_gate_options_from_vote_config(
    server: LiveServer,
) -> None:
    document = httpx.get(f"{server.url}/openapi.json", timeout=30).json()
    model = document["components"]["schemas"]["CollaborationModel"]
    (vote,) = [r for r in model["allOf"] if r["if"]["properties"]["mode"]["const"] == "vote"]
    assert {"gate", "below", "logprob"} <= set(vote["then"]["propertyNames"]["enum"])
    (auto,) = [r for r in model["allOf"] if r["if"]["properties"]["mode"]["const"] == "auto"]
    assert "logprob" in auto["then"]["propertyNames"]["enum"]
    assert "gate" not in auto["then"]["propertyNames"]["enum"]
    assert "below [greedy|abstain|escalate]" in model["description"]
