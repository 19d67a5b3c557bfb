"""The browser view at /ui, end to end in a real headless Chromium (Debian's) driven by Playwright.

The server is the real app under uvicorn on a ScriptedEngine whose voters take
their time: one of them reasons for much longer than the others, so the vote
is decided without it and it is pruned while the page watches. ``make test``
installs Debian's ``chromium`` when it is missing (``make browser``).

Set ``UPDATE_SCREENSHOTS=1`` to also copy the screenshot to ``docs/img/ui.png``
(the README's picture).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from microagent.engine_bridge import EngineRequest
from microagent.testing import ScriptedEngine
from test_server_helpers import LiveServer, live_server, real_server

if TYPE_CHECKING:
    from _engine import RealEngine

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
API_KEY = "ui-test-key"
QUESTION = "Is 17 a prime number?"
CONTEXT = "A prime number has exactly two divisors: 1 and itself."
REASONS = [
    "17 is not divisible by 2, 3 or any number up to its square root, so it is prime.",
    "Checking each divisor in turn: 2 does not divide 17, 3 does not divide 17, "
    "4 does not divide 17, 5 does not divide 17, and I should also look at 6, 7, 8, "
    "9, 10, 11, 12, 13, 14, 15 and 16 before I say anything at all about it. " * 3,
    "Its only divisors are 1 and 17, which is the definition of a prime.",
    "17 = 1 x 17 and no other product of whole numbers gives 17, so yes.",
    "The primes below 20 are 2, 3, 5, 7, 11, 13, 17 and 19: 17 is one of them.",
]
#: records each text the run state shows (a check after the fact cannot race the run)
STATE_WATCH = """
window.states = [];
const state = document.getElementById("state");
new MutationObserver(() => window.states.push(state.textContent)).observe(
  state, { childList: true, characterData: true, subtree: true });
"""
REVIEW = "The voters agree: 17 is prime (its only divisors are 1 and 17)."


def voting_engine() -> ScriptedEngine:
    """Five voters reason (the second at length) and answer yes; then the aggregator writes."""
    lock = threading.Lock()
    calls = [0]

    def script(prompt: tuple[int, ...], request: EngineRequest) -> str | None:
        if request.sampling.choices:
            return "yes"
        with lock:
            calls[0] += 1
            n = calls[0]
        return REASONS[n - 1] if n <= len(REASONS) else REVIEW

    return ScriptedEngine(script=script, decode_time_per_token=0.01)


@pytest.fixture
def server() -> Iterator[LiveServer]:
    with live_server(lambda: {"scripted": voting_engine()}, api_key=API_KEY) as srv:
        yield srv


def test_the_page_needs_no_key_but_the_api_does(server: LiveServer) -> None:
    page = httpx.get(f"{server.url}/ui")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "connect-src 'self'" in page.headers["content-security-policy"]
    for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css")):
        asset = httpx.get(f"{server.url}/ui/{name}")
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind)
        assert asset.text
    assert httpx.get(f"{server.url}/ui/secrets.py").status_code == 404
    assert httpx.get(f"{server.url}/v1/models").status_code == 401
    assert httpx.post(f"{server.url}/ui", json={}).status_code == 401  # only GET is open
    assert httpx.get(f"{server.url}/v1/models", headers=server.headers).status_code == 200


def test_the_page_loads_nothing_from_elsewhere() -> None:
    """No CDN: every URL in the page's files is this server's (the SVG namespace aside)."""
    for name in ("index.html", "app.js", "style.css"):
        text = (ROOT / "server" / "ui" / name).read_text()
        urls = set(re.findall(r"(?:https?:)?//[\w.-]+\.[a-z]{2,}[^\s\"')]*", text))
        assert urls <= {"http://www.w3.org/2000/svg"}, (name, urls)


@pytest.fixture
def chromium_path() -> str:
    if not CHROMIUM.exists():
        message = "Debian's chromium is not installed (`make browser` installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return str(CHROMIUM)


def test_a_vote_streams_into_one_lane_per_agent(
    server: LiveServer, chromium_path: str, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            page.goto(f"{server.url}/ui")

            # the server wants a key: the page asks for it, then lists the models
            expect(page.locator("#key-row")).to_be_visible()
            page.fill("#api-key", API_KEY)
            page.press("#api-key", "Tab")
            expect(page.locator("#server")).to_have_class(re.compile(r"\bok\b"))
            expect(page.locator("#model option")).to_have_text(["scripted"])

            # five voters and an aggregator, a question and a context
            page.select_option("#mode", "vote")
            page.fill(".agent-row .agent-count", "5")
            page.click("#add-agent")
            expect(page.locator(".agent-row")).to_have_count(2)
            page.fill("#choices", "yes,no")
            page.fill("#max-tokens", "400")
            page.fill("#question", QUESTION)
            page.fill("#context", CONTEXT)
            page.evaluate(STATE_WATCH)  # every state the page shows, however briefly
            page.click("#run")

            # one lane per agent appears and fills as the agents stream
            lanes = page.locator(".lane")
            expect(lanes).to_have_count(6, timeout=15_000)
            first = page.locator('.lane[data-agent="voter-1"]')
            expect(first.locator(".text")).to_contain_text("17 is not divisible")

            # the vote is decided without the slow voter: it is pruned, marked so
            slow = page.locator('.lane[data-agent="voter-2"]')
            expect(slow).to_have_class(re.compile(r"\bpruned\b"), timeout=15_000)
            expect(slow.locator(".badge")).to_contain_text("pruned")
            expect(page.locator(".vote[data-choice='yes'] .count")).to_have_text(
                re.compile(r"^[3-5]$")
            )

            # then the answer, the token accounting and the timeline
            expect(page.locator("#answer")).to_have_text(REVIEW, timeout=15_000)
            expect(page.locator("#state")).to_have_text("done")
            assert page.evaluate("window.states")[:2] == ["running", "done"]
            expect(page.locator('.lane[data-agent="aggregator"] .badge')).to_have_text("done")
            expect(page.locator("#usage")).to_contain_text("cached")
            expect(page.locator("#agent-table tr.pruned", has_text="voter-2")).to_have_count(1)
            expect(page.locator("#timeline rect.span.pruned")).not_to_have_count(0)
            assert page.locator("#timeline rect.span").count() >= 6
            for lane in lanes.all():
                expect(lane.locator(".tokens")).to_contain_text("generated")

            shot = tmp_path / "ui.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("UPDATE_SCREENSHOTS"):
        target = ROOT / "docs" / "img" / "ui.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, target)
    # the only failed request is the first /v1/models, before the key was given
    assert [e for e in errors if "status of 401" not in e] == []


def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def test_tool_calls_show_in_the_lanes(chromium_path: str, tmp_path: Path) -> None:
    from microagent.collab import Tool
    from playwright.sync_api import expect, sync_playwright

    with (
        live_server(
            lambda: {"scripted": ScriptedEngine()}, tools=[Tool.from_function(weather)]
        ) as srv,
        sync_playwright() as pw,
    ):
        browser = pw.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            page.goto(f"{srv.url}/ui")
            expect(page.locator("#model option")).to_have_text(["scripted"])
            page.select_option("#mode", "debate")
            page.fill(".agent-row .agent-count", "2")
            page.fill("#tools", "weather")
            page.check("#tools-required")
            page.fill("#question", "Is it sunny in Oslo?")
            page.click("#run")
            expect(page.locator("#state")).to_have_text("done", timeout=15_000)
            lane = page.locator('.lane[data-agent="agent-1"], .lane').first
            expect(lane.locator(".tool").first).to_contain_text("⚙ weather(")
            expect(page.locator(".lane .tool", has_text="sunny in")).not_to_have_count(0)
            expect(page.locator("#timeline line.tool-tick")).not_to_have_count(0)
            page.screenshot(path=str(tmp_path / "ui-tools.png"), full_page=True)
        finally:
            browser.close()


def _open(pw: Any, chromium_path: str, url: str, errors: list[str]) -> tuple[Any, Any]:
    browser = pw.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{url}/ui")
    return browser, page


def test_a_split_free_vote_says_no_answer_won_and_an_empty_question_is_refused(
    chromium_path: str,
) -> None:
    from playwright.sync_api import expect, sync_playwright

    replies = iter(["red", "green", "blue"])
    lock = threading.Lock()

    def script(prompt: tuple[int, ...], request: EngineRequest) -> str:
        with lock:
            return next(replies, "grey")

    posted: list[str] = []
    errors: list[str] = []
    with (
        live_server(lambda: {"scripted": ScriptedEngine(script=script)}) as srv,
        sync_playwright() as pw,
    ):
        browser, page = _open(pw, chromium_path, srv.url, errors)
        try:
            page.on(
                "request",
                lambda r: posted.append(r.post_data or "") if r.method == "POST" else None,
            )
            expect(page.locator("#model option")).to_have_text(["scripted"])
            page.fill("#question", "   ")
            page.click("#run")
            expect(page.locator("#error")).to_contain_text("Type a question")
            assert posted == []  # nothing was sent

            page.fill("#question", "Name a colour.")
            page.fill("#choices", "")
            page.click("#run")
            expect(page.locator("#state")).to_have_text("done", timeout=30_000)
            expect(page.locator("#answer")).to_have_text("No answer won: the votes split 1/1/1.")
        finally:
            browser.close()
    assert errors == []


@pytest.mark.engine
def test_an_untouched_first_run_on_the_real_engine_votes_on_the_shown_choices(
    real_engine: RealEngine, chromium_path: str
) -> None:
    """A new user opens /ui and presses Run without typing: the question and the choices the
    page shows are what is sent, and the page announces a choice (or that none won)."""
    from playwright.sync_api import expect, sync_playwright

    posted: list[dict[str, Any]] = []
    errors: list[str] = []
    with (
        real_server(real_engine) as srv,
        sync_playwright() as pw,
    ):
        browser, page = _open(pw, chromium_path, srv.url, errors)
        try:
            page.on(
                "request",
                lambda r: (
                    posted.append(json.loads(r.post_data or "{}")) if r.method == "POST" else None
                ),
            )
            expect(page.locator("#model option")).not_to_have_count(0)
            page.click("#run")
            expect(page.locator("#state")).to_have_text("done", timeout=240_000)
            answer = page.locator("#answer").text_content() or ""
            votes = page.locator(".vote b").all_text_contents()
        finally:
            browser.close()
    (body,) = posted
    assert body["messages"][-1]["content"] == QUESTION
    assert body["collaboration"]["answer"] == {"choices": ["yes", "no"]}
    assert votes and set(votes) <= {"yes", "no"}
    assert answer in ("yes", "no") or answer.startswith("No answer won"), answer
    assert errors == []
    real_engine.assert_idle(30)
