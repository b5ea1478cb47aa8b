"""Helpers for tests that run the CLI as a subprocess: `quantkit ...` and `quantkit serve` on
127.0.0.1. Each call names its working folder (a temporary one), never the repository."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def quantkit(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 3600
             ) -> subprocess.CompletedProcess:
    """`python -m quantkit ARGS` run in `cwd`: relative paths (recipes' outputs, reports/) land there."""
    return subprocess.run([sys.executable, "-m", "quantkit", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=timeout, env={**os.environ, **(env or {})})


def free_port() -> int:
    from quantkit.serve.process import free_port as fp

    return fp()


def get(url: str, key: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (the engine under quantkit serve)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class Served:
    """`quantkit serve ARGS --port P` run in `cwd`; waits for /health 200, remembering every
    status seen."""

    def __init__(self, *args: str, cwd: Path, env: dict[str, str] | None = None,
                 timeout: float = 900) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "quantkit", "serve", *args, "--port", str(self.port)],
            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **(env or {})})
        self.health: list[int] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"quantkit serve exited {self.proc.returncode}: "
                                   f"{self.proc.stderr.read()[-3000:]}")
            try:
                status, _ = get(self.url + "/health")
            except (urllib.error.URLError, ConnectionError):
                status = 0
            if status:
                self.health.append(status)
            if status == 200:
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("quantkit serve did not become ready")

    def stop(self) -> tuple[int, str]:
        """Ctrl-C, as a user would; the exit code and stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode, self.proc.stderr.read()


def check_auto_speeds(res: dict, engine: str, loads: list[int], repeats: int,
                      smallest: str) -> None:
    """`auto --load --prefer speed --json`'s speeds: every server (the original's too) measured
    on `engine` at `loads`, `repeats` times, each figure and level with its interval, each
    candidate's ratio to the original inside its own, and a choice that says why (the smallest
    candidate when no difference is measurable)."""
    for speed in [res["reference"]] + [c["speed"] for c in res["candidates"]]:
        assert speed["engine"] == engine and speed["output_tok_s"] > 0
        assert len(speed["repeats"]) == repeats
        lo, hi = speed["ci"]
        assert 0 <= lo <= sum(speed["repeats"]) / repeats <= hi
        assert [lv["concurrency"] for lv in speed["levels"]] == loads
        assert all(lv["failed"] == 0 and len(lv["repeats"]) == repeats and lv["ci"]
                   for lv in speed["levels"])
    for c in res["candidates"]:
        vs = c["speed"]["vs_original"]
        assert vs["ci"][0] <= vs["ratio"] <= vs["ci"][1]
    reason = res["chosen"]["reason"]
    assert reason.startswith(("no measurable difference", "measurably faster", "the smallest"))
    if "no measurable difference" in reason:
        assert res["chosen"]["name"] == smallest
