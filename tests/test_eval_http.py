"""``microagent eval`` over HTTP: the openai SDK against a live server (a ScriptedEngine).

The requests are the ones a client sends (``extra_body``: agents and
collaboration); the reply's ``collaboration`` object is read back; a
configuration the server refuses (``compute`` without ``serve --calculator``) is a
refusal in the report, not a crash.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import anyio
import pytest
from microagent.evaluation import (
    BUILTIN,
    EvalError,
    EvalReport,
    HTTPRunner,
    evaluate,
    parse_items,
)
from test_server_helpers import live_server, scripted

ITEMS = "\n".join(
    json.dumps(item)
    for item in [
        {"question": "Is 7 prime?", "answers": ["yes"], "choices": ["yes", "no"], "family": "c"},
        {"question": "Is 8 prime?", "answers": ["no"], "choices": ["yes", "no"], "family": "c"},
        {"question": "What is 2 + 2?", "answers": ["4"], "family": "f"},
        {"question": "What is 3 + 3?", "answers": ["6"], "family": "f"},
    ]
)


def test_eval_over_http_reads_answers_usage_and_refusals() -> None:
    items = parse_items(ITEMS)
    with live_server(scripted()) as srv:
        runner = HTTPRunner(srv.url, model="scripted", api_key="none")

        async def go() -> EvalReport:
            try:
                return await evaluate(
                    items,
                    [BUILTIN["vote3"], BUILTIN["compute"]],
                    runner,
                    max_tokens=8,
                    progress=None,
                )
            finally:
                await runner.aclose()

        report = anyio.run(go)
    assert runner.label == f"http:{srv.url}/v1:scripted"
    by_name = {r.name: r for r in report.reports}
    assert by_name["greedy"].refused == 0 and by_name["vote3"].refused == 0
    assert by_name["greedy"].completion_tokens > 0
    closed = [r for r in report.rows if r["config"] == "greedy" and r["family"] == "c"]
    assert all(r["answer"] in ("yes", "no") for r in closed)  # constrained to the choices
    compute = [r for r in report.rows if r["config"] == "compute"]
    assert all(r["refused"] and "calculator" in r["refused"] for r in compute)
    assert by_name["compute"].refused == by_name["compute"].n
    assert by_name["compute"].answered == 0


def test_an_unreachable_server_is_an_eval_error_that_names_it(tmp_path: Path) -> None:
    """A refused connection is an EvalError naming the endpoint, not the SDK's own
    exception, and the journal keeps what finished (nothing here)."""
    with socket.socket() as sock:  # a port nothing listens on once this closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    runner = HTTPRunner(f"http://127.0.0.1:{port}", model="scripted")

    async def go() -> EvalReport:
        try:
            return await evaluate(
                parse_items(ITEMS), [], runner, journal=tmp_path / "j.jsonl", progress=None
            )
        finally:
            await runner.aclose()

    with pytest.raises(EvalError, match=rf"127\.0\.0\.1:{port}/v1 cannot be reached"):
        anyio.run(go)
