"""Sampled tasks over several seeds (--seeds): output i of n items x S seeds is item i % n sampled
with seed round i // n. Scores are compared paired over items and seeds: each item's outputs are
averaged over its seeds on each side, and the bootstrap resamples the items (an item keeps its
seeds together), so one seed (S = 1) gives exactly the single-seed comparison. Each model's
per-seed score shows how far a score moves from seed to seed beside the difference. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict


class SeedSpread(TypedDict):
    """One score per seed round of each model (the share flagged, or closed thinking)."""

    baseline: list[float]
    quantized: list[float]


def per_item(values: Sequence[float], items: int) -> list[float]:
    """`values` (output i: item i % items) averaged over each item's seeds."""
    if items <= 0 or len(values) <= items:
        return list(values)
    sums, counts = [0.0] * items, [0] * items
    for i, v in enumerate(values):
        sums[i % items] += v
        counts[i % items] += 1
    return [s / c for s, c in zip(sums, counts, strict=True) if c]


def per_seed(values: Sequence[float], items: int) -> list[float]:
    """The mean of `values` over each seed round's `items` outputs, round by round."""
    if items <= 0:
        return []
    rounds = [values[k:k + items] for k in range(0, len(values), items)]
    return [sum(r) / len(r) for r in rounds if r]


def spread(quant: Sequence[float], base: Sequence[float], items: int) -> SeedSpread:
    """Both models' per-seed means of a per-output score."""
    return {"baseline": per_seed(base, items), "quantized": per_seed(quant, items)}


def describe_spread(s: Mapping[str, Any] | None, what: str) -> str | None:
    """'per seed (3), flagged share: baseline 2%-5%, quantized 3%-9%' (None: one seed)."""
    if not s or len(s.get("baseline") or []) < 2:
        return None
    b, q = s["baseline"], s.get("quantized") or []

    def span(v: Sequence[float]) -> str:
        return f"{min(v):.0%}-{max(v):.0%}" if v else "—"

    return f"per seed ({len(b)}), {what}: baseline {span(b)}, quantized {span(q)}"
