"""The vLLM engine, in process (`vllm.LLM`): validation on the engine that serves GPTQ/AWQ
artifacts in production. Loglikelihoods come from prompt logprobs, sampling is seeded per request.
Needs a GPU and vLLM (the `vllm` extra); never imported on CPU machines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantkit import console
from quantkit.engines.base import (
    GenerateViaMany,
    Generation,
    HFTokenizerText,
    context_windows,
)
from quantkit.errors import BadInput, EngineError

# the GPU share of each of validation's two engines (baseline and quantized, loaded together):
# 0.45 each left 8 GiB of an H100 between them, and the 8B shape's quantized engine grew 5.5 GiB
# past its share while scoring MMLU; the baseline's prefill then ran out of memory (2026-12-06)
VALIDATE_SHARE = 0.40
# what each engine holds beyond its share (gpu_memory_utilization): the 8B shape's two engines
# held 71.0 GiB on an H100 (compiled starts) and 73.5 GiB (`graphs` starts, scoring MMLU), 7.3
# and 10.2 GiB over their two 31.7 GiB shares (CUDA contexts, graphs, the sampler's
# log-probability buffers; docs/BENCHMARKS.md, third and fourth runs). vLLM starts the second
# engine only where its whole share is free, so both shares and both overheads must fit.
ENGINE_OUTSIDE = 5.5 * 1024**3


def validate_share(total_bytes: float) -> float:
    """Each of validation's two engines' share of a GPU of `total_bytes`: VALIDATE_SHARE where
    both, with what each holds beyond its share, fit (55 GiB or more), else what does fit
    (0.37 of a 48 GB card; 0 where not even the overheads fit)."""
    return max(0.0, min(VALIDATE_SHARE, (total_bytes - 2 * ENGINE_OUTSIDE) / (2 * total_bytes)))


# How a validation engine starts (vLLM 0.26's own options). Validation runs one batch of each
# task on a freshly started engine, so a start's cost is paid once for a few minutes of work:
# the 8B recipe's two compiled starts took 192 s of its 309 s validation (docs/BENCHMARKS.md,
# third run). Side by side on one H100 (bench/h200/vllm_start.py, the 8B shape, 2026-12-07):
# ready in 43.0 s compiled, 9.6 s with `graphs`, 6.5 s eager; HumanEval's shape 4.8, 4.9 and
# 6.3 s, MMLU's 3.5, 3.6 and 3.4 s; `graphs` scores as `compiled` does to 2e-6 in a top
# log-probability. $QUANTKIT_VLLM_START picks another.
START_MODES: dict[str, dict[str, Any]] = {
    "compiled": {},  # vLLM's default: torch.compile, piecewise CUDA graphs up to 512 sequences
    # no torch.compile; whole-step CUDA graphs for decode steps only (HumanEval, sampling)
    "graphs": {"compilation_config": {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}},
    "eager": {"enforce_eager": True},  # neither
}
START_DEFAULT = "graphs"


def start_mode() -> str:
    """The validation engine's start ($QUANTKIT_VLLM_START, else START_DEFAULT)."""
    import os

    mode = os.environ.get("QUANTKIT_VLLM_START", "") or START_DEFAULT
    if mode not in START_MODES:
        raise BadInput(f"QUANTKIT_VLLM_START={mode} is not one of {', '.join(START_MODES)}",
                       f"unset it (vLLM's {START_DEFAULT} start), or set one of those")
    return mode


def vllm_available() -> str | None:
    """vLLM's version when it can be imported here (it needs a GPU to run), else None."""
    from importlib import metadata

    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def probe() -> tuple[str, str] | None:
    """The in-process install probe (EngineSpec.probe): vLLM importable in this Python."""
    if vllm_available() is None:
        return ("--engine vllm needs an NVIDIA GPU and vLLM in this Python environment "
                "(vLLM is not installed)",
                "pip install -e '.[vllm]' on a GPU machine, or use --engine transformers")
    return None


def logs_to_stderr() -> None:
    """vLLM logs to stdout unless told otherwise, and quantkit's stdout carries `--json`
    results: send its logs (this process's, and its engine-core process's) to stderr."""
    import logging
    import os
    import sys

    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # read when vLLM is imported
    if os.environ["VLLM_LOGGING_STREAM"] == "ext://sys.stderr":  # and if it was imported already:
        for handler in logging.getLogger("vllm").handlers:
            if type(handler) is logging.StreamHandler:  # setStream leaves one on stderr as it is
                try:
                    handler.setStream(sys.stderr)
                except ValueError:  # the old stream is closed (an earlier caller's captured
                    handler.stream = sys.stderr  # stderr): nothing left to flush into it


class VllmEngine(HFTokenizerText, GenerateViaMany):
    """A checkpoint loaded by vLLM's offline engine (`vllm.LLM`)."""

    name = "vllm"
    # prompts a generate_many or loglikelihood call should carry: vLLM schedules them itself,
    # and a batch of HumanEval's 164 costs about what one prompt does (chunks of 8 cost 21 times
    # that); MMLU's 14,042 questions go in 14 calls
    batch_prompts = 1024

    def __init__(self, path: Path, threads: int = 0, max_context: int = 2048,
                 gpu_memory_utilization: float | None = None) -> None:
        from quantkit.gpu import gpu_present

        if vllm_available() is None or not gpu_present():
            raise BadInput("--engine vllm needs vLLM and an NVIDIA GPU on this machine",
                           "install the vllm extra on a GPU machine, or use --engine transformers")
        logs_to_stderr()
        from vllm import LLM

        self.path = Path(path)
        self.label = self.path.name
        self.start = start_mode()
        if gpu_memory_utilization is None:  # the share two engines side by side leave each
            import torch

            total = torch.cuda.get_device_properties(0).total_memory
            gpu_memory_utilization = round(validate_share(total), 3)
        console.log(f"vLLM start: {self.start} (QUANTKIT_VLLM_START: {', '.join(START_MODES)})")
        try:  # two engines (baseline, quantized) may share one GPU: each takes under half
            from quantkit.artifact import kv_scheme

            # calibrated k/v scales in the checkpoint: served, so scored, with the FP8 KV cache
            self.kv_cache = "fp8" if kv_scheme(Path(path)) else "auto"
            self.llm = LLM(model=str(path), max_model_len=max_context, seed=0,
                           gpu_memory_utilization=gpu_memory_utilization,
                           enable_prefix_caching=True, max_logprobs=-1,
                           kv_cache_dtype=self.kv_cache, **START_MODES[self.start])
        except Exception as exc:  # vLLM raises many types while loading; all mean "cannot load"
            raise EngineError(f"vLLM could not load {path}: {type(exc).__name__}: "
                              f"{str(exc)[:300]}", "check the checkpoint against vLLM's "
                              "compressed-tensors version (quantkit serve checks it)") from exc
        self.tok = self.llm.get_tokenizer()
        self.context_length = int(self.llm.llm_engine.model_config.max_model_len)
        self.vocab_size = int(self.llm.llm_engine.model_config.get_vocab_size())
        eos = {self.tok.eos_token_id}
        gen = getattr(self.llm.llm_engine, "generation_config_fields", None) or {}
        extra = gen.get("eos_token_id") if isinstance(gen, dict) else None
        eos |= set(extra if isinstance(extra, list) else [extra] if extra is not None else [])
        self.eos_token_ids = {int(e) for e in eos if e is not None}
        bos = self.tok.bos_token_id
        self.prefix = [bos] if bos is not None and self.tok("x")["input_ids"][:1] == [bos] else []
        from importlib import metadata

        self.version = metadata.version("vllm")

    def _prompt_logprobs(self, seqs: list[list[int]]) -> list[list[dict[int, Any] | None]]:
        """Per sequence, per position: {token id: Logprob(logprob, rank)} of the prompt token
        there (and vLLM's top-1); position 0 has none."""
        from vllm import SamplingParams

        if not seqs:
            return []
        params = SamplingParams(max_tokens=1, prompt_logprobs=1, temperature=0.0)
        outs = self.llm.generate([{"prompt_token_ids": s} for s in seqs], params, use_tqdm=False)
        return [list(o.prompt_logprobs) for o in outs]

    def loglikelihood(self, requests: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        # vLLM asks room for one output token beyond the prompt: windows of max_model_len - 1
        seqs = [(self.prefix + ctx + cont)[-(self.context_length - 1):] for ctx, cont in requests]
        results: list[tuple[float, bool]] = [(0.0, False)] * len(seqs)
        single = [i for i, (_, cont) in enumerate(requests) if len(cont) == 1]
        for i, res in zip(single, self._next_token_scores([seqs[i] for i in single])):
            results[i] = res
        rest = [i for i, (_, cont) in enumerate(requests) if len(cont) != 1]
        for i, lps in zip(rest, self._prompt_logprobs([seqs[i] for i in rest])):
            seq, cont = seqs[i], requests[i][1]
            tail = list(zip(seq[-len(cont):], lps[-len(cont):]))
            results[i] = (sum(float(lp[t].logprob) for t, lp in tail if lp),
                          all(lp is not None and lp[t].rank == 1 for t, lp in tail))
        return results

    def _next_token_scores(self, seqs: list[list[int]]) -> list[tuple[float, bool]]:
        """(log-probability, is-greedy) of each sequence's last token given the tokens before it
        (MMLU's single-token answers). One request per distinct context, which asks the
        log-probabilities of exactly its candidate tokens at the next position
        (`logprob_token_ids`): no prompt logprobs, so vLLM's prefix cache serves the shared
        few-shot prefix, and four answers cost one forward of the question."""
        from vllm.sampling_params import MAX_LOGPROB_TOKEN_IDS, SamplingParams

        if not seqs:
            return []
        by_context: dict[tuple[int, ...], list[int]] = {}
        for i, seq in enumerate(seqs):
            by_context.setdefault(tuple(seq[:-1]), []).append(i)
        prompts, asked = [], []
        for ctx, members in by_context.items():
            tokens = sorted({seqs[i][-1] for i in members})
            for s in range(0, len(tokens), MAX_LOGPROB_TOKEN_IDS):
                prompts.append(list(ctx))
                asked.append(tokens[s:s + MAX_LOGPROB_TOKEN_IDS])
        params = [SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=ids,
                                 detokenize=False) for ids in asked]
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                 use_tqdm=False)
        scores: dict[tuple[tuple[int, ...], int], tuple[float, bool]] = {}
        for prompt, ids, o in zip(prompts, asked, outs):
            c = o.outputs[0]
            greedy, lps = c.token_ids[0], c.logprobs[0]
            for t in ids:
                scores[(tuple(prompt), t)] = (float(lps[t].logprob), t == greedy)
        return [scores[(tuple(seq[:-1]), seq[-1])] for seq in seqs]

    def token_nlls(self, ids: list[int]) -> list[float]:
        ids = self.prefix + list(ids)
        windows = context_windows(ids, self.context_length - 1)
        nlls: list[float] = []
        for w, lps in zip(windows, self._prompt_logprobs(windows)):
            nlls += [-float(lp[t].logprob) for t, lp in zip(w[1:], lps[1:]) if lp]
        return nlls[len(self.prefix):]

    def generate_many(self, prompts: list[str], *, max_tokens: int, temperature: float = 0.0,
                      top_p: float = 1.0, seed: int = 0,
                      stop: list[str] | None = None) -> list[Generation]:
        from vllm import SamplingParams

        # one seed per request (seed + i), so a request's output does not depend on its batch;
        # top_k off: only temperature and top_p shape sampling, as in the other engines
        params = [SamplingParams(max_tokens=max_tokens, temperature=temperature,
                                 top_p=top_p if temperature > 0 else 1.0, top_k=0,
                                 seed=seed + i, stop=stop or None, repetition_penalty=1.0)
                  for i in range(len(prompts))]
        batch = [{"prompt_token_ids": (self.prefix + self.encode(p))[
            -max(self.context_length - max_tokens, 1):]} for p in prompts]
        outs = self.llm.generate(batch, params, use_tqdm=False)
        results = []
        for o in outs:
            c = o.outputs[0]
            ids = [t for t in c.token_ids if t not in self.eos_token_ids]
            if c.finish_reason == "length":
                reason = "length"
            elif isinstance(c.stop_reason, str):
                reason = "stop"
            else:
                reason = "eos"
            results.append(Generation(self.decode(ids), ids, reason))
        return results

    def token_logprob_top(self, ids: list[int], k: int) -> tuple[Any, Any]:
        """Each position's k most likely next tokens (ids and log-probabilities, numpy
        [positions, k], best first), in token_nlls' windows: row j predicts ids[j + 1]. vLLM's
        prompt logprobs give no whole rows (validate/kld asks again with a larger k)."""
        import numpy as np
        from vllm import SamplingParams

        windows = context_windows(self.prefix + list(ids), self.context_length - 1)
        # flat: a few lists per request instead of a Logprob object per entry; no token text
        params = SamplingParams(max_tokens=1, prompt_logprobs=k, temperature=0.0,
                                flat_logprobs=True, detokenize=False)
        outs = self.llm.generate([{"prompt_token_ids": w} for w in windows], params,
                                 use_tqdm=False)
        tops, lps = [], []
        for o in outs:
            flat = o.prompt_logprobs  # position 0 holds nothing; then the prompt token, top k
            starts = np.asarray(flat.start_indices[1:])
            if not (np.asarray(flat.end_indices[1:]) - starts == k + 1).all():
                raise EngineError(f"vLLM returned other than {k} prompt logprobs a position",
                                  "check the vLLM version (quantkit supports 0.26)")
            at = starts[:, None] + 1 + np.arange(k)
            tops.append(np.asarray(flat.token_ids, dtype=np.int64)[at])
            lps.append(np.asarray(flat.logprobs, dtype=np.float64)[at])
        if not tops:
            return np.zeros((0, k), dtype=np.int64), np.zeros((0, k))
        skip = len(self.prefix)
        return np.concatenate(tops)[skip:], np.concatenate(lps)[skip:]

    def token_logprob_rows(self, ids: list[int]) -> list[Any]:
        """Whole rows, as the other engines give them: the top k with k the whole vocabulary
        (exact; slow on a large vocabulary, where validate/kld asks token_logprob_top)."""
        import numpy as np

        top_ids, top_lp = self.token_logprob_top(ids, self.vocab_size)
        rows = np.empty(top_ids.shape, dtype=np.float32)
        np.put_along_axis(rows, top_ids, top_lp.astype(np.float32), 1)
        return [rows]

    def close(self) -> None:
        """Stop vLLM's engine-core process now, not when the garbage collector finds the last
        reference to it (until then it holds its GPU memory share: a server started next, as
        `auto --load` does, finds the GPU full)."""
        import gc

        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None:
            try:
                core.shutdown()
            except Exception as exc:  # noqa: BLE001 - vLLM's shutdown raises many types; the GPU
                console.warn(f"vLLM's engine did not shut down cleanly: {exc}")  # is freed below
        del self.llm
        gc.collect()
        try:
            import torch

            torch.cuda.empty_cache()
        except ImportError:
            pass
