"""The OpenAPI schema documents ``agents`` and ``collaboration``; fuzzing it finds no 5xx."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from microagent.collab import AgentSpec
from microagent.server import ServerLimits, create_app
from microagent.testing import ScriptedEngine
from starlette.testclient import TestClient
from strategies import chat_request_bodies


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    engine = ScriptedEngine(reply_words=(1, 4))
    app = create_app(
        {"scripted": engine},
        limits=ServerLimits(max_agents_per_spec=6, max_total_agents=8),
        open_engines=True,
    )
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def test_openapi_schema_has_agents_and_collaboration(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    op = schema["paths"]["/v1/chat/completions"]["post"]
    ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    components = schema["components"]["schemas"]
    request = components[ref]["properties"]
    assert {"messages", "model", "stream", "max_tokens", "agents", "collaboration"} <= set(request)
    agents = request["agents"]["anyOf"][0]
    agent = agents["items"]["properties"]
    assert {
        "name",
        "count",
        "instructions",
        "adapter",
        "model",
        "temperature",
        "max_tokens",
    } <= set(agent)
    collab = components["CollaborationModel"]["properties"]
    assert {"mode", "early_stop", "rounds", "answer"} <= set(collab)
    for path in ("/health", "/v1/models", "/metrics"):
        assert path in schema["paths"]


def test_openapi_agent_bounds_are_agent_spec_bounds(client: TestClient) -> None:
    """The document's agent schema is derived from ``AgentSpec``: every bound is the same."""
    schema = client.get("/openapi.json").json()
    ref = schema["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"][
        "application/json"
    ]["schema"]["$ref"]
    request = schema["components"]["schemas"][ref.rsplit("/", 1)[-1]]["properties"]
    documented = request["agents"]["anyOf"][0]["items"]
    assert documented["additionalProperties"] is False and documented["required"] == ["name"]
    rules = AgentSpec.field_rules()
    assert list(documented["properties"]) == list(rules)
    keys = ("minimum", "maximum", "exclusiveMinimum", "minLength", "maxLength", "type")
    for name, rule in rules.items():
        expected = {k: v for k, v in rule.json_schema().items() if k in keys}
        if name == "count":  # this server's own, tighter cap (ServerLimits.max_agents_per_spec)
            expected["maximum"] = 6
        got = {k: v for k, v in documented["properties"][name].items() if k in keys}
        assert got == expected, name
    assert documented["properties"]["temperature"]["minimum"] == rules["temperature"].minimum == 0
    assert documented["properties"]["temperature"]["maximum"] == rules["temperature"].maximum == 2
    # graph nodes document the same bounds for the fields they share with an agent
    collaboration = schema["components"]["schemas"]["CollaborationModel"]["properties"]
    node = collaboration["nodes"]["items"]["oneOf"][1]["properties"]
    for name in ("temperature", "max_tokens", "count", "name"):
        assert {k: v for k, v in node[name].items() if k in keys} == {
            k: v for k, v in rules[name].json_schema().items() if k in keys
        }


def test_openapi_schema_documents_the_graph(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    collaboration = schema["components"]["schemas"]["CollaborationModel"]["properties"]
    assert {"nodes", "edges", "entry", "output"} <= set(collaboration)
    edge = collaboration["edges"]["items"]
    assert edge["required"] == ["from", "to"] and "max_iterations" in edge["properties"]


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=chat_request_bodies())
def test_fuzzed_requests_never_get_a_5xx(client: TestClient, body: Any) -> None:
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code < 500, (body, r.text)
    if r.status_code >= 400:
        error = r.json()["error"]
        assert error["message"]
        assert error["type"] == "invalid_request_error"
    elif isinstance(body, dict) and body.get("stream") is True:
        assert r.text.rstrip().endswith("data: [DONE]")
    else:
        assert r.json()["object"] == "chat.completion"


def test_fuzz_leaves_the_engine_idle(client: TestClient) -> None:
    client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    engine = client.app.state.microagent.engines["scripted"]  # type: ignore[attr-defined]
    assert not engine.live_requests()
    assert client.get("/health").json()["status"] == "ok"


def test_non_finite_numbers_are_400(client: TestClient) -> None:
    raw = b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e999}'
    r = client.post(
        "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
    )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "temperature"


def test_openapi_documents_the_errors_the_server_sends(client: TestClient) -> None:
    """Validation errors are 400 with one error body; the document says so (its 422 is a
    graph left without an answer, never FastAPI's validation error)."""
    schema = client.get("/openapi.json").json()
    responses = schema["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert {"200", "400", "401", "413", "422", "429", "500", "503", "504"} <= set(responses)
    assert "no_answer" in responses["422"]["description"]
    assert "HTTPValidationError" not in json.dumps(schema)
    request = schema["components"]["schemas"]["ChatCompletionRequest"]
    assert request["properties"]["messages"]["minItems"] == 1
    assert request["additionalProperties"] is False
    r = client.post("/v1/chat/completions", json={"messages": []})
    assert r.status_code == 400
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_an_empty_tools_list_with_agents_is_accepted_as_the_document_says(
    client: TestClient,
) -> None:
    """``tools: []`` with agents means no client tools (it was a 400 the document did not state)."""
    body = {
        "messages": [{"role": "user", "content": "yes or no?"}],
        "max_tokens": 4,
        "agents": [{"name": "voter", "count": 2}],
        "tools": [],
    }
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    body["tools"] = [{"type": "function", "function": {"name": "f"}}]
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"


def test_the_document_states_the_rules_the_server_checks(client: TestClient) -> None:
    """tool_call_id on tool messages, tools with agents and the registered modes are schema."""
    import jsonschema
    from microagent.collab import collaboration_modes

    document = client.get("/openapi.json").json()
    request = jsonschema.Draft202012Validator(
        {"$ref": "#/components/schemas/ChatCompletionRequest", **document}
    )
    user = {"role": "user", "content": "hi"}
    assert not request.is_valid({"messages": [user, {"role": "tool", "content": "x"}]})
    assert not request.is_valid({"messages": [{**user, "tool_call_id": "a"}]})
    agents = {"messages": [user], "agents": [{"name": "a"}]}
    assert request.is_valid({**agents, "tools": []})
    assert not request.is_valid(
        {**agents, "tools": [{"type": "function", "function": {"name": "f"}}]}
    )
    modes = document["components"]["schemas"]["CollaborationModel"]["properties"]["mode"]["enum"]
    assert modes == collaboration_modes()
    assert not request.is_valid({**agents, "collaboration": {"mode": "no-such-mode"}})
