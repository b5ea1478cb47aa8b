"""Run each task on the quantized model and its baseline (cached), and compare them. Which
function runs a task is the task registry's (quantkit.task_registry); each built-in task's is in
its own module of quantkit.tasks (mmlu.py, humaneval.py, domain.py, sampling.py,
long_context.py), which calls this package's work (validate/mmlu.py, ...); an lm-eval task's is
validate/lmeval.py's."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from quantkit import __version__, console
from quantkit.config import ValidateConfig
from quantkit.contract import MetricValue, ModelPair, TaskResult, TaskSeconds
from quantkit.errors import EngineError, QuantkitError
from quantkit.fsutil import atomic_write_text
from quantkit.registry import load
from quantkit.task_registry import TASKS, Prepared
from quantkit.task_registry import task as task_spec
from quantkit.validate.stats import retention_metric

if TYPE_CHECKING:
    from quantkit.engines.base import Engine
    from quantkit.validate.served import Served


@dataclass(frozen=True)
class TaskContext:
    """What a task's run function gets beside the two models: its name, the validation's config,
    its own options (`cfg.options(name)`), what its `prepare` returned before any model
    loaded (`data`, and the warning it gave), and how a thinking model is run (`thinking`:
    validate/served.py's; None for a model without a thinking mode)."""

    name: str
    cfg: ValidateConfig
    options: Any = None
    data: Any = None
    warning: str | None = None
    thinking: Served | None = None


class Models:
    """The two engines, loaded when first needed (a fully cached baseline is never loaded)."""

    def __init__(self, pair: ModelPair, threads: int) -> None:
        self.pair, self.threads = pair, threads
        self.loaded: dict[str, Engine] = {}
        self.load_s: dict[str, float] = {}
        self.baseline_s: dict[str, float] = {}  # per task; absent when the cache answered
        self.load_peaks: dict[str, float] = {}  # peak GPU memory in use once loaded (GiB)

    def get(self, which: str) -> Any:
        if which not in self.loaded:
            from quantkit.engines import engine_for
            from quantkit.meter import meter

            path = self.pair.path(which)
            console.log(f"loading the {which} model ({self.pair.engine}): {path}")
            with meter() as use:
                self.loaded[which] = engine_for(path, threads=self.threads,
                                                engine=self.pair.engine)
            self.load_s[f"load_{which}_s"] = round(use.seconds, 1)
            if use.peak_gpu_gib is not None:
                self.load_peaks[f"load_{which}_peak_gpu_gib"] = round(use.peak_gpu_gib, 2)
        return self.loaded[which]

    def close(self) -> None:
        for engine in self.loaded.values():
            engine.close()


# What a task's functions are called as (`Task.run`, `Task.prepare`, `Task.settings`, named in the
# task registry, which stands below validation's types): each built-in task module holds its
# functions against these, so mypy checks them; a plugin's are named "module:function"


class RunTask(Protocol):
    """A task's run (`Task.run`, which run_tasks calls): both models (loaded when first asked) and
    its context -> its result (a plugin's may be the dict results.json holds, read into a
    TaskResult)."""

    def __call__(self, models: Models, ctx: TaskContext, /) -> TaskResult | Mapping[str, Any]: ...


class PrepareTask(Protocol):
    """A task's `prepare` (prepare_tasks calls it): the validation's config and the task's name ->
    its data, checked."""

    def __call__(self, cfg: ValidateConfig, name: str, /) -> Prepared: ...


class TaskSettings(Protocol):
    """A task's `settings` (settings_of calls it): config, name and its prepared data (None where
    it does not run) -> its part of results.json's `settings` (open JSON: a plugin's task names
    its own keys, so settings_of's and settings_record's dicts stay open too)."""

    def __call__(self, cfg: ValidateConfig, name: str, data: Any, /) -> dict[str, Any]: ...


def prepare_tasks(cfg: ValidateConfig, names: list[str]) -> dict[str, Prepared]:
    """Each task's `prepare` on the ValidateConfig, in order: every task's data read and
    checked before any model loads (BadInput names what is wrong)."""
    out = {}
    for name in names:
        ref = task_spec(name).prepare
        prepare: PrepareTask | None = None if ref is None else load(ref)
        out[name] = prepare(cfg, name) if prepare is not None else Prepared()
    return out


def settings_of(cfg: ValidateConfig, prepared: dict[str, Prepared]) -> dict[str, Any]:
    """What results.json's `settings` records of each registered task's own options (those that
    did not run too: the record's keys do not depend on --tasks)."""
    out: dict[str, Any] = {}
    for name in TASKS.names():
        ref = TASKS[name].settings
        if ref is not None:
            done = prepared.get(name)
            settings: TaskSettings = load(ref)
            out.update(settings(cfg, name, done.data if done is not None else None))
    return out


def run_tasks(pair: ModelPair, contexts: list[TaskContext], threads: int,
              finished: Path | None = None) -> tuple[dict[str, TaskResult], dict[str, float]]:
    """Every task on both models; per task the two results, the comparison metrics, the seconds
    of each side and what the task cost (`resources`: wall time, peak CPU and GPU memory).

    `finished`: a folder where each task's result is kept as it completes (validate's
    `.OUT.partial`), so a validation cut off (a time limit, preemption, Ctrl-C) and run again
    with the same models and options reruns only the tasks it had not finished."""
    from quantkit.meter import meter

    models = Models(pair, threads)
    out: dict[str, TaskResult] = {}
    try:
        for ctx in contexts:
            task = ctx.name
            kept = finished / f"{task}.json" if finished is not None else None
            key = task_key(pair, ctx)
            if kept is not None and kept.is_file():
                prev = json.loads(kept.read_text())
                if prev.get("key") == key:
                    console.log(f"task {task}: reusing its result from the interrupted "
                                f"validation ({kept})")
                    out[task] = TaskResult.from_dict(prev["result"])
                    continue
            t = time.time()
            console.log(f"task {task}")
            loads = sum(models.load_s.values())
            try:
                with meter() as use:
                    result = run_one(models, ctx)
            except QuantkitError as exc:
                if isinstance(exc, EngineError):  # the task named, its hint kept
                    raise EngineError(f"task {task}: {exc.message}", exc.hint) from exc
                raise
            except Exception as exc:  # noqa: BLE001 - the task named; run names its step
                raise EngineError(f"task {task}: {type(exc).__name__}: "
                                  f"{' '.join(str(exc).split())[:400]}",
                                  "the tasks that finished are kept for the rerun") from exc
            total = time.time() - t - (sum(models.load_s.values()) - loads)
            mine = [v for k, v in models.baseline_s.items() if k.split("-")[0] == task]
            base = round(sum(mine), 1)
            out[task] = dataclasses.replace(
                result, seconds=TaskSeconds(base, round(total - base, 1), not mine),
                resources=use.to_dict())
            if kept is not None:
                kept.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(kept, json.dumps({"key": key, "result": out[task].to_dict()}))
    finally:
        models.close()
    return out, {**models.load_s, **models.load_peaks}


def run_one(models: Models, ctx: TaskContext) -> TaskResult:
    """Task `ctx.name`'s run (its `Task.run`, imported now): its TaskResult, a plugin's dict read
    into one."""
    run: RunTask = load(task_spec(ctx.name).run)
    return TaskResult.of(run(models, ctx))


def task_key(pair: ModelPair, ctx: TaskContext) -> str:
    """What a task's result depends on: both models (identity, engine, dtype), the shared
    options, the task's own options and data, and quantkit's version (thresholds are not: the
    gate reads the result)."""
    import hashlib

    opts = ctx.options
    own = dataclasses.asdict(opts) if dataclasses.is_dataclass(opts) and \
        not isinstance(opts, type) else opts
    parts = [pair.artifact_sha256, pair.baseline_sha256, pair.engine, pair.dtype, ctx.name,
             ctx.cfg.limit, ctx.cfg.seed, list(ctx.cfg.task_path), own, ctx.data, __version__]
    if ctx.thinking is not None:  # a model without a thinking mode keeps the key it had
        parts.append(ctx.thinking.record())
    if pair.mode is not None:  # so does an engine that names no mode
        parts.append({"engine_mode": pair.mode})
    if str(ctx.cfg.seeds) not in ("auto", "1") or ctx.thinking is not None:
        parts.append({"seeds": str(ctx.cfg.seeds)})
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def cached_baseline(models: Models, task: str, task_settings: Any,
                    fn: Callable[[Any], Any]) -> Any:
    """The baseline's result of a task from the cache, or computed and stored."""
    from quantkit.models import quantkit_home

    key = cache_key(models.pair.baseline_sha256, models.pair.engine, task, task_settings,
                    models.pair.dtype, models.pair.mode)
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


def paired_retention(quant: Mapping[str, Any], base: Mapping[str, Any], key: str, seed: int
                     ) -> MetricValue:
    """Retention over the documents both sides scored, paired by id (`ids` beside `key`)."""
    b = dict(zip(base["ids"], base[key]))
    q = dict(zip(quant["ids"], quant[key]))
    ids = [i for i in quant["ids"] if i in b]
    return retention_metric([q[i] for i in ids], [b[i] for i in ids], seed=seed)


def settings_record(cfg: ValidateConfig, tasks: list[str], prepared: dict[str, Prepared],
                    dtype: str | None = None, thinking: Served | None = None,
                    mode: str | None = None) -> dict[str, Any]:
    """What results.json records of the settings the tasks ran with (written, never read back):
    the shared options, the dtype the engine computed in and how it ran where it says, the
    thinking mode and budget where the model thinks, then each task's own (its `settings`)."""
    return {"tasks": tasks, "limit": cfg.limit, "seed": cfg.seed,
            "task_path": list(cfg.task_path), **({"dtype": dtype} if dtype else {}),
            **({"engine_mode": mode} if mode else {}),
            **({"thinking": thinking.record()} if thinking is not None else {}),
            **({"seeds": cfg.seeds} if thinking is not None or str(cfg.seeds) not in
               ("auto", "1") else {}),
            **settings_of(cfg, prepared)}


def cache_key(baseline_sha256: str, engine: str, task: str, settings: Any,
              dtype: str | None = None, mode: str | None = None) -> str:
    """Baseline results are reused when model (its identity: weights, config and tokenizer),
    engine, the dtype it computes in and how it runs (where it says), task settings and quantkit
    agree."""
    import hashlib

    parts = [baseline_sha256, engine, task, settings, __version__] + ([dtype] if dtype else []) \
        + ([{"engine_mode": mode}] if mode else [])
    blob = json.dumps(parts, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]
