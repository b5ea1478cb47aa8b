"""HumanEval: the real problems, checked in real sandboxed processes (the sandbox itself:
test_sandbox.py)."""

from __future__ import annotations

from typing import Any

import pytest

from quantkit.engines import Generation
from quantkit.validate.humaneval import (
    STOP,
    check_completion,
    load_problems,
    run_humaneval,
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


@pytest.mark.parametrize("sandbox", ["auto", "basic"])
def test_canonical_solutions_pass(problems: list[dict], sandbox: str) -> None:
    for p in problems:
        assert check_completion(p, p["canonical_solution"], sandbox=sandbox) == (True, "passed"), \
            p["task_id"]


def test_wrong_solution_fails(problems: list[dict]) -> None:
    passed, result = check_completion(problems[0], "    return False\n")
    assert not passed
    assert result.startswith("failed:") and "AssertionError" in result
    assert len(result) <= len("failed: ") + 200


def test_syntax_error_fails(problems: list[dict]) -> None:
    passed, result = check_completion(problems[0], "    return (\n")
    assert not passed and result.startswith("failed:") and "SyntaxError" in result


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
    assert res["sandbox"] in ("bwrap", "basic")


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
