"""The sandbox against hostile programs, in both sandboxes, each checked from outside with a canary.

Every hostile program here is bounded so that it cannot hurt this machine even if the sandbox
failed: forks are counted, the 10 GB file is sparse, nothing recursive is deleted but a canary
folder of the test's own, and the process-killing ones aim only at the test process itself.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quantkit.engines import Generation
from quantkit.validate.humaneval import load_problems, run_humaneval
from quantkit.validate.sandbox import BASIC_WARNING, bwrap_problem, resolve_sandbox, run_program

REPO = Path(__file__).resolve().parents[2]
NORMAL = "assert sorted([3, 1, 2]) == [1, 2, 3]\n"
_BWRAP = bwrap_problem()
KINDS = [pytest.param("bwrap", marks=pytest.mark.skipif(
             _BWRAP is not None, reason=f"bwrap cannot run here: {_BWRAP}")), "basic"]


def _stat(pid: str) -> list[str]:
    """/proc/PID/stat's fields after the command name (state, ppid, ...); [] once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return []


def _state(pid: str) -> str:
    return (_stat(pid) or ["gone"])[0]


def _ours(pid: str) -> bool:
    """Whether `pid` descends from this process: the suite may run in several processes at once
    (pytest-xdist), and another worker's sandboxes are neither checked nor killed here."""
    me = os.getpid()
    for _ in range(64):
        fields = _stat(pid)
        if len(fields) < 2 or pid in ("0", "1"):
            return False
        pid = fields[1]
        if int(pid) == me:
            return True
    return False


def _sandboxed() -> set[int]:
    """Live processes of ours that belong to a sandbox: bwrap, and the interpreters both
    sandboxes start (`python -I -` inside bwrap, `python -I .../guard.py` in the basic one)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ours = (os.path.basename(argv[0]) == b"bwrap"
                or (b"-I" in argv and (argv[-2:] == [b"-", b""] or any(a.endswith(b"guard.py")
                                                                       for a in argv))))
        if ours and _state(entry.name) not in ("Z", "X", "gone") and _ours(entry.name):
            found.add(int(entry.name))
    return found


def _subreaper(on: bool) -> None:
    """PR_SET_CHILD_SUBREAPER: a process the sandbox leaves behind, orphaned, is re-parented to
    this one rather than to init, so `_ours` still finds it."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(36, int(on), 0, 0, 0)


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> Iterator[str]:
    """A sandbox; afterwards no sandboxed process is left and a normal program still passes."""
    _subreaper(True)
    before = _sandboxed()
    yield request.param
    left = _sandboxed() - before
    _subreaper(False)
    for pid in left:  # never leave them running, even when the test fails
        os.kill(pid, signal.SIGKILL)
        try:
            os.waitpid(pid, 0)  # re-parented to this process: reaped here
        except ChildProcessError:
            pass
    assert not left, f"processes outlived the run: {left}"
    assert run_program(NORMAL, sandbox=request.param) == (True, "passed")


@pytest.fixture
def canary(tmp_path: Path) -> Iterator[Path]:
    """A file outside the program's folder that must stay exactly as it is."""
    folder = tmp_path / "outside"
    folder.mkdir()
    file = folder / "canary.txt"
    file.write_text("intact")
    yield file
    assert file.read_text() == "intact"
    assert sorted(p.name for p in folder.iterdir()) == ["canary.txt"]


def _fails(source: str, kind: str, **kw: Any) -> str:
    passed, result = run_program(source, sandbox=kind, **kw)
    assert not passed, result
    return result


@pytest.mark.parametrize("attack", [
    "import os\nos.remove({p!r})\n",
    "import pathlib\npathlib.Path({p!r}).unlink()\n",
    "import shutil, os\nshutil.rmtree(os.path.dirname({p!r}))\n",
    "open({p!r}, 'w').write('overwritten')\n",
    "import pathlib\npathlib.Path({p!r}).write_text('overwritten')\n",
    "import os\nfd = os.open({p!r}, os.O_WRONLY | os.O_TRUNC)\nos.write(fd, b'overwritten')\n",
    "import os\nos.replace({p!r}, {p!r} + '.moved')\n",
    "import os\nos.chmod({p!r}, 0)\n",
    "open({p!r} + '.new', 'w').write('planted')\n",
], ids=["remove", "unlink", "rmtree", "open-w", "write_text", "os.open", "replace", "chmod", "create"])
def test_files_outside_its_folder_stay_intact(kind: str, canary: Path, attack: str) -> None:
    _fails(attack.format(p=str(canary)), kind)


def test_cannot_write_into_the_project_or_the_home(kind: str) -> None:
    targets = [REPO / f".sandbox-canary-{uuid.uuid4().hex}",
               REPO / "quantkit" / f".sandbox-canary-{uuid.uuid4().hex}",
               Path.home() / f".sandbox-canary-{uuid.uuid4().hex}"]
    try:
        for target in targets:
            _fails(f"open({str(target)!r}, 'w').write('x')\n", kind)
            assert not target.exists()
    finally:
        for target in targets:
            target.unlink(missing_ok=True)


def test_cannot_read_a_file_outside(kind: str, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("sandbox-file-secret-3141")
    result = _fails(f"raise SystemExit(open({str(secret)!r}).read())\n", kind)
    assert "sandbox-file-secret" not in result


def test_cannot_read_a_secret_of_the_parent(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QK_SECRET", "sandbox-env-secret-2718")
    source = ("import os\nfound = os.environ.get('QK_SECRET')\n"
              "for pid in (os.getppid(), 1):\n"
              "    try:\n"
              "        env = open(f'/proc/{pid}/environ', 'rb').read()\n"
              "    except OSError:\n"
              "        continue\n"
              "    if b'sandbox-env-secret' in env:\n"
              "        found = env.decode(errors='replace')\n"
              "if found is None:\n"
              "    raise SystemExit('no secret found')\n"
              "print(found)\n")
    result = _fails(source, kind)
    assert "sandbox-env-secret" not in result
    names = "import os\nassert set(os.environ) <= {'PATH', 'LANG', 'LC_CTYPE', 'PWD'}, dict(os.environ)\n"
    assert run_program(names, sandbox=kind) == (True, "passed")


def test_cannot_reach_a_listener_on_localhost(kind: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        source = ("import socket\n"
                  f"s = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                  "s.sendall(b'escaped')\n")
        _fails(source, kind)
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):  # nothing is waiting to be accepted
            listener.accept()


def test_a_fork_bomb_is_refused(kind: str) -> None:
    # at most 64 children, each exiting within 30 s: harmless even if forks were allowed
    source = ("import os, time\nfor _ in range(64):\n    if os.fork() == 0:\n"
              "        time.sleep(30)\n        os._exit(0)\n")
    result = _fails(source, kind)
    assert "BlockingIOError" in result or "PermissionError" in result


def test_a_setsid_double_fork_does_not_outlive_the_run(kind: str) -> None:
    # the fixture checks that no sandboxed process is left afterwards
    source = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
              "        time.sleep(60)\n        os._exit(0)\n    os._exit(0)\ntime.sleep(0.5)\n")
    _fails(source, kind)


def test_killing_its_parent_fails_and_the_test_survives(kind: str) -> None:
    source = (f"import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"
              f"os.kill({os.getpid()}, signal.SIGKILL)\n")
    _fails(source, kind)
    os.kill(os.getpid(), 0)  # still here


def test_a_10_gb_file_is_stopped_by_the_file_size_limit(kind: str) -> None:
    # sparse (a seek, then one byte), and at most 64 MiB of real writes: never 10 GB on disk
    sparse = "f = open('big', 'wb')\nf.seek(10 * 1024**3)\nf.write(b'x')\nf.close()\n"
    assert _fails(sparse, kind) == "file size limit"
    chunks = ("f = open('big', 'wb')\nfor _ in range(64):\n    f.write(b'x' * 2**20)\n"
              "    f.flush()\n")
    assert _fails(chunks, kind) == "file size limit"


def test_an_infinite_loop_times_out(kind: str) -> None:
    start = time.monotonic()
    assert _fails("while True:\n    pass\n", kind, timeout=2) == "timed out"
    assert time.monotonic() - start < 6


def test_a_memory_bomb_hits_the_limit(kind: str) -> None:
    assert _fails("x = bytearray(8 * 1024**3)\n", kind, timeout=5) == "memory limit"
    grow = "x = []\nwhile True:\n    x.append(bytearray(10**6))\n"
    assert _fails(grow, kind, timeout=10, memory_mb=256) == "memory limit"
    assert len(bytearray(64 * 1024**2)) == 64 * 1024**2  # the test process still allocates


def test_the_folder_is_empty_writable_and_gone_afterwards(kind: str) -> None:
    source = ("import os\nassert os.listdir('.') == [], os.listdir('.')\n"
              "open('left-behind.txt', 'w').write('x')\nassert os.listdir('.') == ['left-behind.txt']\n"
              "raise SystemExit(os.getcwd())\n")
    cwd = Path(_fails(source, kind).removeprefix("failed: "))
    assert cwd.resolve() != Path.cwd().resolve()
    assert not (cwd / "left-behind.txt").exists()


def test_limits_apply_to_the_child_only(kind: str) -> None:
    import resource

    before = [resource.getrlimit(r) for r in (resource.RLIMIT_AS, resource.RLIMIT_CPU)]
    source = ("import resource\nassert resource.getrlimit(resource.RLIMIT_AS)[0] == 300 * 1024**2\n"
              f"assert resource.getrlimit(resource.RLIMIT_FSIZE)[0] == {16 * 1024**2}\n")
    assert run_program(source, memory_mb=300, sandbox=kind) == (True, "passed")
    assert [resource.getrlimit(r) for r in (resource.RLIMIT_AS, resource.RLIMIT_CPU)] == before


def test_threads_and_the_standard_library_work(kind: str) -> None:
    source = ("import hashlib, threading, re, math, collections, itertools, json\n"
              "out = []\nt = threading.Thread(target=lambda: out.append(hashlib.md5(b'x').hexdigest()))\n"
              "t.start()\nt.join()\nassert out == ['9dd4e461268c8034f5c8564e155c67a6']\n")
    assert run_program(source, sandbox=kind) == (True, "passed")


def test_modules_that_register_fork_callbacks_work(kind: str) -> None:
    # threading, random, logging and concurrent.futures call os.register_at_fork when imported
    # (a Python built without bz2 imports none of them before the program, and 3.11 failed
    # there): a HumanEval completion uses them, and registering a callback is no escape
    source = ("import os\nos.register_at_fork(after_in_child=lambda: None)\n"
              "import random, logging, queue, concurrent.futures as cf\n"
              "with cf.ThreadPoolExecutor(2) as pool:\n"
              "    assert sorted(pool.map(abs, [-2, 1])) == [1, 2]\n"
              "q = queue.Queue(); q.put(random.Random(0).random()); assert q.get() < 1\n"
              "logging.getLogger('x').warning('still here')\n")
    assert run_program(source, sandbox=kind) == (True, "passed")


def test_a_registered_fork_callback_never_runs(kind: str) -> None:
    # registering is allowed; forking stays refused, so the callback never writes its file
    source = ("import os\n"
              "os.register_at_fork(after_in_child=lambda: open('ran', 'w').write('x'))\n"
              "os.fork()\n")
    result = _fails(source, kind)
    assert "BlockingIOError" in result or "os.fork is disabled" in result


class _Hostile:
    """A model whose completions attack the machine, except for the last problem's."""

    name, label, eos_token_ids, context_length = "hostile", "hostile", set(), 4096

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers

    def generate_many(self, prompts: list[str], **_: Any) -> list[Generation]:
        return [Generation(text=self.answers[p], token_ids=[], finish_reason="stop")
                for p in prompts]


def test_validation_carries_on_after_hostile_completions(kind: str, canary: Path) -> None:
    problems = load_problems(5)
    attacks = [f"    import os\n    os.remove({str(canary)!r})\n",
               "    import os, signal\n    os.kill(os.getppid(), signal.SIGKILL)\n",
               "    import os\n    [os.fork() for _ in range(16)]\n",
               "    x = bytearray(8 * 1024**3)\n"]
    answers = {p["prompt"]: a for p, a in zip(problems, attacks)}
    answers[problems[-1]["prompt"]] = problems[-1]["canonical_solution"]
    res = run_humaneval(_Hostile(answers), limit=5, max_tokens=384, sandbox=kind)
    assert res["sandbox"] == kind
    outcomes = [res["problems"][p["task_id"]]["passed"] for p in problems]
    assert outcomes == [False, False, False, False, True], [
        res["problems"][p["task_id"]]["result"] for p in problems]
    assert res["problems"][problems[3]["task_id"]]["result"] == "memory limit"


def _python(code: str, path: str) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter whose PATH is only `path` (where bwrap is not)."""
    env = {**os.environ, "PATH": path}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=120)


def test_auto_falls_back_to_basic_with_a_warning_when_bwrap_is_missing(tmp_path: Path) -> None:
    out = _python("import json; from quantkit.validate.sandbox import resolve_sandbox\n"
                  "print(json.dumps(resolve_sandbox('auto')))", str(tmp_path))
    kind, warning = json.loads(out.stdout)
    assert kind == "basic"
    assert warning == BASIC_WARNING.format(why="bwrap is not installed")
    assert "apt-get install bubblewrap" in warning


def test_asking_for_bwrap_without_it_is_bad_input(tmp_path: Path) -> None:
    home = tmp_path / "home"
    proc = subprocess.run(
        [sys.executable, "-m", "quantkit", "validate", str(tmp_path / "artifact"), "--baseline",
         "smollm2-135m", "--tasks", "humaneval", "--sandbox", "bwrap", "--out",
         str(tmp_path / "report")], capture_output=True, text=True, cwd=REPO, timeout=300,
        env={**os.environ, "PATH": str(tmp_path), "QUANTKIT_HOME": str(home)})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == ["error: --sandbox bwrap cannot run: bwrap is not installed",
                     "hint: apt-get install bubblewrap (and allow user namespaces), or pass "
                     "--sandbox basic"]
    assert not (tmp_path / "report").exists()


def test_resolve_sandbox() -> None:
    assert resolve_sandbox("basic") == (
        "basic", BASIC_WARNING.format(why="--sandbox basic was asked for"))
    assert resolve_sandbox("auto")[0] == ("bwrap" if _BWRAP is None else "basic")
    if _BWRAP is None:
        assert resolve_sandbox("bwrap") == ("bwrap", None)
    from quantkit.errors import BadInput

    with pytest.raises(BadInput, match="unknown --sandbox 'docker'"):
        resolve_sandbox("docker")


@pytest.mark.slow
def test_validate_records_the_sandbox_and_warns_about_basic(cli, tiny_artifact, tiny_model,
                                                            tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("QUANTKIT_HOME", str(tmp_path / "home"))
    out = tmp_path / "report"
    code, stdout, err = cli("validate", str(tiny_artifact), "--baseline", str(tiny_model),
                            "--tasks", "humaneval", "--humaneval-limit", "1",
                            "--humaneval-max-tokens", "8", "--sandbox", "basic", "--out", str(out))
    assert code == 0, err
    warning = BASIC_WARNING.format(why="--sandbox basic was asked for")
    assert f"warning: {warning}" in stdout
    res = json.loads((out / "results.json").read_text())
    he = res["tasks"]["humaneval"]
    assert res["settings"]["humaneval"]["sandbox"] == "basic"
    assert he["sandbox"] == he["quantized"]["sandbox"] == he["baseline"]["sandbox"] == "basic"
    assert he["sandbox_warning"] == warning
    html = (out / "report.html").read_text()
    assert "Weaker sandbox." in html and "basic sandbox" in html
