"""Load-test arithmetic, pure: per-request timings -> one row per concurrency level -> the knee."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

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


def distribution(values: Sequence[float]) -> dict[str, float | None]:
    """P50, P99 and mean, rounded to microseconds."""
    data = [v for v in values if math.isfinite(v)]
    mean = sum(data) / len(data) if data else None
    return {"p50": _round(percentile(data, 50)), "p99": _round(percentile(data, 99)),
            "mean": _round(mean)}


def summarize_level(concurrency: int, records: Sequence[RequestRecord], wall_s: float
                    ) -> dict[str, Any]:
    """One results row: latency percentiles, throughput and errors of one concurrency level."""
    ok = [r for r in records if r.error is None]
    tokens = sum(r.output_tokens for r in ok)
    messages = list(dict.fromkeys(r.error for r in records if r.error))
    usage = {r.tokens_from_usage for r in ok}
    wall = max(wall_s, 1e-9)
    return {
        "concurrency": concurrency, "requests": len(records), "completed": len(ok),
        "errors": len(records) - len(ok), "error_messages": messages[:ERROR_SAMPLES],
        "no_text": sum(r.no_text for r in ok),
        "wall_s": _round(wall_s), "output_tokens": tokens,
        "tokens_counted_from": ("usage" if usage == {True} else "chunks" if usage == {False}
                                else "mixed" if usage else None),
        "request_throughput": _round(len(ok) / wall), "output_token_throughput": _round(tokens / wall),
        "ttft_s": distribution([r.ttft for r in ok if r.ttft is not None]),
        "tpot_s": distribution([t for r in ok if (t := r.tpot) is not None]),
        "itl_s": distribution([g for r in ok for g in r.itl]),
        "e2e_s": distribution([r.e2e for r in ok if r.e2e is not None]),
    }


def throughput(row: dict[str, Any]) -> float:
    """The throughput the knee follows: output tokens/s, or requests/s when no token was counted."""
    return float(row.get("output_token_throughput") or row.get("request_throughput") or 0.0)


def _breach(row: dict[str, Any], p99_ttft_target: float | None, p99_e2e_target: float | None
            ) -> tuple[str, str] | None:
    """(limited_by, why) if this level is unacceptable whatever its throughput, else None."""
    c = row["concurrency"]
    if row.get("errors"):
        return "errors", f"{row['errors']} of {row['requests']} requests failed at concurrency {c}"
    for key, target, name in (("ttft_s", p99_ttft_target, "TTFT"), ("e2e_s", p99_e2e_target,
                                                                     "end-to-end latency")):
        p99 = (row.get(key) or {}).get("p99")
        if target is not None and (p99 is None or p99 > target):
            shown = "missing" if p99 is None else f"{p99:.3g} s"
            return key.removesuffix("_s"), (f"P99 {name} {shown} breaks the {target:g} s target "
                                            f"at concurrency {c}")
    return None


def find_knee(rows: Sequence[dict[str, Any]], *, min_gain: float = MIN_GAIN,
              p99_ttft_target: float | None = None, p99_e2e_target: float | None = None
              ) -> dict[str, Any]:
    """The highest level worth running: throughput still grows by `min_gain` and no target breaks.

    Returns {"concurrency", "limited_by", "reason"}; `limited_by` is "throughput", "ttft", "e2e",
    "errors" or "max_tested" (throughput still grew at the last level), and `concurrency` is None
    when even the lowest level broke a target or failed.
    """
    levels = sorted(rows, key=lambda r: r["concurrency"])
    if not levels:
        return {"concurrency": None, "limited_by": None, "reason": "no level was run"}
    knee: dict[str, Any] | None = None
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
