"""vLLM's own engine flags on ``microagent serve`` and ``run``, read vLLM's way.

``engine_parser`` builds a command's parser on vLLM's ``FlexibleArgumentParser``
with ``AsyncEngineArgs.add_cli_args`` (so ``--tensor-parallel-size``, ``--dtype``,
``--config FILE``, ``--json-arg.key value`` and ``--flag_name`` all work as with
``vllm serve``), microagent's options beside them. vLLM owns the names both
define (``--max-num-seqs``, ``--max-num-batched-tokens``, ``--max-model-len``,
``--log-level``); microagent keeps a repeatable ``--model`` in place of vLLM's
single one. Importing vLLM takes seconds and sets up its logging, so the parser
is built only when a command that needs it is parsed, after the engine logs are
quieted; where vLLM is not importable the command parses microagent's options
alone (``--engine scripted`` needs no more).

``bridge_settings`` turns the parsed flags into ``VLLMBridge`` arguments. Only
flags the user gave (a value other than the parser's default) reach the engine,
so vLLM chooses the rest for the device, and the bridge keeps its measured CPU
pins on the CPU backend. Flags that would break the product are refused by name.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NoReturn

import attrs

#: vLLM's engine flags ``VLLMBridge`` takes as its own arguments (the rest pass through)
BRIDGE_FLAGS = {
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "enable_lora": "enable_lora",
    "max_lora_rank": "max_lora_rank",
    "max_loras": "max_loras",
    "scheduling_policy": "scheduling_policy",
}
#: vLLM engine arguments that configure a KV tier of their own (one tier, one way to say it)
KV_TIER_ENGINE_ARGS = ("kv_offloading_size", "kv_transfer_config")
_GIB = 1 << 30

#: the note on engine sizes that ``serve --help`` and ``run --help`` show
ENGINE_SIZES_NOTE = (
    "Every model gets an engine of its own, and vLLM's engine flags apply to each "
    "alike (--served-model-name names the first). Only the flags you give reach vLLM: "
    "the rest are vLLM's defaults for the device. On vLLM's CPU backend the sizes "
    "you do not give are pinned to what was measured on a small CPU machine: "
    "--max-num-seqs 16, --max-num-batched-tokens 2048 and --max-model-len 4096 (the "
    "model's own length when smaller)."
)


@attrs.frozen
class EngineFlags:
    """vLLM's engine flags on a parsed command: each flag's destination, its name
    and its default, so that what the user gave is told from what vLLM would choose.

    Attributes:
        names: destination -> the flag's name (``max_num_seqs`` -> ``--max-num-seqs``).
        defaults: destination -> the parser's default.
    """

    names: Mapping[str, str]
    defaults: Mapping[str, object]


def vllm_importable() -> bool:
    """Whether vLLM can be imported here (looked up, not imported)."""
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):  # a broken or hidden package
        return False


def engine_parser(
    prog: str,
    add_options: Callable[[argparse.ArgumentParser], None],
    *,
    description: str | None = None,
    usage: str | None = None,
    verbose: bool | None = None,
    raise_errors: bool = False,
) -> argparse.ArgumentParser:
    """A parser with microagent's options (``add_options``) and, when vLLM is
    importable, vLLM's engine flags on vLLM's ``FlexibleArgumentParser``.

    Args:
        prog: the command (``microagent serve``).
        add_options: adds microagent's own options.
        description: the command's description.
        usage: the usage line (vLLM's flags would make argparse's hundreds of lines long).
        verbose: ``--verbose`` was given: vLLM's import may print as it likes;
            otherwise its logs go to the engine log file (``quiet_engine_logs``).
        raise_errors: a bad option raises ``ValueError`` instead of exiting.
    """
    if not vllm_importable():
        base: type[argparse.ArgumentParser] = argparse.ArgumentParser
        cls = _raising(base) if raise_errors else base
        parser = cls(prog=prog, description=description, usage=usage)
        add_options(parser)
        parser.set_defaults(engine_flags=None)
        return parser
    engine_args = _import_engine_args(verbose)
    flexible = importlib.import_module("vllm.utils.argparse_utils").FlexibleArgumentParser
    cls = type("EngineCommandParser", (_HelpFirst, flexible), {})
    if raise_errors:
        cls = _raising(cls)
    parser = cls(prog=prog, description=description, usage=usage)
    before = set(parser._actions)
    groups_before = list(parser._action_groups)
    engine_args.add_cli_args(parser)
    _drop_option(parser, "--model")  # microagent's is repeatable (MODEL and --model)
    vllm_actions = [a for a in parser._actions if a not in before and a.option_strings]
    vllm_groups = [g for g in parser._action_groups if g not in groups_before]
    add_options(parser)
    assert isinstance(parser, _HelpFirst)
    parser.vllm_groups = vllm_groups
    parser.vllm_actions = set(vllm_actions)
    parser.set_defaults(
        engine_flags=EngineFlags(
            names={a.dest: _long_name(a.option_strings) for a in vllm_actions},
            defaults={a.dest: a.default for a in vllm_actions},
        )
    )
    return parser


def _import_engine_args(verbose: bool | None) -> Any:
    """vLLM's ``AsyncEngineArgs``, imported after the engine logs are quieted: vLLM
    sets up its logging when first imported, and would print to the terminal."""
    if "vllm" not in sys.modules:
        from ..console import quiet_engine_logs

        quiet_engine_logs(verbose)
    return importlib.import_module("vllm.engine.arg_utils").AsyncEngineArgs


def _raising(base: type[argparse.ArgumentParser]) -> type[argparse.ArgumentParser]:
    """``base`` whose usage errors raise ``ValueError`` (``serve_options``, the cluster)."""

    def error(self: argparse.ArgumentParser, message: str) -> NoReturn:
        raise ValueError(message)

    return type(f"Raising{base.__name__}", (base,), {"error": error})


def _long_name(option_strings: Sequence[str]) -> str:
    return next((o for o in option_strings if o.startswith("--")), option_strings[0])


def _drop_option(parser: argparse.ArgumentParser, option: str) -> None:
    """Remove ``option`` from ``parser`` (argparse's own ``conflict_handler='resolve'``
    step, for one name only: any other clash stays an error)."""
    action = parser._option_string_actions.pop(option, None)
    if action is None:  # vLLM leaves --model out of `serve --help`
        return
    action.option_strings = [o for o in action.option_strings if o != option]
    if not action.option_strings:
        container: Any = getattr(action, "container", parser)  # the group it was added to
        container._remove_action(action)


class _HelpFirst(argparse.ArgumentParser):
    """``--help`` on vLLM's parser with microagent's options in full first, then
    vLLM's flags listed by group (vLLM's own ``--help=all`` / ``--help=GROUP`` /
    ``--help=WORD`` give their descriptions, as with ``vllm serve``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.vllm_groups: list[argparse._ArgumentGroup] = []
        self.vllm_actions: set[argparse.Action] = set()

    def _get_formatter(self) -> argparse.HelpFormatter:
        formatter = super()._get_formatter()
        ours = {a for a in self._actions if a not in self.vllm_actions}
        plain = argparse.HelpFormatter._get_help_string
        base = formatter._get_help_string

        def help_string(action: argparse.Action) -> str | None:
            # our help texts state their defaults; vLLM's get argparse's "(default: …)"
            return plain(formatter, action) if action in ours else base(action)

        formatter._get_help_string = help_string  # type: ignore[method-assign]
        return formatter

    def format_help(self) -> str:
        if getattr(type(self), "_search_keyword", None) is not None:
            try:
                return super().format_help()  # vLLM's --help=all / GROUP / WORD
            finally:  # vLLM keeps the word on its class: the next --help is a plain one
                for klass in type(self).__mro__:
                    if "_search_keyword" in vars(klass):
                        klass._search_keyword = None  # type: ignore[attr-defined]
        formatter = self._get_formatter()
        width = max(formatter._width - 4, 40)

        def wrapped(text: str | None, indent: str = "") -> str:
            return textwrap.fill(
                " ".join((text or "").split()),
                width,
                initial_indent=indent,
                subsequent_indent=indent + "  ",
            )

        formatter.add_usage(self.usage, self._actions, self._mutually_exclusive_groups)
        formatter.add_text(wrapped(self.description))
        for group in self._action_groups:
            ours = [a for a in group._group_actions if a not in self.vllm_actions]
            if group in self.vllm_groups or not ours:
                continue
            formatter.start_section(group.title)
            formatter.add_text(wrapped(group.description))
            formatter.add_arguments(ours)
            formatter.end_section()
        formatter.start_section(
            "vLLM's engine flags (--help=all shows their help; --help=GROUP one group, "
            "--help=WORD the flags naming WORD)"
        )
        grouped = {a for g in self.vllm_groups for a in g._group_actions}
        listed = [(g.title or "", list(g._group_actions)) for g in self.vllm_groups]
        listed.append(("other", [a for a in self.vllm_actions if a not in grouped]))
        for title, actions in listed:
            names = sorted(_long_name(a.option_strings) for a in actions if a.option_strings)
            if names:
                formatter.add_text(wrapped(f"{title}: {' '.join(names)}"))
        formatter.end_section()
        formatter.add_text(self.epilog)
        return formatter.format_help()


def given_engine_flags(args: argparse.Namespace) -> dict[str, object]:
    """vLLM's engine flags the user gave: those whose value is not the parser's default
    (giving a flag its default value is the same as not giving it)."""
    flags: EngineFlags | None = getattr(args, "engine_flags", None)
    if flags is None:
        return {}
    return {
        dest: getattr(args, dest)
        for dest, default in flags.defaults.items()
        if hasattr(args, dest) and getattr(args, dest) != default
    }


def flag_name(args: argparse.Namespace, dest: str) -> str:
    """The flag that sets ``dest`` (``--max-num-seqs`` for ``max_num_seqs``)."""
    flags: EngineFlags | None = getattr(args, "engine_flags", None)
    if flags is not None and dest in flags.names:
        return flags.names[dest]
    return "--" + dest.replace("_", "-")


@attrs.frozen
class BridgeSettings:
    """What the engine flags ask of every ``VLLMBridge`` of a command.

    Attributes:
        bridge: ``VLLMBridge`` keyword arguments (sizes, LoRA, the KV tier).
        engine_args: the rest, passed through as ``AsyncEngineArgs`` fields.
        served_name: ``--served-model-name`` (names the first model), or None.
    """

    bridge: Mapping[str, object]
    engine_args: Mapping[str, object]
    served_name: str | None = None


def bridge_settings(args: argparse.Namespace, engine_args: Mapping[str, Any]) -> BridgeSettings:
    """The ``VLLMBridge`` arguments of parsed ``serve``/``run`` options.

    Args:
        args: the parsed command (its engine flags, ``--kv-*`` options).
        engine_args: the ``--engine-arg KEY=VALUE`` pairs, values parsed.

    Raises:
        ValueError: a flag that would break microagent, or one thing said twice;
            the message names the flag.
    """
    given = given_engine_flags(args)
    extra = dict(engine_args)
    both = sorted(set(given) & set(extra))
    if both:
        raise ValueError(
            f"{flag_name(args, both[0])} and --engine-arg {both[0]} both set {both[0]}: give one"
        )
    _refuse_breaking(args, given)
    bridge: dict[str, object] = {}
    for dest, keyword in BRIDGE_FLAGS.items():
        if dest in given:
            bridge[keyword] = given.pop(dest)
    length = given.pop("max_model_len", None)
    if isinstance(length, int) and length > 0:
        bridge["max_model_len"] = length
    elif length is not None:  # -1 / auto: vLLM fits the length to the memory
        given["max_model_len"] = length
    names = given.pop("served_model_name", None)
    served = str(next(iter(names))) if isinstance(names, Iterable) and names else None
    bridge.update(_kv_tier(args, given, extra))
    return BridgeSettings(bridge=bridge, engine_args={**given, **extra}, served_name=served)


def _refuse_breaking(args: argparse.Namespace, given: Mapping[str, object]) -> None:
    """The flags that would take away what microagent is for, refused by name."""
    if given.get("enable_prefix_caching") is False:
        raise ValueError(
            "--no-enable-prefix-caching is refused: microagent's agents share their "
            "context, and sessions keep theirs, in vLLM's prefix cache; it stays on"
        )
    if "scheduler_cls" in given:
        raise ValueError(
            "--scheduler-cls is refused: microagent runs its own scheduler (a subclass of "
            "vLLM's that retains a conversation's KV between turns)"
        )
    if "tokenizer" in given:
        raise ValueError(
            "--tokenizer is refused: microagent tokenizes prompts itself with the model's "
            "own tokenizer, and the engine must decode with the same one"
        )
    names = given.get("served_model_name")
    if isinstance(names, Sequence) and not isinstance(names, str) and len(names) > 1:
        raise ValueError(
            "--served-model-name takes one name here (it names the first model; serve "
            "another model with --model)"
        )
    policy = given.get("scheduling_policy")
    if policy is not None and policy not in ("priority", "fcfs"):
        raise ValueError(f"--scheduling-policy {policy}: microagent runs priority or fcfs")


def _kv_tier(
    args: argparse.Namespace, given: dict[str, object], extra: Mapping[str, object]
) -> dict[str, object]:
    """The KV tier's bridge arguments: ``--kv-host-bytes``, or vLLM's
    ``--kv-offloading-size`` read as the same tier; never two tiers.

    ``--kv-offloading-size N`` is vLLM's native CPU offloading (its
    ``OffloadingConnector``) with an N GiB buffer, which is what microagent's host tier
    is: it becomes ``--kv-host-bytes N GiB``, under ``--kv-tier-policy`` (``lru`` is
    vLLM's own eviction).
    """
    host: int = args.kv_host_bytes
    backend = given.pop("kv_offloading_backend", None)
    size = given.pop("kv_offloading_size", None)
    if backend is not None and backend != "native":
        raise ValueError(
            f"--kv-offloading-backend {backend} is refused: microagent's KV tier is vLLM's "
            "native CPU offloading (--kv-host-bytes or --kv-offloading-size)"
        )
    if size is not None:
        if host:
            raise ValueError(
                "--kv-offloading-size and --kv-host-bytes each configure a KV tier below the "
                "engine's cache: give one of them"
            )
        host = int(float(str(size)) * _GIB)
    if host:
        doubled = [k for k in KV_TIER_ENGINE_ARGS if k in given]
        if doubled:
            raise ValueError(
                f"{flag_name(args, doubled[0])} and --kv-host-bytes each configure a KV tier "
                "below the engine's cache: give one of them"
            )
        doubled = [k for k in KV_TIER_ENGINE_ARGS if k in extra]
        if doubled:
            raise ValueError(
                f"--kv-host-bytes and --engine-arg {'/'.join(doubled)} each configure a KV "
                "tier below the engine's cache: give one of them"
            )
    if args.kv_disk_bytes and not host:
        raise ValueError("--kv-disk-bytes needs --kv-host-bytes: the file tier sits under RAM")
    if args.kv_tier_policy is not None and not host:
        raise ValueError("--kv-tier-policy needs --kv-host-bytes (or --kv-offloading-size)")
    return {
        "host_tier_bytes": host,
        "disk_tier_bytes": args.kv_disk_bytes,
        "tier_policy": args.kv_tier_policy or "sessions",
    }
