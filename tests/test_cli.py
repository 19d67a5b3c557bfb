"""The ``microagent`` command line: help, run (on the ScriptedEngine), prepare, errors."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from microagent.cli import build_parser, main


@pytest.mark.parametrize(
    "argv", [["--help"], ["serve", "--help"], ["run", "--help"], ["prepare", "--help"]]
)
def test_help_everywhere(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: microagent")


def test_version_names_microagent_and_vllm(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``microagent --version``: both versions a bug report needs; without vLLM, ours alone."""
    import importlib.util

    import microagent

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    vllm = r" \(vLLM \d\S*\)" if importlib.util.find_spec("vllm") else ""
    assert re.fullmatch(rf"microagent {re.escape(microagent.__version__)}{vllm}\n", out)

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "vllm" else find_spec(name, *a),
    )
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out == f"microagent {microagent.__version__}\n"


def test_no_command_prints_help_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "serve" in capsys.readouterr().err


def test_serve_options_parse() -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--model",
            "default",
            "--model",
            "/m2",
            "--port",
            "9000",
            "--api-key",
            "k",
            "--adapter",
            "a=/p",
            "--max-num-seqs",
            "8",
            "--engine-arg",
            "enforce_eager=true",
        ]
    )
    assert args.models == ["default", "/m2"] and args.max_num_seqs == 8
    assert args.adapter == [("a", "/p")]
    assert args.engine_arg == [("enforce_eager", "true")]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--adapter", "no-equals"])


def test_the_scripted_engine_takes_its_timing_from_engine_args() -> None:
    from microagent.server import CliError
    from microagent.server._served import make_bridges

    argv = ["serve", "--engine", "scripted", "--engine-arg", "decode_time_per_token=0.01"]
    (engine,) = make_bridges(build_parser().parse_args(argv))
    assert engine.decode_time_per_token == 0.01  # type: ignore[attr-defined]
    assert engine.history_limit == 1024  # type: ignore[attr-defined]  # a served one is bounded
    bad = build_parser().parse_args([*argv, "--engine-arg", "enforce_eager=true"])
    with pytest.raises(CliError, match="not enforce_eager"):
        make_bridges(bad)


def test_kv_tier_budgets_reach_the_bridge_and_one_tier_is_said_one_way(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from microagent.engine_bridge import VLLMBridge
    from microagent.server import CliError
    from microagent.server._served import make_bridges

    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "--kv-host-bytes" in shown and "--kv-disk-bytes" in shown
    argv = ["serve", "--kv-host-bytes", "512MiB", "--kv-disk-bytes", "2GiB"]
    (bridge,) = make_bridges(build_parser().parse_args(argv))
    assert isinstance(bridge, VLLMBridge)
    assert (bridge.host_tier_bytes, bridge.disk_tier_bytes) == (512 << 20, 2 << 30)
    (plain,) = make_bridges(build_parser().parse_args(["serve"]))
    assert isinstance(plain, VLLMBridge) and plain.host_tier_bytes == plain.disk_tier_bytes == 0
    for engine_arg in ("kv_offloading_size=4", 'kv_transfer_config={"kv_connector":"x"}'):
        doubled = build_parser().parse_args(
            ["serve", "--kv-host-bytes", "1048576", "--engine-arg", engine_arg]
        )
        with pytest.raises(CliError, match=f"--kv-host-bytes and --engine-arg {engine_arg[:12]}"):
            make_bridges(doubled)
    with pytest.raises(CliError, match="--kv-disk-bytes needs --kv-host-bytes"):
        make_bridges(build_parser().parse_args(["serve", "--kv-disk-bytes", "1GiB"]))
    for bad in ("-1", "2GB", "lots"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", "--kv-host-bytes", bad])


# -- vLLM's engine flags, vLLM's way --------------------------------------------------------

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM's engine flags need vLLM"
)


@needs_vllm
def test_serve_help_lists_vllm_engine_flags_beside_ours(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["serve", "--help"])
    assert info.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())
    for flag in (
        "--tensor-parallel-size",
        "--gpu-memory-utilization",
        "--dtype",
        "--quantization",
        "--enable-prefix-caching",
        "--kv-offloading-size",
        "--max-num-seqs",
        "--max-model-len",
        "--served-model-name",
        "--log-level",
    ):
        assert flag in shown, flag
    for ours in ("--uvicorn-log-level", "--kv-tier-policy", "--kv-host-bytes", "--model MODEL"):
        assert ours in shown, ours
    assert "--max-num-seqs 16, --max-num-batched-tokens 2048 and --max-model-len 4096" in shown
    with pytest.raises(SystemExit):
        main(["serve", "--help=ParallelConfig"])
    group = capsys.readouterr().out
    assert "--tensor-parallel-size" in group and "--kv-host-bytes" not in group
    with pytest.raises(SystemExit):  # the next --help is the whole one again
        main(["serve", "--help"])
    assert "--kv-host-bytes" in capsys.readouterr().out


@needs_vllm
def test_engine_flags_reach_the_engine_arguments_only_when_given() -> None:
    """The config-level check: what ``AsyncEngineArgs.from_cli_args`` reads from serve's
    namespace is what the bridge hands the engine; flags not given stay vLLM's (on CPU,
    the bridge's measured pins). No engine starts."""
    from microagent.engine_bridge import VLLMBridge
    from microagent.server._served import make_bridges
    from vllm.engine.arg_utils import AsyncEngineArgs

    argv = [
        "serve",
        "--tensor-parallel-size",
        "1",
        "--max-model-len",
        "2048",
        "--kv-cache-dtype",
        "auto",
        "--gpu-memory-utilization",
        "0.8",
        "--dtype",
        "bfloat16",
        "--max_num_seqs",  # vLLM's parser: underscores work too
        "8",
    ]
    args = build_parser().parse_args(argv)
    assert args.uvicorn_log_level is None and args.models is None
    cli = AsyncEngineArgs.from_cli_args(args)
    (bridge,) = make_bridges(args)
    assert isinstance(bridge, VLLMBridge)
    bridge.model_path = "/models/m"
    engine = AsyncEngineArgs(**bridge._engine_arguments())
    for field in (
        "tensor_parallel_size",
        "max_model_len",
        "kv_cache_dtype",
        "gpu_memory_utilization",
        "dtype",
        "max_num_seqs",
    ):
        assert getattr(engine, field) == getattr(cli, field), field
    assert (cli.max_model_len, cli.gpu_memory_utilization, cli.dtype) == (2048, 0.8, "bfloat16")
    assert engine.enable_prefix_caching is True and engine.model == "/models/m"
    assert bridge.max_num_seqs == 8 and bridge.max_model_len == 2048
    given = set(bridge.extra_engine_args)
    assert given == {"gpu_memory_utilization", "dtype"}  # tp 1 and auto are vLLM's defaults

    (plain,) = make_bridges(build_parser().parse_args(["serve"]))
    assert isinstance(plain, VLLMBridge) and plain.extra_engine_args == {}
    plain.model_path = "/models/m"
    if plain._is_cpu:  # the measured pins, said in --help
        arguments = plain._engine_arguments()
        assert (arguments["max_num_seqs"], arguments["max_num_batched_tokens"]) == (16, 2048)
        assert arguments["max_model_len"] == 4096


@needs_vllm
@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--no-enable-prefix-caching"], "--no-enable-prefix-caching is refused"),
        (["--scheduler-cls", "my.Scheduler"], "--scheduler-cls is refused"),
        (["--tokenizer", "/other"], "--tokenizer is refused"),
        (["--served-model-name", "a", "b"], "--served-model-name takes one name"),
        (
            ["--kv-offloading-size", "1", "--kv-host-bytes", "1GiB"],
            "--kv-offloading-size and --kv-host-bytes",
        ),
        (
            ["--kv-transfer-config", '{"kv_connector": "X", "kv_role": "kv_both"}'],
            "--kv-transfer-config and --kv-host-bytes",
        ),
        (["--kv-offloading-size", "1", "--kv-offloading-backend", "lmcache"], "lmcache"),
        (["--max-num-seqs", "4", "--engine-arg", "max_num_seqs=8"], "--max-num-seqs and"),
        (["--kv-tier-policy", "lru"], "--kv-tier-policy needs --kv-host-bytes"),
    ],
)
def test_flags_that_would_break_the_product_are_refused_by_name(
    argv: list[str], named: str
) -> None:
    from microagent.server import CliError
    from microagent.server._served import make_bridges

    if argv[0] == "--kv-transfer-config":
        argv = [*argv, "--kv-host-bytes", "1GiB"]
    with pytest.raises(CliError, match=re.escape(named)):
        make_bridges(build_parser().parse_args(["serve", *argv]))


@needs_vllm
def test_kv_offloading_size_is_the_host_tier_and_models_are_positional_then_repeated(
    tmp_path: Path,
) -> None:
    from microagent.engine_bridge import VLLMBridge
    from microagent.server._served import make_bridges

    argv = ["serve", "m1", "--model", "m2", "--kv-offloading-size", "2", "--kv-tier-policy", "lru"]
    bridges = make_bridges(build_parser().parse_args(argv))
    assert [b.model for b in bridges] == ["m1", "m2"]
    for bridge in bridges:  # every model's engine gets the same flags
        assert isinstance(bridge, VLLMBridge)
        assert (bridge.host_tier_bytes, bridge.tier_policy) == (2 << 30, "lru")
        assert "kv_offloading_size" not in bridge.extra_engine_args
    named = make_bridges(build_parser().parse_args(["serve", "m1", "--served-model-name", "x"]))
    assert [b.model for b in named] == ["x"]

    config = tmp_path / "serve.yaml"
    config.write_text("max-num-seqs: 4\nport: 9001\nmodel: m3\nenable-prefix-caching: true\n")
    args = build_parser().parse_args(["serve", "m1", "--config", str(config), "--port", "9002"])
    assert (args.max_num_seqs, args.port, args.model_tag, args.models) == (4, 9002, "m1", ["m3"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--config", str(tmp_path / "missing.yaml")])


def test_serve_and_run_scripted_work_with_vllm_hidden() -> None:
    """Without vLLM importable, serve and run parse microagent's options alone and the
    ScriptedEngine serves (vLLM hidden in a fresh interpreter: ``import vllm`` fails)."""
    script = """
import sys
sys.modules["vllm"] = None
from microagent.cli import build_parser, main
from microagent.server import served_app
args = build_parser().parse_args(["serve", "a", "--engine", "scripted", "--max-agents", "4"])
served = served_app(args)
assert [b.model for b in served.bridges] == ["a"], served.bridges
run = ["run", "yes?", "--engine", "scripted", "--choices", "yes,no", "--max-tokens", "4"]
assert main(run) == 0
try:
    main(["serve", "--help"])
except SystemExit as exc:
    assert exc.code == 0
assert "vllm" not in [m.split(".")[0] for m in sys.modules if sys.modules[m] is not None]
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "usage: microagent serve [MODEL] [options]" in done.stdout
    assert "--tensor-parallel-size" not in done.stdout and "--engine-arg" in done.stdout


def test_run_shows_agents_and_the_token_table(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "run",
            "Is it yes?",
            "--engine",
            "scripted",
            "--choices",
            "yes,no",
            "--agents",
            "3",
            "--max-tokens",
            "8",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "[voter-1] agent_started" in out
    assert "answer: " in out
    for label in (
        "prompt tokens computed",
        "prompt tokens cached",
        "completion tokens saved",
        "time",
    ):
        assert label in out
    answer = next(line for line in out.splitlines() if line.startswith("answer: "))
    assert answer.split(": ", 1)[1] in ("yes", "no")


def test_run_json_and_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    context = tmp_path / "ctx.txt"
    context.write_text("The sky is blue.")
    trace = tmp_path / "trace.json"
    timeline = tmp_path / "timeline.png"
    code = main(
        [
            "run",
            "Is the sky blue?",
            "--engine",
            "scripted",
            "--context-file",
            str(context),
            "--mode",
            "debate",
            "--agents",
            "2",
            "--rounds",
            "1",
            "--max-tokens",
            "6",
            "--json",
            "--trace",
            str(trace),
            "--timeline",
            str(timeline),
        ]
    )
    assert code == 0
    response = json.loads(capsys.readouterr().out)
    assert response["object"] == "chat.completion"
    assert response["collaboration"]["mode"] == "debate"
    assert response["choices"][0]["message"]["content"] == response["collaboration"]["answer"]
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e["name"] == "final" and e["ph"] == "i" for e in events)
    lanes = {
        e["args"]["agent"]
        for e in events
        if e["ph"] == "M" and e["name"] == "thread_name" and "agent" in e["args"]
    }
    assert lanes == {"debater-1", "debater-2"}
    assert timeline.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_run_errors_are_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "q", "--engine", "scripted", "--mode", "telepathy"]) == 1
    err = capsys.readouterr().err
    assert "error: invalid collaboration" in err and "telepathy" in err
    assert (
        main(["run", "q", "--engine", "scripted", "--context-file", str(tmp_path / "missing.txt")])
        == 1
    )
    assert "cannot read --context-file" in capsys.readouterr().err


def test_prepare_bad_path_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["prepare", str(tmp_path / "nope")]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_python_dash_m_microagent() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "microagent", "run", "--help"],
        capture_output=True,
        text=True,
        timeout=240,  # run's parser imports vLLM for its flags: seconds, more on a busy machine
    )
    assert done.returncode == 0
    assert "--context-file" in done.stdout


# -- the real engine: a quiet terminal by default, the libraries' own output with --verbose ------

#: A line vLLM, torch or transformers would print: vLLM's prefixed log records, Python
#: warnings, c10's C++ warnings, Triton notices and the weight-loading progress bar.
LIBRARY_LINE = re.compile(
    r"\((?:EngineCore|MainProcess|Worker|VllmWorker)[^)]*pid=\d+\)"
    r"|^(?:INFO|WARNING|DEBUG|ERROR) \d\d-\d\d "
    r"|\b(?:Future|User|Deprecation|Runtime)Warning\b"
    r"|^\[W\d{4} "
    r"|Triton is installed"
    r"|Loading safetensors",
    re.MULTILINE,
)


def _run_real(*extra: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(
            ("VLLM_LOGGING", "VLLM_CONFIGURE", "MICROAGENT_LOG", "MICROAGENT_ENGINE")
        )
        and k not in ("PYTHONWARNINGS", "TQDM_DISABLE", "TORCH_CPP_LOG_LEVEL")
    }
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("microagent")),
            "run",
            "Is 17 a prime number?",
            "--choices",
            "yes,no",
            "--agents",
            "3",
            "--max-tokens",
            "4",
            "--max-num-seqs",
            "4",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=540,  # ~30 s alone; minutes when other engines share the two cores
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _times(out: str) -> tuple[float, float]:
    collab = re.search(r"collaboration time\s+([\d.]+)s", out)
    engine = re.search(r"engine start\s+([\d.]+)s", out)
    assert collab and engine, out
    return float(collab[1]), float(engine[1])


@pytest.mark.engine
def test_run_on_the_real_engine_is_quiet_and_times_the_engine_apart() -> None:
    done = _run_real()
    both = done.stdout + done.stderr
    assert LIBRARY_LINE.findall(both) == [], both[-3000:]
    assert "answer: " in done.stdout and "[voter-1] agent_started" in done.stdout
    assert "engine ready: SmolLM2-135M-Instruct" in done.stderr
    collaboration, engine = _times(done.stdout)
    assert engine > collaboration  # starting vLLM takes seconds, this vote a fraction
    log = re.search(r"engine log: (\S+)", done.stderr)
    assert log is None  # nothing failed, so nothing pointed at the log


@pytest.mark.engine
def test_run_verbose_shows_the_libraries_output() -> None:
    done = _run_real("--verbose")
    both = done.stdout + done.stderr
    found = LIBRARY_LINE.findall(both)
    assert any("EngineCore" in line for line in found), both[-3000:]
    _times(done.stdout)


def test_engine_errors_are_one_line_with_the_cause(tmp_path: Path) -> None:
    from microagent.console import EngineLog

    log_file = tmp_path / "engine.log"
    log_file.write_text(
        "12:00 EngineCore pid=1 ERROR [vllm] EngineCore failed to start.\n"
        "Traceback (most recent call last):\n"
        '  File "core.py", line 1, in run\n'
        "ValueError: max_model_len 99999 is larger than the model allows\n"
        "12:00 MainProcess pid=1 INFO [vllm] shutting down\n"
    )
    line = EngineLog(verbose=False, path=log_file).explain("starting the engine failed")
    assert "\n" not in line
    assert "ValueError: max_model_len 99999" in line and str(log_file) in line
    assert EngineLog(verbose=True).explain("x") == "x"
    assert EngineLog(verbose=True).explain("bad value\n  for field\n") == "bad value for field"
