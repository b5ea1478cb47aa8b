"""Run each task on the quantized model and its baseline (cached), and compare them."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from quantkit import __version__, console
from quantkit.fsutil import atomic_write_text
from quantkit.validate.stats import metric


class _Models:
    """The two engines, loaded when first needed (a fully cached baseline is never loaded)."""

    def __init__(self, pair: dict[str, Any], threads: int) -> None:
        self.pair, self.threads = pair, threads
        self.loaded: dict[str, Any] = {}
        self.load_s: dict[str, float] = {}
        self.baseline_s: dict[str, float] = {}  # per task; absent when the cache answered

    def get(self, which: str) -> Any:
        if which not in self.loaded:
            from quantkit.engines import engine_for

            t = time.time()
            path = self.pair[f"{which}_path"]
            console.log(f"loading the {which} model ({self.pair['engine']}): {path}")
            self.loaded[which] = engine_for(path, threads=self.threads,
                                            engine=self.pair["engine"])
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
            loads = sum(models.load_s.values())
            out[task] = RUNNERS[task](models, settings, domain_rows)
            total = time.time() - t - (sum(models.load_s.values()) - loads)
            mine = [v for k, v in models.baseline_s.items() if k.split("-")[0] == task]
            base = round(sum(mine), 1)
            out[task]["seconds"] = {"baseline": base, "quantized": round(total - base, 1),
                                    "baseline_cached": not mine}
    finally:
        models.close()
    return out, models.load_s


def _baseline(models: _Models, task: str, task_settings: Any, fn: Callable[[Any], Any]) -> Any:
    """The baseline's result of a task from the cache, or computed and stored."""
    from quantkit.models import quantkit_home

    key = cache_key(models.pair["baseline_sha256"], models.pair["engine"], task, task_settings)
    file = quantkit_home() / "validate-cache" / f"{task}-{key}.json"
    if file.is_file():
        console.log(f"{task}: baseline results from the cache ({file.name})")
        return json.loads(file.read_text())
    engine = models.get("baseline")  # its load time is in load_s, which run_tasks leaves out
    t = time.time()
    result = fn(engine)
    models.baseline_s[task] = round(time.time() - t, 1)
    file.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(file, json.dumps(result))
    return result


def _mmlu(models: _Models, settings: dict[str, Any], _rows: Any) -> dict[str, Any]:
    from pathlib import Path

    from quantkit.validate.mmlu import run_mmlu
    from quantkit.validate.stats import retention_metric

    data = settings["mmlu_data"]
    data_dir = Path(data) if data and data != "None" else None

    def run(engine: Any) -> dict[str, Any]:
        return run_mmlu(engine, data_dir=data_dir, limit=settings["limit"])

    base = _baseline(models, "mmlu", [settings["limit"], settings["mmlu_data"]], run)
    quant = run(models.get("quantized"))
    b = dict(zip(base["ids"], base["correct"]))
    ids = [i for i in quant["ids"] if i in b]
    retention = retention_metric([quant["correct"][quant["ids"].index(i)] for i in ids],
                                 [b[i] for i in ids], seed=settings["seed"])
    return {"quantized": quant, "baseline": base, "retention": retention}


def _humaneval(models: _Models, settings: dict[str, Any], _rows: Any) -> dict[str, Any]:
    from quantkit.validate.humaneval import PROMPT_VERSION, run_humaneval
    from quantkit.validate.stats import retention_metric

    he = settings["humaneval"]

    def run(engine: Any) -> dict[str, Any]:
        return run_humaneval(engine, limit=he["limit"], max_tokens=he["max_tokens"],
                             sandbox=he["sandbox"])

    base = _baseline(models, "humaneval", {**he, "prompt_version": PROMPT_VERSION}, run)
    quant = run(models.get("quantized"))
    ids = [i for i in quant["problems"] if i in base["problems"]]
    q = [float(quant["problems"][i]["passed"]) for i in ids]
    b = [float(base["problems"][i]["passed"]) for i in ids]
    changed = [{"task_id": i, "baseline": bool(bb), "quantized": bool(qq)}
               for i, qq, bb in zip(ids, q, b) if qq != bb]
    return {"quantized": quant, "baseline": base,
            "retention": retention_metric(q, b, seed=settings["seed"]),
            "changed": changed, "sandbox": he["sandbox"]}


def _domain(models: _Models, settings: dict[str, Any], rows: Any) -> dict[str, Any]:
    from quantkit.validate.domain import run_domain
    from quantkit.validate.stats import ppl_ratio_ci, retention_metric

    base = _baseline(models, "domain", [rows], lambda e: run_domain(e, rows))
    quant = run_domain(models.get("quantized"), rows)
    res: dict[str, Any] = {"file": settings["domain_set"], "quantized": quant, "baseline": base}
    if "ppl" in quant:
        _, lo, hi = ppl_ratio_ci(quant["line_nll"], base["line_nll"], seed=settings["seed"])
        res["ppl_increase"] = metric(quant["ppl"] / base["ppl"] - 1, lo - 1, hi - 1,
                                      quant["text_lines"])
    if "qa" in quant:
        q = [float(i["correct"]) for i in quant["qa"]["items"]]
        b = [float(i["correct"]) for i in base["qa"]["items"]]
        res["qa_retention"] = retention_metric(q, b, seed=settings["seed"])
    texts = [r["text"] for r in rows if r["kind"] == "text"]
    if texts:
        from quantkit.validate import kld

        side = _baseline(models, "domain-kl", [rows, kld.TOP_K],
                         lambda e: kld.baseline_side(e, texts))
        res.update(kld.compare(models.get("quantized"), texts, side, seed=settings["seed"]))
        if models.pair["engine"] == "vllm":  # its prompt logprobs are each position's top-k
            res["kld_rows"] = "vLLM top-256 per position, the rest spread evenly (an estimate)"
    return res


def _sampling(models: _Models, settings: dict[str, Any], rows: Any) -> dict[str, Any]:
    from quantkit.validate import sampling

    s = settings["sampling"]
    prompts = [r["prompt"] for r in rows or [] if r["kind"] == "qa"] or sampling.BUILTIN_PROMPTS
    gen = {k: s[k] for k in ("n", "temperature", "top_p", "max_tokens", "seed")}
    base = _baseline(models, "sampling", [prompts, gen],
                     lambda e: sampling.sample_side(e, prompts, **gen))
    # the quantized outputs are scored by the original model: how plausible it finds them
    return sampling.sample_check(models.get("quantized"), models.get("baseline"), prompts,
                                 baseline_side=base, **gen)


RUNNERS: dict[str, Callable[[_Models, dict[str, Any], Any], dict[str, Any]]] = {
    "mmlu": _mmlu, "humaneval": _humaneval, "domain": _domain, "sampling": _sampling}


def cache_key(baseline_sha256: str, engine: str, task: str, settings: Any) -> str:
    """Baseline results are reused when model, engine, task settings and quantkit agree."""
    import hashlib

    blob = json.dumps([baseline_sha256, engine, task, settings, __version__], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]
