"""The basic sandbox's guard: run as `python -I guard.py` with the program on stdin.

Before the program runs, its own interpreter loses what a careless (or hostile) program could use
to reach outside: new processes, signals to other processes, deleting, renaming or re-permitting
files, writing outside the working folder, reading outside it and the Python installation,
sockets and ctypes. It is a guard against accidents in Python code, not a security boundary (a
determined program can rebuild what is removed from the interpreter); the bwrap sandbox is that
boundary. Standard library only: this file must not import quantkit.
"""

from __future__ import annotations

import builtins
import io
import os
import sys
from collections.abc import Callable
from typing import Any

# Process creation and control, identity, working folder, and every file operation that does not
# go through open(); refused for every path.
_REFUSED_OS = (
    "fork", "forkpty", "vfork", "system", "popen", "posix_spawn",
    "posix_spawnp", "execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp",
    "execlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe", "spawnl", "spawnle", "spawnlp",
    "spawnlpe", "kill", "killpg", "pidfd_open", "setsid", "setpgid", "setpgrp", "setuid",
    "setgid", "seteuid", "setegid", "setreuid", "setregid", "setresuid", "setresgid",
    "setgroups", "chdir", "fchdir", "chroot", "remove", "unlink", "rmdir", "removedirs",
    "rename", "renames", "replace", "truncate", "chmod", "fchmod", "lchmod", "chown", "fchown",
    "lchown", "chflags", "lchflags", "link", "symlink", "mkfifo", "mknod", "utime",
)
_REFUSED_SHUTIL = ("rmtree", "move", "chown", "copytree", "make_archive", "unpack_archive")
# Imported as None: `import socket` raises ImportError. The C modules are listed with their
# Python wrappers so neither route is open.
_REFUSED_MODULES = (
    "subprocess", "_posixsubprocess", "multiprocessing", "_multiprocessing", "socket", "_socket",
    "ssl", "_ssl", "ctypes", "_ctypes", "pty",
)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _refuse(name: str) -> Callable[..., Any]:
    def refused(*_args: Any, **_kwargs: Any) -> Any:
        raise PermissionError(f"{name} is disabled in the sandbox")

    return refused


def _ignore(*_args: Any, **_kwargs: Any) -> None:
    """os.register_at_fork in the sandbox: nothing can fork, so no callback will ever run."""


def install(workdir: str) -> None:
    """Take away from this interpreter what could reach outside `workdir`; irreversible."""
    import posix
    import resource
    import shutil
    import signal

    work = os.path.realpath(workdir)
    me = f"/proc/{os.getpid()}"
    # reading: the folder, the Python installation (tracebacks and lazy imports read it), /usr,
    # a few devices and this process's own /proc entry; writing: the folder only
    readable = tuple({work, os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix),
                      "/usr", me, "/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"})
    writable = (work, "/dev/null")

    def inside(path: Any, roots: tuple[str, ...]) -> bool:
        if isinstance(path, int):  # a descriptor this program already holds
            return True
        real = os.path.realpath(os.fsdecode(os.fspath(path)))
        return any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots)

    def check(path: Any, write: bool) -> None:
        if not inside(path, writable if write else readable):
            what = "writing" if write else "reading"
            raise PermissionError(f"{what} {os.fsdecode(os.fspath(path))!r} is outside the "
                                  "sandbox's folder")

    real_open, real_os_open, real_mkdir = io.open, os.open, os.mkdir
    real_fileio = io.FileIO

    def guarded_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        check(file, write=any(c in mode for c in "wax+"))
        return real_open(file, mode, *args, **kwargs)

    def guarded_os_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: Any = None) -> int:
        if dir_fd is not None:
            raise PermissionError("os.open with dir_fd is disabled in the sandbox")
        check(path, write=bool(flags & _WRITE_FLAGS))
        return real_os_open(path, flags, mode)

    def guarded_mkdir(path: Any, mode: int = 0o777, *, dir_fd: Any = None) -> None:
        if dir_fd is not None:
            raise PermissionError("os.mkdir with dir_fd is disabled in the sandbox")
        check(path, write=True)
        real_mkdir(path, mode)

    class GuardedFileIO(real_fileio):  # type: ignore[misc, valid-type]
        def __init__(self, file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> None:
            check(file, write=any(c in mode for c in "wax+"))
            super().__init__(file, mode, *args, **kwargs)

    replaced: dict[str, Callable[..., Any]] = {"open": guarded_os_open, "mkdir": guarded_mkdir}
    # Registering a fork callback is harmless once every way to fork is gone, and the standard
    # library does it at import (threading, random, logging on 3.11): accept and drop it.
    replaced["register_at_fork"] = _ignore
    replaced.update({name: _refuse(f"os.{name}") for name in _REFUSED_OS if hasattr(os, name)})
    for module in (os, posix):
        for name, fn in replaced.items():
            setattr(module, name, fn)
    for name in _REFUSED_SHUTIL:
        setattr(shutil, name, _refuse(f"shutil.{name}"))
    import _io

    guarded = {"open": guarded_open, "FileIO": GuardedFileIO}
    for module, names in ((builtins, ("open",)), (io, guarded), (_io, guarded)):
        for name in names:
            setattr(module, name, guarded[name])
    for name in ("pthread_kill", "pidfd_send_signal"):
        if hasattr(signal, name):
            setattr(signal, name, _refuse(f"signal.{name}"))
    # the limits were set as soft = hard; as root a program could raise the hard ones
    for name in ("setrlimit", "prlimit"):
        setattr(resource, name, _refuse(f"resource.{name}"))
    for name in _REFUSED_MODULES:
        sys.modules[name] = None  # type: ignore[assignment]


def main() -> None:
    """Read the program from stdin, guard this interpreter, run the program as __main__."""
    source = sys.stdin.buffer.read()
    sys.stdin.close()
    install(os.getcwd())
    code = compile(source, "<program>", "exec")
    exec(code, {"__name__": "__main__", "__builtins__": builtins})  # noqa: S102 - the point


if __name__ == "__main__":
    main()
