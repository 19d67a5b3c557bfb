"""``microagent eval``'s command: inputs checked with clear errors, outputs written, resume.

Requests go to a fake runner injected through ``cmd_eval(runner=...)``; the
in-process engine path is ``tests/test_evaluation.py``'s real-engine test.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
from microagent.evaluation import EvalRequest, HTTPRunner, Reply
from microagent.evaluation._command import add_eval_options, cmd_eval


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="microagent eval")
    add_eval_options(parser)
    return parser.parse_args(list(argv))


@attrs.define
class Echo:
    """A fake runner: every configuration answers right; it counts its calls."""

    label: str = "fake"
    calls: int = 0

    async def run(self, request: EvalRequest) -> Reply:
        self.calls += 1
        a, b = (int(w.rstrip("?")) for w in request.question.split()[2:5:2])
        return Reply(str(a + b), 10, 2, 0.01)


def _write_items(path: Path, n: int = 12) -> Path:
    path.write_text(
        "\n".join(
            json.dumps({"question": f"What is {i} + {i + 1}?", "answers": [str(2 * i + 1)]})
            for i in range(n)
        )
        + "\n"
    )
    return path


def test_a_run_writes_its_report_and_resumes(tmp_path: Path) -> None:
    items = _write_items(tmp_path / "q.jsonl")
    out = io.StringIO()
    args = _parse(str(items), "--config", "vote3", "--out", str(tmp_path / "o"))
    runner = Echo()
    assert cmd_eval(args, runner=runner, out=out) == 0
    assert runner.calls == 2 * 12
    assert "Nothing beat greedy" in out.getvalue()  # a tie on selection keeps greedy
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["choice"]["name"] == "greedy"
    assert not (tmp_path / "o" / "preset.json").exists()
    again = Echo()
    assert cmd_eval(args, runner=again, out=io.StringIO()) == 0
    assert again.calls == 0  # resumed from the journal under --out


def test_limit_takes_the_first_items(tmp_path: Path) -> None:
    items = _write_items(tmp_path / "q.jsonl")
    args = _parse(str(items), "--config", "vote3", "--limit", "4", "--out", str(tmp_path))
    runner = Echo()
    assert cmd_eval(args, runner=runner, out=io.StringIO()) == 0
    assert runner.calls == 2 * 4


def test_a_bad_line_is_an_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    items = _write_items(tmp_path / "q.jsonl", 3)
    items.write_text(items.read_text() + '{"question": "q", "answers": [2]}\n')
    runner = Echo()
    assert cmd_eval(_parse(str(items), "--out", str(tmp_path)), runner=runner) == 2
    err = capsys.readouterr().err
    assert "line 4" in err and "answers[0]" in err
    assert runner.calls == 0


def test_an_unknown_configuration_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    items = _write_items(tmp_path / "q.jsonl", 3)
    args = _parse(str(items), "--config", "nope.json", "--out", str(tmp_path))
    assert cmd_eval(args, runner=Echo()) == 2
    assert "nope.json" in capsys.readouterr().err


def test_options_are_bounded() -> None:
    with pytest.raises(SystemExit):
        _parse("q.jsonl", "--select-fraction", "1.5")
    with pytest.raises(SystemExit):
        _parse("q.jsonl", "--concurrency", "0")


def test_replay_writes_the_same_report_without_a_runner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    items = _write_items(tmp_path / "q.jsonl")
    argv = [str(items), "--config", "vote3", "--out", str(tmp_path / "o")]
    assert cmd_eval(_parse(*argv), runner=Echo(), out=io.StringIO()) == 0
    report = tmp_path / "o" / "report.json"
    recorded = report.read_bytes()
    report.unlink()
    out = io.StringIO()
    assert cmd_eval(_parse(*argv, "--replay"), out=out) == 0  # no runner, no engine
    assert report.read_bytes() == recorded
    assert "on fake" in out.getvalue()  # the recorded runner's label
    journal = tmp_path / "o" / "journal.jsonl"
    lines = journal.read_text().splitlines(keepends=True)
    journal.write_text("".join(lines[:-1]))
    assert cmd_eval(_parse(*argv, "--replay"), out=io.StringIO()) == 1
    err = capsys.readouterr().err
    assert "no reply for item line 12" in err and "resume" not in err


def test_replay_imports_no_engine_and_no_http_client(tmp_path: Path) -> None:
    """In a fresh interpreter, ``microagent eval --replay`` loads neither vLLM nor an
    HTTP client, even with ``--base-url`` (it names the runner, nothing is sent)."""
    items = _write_items(tmp_path / "q.jsonl", 6)
    url = "http://127.0.0.1:9"  # the discard port: nothing listens
    argv = [str(items), "--config", "vote3", "--out", str(tmp_path), "--base-url", url]
    assert cmd_eval(_parse(*argv), runner=Echo(HTTPRunner(url).label), out=io.StringIO()) == 0
    probe = (
        "import sys\n"
        "from microagent.cli import main\n"
        f"status = main(['eval', *{[*argv, '--replay']!r}])\n"
        "heavy = {'vllm', 'torch', 'openai', 'httpx'}\n"
        "print(repr((status, sorted(m for m in sys.modules if m.split('.')[0] in heavy))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    status, loaded = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert status == 0, done.stderr
    assert loaded == []
