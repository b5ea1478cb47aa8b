"""Run each task on the quantized model and its baseline (cached), and compare them. Which
function runs a task is the task registry's (quantkit.tasks); the built-in tasks' are here."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from quantkit import __version__, console
from quantkit.config import ValidateConfig
from quantkit.fsutil import atomic_write_text
from quantkit.validate.stats import metric, retention_metric


@dataclass(frozen=True)
class TaskContext:
    """What a task's run function gets beside the two models: its name, the validation's config
    and what validate() resolved before any model loaded."""

    name: str
    cfg: ValidateConfig
    domain_rows: list[dict[str, Any]] | None = None
    sandbox: str = "basic"


class Models:
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


def run_tasks(pair: dict[str, Any], contexts: list[TaskContext], threads: int) -> tuple[
                  dict[str, Any], dict[str, float]]:
    """Every task on both models; per task the two results and the comparison metrics."""
    from quantkit.registry import load
    from quantkit.tasks import task as task_spec

    models = Models(pair, threads)
    out: dict[str, Any] = {}
    try:
        for ctx in contexts:
            task = ctx.name
            t = time.time()
            console.log(f"task {task}")
            loads = sum(models.load_s.values())
            out[task] = load(task_spec(task).run)(models, ctx)
            total = time.time() - t - (sum(models.load_s.values()) - loads)
            mine = [v for k, v in models.baseline_s.items() if k.split("-")[0] == task]
            base = round(sum(mine), 1)
            out[task]["seconds"] = {"baseline": base, "quantized": round(total - base, 1),
                                    "baseline_cached": not mine}
    finally:
        models.close()
    return out, models.load_s


def cached_baseline(models: Models, task: str, task_settings: Any,
                    fn: Callable[[Any], Any]) -> Any:
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


def paired_retention(quant: dict[str, Any], base: dict[str, Any], key: str, seed: int
                     ) -> dict[str, Any]:
    """Retention over the documents both sides scored, paired by id (`ids` beside `key`)."""
    b = dict(zip(base["ids"], base[key]))
    q = dict(zip(quant["ids"], quant[key]))
    ids = [i for i in quant["ids"] if i in b]
    return retention_metric([q[i] for i in ids], [b[i] for i in ids], seed=seed)


def humaneval_limit(cfg: ValidateConfig) -> int | None:
    """HumanEval's problem count: its own limit, else the shared --limit."""
    return cfg.humaneval_limit or cfg.limit


def settings_record(cfg: ValidateConfig, tasks: list[str], sandbox: str) -> dict[str, Any]:
    """What results.json records of the settings the tasks ran with (written, never read back)."""
    return {"tasks": tasks, "limit": cfg.limit, "seed": cfg.seed, "mmlu_data": cfg.mmlu_data,
            "task_path": list(cfg.task_path),
            "humaneval": {"limit": humaneval_limit(cfg), "max_tokens": cfg.humaneval_max_tokens,
                          "sandbox": sandbox},
            "domain_set": cfg.domain_set, "sampling": _sampling_settings(cfg)}


def _sampling_settings(cfg: ValidateConfig) -> dict[str, Any]:
    return {"n": cfg.samples, "temperature": cfg.temperature, "top_p": cfg.top_p,
            "max_tokens": cfg.max_tokens, "seed": cfg.seed}


def mmlu_task(models: Models, ctx: TaskContext) -> dict[str, Any]:
    from pathlib import Path

    from quantkit.validate.mmlu import run_mmlu

    cfg = ctx.cfg
    data_dir = Path(cfg.mmlu_data) if cfg.mmlu_data is not None else None

    def run(engine: Any) -> dict[str, Any]:
        return run_mmlu(engine, data_dir=data_dir, limit=cfg.limit, progress=console.progress)

    base = cached_baseline(models, "mmlu", [cfg.limit, str(cfg.mmlu_data)], run)
    quant = run(models.get("quantized"))
    return {"quantized": quant, "baseline": base,
            "retention": paired_retention(quant, base, "correct", cfg.seed)}


def humaneval_task(models: Models, ctx: TaskContext) -> dict[str, Any]:
    from quantkit.validate.humaneval import PROMPT_VERSION, run_humaneval

    cfg = ctx.cfg
    he = {"limit": humaneval_limit(cfg), "max_tokens": cfg.humaneval_max_tokens,
          "sandbox": ctx.sandbox}

    def run(engine: Any) -> dict[str, Any]:
        return run_humaneval(engine, limit=humaneval_limit(cfg),
                             max_tokens=cfg.humaneval_max_tokens, sandbox=ctx.sandbox)

    base = cached_baseline(models, "humaneval", {**he, "prompt_version": PROMPT_VERSION}, run)
    quant = run(models.get("quantized"))
    ids = [i for i in quant["problems"] if i in base["problems"]]
    q = [float(quant["problems"][i]["passed"]) for i in ids]
    b = [float(base["problems"][i]["passed"]) for i in ids]
    changed = [{"task_id": i, "baseline": bool(bb), "quantized": bool(qq)}
               for i, qq, bb in zip(ids, q, b) if qq != bb]
    return {"quantized": quant, "baseline": base,
            "retention": retention_metric(q, b, seed=cfg.seed),
            "changed": changed, "sandbox": ctx.sandbox}


def domain_task(models: Models, ctx: TaskContext) -> dict[str, Any]:
    from quantkit.validate.domain import run_domain
    from quantkit.validate.stats import ppl_ratio_ci

    rows = ctx.domain_rows or []
    seed = ctx.cfg.seed
    base = cached_baseline(models, "domain", [rows], lambda e: run_domain(e, rows))
    quant = run_domain(models.get("quantized"), rows)
    res: dict[str, Any] = {"file": ctx.cfg.domain_set, "quantized": quant, "baseline": base}
    if "ppl" in quant:
        _, lo, hi = ppl_ratio_ci(quant["line_nll"], base["line_nll"], seed=seed)
        res["ppl_increase"] = metric(quant["ppl"] / base["ppl"] - 1, lo - 1, hi - 1,
                                      quant["text_lines"])
    if "qa" in quant:
        q = [float(i["correct"]) for i in quant["qa"]["items"]]
        b = [float(i["correct"]) for i in base["qa"]["items"]]
        res["qa_retention"] = retention_metric(q, b, seed=seed)
    texts = [r["text"] for r in rows if r["kind"] == "text"]
    if texts:
        from quantkit.validate import kld

        side = cached_baseline(models, "domain-kl", [rows, kld.TOP_K],
                               lambda e: kld.baseline_side(e, texts))
        res.update(kld.compare(models.get("quantized"), texts, side, seed=seed))
        from quantkit.engines.choice import ENGINES

        engine = models.pair["engine"]
        if ENGINES[engine].logprobs == "top-k":  # its prompt logprobs: each position's top k
            res["kld_rows"] = (f"{engine}: each position's top k, k raised (x8, up to "
                               f"{kld.MAX_TOP_K}) until the original's top tokens are found; "
                               "exact where uncovered_mass is 0, else an estimate")
    return res


def sampling_task(models: Models, ctx: TaskContext) -> dict[str, Any]:
    from quantkit.validate import sampling

    rows = ctx.domain_rows
    prompts = [r["prompt"] for r in rows or [] if r["kind"] == "qa"] or sampling.BUILTIN_PROMPTS
    gen = _sampling_settings(ctx.cfg)
    base = cached_baseline(models, "sampling", [prompts, gen],
                     lambda e: sampling.sample_side(e, prompts, **gen))
    # the quantized outputs are scored by the original model: how plausible it finds them
    return sampling.sample_check(models.get("quantized"), models.get("baseline"), prompts,
                                 baseline_side=base, **gen)


def long_context_task(models: Models, ctx: TaskContext) -> dict[str, Any]:
    """Facts planted in long documents, retrieved by both models on the serving engine (with
    the FP8 KV cache where the artifact carries its scales): retention of retrieval accuracy."""
    import hashlib

    from quantkit.validate.longctx import build_items, filler, run_long_context

    quant = models.get("quantized")
    items = build_items(quant.encode, quant.context_length, filler(ctx.domain_rows),
                        ctx.cfg.long_context_samples, ctx.cfg.seed)
    digest = hashlib.sha256(json.dumps([[i["ids"], i["answer"]] for i in items]).encode())
    base = cached_baseline(models, "long_context", [digest.hexdigest()],
                           lambda e: run_long_context(e, items))
    q = run_long_context(quant, items)

    def chance(side: dict[str, Any]) -> list[float]:
        return [math.exp(r["logprob"]) for r in side["items"]]

    # gated on the probability each model gives the planted code (greedy accuracy flips on near
    # ties where a small model's digits compete; the probability moves smoothly, and a broken
    # cache sends it to ~0); accuracy is reported beside it
    return {"quantized": q, "baseline": base, "kv_cache": getattr(quant, "kv_cache", "auto"),
            "retention": retention_metric(chance(q), chance(base), seed=ctx.cfg.seed),
            "accuracy_retention": retention_metric([float(r["correct"]) for r in q["items"]],
                                                   [float(r["correct"]) for r in base["items"]],
                                                   seed=ctx.cfg.seed)}


def lm_eval_task(models: Models, ctx: TaskContext) -> dict[str, Any]:
    """The validation task for lm-eval task `ctx.name`: both sides (baseline cached) and the
    retention of the quantized model's score over the same documents."""
    from quantkit.engines import Engine
    from quantkit.validate.lmeval import fingerprint, score

    cfg = ctx.cfg
    paths = tuple(cfg.task_path)

    def run(engine: Engine) -> dict[str, Any]:
        return score(engine, ctx.name, task_paths=paths, limit=cfg.limit, seed=cfg.seed,
                     progress=console.progress)

    key = [ctx.name, cfg.limit, cfg.seed, fingerprint(ctx.name, paths)]
    base = cached_baseline(models, ctx.name, key, run)
    quant = run(models.get("quantized"))
    res = {"quantized": quant, "baseline": base,
           "retention": paired_retention(quant, base, "scores", cfg.seed),
           "metric": quant["metric"], "source": "lm-eval"}
    for side in ("quantized", "baseline"):
        r = res[side]
        res[f"{side}_score"] = metric(r["value"], r["lo"], r["hi"], r["n"])
    return res


def cache_key(baseline_sha256: str, engine: str, task: str, settings: Any) -> str:
    """Baseline results are reused when model (its identity: weights, config and tokenizer),
    engine, task settings and quantkit agree."""
    import hashlib

    blob = json.dumps([baseline_sha256, engine, task, settings, __version__], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]
