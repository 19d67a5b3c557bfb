"""A sandbox for untrusted Python: the code validators' candidates and tests.

Each run is a fresh process tree in its own Linux namespaces (``unshare``):
a user namespace (no privilege outside it), a network namespace with only a
loopback that is down (no network), a PID namespace with its own ``/proc``
(the server's processes, and their environments, cannot be seen), and a mount
namespace where every mount is read-only except a private, size-capped
``tmpfs`` (its working directory, ``TMPDIR`` and ``HOME``). The environment is empty but
for ``PATH``/``HOME``/``TMPDIR``; resource limits cap CPU time, address space,
file size, processes and open files; the whole tree is killed when the wall
clock runs out or the caller is cancelled; output is capped.

Where the platform cannot build these namespaces, nothing runs:
:func:`sandbox_unavailable` says why and :func:`run_sandboxed` raises
:class:`SandboxUnavailable`.
"""

from __future__ import annotations

import contextlib
import functools
import math
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import anyio
import attrs
from anyio.abc import ByteReceiveStream

from ._errors import CollaborationError

_MIB = 1 << 20


class SandboxUnavailable(CollaborationError, RuntimeError):
    """This machine cannot isolate untrusted code (no ``unshare``, or namespaces refused)."""


@attrs.frozen(kw_only=True)
class SandboxLimits:
    """What one sandboxed run may use.

    Attributes:
        memory_bytes: address space of each process (``RLIMIT_AS``).
        file_bytes: the largest file it may write (``RLIMIT_FSIZE``).
        tmp_bytes: the size of its private tmpfs (working directory, ``TMPDIR``).
        processes: processes and threads inside the sandbox (``RLIMIT_NPROC``).
        open_files: file descriptors per process (``RLIMIT_NOFILE``).
        output_bytes: stdout and stderr kept, each; the rest is read and dropped.
    """

    memory_bytes: int = 256 * _MIB
    file_bytes: int = 8 * _MIB
    tmp_bytes: int = 16 * _MIB
    processes: int = 8
    open_files: int = 64
    output_bytes: int = 64 * 1024


@attrs.frozen(kw_only=True)
class SandboxResult:
    """How a sandboxed run ended.

    Attributes:
        returncode: the exit status (negative: killed by that signal); ``None`` when
            it was killed for running past its wall-clock timeout.
        stdout: the first ``output_bytes`` of its standard output.
        stderr: the first ``output_bytes`` of its standard error.
        timed_out: it ran past its timeout and was killed.
        seconds: wall-clock time it ran.
    """

    returncode: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0


#: Exit status and message of a sandbox whose mounts could not all be made read-only.
_SETUP_FAILED = 97
_SETUP_MESSAGE = "sandbox: cannot make a mount read-only: "

# Run by the sandbox's first process, as root of its own user namespace: make every
# mount read-only (keeping the flags the parent namespace locked: nosuid, nodev, noexec,
# atime), then check that the top mount at every path is read-only, failing closed with
# _SETUP_FAILED otherwise; mount a private tmpfs on the empty directory made for this
# run (not over /tmp, which may hold the interpreter itself); become the limited Python.
_SETUP = (
    "set -e; "
    "while read -r dev m fs opts rest; do "
    'case ",$opts," in *,ro,*) continue;; esac; '
    "flags=ro; "
    "for f in nosuid nodev noexec noatime nodiratime relatime strictatime; do "
    'case ",$opts," in *,$f,*) flags="$flags,$f";; esac; done; '
    'mount -o "remount,bind,$flags" "$m" 2>/dev/null || true; '
    "done < /proc/mounts; "
    # the last entry of a path is the mount a process sees there
    "bad=$(awk '{top[$2] = $4} END {for (m in top) "
    "if (top[m] !~ /(^|,)ro(,|$)/) print m}' /proc/mounts); "
    'if [ -n "$bad" ]; then '
    f'echo "{_SETUP_MESSAGE}"$bad >&2; exit {_SETUP_FAILED}; fi; '
    'mount -t tmpfs -o "size=$1,mode=1777,nosuid,nodev" tmpfs "$2"; '
    'cd "$2"; '
    "shift 2; "
    'exec "$@"'
)


def _command(python: str, limits: SandboxLimits, cpu_seconds: int, work: str) -> list[str]:
    return [
        "unshare",
        "--user",
        "--map-root-user",
        "--net",
        "--pid",
        "--fork",
        "--mount-proc",
        "--kill-child",
        "--",
        "sh",
        "-c",
        _SETUP,
        "sandbox",
        str(limits.tmp_bytes),
        work,
        "prlimit",
        f"--cpu={cpu_seconds}",
        f"--as={limits.memory_bytes}",
        f"--fsize={limits.file_bytes}",
        f"--nproc={limits.processes}",
        f"--nofile={limits.open_files}",
        "--core=0",
        "--",
        python,
        "-I",
        "-c",
        _BOOTSTRAP,
    ]


# The sandboxed interpreter's first lines: forbid creating processes (a seccomp filter
# that lets threads be made, and nothing else), then run the program read from stdin.
# ``RLIMIT_NPROC`` alone does not hold: the kernel exempts uid 0, which the sandbox's
# user is when the server runs as root.
_BOOTSTRAP = """
import ctypes, platform, struct, sys
ARCHES = {
    "x86_64": (0xC000003E, 56, (57, 58), True),
    "aarch64": (0xC00000B7, 220, (), False),
}
arch, clone, forks, x32 = ARCHES[platform.machine()]
CLONE3, CLONE_THREAD = 435, 0x00010000
ALLOW, KILL = 0x7FFF0000, 0x80000000
EPERM, ENOSYS = 0x00050000 | 1, 0x00050000 | 38
def op(code, k, jt=0, jf=0):
    return struct.pack("HBBI", code, jt, jf, k)
LD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
prog = [op(LD, 4), op(JEQ, arch, 1, 0), op(RET, KILL), op(LD, 0)]
if x32:
    prog += [op(JGE, 0x40000000, 0, 1), op(RET, EPERM)]
prog += [op(JEQ, CLONE3, 0, 1), op(RET, ENOSYS)]
for nr in forks:
    prog += [op(JEQ, nr, 0, 1), op(RET, EPERM)]
prog += [op(JEQ, clone, 1, 0), op(RET, ALLOW), op(LD, 16), op(JSET, CLONE_THREAD, 0, 1),
         op(RET, ALLOW), op(RET, EPERM)]
code = b"".join(prog)
buf = ctypes.create_string_buffer(code, len(code))
fprog = struct.pack("HxxxxxxP", len(prog), ctypes.addressof(buf))
fbuf = ctypes.create_string_buffer(fprog, len(fprog))
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(22, 2, ctypes.addressof(fbuf), 0, 0):
    raise SystemExit("sandbox: seccomp refused: errno %d" % ctypes.get_errno())
del ctypes, platform, struct, ARCHES, libc, buf, fbuf, fprog, code, prog, op
source = sys.stdin.read()
sys.stdin.close()
exec(compile(source, "<candidate>", "exec"), {"__name__": "__main__"})
"""


def _env(work: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8"}


@functools.cache
def sandbox_unavailable() -> str | None:
    """Why this machine cannot run the sandbox, or ``None`` when it can (probed once).

    The probe runs a real sandboxed Python and checks that it has no network and
    cannot write outside its private tmpfs (the sandbox's setup itself refuses to
    start when a mount stays writable).
    """
    if platform.machine() not in ("x86_64", "aarch64"):
        return f"no process filter for the {platform.machine()} architecture"
    missing = [tool for tool in ("unshare", "prlimit", "sh") if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)} (util-linux)"
    probe = (
        "import os, socket\n"
        "assert open('/proc/self/status').read()\n"
        "assert os.getpid() == 1, 'no pid namespace'\n"
        "try:\n"
        "    socket.create_connection(('127.0.0.1', 9), timeout=1)\n"
        "except OSError:\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('network reachable')\n"
        "try:\n"
        "    open(os.path.join(os.path.dirname(os.__file__), '.sandbox-probe'), 'w')\n"
        "except OSError:\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('file system writable')\n"
        "open(os.path.join(os.environ['TMPDIR'], 'ok'), 'w').write('ok')\n"
        "try:\n"
        "    pid = os.fork()\n"
        "except OSError:\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('processes can be created')\n"
    )
    try:
        with tempfile.TemporaryDirectory(prefix="microagent-sandbox-") as work:
            proc = subprocess.run(
                _command(sys.executable, SandboxLimits(), 10, work),
                input=probe.encode(),
                capture_output=True,
                env=_env(work),
                cwd="/",
                timeout=30,
                check=False,
            )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the namespace probe failed: {exc}"
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()
        return "Linux namespaces are not available here: " + (
            tail[-1] if tail else f"exit code {proc.returncode}"
        )
    return None


async def run_sandboxed(
    source: str, *, timeout: float, limits: SandboxLimits | None = None
) -> SandboxResult:
    """Run the Python program ``source`` in a fresh sandbox; never raises for what it does.

    Args:
        source: the program, given on standard input (nothing is written to disk here).
        timeout: wall-clock seconds before the whole process tree is killed; CPU time
            is capped at the same figure, rounded up.
        limits: resource limits (``SandboxLimits()`` when omitted).

    Raises:
        SandboxUnavailable: the platform cannot build the sandbox (nothing ran).
    """
    if timeout <= 0:
        raise ValueError("timeout must be positive")
    reason = sandbox_unavailable()
    if reason is not None:
        raise SandboxUnavailable(f"cannot run untrusted code safely here: {reason}")
    limits = limits or SandboxLimits()
    with tempfile.TemporaryDirectory(prefix="microagent-sandbox-") as work:
        result = await _run(source, timeout, limits, work)
    if result.returncode == _SETUP_FAILED and result.stderr.startswith(_SETUP_MESSAGE.encode()):
        # fail closed: the program never ran with a writable mount
        detail = result.stderr.decode(errors="replace").strip()
        raise SandboxUnavailable(f"cannot run untrusted code safely here: {detail}")
    return result


async def _run(source: str, timeout: float, limits: SandboxLimits, work: str) -> SandboxResult:
    command = _command(sys.executable, limits, max(1, math.ceil(timeout)), work)
    started = time.monotonic()
    stdout = bytearray()
    stderr = bytearray()
    returncode: int | None = None
    timed_out = False
    async with await anyio.open_process(
        command, stdin=subprocess.PIPE, env=_env(work), cwd="/", start_new_session=True
    ) as process:
        try:
            with anyio.move_on_after(timeout) as deadline:
                async with anyio.create_task_group() as tg:
                    assert process.stdout is not None and process.stderr is not None
                    tg.start_soon(_read_capped, process.stdout, stdout, limits.output_bytes)
                    tg.start_soon(_read_capped, process.stderr, stderr, limits.output_bytes)
                    assert process.stdin is not None
                    # it may exit before reading everything
                    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                        await process.stdin.send(source.encode())
                    await process.stdin.aclose()
                    returncode = await process.wait()
            timed_out = deadline.cancelled_caught
        finally:
            if process.returncode is None:
                process.kill()  # unshare's --kill-child takes the namespace down with it
                with anyio.CancelScope(shield=True):
                    await process.wait()
    return SandboxResult(
        returncode=None if timed_out else returncode,
        stdout=bytes(stdout),
        stderr=bytes(stderr),
        timed_out=timed_out,
        seconds=time.monotonic() - started,
    )


async def _read_capped(stream: ByteReceiveStream, into: bytearray, cap: int) -> None:
    """Read ``stream`` to its end, keeping its first ``cap`` bytes."""
    async for chunk in stream:
        room = cap - len(into)
        if room > 0:
            into += chunk[:room]
