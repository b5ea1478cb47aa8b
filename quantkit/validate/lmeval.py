"""Any lm-evaluation-harness task as a validation task: lm-eval's own task definitions (its
registry, plus `--task-path` folders searched as its include path), templates, few-shot settings
and per-sample metrics, scored on a quantkit `Engine` through a three-method lm-eval adapter.

Each side gets the task's main metric (the first in its metric list, first filter) with a bootstrap
interval; the comparison is `retention` with a paired interval over the same documents.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from quantkit.contract import TaskResult
from quantkit.engines import Engine
from quantkit.errors import BadInput, EngineError
from quantkit.task_registry import Prepared, lm_eval_manager

if TYPE_CHECKING:
    from lm_eval.api.group import Group
    from lm_eval.api.task import Task

    from quantkit.validate.runner import Models, PrepareTask, RunTask, TaskContext

CHUNK_QUESTIONS = 256  # contexts per engine.loglikelihood call (unless the engine says
# `batch_prompts`): big batches, yet some progress
FEWSHOT_SEED = 1234  # lm-eval's own default fewshot seed
Progress = Callable[[Iterable[Any], str, int], Iterator[Any]]  # the shape of console.progress


class LoadedTasks(TypedDict):
    """lm-eval's TaskManager.load result (its TaskDict): every leaf task by name, the groups and
    each group's children."""

    tasks: dict[str, Task]
    groups: NotRequired[dict[str, Group]]
    group_map: NotRequired[dict[str, list[str]]]


class SubtaskScore(TypedDict):
    """One leaf task of an lm-eval side: its main metric, the filter read, the mean, documents,
    few-shot count."""

    metric: str
    filter: str | None
    value: float
    n: int
    num_fewshot: int


class LmEvalSide(TypedDict):
    """One model on an lm-eval task or group (`score`): the main metric's mean with its bootstrap
    interval, each document's score in a stable order (`ids` beside `scores`) so two models'
    runs pair up, and each leaf task's own."""

    task: str
    metric: str
    value: float
    lo: float
    hi: float
    n: int
    ids: list[str]
    scores: list[float]
    subtasks: dict[str, SubtaskScore]
    source: str


@functools.cache
def adapter_class() -> type:
    """`QuantkitLM`, an lm_eval `LM` subclass; built on first use so lm_eval imports lazily."""
    from lm_eval.api.model import LM

    class QuantkitLM(LM):
        """lm-eval's three request types on a quantkit Engine, tokenized the way HFLM does."""

        def __init__(self, engine: Engine, progress: Progress | None = None,
                     label: str = "lm-eval", encoded: Encoded | None = None) -> None:
            super().__init__()
            self.engine = engine
            self.progress = progress
            self.label = label
            self.encoded = encoded
            self.seconds = {"encode": 0.0, "engine": 0.0}  # where a run's time went

        def _encode_pairs(self, args: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
            """(context ids, continuation ids) of each request, as lm-eval's
            TemplateLM._encode_pair makes them: the whole text's tokens after the context's
            (trailing context spaces move to the continuation). Texts are encoded in batched
            calls where the engine has them (`encode_many`: a fast tokenizer encodes a batch on
            every core), and `context + continuation` through `split_encode`: MMLU's five
            5-shot texts a question share one few-shot head."""
            timer = time.perf_counter()
            with_context = [(c, x) for c, x in args if c]
            key = encoding_key(self.engine, with_context) if self.encoded is not None else None
            if key is not None and self.encoded is not None and key in self.encoded:
                ids = self.encoded[key]  # the other model's, with the same tokenizer
            else:
                ids = split_encode(self._encode_many, with_context)
                if key is not None and self.encoded is not None:
                    self.encoded[key] = ids
            pairs = []
            for context, continuation in args:
                if not context:  # as HFLM without a BOS token: EOS stands in for the context
                    pairs.append(([min(self.engine.eos_token_ids)],
                                  self.engine.encode(continuation)))
                    continue
                ctx = ids[context.rstrip()]
                pairs.append((ctx, ids[context + continuation][len(ctx):]))
            self.seconds["encode"] += time.perf_counter() - timer
            return pairs

        def _encode_many(self, texts: list[str]) -> list[list[int]]:
            many = getattr(self.engine, "encode_many", None)
            return many(texts) if many is not None else [self.engine.encode(t) for t in texts]

        def loglikelihood(self, requests: list[Any]) -> list[tuple[float, bool]]:
            """(log-probability, is-greedy) of each (context, continuation)."""
            pairs = self._encode_pairs([r.args for r in requests])
            # requests sharing a context stay in one call, so the engine can share their forward
            by_context: dict[tuple[int, ...], list[int]] = {}
            for i, (ctx, _) in enumerate(pairs):
                by_context.setdefault(tuple(ctx), []).append(i)
            groups = list(by_context.values())
            size = getattr(self.engine, "batch_prompts", CHUNK_QUESTIONS)  # where it says
            chunks = [sum(groups[s:s + size], []) for s in range(0, len(groups), size)]
            if self.progress is not None:
                chunks = list(self.progress(chunks, self.label, len(chunks)))
            out: list[tuple[float, bool]] = [(0.0, False)] * len(pairs)
            timer = time.perf_counter()
            for chunk in chunks:
                for i, res in zip(chunk, self.engine.loglikelihood([pairs[i] for i in chunk])):
                    out[i] = (float(res[0]), bool(res[1]))
            self.seconds["engine"] += time.perf_counter() - timer
            return out

        def loglikelihood_rolling(self, requests: list[Any]) -> list[float]:
            """Log-probability of each whole text."""
            # token_nlls scores every token after the first; the first is scored too where the
            # engine puts a BOS token in front (as TransformersEngine does)
            return [-sum(self.engine.token_nlls(self.engine.encode(r.args[0]))) for r in requests]

        def generate_until(self, requests: list[Any]) -> list[str]:
            """Greedy continuation of each context, cut at its `until` strings."""
            out = []
            for r in requests:
                context, kwargs = r.args[0], dict(r.args[1] or {})
                until = kwargs.get("until") or []
                until = [until] if isinstance(until, str) else list(until)
                gen = self.engine.generate(context, temperature=0.0, stop=until or None,
                                           max_tokens=int(kwargs.get("max_gen_toks", 256)))
                text = gen.text
                for stop in until:  # lm-eval cuts at the first stop string, whatever the engine did
                    text = text.split(stop)[0]
                out.append(text)
            return out

    return QuantkitLM


# the token ids of a run's texts (split_encode's), by encoding_key: a task's two sides share
# one, so the second model, with the same tokenizer, does not tokenize the same texts again
# (MMLU's 14,042 five-shot questions: 37-44 s a model on an H100's host, docs/BENCHMARKS.md)
Encoded = dict[str, dict[str, list[int]]]


def encoding_key(engine: Engine, pairs: list[tuple[str, str]]) -> str | None:
    """The engine's tokenizer and the texts, as one digest; None where the engine cannot name
    its tokenizer (`tokenizer_fingerprint`), so nothing is shared."""
    import hashlib

    fingerprint = getattr(engine, "tokenizer_fingerprint", None)
    tokenizer = fingerprint() if callable(fingerprint) else None
    if tokenizer is None:
        return None
    h = hashlib.sha256(tokenizer.encode())
    for context, continuation in pairs:
        h.update(b"\0" + context.encode() + b"\1" + continuation.encode())
    return h.hexdigest()


SPLIT_AT = "\n\n"  # where a few-shot prompt's shared head ends (lm-eval's fewshot_delimiter)


def split_encode(encode_many: Callable[[list[str]], list[list[int]]],
                 pairs: list[tuple[str, str]]) -> dict[str, list[int]]:
    """The token ids of each pair's context (trailing spaces stripped) and of its
    `context + continuation`, each exactly as the whole string encodes.

    A context is encoded whole. `context + continuation` is encoded as the context's head before
    its last few-shot delimiter, shared by every question of a task and encoded once, followed
    by the rest: for MMLU, 56,168 five-shot texts of about 700 tokens become 57 heads and the
    questions. The split is used only where the head's ids followed by the rest's are exactly
    the context's own ids (checked for each context); the text's split sits at the same place,
    among the same characters, with the question between it and the continuation. Any other
    text is encoded whole."""
    contexts = list(dict.fromkeys(c.rstrip() for c, _ in pairs))
    ids = dict(zip(contexts, encode_many(contexts)))
    cut: dict[str, int] = {}
    for c in contexts:
        # before the delimiter: a tokenizer keeps "\n\n" whole before a word, not at a text's end
        k = c.rfind(SPLIT_AT)
        if k > 0 and len(c) - k > 2 * len(SPLIT_AT):  # a head, and a question after it
            cut[c] = k
    heads = list(dict.fromkeys(c[:k] for c, k in cut.items()))
    head_ids = dict(zip(heads, encode_many(heads)))
    checked = encode_many([c[k:] for c, k in cut.items()])
    good = {c: k for (c, k), tail in zip(cut.items(), checked) if head_ids[c[:k]] + tail == ids[c]}
    texts: dict[str, int] = {}  # each text not yet encoded -> where it splits (0: whole)
    for c, x in pairs:
        if c + x not in ids:
            texts.setdefault(c + x, good.get(c.rstrip(), 0))
    todo = list(texts)
    for t, rest in zip(todo, encode_many([t[texts[t]:] for t in todo])):
        k = texts[t]
        ids[t] = head_ids[t[:k]] + rest if k else rest
    return ids


def load_tasks(name: str, task_paths: tuple[str, ...]) -> LoadedTasks:
    """lm-eval's TaskDict for `name` with its data loaded; a task lm-eval cannot build (bad
    template, missing data, offline hub) is BadInput."""
    from datasets.exceptions import DatasetGenerationError

    _offline_if_local(name, task_paths)
    try:
        loaded = lm_eval_manager(tuple(task_paths)).load([name])
    except (OSError, ValueError, KeyError, TypeError, AttributeError,
            DatasetGenerationError) as exc:
        raise BadInput(f"lm-eval cannot load task {name!r}: {' '.join(str(exc).split())[:300]}",
                       "check the task's YAML and data files (offline: local data only)") from exc
    return loaded


def evaluate_docs(engine: Engine, loaded: LoadedTasks, *, limit: int | None,
                  progress: Progress | None, label: str,
                  seconds: dict[str, float] | None = None, encoded: Encoded | None = None
                  ) -> dict[str, list[dict[str, Any]]]:
    """lm-eval's own evaluation of `loaded` (a TaskManager.load result) on a quantkit engine:
    each leaf task's logged documents, in doc_id order (lm-eval's open JSON: a key per metric).
    `seconds`, where given, gets where the time went: `lm_eval` (building requests, scoring),
    `encode` (tokenizing), `engine`. `encoded`, where given, keeps the texts' token ids for
    another engine with the same tokenizer (a task's other side) and takes them from it."""
    from lm_eval.evaluator import evaluate

    _compile_templates_once()
    for task in loaded["tasks"].values():
        task.set_fewshot_seed(seed=FEWSHOT_SEED)  # first_n sampler: it only fixes the API's RNG
    lm = adapter_class()(engine, progress, label, encoded)
    timer = time.perf_counter()
    out = evaluate(lm=lm, task_dict=loaded, limit=limit, bootstrap_iters=0, log_samples=True)
    if seconds is not None:
        spent = {k: round(v, 2) for k, v in lm.seconds.items()}
        seconds.update(lm_eval=round(time.perf_counter() - timer - sum(lm.seconds.values()), 2),
                       **spent)
    if out is None:
        raise EngineError("lm-eval returned no results", "run in a single process")
    return {name: sorted(out["samples"].get(name) or [], key=lambda d: d["doc_id"])
            for name in loaded["tasks"]}


@functools.cache
def _compile_templates_once() -> None:
    """lm-eval renders a task's Jinja templates with `utils.apply_template`, which compiles the
    template again on every call: 60% of MMLU's 14,042-question evaluation before any model
    work (7 compiles a question). The same environment and template give the same compiled
    template, so it is compiled once and rendered as lm-eval renders it."""
    import lm_eval.utils as lm_utils

    env = lm_utils.env
    compiled = functools.lru_cache(maxsize=4096)(env.from_string)

    def apply_template(template: str, doc: dict[str, Any]) -> str:  # a dataset's row: open
        return str(compiled(template).render(**doc))

    lm_utils.apply_template = apply_template


def offline_datasets() -> None:
    """Local files only: keep datasets/evaluate from asking the hub (slow, and fails offline)."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_EVALUATE_OFFLINE"):
        os.environ.setdefault(var, "1")


def _offline_if_local(name: str, task_paths: tuple[str, ...]) -> None:
    """A task from a --task-path folder reads local files: keep datasets from asking the hub."""
    entry = lm_eval_manager(tuple(task_paths)).task_index.get(name)
    path = getattr(entry, "yaml_path", None)
    if path is not None and any(Path(path).is_relative_to(Path(p).resolve()) or
                                Path(path).is_relative_to(Path(p)) for p in task_paths):
        offline_datasets()


def score(engine: Engine, name: str, *, task_paths: tuple[str, ...] = (),
          limit: int | None = None, seed: int = 0,
          progress: Progress | None = None, encoded: Encoded | None = None) -> LmEvalSide:
    """`engine` on lm-eval task (or group) `name`: the main metric of each leaf task per document,
    their mean with a bootstrap interval, and the documents in one stable order (task, doc_id),
    so two models' runs pair up. `limit` is per leaf task, as lm-eval's."""
    from lm_eval.api.metrics import mean

    from quantkit.validate.stats import mean_ci

    loaded = load_tasks(name, task_paths)
    samples = evaluate_docs(engine, loaded, limit=limit, progress=progress, label=name,
                            encoded=encoded)
    ids: list[str] = []
    scores: list[float] = []
    subtasks: dict[str, SubtaskScore] = {}
    for task_name in sorted(loaded["tasks"]):
        task = loaded["tasks"][task_name]
        docs = samples[task_name]
        metric = _main_metric(task)
        if task.aggregation().get(metric) is not mean:
            raise BadInput(f"task {task_name}'s main metric {metric!r} is a corpus-level "
                           "aggregate, not a mean over documents", "validate on a task whose "
                           "first metric is per document (acc, exact_match, ...)")
        filters = list(dict.fromkeys(d["filter"] for d in docs))
        docs = [d for d in docs if not filters or d["filter"] == filters[0]]
        values = [float(d[metric]) for d in docs]
        ids += [f"{task_name}/{d['doc_id']}" for d in docs]
        scores += values
        subtasks[task_name] = {"metric": metric, "filter": filters[0] if filters else None,
                               "value": sum(values) / len(values) if values else 0.0,
                               "n": len(values), "num_fewshot": task.config.num_fewshot or 0}
    if not scores:
        raise BadInput(f"lm-eval task {name!r} produced no scored documents",
                       "check its data files and splits (test_split / validation_split)")
    value, lo, hi = mean_ci(scores, seed=seed)
    first = next(iter(subtasks.values()))
    return {"task": name, "metric": first["metric"], "value": value, "lo": lo, "hi": hi,
            "n": len(scores), "ids": ids, "scores": scores, "subtasks": subtasks,
            "source": "lm-eval"}


def _main_metric(task: Any) -> str:
    """The task's first listed metric (lm-eval's own default list where the YAML gives none)."""
    listed = task.config.metric_list or []
    if listed and isinstance(listed[0], dict) and "metric" in listed[0]:
        return str(listed[0]["metric"])
    return str(next(iter(task.aggregation())))


def fingerprint(name: str, task_paths: tuple[str, ...]) -> str:
    """A hash of the task's YAML (and the files it includes), so an edited task is not served
    from the baseline cache."""
    import hashlib

    entry = lm_eval_manager(tuple(task_paths)).task_index.get(name)
    path = getattr(entry, "yaml_path", None)
    h = hashlib.sha256(name.encode())
    if path is not None:
        for f in sorted(Path(path).parent.glob("*.yaml")) + [Path(path)]:
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


# -- any lm-eval task's lifecycle (quantkit.task_registry.task: prepare, run) ----------------------

def prepare(cfg: Any, name: str) -> Prepared:
    """lm-eval builds the task (template, data) now: a bad one fails before any model loads."""
    load_tasks(name, tuple(cfg.task_path))
    return Prepared()


def run_task(models: Models, ctx: TaskContext) -> TaskResult:
    """The validation task for lm-eval task `ctx.name`: both sides (baseline cached) and the
    retention of the quantized model's score over the same documents."""
    from quantkit import console
    from quantkit.validate.runner import cached_baseline, paired_retention
    from quantkit.validate.stats import metric

    cfg = ctx.cfg
    paths = tuple(cfg.task_path)

    encoded: Encoded = {}  # the two sides' shared tokenization

    def side(engine: Engine) -> LmEvalSide:
        return score(engine, ctx.name, task_paths=paths, limit=cfg.limit, seed=cfg.seed,
                     progress=console.progress, encoded=encoded)

    key = [ctx.name, cfg.limit, cfg.seed, fingerprint(ctx.name, paths)]
    base = cached_baseline(models, ctx.name, key, side)
    quant = side(models.get("quantized"))
    metrics = {"retention": paired_retention(quant, base, "scores", cfg.seed)}
    for which, r in (("quantized", quant), ("baseline", base)):
        metrics[f"{which}_score"] = metric(r["value"], r["lo"], r["hi"], r["n"])
    return TaskResult(quant, base, metrics, extra={"metric": quant["metric"], "source": "lm-eval"})


if TYPE_CHECKING:  # each function held against the Protocol its caller loads it as
    _run: RunTask = run_task
    _prepare: PrepareTask = prepare
