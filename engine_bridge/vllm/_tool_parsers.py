"""vLLM's tool-call parsers: the names its ``ToolParserManager`` knows, for refusing by name.

``serve --tool-call-parser`` takes vLLM's names. The formats microagent reads
and constrains itself are in ``engine_bridge._tool_formats``; a name vLLM knows
beyond those is refused with a message saying so, an unknown one as unknown.
"""

from __future__ import annotations


def vllm_tool_parsers() -> tuple[str, ...]:
    """The parser names the installed vLLM registers, sorted (none without vLLM)."""
    try:
        from vllm.tool_parsers import ToolParserManager
    except ImportError:  # the scripted engine alone, or an older vLLM
        return ()
    names = {*ToolParserManager.tool_parsers, *ToolParserManager.lazy_parsers}
    return tuple(sorted(names))
