"""schemathesis against the live server on the ScriptedEngine: every check, the success path too.

Every built-in check runs on every response (no 5xx, status codes, content
types, headers and bodies as documented, SSE events as documented…). One
allowance, stated here: ``positive_data_acceptance`` accepts a 400 for a
schema-valid body. The server's semantic rules cannot all be JSON Schema (a
tool message must answer an earlier call's id, a model must be one this server
serves, a mode must be registered), and a 400 that names the field is the
documented answer to them.

Plain schema-driven bodies almost never pass those rules (measured: 0 of 200
answered 200), so half of the cases start from a valid request (a plain
completion, a stream, a vote, a streamed debate) and take up to two fields from
a schemathesis-generated body. The fraction of 200s is printed and must stay
above ``SUCCESS_FLOOR``. A short run does the same on the real engine (generations
capped at 16 tokens): no 5xx, no check failing there either.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from microagent.server import ServerLimits
from schemathesis.checks import CHECKS, load_all_checks
from test_server_helpers import LiveServer, live_server, scripted

if TYPE_CHECKING:
    from _engine import RealEngine

#: The least fraction of fuzzed chat requests that must answer 200 (measured: 0.43).
SUCCESS_FLOOR = 0.3
EXAMPLES = 300
REAL_EXAMPLES = 40
LIMITS = ServerLimits(max_agents_per_spec=6, max_total_agents=8)

USER = [{"role": "user", "content": "Is it yes or no?"}]
VALID: list[dict[str, Any]] = [
    {"messages": USER, "max_tokens": 8},
    {"messages": USER, "max_tokens": 8, "stream": True},
    {
        "messages": USER,
        "max_tokens": 8,
        "agents": [{"name": "voter", "count": 3}],
        "collaboration": {"mode": "vote", "answer": {"choices": ["yes", "no"]}},
    },
    {
        "messages": USER,
        "max_tokens": 8,
        "stream": True,
        "agents": [{"name": "debater", "count": 2}],
        "collaboration": {"mode": "debate", "rounds": 1},
    },
]


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(scripted(reply_words=(1, 4)), limits=LIMITS) as srv:
        yield srv


def fuzz(server: LiveServer, examples: int, cap: bool = False) -> float:
    """Run schemathesis with every check on ``server``; the fraction of chat requests with 200.

    ``cap`` keeps generations short (a real engine on a CPU decodes ~26 tokens/s):
    ``max_tokens`` at most 16 and ``n`` at most 2, values the schema allows.
    """
    config = schemathesis.Config.from_dict(
        {"checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "400"]}}}
    )
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json", config=config)
    load_all_checks()
    checks = [c for c in CHECKS.get_all() if not isinstance(c, type)]
    chat = schema["/v1/chat/completions"]["POST"]

    @st.composite
    def near_valid(draw: st.DrawFn) -> Any:
        case = draw(chat.as_strategy())
        body = copy.deepcopy(draw(st.sampled_from(VALID)))
        fuzzed = case.body if isinstance(case.body, dict) else {}
        if fuzzed:
            for field in draw(st.sets(st.sampled_from(sorted(fuzzed)), max_size=2)):
                body[field] = fuzzed[field]
        case.body = body
        return case

    statuses: Counter[tuple[str, int]] = Counter()

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=st.one_of(schema.as_strategy(), near_valid()))
    def run(case: Any) -> None:
        if cap and isinstance(case.body, dict):
            for key, most in (("max_tokens", 16), ("max_completion_tokens", 16), ("n", 2)):
                value = case.body.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value > most:
                    case.body[key] = most
        response = case.call(base_url=server.url, timeout=120)
        statuses[(case.operation.path, response.status_code)] += 1
        case.validate_response(response, checks=checks)  # raises on any failed check

    run()
    chat_statuses = Counter({s: n for (path, s), n in statuses.items() if "chat" in path})
    fraction = chat_statuses[200] / sum(chat_statuses.values())
    print(
        f"schemathesis: {sum(statuses.values())} cases, {len(checks)} checks; "
        f"chat completions {dict(chat_statuses)}: {fraction:.0%} answered 200"
    )
    assert not [s for (_, s), _n in statuses.items() if s >= 500]
    return fraction


def test_schemathesis_finds_nothing_and_reaches_the_success_path(server: LiveServer) -> None:
    fraction = fuzz(server, EXAMPLES)
    print(f"success path: {fraction:.0%} (floor {SUCCESS_FLOOR:.0%})")
    assert fraction >= SUCCESS_FLOOR
    assert not server.engines["scripted"].live_requests()


@pytest.mark.engine
def test_schemathesis_short_run_on_the_real_engine(real_engine: RealEngine) -> None:
    bridge = real_engine.bridge
    with live_server(
        lambda: {bridge.model: bridge},
        portal=real_engine.portal,
        open_engines=False,
        limits=LIMITS,
    ) as srv:
        fraction = fuzz(srv, REAL_EXAMPLES, cap=True)
    assert fraction > 0  # the success path is reached on the real engine too
    real_engine.assert_idle(30)
