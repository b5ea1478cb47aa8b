"""The engine as a child process: started in its own process group (killed with it, and with
quantkit: PR_SET_PDEATHSIG), its output kept for errors and scanned for what it reports; and
`quantkit serve` itself as a child, for the commands that serve an artifact to measure it."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from quantkit import console
from quantkit.errors import EXIT_BAD_INPUT, BadInput, EngineError, QuantkitError
from quantkit.serve.launcher import Launch, engine_env


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
        if self.proc is not None:
            stop_group(self.proc, signal.SIGTERM, grace)


def stop_group(proc: subprocess.Popen, first: int, grace: float) -> None:
    """`first` to a child's whole process group, SIGKILL to what is left after `grace` s."""
    if proc.poll() is not None:
        return
    pgid = proc.pid
    for sig, wait in ((first, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    try:  # children that outlived the leader
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@contextlib.contextmanager
def quantkit_serve(artifact: Path, args: Sequence[str], log: Path,
                   timeout: float = 900.0) -> Iterator[str]:
    """`quantkit serve ARTIFACT --port P ARGS` as a child (its own process group, its output in
    `log`), for `quantkit doctor ARTIFACT` and `quantkit auto --load`: yields its URL once
    /health answers 200 (warm), and stops it (Ctrl-C to the group, then SIGKILL) on the way out.
    A child that exits first raises what it printed (`serve_failed`)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "quantkit", "serve", str(artifact), "--port", str(port), *args]
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_die_with_parent)
    try:
        deadline = time.monotonic() + timeout
        while not _healthy(url):
            if proc.poll() is not None:
                raise serve_failed(proc.returncode, log.read_text(encoding="utf-8",
                                                                  errors="replace"), artifact)
            if time.monotonic() > deadline:
                raise EngineError(f"quantkit serve did not become ready in {timeout:.0f} s",
                                  f"see {log}")
            time.sleep(0.5)
        yield url
    finally:
        stop_group(proc, signal.SIGINT, 60.0)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def serve_failed(code: int, output: str, artifact: Path) -> QuantkitError:
    """The error `quantkit serve` printed, raised again as one error (not quoted inside ours):
    its own error and hint when it refused bad input (exit 2), else an EngineError with its
    last lines."""
    lines = output.splitlines()
    message = next((ln[len("error: "):] for ln in lines if ln.startswith("error: ")), "")
    hint = next((ln[len("hint: "):] for ln in lines if ln.startswith("hint: ")), "")
    if code == EXIT_BAD_INPUT and message:
        return BadInput(message, hint)
    return EngineError(f"quantkit serve exited {code}: {message or output.strip()[-300:]}",
                       f"run `quantkit serve {artifact} --allow-unvalidated` to see why")
