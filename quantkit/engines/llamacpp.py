"""The llama.cpp engine (llama-cpp-python): GGUF artifacts and their F16 baselines."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, cast

from quantkit.engines.base import Generation, context_windows, loglikelihood_by_prefix
from quantkit.errors import EngineError


def probe() -> tuple[str, str] | None:
    """The in-process install probe (EngineSpec.probe): llama-cpp-python importable here."""
    from importlib.util import find_spec

    if find_spec("llama_cpp") is None:
        return ("--engine llama.cpp needs llama-cpp-python, which is not installed here",
                "pip install -e '.[gguf]'")
    return None


@functools.cache
def extra_buffers_unsafe() -> bool:
    """Whether llama.cpp's extra CPU buffer types (repacked and AMX weights) must stay off: on a
    CPU with AMX, llama-cpp-python 0.3.36 crashed the process (SIGSEGV) decoding Q4_K_M GGUFs,
    the demo's and tiny Mixtral/Qwen3-MoE ones, with them on; on AVX2 CPUs they worked."""
    try:
        return "amx_int8" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@contextmanager
def no_extra_buffers() -> Iterator[None]:
    """llama-cpp-python's models load with `use_extra_bufts` off inside this block: its `Llama`
    takes no argument for it, so the default parameters it starts from are changed."""
    import llama_cpp.llama_cpp as low

    default = low.llama_model_default_params

    def params() -> Any:
        p = default()
        p.use_extra_bufts = False
        return p

    low.llama_model_default_params = params
    try:
        yield
    finally:
        low.llama_model_default_params = default


def load_llama(path: Path, **kwargs: Any) -> Any:
    """`llama_cpp.Llama(model_path=path, **kwargs)`, without the extra buffer types where they
    crash (`extra_buffers_unsafe`)."""
    import llama_cpp

    with no_extra_buffers() if extra_buffers_unsafe() else nullcontext():
        return llama_cpp.Llama(model_path=str(path), **kwargs)


def _log_softmax(logits: Any) -> Any:
    import numpy as np

    top = logits.max(1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(1, keepdims=True))


class LlamaCppEngine:
    """A GGUF model in llama.cpp; every scoring call evaluates from a fresh context."""

    name = "llama.cpp"

    def __init__(self, path: Path, threads: int = 0, n_ctx: int = 2048) -> None:

        from quantkit.threads import compute_threads

        # both pools: llama-cpp-python sizes the batch (prompt, scoring) pool by every core
        # unless told, and its spinning threads are what a busy machine punishes
        n = compute_threads(threads)

        self.path = Path(path)
        self.label = self.path.name
        try:
            self.llm = load_llama(self.path, n_ctx=n_ctx, logits_all=True, n_threads=n,
                                  n_threads_batch=n, n_gpu_layers=-1, seed=0, verbose=False)
        except (ValueError, RuntimeError) as exc:
            raise EngineError(f"llama.cpp could not load {path}: {exc}",
                              "check the file, or re-run `quantkit quantize`") from exc
        self.context_length = n_ctx
        self.eos_token_ids = {int(self.llm.token_eos())}
        eot = self.llm.metadata.get("tokenizer.ggml.eot_token_id")
        if eot is not None:
            self.eos_token_ids.add(int(eot))
        self.prefix = self.llm.tokenize(b"", add_bos=True, special=False)

    def encode(self, text: str) -> list[int]:
        # special=True: chat-template markers are tokens, as transformers tokenizers parse them
        return list(self.llm.tokenize(text.encode(), add_bos=False, special=True))

    def decode(self, ids: list[int]) -> str:
        return self.llm.detokenize(ids).decode("utf-8", errors="replace")

    def chat_prompt(self, user: str, **kwargs: Any) -> str:
        template = self.llm.metadata.get("tokenizer.chat_template")
        if not template:
            return user
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        return env.from_string(template).render(
            messages=[{"role": "user", "content": user}], add_generation_prompt=True,
            bos_token="", eos_token="", **kwargs)

    def _logprobs(self, seq: list[int], rows: range) -> Any:
        """Log-softmax of the predictions at positions `rows` of `seq`, evaluated from an empty
        context. A few rows (MMLU's one per question): only those positions get logits, which
        `Llama.eval` computes and copies for every position (measured: 1.28 s against 1.56 s for
        600 tokens of the demo's Q4_K_M on 2 cores)."""
        import numpy as np

        llm, n_vocab = self.llm, self.llm.n_vocab()
        llm.reset()
        if 2 * len(rows) > len(seq):  # most rows: llama-cpp-python's own copy of them is faster
            llm.eval(seq)
            return _log_softmax(np.asarray(llm.scores[rows.start:rows.stop], dtype=np.float64))
        llm._ctx.kv_cache_seq_rm(-1, 0, -1)
        batch, out = llm._batch, []
        for start in range(0, len(seq), llm.n_batch):
            chunk = seq[start:start + llm.n_batch]
            raw, wanted = batch.batch, 0
            raw.n_tokens = len(chunk)
            for k, token in enumerate(chunk):
                raw.token[k], raw.pos[k], raw.n_seq_id[k] = token, start + k, 1
                raw.seq_id[k][0] = 0
                raw.logits[k] = rows.start <= start + k < rows.stop
                wanted += raw.logits[k]
            llm._ctx.decode(batch)
            if wanted:  # llama.cpp lays out the asked rows one after another, in batch order
                out.append(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(wanted, n_vocab))
                           .astype(np.float64))
        return _log_softmax(np.concatenate(out))

    def loglikelihood(self, requests: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        return loglikelihood_by_prefix(requests, self.prefix, self.context_length,
                                       lambda seqs, rows: [self._logprobs(s, r)
                                                           for s, r in zip(seqs, rows)])

    def _windows(self, ids: list[int]) -> list[tuple[list[int], Any]]:
        """(window, its log-softmax rows) over prefix + ids, overlapping by one token."""
        return [(w, self._logprobs(w, range(0, len(w) - 1)))
                for w in context_windows(self.prefix + list(ids), self.context_length)]

    def token_nlls(self, ids: list[int]) -> list[float]:
        nlls: list[float] = []
        for w, lp in self._windows(ids):
            nlls += [-float(lp[j, t]) for j, t in enumerate(w[1:])]
        return nlls[len(self.prefix):]

    def token_logprob_rows(self, ids: list[int]) -> list[Any]:
        rows = [lp.astype("float32") for _, lp in self._windows(ids)]
        return [rows[0][len(self.prefix):]] + rows[1:] if rows else []

    def generate(self, prompt: str, *, max_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int = 0, stop: list[str] | None = None) -> Generation:
        ids = self.prefix + list(self.llm.tokenize(prompt.encode(), add_bos=False, special=True))
        ids = ids[-max(self.context_length - max_tokens, 1):]
        self.llm.reset()
        self.llm.set_seed(seed)
        # llama-cpp-python's defaults add top_k 40, min_p 0.05 and a repeat penalty of 1.1; the
        # check measures the model itself, so only temperature and top_p shape the sampling
        res = self.llm.create_completion(ids, max_tokens=max_tokens, temperature=temperature,
                                         top_p=top_p if temperature > 0 else 1.0, top_k=0,
                                         min_p=0.0, repeat_penalty=1.0, seed=seed, stop=stop)
        choice = cast(Any, res)["choices"][0]
        text = choice["text"]
        # llama-cpp-python says "stop" for both EOS and a stop string; without stop strings it
        # can only be EOS
        reason = "length" if choice["finish_reason"] == "length" else ("stop" if stop else "eos")
        return Generation(text, self.encode(text), reason)

    def generate_many(self, prompts: list[str], *, max_tokens: int, temperature: float = 0.0,
                      top_p: float = 1.0, seed: int = 0,
                      stop: list[str] | None = None) -> list[Generation]:
        return [self.generate(p, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                              seed=seed + i, stop=stop) for i, p in enumerate(prompts)]

    def close(self) -> None:
        self.llm.close()
