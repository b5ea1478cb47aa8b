"""Confidence intervals: known Wilson values, paired bootstrap behaviour, verdict support."""

from __future__ import annotations

import math

import numpy as np
import pytest

from quantkit.gate import too_small
from quantkit.validate.stats import (
    diff_ci_paired,
    ppl_ratio_ci,
    ratio_ci_paired,
    retention,
    retention_metric,
    wilson,
)


@pytest.mark.parametrize(("k", "n", "expected"), [
    (50, 100, (0.4038, 0.5962)),
    (0, 10, (0.0, 0.2775)),
    (10, 10, (0.7225, 1.0)),
    (81, 263, (0.2553, 0.3662)),
])
def test_wilson_known_values(k: int, n: int, expected: tuple[float, float]) -> None:
    lo, hi = wilson(k, n)
    assert lo == pytest.approx(expected[0], abs=1e-4)
    assert hi == pytest.approx(expected[1], abs=1e-4)


def test_wilson_edges() -> None:
    assert wilson(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson(11, 10)
    narrow, wide = wilson(500, 1000), wilson(50, 100)
    assert narrow[1] - narrow[0] < wide[1] - wide[0]


def test_retention() -> None:
    assert retention(0.45, 0.5) == pytest.approx(0.9)
    assert math.isnan(retention(0.3, 0.0))


def test_identical_samples_give_ratio_one_with_tight_interval() -> None:
    rng = np.random.default_rng(1)
    correct = (rng.random(500) < 0.6).astype(float).tolist()
    value, lo, hi = ratio_ci_paired(correct, correct)
    assert (value, lo, hi) == (1.0, 1.0, 1.0)
    values = rng.normal(2.5, 0.4, 300).tolist()
    assert ppl_ratio_ci(values, values) == (1.0, 1.0, 1.0)
    assert diff_ci_paired(values, values) == (0.0, 0.0, 0.0)


def test_clear_accuracy_loss_excludes_one() -> None:
    rng = np.random.default_rng(2)
    b = (rng.random(1000) < 0.7).astype(float)
    q = b * (rng.random(1000) < 0.8)  # the quantized model loses ~20% of what the baseline knew
    value, lo, hi = ratio_ci_paired(q.tolist(), b.tolist())
    assert value == pytest.approx(q.mean() / b.mean())
    assert lo <= value <= hi < 1.0
    assert 0.75 < lo and hi < 0.85


def test_pairing_tightens_the_interval() -> None:
    # item difficulty varies a lot, the quantized model is uniformly 0.1 nats worse: pairing
    # removes the difficulty spread, so the interval is far narrower than the spread itself
    rng = np.random.default_rng(3)
    b = rng.normal(3.0, 1.0, 400)
    q = b + 0.1 + rng.normal(0, 0.01, 400)
    value, lo, hi = ppl_ratio_ci(q.tolist(), b.tolist())
    assert value == pytest.approx(math.exp(0.1), rel=1e-3)
    assert 1.0 < lo < value < hi < 1.11
    d, dlo, dhi = diff_ci_paired(q.tolist(), b.tolist())
    assert d == pytest.approx(0.1, abs=2e-3)
    assert math.exp(dlo) == pytest.approx(lo) and math.exp(dhi) == pytest.approx(hi)


def test_deterministic_by_seed() -> None:
    rng = np.random.default_rng(4)
    b = rng.random(200).tolist()
    q = (np.asarray(b) + rng.normal(0, 0.2, 200)).tolist()
    assert ratio_ci_paired(q, b, seed=7) == ratio_ci_paired(q, b, seed=7)
    assert diff_ci_paired(q, b, seed=7) == diff_ci_paired(q, b, seed=7)
    assert diff_ci_paired(q, b, seed=7)[1:] != diff_ci_paired(q, b, seed=8)[1:]


def test_level_widens_interval() -> None:
    rng = np.random.default_rng(5)
    b = rng.normal(0, 1, 300).tolist()
    q = rng.normal(0, 1, 300).tolist()
    _, lo90, hi90 = diff_ci_paired(q, b, level=0.90)
    _, lo99, hi99 = diff_ci_paired(q, b, level=0.99)
    assert lo99 <= lo90 and hi90 <= hi99


def test_zero_baseline_and_empty_samples_give_nan() -> None:
    assert all(math.isnan(x) for x in ratio_ci_paired([1.0, 0.0], [0.0, 0.0]))
    assert all(math.isnan(x) for x in diff_ci_paired([], []))
    with pytest.raises(ValueError):
        diff_ci_paired([1.0, 2.0], [1.0])


def test_retention_metric_says_no_signal_where_the_baseline_scores_zero() -> None:
    both = retention_metric([0.0] * 10, [0.0] * 10)
    assert both.note == "no signal: 0/10 on both"
    assert math.isnan(both.value) and both.lo is None and both.n == 10
    only_q = retention_metric([1.0, 1.0] + [0.0] * 8, [0.0] * 10)
    assert only_q.note == "no signal: the baseline scored 0/10 (quantized 2/10)"
    assert retention_metric([], []).note == "no signal: no items compared"
    measured = retention_metric([1.0, 1.0, 0.0, 1.0], [1.0, 0.0, 0.0, 1.0])
    assert "note" not in measured.to_dict() and measured.value == 1.5 and measured.n == 4


def test_ratio_survives_resamples_with_zero_baseline() -> None:
    # with 2 correct baseline items out of 20 many resamples have mean(b) == 0
    b = [1.0, 1.0] + [0.0] * 18
    q = [1.0, 0.0, 1.0] + [0.0] * 17
    value, lo, hi = ratio_ci_paired(q, b)
    assert value == 1.0
    assert lo <= value and math.isinf(hi)


@pytest.mark.parametrize(("lo", "hi", "limit", "op", "expected"), [
    (0.90, 0.99, 0.95, ">=", True),   # straddles: could pass or fail
    (0.96, 0.99, 0.95, ">=", False),  # clearly passes
    (0.80, 0.90, 0.95, ">=", False),  # clearly fails
    (0.95, 0.99, 0.95, ">=", False),  # lo on the limit still passes
    (1.01, 1.08, 1.05, "<=", True),
    (1.01, 1.04, 1.05, "<=", False),
    (1.06, 1.10, 1.05, "<=", False),
    (1.01, 1.05, 1.05, "<=", False),  # hi on the limit still passes
])
def test_too_small(lo: float, hi: float, limit: float, op: str, expected: bool) -> None:
    assert too_small(100, lo, hi, limit, op) is expected


def test_too_small_without_data() -> None:
    assert too_small(0, 0.96, 0.99, 0.95, ">=")
    assert too_small(10, float("nan"), float("nan"), 0.95, ">=")
    with pytest.raises(ValueError):
        too_small(10, 0.9, 1.0, 0.95, ">")
