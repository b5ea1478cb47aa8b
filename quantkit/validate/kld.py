"""KL divergence and top-1 agreement of the quantized model against the original, per token.

For every position of every domain text line, KL(original || quantized) of the next-token
distributions and whether both models rank the same token first. The original's side is kept as
its TOP_K most likely tokens per position (what the baseline cache stores) plus one bucket for the
rest of the vocabulary; the quantized side is its full row. The KL of that coarsening is a lower
bound of the full-vocabulary KL, equal to it when the rest holds no mass; `tail_mass` says how
much it holds. Top-1 agreement is exact. Intervals: a bootstrap over lines (the independent unit).
"""

from __future__ import annotations

from typing import Any

import numpy as np

TOP_K = 256


def baseline_side(engine: Any, texts: list[str]) -> dict[str, Any]:
    """The original's top TOP_K log-probabilities per position of each line (JSON-able)."""
    lines = []
    for text in texts:
        rows = _rows(engine, text)
        k = min(TOP_K, rows.shape[1])
        ids = np.argpartition(-rows, k - 1, axis=1)[:, :k]
        lp = np.take_along_axis(rows, ids, 1)
        order = np.argsort(-lp, axis=1)  # first column: the top token
        lines.append({"ids": np.take_along_axis(ids, order, 1).astype(np.int32).tolist(),
                      "logp": np.round(np.take_along_axis(lp, order, 1), 5).tolist()})
    return {"top_k": TOP_K, "lines": lines}


def compare(engine: Any, texts: list[str], base: dict[str, Any], seed: int = 0
            ) -> dict[str, Any]:
    """Per-token KL and top-1 agreement of `engine` (the quantized model) against `base`."""
    from quantkit.validate.stats import metric

    kls, agree, tails = [], [], []
    for text, line in zip(texts, base["lines"]):
        q = _rows(engine, text)
        ids, lp = np.asarray(line["ids"], dtype=np.int64), np.asarray(line["logp"])
        if q.shape[0] != ids.shape[0]:
            raise ValueError(f"the models tokenize a line differently ({ids.shape[0]} vs "
                             f"{q.shape[0]} positions): they do not share a tokenizer")
        kl_line, agree_line, tail_line = position_kl(lp, ids, q)
        kls.append(kl_line)
        agree.append(agree_line)
        tails.append(tail_line)
    n = len(kls)
    mean = _line_bootstrap(kls, lambda v: float(v.mean()), seed)
    p99 = _line_bootstrap(kls, lambda v: float(np.quantile(v, 0.99)), seed)
    top1 = _line_bootstrap(agree, lambda v: float(v.mean()), seed)
    all_tail = np.concatenate(tails) if tails else np.zeros(0)
    return {"kld": metric(*mean, n), "kld_p99": metric(*p99, n),
            "top1_agreement": metric(*top1, n),
            "kld_positions": int(sum(len(k) for k in kls)),
            "tail_mass": {"mean": round(float(all_tail.mean()), 6) if all_tail.size else None,
                          "max": round(float(all_tail.max()), 6) if all_tail.size else None},
            "line_kld": [round(float(k.mean()), 6) if k.size else None for k in kls]}


def position_kl(base_logp: np.ndarray, base_ids: np.ndarray, quant_rows: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(KL per position, top-1 agreement per position, the original's mass outside its top-k)."""
    q = np.take_along_axis(quant_rows.astype(np.float64), base_ids, 1)
    p = np.exp(base_logp)
    p_rest = np.clip(1.0 - p.sum(1), 0.0, 1.0)
    q_rest = np.clip(1.0 - np.exp(q).sum(1), 1e-12, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        tail = np.where(p_rest > 1e-9, p_rest * (np.log(np.maximum(p_rest, 1e-300)) - np.log(q_rest)),
                        0.0)
    kl = np.maximum((p * (base_logp - q)).sum(1) + tail, 0.0)
    agree = (base_ids[:, 0] == quant_rows.argmax(1)).astype(np.float64)
    return kl, agree, p_rest


def _rows(engine: Any, text: str) -> np.ndarray:
    rows = engine.token_logprob_rows(engine.encode(text))
    return np.concatenate(rows) if rows else np.zeros((0, 1), dtype=np.float32)


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
