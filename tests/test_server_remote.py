"""``microagent serve --remote``: options into RemoteBridges, remote failures into 502s."""

from __future__ import annotations

import pytest
from microagent import RemoteBridge, RemoteError
from microagent.cli import build_parser, main
from microagent.collab import CollaborationFailed
from microagent.server._remote import make_remotes, remote_cause, remote_failure

URL = "https://api.example.com/v1"


def remotes(*argv: str) -> list[RemoteBridge]:
    return make_remotes(build_parser().parse_args(["serve", "--engine", "scripted", *argv]))


def test_remote_options_make_one_bridge_each() -> None:
    (big,) = remotes(
        "--remote",
        f"big={URL}",
        "--remote-key",
        "big=BIG_KEY",
        "--remote-model",
        "big=Qwen2.5-7B-Instruct",
        "--remote-timeout",
        "5",
        "--remote-attempts",
        "2",
    )
    assert (big.model, big.url, big.remote_model) == ("big", URL, "Qwen2.5-7B-Instruct")
    assert big.api_key_env == "BIG_KEY" and big.remote
    assert (big.timeout, big.max_attempts) == (5.0, 2)
    (plain,) = remotes("--remote", f"small={URL}")
    assert plain.remote_model == "small" and plain.api_key_env is None
    assert remotes() == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--remote", "big"], "NAME=VALUE"),
        (["--remote", f"big={URL}", "--remote", f"big={URL}"], "twice"),
        (["--remote", f"big={URL}", "--remote-key", "other=ENV"], "names no --remote"),
        (["--remote-model", "big=m"], "names no --remote"),
        (["--remote", "big=ftp://h/v1"], "http://"),
        (["--remote", f"big={URL}", "--remote-attempts", "0"], ">= 1"),
    ],
)
def test_bad_remote_options_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        remotes(*argv)


def test_serve_refuses_bad_remotes_before_starting(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--engine", "scripted", "--remote", "big"]) == 2
    assert "--remote expects NAME=VALUE" in capsys.readouterr().err
    code = main(["serve", "--engine", "scripted", "--model", "big", "--remote", f"big={URL}"])
    assert code == 1
    assert "served here already" in capsys.readouterr().err


def test_a_remote_failure_anywhere_in_the_chain_is_a_502_naming_it() -> None:
    err = RemoteError("big", "HTTP 503: down", status=503, attempts=4)
    wrapped = CollaborationFailed("vote failed", cause=ExceptionGroup("g", [err]))
    assert remote_cause(wrapped) is err
    api = remote_failure(wrapped)
    assert api is not None and api.status == 502 and api.code == "remote_error"
    assert "'big'" in api.message and "4 attempt" in api.message
    assert remote_failure(CollaborationFailed("no voter answered")) is None
