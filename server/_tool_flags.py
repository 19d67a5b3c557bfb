"""``serve --tool-call-parser`` and ``--enable-auto-tool-choice``: each model's tool-call format.

vLLM's front-end flags, with vLLM's names and meaning: the parser names the
format the model writes its calls in (``hermes``, ``llama3_json``…), and
``--enable-auto-tool-choice`` lets ``tool_choice: "auto"`` through (a parser
named without it refuses ``auto`` with vLLM's 400, in ``tool_plan``). Without
either flag the server keeps its own default: Hermes calls described in the
system turn, ``auto`` allowed.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from ..engine_bridge import CALL_PARSERS, EngineBridge, ToolFormat, vllm_tool_parsers


def add_tool_call_options(p: argparse.ArgumentParser) -> None:
    """vLLM's two tool-call flags (read by ``tool_format_of``)."""
    g = p.add_argument_group(
        "tool calls", "the format models write tool calls in, as `vllm serve` takes it"
    )
    g.add_argument(
        "--tool-call-parser",
        metavar="NAME",
        help="the parser of the models' tool calls, by vLLM's name: "
        f"{', '.join(CALL_PARSERS)}. A model whose chat template has a tool format "
        "gets its tools rendered by it; calls under tool_choice required or a named "
        "function are constrained to the parser's format. Without it: Hermes "
        "<tool_call> calls described in the system turn (docs/tools.md)",
    )
    g.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help='allow tool_choice "auto" with --tool-call-parser (as vLLM, a parser named '
        'without it refuses "auto"); without a parser, "auto" is always allowed',
    )


def tool_format_of(args: argparse.Namespace) -> ToolFormat:
    """The format the flags ask for; a ValueError (a usage error) names the flag at fault."""
    parser: str | None = getattr(args, "tool_call_parser", None)
    auto = bool(getattr(args, "enable_auto_tool_choice", False))
    if parser is None:
        if auto:
            raise ValueError("--enable-auto-tool-choice requires --tool-call-parser")
        return ToolFormat()
    if parser not in CALL_PARSERS:
        known = vllm_tool_parsers()
        if parser in known:
            raise ValueError(
                f"--tool-call-parser {parser}: vLLM's {parser!r} format is not read or "
                f"constrained here; microagent serves {', '.join(CALL_PARSERS)}"
            )
        raise ValueError(
            f"--tool-call-parser {parser!r}: unknown parser (supported: {', '.join(CALL_PARSERS)})"
        )
    return ToolFormat(parser, templated=True, auto=auto)


def apply_tool_format(bridges: Iterable[EngineBridge], call_format: ToolFormat) -> None:
    """Every served model writes its calls in ``call_format`` (vLLM's flag: one per server)."""
    for bridge in bridges:
        bridge.tool_format = call_format
