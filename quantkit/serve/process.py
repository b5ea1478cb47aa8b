"""The engine as a child process: started in its own process group (killed with it, and with
quantkit: PR_SET_PDEATHSIG), its output kept for errors and scanned for what it reports."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path

from quantkit import console
from quantkit.errors import BadInput
from quantkit.serve.launch import Launch, engine_env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_port(host: str, port: int) -> None:
    """Refuse a port that is taken before anything starts."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise BadInput(f"cannot listen on {host}:{port}: {exc.strerror}",
                           "pass another --port, or stop what holds it") from None


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: no orphan if quantkit is killed hard


class EngineProcess:
    """Start, watch and stop one engine."""

    def __init__(self, launch: Launch, log_file: Path | None = None,
                 on_line: Callable[[str], None] | None = None) -> None:
        self.launch = launch
        self.tail: deque[str] = deque(maxlen=40)
        self.log_file = log_file
        self.on_line = on_line
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        console.log(f"starting {self.launch.engine}: {' '.join(self.launch.cmd)}")
        self.proc = subprocess.Popen(
            self.launch.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=engine_env(self.launch), start_new_session=True, preexec_fn=_die_with_parent,
            errors="replace")
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        sink = open(self.log_file, "a", encoding="utf-8") if self.log_file else None
        try:
            for line in self.proc.stdout:
                self.tail.append(line.rstrip())
                if sink:
                    sink.write(line)
                    sink.flush()
                if self.on_line:
                    self.on_line(line)
        finally:
            if sink:
                sink.close()

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def last_lines(self, n: int = 5) -> str:
        return " | ".join(list(self.tail)[-n:])

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the whole process group, then SIGKILL what is left."""
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = self.proc.pid
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # children that outlived the leader
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
