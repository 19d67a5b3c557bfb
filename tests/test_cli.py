"""The ``microagent`` command line: help, run (on the ScriptedEngine), prepare, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from microagent.server._cli import build_parser, main


@pytest.mark.parametrize(
    "argv", [["--help"], ["serve", "--help"], ["run", "--help"], ["prepare", "--help"]]
)
def test_help_everywhere(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: microagent")


def test_no_command_prints_help_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "serve" in capsys.readouterr().err


def test_serve_options_parse() -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--model",
            "default",
            "--model",
            "/m2",
            "--port",
            "9000",
            "--api-key",
            "k",
            "--adapter",
            "a=/p",
            "--max-num-seqs",
            "8",
            "--engine-arg",
            "enforce_eager=true",
        ]
    )
    assert args.model == ["default", "/m2"]
    assert args.adapter == [("a", "/p")]
    assert args.engine_arg == [("enforce_eager", "true")]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--adapter", "no-equals"])


def test_run_shows_agents_and_the_token_table(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "run",
            "Is it yes?",
            "--engine",
            "scripted",
            "--choices",
            "yes,no",
            "--agents",
            "3",
            "--max-tokens",
            "8",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "[voter-1] agent_started" in out
    assert "answer: " in out
    for label in (
        "prompt tokens computed",
        "prompt tokens cached",
        "completion tokens saved",
        "time",
    ):
        assert label in out
    answer = next(line for line in out.splitlines() if line.startswith("answer: "))
    assert answer.split(": ", 1)[1] in ("yes", "no")


def test_run_json_and_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    context = tmp_path / "ctx.txt"
    context.write_text("The sky is blue.")
    trace = tmp_path / "trace.json"
    timeline = tmp_path / "timeline.png"
    code = main(
        [
            "run",
            "Is the sky blue?",
            "--engine",
            "scripted",
            "--context-file",
            str(context),
            "--mode",
            "debate",
            "--agents",
            "2",
            "--rounds",
            "1",
            "--max-tokens",
            "6",
            "--json",
            "--trace",
            str(trace),
            "--timeline",
            str(timeline),
        ]
    )
    assert code == 0
    response = json.loads(capsys.readouterr().out)
    assert response["object"] == "chat.completion"
    assert response["collaboration"]["mode"] == "debate"
    assert response["choices"][0]["message"]["content"] == response["collaboration"]["answer"]
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e["name"] == "final" and e["ph"] == "i" for e in events)
    lanes = {
        e["args"]["agent"]
        for e in events
        if e["ph"] == "M" and e["name"] == "thread_name" and "agent" in e["args"]
    }
    assert lanes == {"debater-1", "debater-2"}
    assert timeline.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_run_errors_are_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "q", "--engine", "scripted", "--mode", "telepathy"]) == 1
    err = capsys.readouterr().err
    assert "error: invalid collaboration" in err and "telepathy" in err
    assert (
        main(["run", "q", "--engine", "scripted", "--context-file", str(tmp_path / "missing.txt")])
        == 1
    )
    assert "cannot read --context-file" in capsys.readouterr().err


def test_prepare_bad_path_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["prepare", str(tmp_path / "nope")]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_python_dash_m_microagent() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "microagent", "run", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0
    assert "--context-file" in done.stdout
