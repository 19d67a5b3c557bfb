"""The code sandbox: each escape a client's Python could try is tried, and fails.

Every test runs real code in a real sandbox (namespaces, seccomp, rlimits) and
checks the effect from outside as well as the verdict inside: the listener got
no connection, no process is left, no file was written, the secret was not seen.
"""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import anyio
import pytest
from microagent.collab import CollaborationError, sandbox_unavailable
from microagent.collab._sandbox import SandboxLimits, SandboxUnavailable, run_sandboxed

pytestmark = pytest.mark.anyio


def test_this_machine_can_build_the_sandbox() -> None:
    # CI and the development machine run Linux with user namespaces; where that is not
    # so, code validators are refused (tested below), never run unconfined.
    assert sandbox_unavailable() is None


async def test_ordinary_code_runs_and_its_output_comes_back() -> None:
    source = "import json, threading\nt = threading.Thread(target=print, args=('t',))\n"
    source += "t.start(); t.join()\nprint(json.dumps({'sum': sum(range(10))}))\n"
    result = await run_sandboxed(source, timeout=10)
    assert result.ok and not result.timed_out
    assert result.stdout.decode().split() == ["t", '{"sum":', "45}"]


async def test_a_failing_assert_is_a_nonzero_exit_with_the_traceback() -> None:
    result = await run_sandboxed("assert 1 + 1 == 3, 'arithmetic'", timeout=10)
    assert result.returncode == 1 and not result.ok
    assert result.stderr.decode().strip().splitlines()[-1] == "AssertionError: arithmetic"


async def test_no_network_not_even_the_servers_own_port() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        source = (
            "import socket\n"
            "for host in ('127.0.0.1', '1.1.1.1'):\n"
            "    try:\n"
            f"        socket.create_connection((host, {port}), timeout=2)\n"
            "    except OSError as exc:\n"
            "        print(host, type(exc).__name__)\n"
            "    else:\n"
            "        print(host, 'CONNECTED')\n"
        )
        result = await run_sandboxed(source, timeout=10)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody knocked
    assert result.ok, result.stderr
    lines = result.stdout.decode().splitlines()
    assert len(lines) == 2 and not any("CONNECTED" in line for line in lines)


def _become_subreaper() -> None:
    """Orphans of this process's descendants are re-parented to it, not to init: a sandbox
    process that outlives its parent still counts as this test's (``_sandbox_processes``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


PR_SET_CHILD_SUBREAPER = 36
_become_subreaper()


def _sandbox_processes() -> int:
    """Sandbox processes (a bwrap, or its interpreter) descended from this test process:
    another pytest worker's sandboxes (``make check`` runs two) are not this test's."""
    ps = subprocess.run(
        ["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True, check=True
    )
    parent: dict[int, int] = {}
    args: dict[int, str] = {}
    for line in ps.stdout.splitlines():
        pid, ppid, *rest = line.split(None, 2)
        parent[int(pid)], args[int(pid)] = int(ppid), rest[0] if rest else ""

    def mine(pid: int) -> bool:
        while pid > 1:
            pid = parent.get(pid, 0)
            if pid == os.getpid():
                return True
        return False

    markers = ("bwrap --unshare-all", "sandbox: seccomp refused")
    return sum(any(m in a for m in markers) and mine(pid) for pid, a in args.items())


async def test_a_fork_bomb_creates_no_process_and_leaves_nothing_behind() -> None:
    source = (
        "import os, subprocess\n"
        "made = 0\n"
        "for _ in range(1000):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            while True: pass\n"
        "        made += 1\n"
        "    except OSError:\n"
        "        pass\n"
        "try:\n"
        "    subprocess.run(['sh', '-c', 'true'])\n"
        "except OSError:\n"
        "    pass\n"
        "else:\n"
        "    made += 1\n"
        "print('made', made)\n"
    )
    result = await run_sandboxed(source, timeout=10)
    assert result.stdout.decode().split() == ["made", "0"], result.stderr
    assert _sandbox_processes() == 0


async def test_an_infinite_loop_is_killed_at_its_timeout_with_its_whole_tree() -> None:
    started = time.monotonic()
    result = await run_sandboxed("while True:\n    pass\n", timeout=1.5)
    elapsed = time.monotonic() - started
    assert result.timed_out and result.returncode is None
    assert 1.5 <= elapsed < 5
    assert _sandbox_processes() == 0


async def test_a_huge_file_stops_at_the_size_limit() -> None:
    limits = SandboxLimits(file_bytes=1 << 20)
    source = "open('big', 'wb').write(b'x' * (64 << 20))\n"
    result = await run_sandboxed(source, timeout=10, limits=limits)
    assert not result.ok
    assert "File too large" in result.stderr.decode()


async def test_the_file_system_is_read_only_but_for_a_private_tmpfs() -> None:
    targets = [
        Path(__file__).parent / f".written-by-sandbox-{os.getpid()}",  # the project
        Path(tempfile.gettempdir()) / f"written-by-sandbox-{os.getpid()}",  # the host's /tmp
    ]
    source = (
        "import os\n"
        "work = os.environ['TMPDIR']\n"
        "open('mine', 'w').write('ok')\n"
        "assert os.getcwd() == work and os.listdir(work) == ['mine'], os.listdir(work)\n"
        "for target in %r:\n"
        "    try:\n"
        "        open(target, 'w').write('escaped')\n"
        "    except OSError as exc:\n"
        "        print(exc.strerror)\n"
        "    else:\n"
        "        print('WROTE', target)\n"
    ) % [str(t) for t in targets]
    result = await run_sandboxed(source, timeout=10)
    assert result.ok, result.stderr
    # the project is not there at all (its parents are read-only); the host's /tmp is the
    # sandbox's own tmpfs: the write lands there, and the host never sees it
    lines = result.stdout.decode().splitlines()
    assert lines[0] in ("No such file or directory", "Read-only file system")
    assert lines[1] == f"WROTE {targets[1]}" or lines[1] == "Read-only file system"
    assert not any(t.exists() for t in targets)


async def test_memory_is_capped() -> None:
    limits = SandboxLimits(memory_bytes=128 << 20)
    result = await run_sandboxed("x = bytearray(512 << 20)\n", timeout=10, limits=limits)
    assert not result.ok
    assert "MemoryError" in result.stderr.decode()


async def test_the_servers_environment_and_processes_are_invisible(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An empty environment, and no /proc or /sys at all: no process of the host (or of
    the sandbox) can be listed or read, no sysctl written."""
    monkeypatch.setenv("MICROAGENT_SANDBOX_SECRET", "s3cr3t-value")
    assert os.environ["MICROAGENT_SANDBOX_SECRET"] == "s3cr3t-value"
    source = (
        "import os\n"
        "seen = [k for k, v in os.environ.items() if 's3cr3t' in v]\n"
        "print(seen, sorted(os.environ), os.path.exists('/proc'), os.path.exists('/sys'))\n"
    )
    result = await run_sandboxed(source, timeout=10)
    assert result.ok, result.stderr
    assert result.stdout.decode().split() == [
        "[]",
        "['HOME',",
        "'LANG',",
        "'PATH',",
        "'PWD',",
        "'TMPDIR']",
        "False",
        "False",
    ]


async def test_output_is_capped_and_the_rest_is_drained() -> None:
    limits = SandboxLimits(output_bytes=1000)
    result = await run_sandboxed("print('x' * 5_000_000)\n", timeout=10, limits=limits)
    assert result.ok and len(result.stdout) == 1000


async def test_cancelling_the_caller_kills_the_sandbox() -> None:
    with anyio.move_on_after(1.0) as scope:
        await run_sandboxed("import time\ntime.sleep(60)\n", timeout=60)
    assert scope.cancelled_caught
    assert _sandbox_processes() == 0


async def test_without_namespaces_nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        "microagent.collab._sandbox.sandbox_unavailable", lambda: "namespaces refused"
    )
    with pytest.raises(SandboxUnavailable, match="namespaces refused") as info:
        await run_sandboxed("print(1)", timeout=5)
    assert isinstance(info.value, CollaborationError)


async def test_every_directory_but_the_private_tmpfs_refuses_writes() -> None:
    """Every directory the sandbox can see (a walk of its whole tree) is tried for a new
    file; only the private tmpfs takes one."""
    source = (
        "import os\n"
        "dirs = wrote = 0\n"
        "for top, subdirs, files in os.walk('/'):\n"
        "    if top == '/tmp' or top.startswith('/tmp/'):\n"
        "        continue\n"
        "    dirs += 1\n"
        "    try:\n"
        "        open(os.path.join(top, '.sandbox-w'), 'w').close()\n"
        "    except OSError:\n"
        "        continue\n"
        "    wrote += 1\n"
        "    print('WROTE', top)\n"
        "open('/tmp/mine', 'w').close()\n"
        "print('dirs', dirs, 'wrote', wrote)\n"
    )
    result = await run_sandboxed(source, timeout=60)
    assert result.ok, result.stderr
    last = result.stdout.decode().splitlines()[-1].split()
    assert last[0] == "dirs" and int(last[1]) > 10  # it saw the real tree
    assert last[2:] == ["wrote", "0"], result.stdout.decode()[-2000:]


async def test_a_bwrap_that_does_not_isolate_fails_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``bwrap`` that runs the program unconfined (here a script that skips every option):
    the probe sees host files and a writable file system, and nothing runs."""
    from microagent.collab import _sandbox

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "bwrap").write_text(
        '#!/bin/sh\n[ "$1" = --version ] && { echo "bubblewrap 0.8.0"; exit 0; }\n'
        'while [ "$1" != -- ]; do shift; done; shift; exec "$@"\n'
    )
    (fake / "bwrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    _sandbox.sandbox_unavailable.cache_clear()
    try:
        reason = _sandbox.sandbox_unavailable()
        assert reason is not None and "cannot isolate" in reason and "host files" in reason
        marker = tmp_path / "ran"
        with pytest.raises(SandboxUnavailable, match="cannot isolate"):
            await run_sandboxed(f"open({str(marker)!r}, 'w')\n", timeout=10)
        assert not marker.exists()
    finally:
        _sandbox.sandbox_unavailable.cache_clear()


async def test_without_bwrap_nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from microagent.collab import _sandbox

    monkeypatch.setenv("PATH", "/nonexistent")
    _sandbox.sandbox_unavailable.cache_clear()
    try:
        reason = _sandbox.sandbox_unavailable()
        assert reason is not None and "bubblewrap" in reason
        with pytest.raises(SandboxUnavailable, match="bubblewrap"):
            await run_sandboxed("print(1)", timeout=5)
    finally:
        _sandbox.sandbox_unavailable.cache_clear()
