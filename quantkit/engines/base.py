"""What every in-process engine adapter implements, and the engine-neutral scoring routines."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass
class Generation:
    """One sampled or greedy continuation."""

    text: str
    token_ids: list[int]
    finish_reason: str  # "eos" (the model stopped), "stop" (a stop string), "length" (hit max_tokens)


class Engine(Protocol):
    """What validation needs from a loaded model; implemented for transformers and llama.cpp."""

    name: str  # "transformers" or "llama.cpp"
    label: str  # a short name of the model for reports
    eos_token_ids: set[int]
    context_length: int

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without BOS/special tokens."""

    def decode(self, ids: list[int]) -> str:
        """Text of token ids, skipping special tokens."""

    def chat_prompt(self, user: str, **template: Any) -> str:
        """`user` as one chat turn through the model's chat template (plain text if it has none);
        `template`: the template's arguments (a thinking model's switch)."""

    def loglikelihood(self, requests: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """Per (context, continuation): summed log-probability of the continuation given the
        context, and whether greedy decoding would have produced exactly the continuation."""

    def token_nlls(self, ids: list[int]) -> list[float]:
        """Negative log-likelihood of ids[1:], each given the tokens before it (within the
        context length; longer inputs are scored in consecutive windows)."""

    def token_logprob_rows(self, ids: list[int]) -> list[Any]:
        """Log-softmax rows over the whole vocabulary (numpy float32 [positions, vocab]) of the
        predictions of ids[1:], in token_nlls' windows: row j of the concatenation predicts
        ids[j + 1]. (vLLM's prompt logprobs are top-k: it also has `token_logprob_top(ids, k)`,
        each position's k most likely tokens, which validate/kld asks instead.)"""

    def generate(self, prompt: str, *, max_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int = 0, stop: list[str] | None = None) -> Generation:
        """Continue `prompt` (already templated); temperature 0 is greedy."""

    def generate_many(self, prompts: list[str], *, max_tokens: int, temperature: float = 0.0,
                      top_p: float = 1.0, seed: int = 0,
                      stop: list[str] | None = None) -> list[Generation]:
        """`generate` for many prompts, batched where the engine gains from it. The seed is
        that of the whole call: the same prompts and seed give the same outputs."""

    def close(self) -> None:
        """Free the model."""


class EngineAdapter(Protocol):
    """An engine's in-process adapter (`EngineSpec.adapter`, a class, which engine_for calls):
    the model file or folder and the CPU threads (0: the machine's) -> the loaded model validation
    scores through."""

    def __call__(self, path: Path, /, *, threads: int) -> Engine: ...


def loglikelihood_by_prefix(requests: list[tuple[list[int], list[int]]], prefix: list[int],
                            context_length: int,
                            score: Callable[[list[list[int]], list[range]], list[Any]]
                            ) -> list[tuple[float, bool]]:
    """Engine-neutral loglikelihood: requests whose context + continuation[:-1] match share one
    evaluation (MMLU's four single-token answers after one prompt), and only the continuation's
    rows are scored. `score(seqs, rows)` returns per sequence the log-softmax of those rows."""
    fulls = [(prefix + ctx + cont)[-(context_length + 1):] for ctx, cont in requests]
    span: dict[tuple[int, ...], int] = {}
    for full, (_, cont) in zip(fulls, requests):
        span[tuple(full[:-1])] = max(span.get(tuple(full[:-1]), 0), len(cont))
    keys = list(span)
    logps = dict(zip(keys, score([list(k) for k in keys],
                                 [range(len(k) - span[k], len(k)) for k in keys])))
    results = []
    for full, (_, cont) in zip(fulls, requests):
        key = tuple(full[:-1])
        lp = logps[key][span[key] - len(cont):]  # the rows of this continuation's positions
        results.append((float(sum(float(lp[j, t]) for j, t in enumerate(cont))),
                        all(int(lp[j].argmax()) == t for j, t in enumerate(cont))))
    return results


def perplexity(windows: Iterable[Any], nll_of: Callable[[Any], tuple[float, int]]) -> float:
    """exp(mean next-token NLL) over token windows, each scored from a fresh context by
    `nll_of(window) -> (summed NLL, tokens scored)`: the one perplexity routine of quantkit."""
    import math

    nll, count = 0.0, 0
    for window in windows:
        s, n = nll_of(window)
        nll, count = nll + s, count + n
    return math.exp(nll / count)


def context_windows(ids: list[int], length: int) -> list[list[int]]:
    """Consecutive windows of at most `length` tokens overlapping by one, so every token after
    the first is scored once, given the tokens before it in its window."""
    windows = [ids[s:s + length] for s in range(0, max(len(ids) - 1, 1), length - 1)]
    return [w for w in windows if len(w) >= 2]


class HFTokenizerText:
    """`Engine.encode`, `encode_many`, `decode` and `chat_prompt` through a Hugging Face
    tokenizer held as `self.tok` (the transformers and vLLM engines)."""

    tok: Any

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        """`encode` of many texts in one call (the fast tokenizer batches them on every core)."""
        return [list(ids) for ids in self.tok(texts, add_special_tokens=False)["input_ids"]]

    def decode(self, ids: list[int]) -> str:
        return str(self.tok.decode(ids, skip_special_tokens=True))

    def tokenizer_fingerprint(self) -> str | None:
        """A digest of what turns text into ids here (a fast tokenizer's whole definition):
        engines with the same one encode every text alike, as a quantized model and its
        original do (the artifact carries the original's tokenizer files), so one's encoding
        serves the other. None where the tokenizer cannot say (a slow one)."""
        backend = getattr(self.tok, "backend_tokenizer", None)
        if backend is None:
            return None
        digest: str | None = getattr(self, "_tokenizer_digest", None)
        if digest is None:
            import hashlib

            text = f"{type(self.tok).__name__}\n{backend.to_str()}"
            digest = hashlib.sha256(text.encode()).hexdigest()
            self._tokenizer_digest = digest
        return digest

    def chat_prompt(self, user: str, **template: Any) -> str:
        if not getattr(self.tok, "chat_template", None):
            return user
        return str(self.tok.apply_chat_template([{"role": "user", "content": user}],
                                                tokenize=False, add_generation_prompt=True,
                                                **template))


class GenerateViaMany:
    """`Engine.generate` as one call of the engine's batched `generate_many`."""

    def generate_many(self, prompts: list[str], *, max_tokens: int, temperature: float = 0.0,
                      top_p: float = 1.0, seed: int = 0,
                      stop: list[str] | None = None) -> list[Generation]:
        raise NotImplementedError

    def generate(self, prompt: str, *, max_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int = 0, stop: list[str] | None = None) -> Generation:
        """One prompt through `generate_many`."""
        return self.generate_many([prompt], max_tokens=max_tokens, temperature=temperature,
                                  top_p=top_p, seed=seed, stop=stop)[0]
