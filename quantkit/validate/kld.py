"""KL divergence and top-1 agreement of the quantized model against the original, per token.

For every position of every domain text line, KL(original || quantized) of the next-token
distributions and whether both models rank the same token first. The original's side is kept as
its TOP_K most likely tokens per position (what the baseline cache stores) plus one bucket for the
rest of the vocabulary; the quantized side is its mass on exactly those tokens and on the rest.
The KL of that coarsening is a lower bound of the full-vocabulary KL, equal to it when the rest
holds no mass; `tail_mass` says how much it holds. Top-1 agreement is exact.

An engine that gives only each position's top k (vLLM's prompt logprobs) is asked again with a
larger k (x8, up to MAX_TOP_K or the vocabulary) until the original's tokens are all found; any
still missing get the quantized side's k-th probability (their upper bound: their terms are then
lower bounds), and `uncovered_mass` says how much of the original's mass that touched (0: the
same KL as from whole rows). Intervals: a bootstrap over lines (the independent unit).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quantkit.contract import TaskResult

TOP_K = 256
# the largest top-k asked of an engine that gives no whole rows (vLLM): each position of a line
# then returns this many entries, so it bounds the memory and time of one line
MAX_TOP_K = 4096
# stop asking for more once no position leaves more of the original's mass than this unfound
COVERED_ENOUGH = 1e-6


def baseline_side(engine: Any, texts: list[str]) -> dict[str, Any]:
    """The original's top TOP_K log-probabilities per position of each line (JSON-able)."""
    lines = []
    top = getattr(engine, "token_logprob_top", None)
    for text in texts:
        if top is not None:  # an engine without whole rows gives its top k, best first
            ids, lp = top(engine.encode(text), min(TOP_K, int(engine.vocab_size)))
        else:
            rows = _whole_rows(engine, engine.encode(text))
            k = min(TOP_K, rows.shape[1])
            ids = np.argpartition(-rows, k - 1, axis=1)[:, :k]
            lp = np.take_along_axis(rows, ids, 1)
            order = np.argsort(-lp, axis=1)  # first column: the top token
            ids, lp = np.take_along_axis(ids, order, 1), np.take_along_axis(lp, order, 1)
        lines.append({"ids": ids.astype(np.int32).tolist(), "logp": np.round(lp, 5).tolist()})
    return {"top_k": TOP_K, "lines": lines}


def compare(engine: Any, texts: list[str], base: dict[str, Any], seed: int = 0
            ) -> TaskResult:
    """Per-token KL and top-1 agreement of `engine` (the quantized model) against `base`: the
    metrics kld, kld_p99 and top1_agreement, and what they were taken over (no sides)."""
    from quantkit.validate.stats import metric

    kls, agree, tails, uncovered = [], [], [], []
    for text, line in zip(texts, base["lines"]):
        ids, lp = np.asarray(line["ids"], dtype=np.int64), np.asarray(line["logp"])
        q_at, q_top1, found = quant_side(engine, engine.encode(text), ids, lp)
        kl_line, agree_line, tail_line = kl_at(lp, ids, q_at, q_top1)
        kls.append(kl_line)
        agree.append(agree_line)
        tails.append(tail_line)
        uncovered.append(np.where(found, 0.0, np.exp(lp)).sum(1))
    n = len(kls)
    mean = _line_bootstrap(kls, lambda v: float(v.mean()), seed)
    p99 = _line_bootstrap(kls, lambda v: float(np.quantile(v, 0.99)), seed)
    top1 = _line_bootstrap(agree, lambda v: float(v.mean()), seed)
    all_tail = np.concatenate(tails) if tails else np.zeros(0)
    all_unc = np.concatenate(uncovered) if uncovered else np.zeros(0)
    return TaskResult(metrics={"kld": metric(*mean, n), "kld_p99": metric(*p99, n),
                               "top1_agreement": metric(*top1, n)}, extra={
        "kld_positions": int(sum(len(k) for k in kls)),
        "tail_mass": {"mean": round(float(all_tail.mean()), 6) if all_tail.size else None,
                      "max": round(float(all_tail.max()), 6) if all_tail.size else None},
        "uncovered_mass": {"mean": round(float(all_unc.mean()), 8) if all_unc.size else None,
                           "max": round(float(all_unc.max()), 8) if all_unc.size else None},
        "line_kld": [round(float(k.mean()), 6) if k.size else None for k in kls]})


def position_kl(base_logp: np.ndarray, base_ids: np.ndarray, quant_rows: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(KL per position, top-1 agreement per position, the original's mass outside its top-k),
    from the quantized model's whole rows."""
    return kl_at(base_logp, base_ids, np.take_along_axis(quant_rows, base_ids, 1),
                 quant_rows.argmax(1))


def kl_at(base_logp: np.ndarray, base_ids: np.ndarray, q_at: np.ndarray, q_top1: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """position_kl from the quantized side's log-probabilities at the original's top-k tokens
    (`q_at`, aligned with `base_ids`) and its most likely token per position."""
    q = q_at.astype(np.float64)
    p = np.exp(base_logp)
    p_rest = np.clip(1.0 - p.sum(1), 0.0, 1.0)
    q_rest = np.clip(1.0 - np.exp(q).sum(1), 1e-12, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        tail = np.where(p_rest > 1e-9, p_rest * (np.log(np.maximum(p_rest, 1e-300)) - np.log(q_rest)),
                        0.0)
    kl = np.maximum((p * (base_logp - q)).sum(1) + tail, 0.0)
    agree = (base_ids[:, 0] == q_top1).astype(np.float64)
    return kl, agree, p_rest


def quant_side(engine: Any, ids: list[int], base_ids: np.ndarray, base_logp: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The quantized side of one line: (log-probabilities at the original's top-k tokens, its
    most likely token, which of the original's tokens were found) per position. From whole rows
    where the engine has them; else from its top k, asked again with a larger k while any
    position leaves more than COVERED_ENOUGH of the original's mass unfound."""
    top = getattr(engine, "token_logprob_top", None)
    if top is None:
        q = _whole_rows(engine, ids)
        _same_positions(base_ids, q)
        return (np.take_along_axis(q, base_ids, 1), q.argmax(1),
                np.ones(base_ids.shape, dtype=bool))
    vocab = int(engine.vocab_size)
    k = min(max(base_ids.shape[1], 1), vocab)
    while True:
        top_ids, top_lp = top(ids, k)
        _same_positions(base_ids, top_ids)
        q_at, found = lookup(top_ids, top_lp, base_ids)
        unfound = np.where(found, 0.0, np.exp(base_logp)).sum(1)
        if not unfound.size or unfound.max() <= COVERED_ENOUGH or k >= min(MAX_TOP_K, vocab):
            break
        k = min(k * 8, MAX_TOP_K, vocab)
    return q_at, top_ids[:, 0], found


def lookup(top_ids: np.ndarray, top_lp: np.ndarray, want: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray]:
    """Per position, the log-probabilities of the `want` tokens in a top-k list (ids and
    log-probabilities [positions, k], best first), and which were in it. A token not in it gets
    the list's last (k-th) log-probability: its upper bound."""
    n, k = top_ids.shape
    if n == 0:
        return np.zeros(want.shape), np.ones(want.shape, dtype=bool)
    span = int(max(top_ids.max(), want.max())) + 1  # one key space per row: row * span + id
    rows = np.arange(n, dtype=np.int64)[:, None] * span
    order = np.argsort(top_ids, axis=1)
    keys = (np.take_along_axis(top_ids, order, 1) + rows).ravel()
    at = np.minimum(np.searchsorted(keys, (want + rows).ravel()), n * k - 1).reshape(want.shape)
    found = keys[at] == want + rows
    lp_sorted = np.take_along_axis(top_lp, order, 1).ravel()
    q_at = np.where(found, lp_sorted[at], top_lp[:, -1:])
    return q_at.astype(np.float64), found


def _whole_rows(engine: Any, ids: list[int]) -> np.ndarray:
    rows = engine.token_logprob_rows(ids)
    return np.concatenate(rows) if rows else np.zeros((0, 1), dtype=np.float32)


def _same_positions(base_ids: np.ndarray, quant: np.ndarray) -> None:
    if quant.shape[0] != base_ids.shape[0]:
        raise ValueError(f"the models tokenize a line differently ({base_ids.shape[0]} vs "
                         f"{quant.shape[0]} positions): they do not share a tokenizer")


def _line_bootstrap(per_line: list[np.ndarray], stat: Any, seed: int, n_boot: int = 1000
                    ) -> tuple[float, float, float]:
    """stat over all positions, and its 95% interval from resampling whole lines."""
    lines = [v for v in per_line if v.size]
    if not lines:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    value = stat(np.concatenate(lines))
    boots = [stat(np.concatenate([lines[i] for i in rng.integers(0, len(lines), len(lines))]))
             for _ in range(n_boot)]
    lo, hi = np.quantile(boots, [0.025, 0.975])
    return value, float(lo), float(hi)
