"""Run each task on the quantized model and its baseline (cached), and compare them."""

from __future__ import annotations

import json
import math
import time
from typing import Any, Callable

from quantkit import console


class _Models:
    """The two engines, loaded when first needed (a fully cached baseline is never loaded)."""

    def __init__(self, pair: dict[str, Any], threads: int) -> None:
        self.pair, self.threads, self.loaded, self.load_s = pair, threads, {}, {}

    def get(self, which: str) -> Any:
        if which not in self.loaded:
            from quantkit.engines import engine_for

            t = time.time()
            path = self.pair[f"{which}_path"]
            console.log(f"loading the {which} model ({self.pair['engine']}): {path}")
            self.loaded[which] = engine_for(path, threads=self.threads)
            self.load_s[f"load_{which}_s"] = round(time.time() - t, 1)
        return self.loaded[which]

    def close(self) -> None:
        for engine in self.loaded.values():
            engine.close()


def run_tasks(pair: dict[str, Any], tasks: list[str], settings: dict[str, Any],
              domain_rows: list[dict[str, Any]] | None, threads: int) -> tuple[
                  dict[str, Any], dict[str, float]]:
    """Every task on both models; per task the two results and the comparison metrics."""
    models = _Models(pair, threads)
    out: dict[str, Any] = {}
    try:
        for task in tasks:
            t = time.time()
            console.log(f"task {task}")
            out[task] = RUNNERS[task](models, settings, domain_rows)
            out[task]["seconds"] = round(time.time() - t, 1)
    finally:
        models.close()
    return out, models.load_s


def _baseline(models: _Models, task: str, task_settings: Any, fn: Callable[[Any], Any]) -> Any:
    """The baseline's result of a task from the cache, or computed and stored."""
    from quantkit.models import quantkit_home
    from quantkit.validate import cache_key

    key = cache_key(models.pair["baseline_sha256"], models.pair["engine"], task, task_settings)
    file = quantkit_home() / "validate-cache" / f"{task}-{key}.json"
    if file.is_file():
        console.log(f"{task}: baseline results from the cache ({file.name})")
        return json.loads(file.read_text())
    result = fn(models.get("baseline"))
    file.parent.mkdir(parents=True, exist_ok=True)
    part = file.with_suffix(".part")
    part.write_text(json.dumps(result))
    part.replace(file)
    return result


def _metric(value: float, lo: float, hi: float, n: int) -> dict[str, Any]:
    clean = [None if isinstance(v, float) and math.isnan(v) else v for v in (value, lo, hi)]
    return {"value": clean[0] if clean[0] is not None else float("nan"), "lo": clean[1],
            "hi": clean[2], "n": n}


def _mmlu(models: _Models, settings: dict[str, Any], _rows: Any) -> dict[str, Any]:
    from pathlib import Path

    from quantkit.validate.mmlu import run_mmlu
    from quantkit.validate.stats import ratio_ci_paired

    data = settings["mmlu_data"]
    data_dir = Path(data) if data and data != "None" else None

    def run(engine: Any) -> dict[str, Any]:
        return run_mmlu(engine, data_dir=data_dir, limit=settings["limit"])

    base = _baseline(models, "mmlu", [settings["limit"], settings["mmlu_data"]], run)
    quant = run(models.get("quantized"))
    b = dict(zip(base["ids"], base["correct"]))
    ids = [i for i in quant["ids"] if i in b]
    value, lo, hi = ratio_ci_paired([quant["correct"][quant["ids"].index(i)] for i in ids],
                                    [b[i] for i in ids], seed=settings["seed"])
    return {"quantized": quant, "baseline": base, "retention": _metric(value, lo, hi, len(ids))}


def _humaneval(models: _Models, settings: dict[str, Any], _rows: Any) -> dict[str, Any]:
    from quantkit.validate.humaneval import run_humaneval
    from quantkit.validate.stats import ratio_ci_paired

    he = settings["humaneval"]

    def run(engine: Any) -> dict[str, Any]:
        return run_humaneval(engine, limit=he["limit"], max_tokens=he["max_tokens"])

    base = _baseline(models, "humaneval", he, run)
    quant = run(models.get("quantized"))
    ids = [i for i in quant["problems"] if i in base["problems"]]
    q = [float(quant["problems"][i]["passed"]) for i in ids]
    b = [float(base["problems"][i]["passed"]) for i in ids]
    value, lo, hi = ratio_ci_paired(q, b, seed=settings["seed"])
    changed = [{"task_id": i, "baseline": bool(bb), "quantized": bool(qq)}
               for i, qq, bb in zip(ids, q, b) if qq != bb]
    return {"quantized": quant, "baseline": base, "retention": _metric(value, lo, hi, len(ids)),
            "changed": changed}


def _domain(models: _Models, settings: dict[str, Any], rows: Any) -> dict[str, Any]:
    from quantkit.validate.domain import run_domain
    from quantkit.validate.stats import ppl_ratio_ci, ratio_ci_paired

    base = _baseline(models, "domain", [rows], lambda e: run_domain(e, rows))
    quant = run_domain(models.get("quantized"), rows)
    res: dict[str, Any] = {"file": settings["domain_set"], "quantized": quant, "baseline": base}
    if "ppl" in quant:
        _, lo, hi = ppl_ratio_ci(quant["line_nll"], base["line_nll"], seed=settings["seed"])
        res["ppl_increase"] = _metric(quant["ppl"] / base["ppl"] - 1, lo - 1, hi - 1,
                                      quant["text_lines"])
    if "qa" in quant:
        q = [float(i["correct"]) for i in quant["qa"]["items"]]
        b = [float(i["correct"]) for i in base["qa"]["items"]]
        res["qa_retention"] = _metric(*ratio_ci_paired(q, b, seed=settings["seed"]), len(q))
    return res


def _sampling(models: _Models, settings: dict[str, Any], rows: Any) -> dict[str, Any]:
    from quantkit.validate import sampling

    s = settings["sampling"]
    prompts = [r["prompt"] for r in rows or [] if r["kind"] == "qa"] or sampling.BUILTIN_PROMPTS
    gen = {k: s[k] for k in ("n", "temperature", "top_p", "max_tokens", "seed")}

    def run(engine: Any) -> dict[str, Any]:
        outputs = sampling.generate_outputs(engine, prompts, **gen)
        return sampling.summarize(sampling.score_outputs(outputs, engine))

    base = _baseline(models, "sampling", [prompts, gen], run)
    quant_outputs = sampling.generate_outputs(models.get("quantized"), prompts, **gen)
    # how likely the original model finds the quantized outputs
    quant = sampling.summarize(sampling.score_outputs(quant_outputs, models.get("baseline")))
    from quantkit.validate.stats import diff_ci_paired

    q = [float(bool(o["flags"])) for o in quant["outputs"]]
    b = [float(bool(o["flags"])) for o in base["outputs"]]
    value, lo, hi = diff_ci_paired(q, b, seed=s["seed"])
    return {"settings": gen, "quantized": quant, "baseline": base,
            "flagged_increase": _metric(value, lo, hi, len(q))}


RUNNERS: dict[str, Callable[[_Models, dict[str, Any], Any], dict[str, Any]]] = {
    "mmlu": _mmlu, "humaneval": _humaneval, "domain": _domain, "sampling": _sampling}
