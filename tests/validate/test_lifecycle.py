"""Each task carries its lifecycle (quantkit.tasks): its options are fields of ValidateConfig (one
flag and one recipe key each, named as before), `prepare` reads its data before any model loads,
`settings` fills results.json, `early` tells `quantkit auto` what to run first. The settings record
and the baseline cache keys are those quantkit wrote before the tasks carried them, so existing
results read the same and existing caches keep answering."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from quantkit.config import AutoConfig, ValidateConfig
from quantkit.contract import ModelPair
from quantkit.errors import BadInput
from quantkit.registry import load
from quantkit.tasks import TASKS, options_class, task
from quantkit.validate import runner
from quantkit.validate.domain import load_domain_set
from quantkit.validate.runner import prepare_tasks

DOMAIN = str(Path(__file__).parents[2] / "recipes" / "data" / "demo-domain.jsonl")
# every validate option before the tasks carried their own: flags and recipe keys are a contract
FIELDS = {"tasks", "task_path", "engine", "domain_set", "limit", "humaneval_limit",
          "humaneval_max_tokens", "sandbox", "mmlu_data", "samples", "temperature", "top_p",
          "max_tokens", "long_context_samples", "seed", "threads", "thresholds",
          "thinking", "thinking_budget", "seeds"}  # issue 48: how a thinking model is served


def _cfg(**extra: Any) -> Any:
    return ValidateConfig(**{"tasks": ("mmlu", "humaneval", "domain", "sampling"),
                             "domain_set": DOMAIN, "limit": 2, "humaneval_limit": 3,
                             "humaneval_max_tokens": 100, "sandbox": "basic", "samples": 8,
                             "temperature": 0.7, "top_p": 0.8, "max_tokens": 50, "seed": 4,
                             **extra})


def test_the_options_are_the_fields_they_were_and_each_task_reads_its_own():
    assert {f.name for f in dataclasses.fields(ValidateConfig)} == FIELDS
    cfg = _cfg()
    cfg.check()
    assert cfg.options("sampling") == options_class("sampling")(samples=8, temperature=0.7,
                                                                top_p=0.8, max_tokens=50)
    assert cfg.options("humaneval").sandbox == "basic" and cfg.options("domain").domain_set == DOMAIN
    assert cfg.options("arc_easy") is None  # an lm-eval task has none of its own
    for name in TASKS:  # a task's own check runs in the config's
        opts = options_class(name)
        for f in dataclasses.fields(opts) if opts else ():
            assert f.name in FIELDS
    with pytest.raises(BadInput, match="--top-p 0.0 is out of range"):
        _cfg(top_p=0.0).check()
    with pytest.raises(BadInput, match="unknown --sandbox 'docker'"):
        _cfg(sandbox="docker").check()


def test_the_settings_record_is_unchanged():
    cfg = _cfg()
    prepared = prepare_tasks(cfg, cfg.run_tasks)
    assert prepared["humaneval"].data == "basic" and "basic sandbox" in prepared["humaneval"].warning
    # what results.json's `settings` held before the tasks carried their settings
    assert runner.settings_record(cfg, cfg.run_tasks, prepared) == {
        "tasks": ["mmlu", "humaneval", "domain", "sampling"], "limit": 2, "seed": 4,
        "mmlu_data": None, "task_path": [],
        "humaneval": {"limit": 3, "max_tokens": 100, "sandbox": "basic"},
        "domain_set": DOMAIN,
        "sampling": {"n": 8, "temperature": 0.7, "top_p": 0.8, "max_tokens": 50, "seed": 4}}
    # a task that does not run still records its options (the record's keys do not move)
    only = _cfg(tasks=("sampling",), sandbox="auto")
    record = runner.settings_record(only, only.run_tasks, prepare_tasks(only, only.run_tasks))
    assert record["humaneval"] == {"limit": 3, "max_tokens": 100, "sandbox": "auto"}
    # the dtype the engine computed in, where it says, follows the shared options
    record = runner.settings_record(cfg, cfg.run_tasks, prepared, "bfloat16")
    assert list(record)[:5] == ["tasks", "limit", "seed", "task_path", "dtype"]
    assert record["dtype"] == "bfloat16"


class Stop(Exception):
    pass


class FakeModels:
    pair = ModelPair("transformers", Path("q"), Path("b"), "q", "abc", None, Path("b"), True)

    def get(self, which: str) -> None:
        return None


def test_the_baseline_cache_keys_are_unchanged(monkeypatch):
    from quantkit.validate import domain, kld
    from quantkit.validate.humaneval import PROMPT_VERSION

    seen: list[tuple[str, Any]] = []

    def cached(models: Any, name: str, key: Any, fn: Any) -> Any:
        seen.append((name, key))
        if name == "domain":  # on to the KL side's key
            return {}
        raise Stop

    monkeypatch.setattr(runner, "cached_baseline", cached)
    monkeypatch.setattr(domain, "run_domain", lambda engine, rows, served=None: {})
    monkeypatch.setattr(kld, "compare", lambda *a, **k: {})
    cfg = _cfg()
    prepared = prepare_tasks(cfg, cfg.run_tasks)
    for name in cfg.run_tasks:
        ctx = runner.TaskContext(name, cfg, cfg.options(name), prepared[name].data,
                                 prepared[name].warning)
        with pytest.raises(Stop):
            load(task(name).run)(FakeModels(), ctx)
    rows = load_domain_set(Path(DOMAIN))
    prompts = [r["prompt"] for r in rows if r["kind"] == "qa"]
    # the settings each task keyed its baseline with before (runner.py's mmlu_task, ...)
    assert seen == [
        ("mmlu", [2, "None"]),
        ("humaneval", {"limit": 3, "max_tokens": 100, "sandbox": "basic",
                       "prompt_version": PROMPT_VERSION}),
        ("domain", [rows]), ("domain-kl", [rows, kld.TOP_K]),
        ("sampling", [prompts, {"n": 8, "temperature": 0.7, "top_p": 0.8, "max_tokens": 50,
                                "seed": 4}])]
    # and the key of one such file, as quantkit wrote it (the version held fixed)
    monkeypatch.setattr(runner, "__version__", "0.0.0")
    assert runner.cache_key("abc", "transformers", "mmlu", [2, "None"]) == (
        "b75ced9c02e4664af21c85fd80c543cd")
    # an engine that names its dtype keys by it: a float32 baseline never answers for bfloat16
    keys = {runner.cache_key("abc", "transformers", "mmlu", [2, "None"], dtype)
            for dtype in (None, "float32", "bfloat16")}
    assert len(keys) == 3


def test_prepare_reads_the_data_before_any_model(tmp_path):
    bad = tmp_path / "d.jsonl"
    bad.write_text("not json\n")
    with pytest.raises(BadInput, match="line 1: not valid JSON"):
        prepare_tasks(_cfg(domain_set=str(bad)), ["domain"])
    with pytest.raises(BadInput, match="MMLU data folder .* does not exist"):
        prepare_tasks(_cfg(mmlu_data=str(tmp_path / "none")), ["mmlu"])
    # the sampling check asks the domain set's questions only where the domain task runs
    assert prepare_tasks(_cfg(tasks=("sampling",)), ["sampling"])["sampling"].data[0] != (
        prepare_tasks(_cfg(), ["sampling"])["sampling"].data[0])


def test_auto_runs_the_early_tasks_first_where_others_follow():
    from quantkit.auto import _early_tasks

    gated = {"domain": {"kld": 0.5}, "sampling": {"flagged_increase": 0.5}}
    assert [t for t in TASKS if task(t).early] == ["domain"]
    assert _early_tasks(AutoConfig(), _cfg(thresholds=gated)) == ["domain"]
    assert _early_tasks(AutoConfig(early_reject=False), _cfg(thresholds=gated)) == []
    alone = _cfg(tasks=("domain",), thresholds={"domain": {"kld": 0.5}})
    assert _early_tasks(AutoConfig(), alone) == []  # nothing would follow
    assert _early_tasks(AutoConfig(), _cfg(thresholds={"sampling": {"flagged_increase": 0.5}})) == []
