"""HumanEval: the real problems, checked in real sandboxed processes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from quantkit.engines import Generation
from quantkit.validate.humaneval import (
    STOP,
    check_completion,
    load_problems,
    run_humaneval,
    run_program,
    truncate,
)


@pytest.fixture(scope="module")
def problems() -> list[dict]:
    return load_problems(3)


def test_load_problems_keys_and_order() -> None:
    first = load_problems(3)
    assert len(first) == 3
    assert [p["task_id"] for p in first] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    for p in first:
        assert {"task_id", "prompt", "test", "entry_point"} <= p.keys()
    everything = load_problems()
    assert len(everything) == 164
    assert everything[:3] == first


def test_canonical_solutions_pass(problems: list[dict]) -> None:
    for p in problems:
        assert check_completion(p, p["canonical_solution"]) == (True, "passed"), p["task_id"]


def test_wrong_solution_fails(problems: list[dict]) -> None:
    passed, result = check_completion(problems[0], "    return False\n")
    assert not passed
    assert result.startswith("failed:") and "AssertionError" in result
    assert len(result) <= len("failed: ") + 200


def test_syntax_error_fails(problems: list[dict]) -> None:
    passed, result = check_completion(problems[0], "    return (\n")
    assert not passed and result.startswith("failed:") and "SyntaxError" in result


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie left for a non-reaping init counts as dead)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_infinite_loop_is_killed_with_its_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    source = ("import os\nif os.fork() == 0:\n    while True: pass\n"
              f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\nwhile True: pass\n")
    start = time.monotonic()
    assert run_program(source, timeout=2) == (False, "timed out")
    assert time.monotonic() - start < 6
    assert not _alive(int(pid_file.read_text()))


def test_memory_bomb_hits_the_limit() -> None:
    assert run_program("x = bytearray(8 * 1024**3)\n", timeout=5) == (False, "memory limit")
    grow = "x = []\nwhile True:\n    x.append(bytearray(10**6))\n"
    assert run_program(grow, timeout=10, memory_mb=256) == (False, "memory limit")
    # the test process itself still allocates freely
    assert len(bytearray(64 * 1024**2)) == 64 * 1024**2


def test_no_secrets_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QK_SECRET", "x")
    assert run_program("import os\nassert 'QK_SECRET' not in os.environ\n") == (True, "passed")
    passed, result = run_program("import os\nprint(os.environ['QK_SECRET'])\n")
    assert not passed and "KeyError" in result
    assert run_program("import os\nassert set(os.environ) <= {'PATH', 'LANG', 'LC_CTYPE'}\n") \
        == (True, "passed")


def test_cwd_is_an_empty_temp_dir_removed_afterwards() -> None:
    source = ("import os\nassert os.listdir('.') == [], os.listdir('.')\n"
              "open('left-behind.txt', 'w').write('x')\nraise SystemExit(os.getcwd())\n")
    passed, result = run_program(source)
    assert not passed and result.startswith("failed: ")
    cwd = Path(result.removeprefix("failed: "))
    assert cwd.name.startswith("quantkit-humaneval-")
    assert cwd.resolve() != Path.cwd().resolve()
    assert not cwd.exists()


def test_truncate_cuts_at_the_first_stop_string() -> None:
    body = "    return x + 1\n"
    assert truncate(body) == body
    assert truncate(body + "\ndef helper():\n    pass\n") == body
    assert truncate(body + "\n\nif __name__ == '__main__':\n    main()\n") == body + "\n"
    assert truncate(body + "\nprint(f(1))\nclass A: pass\n") == body
    assert truncate(body + "\nassert f(1) == 2\n") == body
    assert truncate(body + "\n# tests\n") == body
    assert truncate("    # a comment inside the body\n" + body) == "    # a comment inside the body\n" + body
    for stop in STOP:
        assert truncate(body + stop + "rest") == body


class _CannedEngine:
    """A stand-in for the model: returns a fixed completion per prompt, plus trailing junk."""

    name, label, eos_token_ids, context_length = "canned", "canned", set(), 4096

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self.calls: list[dict] = []

    def generate(self, prompt: str, *, max_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int = 0, stop: list[str] | None = None) -> Generation:
        self.calls.append({"max_tokens": max_tokens, "temperature": temperature, "stop": stop})
        text = self.answers.get(prompt, "    return None\n") + "\n\ndef unrelated():\n    1 / 0\n"
        return Generation(text=text, token_ids=[], finish_reason="length")

    def generate_many(self, prompts: list[str], **kwargs: Any) -> list[Generation]:
        return [self.generate(p, **kwargs) for p in prompts]


def test_run_humaneval_canonical_scores_one(problems: list[dict]) -> None:
    engine = _CannedEngine({p["prompt"]: p["canonical_solution"] for p in problems})
    res = run_humaneval(engine, limit=3, max_tokens=64)
    assert res["pass_at_1"] == 1.0 and res["n"] == 3 and res["passed"] == 3
    assert list(res["problems"]) == [p["task_id"] for p in problems]
    for p in problems:
        row = res["problems"][p["task_id"]]
        assert row == {"passed": True, "result": "passed", "completion": row["completion"]}
        assert "unrelated" not in row["completion"]
    assert engine.calls == [{"max_tokens": 64, "temperature": 0.0, "stop": STOP}] * 3


def test_run_humaneval_garbage_scores_zero(problems: list[dict]) -> None:
    seen: list[str] = []

    def progress(items, description, total):  # console.progress's shape
        seen.append(description)
        assert total == 1  # one batch of 3 problems
        yield from items

    engine = _CannedEngine({p["prompt"]: "    return 'garbage'\n" for p in problems})
    res = run_humaneval(engine, limit=3, progress=progress)
    assert res["pass_at_1"] == 0.0 and res["passed"] == 0 and res["n"] == 3
    assert all(r["result"].startswith("failed:") for r in res["problems"].values())
    assert seen == ["humaneval"]


def test_limits_apply_to_the_child_only() -> None:
    import resource

    before = [resource.getrlimit(r) for r in (resource.RLIMIT_AS, resource.RLIMIT_CPU)]
    assert run_program("import resource\n"
                       "assert resource.getrlimit(resource.RLIMIT_AS)[0] == 300 * 1024**2\n",
                       memory_mb=300) == (True, "passed")
    assert [resource.getrlimit(r) for r in (resource.RLIMIT_AS, resource.RLIMIT_CPU)] == before
