"""The transformers engine: HF and compressed-tensors checkpoints, on CPU or GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantkit.engines.base import (
    GenerateViaMany,
    Generation,
    HFTokenizerText,
    context_windows,
    loglikelihood_by_prefix,
    perplexity,
)

BATCH_TOKENS = 4096  # padded tokens per scoring forward on CPU; larger batches spill the caches
GEN_BATCH = 16  # prompts generated together


def compute_dtype(path: Path, device: str = "auto") -> str:
    """The dtype this engine runs the model at `path` in: bfloat16 on a GPU; on the CPU, the
    CPU's match to the dtype its config names (threads.cpu_dtype). The engine registry's `dtype`:
    validation records it and keys its baseline cache by it."""
    from quantkit.models import config_dtype
    from quantkit.threads import cpu_dtype

    return "bfloat16" if _device(device) != "cpu" else cpu_dtype(config_dtype(path))


def _device(device: str) -> str:
    """`device`, with "auto" resolved: the GPU where torch sees one, else the CPU."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class TransformersEngine(HFTokenizerText, GenerateViaMany):
    """A causal LM loaded with transformers; scoring batches requests that share a prefix."""

    name = "transformers"

    def __init__(self, path: Path, threads: int = 0, device: str = "auto",
                 max_context: int = 2048) -> None:
        import torch

        from quantkit.models import load_model, load_tokenizer
        from quantkit.threads import use_torch_threads

        self.device = device = _device(device)
        self.threads = use_torch_threads(threads) if device == "cpu" else threads
        self.path = Path(path)
        self.label = self.path.name
        self.tok = load_tokenizer(self.path)
        self.dtype = compute_dtype(self.path, device)
        self.model = load_model(self.path, dtype=self.dtype, device=device)
        from quantkit.artifact import kv_scheme
        from quantkit.kvcache import emulate_fp8_kv

        # a checkpoint with calibrated k/v scales is served with vLLM's FP8 KV cache: score that
        self.kv_cache = "fp8" if kv_scheme(self.path) and emulate_fp8_kv(self.model,
                                                                          self.path) else "auto"
        cfg = self.model.config
        self.context_length = min(int(getattr(cfg, "max_position_embeddings", 2048)), max_context)
        eos = self.model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        self.eos_token_ids = {int(e) for e in eos + [self.tok.eos_token_id] if e is not None}
        with torch.no_grad():
            # compressed-tensors checkpoints decompress in a hook on the first full forward;
            # scoring calls the base model directly, so warm the whole model once here
            self.model(input_ids=torch.tensor([[min(self.eos_token_ids)]], device=device))
        bos = self.tok.bos_token_id
        self.prefix = [bos] if bos is not None and self.tok("x")["input_ids"][:1] == [bos] else []

    def _logprobs_at(self, seqs: list[list[int]], rows: list[list[int]]) -> list[Any]:
        """Log-softmax rows of the given positions of each sequence; right-padded batches."""
        import torch

        out: list[Any] = [None] * len(seqs)
        order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
        start = 0
        while start < len(order):
            width = len(seqs[order[start]])
            per = max(1, BATCH_TOKENS // width)
            group = order[start:start + per]
            start += per
            ids = torch.zeros(len(group), width, dtype=torch.long)
            mask = torch.zeros(len(group), width, dtype=torch.long)
            for j, i in enumerate(group):
                ids[j, :len(seqs[i])] = torch.tensor(seqs[i])
                mask[j, :len(seqs[i])] = 1
            with torch.no_grad():
                hidden = self.model.model(input_ids=ids.to(self.device),
                                          attention_mask=mask.to(self.device)).last_hidden_state
                for j, i in enumerate(group):
                    # only the rows we score go through the output head: the logits of every
                    # position would cost vocab x length floats
                    out[i] = torch.log_softmax(self._head(hidden[j, rows[i]]), -1).cpu()
        return out

    def _head(self, hidden: Any) -> Any:
        """The logits the model's own forward makes of final hidden states: the output head,
        then what some architectures apply after it (Gemma 2/3's soft-capping, Granite's
        scaling, Cohere's scale)."""
        import torch

        cfg = self.model.config
        logits = self.model.lm_head(hidden).float()
        if getattr(cfg, "final_logit_softcapping", None):
            cap = float(cfg.final_logit_softcapping)
            logits = torch.tanh(logits / cap) * cap
        if getattr(cfg, "logits_scaling", None):
            logits = logits / float(cfg.logits_scaling)
        if getattr(cfg, "logit_scale", None):
            logits = logits * float(cfg.logit_scale)
        return logits

    def loglikelihood(self, requests: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        return loglikelihood_by_prefix(requests, self.prefix, self.context_length,
                                       lambda seqs, rows: self._logprobs_at(
                                           seqs, [list(r) for r in rows]))

    def token_nlls(self, ids: list[int]) -> list[float]:
        ids = self.prefix + list(ids)
        skip = len(self.prefix)
        nlls: list[float] = []
        windows = context_windows(ids, self.context_length)
        logps = self._logprobs_at(windows, [list(range(len(w) - 1)) for w in windows])
        for w, lp in zip(windows, logps):
            nlls += [-float(lp[p, t]) for p, t in enumerate(w[1:])]
        return nlls[skip:]

    def token_logprob_rows(self, ids: list[int]) -> list[Any]:
        windows = context_windows(self.prefix + list(ids), self.context_length)
        rows = [lp.numpy().astype("float32") for lp in self._logprobs_at(
            windows, [list(range(len(w) - 1)) for w in windows])]
        return [rows[0][len(self.prefix):]] + rows[1:] if rows else []

    def generate_many(self, prompts: list[str], *, max_tokens: int, temperature: float = 0.0,
                      top_p: float = 1.0, seed: int = 0,
                      stop: list[str] | None = None) -> list[Generation]:
        # one left-padded batch per GEN_BATCH prompts: on CPU, generate() spends most of a step
        # in Python per layer, so a batch of 16 costs little more than one prompt
        import torch

        sample = temperature > 0
        kwargs: dict[str, Any] = {"do_sample": sample, "max_new_tokens": max_tokens,
                                  "pad_token_id": min(self.eos_token_ids)}
        if sample:  # top_k 0: only temperature and top_p shape the sampling, as in llama.cpp's
            kwargs.update(temperature=temperature, top_p=top_p, top_k=0)
        else:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        if stop:
            kwargs.update(stop_strings=stop, tokenizer=self.tok)
        results: list[Generation] = []
        for start in range(0, len(prompts), GEN_BATCH):
            batch = [(self.prefix + self.encode(p))[-max(self.context_length - max_tokens, 1):]
                     for p in prompts[start:start + GEN_BATCH]]
            width = max(map(len, batch))
            ids = torch.full((len(batch), width), min(self.eos_token_ids), dtype=torch.long)
            mask = torch.zeros_like(ids)
            for j, row in enumerate(batch):
                ids[j, width - len(row):] = torch.tensor(row)
                mask[j, width - len(row):] = 1
            torch.manual_seed(seed + start)
            with torch.no_grad():
                out = self.model.generate(ids.to(self.device), attention_mask=mask.to(self.device),
                                          **kwargs)
            for row in out[:, width:].tolist():
                results.append(self._finish(row, stop))
        return results

    def _finish(self, new: list[int], stop: list[str] | None) -> Generation:
        reason = "length"
        for k, t in enumerate(new):
            if t in self.eos_token_ids:  # the rest of the row is padding
                new, reason = new[:k], "eos"
                break
        text = self.decode(new)
        for s in stop or []:
            if s in text:
                text, reason = text[:text.index(s)], "stop"
        return Generation(text, new, reason)

    def close(self) -> None:
        del self.model


def token_windows(tok: Any, texts: list[str], length: int, limit: int) -> Any:
    """Concatenate texts (EOS between them) and cut `limit` windows of `length` tokens."""
    import torch

    ids: list[int] = []
    for text in texts:
        ids += tok(text)["input_ids"] + [tok.eos_token_id]
        if len(ids) >= length * limit:
            break
    usable = min(limit, len(ids) // length)
    return torch.tensor(ids[: usable * length]).view(usable, length)


def model_perplexity(model: Any, windows: Any, device: Any = "cpu") -> float:
    """Perplexity of a loaded transformers causal LM over token windows (one forward each)."""
    import torch

    def nll_of(row: Any) -> tuple[float, int]:
        ids = row[None].to(device)
        with torch.no_grad():
            logits = model(input_ids=ids).logits.float()
        nll = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:], reduction="sum")
        return float(nll), ids.shape[1] - 1

    return perplexity(windows, nll_of)
