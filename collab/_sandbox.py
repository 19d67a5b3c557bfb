"""A sandbox for untrusted Python: code validators' candidates and tests, the calculator.

Each run is a fresh process tree under bubblewrap (``bwrap``, Debian's
``bubblewrap``), the tool Flatpak builds its sandboxes on:

- every namespace unshared (user, mount, PID, network, IPC, UTS, cgroup), every
  capability dropped, nested user namespaces disabled, killed with its parent;
- a root that is an empty, read-only tmpfs holding only the interpreter, its
  standard library (``site-packages`` hidden) and the system's shared libraries,
  all bound read-only; a private, size-capped tmpfs at ``/tmp`` (the working
  directory, ``TMPDIR`` and ``HOME``); a minimal ``/dev``; no ``/proc`` and no ``/sys``
  (the sandbox's user is the server's, root included: a ``/proc`` would let it write
  the host's sysctls, ``core_pattern`` among them);
- a network namespace with only its own loopback (no host socket, TCP or UNIX,
  can be reached: no host path is mounted and abstract sockets are per namespace);
- an empty environment but for ``PATH``/``HOME``/``TMPDIR``/``LANG``;
- inside, before the untrusted program runs: resource limits (CPU time, address
  space, file size, open files, no core dumps) and a seccomp filter that refuses
  new processes, the mount, namespace and file-system-context calls, ``bpf``,
  ``keyctl``, ``ptrace``, ``io_uring`` and their kin, and every socket family
  but UNIX, IPv4 and IPv6 (which reach only the sandbox's own loopback);
- the whole tree killed when the wall clock runs out or the caller is
  cancelled; output capped.

Fail closed: where ``bwrap`` is missing or cannot build these namespaces, or a probe
run finds any of the isolation missing, nothing runs: :func:`sandbox_unavailable`
says why and :func:`run_sandboxed` raises :class:`SandboxUnavailable`.
docs/security.md says what is isolated and what is not.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import time

import anyio
import attrs
from anyio.abc import ByteReceiveStream

from ._errors import CollaborationError

_MIB = 1 << 20

#: the oldest bubblewrap with everything the sandbox asks of it (``--disable-userns``)
BWRAP_MIN_VERSION = (0, 8, 0)


class SandboxUnavailable(CollaborationError, RuntimeError):
    """This machine cannot isolate untrusted code (no ``bwrap``, or its isolation failed)."""


@attrs.frozen(kw_only=True)
class SandboxLimits:
    """What one sandboxed run may use.

    Attributes:
        memory_bytes: address space of the process (``RLIMIT_AS``).
        file_bytes: the largest file it may write (``RLIMIT_FSIZE``).
        tmp_bytes: the size of its private tmpfs (working directory, ``TMPDIR``).
        processes: processes and threads (``RLIMIT_NPROC``; new processes are
            refused by the seccomp filter whatever this says, threads are not).
        open_files: file descriptors (``RLIMIT_NOFILE``).
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


#: where the sandbox's private tmpfs is mounted (its working directory, TMPDIR and HOME)
WORK_DIR = "/tmp"

#: Exit status and message of a sandbox whose filter or limits could not be installed.
_SETUP_FAILED = 97
_SETUP_MESSAGE = "sandbox: seccomp refused"

# The sandboxed interpreter's first lines, run before any untrusted code: set the resource
# limits, then install a seccomp filter (fail closed: exit _SETUP_FAILED when either is
# refused), then run the program read from stdin. The filter refuses new processes
# (threads are allowed), the mount / namespace / fs-context / module / key / bpf / ptrace /
# io_uring calls and every socket family but UNIX, INET and INET6. Even were one of these
# let through, bwrap has dropped every capability: the filter is the second wall.
_BOOTSTRAP = """
import ctypes, platform, resource, struct, sys
cpu, mem, fsize, nproc, nofile = (int(v) for v in sys.argv[1:6])
try:
    for lim, v in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, mem),
                   (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_NPROC, nproc),
                   (resource.RLIMIT_NOFILE, nofile), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(lim, (v, v))
except (OSError, ValueError) as exc:
    sys.stderr.write("sandbox: seccomp refused: limits: %s\\n" % exc)
    raise SystemExit(97)
COMMON = (425, 426, 427, 428, 429, 430, 431, 432, 433, 438, 440, 442, 443, 447)
ARCHES = {
    "x86_64": (0xC000003E, 56, (57, 58), True, (41, 53), (165, 166, 155, 161, 272, 308, 101,
               310, 311, 321, 250, 248, 249, 298, 323, 246, 320, 175, 313, 176, 303, 304,
               163, 167, 168, 169, 103, 179, 134, 172, 173, 153) + COMMON),
    "aarch64": (0xC00000B7, 220, (), False, (198, 199), (40, 39, 41, 51, 97, 268, 117, 270,
                271, 280, 219, 217, 218, 241, 282, 104, 294, 105, 273, 106, 264, 265, 89,
                224, 225, 142, 116, 60, 58) + COMMON),
}
arch, clone, forks, x32, sockets, denied = ARCHES[platform.machine()]
CLONE3, CLONE_THREAD = 435, 0x00010000
ALLOW, KILL = 0x7FFF0000, 0x80000000
EPERM, ENOSYS, EAFNOSUPPORT = 0x00050000 | 1, 0x00050000 | 38, 0x00050000 | 97
def op(code, k, jt=0, jf=0):
    return struct.pack("HBBI", code, jt, jf, k)
LD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
prog = [op(LD, 4), op(JEQ, arch, 1, 0), op(RET, KILL), op(LD, 0)]
if x32:
    prog += [op(JGE, 0x40000000, 0, 1), op(RET, EPERM)]
prog += [op(JEQ, CLONE3, 0, 1), op(RET, ENOSYS)]
for nr in forks + denied:
    prog += [op(JEQ, nr, 0, 1), op(RET, EPERM)]
for nr in sockets:
    prog += [op(JEQ, nr, 0, 6), op(LD, 16), op(JEQ, 1, 3, 0), op(JEQ, 2, 2, 0),
             op(JEQ, 10, 1, 0), op(RET, EAFNOSUPPORT), op(RET, ALLOW)]
prog += [op(JEQ, clone, 1, 0), op(RET, ALLOW), op(LD, 16), op(JSET, CLONE_THREAD, 0, 1),
         op(RET, ALLOW), op(RET, EPERM)]
code = b"".join(prog)
buf = ctypes.create_string_buffer(code, len(code))
fprog = struct.pack("HxxxxxxP", len(prog), ctypes.addressof(buf))
fbuf = ctypes.create_string_buffer(fprog, len(fprog))
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(22, 2, ctypes.addressof(fbuf), 0, 0):
    sys.stderr.write("sandbox: seccomp refused: errno %d\\n" % ctypes.get_errno())
    raise SystemExit(97)
del ctypes, platform, resource, struct, ARCHES, COMMON, libc, buf, fbuf, fprog, code, prog, op
sys.argv[:] = ["<candidate>"]
source = sys.stdin.read()
sys.stdin.close()
exec(compile(source, "<candidate>", "exec"), {"__name__": "__main__"})
"""


def _interpreter() -> str:
    """The interpreter's own file (a virtual environment's ``python`` is a link to it)."""
    return os.path.realpath(sys.executable)


@functools.cache
def _root_layout() -> tuple[str, ...]:
    """bwrap's arguments for the sandbox's root: the interpreter, its standard library and
    the shared libraries it links, each read-only, and nothing else of the host."""
    args: list[str] = []
    seen: set[str] = set()

    def bind(path: str) -> None:
        if path in seen or not os.path.exists(path):
            return
        seen.add(path)
        args.extend(["--ro-bind", os.path.realpath(path), path])

    bind(_interpreter())
    # the base interpreter's paths, never a virtual environment's (its site-packages)
    base = {
        "base": sys.base_prefix,
        "installed_base": sys.base_prefix,
        "platbase": sys.base_exec_prefix,
        "installed_platbase": sys.base_exec_prefix,
    }
    paths = sysconfig.get_paths(vars=base)
    stdlib = paths["stdlib"]
    bind(stdlib)
    if paths["platstdlib"] != stdlib:
        bind(paths["platstdlib"])
    dynload = os.path.join(paths["platstdlib"], "lib-dynload")
    if not dynload.startswith(stdlib):
        bind(dynload)
    libdir = sysconfig.get_config_var("LIBDIR")
    if isinstance(libdir, str) and sysconfig.get_config_var("Py_ENABLE_SHARED"):
        for var in ("INSTSONAME", "LDLIBRARY"):
            name = sysconfig.get_config_var(var)
            if isinstance(name, str) and name:
                bind(os.path.join(libdir, name))
    # the system's shared libraries (libc, libm, libffi, libz...): /lib and /lib64 are
    # symbolic links into /usr on merged-/usr systems, made the same here
    multiarch = sysconfig.get_config_var("MULTIARCH")
    libs = [f"/usr/lib/{multiarch}"] if isinstance(multiarch, str) and multiarch else ["/usr/lib"]
    libs.append("/usr/lib64")
    for path in libs:
        bind(path)
    for top in ("/lib", "/lib64"):
        if os.path.islink(top):
            args.extend(["--symlink", os.readlink(top), top])
        elif isinstance(multiarch, str) and multiarch and top == "/lib":
            bind(f"/lib/{multiarch}")
        else:
            bind(top)
    # the base interpreter's own site-packages (pip and the like) stay out of sight
    for hidden in ("site-packages", "dist-packages"):
        path = os.path.join(stdlib, hidden)
        if os.path.isdir(path):
            args.extend(["--tmpfs", path, "--remount-ro", path])
    return tuple(args)


def _command(python: str, limits: SandboxLimits, cpu_seconds: int) -> list[str]:
    bwrap = shutil.which("bwrap") or "bwrap"
    return [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--cap-drop",
        "ALL",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        *(arg for key, value in _env().items() for arg in ("--setenv", key, value)),
        *_root_layout(),
        "--dev",
        "/dev",
        "--size",
        str(limits.tmp_bytes),
        "--tmpfs",
        WORK_DIR,
        "--chdir",
        WORK_DIR,
        "--remount-ro",
        "/dev",
        "--remount-ro",
        "/",
        "--",
        python,
        "-I",
        "-S",
        "-c",
        _BOOTSTRAP,
        str(cpu_seconds),
        str(limits.memory_bytes),
        str(limits.file_bytes),
        str(limits.processes),
        str(limits.open_files),
    ]


def _env() -> dict[str, str]:
    """The sandboxed program's whole environment."""
    return {"PATH": "/usr/bin:/bin", "HOME": WORK_DIR, "TMPDIR": WORK_DIR, "LANG": "C.UTF-8"}


def bwrap_version() -> tuple[int, ...] | None:
    """The installed bubblewrap's version, or ``None`` when there is none."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return None
    try:
        out = subprocess.run(
            [bwrap, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", out)
    if found is None:
        return None
    return tuple(int(part) for part in found.groups(default="0"))


# What the probe checks from inside, each a line on stdout ("ok NAME" or "BAD NAME why"); it
# stops at the first failure, so an unconfined run (a broken bwrap) touches nothing of the host.
_PROBE = r"""
import ctypes, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
def check(name, bad):
    if bad:
        print("BAD " + name + " " + bad)
        raise SystemExit(0)
    print("ok " + name)
def refused(fn):
    try:
        fn()
    except OSError:
        return ""
    return "allowed"
check("host", "" if not os.path.exists("/etc") and not os.path.exists("/home") else "host files")
check("proc", "" if not os.path.exists("/proc") and not os.path.exists("/sys") else "proc")
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2).close()
except OSError:
    check("network", "")
else:
    check("network", "the host's loopback is reachable")
check("write", refused(lambda: open(os.path.join(os.path.dirname(os.__file__), ".probe"), "w")))
check("root", refused(lambda: open("/.probe", "w")))
check("mount", "" if libc.mount(None, b"/", None, 32 | 4096, None) != 0 else "remount allowed")
check("unshare", "" if libc.unshare(0x00020000) != 0 else "unshare allowed")
check("fork", refused(os.fork))
check("netlink", refused(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)))
check("tmp", "" if open("/tmp/ok", "w").write("ok") == 2 else "no private tmpfs")
"""
_PROBE_CHECKS = (
    "host",
    "proc",
    "network",
    "write",
    "root",
    "mount",
    "unshare",
    "fork",
    "netlink",
    "tmp",
)


@functools.cache
def sandbox_unavailable() -> str | None:
    """Why this machine cannot run the sandbox, or ``None`` when it can (probed once).

    The probe runs a real sandboxed Python and checks, from inside, every wall the
    sandbox promises: no host files, no ``/proc``, no host network (a listener made
    here for the probe gets no connection), no write outside its private tmpfs, no
    remount, no new namespace, no new process, no netlink socket.
    """
    if platform.machine() not in ("x86_64", "aarch64"):
        return f"no process filter for the {platform.machine()} architecture"
    version = bwrap_version()
    if version is None:
        return "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    if version < BWRAP_MIN_VERSION:
        wanted = ".".join(map(str, BWRAP_MIN_VERSION))
        return f"bubblewrap {'.'.join(map(str, version))} is older than {wanted}"
    try:
        with socket.socket() as listener:  # the probe must not reach it
            listener.bind(("127.0.0.1", 0))
            listener.listen()
            port = listener.getsockname()[1]
            proc = subprocess.run(
                _command(_interpreter(), SandboxLimits(), 10),
                input=f"import sys\nsys.argv[1:] = [{port!r}]\n{_PROBE}".encode(),
                capture_output=True,
                env=_env(),
                cwd="/",
                timeout=30,
                check=False,
            )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the sandbox probe failed: {exc}"
    lines = proc.stdout.decode(errors="replace").splitlines()
    passed = {line.split()[1] for line in lines if line.startswith("ok ")}
    failed = [line[4:] for line in lines if line.startswith("BAD ")]
    if proc.returncode != 0 or failed or passed != set(_PROBE_CHECKS):
        tail = proc.stderr.decode(errors="replace").strip().splitlines()
        why = "; ".join(failed) or (tail[-1] if tail else f"exit code {proc.returncode}")
        return f"bubblewrap cannot isolate code here: {why}"
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
    result = await _run(source, timeout, limits)
    if result.returncode == _SETUP_FAILED and result.stderr.startswith(_SETUP_MESSAGE.encode()):
        # fail closed: the program never ran without its limits and filter
        detail = result.stderr.decode(errors="replace").strip()
        raise SandboxUnavailable(f"cannot run untrusted code safely here: {detail}")
    return result


async def _run(source: str, timeout: float, limits: SandboxLimits) -> SandboxResult:
    command = _command(_interpreter(), limits, max(1, math.ceil(timeout)))
    started = time.monotonic()
    stdout = bytearray()
    stderr = bytearray()
    returncode: int | None = None
    timed_out = False
    async with await anyio.open_process(
        command, stdin=subprocess.PIPE, env=_env(), cwd="/", start_new_session=True
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
                process.kill()  # bwrap is the PID namespace's init: its end ends them all
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
