"""vLLM's front-end flags on ``microagent serve``: CORS (``--allowed-origins``,
``--allowed-methods``, ``--allowed-headers``, ``--allow-credentials``) and
``--chat-template``.

Each server is built as ``microagent serve --engine scripted`` builds it
(``serve_options``, then ``served_app``) and called in process over ASGI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from microagent.cli import main
from microagent.server import CliError, serve_options
from microagent.testing import ScriptedEngine
from test_presets import run, serve

APP = "https://app.example"
OTHER = "https://evil.example"
USER = [{"role": "user", "content": "Is 7 a prime number?"}]
#: a template of its own: roles in brackets, upper case (ChatML would write them bare)
TEMPLATE = (
    "{% for m in messages %}<|im_start|>[{{ m.role | upper }}]\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>[ASSISTANT]\n{% endif %}"
)


def _preflight(origin: str, headers: str = "authorization, content-type") -> dict[str, str]:
    return {
        "origin": origin,
        "access-control-request-method": "POST",
        "access-control-request-headers": headers,
    }


def test_an_allowed_origin_gets_the_cors_headers_and_another_does_not() -> None:
    served = serve("--allowed-origins", f'["{APP}"]', "--api-key", "k-1")

    async def scenario(client: httpx.AsyncClient) -> None:
        # the preflight is answered before the key check (a browser sends no key with it)
        ok = await client.options("/v1/chat/completions", headers=_preflight(APP))
        assert ok.status_code == 200, ok.text
        assert ok.headers["access-control-allow-origin"] == APP
        assert "POST" in ok.headers["access-control-allow-methods"]
        assert "authorization" in ok.headers["access-control-allow-headers"].lower()
        assert "access-control-allow-credentials" not in ok.headers  # not asked for
        simple = await client.get(
            "/v1/models", headers={"origin": APP, "authorization": "Bearer k-1"}
        )
        assert simple.status_code == 200
        assert simple.headers["access-control-allow-origin"] == APP
        refused = await client.get("/v1/models", headers={"origin": APP})  # no key: 401
        assert refused.status_code == 401  # and the browser may read why
        assert refused.headers["access-control-allow-origin"] == APP
        bad = await client.options("/v1/chat/completions", headers=_preflight(OTHER))
        assert bad.status_code == 400
        assert "access-control-allow-origin" not in bad.headers
        other = await client.get(
            "/v1/models", headers={"origin": OTHER, "authorization": "Bearer k-1"}
        )
        assert other.status_code == 200
        assert "access-control-allow-origin" not in other.headers

    run(served, scenario)


def test_without_the_flags_no_origin_is_allowed_as_in_vllm() -> None:
    served = serve()

    async def scenario(client: httpx.AsyncClient) -> None:
        pre = await client.options("/v1/chat/completions", headers=_preflight(APP))
        assert pre.status_code == 400
        assert "access-control-allow-origin" not in pre.headers
        simple = await client.get("/v1/models", headers={"origin": APP})
        assert simple.status_code == 200
        assert "access-control-allow-origin" not in simple.headers

    run(served, scenario)


def test_methods_headers_and_credentials_are_as_given() -> None:
    served = serve(
        "--allowed-origins",
        '["*"]',
        "--allowed-methods",
        '["GET"]',
        "--allowed-headers",
        '["content-type"]',
        "--allow-credentials",
    )

    async def scenario(client: httpx.AsyncClient) -> None:
        get = await client.options(
            "/v1/models",
            headers={**_preflight(APP, "content-type"), "access-control-request-method": "GET"},
        )
        assert get.status_code == 200
        assert get.headers["access-control-allow-origin"] == APP  # credentials: echoed
        assert get.headers["access-control-allow-credentials"] == "true"
        post = await client.options("/v1/chat/completions", headers=_preflight(APP, "x-mine"))
        assert post.status_code == 400  # neither the method nor the header is allowed
        assert post.text == "Disallowed CORS method, headers"

    run(served, scenario)


@pytest.mark.parametrize("value", ["https://app.example", '{"a": 1}', "[1]", "[oops"])
def test_a_cors_value_that_is_not_a_json_list_of_strings_is_refused_by_name(
    value: str,
) -> None:
    with pytest.raises(ValueError, match=r"--allowed-origins.*JSON list of strings"):
        serve_options(["--engine", "scripted", "--allowed-origins", value])


def test_serve_help_lists_the_front_end_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["serve", "--help"])
    assert info.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())
    for flag in (
        "--allowed-origins",
        "--allowed-methods",
        "--allowed-headers",
        "--allow-credentials",
        "--chat-template",
    ):
        assert flag in shown, flag
    assert 'default ["*"]' in shown and "default []" in shown


def _rendered(served: Any) -> tuple[str, str]:
    """What the served model renders: ``/tokenize`` of USER, detokenized, and the prompt
    of the engine request a chat completion made."""
    out: list[str] = []

    async def scenario(client: httpx.AsyncClient) -> None:
        ids = await client.post("/tokenize", json={"messages": USER})
        assert ids.status_code == 200, ids.text
        text = await client.post("/detokenize", json={"tokens": ids.json()["tokens"]})
        out.append(text.json()["prompt"])
        chat = await client.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 4})
        assert chat.status_code == 200, chat.text

    run(served, scenario)
    engine = served.bridges[0]
    assert isinstance(engine, ScriptedEngine)
    return out[0], engine.detokenize(list(engine.history[-1].prompt.token_ids))


def test_a_chat_template_file_renders_the_served_models_prompts(tmp_path: Path) -> None:
    path = tmp_path / "template.jinja"
    path.write_text(TEMPLATE, encoding="utf-8")
    tokenized, prompt = _rendered(serve("--chat-template", str(path)))
    want = "<|im_start|>[USER]\nIs 7 a prime number?<|im_end|>\n<|im_start|>[ASSISTANT]\n"
    assert tokenized.endswith(want)
    assert prompt.endswith(want)
    plain, _ = _rendered(serve())  # the tokenizer's own (ChatML) without the flag
    assert "[USER]" not in plain and plain.endswith("<|im_start|>assistant\n")


def test_an_inline_chat_template_is_taken_as_the_template() -> None:
    tokenized, prompt = _rendered(serve("--chat-template", TEMPLATE))
    assert "<|im_start|>[USER]\nIs 7 a prime number?<|im_end|>" in tokenized
    assert prompt.endswith("<|im_start|>[ASSISTANT]\n")


def test_a_missing_chat_template_file_is_refused_at_startup_naming_the_flag(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "nowhere" / "template.jinja"
    with pytest.raises(CliError, match=r"--chat-template '.*template\.jinja': no chat template"):
        serve("--chat-template", str(missing))


def test_broken_jinja_is_refused_at_startup_naming_the_flag() -> None:
    with pytest.raises(CliError, match="--chat-template: the chat template is not valid Jinja"):
        serve("--chat-template", "{% for m in messages %}{{ m.content }}\n")  # no endfor


def test_a_scripted_engine_renders_with_its_chat_template() -> None:
    engine = ScriptedEngine(chat_template=TEMPLATE)
    handle = engine.chat.generation_prompt(engine.chat.context(USER))
    assert engine.detokenize(list(handle.token_ids)) == (
        "<|im_start|>[USER]\nIs 7 a prime number?<|im_end|>\n<|im_start|>[ASSISTANT]\n"
    )
    with pytest.raises(ValueError, match="dropped or reordered"):  # no contents to splice
        ScriptedEngine(chat_template="{% for m in messages %}x<|im_end|>{% endfor %}")
    with pytest.raises(ValueError, match=r"--chat-template: the chat template refused.*no chat"):
        ScriptedEngine(chat_template="{{ raise_exception('no chat here') }}")
