"""Every ```python block of docs/**/*.md and README.md runs here, so the docs cannot rot,
and the docs are linted against the code: every option of ``microagent serve`` and every
built-in mode is documented, every page is linked from the index, every local link resolves.

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
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import attrs
import microagent
import microagent.cli
import microagent.collab
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


# -- the docs match the code -------------------------------------------------------------

#: Pages that document ``microagent serve``'s own options.
SERVE_PAGES = ("http.md", "gpu.md")
#: Generated pages (``bench/report.py``), indexed by BENCHMARKS.md rather than the docs index.
GENERATED = DOCS / "benchmarks"
_OPTION_LINE = re.compile(r"^ {2}(-\w, )?--[\w-]+")  # argparse's action column; prose is deeper


def option_names(help_text: str) -> set[str]:
    """The long options an argparse help lists (the option column only, not the prose)."""
    names: set[str] = set()
    for line in help_text.splitlines():
        if _OPTION_LINE.match(line):
            column = re.split(r"\s{2,}", line.strip())[0]
            names |= set(re.findall(r"--[\w-]+", column))
    return names - {"--help"}


def serve_options_of_microagent(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> set[str]:
    """``microagent serve --help``'s own options: the real parser, built with vLLM hidden so
    that vLLM's engine flags (documented by vLLM) stay out."""
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(SystemExit) as exit_info:
        microagent.cli.build_parser().parse_args(["serve", "--help"])
    assert exit_info.value.code == 0
    return option_names(capsys.readouterr().out)


def _mentions(text: str, flag: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) is not None


def test_every_serve_option_is_documented(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    options = serve_options_of_microagent(capsys, monkeypatch)
    assert {"--host", "--preset", "--engine", "--model"} <= options  # read from the parser
    assert "--tensor-parallel-size" not in options  # vLLM's own, documented by vLLM
    text = "\n".join((DOCS / page).read_text(encoding="utf-8") for page in SERVE_PAGES)
    assert sorted(o for o in options if not _mentions(text, o)) == [], (
        f"serve options missing from docs/{' and docs/'.join(SERVE_PAGES)}"
    )


def test_every_built_in_mode_is_in_the_http_page() -> None:
    built_in = [
        m
        for m in microagent.collab.collaboration_modes()
        if microagent.collab.get_mode(m).__module__.startswith("microagent.")
    ]
    assert {"vote", "graph", "auto", "best_of"} <= set(built_in)
    http = (DOCS / "http.md").read_text(encoding="utf-8")
    assert [m for m in built_in if f"`{m}`" not in http] == []


def _links(path: Path) -> set[Path]:
    """The local pages ``path`` links to (Markdown links, anchors dropped)."""
    text = path.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)", text)
    return {(path.parent / t).resolve() for t in targets if not re.match(r"[a-z]+:", t, re.I)}


def test_every_page_is_linked_from_the_docs_index() -> None:
    index = DOCS / "index.md"
    pages = {
        p.resolve() for p in DOCS.rglob("*.md") if p != index and not p.is_relative_to(GENERATED)
    }
    assert len(pages) > 20
    unlinked = sorted(str(p.relative_to(DOCS)) for p in pages - _links(index))
    assert unlinked == []


def test_the_http_page_links_presets() -> None:
    assert (DOCS / "presets.md").resolve() in _links(DOCS / "http.md")


def _ignored_by_git(paths: list[Path]) -> set[Path]:
    """The paths git ignores: present here, absent from a clean clone (CI's checkout)."""
    if not (ROOT / ".git").exists() or not paths:
        return set()
    done = subprocess.run(
        ["git", "check-ignore", "--stdin"],
        cwd=ROOT,
        input="\n".join(str(p.relative_to(ROOT)) for p in paths),
        capture_output=True,
        text=True,
        check=False,
    )
    return {(ROOT / line).resolve() for line in done.stdout.splitlines() if line}


def test_every_local_link_of_the_docs_resolves() -> None:
    links = [
        (page, target)
        for page in doc_files()
        for target in _links(page)
        if target.is_relative_to(ROOT)
    ]
    ignored = _ignored_by_git([t for _, t in links if t.exists()])
    broken = [
        f"{page.relative_to(ROOT)} -> {target.relative_to(ROOT)}"
        for page, target in links
        if not target.exists() or target in ignored
    ]
    assert broken == []


def test_the_docs_lint_can_fail(tmp_path: Path) -> None:
    help_text = (
        "options:\n  -h, --help            show help\n  --host HOST           bind address,"
        " see --port\n  --api-key API_KEY     a key\n  --admin-key ADMIN_KEY\n"
        "                        --admin-key-file too\n"
    )
    assert option_names(help_text) == {"--host", "--api-key", "--admin-key"}
    assert _mentions("`--api-key`", "--api-key")
    assert not _mentions("`--api-key-file`", "--api-key")
    page = tmp_path / "page.md"
    page.write_text("[a](a.md#x) [b](sub/b.md) [web](https://example.com/c.md)\n")
    assert _links(page) == {(tmp_path / "a.md").resolve(), (tmp_path / "sub/b.md").resolve()}
