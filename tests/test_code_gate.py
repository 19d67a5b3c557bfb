"""One gate for client code: every place a spec can carry code is refused unless the
server allows it, and the places are found by walking the OpenAPI document.

The reported escape: ``--allow-code-validators`` guarded ``collaboration.validator``
only, so a graph edge's ``when: {"validator": {"type": "python_tests"}}`` ran the
client's code (200) on a server that had not allowed it.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from microagent.collab import (
    CodePolicy,
    InvalidCollaboration,
    code_policy,
    prepare_collaboration,
    python_tests_validator,
)
from microagent.collab._calculator import calculate
from microagent.collab._validators import run_validator
from microagent.server import ServerLimits, create_app
from test_server_helpers import LiveServer, live_server, scripted

CODE = {"type": "python_tests", "tests": "assert True"}
USER = [{"role": "user", "content": "Write add(a, b) in Python."}]
GRAPH: dict[str, Any] = {
    "mode": "graph",
    "nodes": [{"name": "coder"}, {"name": "reviewer"}],
    "edges": [{"from": "coder", "to": "reviewer", "when": {"validator": CODE}}],
}

#: every place of the request body where a validator can appear (a dotted path, as the
#: walk below names it) -> the requests that put client code there, one per mode using it
CODE_PLACES: dict[str, list[tuple[dict[str, Any], str]]] = {
    "collaboration.validator": [
        ({"mode": mode, "validator": CODE}, "collaboration.validator.type")
        for mode in ("reflect", "best_of", "auto")
    ],
    "collaboration.edges[].when.validator": [(GRAPH, "collaboration.edges.when")],
}
#: the calculator's places: a mode, and auto's option
CALCULATOR_PLACES: list[tuple[dict[str, Any], str]] = [
    ({"mode": "compute"}, "collaboration.mode"),
    ({"mode": "auto", "calculator": True}, "collaboration.calculator"),
]


def _validator_places(doc: dict[str, Any]) -> set[str]:
    """The dotted paths of the chat request body at which the document allows a
    ``python_tests`` validator (each ``const: python_tests``)."""
    schemas = doc["components"]["schemas"]
    found: set[str] = set()

    def walk(node: Any, path: list[str]) -> None:
        if isinstance(node, dict):
            if node.get("const") == "python_tests":
                found.add(".".join(path[:-1]).replace(".[]", "[]"))  # path ends at "type"
            if "$ref" in node:
                name = node["$ref"].rsplit("/", 1)[-1]
                if name not in path:  # no cycles
                    walk(schemas[name], path)
            for key, value in node.items():
                if key == "properties":
                    for prop, sub in value.items():
                        walk(sub, [*path, prop])
                elif key == "items":
                    walk(value, [*path, "[]"])
                elif key in ("oneOf", "anyOf", "allOf"):
                    for sub in value:
                        walk(sub, path)
                elif key == "additionalProperties" and isinstance(value, dict):
                    walk(value, [*path, "*"])

    body = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]
    walk(body["application/json"]["schema"], [])
    return found


def test_the_openapi_document_lists_exactly_the_places_tested_here() -> None:
    """A new place for a validator fails here until it is added to CODE_PLACES."""
    doc = create_app(scripted()()).openapi()
    assert _validator_places(doc) == set(CODE_PLACES)


@pytest.fixture(scope="module")
def default_server() -> Iterator[LiveServer]:
    with live_server(scripted(), watch_health=True) as srv:
        yield srv


def _post(srv: LiveServer, collaboration: dict[str, Any], max_tokens: int = 8) -> httpx.Response:
    body: dict[str, Any] = {
        "messages": USER,
        "max_tokens": max_tokens,
        "agents": [{"name": "coder"}] if collaboration["mode"] != "graph" else [],
        "collaboration": collaboration,
    }
    if collaboration["mode"] == "graph":
        body.pop("agents")
    return httpx.post(f"{srv.url}/v1/chat/completions", json=body, headers=srv.headers, timeout=30)


@pytest.mark.parametrize(
    ("collaboration", "field"),
    [case for cases in CODE_PLACES.values() for case in cases] + CALCULATOR_PLACES,
    ids=lambda v: v.get("mode", "") if isinstance(v, dict) else v,
)
def test_every_place_is_refused_on_a_server_that_did_not_allow_code(
    default_server: LiveServer, collaboration: dict[str, Any], field: str
) -> None:
    r = _post(default_server, collaboration)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"].startswith(field), error
    assert "disabled" in error["message"] and "start the server with --" in error["message"]


def test_with_the_flag_a_graph_edge_validator_runs_in_the_sandbox() -> None:
    """The positive control: the same graph is accepted, and its edge's tests decide the
    route (a failing test stops the edge: the reviewer, the output node, is pruned)."""
    limits = ServerLimits(allow_code_validators=True)
    code = "```python\ndef add(a, b):\n    return a + b\n```"
    passing = {"type": "python_tests", "tests": "assert add(2, 3) == 5"}
    failing = {"type": "python_tests", "tests": "assert add(2, 2) == 5"}
    edge = GRAPH["edges"][0]
    with live_server(
        scripted(script=lambda ids, request: code), limits=limits, watch_health=True
    ) as srv:
        r = _post(srv, {**GRAPH, "edges": [{**edge, "when": {"validator": failing}}]}, 64)
        assert r.status_code == 422, r.text
        assert "'reviewer' was pruned" in r.json()["error"]["message"]
        r = _post(srv, {**GRAPH, "edges": [{**edge, "when": {"validator": passing}}]}, 64)
        assert r.status_code == 200, r.text
        passing_roles = [agent["role"] for agent in r.json()["collaboration"]["agents"]]
    assert passing_roles == ["coder", "reviewer"]


def test_in_process_a_deny_policy_refuses_when_building() -> None:
    with code_policy(CodePolicy.deny_all()):
        for collaboration, field in [
            case for cases in CODE_PLACES.values() for case in cases
        ] + CALCULATOR_PLACES:
            options = {k: v for k, v in collaboration.items() if k != "mode"}
            agents = None if collaboration["mode"] == "graph" else [{"name": "coder"}]
            with pytest.raises(InvalidCollaboration) as info:
                prepare_collaboration(collaboration["mode"], agents, options)
            assert info.value.field.startswith(field) and "disabled" in info.value.reason


@pytest.mark.anyio
async def test_the_gate_holds_where_code_runs_too() -> None:
    """A validator or a calculation built under one policy and run under a denying one
    runs nothing: the second wall, for a path that skipped the first."""
    check = python_tests_validator("assert True")
    with code_policy(CodePolicy.deny_all()):
        verdict = await run_validator(check, "```python\nx = 1\n```")
        with pytest.raises(InvalidCollaboration, match="disabled"):
            await calculate("1 + 1")
    assert not verdict.ok and "disabled" in verdict.message
    assert (await run_validator(check, "```python\nx = 1\n```")).ok


def test_an_attackers_tests_over_http_change_nothing_and_read_nothing(tmp_path: Path) -> None:
    """Issue 36's escape as a client sends it, on a server that allows code validators:
    the tests remount ``/`` read-write, write into a host directory, read a host secret
    into the verdict (and print it, as the old sandbox returned stderr's last line) and
    dial a host UNIX socket; top level and on a graph edge. The host is untouched, the
    secret is in no response, the listener gets no connection."""
    secret = tmp_path / "secret.txt"
    secret.write_text("host-secret-7f3a")
    target = tmp_path / "escaped"
    sock_path = tmp_path / "host.sock"
    attack = (
        "import ctypes, socket, sys\n"
        "ctypes.CDLL(None, use_errno=True).mount(None, b'/', None, 32 | 4096, None)\n"
        "try:\n"
        f"    open({str(target)!r}, 'w').write('x')\n"
        "except OSError:\n"
        "    pass\n"
        "try:\n"
        f"    s = socket.socket(socket.AF_UNIX); s.connect({str(sock_path)!r}); s.send(b'hi')\n"
        "except OSError:\n"
        "    pass\n"
        "try:\n"
        f"    data = open({str(secret)!r}).read()\n"
        "except OSError as exc:\n"
        "    data = repr(exc)\n"
        "print(data, file=sys.stderr)\n"
        "assert False, data\n"
    )
    validator = {"type": "python_tests", "tests": attack}
    code = "```python\ndef add(a, b):\n    return a + b\n```"
    edge = GRAPH["edges"][0]
    limits = ServerLimits(allow_code_validators=True)
    with (
        socket.socket(socket.AF_UNIX) as listener,
        live_server(
            scripted(script=lambda ids, request: code), limits=limits, watch_health=True
        ) as srv,
    ):
        listener.bind(str(sock_path))
        listener.listen()
        listener.setblocking(False)
        top = _post(srv, {"mode": "reflect", "validator": validator, "rounds": 1}, 64)
        assert top.status_code == 200, top.text
        message = top.json()["collaboration"]["details"]["validator_message"]
        # the verdict is the assertion's own message: the read failed inside
        assert "tests failed" in message and "No such file" in message, message
        graph = {**GRAPH, "edges": [{**edge, "when": {"validator": validator}}]}
        pruned = _post(srv, graph, 64)
        assert pruned.status_code == 422, pruned.text  # the edge's tests failed
        with pytest.raises(BlockingIOError):
            listener.accept()
    for response in (top, pruned):
        assert "host-secret-7f3a" not in response.text
    assert not target.exists()
    assert secret.read_text() == "host-secret-7f3a"
