"""Sampled tasks over several seeds (issue 48, item 4): each item's seeds averaged before the
paired bootstrap, so one seed is the single-seed comparison, and each model's per-seed spread."""

from __future__ import annotations

from quantkit.config import ValidateConfig
from quantkit.validate.seeds import describe_spread, per_item, per_seed, spread


def test_items_are_averaged_over_their_seeds():
    values = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]  # 2 items x 3 seeds: item = i % 2
    assert per_item(values, 2) == [2 / 3, 1 / 3]
    assert per_item(values[:2], 2) == values[:2]  # one seed: unchanged
    assert per_seed(values, 2) == [0.5, 0.5, 0.5]
    s = spread([1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0], 2)
    assert s == {"baseline": [0.0, 0.5], "quantized": [1.0, 0.0]}
    assert describe_spread(s, "flagged share") == (
        "per seed (2), flagged share: baseline 0%-50%, quantized 0%-100%")
    assert describe_spread({"baseline": [0.1], "quantized": [0.2]}, "x") is None


def test_auto_seeds_are_three_only_for_a_thinking_model_that_samples():
    auto = ValidateConfig()
    assert auto.seeds_for(thinks=True, temperature=0.9) == 3
    assert auto.seeds_for(thinks=False, temperature=0.9) == 1
    assert auto.seeds_for(thinks=True, temperature=0.0) == 1
    assert ValidateConfig(seeds="5").seeds_for(thinks=False, temperature=0.9) == 5
