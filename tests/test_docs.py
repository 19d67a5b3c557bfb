"""Every ```python block of docs/**/*.md and README.md runs here, so the docs cannot rot.

One test per block (id ``file:line``). Blocks of one file run in order in one
shared namespace, so a page can build up; a block run on its own first runs
the earlier blocks of its file. A block whose info string says ``fragment``
(```python title="fragment") is a deliberately partial snippet and is not run.

Blocks that use ``VLLMBridge`` (outside comments) run against the shared real engine of the
test session (``real_engine``, marked ``engine``): ``anyio.run`` runs the
snippet's coroutine on the engine's own loop, and ``VLLMBridge(...)`` yields
the shared bridge without closing it. The other blocks run as written
(``anyio.run`` on asyncio, the ``ScriptedEngine``).
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import attrs
import microagent
import microagent.engine_bridge
import pytest
from microagent.collab import collaboration_modes, unregister_mode

if TYPE_CHECKING:
    from _engine import RealEngine

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

#: Pages this runner is responsible for; each must exist and hold at least one python block.
OWNED_PAGES = (
    "index.md",
    "http.md",
    "concepts/actors.md",
    "concepts/mailboxes.md",
    "concepts/kv-handles.md",
    "concepts/engine-bridge.md",
    "concepts/scripted-engine.md",
    "modes/vote.md",
    "modes/debate.md",
    "modes/reflect.md",
    "modes/aggregate.md",
    "modes/cascade.md",
    "modes/compute.md",
    "modes/custom.md",
    "remote.md",
    "observability.md",
    "scale.md",
)

_USES_VLLM = re.compile(r"^[^#\n]*\bVLLMBridge\b", re.MULTILINE)  # outside comments
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@attrs.frozen
class Block:
    """One fenced code block of a Markdown file."""

    path: Path
    line: int  # 1-based line of the opening fence
    language: str
    info: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.language == "python" and "fragment" not in self.info

    @property
    def needs_engine(self) -> bool:
        return _USES_VLLM.search(self.code) is not None


def parse_blocks(path: Path, text: str) -> list[Block]:
    """Every fenced block of ``text`` (CommonMark: ``` or ~~~, closed by a longer-or-equal run)."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        fence, info = m["fence"], m["info"].strip()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines):
            close = _FENCE.match(lines[i])
            if (
                close is not None
                and close["fence"][0] == fence[0]
                and len(close["fence"]) >= len(fence)
                and not close["info"].strip()
            ):
                break
            body.append(lines[i])
            i += 1
        i += 1
        language = info.split()[0].split("{")[0].lower() if info else ""
        blocks.append(Block(path, start + 1, language, info, textwrap.dedent("\n".join(body))))
    return blocks


def doc_files() -> list[Path]:
    files = sorted(DOCS.rglob("*.md")) if DOCS.is_dir() else []
    readme = ROOT / "README.md"
    return [*files, readme] if readme.is_file() else files


def runnable_blocks() -> list[Block]:
    return [
        b for f in doc_files() for b in parse_blocks(f, f.read_text(encoding="utf-8")) if b.runnable
    ]


BLOCKS = runnable_blocks()


class _SharedBridge:
    """What ``VLLMBridge(...)`` returns in a doc block: the session's bridge, never closed."""

    def __init__(self, bridge: Any) -> None:
        self._bridge = bridge

    async def __aenter__(self) -> Any:
        return self._bridge

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


@attrs.define
class _FileState:
    namespace: dict[str, Any]
    done: set[int] = attrs.Factory(set)
    broken: str | None = None


_STATES: dict[Path, _FileState] = {}


def _state(path: Path) -> _FileState:
    if path not in _STATES:
        _STATES[path] = _FileState({"__name__": "__main__", "__file__": str(path)})
    return _STATES[path]


def _exec(block: Block, namespace: dict[str, Any]) -> None:
    # pad with blank lines so tracebacks point at the Markdown file's own line numbers
    source = "\n" * block.line + block.code + "\n"
    exec(compile(source, str(block.path), "exec"), namespace)


def _run(block: Block) -> None:
    """Run the earlier non-engine blocks of the file (once), then ``block``."""
    state = _state(block.path)
    if state.broken is not None:
        pytest.fail(f"an earlier block of this file failed: {state.broken}")
    for earlier in BLOCKS:
        if earlier.path != block.path or earlier.line >= block.line or earlier.needs_engine:
            continue
        if earlier.line not in state.done:
            try:
                _exec(earlier, state.namespace)
            except BaseException:
                state.broken = earlier.id
                raise
            state.done.add(earlier.line)
    try:
        _exec(block, state.namespace)
    except BaseException:
        if not block.needs_engine:
            state.broken = block.id
        raise
    state.done.add(block.line)


@pytest.fixture(scope="module", autouse=True)
def _restore_modes() -> Iterator[None]:
    """Modes a page registers (custom.md) do not leak into other test modules."""
    before = set(collaboration_modes())
    yield
    for name in set(collaboration_modes()) - before:
        unregister_mode(name)


def _params(engine: bool) -> list[Any]:
    return [pytest.param(b, id=b.id) for b in BLOCKS if b.needs_engine == engine]


@pytest.mark.parametrize("block", _params(engine=False))
def test_doc_block(block: Block) -> None:
    _run(block)


@pytest.mark.engine
@pytest.mark.parametrize("block", _params(engine=True))
def test_doc_block_on_real_engine(
    block: Block, real_engine: RealEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    def run(fn: Any, *args: Any, **_: Any) -> Any:
        return real_engine.call(fn, *args)

    def factory(*_args: Any, **_kwargs: Any) -> _SharedBridge:
        return _SharedBridge(real_engine.bridge)

    monkeypatch.setattr(anyio, "run", run)
    monkeypatch.setattr(microagent, "VLLMBridge", factory)
    monkeypatch.setattr(microagent.engine_bridge, "VLLMBridge", factory)
    _run(block)
    real_engine.assert_idle()


# -- the runner itself -------------------------------------------------------------------


@pytest.mark.parametrize("page", OWNED_PAGES)
def test_page_exists_with_a_runnable_block(page: str) -> None:
    path = DOCS / page
    assert path.is_file(), f"missing docs page {page}"
    blocks = parse_blocks(path, path.read_text(encoding="utf-8"))
    assert any(b.runnable for b in blocks), f"{page} has no runnable python block"


def test_parser_finds_fences_lines_and_fragments() -> None:
    text = textwrap.dedent(
        """\
        # Title

        ```python
        x = 1
        ```

        ````python title="fragment"
        ```
        y = undefined
        ````

        ```json
        {"a": 1}
        ```

          ```python
          z = 2
          ```
        """
    )
    blocks = parse_blocks(DOCS / "x.md", text)
    assert [(b.line, b.language, b.runnable) for b in blocks] == [
        (3, "python", True),
        (7, "python", False),
        (12, "json", False),
        (16, "python", True),
    ]
    assert blocks[0].code == "x = 1"
    assert blocks[1].code == "```\ny = undefined"
    assert blocks[3].code == "z = 2"


def test_blocks_share_a_namespace_per_file_and_report_markdown_lines(tmp_path: Path) -> None:
    path = tmp_path / "page.md"
    path.write_text(
        "text\n\n```python\nvalue = 41\n```\n\n"
        "```python\nvalue += 1\nraise ValueError(value)\n```\n"
    )
    first, second = parse_blocks(path, path.read_text())
    namespace: dict[str, Any] = {}
    _exec(first, namespace)
    with pytest.raises(ValueError, match="42") as info:
        _exec(second, namespace)
    assert info.traceback[-1].lineno + 1 == 9  # the raise is on line 9 of the Markdown file


def test_every_docs_block_is_collected() -> None:
    owned = [b for b in BLOCKS if b.path.is_relative_to(DOCS)]
    assert len(owned) >= len(OWNED_PAGES)
    assert all(b.code.strip() for b in BLOCKS), "an empty python block"
