"""A preset run on the real default model by clients that can only name a model.

The openai SDK (no ``extra_body``) and LiteLLM's ``openai/`` provider (in the
client environment of ``test_clients``) send ``model: "vote2"`` and nothing
else of microagent's; the replies prove a collaboration ran, not one
generation: two agents' records, and usage that is their sum.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest
from _engine import RealEngine
from microagent.server._presets import load_presets, preset_option
from openai.types.chat import ChatCompletionMessageParam
from test_clients import client_python, run_client
from test_server_helpers import LiveServer, real_server

pytestmark = [pytest.mark.engine]

QUESTION = "Is 7 a prime number? Answer yes or no."
#: two voters on a closed question, both always run (the smallest real collaboration)
VOTE2 = {
    "agents": [{"name": "voter", "count": 2}],
    "collaboration": {"mode": "vote", "answer": {"choices": ["yes", "no"]}, "early_stop": False},
}


@pytest.fixture(scope="module")
def server(
    real_engine: RealEngine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    path = tmp_path_factory.mktemp("presets") / "vote2.json"
    path.write_text(json.dumps(VOTE2), encoding="utf-8")
    presets = load_presets([preset_option(f"vote2={path}")])
    with real_server(real_engine, presets=presets) as srv:
        yield srv
    real_engine.assert_idle(30)


def test_the_openai_sdk_runs_a_preset_by_its_model_name(server: LiveServer) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    assert "vote2" in [m.id for m in client.models.list()]
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": QUESTION}]

    reply = client.chat.completions.create(
        model="vote2",
        messages=messages,
        max_tokens=8,
    )
    assert reply.model == "vote2"
    assert reply.choices[0].message.content in ("yes", "no")
    collaboration = (reply.model_extra or {})["collaboration"]
    agents = collaboration["agents"]
    assert collaboration["mode"] == "vote" and len(agents) == 2
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == sum(a["prompt_tokens"] for a in agents)
    assert all(a["prompt_tokens"] > 0 and a["completion_tokens"] > 0 for a in agents)

    chunks = list(
        client.chat.completions.create(
            model="vote2",
            messages=messages,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks and all(c.model == "vote2" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text in ("yes", "no")
    last = [c for c in chunks if (c.model_extra or {}).get("collaboration")][-1]
    streamed_agents = (last.model_extra or {})["collaboration"]["agents"]
    assert len(streamed_agents) == 2
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.prompt_tokens == sum(a["prompt_tokens"] for a in streamed_agents)


def test_the_openai_sdk_runs_a_preset_on_responses(server: LiveServer) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    response = client.responses.create(model="vote2", input=QUESTION, max_output_tokens=8)
    assert response.model == "vote2" and response.status == "completed"
    assert response.output_text in ("yes", "no")
    agents = (response.model_extra or {})["collaboration"]["agents"]
    assert len(agents) == 2 and response.usage is not None
    assert response.usage.input_tokens == sum(a["prompt_tokens"] for a in agents)

    with client.responses.stream(model="vote2", input=QUESTION, max_output_tokens=8) as stream:
        final = stream.get_final_response()
    assert final.model == "vote2" and final.output_text in ("yes", "no")
    assert final.usage is not None and final.usage.input_tokens > 0


@pytest.mark.clients
def test_litellm_runs_a_preset_by_its_model_name(server: LiveServer) -> None:
    """LiteLLM's reply has the usage of the collaboration the openai SDK sees for the same
    request (two agents, deterministic prompts), so its request ran it too."""
    out = run_client(client_python(), "litellm_preset.py", f"{server.url}/v1", "vote2")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    seen = client.chat.completions.create(
        model="vote2",
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=8,
    )
    assert seen.usage is not None and len((seen.model_extra or {})["collaboration"]["agents"]) == 2
    assert out["text"] in ("yes", "no") and out["stream_text"] in ("yes", "no"), out
    assert out["model"].endswith("vote2") and out["responses_model"] == "vote2", out
    assert out["responses_text"] in ("yes", "no"), out
    assert out["usage"]["prompt_tokens"] == seen.usage.prompt_tokens, out
    assert out["stream_usage"]["prompt_tokens"] == seen.usage.prompt_tokens, out
    assert out["responses_usage"]["input_tokens"] == seen.usage.prompt_tokens, out
