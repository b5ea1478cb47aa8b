"""The sampling check on real strings and on two test-double engines."""

from __future__ import annotations

import random
from typing import Any

import pytest

from quantkit.engines import Generation
from quantkit.errors import BadInput
from quantkit.validate.sampling import (
    BUILTIN_PROMPTS,
    flags,
    generate_outputs,
    longest_loop,
    sample_check,
    score_outputs,
    summarize,
    text_metrics,
)

PROSE = (
    "The lighthouse stood at the edge of the cliff, its white paint peeling after decades of "
    "salt and wind. Every evening the keeper climbed the spiral stairs, trimmed the wick and "
    "watched the beam sweep across the dark water. Ships rarely passed anymore, but he kept the "
    "routine anyway, partly out of duty and partly because the quiet rhythm of the work helped "
    "him think. One night, as fog rolled in from the south, he noticed a small boat drifting "
    "without lights toward the rocks below."
)
VOCAB: dict[str, int] = {}


def ids(text: str) -> list[int]:
    """Word-level token ids from one shared vocabulary (1-based; 0 is EOS)."""
    return [VOCAB.setdefault(w, len(VOCAB) + 1) for w in text.split()]


def metrics(text: str, finish_reason: str = "eos") -> dict[str, Any]:
    return text_metrics(text, ids(text), finish_reason)


def test_looping_text_is_flagged_with_its_loop_length() -> None:
    text = "Well, " + "I am not sure. " * 20 + "OK"
    m = metrics(text, "length")
    assert m["longest_loop"] == 80  # 20 copies of a 4-token block
    assert m["repeated_ngram_rate"] > 0.9
    assert not m["stopped"]
    assert "repetition" in flags(m)


def test_longest_loop_definition() -> None:
    assert longest_loop(ids("a b c a b c a b c")) == 9
    assert longest_loop(ids("a b c a b c")) == 0  # two copies are not a loop
    assert longest_loop(ids("x a a a y")) == 3
    assert longest_loop(ids("a b c a b c a b c a b")) == 11  # a partial copy still counts
    assert longest_loop([]) == 0
    long_block = list(range(100, 160))  # a 60-token block, three times
    assert longest_loop([1] + long_block * 3 + [2]) == 180


def test_normal_prose_is_not_flagged() -> None:
    m = metrics(PROSE)
    assert m["words"] > 32 and m["length_tokens"] == m["words"]
    assert m["repeated_ngram_rate"] == 0.0
    assert m["longest_loop"] == 0
    assert m["distinct_2"] > 0.95
    assert m["script_mixing"] == 1 and m["mixed_script_words"] == 0
    assert m["replacement_chars"] == 0 and m["control_chars"] == 0
    assert m["stopped"]
    assert flags(m, baseline_nll=2.1) == []


def test_distinct_n_known_values() -> None:
    m = metrics("a b a b a b")
    assert m["distinct_2"] == pytest.approx(2 / 5)
    assert m["distinct_3"] == pytest.approx(2 / 4)
    assert metrics("one")["distinct_2"] == 1.0  # no bigrams: nothing repeated
    m = metrics("a b " * 20)
    assert m["distinct_2"] < 0.3 and "low_diversity" in flags(m)


@pytest.mark.parametrize("text", [
    "The answer is \ufffd\ufffd probably",
    "The quick br\u043ewn fox jumps",  # a Cyrillic o inside an English word
    "hello \u043f\u0440\u0438\u0432\u0435\u0442 \u03b3\u03b5\u03b9\u03ac",  # three scripts
    "a\x00b\x01c\x02d",
])
def test_garbled_text(text: str) -> None:
    assert "garbled" in flags(metrics(text))


def test_garbled_details() -> None:
    m = metrics("The quick br\u043ewn fox")
    assert m["mixed_script_words"] == 1 and m["script_mixing"] == 2
    assert metrics("x \ufffd y \ufffd")["replacement_chars"] == 2
    assert metrics("a\x00b\x1bc\x85 d\n\te\r")["control_chars"] == 3


@pytest.mark.parametrize("text", [
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043a\u0430\u043a \u0434\u0435\u043b\u0430?",
    "The area is \u03c0r\u00b2 for radius r, in \u00b5m\u00b2.",  # Greek in formulas, micro sign
    "In Japanese, hello is \u3053\u3093\u306b\u3061\u306f.",
    "line one\nline\ttwo\r\n",
])
def test_legitimate_text_is_not_garbled(text: str) -> None:
    assert "garbled" not in flags(metrics(text))


def test_implausible_needs_a_high_baseline_nll() -> None:
    m = metrics(PROSE)
    assert flags(m, baseline_nll=7.0) == ["implausible"]
    assert flags(m, baseline_nll=5.0) == []
    assert flags(m, baseline_nll=None) == []


def test_builtin_prompts() -> None:
    assert len(BUILTIN_PROMPTS) == 64 == len(set(BUILTIN_PROMPTS))
    assert all(0 < len(p) < 200 for p in BUILTIN_PROMPTS)


SENTENCES = [s.strip() + "." for s in PROSE.split(".") if s.strip()]


class FakeEngine:
    """Deterministic in the seed: a few prose sentences; records every call."""

    name = "fake"
    context_length = 4096

    def __init__(self, label: str) -> None:
        self.label = label
        self.eos_token_ids = {0}
        self.calls: list[dict[str, Any]] = []
        self.scored: list[list[int]] = []

    def encode(self, text: str) -> list[int]:
        return ids(text)

    def decode(self, token_ids: list[int]) -> str:
        words = {v: k for k, v in VOCAB.items()}
        return " ".join(words[i] for i in token_ids)

    def chat_prompt(self, user: str) -> str:
        return f"USER: {user} ASSISTANT:"

    def text(self, seed: int) -> str:
        return " ".join(random.Random(seed).sample(SENTENCES, 3))

    def generate(self, prompt: str, *, max_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int = 0, stop: list[str] | None = None) -> Generation:
        self.calls.append({"prompt": prompt, "seed": seed, "max_tokens": max_tokens,
                           "temperature": temperature, "top_p": top_p, "stop": stop})
        token_ids = ids(self.text(seed))[:max_tokens]
        reason = "length" if len(token_ids) == max_tokens else "eos"
        return Generation(self.decode(token_ids), token_ids, reason)

    def generate_many(self, prompts: list[str], *, max_tokens: int, temperature: float = 0.0,
                      top_p: float = 1.0, seed: int = 0,
                      stop: list[str] | None = None) -> list[Generation]:
        return [self.generate(p, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                              seed=seed + i, stop=stop) for i, p in enumerate(prompts)]

    def token_nlls(self, token_ids: list[int]) -> list[float]:
        # the NLL of ids[k] is k / 1000: a mean over positions tells which positions were used
        self.scored.append(list(token_ids))
        return [k / 1000 for k in range(1, len(token_ids))]

    def loglikelihood(self, requests: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class LoopingEngine(FakeEngine):
    """Falls into a loop on even seeds."""

    def text(self, seed: int) -> str:
        if seed % 2 == 0:
            return "I think the answer is " + "that it depends on the context. " * 30
        return super().text(seed)


def test_sample_check_flags_the_looping_model() -> None:
    quantized, baseline = LoopingEngine("q"), FakeEngine("b")
    prompts = ["What is a lighthouse?", "Tell a story.", "Why is the sea salty?"]
    res = sample_check(quantized, baseline, prompts, n=20, temperature=0.7, top_p=0.8,
                       max_tokens=100, seed=10).to_dict()
    assert res["settings"] == {"n": 20, "temperature": 0.7, "top_p": 0.8, "max_tokens": 100,
                               "seed": 10, "prompts": 3}
    assert res["quantized"]["flagged"] == 10 and res["baseline"]["flagged"] == 0
    m = res["flagged_increase"]
    assert m["value"] == pytest.approx(0.5) and m["n"] == 20
    assert 0 < m["lo"] <= 0.5 <= m["hi"]
    assert res["quantized"]["flag_counts"]["repetition"] == 10
    assert res["quantized"]["eos_share"] == 0.5 and res["baseline"]["eos_share"] == 1.0
    # both models, across two chunks: prompt i % len, through the chat template, seed + i, the same settings
    for engine in (quantized, baseline):
        assert [c["seed"] for c in engine.calls] == list(range(10, 30))
        assert [c["prompt"] for c in engine.calls] == [
            f"USER: {prompts[i % 3]} ASSISTANT:" for i in range(20)]
        assert all((c["temperature"], c["top_p"], c["max_tokens"], c["stop"]) == (0.7, 0.8, 100,
                                                                                   None)
                   for c in engine.calls)
    looped = res["quantized"]["outputs"][0]
    assert looped["flags"] == ["repetition", "low_diversity"]
    assert looped["finish_reason"] == "length" and looped["metrics"]["longest_loop"] >= 48
    assert {"i", "seed", "prompt", "text", "finish_reason", "metrics", "baseline_nll",
            "flags"} <= looped.keys()
    assert "token_ids" not in looped


def test_baseline_scores_only_the_output_positions() -> None:
    quantized, baseline = LoopingEngine("q"), FakeEngine("b")
    prompts = ["What is a lighthouse?"]
    res = sample_check(quantized, baseline, prompts, n=4, temperature=0.9, top_p=0.9,
                       max_tokens=50, seed=0).to_dict()
    assert quantized.scored == []  # the baseline scores every output, the quantized ones too
    prompt_ids = ids(baseline.chat_prompt(prompts[0]))
    p = len(prompt_ids)
    outputs = res["baseline"]["outputs"] + res["quantized"]["outputs"]  # the baseline samples first
    assert len(baseline.scored) == len(outputs)
    for o, scored in zip(outputs, baseline.scored):
        n_out = o["metrics"]["length_tokens"]
        assert scored == prompt_ids + ids(o["text"])
        # output tokens sit at positions p .. p + n_out - 1 and cost k / 1000 each
        assert o["baseline_nll"] == pytest.approx((p + (n_out - 1) / 2) / 1000)
    means = res["baseline"]["means"]
    assert means["baseline_nll"] == pytest.approx(
        sum(o["baseline_nll"] for o in res["baseline"]["outputs"]) / 4)


def test_building_blocks_and_progress() -> None:
    engine = FakeEngine("b")
    seen: list[tuple[str, int | None]] = []

    def progress(items: Any, description: str, total: int | None = None) -> Any:
        seen.append((description, total))
        return items

    outputs = generate_outputs(engine, ["hi"], n=40, temperature=0.9, top_p=0.9, max_tokens=256,
                               seed=5, progress=progress)
    assert seen == [("sampling b", 3)]  # chunks of GEN_CHUNK = 16
    assert [o["seed"] for o in outputs] == list(range(5, 45))
    assert [c["seed"] for c in engine.calls] == list(range(5, 45))
    summary = summarize(score_outputs(outputs, engine))
    assert summary["n"] == 40 and summary["flagged_share"] == 0.0
    assert summary["means"]["distinct_2"] > 0.9


def test_bad_input() -> None:
    with pytest.raises(BadInput):
        generate_outputs(FakeEngine("b"), [], n=4, temperature=0.9, top_p=0.9, max_tokens=16,
                         seed=0)
    with pytest.raises(BadInput):
        generate_outputs(FakeEngine("b"), ["hi"], n=0, temperature=0.9, top_p=0.9, max_tokens=16,
                         seed=0)
