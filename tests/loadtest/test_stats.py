"""The load test's statistics on numbers with known answers: the t critical values, the interval
of a level's repeats, their spread, the ratio of two servers with its interval, the rule that
calls one faster, and the alternating order."""

from __future__ import annotations

import math

import pytest

from quantkit.loadtest.stats import (
    RequestRecord,
    alternating,
    combine_repeats,
    faster,
    interval,
    ratio_interval,
    spread,
    summarize_level,
    t_quantile,
)


@pytest.mark.parametrize(("df", "t"), [(1, 12.7062), (2, 4.3027), (3, 3.1824), (4, 2.7764),
                                       (9, 2.2622), (30, 2.0423), (1e6, 1.9600)])
def test_t_critical_values_match_the_tables(df: float, t: float) -> None:
    assert t_quantile(df) == pytest.approx(t, abs=1e-4)


def test_interval_is_the_t_interval_of_the_mean() -> None:
    # mean 12, sd 2, n 3: 12 +- 4.3027 * 2 / sqrt(3)
    half = 4.302653 * 2 / math.sqrt(3)
    assert interval([10.0, 12.0, 14.0]) == pytest.approx([12 - half, 12 + half], abs=1e-5)
    assert interval([3.0, 3.0, 3.0]) == [3.0, 3.0]
    assert interval([5.0]) is None and interval([]) is None  # one figure has no interval
    assert interval([1.0, 9.0]) == [0.0, pytest.approx(5 + 12.7062 * 4, abs=1e-3)]  # >= 0
    assert interval([-1.0, 1.0])[0] == pytest.approx(-12.7062, abs=1e-3)


def test_spread_is_max_minus_min_over_the_median() -> None:
    assert spread([90.0, 100.0, 110.0]) == 0.2
    assert spread([100.0, 104.0, 102.0]) == pytest.approx(4 / 102, abs=1e-4)
    assert spread([7.0]) is None and spread([0.0, 0.0]) is None


def test_ratio_interval_is_welch_on_the_logarithms() -> None:
    same = ratio_interval([110.0] * 3, [100.0] * 3)
    assert same == {"ratio": 1.1, "ci": [1.1, 1.1]}
    # logs 0.1, 0.3 against 0, 0: difference 0.2, standard error 0.1, 1 degree of freedom
    got = ratio_interval([math.exp(0.1), math.exp(0.3)], [1.0, 1.0])
    assert got is not None and got["ratio"] == pytest.approx(math.exp(0.2), abs=1e-4)
    assert got["ci"] == pytest.approx([math.exp(0.2 - 1.270620), math.exp(0.2 + 1.270620)],
                                      abs=1e-3)
    assert ratio_interval([120.0], [100.0]) == {"ratio": 1.2, "ci": None}  # one repeat a side
    assert ratio_interval([0.0], [100.0]) is None


def test_faster_only_where_the_interval_clears_one_plus_the_margin() -> None:
    base = [100.0, 101.0, 99.0]
    assert faster([120.0, 121.0, 119.0], base, 0.03)
    assert not faster(base, [120.0, 121.0, 119.0], 0.03)
    assert not faster([102.0, 103.0, 101.0], base, 0.0)      # 1.02x, within the noise
    near = [104.0, 105.0, 103.0]                             # 1.04x [1.02, 1.06]
    assert faster(near, base, 0.0) and not faster(near, base, 0.03)  # within the margin
    assert not faster([150.0], [100.0], 0.0)                 # one repeat: no interval, no claim
    assert not faster([300.0, 100.0, 200.0], base, 0.0)      # far faster, but too noisy to say


def test_servers_alternate_so_drift_falls_on_both() -> None:
    assert alternating(["A", "B"], 4) == list("ABBAABBA")
    assert alternating(["orig", "Q4", "Q8"], 2) == ["orig", "Q4", "Q8", "Q8", "Q4", "orig"]
    assert alternating(["A"], 3) == ["A", "A", "A"]


def _repeat(c: int, tok_s: float) -> dict:
    rec = [RequestRecord("short", None, 0.1, 1.0, (0.1,), 10, 5, True)]
    return summarize_level(c, rec, wall_s=10 / tok_s)


def test_a_level_combines_its_repeats_and_flags_a_spread_over_10_percent() -> None:
    rows = [_repeat(2, t) for t in (100.0, 104.0, 102.0)]
    recs = [RequestRecord("short", None, 0.1, 1.0, (0.1,), 10, 5, True)] * 3
    row = combine_repeats(rows, recs, [0, 1, 2])
    assert row["output_token_throughput"] == 102.0  # the median
    assert row["output_token_throughput_ci"] == pytest.approx(interval([100.0, 104.0, 102.0]))
    assert [r["output_token_throughput"] for r in row["repeats"]] == [100.0, 104.0, 102.0]
    assert [r["seed"] for r in row["repeats"]] == [0, 1, 2]
    assert row["ttft_p50_s"] == 0.1 and row["ttft_p50_s_ci"] == [0.1, 0.1]
    assert row["requests"] == 3 and row["output_tokens"] == 30 and not row["unsteady"]
    shaky = combine_repeats([_repeat(2, t) for t in (100.0, 112.0, 104.0)], recs, [0, 1, 2])
    assert shaky["unsteady"] and shaky["output_token_throughput_spread"] == pytest.approx(
        12 / 104, abs=1e-4)
