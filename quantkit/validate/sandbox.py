"""Where HumanEval's model-written programs run: `run_program`, in bubblewrap or the basic sandbox.

bwrap (bubblewrap, where it can create namespaces): the program sees /usr and the Python
installation read-only and nothing else of the machine (no home, no project, no /etc: the rest
of its root is an empty read-only tmpfs), a private 64 MiB tmpfs as its folder, no network (its
own network namespace, loopback only), its own PID namespace (whatever it starts dies with the
run: --die-with-parent, and the namespace ends with its first process), no user namespaces of its
own, and a seccomp filter that refuses new processes (threads are allowed): RLIMIT_NPROC would
bound processes for an ordinary user, but the kernel does not enforce it for root, who runs CI.

basic (where bwrap is missing or cannot run): the program runs as the invoking user, with the
filesystem and network reachable, behind process limits and `guard.py`, which takes fork, exec,
subprocess, kill, deleting and renaming files, writes outside the folder, sockets and ctypes out
of the program's interpreter before it runs. RLIMIT_NPROC bounds processes for an ordinary user;
as root the kernel ignores it and the guard is the only bound. A determined program can get past
a Python-level guard, hence the warning that goes with it into results.json and the report.

Both: `python -I` with a two-variable environment (no inherited secrets), rlimits on memory, CPU
time and file size, an empty temporary folder, a wall-clock timeout, and the process group killed
at the end.
"""

from __future__ import annotations

import errno
import functools
import json
import math
import os
import resource
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from quantkit.errors import BadInput

SANDBOXES = ("auto", "bwrap", "basic")  # --sandbox (HumanEval's option): auto picks one of the two
BASIC_WARNING = ("HumanEval's programs ran in the basic sandbox (process limits and a Python-level "
                 "guard, as the invoking user, with the filesystem and the network reachable) "
                 "because {why}; install bubblewrap (apt-get install bubblewrap) for the real one")

_STDERR_TAIL = 8192  # bytes of stderr read back: enough for the last line of a traceback
_MAX_FILE_BYTES = 16 * 1024**2  # caps files the program writes, its stderr included
_TMPFS_BYTES = 64 * 1024**2  # bwrap: the program's whole folder
_NPROC_MARGIN = 32  # tasks above the user's count now (bwrap itself takes two)
_GUARD = Path(__file__).with_name("guard.py")


def resolve_sandbox(requested: str) -> tuple[str, str | None]:
    """The sandbox that runs for `requested` (auto: bwrap where it works here, else basic) and
    the warning that goes with the basic one; BadInput when bwrap is asked for and cannot run."""
    if requested not in SANDBOXES:
        raise BadInput(f"unknown --sandbox {requested!r}", "use " + ", ".join(SANDBOXES))
    if requested == "basic":
        return "basic", BASIC_WARNING.format(why="--sandbox basic was asked for")
    problem = bwrap_problem()
    if problem is None:
        return "bwrap", None
    if requested == "bwrap":
        raise BadInput(f"--sandbox bwrap cannot run: {problem}",
                       "apt-get install bubblewrap (and allow user namespaces), or pass "
                       "--sandbox basic")
    return "basic", BASIC_WARNING.format(why=problem)


@functools.cache
def bwrap_problem() -> str | None:
    """Why bwrap cannot sandbox programs here, or None when it can (probed once per process)."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed"
    machine = os.uname().machine
    if machine not in _ARCHES:
        return f"quantkit has no seccomp filter for bwrap on {machine}"
    ok, result = _execute("bwrap", "pass\n", timeout=20.0, memory_mb=256)
    return None if ok else f"bwrap cannot start a program here ({result})"


def run_program(source: str, *, timeout: float = 10.0, memory_mb: int = 1024,
                sandbox: str = "auto") -> tuple[bool, str]:
    """Run untrusted Python `source` in a sandbox; (passed, result).

    result is "passed", "timed out", "memory limit", "file size limit" or
    "failed: <last line of stderr>"."""
    return _execute(resolve_sandbox(sandbox)[0], source, timeout=timeout, memory_mb=memory_mb)


def _execute(kind: str, source: str, *, timeout: float, memory_mb: int) -> tuple[bool, str]:
    env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": os.environ.get("LANG", "C.UTF-8")}
    cpu_seconds = math.ceil(timeout) + 1  # a backstop; the wall-clock timeout normally fires first
    nproc = None if os.geteuid() == 0 else _user_tasks(os.getuid()) + _NPROC_MARGIN
    with ExitStack() as stack:
        # the source goes in on stdin and stderr to an unlinked file outside the folder, so the
        # program starts in a truly empty folder and cannot flood the parent's memory
        cwd = stack.enter_context(tempfile.TemporaryDirectory(prefix="quantkit-sandbox-",
                                                              ignore_cleanup_errors=True))
        err = stack.enter_context(tempfile.TemporaryFile())
        info_r: int = -1
        fds: tuple[int, ...] = ()
        if kind == "bwrap":
            rules = stack.enter_context(tempfile.TemporaryFile())
            rules.write(_seccomp_filter(os.uname().machine))
            rules.seek(0)
            info_r, info_w = os.pipe()
            stack.callback(os.close, info_r)
            argv, fds = _bwrap_argv(rules.fileno(), info_w, env["LANG"]), (rules.fileno(), info_w)
        else:
            argv = [sys.executable, "-I", str(_GUARD)]
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err, cwd=cwd,
                env=env, start_new_session=True, pass_fds=fds,
                preexec_fn=_limits(memory_mb, cpu_seconds, nproc))  # noqa: PLW1509 (see _limits)
        finally:
            if kind == "bwrap":
                os.close(info_w)
        timed_out = False
        try:
            proc.communicate(source.encode("utf-8"), timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            if kind == "bwrap":
                _kill_namespace(info_r)
        finally:
            # Kill the whole group every time: children the program forked must not outlive it.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        err.seek(max(0, err.seek(0, os.SEEK_END) - _STDERR_TAIL))
        stderr = err.read().decode("utf-8", errors="replace")
    code = proc.returncode
    if kind == "bwrap" and code > 128:  # bwrap reports a program killed by signal N as 128 + N
        code = -(code - 128)
    return _outcome(code, timed_out, stderr)


def _outcome(code: int, timed_out: bool, stderr: str) -> tuple[bool, str]:
    if timed_out or code == -signal.SIGXCPU:
        return False, "timed out"
    if code == 0:
        return True, "passed"
    if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
        return False, "memory limit"
    if code == -signal.SIGXFSZ or "File too large" in stderr:
        return False, "file size limit"
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    last = lines[-1][:200] if lines else ""
    if not last:
        last = (f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}")
    return False, f"failed: {last}"


def _limit(kind: int, value: int) -> None:
    """Lower one rlimit to `value` (soft and hard), never above the hard limit we inherited."""
    _, hard = resource.getrlimit(kind)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(kind, (value, value))


def _limits(memory_mb: int, cpu_seconds: int, nproc: int | None) -> Callable[[], None]:
    """A preexec_fn that applies the limits in the child between fork and exec.

    It only calls setrlimit (a C function of a module imported here already), so it takes no
    Python-level lock that a thread of the parent might hold at fork time. `nproc` is None for
    root, for whom the kernel does not enforce RLIMIT_NPROC."""
    memory = memory_mb * 1024**2

    def apply() -> None:
        _limit(resource.RLIMIT_AS, memory)
        _limit(resource.RLIMIT_CPU, cpu_seconds)
        _limit(resource.RLIMIT_FSIZE, _MAX_FILE_BYTES)
        _limit(resource.RLIMIT_CORE, 0)
        if nproc is not None:
            _limit(resource.RLIMIT_NPROC, nproc)

    return apply


def _user_tasks(uid: int) -> int:
    """Tasks (processes and threads) `uid` runs now: what RLIMIT_NPROC counts."""
    count = 0
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and entry.stat().st_uid == uid:
                count += len(os.listdir(entry / "task"))
        except OSError:  # gone meanwhile
            pass
    return count


def _bwrap_argv(seccomp_fd: int, info_fd: int, lang: str) -> list[str]:
    """bwrap's command line: what the program sees, and the program (`python -I -`)."""
    python = os.path.realpath(sys.executable)
    argv = ["bwrap", "--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-net",
            "--unshare-uts", "--unshare-cgroup-try", "--disable-userns", "--uid", "65534",
            "--gid", "65534", "--hostname", "sandbox", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin",
            "--setenv", "LANG", lang, "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    # the Python installation (pyenv's lives in the home folder: only it is bound, not the home)
    prefixes = {os.path.realpath(sys.base_prefix), os.path.dirname(os.path.dirname(python))}
    for prefix in sorted(prefixes):
        if prefix != "/usr" and not prefix.startswith("/usr/"):
            argv += ["--ro-bind", prefix, prefix]
    return argv + ["--proc", "/proc", "--dev", "/dev", "--size", str(_TMPFS_BYTES),
                   "--perms", "1777", "--tmpfs", "/tmp", "--perms", "0700", "--dir", "/tmp/work",
                   "--remount-ro", "/", "--chdir", "/tmp/work", "--seccomp", str(seccomp_fd),
                   "--info-fd", str(info_fd), python, "-I", "-"]


def _kill_namespace(info_fd: int) -> None:
    """Kill the first process of the program's PID namespace (the kernel then kills the rest,
    and bwrap exits once they are gone); its pid is in what bwrap wrote to --info-fd. Returns
    once that process has exited, which it does only after the rest of its namespace (at most
    5 s): a timed-out program is gone, not dying, when run_program returns."""
    ready, _, _ = select.select([info_fd], [], [], 1.0)
    if not ready:
        return
    try:
        pid = int(json.loads(os.read(info_fd, 65536) or b"{}").get("child-pid", 0))
    except (ValueError, AttributeError, OSError):
        return
    if pid <= 0:
        return
    try:
        pidfd = os.pidfd_open(pid)  # held, so the pid cannot be reused under us
    except ProcessLookupError:  # gone meanwhile
        return
    except OSError:  # no pidfds (a kernel before 5.3): killed, not waited for
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        select.select([pidfd], [], [], 5.0)  # readable once it has exited
    except OSError:
        pass
    finally:
        os.close(pidfd)


# seccomp: refuse every way of creating a process, allow threads (clone with CLONE_THREAD).
# clone3 gets ENOSYS, so the C library falls back to clone for its threads, as under Docker.
_ARCHES = {"x86_64": (0xC000003E, {"fork": 57, "vfork": 58}, 56, 435),
           "aarch64": (0xC00000B7, {}, 220, 435)}
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _ERRNO, _KILL = 0x7FFF0000, 0x00050000, 0x80000000
_CLONE_THREAD = 0x00010000
_X32_BIT = 0x40000000


def _seccomp_filter(machine: str) -> bytes:
    """The classic BPF program bwrap --seccomp loads (struct sock_filter: u16 code, u8 jt, u8 jf,
    u32 k), reading struct seccomp_data: nr at 0, arch at 4, args[0]'s low word at 16."""
    arch, forks, clone, clone3 = _ARCHES[machine]
    again = _ERRNO | errno.EAGAIN
    prog = [(_LD_ABS, 0, 0, 4), (_JEQ, 1, 0, arch), (_RET, 0, 0, _KILL), (_LD_ABS, 0, 0, 0)]
    if machine == "x86_64":  # the x32 ABI's numbers would bypass the checks below
        prog += [(_JGE, 0, 1, _X32_BIT), (_RET, 0, 0, _ERRNO | errno.ENOSYS)]
    prog += [(_JEQ, 0, 1, clone3), (_RET, 0, 0, _ERRNO | errno.ENOSYS)]
    for nr in forks.values():
        prog += [(_JEQ, 0, 1, nr), (_RET, 0, 0, again)]
    prog += [(_JEQ, 0, 3, clone), (_LD_ABS, 0, 0, 16), (_JSET, 1, 0, _CLONE_THREAD),
             (_RET, 0, 0, again), (_RET, 0, 0, _ALLOW)]
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)
