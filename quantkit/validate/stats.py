"""Confidence intervals for "quantized vs baseline" comparisons.

Every comparison is paired: item i of the quantized list and item i of the baseline list are the
same question, line or window. Resampling items jointly keeps that pairing, so the interval
reflects how the two models differ on the same items rather than how hard the items are.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from quantkit.contract import MetricValue

# bootstrap rows drawn at once are capped so n_boot x n indices stay near 32 MiB of int64;
# a 2000 x 1000 matrix is one chunk, larger evaluations are streamed in slices
_CHUNK_CELLS = 4_000_000

Interval = tuple[float, float, float]
NAN = float("nan")


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion; (0, 1) when there are no trials."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"successes must lie in 0..{n}, got {successes}")
    p = successes / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, center - half), min(1.0, center + half)


def retention(q: float, b: float) -> float:
    """q / b, the share of the baseline's score the quantized model keeps; nan when b is 0."""
    return q / b if b != 0 else NAN


def _paired(q: Sequence[float], b: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    qa, ba = np.asarray(q, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if qa.ndim != 1 or qa.shape != ba.shape:
        raise ValueError(f"paired samples need equal 1-D lengths, got {qa.shape} and {ba.shape}")
    return qa, ba


def _bootstrap_means(qa: np.ndarray, ba: np.ndarray, seed: int,
                     n_boot: int) -> tuple[np.ndarray, np.ndarray]:
    """Means of q and b over n_boot resamples of the item indices (the same indices for both)."""
    n = len(qa)
    rng = np.random.default_rng(seed)
    rows = max(1, _CHUNK_CELLS // n)
    mq, mb = np.empty(n_boot), np.empty(n_boot)
    for start in range(0, n_boot, rows):
        stop = min(n_boot, start + rows)
        idx = rng.integers(0, n, size=(stop - start, n))
        mq[start:stop] = qa[idx].mean(axis=1)
        mb[start:stop] = ba[idx].mean(axis=1)
    return mq, mb


def _percentile_interval(stats: np.ndarray, level: float) -> tuple[float, float]:
    """Percentile bootstrap bounds; undefined resamples (nan) are dropped.

    The nearest order statistics outward ("lower"/"higher") are used instead of interpolation,
    so an infinite resample (x / 0) cannot turn a bound into inf - inf = nan.
    """
    stats = stats[~np.isnan(stats)]
    if stats.size == 0:
        return NAN, NAN
    alpha = (1 - level) / 2
    lo = float(np.quantile(stats, alpha, method="lower"))
    hi = float(np.quantile(stats, 1 - alpha, method="higher"))
    return lo, hi


def _paired_ci(q: Sequence[float], b: Sequence[float],
               stat: Callable[[np.ndarray, np.ndarray], np.ndarray],
               seed: int, n_boot: int, level: float) -> Interval:
    if not 0 < level < 1:
        raise ValueError(f"level must lie strictly between 0 and 1, got {level}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be at least 1, got {n_boot}")
    qa, ba = _paired(q, b)
    if qa.size == 0:
        return NAN, NAN, NAN
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        value = float(stat(np.array([qa.mean()]), np.array([ba.mean()]))[0])
        mq, mb = _bootstrap_means(qa, ba, seed, n_boot)
        lo, hi = _percentile_interval(stat(mq, mb), level)
    return value, lo, hi


def _ratio(mq: np.ndarray, mb: np.ndarray) -> np.ndarray:
    return np.where(mb == 0, np.where(mq == 0, NAN, np.inf * np.sign(mq)), mq / mb)


def _diff(mq: np.ndarray, mb: np.ndarray) -> np.ndarray:
    return mq - mb


def _exp_diff(mq: np.ndarray, mb: np.ndarray) -> np.ndarray:
    return np.exp(mq - mb)


def ratio_ci_paired(q: Sequence[float], b: Sequence[float], *, seed: int = 0, n_boot: int = 2000,
                    level: float = 0.95) -> Interval:
    """mean(q) / mean(b) and its paired-bootstrap percentile interval: (value, lo, hi).

    Works for 0/1 correctness lists (accuracy retention) and for per-item scores. When mean(b)
    is 0 the ratio is undefined and all three are nan. Resamples whose baseline mean is 0 count
    as +inf (or are dropped when the quantized mean is 0 too).
    """
    _, ba = _paired(q, b)
    if ba.size == 0 or ba.mean() == 0:
        return NAN, NAN, NAN
    return _paired_ci(q, b, _ratio, seed, n_boot, level)


def diff_ci_paired(q: Sequence[float], b: Sequence[float], *, seed: int = 0, n_boot: int = 2000,
                   level: float = 0.95) -> Interval:
    """mean(q) - mean(b) and its paired-bootstrap percentile interval: (value, lo, hi)."""
    return _paired_ci(q, b, _diff, seed, n_boot, level)


def ppl_ratio_ci(q_nll: Sequence[float], b_nll: Sequence[float], *, seed: int = 0,
                 n_boot: int = 2000, level: float = 0.95) -> Interval:
    """Perplexity ratio exp(mean q_nll) / exp(mean b_nll) with a paired-bootstrap interval.

    The inputs are per-line (or per-window) mean NLLs in nats, paired by line; each line weighs
    the same, whatever its token count. The ratio is returned as is (1.0 = no change); the
    caller subtracts 1 for a relative increase.
    """
    return _paired_ci(q_nll, b_nll, _exp_diff, seed, n_boot, level)


def retention_metric(q: Sequence[float], b: Sequence[float], *, seed: int = 0) -> MetricValue:
    """mean(q) / mean(b) of paired scores as a metric (`metric`). Where the baseline scores 0 the
    ratio says nothing, so the metric carries a `note` ("no signal: 0/10 on both") for the
    summary, the report and the gate to show instead of nan."""
    m = metric(*ratio_ci_paired(q, b, seed=seed), len(q))
    if not len(b) or float(np.sum(b)) == 0:
        return m.with_note(no_signal(q, b))
    return m


def no_signal(q: Sequence[float], b: Sequence[float]) -> str:
    """Why a retention over a baseline that scores 0 is undefined, in the items' own counts."""
    n = len(q)
    if n == 0:
        return "no signal: no items compared"
    got = float(np.sum(q))
    shown = f"{got:g}" if got.is_integer() else f"{got:.3g}"
    if got == 0:
        return f"no signal: 0/{n} on both"
    return f"no signal: the baseline scored 0/{n} (quantized {shown}/{n})"


def metric(value: float, lo: float, hi: float, n: int) -> MetricValue:
    """A compared metric: value, 95% interval (None where not finite), n."""
    clean = [None if isinstance(v, float) and math.isnan(v) else v for v in (value, lo, hi)]
    return MetricValue(clean[0] if clean[0] is not None else float("nan"), clean[1], clean[2], n)


def mean_ci(values: Sequence[float], *, seed: int = 0, n_boot: int = 2000,
            level: float = 0.95) -> Interval:
    """mean(values) and its bootstrap percentile interval: (value, lo, hi); nan when empty."""
    va = np.asarray(values, dtype=np.float64)
    if va.size == 0:
        return NAN, NAN, NAN
    means, _ = _bootstrap_means(va, va, seed, n_boot)
    lo, hi = _percentile_interval(means, level)
    return float(va.mean()), lo, hi
