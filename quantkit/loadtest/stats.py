"""Load-test arithmetic, pure: per-request timings -> one row per concurrency level -> the knee."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from quantkit.records import BenchLevel, BenchRepeat, BenchRow, Distribution, Knee, Ratio

# More concurrency that buys less than 10% more throughput only buys queueing (higher latency).
MIN_GAIN = 0.10
# Serve at 80% of the knee: room for bursts and for requests longer than the benchmark's.
HEADROOM = 0.20
ERROR_SAMPLES = 5
LATENCIES = ("ttft_s", "tpot_s", "itl_s", "e2e_s")


@dataclass(frozen=True)
class RequestRecord:
    """What one streamed request measured; times in seconds from sending it."""

    prompt_class: str
    error: str | None = None
    ttft: float | None = None              # to the first chunk that carries text
    e2e: float | None = None               # to the end of the stream
    itl: tuple[float, ...] = field(default=())  # gaps between text chunks
    output_tokens: int = 0
    prompt_tokens: int | None = None
    tokens_from_usage: bool = False
    no_text: bool = False                  # completed, but every token's text was held back

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first."""
        if self.error or self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation, as numpy's default; None if empty."""
    data = sorted(v for v in values if math.isfinite(v))
    if not data:
        return None
    rank = (len(data) - 1) * min(max(q, 0.0), 100.0) / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (rank - lo)


def distribution(values: Sequence[float]) -> Distribution:
    """P50, P99 and mean, rounded to microseconds."""
    data = [v for v in values if math.isfinite(v)]
    mean = sum(data) / len(data) if data else None
    return {"p50": _round(percentile(data, 50)), "p99": _round(percentile(data, 99)),
            "mean": _round(mean)}


def summarize_level(concurrency: int, records: Sequence[RequestRecord], wall_s: float,
                    held_s: float | None = None) -> BenchRow:
    """One results row: latency percentiles, throughput and errors of one concurrency level.
    Throughput is over `held_s` where given (the seconds the requests held their slots, over the
    slots: client.run_level), else over `wall_s`."""
    ok = [r for r in records if r.error is None]
    tokens = sum(r.output_tokens for r in ok)
    messages = list(dict.fromkeys(r.error for r in records if r.error))
    usage = {r.tokens_from_usage for r in ok}
    wall = max(wall_s if held_s is None else held_s, 1e-9)
    return {
        "concurrency": concurrency, "requests": len(records), "completed": len(ok),
        "errors": len(records) - len(ok), "error_messages": messages[:ERROR_SAMPLES],
        "no_text": sum(r.no_text for r in ok),
        "wall_s": _round(wall_s), "held_s": _round(held_s), "output_tokens": tokens,
        "tokens_counted_from": ("usage" if usage == {True} else "chunks" if usage == {False}
                                else "mixed" if usage else None),
        "request_throughput": _round(len(ok) / wall), "output_token_throughput": _round(tokens / wall),
        "ttft_s": distribution([r.ttft for r in ok if r.ttft is not None]),
        "tpot_s": distribution([t for r in ok if (t := r.tpot) is not None]),
        "itl_s": distribution([g for r in ok for g in r.itl]),
        "e2e_s": distribution([r.e2e for r in ok if r.e2e is not None]),
    }


def throughput(row: BenchRow) -> float:
    """The throughput the knee follows: output tokens/s, or requests/s when no token was counted."""
    return float(row.get("output_token_throughput") or row.get("request_throughput") or 0.0)


def _breach(row: BenchRow, p99_ttft_target: float | None, p99_e2e_target: float | None
            ) -> tuple[str, str] | None:
    """(limited_by, why) if this level is unacceptable whatever its throughput, else None."""
    c = row["concurrency"]
    if row.get("errors"):
        return "errors", f"{row['errors']} of {row['requests']} requests failed at concurrency {c}"
    for key, dist, target, name in (("ttft_s", row.get("ttft_s"), p99_ttft_target, "TTFT"),
                                    ("e2e_s", row.get("e2e_s"), p99_e2e_target,
                                     "end-to-end latency")):
        p99 = (dist or {}).get("p99")
        if target is not None and (p99 is None or p99 > target):
            shown = "missing" if p99 is None else f"{p99:.3g} s"
            return key.removesuffix("_s"), (f"P99 {name} {shown} breaks the {target:g} s target "
                                            f"at concurrency {c}")
    return None


def find_knee(rows: Sequence[BenchRow], *, min_gain: float = MIN_GAIN,
              p99_ttft_target: float | None = None, p99_e2e_target: float | None = None
              ) -> Knee:
    """The highest level worth running: throughput still grows by `min_gain` and no target breaks.

    Returns {"concurrency", "limited_by", "reason"}; `limited_by` is "throughput", "ttft", "e2e",
    "errors" or "max_tested" (throughput still grew at the last level), and `concurrency` is None
    when even the lowest level broke a target or failed.
    """
    levels = sorted(rows, key=lambda r: r["concurrency"])
    if not levels:
        return {"concurrency": None, "limited_by": None, "reason": "no level was run"}
    knee: BenchRow | None = None
    for row in levels:
        breach = _breach(row, p99_ttft_target, p99_e2e_target)
        if breach:
            return {"concurrency": knee["concurrency"] if knee else None, "limited_by": breach[0],
                    "reason": breach[1]}
        if knee is not None:
            before, now = throughput(knee), throughput(row)
            gain = now / before - 1 if before > 0 else math.inf
            if gain < min_gain:
                return {"concurrency": knee["concurrency"], "limited_by": "throughput",
                        "reason": (f"throughput grew {gain:+.1%} from concurrency "
                                   f"{knee['concurrency']} to {row['concurrency']} "
                                   f"(less than {min_gain:.0%})")}
        knee = row
    top = levels[-1]["concurrency"]
    return {"concurrency": top, "limited_by": "max_tested",
            "reason": (f"throughput still grew at concurrency {top}, the highest tested; "
                       "test higher concurrency to find the knee")}


def recommend(knee_concurrency: int | None, headroom: float = HEADROOM) -> int:
    """The concurrency to configure: the knee less the headroom, rounded down, at least 1."""
    if knee_concurrency is None:
        return 1
    return max(1, math.floor(knee_concurrency * (1 - headroom) + 1e-9))


def _round(v: float | None, digits: int = 6) -> float | None:
    return None if v is None else round(v, digits)


# -- repeats: intervals, spread, ratios, order -------------------------------------------------------

# A level whose repeats spread more than this ((max - min) / median of its throughput) is unsteady:
# the server's speed drifted while it was measured, and one figure would hide it.
UNSTEADY_SPREAD = 0.10
CONFIDENCE = 0.95
INTERVAL = "95% t-interval of the mean of the repeats"


def t_quantile(df: float, confidence: float = CONFIDENCE) -> float:
    """The two-sided Student-t critical value (4.303 for 2 degrees of freedom at 95%), by
    bisection on the t distribution's tail (scipy is not a dependency)."""
    tail = (1 - confidence) / 2
    lo, hi = 0.0, 1.0
    while _t_tail(hi, df) > tail:
        lo, hi = hi, hi * 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_tail(mid, df) > tail else (lo, mid)
    return (lo + hi) / 2


def _t_tail(t: float, df: float) -> float:
    """P(T > t) for t >= 0: half the regularized incomplete beta I_x(df/2, 1/2), x = df/(df+t^2)."""
    return 0.5 * _beta_inc(df / 2, 0.5, df / (df + t * t))


def _beta_inc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function (continued fraction, Lentz's method)."""
    if x <= 0 or x >= 1:
        return 0.0 if x <= 0 else 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _beta_inc(b, a, 1 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x)) / a
    tiny, f, c, d = 1e-300, 1.0, 1.0, 0.0
    for i in range(400):
        m = i // 2
        if i == 0:
            num = 1.0
        elif i % 2 == 0:
            num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            num = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + num * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + num / c
        c = c if abs(c) > tiny else tiny
        f *= c * d
        if abs(1.0 - c * d) < 1e-14:
            break
    return front * (f - 1.0)


def median(values: Sequence[float]) -> float | None:
    return percentile(values, 50)


def interval(values: Sequence[float], confidence: float = CONFIDENCE) -> list[float] | None:
    """The t-interval of the mean of the repeats, [lo, hi]: mean +- t(n-1) * sd / sqrt(n).

    Chosen over a bootstrap of the median because with 3-5 repeats a bootstrap's interval is
    little more than [min, max] and covers the truth far less often than it claims; the t-interval
    is honest about so few figures (wide with 2-3). Figures that are all >= 0 (throughputs,
    latencies) get a lower end of at least 0. None with fewer than two figures."""
    data = [float(v) for v in values if v is not None and math.isfinite(v)]
    if len(data) < 2:
        return None
    n = len(data)
    mean = sum(data) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in data) / (n - 1))
    half = t_quantile(n - 1, confidence) * sd / math.sqrt(n)
    lo = max(mean - half, 0.0) if min(data) >= 0 else mean - half
    return [_round(lo), _round(mean + half)]  # type: ignore[list-item]


def spread(values: Sequence[float]) -> float | None:
    """(max - min) / median of the repeats; None with fewer than two or a median of 0."""
    data = [float(v) for v in values if v is not None and math.isfinite(v)]
    mid = median(data)
    if len(data) < 2 or not mid:
        return None
    return round((max(data) - min(data)) / mid, 4)


def ratio_interval(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE
                   ) -> Ratio | None:
    """How many times b's figure a's is, with its interval: Welch's t-interval on the difference
    of the mean logarithms (unpaired repeats, unequal variances), taken back with exp, i.e. the
    ratio of the geometric means. {"ratio", "ci": [lo, hi] or None with fewer than two figures a
    side}; None when a side has no positive figure."""
    la = [math.log(v) for v in a if v is not None and math.isfinite(v) and v > 0]
    lb = [math.log(v) for v in b if v is not None and math.isfinite(v) and v > 0]
    if not la or not lb:
        return None
    ma, mb = sum(la) / len(la), sum(lb) / len(lb)
    ratio = math.exp(ma - mb)
    if len(la) < 2 or len(lb) < 2:
        return {"ratio": round(ratio, 4), "ci": None}
    va = sum((v - ma) ** 2 for v in la) / (len(la) - 1) / len(la)
    vb = sum((v - mb) ** 2 for v in lb) / (len(lb) - 1) / len(lb)
    se = math.sqrt(va + vb)
    if se == 0:
        return {"ratio": round(ratio, 4), "ci": [round(ratio, 4), round(ratio, 4)]}
    df = (va + vb) ** 2 / (va ** 2 / (len(la) - 1) + vb ** 2 / (len(lb) - 1))
    half = t_quantile(df, confidence) * se
    return {"ratio": round(ratio, 4),
            "ci": [round(math.exp(ma - mb - half), 4), round(math.exp(ma - mb + half), 4)]}


def faster(a: Sequence[float], b: Sequence[float], margin: float) -> bool:
    """Whether a is measurably faster than b: the interval of a / b clears 1 + margin (all of
    it above). Within the noise (an interval that reaches 1 + margin, or none: one repeat) it is
    not."""
    found = ratio_interval(a, b)
    return bool(found and found["ci"] and found["ci"][0] > 1 + margin)


def alternating(names: Sequence[str], rounds: int) -> list[str]:
    """The order servers are measured in: forward, then backward, ... (A B, B A, A B): a drift
    in the machine's speed (heat, other load) then falls on every server alike."""
    return [name for r in range(rounds) for name in in_round(names, r)]


def in_round(names: Sequence[str], r: int) -> list[str]:
    """Round r of `alternating`: forward when r is even, else backward."""
    return list(names) if r % 2 == 0 else list(reversed(names))


def combine_repeats(rows: Sequence[BenchRow], records: Sequence[RequestRecord],
                    seeds: Sequence[int]) -> BenchLevel:
    """One level's row from its repeats' rows: the latency distributions over every counted
    request of every repeat; output_token_throughput and request_throughput the median of the
    repeats; for throughput, TTFT P50 and TPOT P50 the interval (`X_ci`, `interval`) and the
    spread (`X_spread`); `repeats` each repeat's figures; `unsteady` when the throughput's spread
    is over UNSTEADY_SPREAD."""
    first = rows[0]
    wall = sum(r["wall_s"] or 0.0 for r in rows)
    row = summarize_level(first["concurrency"], records, wall)
    row["held_s"] = _round(sum(r.get("held_s") or 0.0 for r in rows))
    row["request_throughput"] = _round(median([r["request_throughput"] or 0.0 for r in rows]))
    repeats: list[BenchRepeat] = [
        {"seed": s, "requests": r["requests"], "errors": r["errors"], "wall_s": r["wall_s"],
         "output_tokens": r["output_tokens"], "request_throughput": r["request_throughput"],
         "output_token_throughput": r.get("output_token_throughput"),
         "ttft_p50_s": (r.get("ttft_s") or {}).get("p50"),
         "tpot_p50_s": (r.get("tpot_s") or {}).get("p50"),
         "gpu_busy_pct": None if (g := r.get("gpu")) is None else g["busy_pct"]}
        for r, s in zip(rows, seeds)]
    tok = [v for rep in repeats if (v := rep["output_token_throughput"]) is not None]
    ttft = [v for rep in repeats if (v := rep["ttft_p50_s"]) is not None]
    tpot = [v for rep in repeats if (v := rep["tpot_p50_s"]) is not None]
    busy = [v for rep in repeats if (v := rep["gpu_busy_pct"]) is not None]
    row["output_token_throughput"] = _round(median(tok)) if tok else 0.0
    tok_spread = spread(tok)
    return {**row, "repeats": repeats,
            "output_token_throughput_ci": interval(tok),
            "output_token_throughput_spread": tok_spread,
            "ttft_p50_s": _round(median(ttft)), "ttft_p50_s_ci": interval(ttft),
            "ttft_p50_s_spread": spread(ttft),
            "tpot_p50_s": _round(median(tpot)), "tpot_p50_s_ci": interval(tpot),
            "tpot_p50_s_spread": spread(tpot),
            "unsteady": bool((tok_spread or 0) > UNSTEADY_SPREAD),
            "gpu_busy_pct": _round(median(busy)) if busy else None}
