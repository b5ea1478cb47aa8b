"""Greedy next-token agreement of the two models on a few prompts."""

from __future__ import annotations

from typing import Any

from quantkit.tasks import Metric, Task

PROMPTS = ["def add(a, b):", "import os", "The capital of", "for i in range("]


def agreement(models: Any, ctx: Any) -> dict[str, Any]:
    """The task's run: both sides' greedy next token, their agreement and its retention."""
    from quantkit.validate.stats import metric, retention_metric

    prompts = PROMPTS[:ctx.options.agree_prompts]

    def side(engine: Any) -> dict[str, Any]:
        return {"tokens": [engine.generate(p, max_tokens=1, temperature=0.0).text for p in prompts]}

    base, quant = side(models.get("baseline")), side(models.get("quantized"))
    same = [float(a == b) for a, b in zip(base["tokens"], quant["tokens"])]
    return {"quantized": quant, "baseline": base,
            "agreement": metric(sum(same) / len(same), 0.0, 1.0, len(same)),
            "retention": retention_metric(same, [1.0] * len(same), seed=ctx.cfg.seed)}


def settings(cfg: Any, name: str, data: Any) -> dict[str, Any]:
    """What results.json's settings record of the task: its prompt count."""
    return {name: {"prompts": cfg.options(name).agree_prompts}}


METRICS = {"agreement": Metric(">=", 0.0, 1.0, "greedy next-token match"),
           "retention": Metric(">=", 0.0, 1.5, "agreement / 1")}
AGREE = Task("agree", run="quantkit_toy_plugin.task:agreement", title="Toy agreement",
             metrics=METRICS, default=False, options="quantkit_toy_plugin.options:AgreeOptions",
             settings="quantkit_toy_plugin.task:settings")
