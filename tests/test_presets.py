"""Presets (``serve --preset NAME=FILE``): a collaboration a client runs by naming a model.

Each server here is built as ``microagent serve --engine scripted`` builds it
(``serve_options``, then ``served_app``) and called in process over ASGI: the
listing, chat and Responses (streamed or not), the refusals at startup (a name
clash, a bad file, named), ``--config``'s ``preset:`` mapping, and a preset that
``microagent eval`` wrote.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from microagent.evaluation import BUILTIN
from microagent.evaluation._preset import write_preset
from microagent.server import CliError, serve_options, served_app
from microagent.server._presets import MAX_PRESET_BYTES

USER = [{"role": "user", "content": "Is 7 a prime number?"}]
#: a small preset: two voters on a closed question, both always run
VOTE2 = {
    "agents": [{"name": "voter", "count": 2}],
    "collaboration": {"mode": "vote", "answer": {"choices": ["yes", "no"]}, "early_stop": False},
}


def preset_file(tmp_path: Path, name: str, doc: Any) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    return path


def serve(*argv: str) -> Any:
    """The app ``microagent serve --engine scripted ARGV`` would serve (not started)."""
    return served_app(serve_options(["--engine", "scripted", *argv]))


def run(served: Any, scenario: Callable[[httpx.AsyncClient], Awaitable[None]]) -> None:
    """Open ``served``'s engines and run ``scenario`` against its app over ASGI."""

    async def go() -> None:
        async with contextlib.AsyncExitStack() as stack:
            for bridge in served.bridges:
                await stack.enter_async_context(bridge)
            client = await stack.enter_async_context(_client(served.app))
            await scenario(client)

    anyio.run(go)


@contextlib.asynccontextmanager
async def _client(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=30
    ) as client:
        yield client


def events(text: str) -> list[dict[str, Any]]:
    """The JSON data of a server-sent event stream (``[DONE]`` left out)."""
    return [
        json.loads(line[len("data: ") :])
        for line in text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


def test_a_preset_is_listed_after_the_served_models(tmp_path: Path) -> None:
    served = serve("--preset", f"vote2={preset_file(tmp_path, 'vote2', VOTE2)}")

    async def scenario(client: httpx.AsyncClient) -> None:
        data = (await client.get("/v1/models")).json()["data"]
        assert [m["id"] for m in data] == ["scripted", "vote2"]
        card = data[1]
        assert card["owned_by"] == "microagent" and card["object"] == "model"
        assert card["parent"] == "scripted"
        assert card["collaboration"] == {"mode": "vote", "agents": 2}

    run(served, scenario)


def test_chat_naming_a_preset_runs_its_collaboration_streamed_or_not(tmp_path: Path) -> None:
    served = serve("--preset", f"vote2={preset_file(tmp_path, 'vote2', VOTE2)}")

    async def scenario(client: httpx.AsyncClient) -> None:
        r = await client.post(
            "/v1/chat/completions", json={"model": "vote2", "messages": USER, "max_tokens": 4}
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["model"] == "vote2"
        assert body["collaboration"]["mode"] == "vote"
        assert len(body["collaboration"]["agents"]) == 2
        assert body["choices"][0]["message"]["content"] in ("yes", "no")
        assert body["usage"]["prompt_tokens"] == body["collaboration"]["usage"]["prompt_tokens"]
        assert list(body["usage"]["by_model"]) == ["scripted"]  # the engine that computed it

        r = await client.post(
            "/v1/chat/completions",
            json={"model": "vote2", "messages": USER, "stream": True},
        )
        assert r.status_code == 200, r.text
        chunks = events(r.text)
        assert chunks and all(c["model"] == "vote2" for c in chunks)
        assert any(c.get("collaboration", {}).get("mode") == "vote" for c in chunks)
        text = "".join(
            c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
        )
        assert text in ("yes", "no")

    run(served, scenario)


def test_responses_naming_a_preset_runs_its_collaboration_streamed_or_not(
    tmp_path: Path,
) -> None:
    served = serve("--preset", f"vote2={preset_file(tmp_path, 'vote2', VOTE2)}")

    async def scenario(client: httpx.AsyncClient) -> None:
        r = await client.post(
            "/v1/responses", json={"model": "vote2", "input": "Is 7 a prime number?"}
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["model"] == "vote2" and body["status"] == "completed"
        assert body["usage"]["input_tokens"] > 0
        assert body["output"][-1]["content"][0]["text"] in ("yes", "no")

        r = await client.post(
            "/v1/responses",
            json={"model": "vote2", "input": "Is 7 a prime number?", "stream": True},
        )
        assert r.status_code == 200, r.text
        done = [e for e in events(r.text) if e.get("type") == "response.completed"]
        assert len(done) == 1 and done[0]["response"]["model"] == "vote2"
        assert done[0]["response"]["usage"]["input_tokens"] > 0

    run(served, scenario)


def test_a_request_naming_a_preset_and_sending_agents_is_refused_naming_the_field(
    tmp_path: Path,
) -> None:
    served = serve("--preset", f"vote2={preset_file(tmp_path, 'vote2', VOTE2)}")

    async def scenario(client: httpx.AsyncClient) -> None:
        for field, value in (("agents", VOTE2["agents"]), ("collaboration", {"mode": "vote"})):
            for route, base in (
                ("/v1/chat/completions", {"messages": USER}),
                ("/v1/responses", {"input": "Is 7 prime?"}),
            ):
                r = await client.post(route, json={**base, "model": "vote2", field: value})
                assert r.status_code == 400, r.text
                error = r.json()["error"]
                assert error["param"] == field and "preset" in error["message"], error
        # the served model still takes a request's own agents
        r = await client.post(
            "/v1/chat/completions", json={"messages": USER, "model": "scripted", **VOTE2}
        )
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "scripted"

    run(served, scenario)


def test_a_preset_named_as_a_served_model_or_twice_is_refused(tmp_path: Path) -> None:
    path = preset_file(tmp_path, "vote2", VOTE2)
    with pytest.raises(CliError, match=r"--preset scripted=.*'scripted' is a served"):
        serve("--preset", f"scripted={path}")
    with pytest.raises(CliError, match=r"two presets are named 'vote2'"):
        serve("--preset", f"vote2={path}", "--preset", f"vote2={path}")
    with pytest.raises(CliError, match=r"'default' already means"):
        serve("--preset", f"default={path}")
    with pytest.raises(CliError, match=r"the name must be"):
        serve("--preset", f"has space={path}")
    with pytest.raises(ValueError, match=r"expected NAME=FILE"):
        serve("--preset", "vote2")


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ("{not json", "not a JSON file"),
        (" " * (MAX_PRESET_BYTES + 1), f"larger than {MAX_PRESET_BYTES} bytes"),
        ([1, 2], "expected a JSON object"),
        ({"collaboration": {"mode": "vote"}}, "agents: required"),
        ({**VOTE2, "extra": 1}, "extra: unknown field"),
        ({**VOTE2, "agents": "voter"}, "agents: "),
        ({**VOTE2, "agents": [{"name": "v", "count": 0}]}, r"agents\[0\]\.count"),
        ({**VOTE2, "agents": [{"name": "v", "tempreature": 1}]}, r"agents\[0\]"),
        (
            {**VOTE2, "agents": [{"name": "v", "count": 40}]},
            r"agents\[0\]\.count must be in 1\.\.32",
        ),
        ({**VOTE2, "collaboration": {"mode": "nosuchmode"}}, "collaboration.mode"),
        ({**VOTE2, "collaboration": {"mode": "vote", "rounds": "2"}}, "collaboration.rounds"),
        ({**VOTE2, "collaboration": {"mode": "vote", "tools": ["nope"]}}, "collaboration.tools"),
        ({**VOTE2, "collaboration": {"mode": "compute"}}, "calculator"),
        ({**VOTE2, "model": "elsewhere"}, "model: unknown model 'elsewhere'"),
        ({**VOTE2, "model": 3}, "model: expected"),
    ],
)
def test_a_bad_preset_file_is_refused_at_startup_naming_the_file_and_field(
    tmp_path: Path, doc: Any, says: str
) -> None:
    path = preset_file(tmp_path, "bad", doc)
    with pytest.raises(CliError, match=rf"--preset bad={path}: .*{says}"):
        serve("--preset", f"bad={path}")


def test_a_missing_preset_file_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(CliError, match=r"--preset bad=.*missing.json: cannot read it"):
        serve("--preset", f"bad={tmp_path / 'missing.json'}")


def test_a_preset_runs_on_the_model_it_names(tmp_path: Path) -> None:
    path = preset_file(tmp_path, "on-b", {**VOTE2, "model": "b"})
    served = serve("--model", "a", "--model", "b", "--preset", f"on-b={path}")

    async def scenario(client: httpx.AsyncClient) -> None:
        data = (await client.get("/v1/models")).json()["data"]
        assert data[-1]["id"] == "on-b" and data[-1]["parent"] == "b"
        r = await client.post("/v1/chat/completions", json={"model": "on-b", "messages": USER})
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "on-b" and list(r.json()["usage"]["by_model"]) == ["b"]

    run(served, scenario)


def test_presets_in_a_config_file(tmp_path: Path) -> None:
    """``--config``'s ``preset:`` mapping (vLLM's config file): a file, or the preset itself."""
    pytest.importorskip("vllm")  # --config is vLLM's parser's
    path = preset_file(tmp_path, "vote2", VOTE2)
    config = tmp_path / "serve.yaml"
    config.write_text(
        f"preset:\n  vote2: {path}\n  inline:\n"
        + "".join(f"    {line}\n" for line in json.dumps(VOTE2).splitlines()),
        encoding="utf-8",
    )
    served = serve("--config", str(config))

    async def scenario(client: httpx.AsyncClient) -> None:
        data = (await client.get("/v1/models")).json()["data"]
        assert [m["id"] for m in data] == ["scripted", "vote2", "inline"]
        r = await client.post("/v1/chat/completions", json={"model": "inline", "messages": USER})
        assert r.status_code == 200, r.text
        assert r.json()["collaboration"]["mode"] == "vote"

    run(served, scenario)


def test_a_preset_written_by_microagent_eval_loads_in_serve(tmp_path: Path) -> None:
    candidate = BUILTIN["vote3"]
    path = write_preset(candidate, tmp_path / "eval-out" / "preset.json")
    served = serve("--preset", f"{candidate.name}={path}")

    async def scenario(client: httpx.AsyncClient) -> None:
        ids = [m["id"] for m in (await client.get("/v1/models")).json()["data"]]
        assert ids == ["scripted", candidate.name]
        r = await client.post(
            "/v1/chat/completions",
            json={"model": candidate.name, "messages": USER, "max_tokens": 4},
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["model"] == candidate.name
        assert body["collaboration"]["mode"] == candidate.free.collaboration["mode"]

    run(served, scenario)
