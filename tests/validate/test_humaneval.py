"""HumanEval: the real problems, checked in real sandboxed processes (the sandbox itself:
test_sandbox.py)."""

from __future__ import annotations

from typing import Any

import pytest

from quantkit.engines import Generation
from quantkit.validate.humaneval import (
    ANSWER_START,
    CHAT_STOP,
    STOP,
    build_prompt,
    check_completion,
    extract_code,
    is_chat,
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
    res = run_humaneval(engine, limit=3, max_tokens=64, sandbox="auto")
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
    res = run_humaneval(engine, limit=3, max_tokens=384, sandbox="auto", progress=progress)
    assert res["pass_at_1"] == 0.0 and res["passed"] == 0 and res["n"] == 3
    assert all(r["result"].startswith("failed:") for r in res["problems"].values())
    assert seen == ["humaneval"]


# What SmolLM2-135M-Instruct answers when asked for HumanEval/2 in a chat turn (its own answer's
# shape: a fenced block, then prose), with the block's code made right so that it can pass.
INSTRUCT_ANSWER = ("```python\ndef truncate_number(number: float) -> float:\n"
                   "    return number % 1.0\n```\n\nThis function uses the `%` operator to "
                   "return the decimal part of the number.")


def test_instruct_answer_gives_its_code_not_an_empty_program(problems: list[dict]) -> None:
    """The demo's fault: the Codex stop strings cut an instruct answer at its first "\\ndef ",
    leaving a bare "```python" (or nothing) as the program, so every problem failed."""
    p = problems[2]
    assert truncate(INSTRUCT_ANSWER).strip() == "```python"  # what was run before
    code = extract_code(p, INSTRUCT_ANSWER)
    assert code == "\ndef truncate_number(number: float) -> float:\n    return number % 1.0\n"
    assert check_completion(p, code) == (True, "passed")
    # the same answer when the fence was opened in the prompt: generation stops at the closing one
    opened = truncate(INSTRUCT_ANSWER[len(ANSWER_START):], CHAT_STOP)
    assert extract_code(p, opened) == code


def test_instruct_answer_with_imports_and_a_helper_passes(problems: list[dict]) -> None:
    p = problems[0]
    answer = ("from typing import List\n\n\ndef close(a: float, b: float, t: float) -> bool:\n"
              "    return abs(a - b) < t\n\n\n"
              "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
              "    return any(close(a, b, threshold) for i, a in enumerate(numbers)\n"
              "               for b in numbers[i + 1:])\n\n\n"
              "print(has_close_elements([1.0, 2.0], 0.5))\n")
    code = extract_code(p, truncate(answer, CHAT_STOP))
    assert "def close" in code and "print(" not in code
    assert check_completion(p, code) == (True, "passed")


def test_a_body_continuation_is_read_as_before(problems: list[dict]) -> None:
    p = problems[0]
    body = "    return False\n"
    assert extract_code(p, body + "\n\ndef unrelated():\n    1 / 0\n") == body + "\n"
    assert extract_code(p, p["canonical_solution"]) == p["canonical_solution"]


@pytest.mark.slow
def test_demo_model_completions_are_checked_and_scored(demo_model) -> None:
    """The real demo model (an instruct model) on three problems, through the chat template:
    each greedy answer is extracted, run in the sandbox and scored, and the record says what the
    sandbox says of it. No assertion reads the greedy text itself: it moves with the CPU's
    numerics (an AMD EPYC without AMX wrote `1.0f` where an Intel AMX machine wrote `1.0`)."""
    from quantkit.engines.hf import TransformersEngine

    engine = TransformersEngine(demo_model, threads=1)
    try:
        assert is_chat(engine)
        prompt = build_prompt(engine, load_problems(1)[0], chat=True)
        assert prompt.endswith(ANSWER_START) and "<|im_start|>assistant" in prompt
        res = run_humaneval(engine, limit=3, max_tokens=96, sandbox="auto")
    finally:
        engine.close()
    assert res["prompt"] == "chat" and res["n"] == 3
    problems = load_problems(3)
    assert list(res["problems"]) == [p["task_id"] for p in problems]
    for p in problems:
        rec = res["problems"][p["task_id"]]
        assert isinstance(rec["completion"], str) and rec["completion"].strip()
        assert isinstance(rec["result"], str)
        # the recorded verdict is the sandbox's for the recorded program
        assert rec["passed"] == check_completion(p, rec["completion"], sandbox=res["sandbox"])[0]
    assert res["passed"] == sum(r["passed"] for r in res["problems"].values())
    assert res["pass_at_1"] == res["passed"] / 3
