"""Shared fixtures: the anyio backends every runtime test runs on."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from _engine import RealEngine
    from microagent.testing import VLLMServer

BACKENDS = [
    pytest.param(("asyncio", {}), id="asyncio"),
    pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
    pytest.param(("trio", {}), id="trio"),
]


#: the backends' ids, in ``BACKENDS``'s order (``--backends`` chooses among them)
BACKEND_IDS = {str(p.id): p.values[0] for p in BACKENDS}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--backends",
        default=",".join(BACKEND_IDS),
        help="comma-separated anyio backends to run the async tests on (default: all three; "
        "make check runs asyncio only, make test all)",
    )


@pytest.fixture(params=BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, object]]:
    """Run ``@pytest.mark.anyio`` tests on asyncio, asyncio+uvloop and trio."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def real_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealEngine]:
    """The one real vLLM engine of the test session (started on first use, ~25 s).

    Yields a ``RealEngine`` (see ``tests/_engine.py``): ``.bridge`` is a
    ``VLLMBridge`` on the embedded default model with LoRA enabled and two
    registered random adapters (``"lora-a"``, ``"lora-b"``); ``.portal`` is the
    asyncio blocking portal whose loop owns it. The bridge is asyncio-only, so
    call it through the portal from any test (sync, or any anyio backend)::

        @pytest.mark.engine
        def test_x(real_engine):
            b = real_engine.bridge
            result = real_engine.call(b.generate, b.handle(ids), Sampling(max_tokens=8))

    Share it, don't break it: leave no request running (``real_engine.assert_idle()``),
    don't close it. Make prompts unique (a nonce) when a test counts cache hits.
    """
    from _engine import real_engine_session

    with real_engine_session(tmp_path_factory.mktemp("real-engine")) as engine:
        yield engine


@pytest.fixture(scope="session")
def vllm_server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[VLLMServer]:
    """vLLM's own OpenAI server on the default model (the "remote" of hybrid tests).

    Served as ``SERVED_NAME`` at ``.base_url``; ``.metrics()`` reads its counters.
    The process starts first and the shared ``real_engine`` boots meanwhile
    (the server needs ~110 s to be healthy, the engine ~25 s).
    """
    from _vllm_server import start_server

    server = start_server(tmp_path_factory.mktemp("vllm-server"))
    try:
        request.getfixturevalue("real_engine")
        server.wait_healthy(timeout=420)
        yield server
    finally:
        server.stop()


#: Fixtures that start something slow, and the mark a test using one must carry: a real
#: vLLM engine (``engine``), a local Ray cluster (``ray``).
SLOW_FIXTURES = {
    "engine": frozenset({"real_engine", "vllm_server", "real_cluster"}),
    "ray": frozenset({"cluster", "real_cluster"}),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the fast/slow split explicit: ``make check`` runs ``-m "not engine and not ray"``,
    so a test that reaches a real engine or a Ray cluster without its mark would slow it
    down unseen; refuse it. ``--backends`` deselects the async tests of other backends."""
    chosen = [b.strip() for b in str(config.getoption("--backends")).split(",") if b.strip()]
    unknown = sorted(set(chosen) - set(BACKEND_IDS))
    if unknown or not chosen:
        raise pytest.UsageError(f"--backends: unknown {unknown}; choose from {list(BACKEND_IDS)}")
    wanted = [BACKEND_IDS[b] for b in chosen]
    dropped = [
        item
        for item in items
        if "anyio_backend" in getattr(getattr(item, "callspec", None), "params", {})
        and item.callspec.params["anyio_backend"] not in wanted  # type: ignore[attr-defined]
    ]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        gone = {id(item) for item in dropped}
        items[:] = [item for item in items if id(item) not in gone]
    for mark, fixtures in SLOW_FIXTURES.items():
        unmarked = [
            item.nodeid
            for item in items
            if fixtures & set(getattr(item, "fixturenames", ()))
            and item.get_closest_marker(mark) is None
        ]
        if unmarked:
            raise pytest.UsageError(
                f"tests that use these fixtures need @pytest.mark.{mark}: "
                + ", ".join(unmarked[:5])
            )
