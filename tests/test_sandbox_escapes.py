"""Escape classes, not single repros: each test tries every member of a class of escape
from inside the real sandbox and checks the host from outside as well.

Each class is listed in docs/security.md. On the namespace sandbox this replaced (root of
its own user namespace with every capability, unlocked read-only remounts, a seccomp
filter against fork only, the host's whole file system visible) the remount, the
namespace calls, the host-file reads and the host UNIX socket all succeeded.
"""

from __future__ import annotations

import ast
import os
import platform
import socket
import sys
from pathlib import Path

import pytest
from microagent.collab._sandbox import SandboxLimits, run_sandboxed

pytestmark = pytest.mark.anyio

_X86 = platform.machine() == "x86_64"
HOME_CACHE = os.path.expanduser("~/.cache")
CORE_PATTERN = Path("/proc/sys/kernel/core_pattern")

#: the mount family and the namespace calls, by number (x86_64, aarch64), with arguments
#: that would succeed for a process that had the right to make them
_MOUNT_AND_NAMESPACE_CALLS = {
    "mount(MS_REMOUNT|MS_BIND, /)": ((165, 40), "None, b'/', None, 32 | 4096, None"),
    "mount(tmpfs)": ((165, 40), "b'none', b'/tmp', b'tmpfs', 0, None"),
    "mount(proc)": ((165, 40), "b'proc', b'/tmp', b'proc', 0, None"),
    "mount(sysfs)": ((165, 40), "b'sysfs', b'/tmp', b'sysfs', 0, None"),
    "umount2(/tmp)": ((166, 39), "b'/tmp', 2"),
    "pivot_root": ((155, 41), "b'/tmp', b'/tmp'"),
    "chroot": ((161, 51), "b'/tmp'"),
    "unshare(CLONE_NEWUSER)": ((272, 97), "0x10000000"),
    "unshare(CLONE_NEWNS)": ((272, 97), "0x00020000"),
    "setns": ((308, 268), "0, 0"),
    "open_tree": ((428, 428), "-100, b'/', 1"),
    "move_mount": ((429, 429), "-100, b'/', -100, b'/tmp', 0"),
    "fsopen": ((430, 430), "b'tmpfs', 0"),
    "fsconfig": ((431, 431), "3, 6, None, None, 0"),
    "fsmount": ((432, 432), "3, 0, 0"),
    "fspick": ((433, 433), "-100, b'/', 0"),
    "mount_setattr": ((442, 442), "-100, b'/', 0, None, 0"),
}

#: kernel attack surface that has no business in a calculation: each must be refused
_KERNEL_SURFACE_CALLS = {
    "ptrace(PTRACE_TRACEME)": ((101, 117), "0, 0, 0, 0"),
    "ptrace(PTRACE_ATTACH, 1)": ((101, 117), "16, 1, 0, 0"),
    "process_vm_readv": ((310, 270), "1, None, 0, None, 0, 0"),
    "bpf": ((321, 280), "0, None, 0"),
    "keyctl": ((250, 219), "0, 0, 0, 0, 0"),
    "add_key": ((248, 217), "b'user', b'k', b'v', 1, -2"),
    "io_uring_setup": ((425, 425), "1, None"),
    "userfaultfd": ((323, 282), "0"),
    "perf_event_open": ((298, 241), "None, 0, -1, -1, 0"),
    "init_module": ((175, 105), "None, 0, None"),
    "kexec_load": ((246, 104), "0, 0, None, 0"),
    "open_by_handle_at": ((304, 265), "-100, None, 0"),
}


def _syscall_program(calls: dict[str, tuple[tuple[int, int], str]]) -> str:
    lines = ["import ctypes", "libc = ctypes.CDLL(None, use_errno=True)"]
    for name, (numbers, args) in calls.items():
        nr = numbers[0] if _X86 else numbers[1]
        lines.append(f"rc = libc.syscall({nr}, {args})")
        lines.append(f"print({name!r}, 'refused' if rc == -1 else 'ALLOWED', ctypes.get_errno())")
    return "\n".join(lines) + "\n"


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="syscall numbers")
async def test_every_mount_and_namespace_call_is_refused(tmp_path: Path) -> None:
    result = await run_sandboxed(_syscall_program(_MOUNT_AND_NAMESPACE_CALLS), timeout=20)
    assert result.ok, result.stderr
    lines = result.stdout.decode().splitlines()
    assert len(lines) == len(_MOUNT_AND_NAMESPACE_CALLS)
    assert not [line for line in lines if "ALLOWED" in line], lines


async def test_a_remount_then_a_host_write_leaves_the_host_untouched(tmp_path: Path) -> None:
    """The reported escape: remount / read-write, then write where the host would see it."""
    target = tmp_path / "escaped"
    source = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('remount', libc.mount(None, b'/', None, 32 | 4096, None))\n"
        f"for path in ({str(target)!r}, '/escaped', '/usr/lib64/escaped'):\n"
        "    try:\n"
        "        open(path, 'w').write('x')\n"
        "    except OSError as exc:\n"
        "        print('refused', exc.errno)\n"
        "    else:\n"
        "        print('WROTE', path)\n"
    )
    result = await run_sandboxed(source, timeout=10)
    assert result.ok, result.stderr
    lines = result.stdout.decode().splitlines()
    assert lines[0] == "remount -1"
    assert [line.split()[0] for line in lines[1:]] == ["refused"] * 3
    assert not target.exists()


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="syscall numbers")
async def test_ptrace_bpf_keys_io_uring_and_their_kin_are_refused() -> None:
    result = await run_sandboxed(_syscall_program(_KERNEL_SURFACE_CALLS), timeout=20)
    assert result.ok, result.stderr
    lines = result.stdout.decode().splitlines()
    assert len(lines) == len(_KERNEL_SURFACE_CALLS)
    assert not [line for line in lines if "ALLOWED" in line], lines


async def test_no_host_file_can_be_read(tmp_path: Path) -> None:
    """A secret the test writes, the project's own source, the server's virtual
    environment, /etc and the host's /proc: none exists inside."""
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cr3t-host-file")
    paths = [
        str(secret),
        __file__,
        sys.prefix,
        os.path.join(sys.prefix, "pyvenv.cfg"),
        "/etc/passwd",
        "/etc/hostname",
        "/home",
        "/var",
        "/proc/1/root/etc/passwd",
        "/proc/1/environ",
        "/sys/kernel",
        HOME_CACHE,
    ]
    source = (
        "import os\n"
        f"for path in {paths!r}:\n"
        "    try:\n"
        "        if os.path.isdir(path):\n"
        "            found = os.listdir(path)\n"
        "        else:\n"
        "            found = open(path, 'rb').read()\n"
        "    except OSError:\n"
        "        print('unreadable', path)\n"
        "    else:\n"
        "        print('READ' if found else 'empty', path)\n"
    )
    result = await run_sandboxed(source, timeout=10)
    assert result.ok, result.stderr
    out = result.stdout.decode()
    assert "s3cr3t" not in out
    lines = out.splitlines()
    assert len(lines) == len(paths)
    # /proc/1 is bwrap's own process inside the namespace: its environment is the sandbox's
    read = [line for line in lines if line.startswith("READ") and "/proc/1/environ" not in line]
    assert not read, read


async def test_the_root_holds_only_the_interpreter_and_libraries() -> None:
    result = await run_sandboxed("import os\nprint(sorted(os.listdir('/')))\n", timeout=10)
    assert result.ok, result.stderr
    top = set(ast.literal_eval(result.stdout.decode()))
    assert top <= {"dev", "lib", "lib64", "proc", "tmp", "usr", "root", "opt", "home"}
    assert "etc" not in top and "work" not in top and "sys" not in top and "var" not in top


async def test_no_host_unix_socket_is_reachable(tmp_path: Path) -> None:
    """A path socket in a host directory and an abstract one: neither gets a connection."""
    path = tmp_path / "host.sock"
    abstract = f"\0microagent-test-{os.getpid()}"
    listeners = []
    for address in (str(path), abstract):
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(address)
        listener.listen()
        listener.setblocking(False)
        listeners.append(listener)
    try:
        source = (
            "import socket\n"
            f"for address in ({str(path)!r}, {abstract!r}):\n"
            "    s = socket.socket(socket.AF_UNIX)\n"
            "    try:\n"
            "        s.connect(address)\n"
            "    except OSError as exc:\n"
            "        print('refused', exc.errno)\n"
            "    else:\n"
            "        print('CONNECTED')\n"
        )
        result = await run_sandboxed(source, timeout=10)
        for listener in listeners:
            with pytest.raises(BlockingIOError):
                listener.accept()  # nobody knocked
    finally:
        for listener in listeners:
            listener.close()
    assert result.ok, result.stderr
    assert [line.split()[0] for line in result.stdout.decode().splitlines()] == ["refused"] * 2


async def test_every_socket_family_but_unix_and_ip_is_refused() -> None:
    """Netlink (routes, audit, uevents), packet, key, ALG, vsock, bluetooth, CAN, XDP...:
    only UNIX, IPv4 and IPv6 open, and those reach only the sandbox's own loopback."""
    families = {
        "AF_NETLINK": 16,
        "AF_PACKET": 17,
        "AF_KEY": 15,
        "AF_ALG": 38,
        "AF_VSOCK": 40,
        "AF_BLUETOOTH": 31,
        "AF_CAN": 29,
        "AF_XDP": 44,
        "AF_TIPC": 30,
        "AF_RDS": 21,
        "AF_APPLETALK": 5,
    }
    source = (
        "import socket\n"
        f"for name, family in {families!r}.items():\n"
        "    for kind in (socket.SOCK_RAW, socket.SOCK_DGRAM, socket.SOCK_STREAM):\n"
        "        try:\n"
        "            socket.socket(family, kind, 0).close()\n"
        "        except OSError:\n"
        "            continue\n"
        "        print('OPENED', name, kind)\n"
        "print('done')\n"
    )
    result = await run_sandboxed(source, timeout=10)
    assert result.ok, result.stderr
    assert result.stdout.decode().splitlines() == ["done"]


async def test_proc_and_sys_tricks() -> None:
    """No /proc and no /sys: the sandbox's user is the server's (root, on CI), and a /proc
    let it write the host's sysctls (core_pattern runs a program as root on a crash).
    Neither can be mounted, and no sysctl path opens."""
    before = CORE_PATTERN.read_bytes()  # noqa: ASYNC240 - a few bytes from procfs
    source = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('exists', os.path.exists('/proc'), os.path.exists('/sys'))\n"
        "for fs in (b'proc', b'sysfs'):\n"
        "    print('mount', fs.decode(), libc.mount(fs, b'/tmp', fs, 0, None))\n"
        "for path in ('/proc/sys/kernel/core_pattern', '/proc/sysrq-trigger',\n"
        "             '/proc/self/uid_map', '/proc/1/mem', '/sys/kernel/uevent_helper',\n"
        "             '/tmp/proc/sys/kernel/core_pattern'):\n"
        "    try:\n"
        "        with open(path, 'w') as f:\n"
        "            f.write('|/tmp/x')\n"
        "    except OSError:\n"
        "        print('refused', path)\n"
        "    else:\n"
        "        print('WROTE', path)\n"
    )
    result = await run_sandboxed(source, timeout=10)
    assert result.ok, result.stderr
    lines = result.stdout.decode().splitlines()
    assert lines[:3] == ["exists False False", "mount proc -1", "mount sysfs -1"]
    assert [line.split()[0] for line in lines[3:]] == ["refused"] * 6, lines
    assert CORE_PATTERN.read_bytes() == before  # noqa: ASYNC240


async def test_threads_cannot_exhaust_processes() -> None:
    """Threads are allowed (a program may use them) but capped by RLIMIT_NPROC."""
    limits = SandboxLimits(processes=4)
    source = (
        "import threading, time\n"
        "made = 0\n"
        "stop = threading.Event()\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        threading.Thread(target=stop.wait, daemon=True).start()\n"
        "    except RuntimeError:\n"
        "        break\n"
        "    made += 1\n"
        "print('threads', made)\n"
        "stop.set()\n"
    )
    result = await run_sandboxed(source, timeout=10, limits=limits)
    assert result.ok, result.stderr
    made = int(result.stdout.decode().split()[1])
    assert made < 8


async def test_the_disk_cannot_be_filled() -> None:
    """The private tmpfs is size-capped; every other place is read-only; many small files
    stop at the same cap."""
    limits = SandboxLimits(tmp_bytes=2 << 20, file_bytes=64 << 20)
    source = (
        "import os, errno\n"
        "written = 0\n"
        "try:\n"
        "    for i in range(100000):\n"
        "        with open(f'/tmp/f{i}', 'wb') as f:\n"
        "            f.write(b'x' * 4096)\n"
        "        written += 4096\n"
        "except OSError as exc:\n"
        "    print('stopped', errno.errorcode[exc.errno])\n"
        "print('written', written)\n"
        "for path in ('/big', '/dev/big', '/proc/big'):\n"
        "    try:\n"
        "        open(path, 'wb').write(b'x')\n"
        "    except OSError:\n"
        "        print('refused', path)\n"
    )
    result = await run_sandboxed(source, timeout=20, limits=limits)
    assert result.ok, result.stderr
    lines = result.stdout.decode().splitlines()
    assert lines[0] == "stopped ENOSPC"
    assert int(lines[1].split()[1]) <= 2 << 20
    assert lines[2:] == ["refused /big", "refused /dev/big", "refused /proc/big"]


async def test_memory_exhaustion_through_mmap_is_capped() -> None:
    limits = SandboxLimits(memory_bytes=128 << 20)
    source = (
        "import mmap\n"
        "maps = []\n"
        "try:\n"
        "    for _ in range(64):\n"
        "        maps.append(mmap.mmap(-1, 64 << 20))\n"
        "except (OSError, MemoryError):\n"
        "    print('capped', len(maps))\n"
    )
    result = await run_sandboxed(source, timeout=10, limits=limits)
    assert result.ok, result.stderr
    assert result.stdout.decode().split()[0] == "capped"
    assert int(result.stdout.decode().split()[1]) < 2
