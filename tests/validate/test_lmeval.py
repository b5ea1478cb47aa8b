"""Any lm-eval task as a validation task: a team's own task YAML over local JSONL
(recipes/tasks/cs_mcq.yaml), scored through quantkit's adapter as lm-eval's own hf backend scores
it, gated on retention, and the bad input its options can get."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TASKS = str(ROOT / "recipes" / "tasks")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("QUANTKIT_HOME", str(tmp_path / "home"))  # a fresh baseline cache
    monkeypatch.chdir(ROOT)  # the task YAML names its data relative to the repository root
    return tmp_path / "home"


def _validate(artifact: Path, baseline: Path, out: Path, *extra: str) -> list[str]:
    return ["validate", str(artifact), "--baseline", str(baseline), "--out", str(out),
            "--task-path", TASKS, *extra]


def test_validate_gates_on_an_lm_eval_task(cli, tiny_artifact, tiny_model, home, tmp_path):
    thresholds = tmp_path / "t.yaml"
    thresholds.write_text("cs_mcq: {retention: 0.5}\n")
    out = tmp_path / "report"
    args = _validate(tiny_artifact, tiny_model, out, "--tasks", "cs_mcq", "--limit", "12",
                     "--thresholds", str(thresholds))
    code, stdout, err = cli(*args)
    res = json.loads((out / "results.json").read_text())
    assert code == {"pass": 0, "fail": 1}[res["gate"]["verdict"]], err
    t = res["tasks"]["cs_mcq"]
    assert t["metric"] == "acc" and t["source"] == "lm-eval"
    for side in ("quantized", "baseline"):
        s = t[side]
        assert s["n"] == 12 and len(s["scores"]) == 12 and set(s["scores"]) <= {0.0, 1.0}
        assert s["value"] == pytest.approx(sum(s["scores"]) / 12)
        assert s["lo"] <= s["value"] <= s["hi"]
        assert t[f"{side}_score"]["value"] == pytest.approx(s["value"])
    assert t["retention"]["n"] == 12
    assert res["settings"]["task_path"] == [TASKS]
    [check] = res["gate"]["checks"]
    assert (check["task"], check["metric"], check["op"]) == ("cs_mcq", "retention", ">=")
    assert "cs_mcq.acc: baseline" in stdout and "cs_mcq.retention" in stdout
    html = (out / "report.html").read_text()
    assert 'id="cs_mcq"' in html and "lm-evaluation-harness" in html
    # the baseline's side comes from the cache the second time: the same documents, same scores
    code2, _, err2 = cli(*_validate(tiny_artifact, tiny_model, tmp_path / "again", "--tasks",
                                    "cs_mcq", "--limit", "12"))
    again = json.loads((tmp_path / "again" / "results.json").read_text())["tasks"]["cs_mcq"]
    assert code2 == 0, err2
    assert again["seconds"]["baseline_cached"] and again["baseline"] == t["baseline"]


@pytest.mark.slow
@pytest.mark.e2e  # 80 questions on the demo model, through quantkit and through lm-eval
def test_baseline_score_equals_lm_eval_hf_backend(demo_model, home):
    """The same task and data through lm-eval's own hf backend: the same answer per document."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    from quantkit.engines import engine_for
    from quantkit.validate.lmeval import score

    engine = engine_for(demo_model, threads=0, engine="transformers")
    ours = score(engine, "cs_mcq", task_paths=(TASKS,), limit=24)
    engine.close()
    out = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={demo_model},dtype=float32",
                                  tasks=["cs_mcq"], limit=24, device="cpu", batch_size=8,
                                  task_manager=TaskManager(include_path=[TASKS]))
    theirs = sorted(out["samples"]["cs_mcq"], key=lambda d: d["doc_id"])
    assert [float(d["acc"]) for d in theirs] == ours["scores"]
    assert ours["value"] == pytest.approx(out["results"]["cs_mcq"]["acc,none"])
    assert 0 < ours["value"] < 1  # a real model on real questions: neither all right nor wrong


def test_lm_eval_registry_names_pass_the_check():
    """Names from lm-eval's own registry are known without loading their data (offline here)."""
    from quantkit.config import ValidateConfig

    ValidateConfig(tasks=("arc_easy", "gsm8k", "mmlu"),
                   thresholds={"arc_easy": {"retention": 0.95}}).check()


def _bad(tmp: Path) -> dict[str, tuple[list[str], str]]:
    empty = tmp / "empty"
    empty.mkdir()
    broken = tmp / "broken"
    broken.mkdir()
    (broken / "t.yaml").write_text("task: broken\ndoc_to_text: [unclosed\n")
    nameless = tmp / "nameless"
    nameless.mkdir()
    (nameless / "t.yaml").write_text("dataset_path: json\ndoc_to_text: '{{q}}'\n")
    bad_template = tmp / "badtemplate"
    bad_template.mkdir()
    (bad_template / "t.yaml").write_text(
        "task: no_data\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {tmp / 'missing.jsonl'}\ntest_split: test\noutput_type: multiple_choice\n"
        "doc_to_text: '{{q}}'\ndoc_to_choice: '{{c}}'\ndoc_to_target: 0\n")
    thr = tmp / "thr.yaml"
    thr.write_text("cs_mcq: {retention: 0.9}\n")
    return {
        "unknown task": (["--tasks", "cs_mcqq", "--task-path", TASKS],
                         "unknown task 'cs_mcqq' (did you mean 'cs_mcq'?)"),
        "task path without yaml": (["--tasks", "mmlu", "--task-path", str(empty)],
                                   "holds no task YAML"),
        "task path missing": (["--tasks", "mmlu", "--task-path", str(tmp / "nope")],
                              "is not a folder"),
        "yaml lm-eval rejects": (["--tasks", "broken", "--task-path", str(broken)],
                                 "is rejected by lm-eval"),
        "yaml without a task": (["--tasks", "mmlu", "--task-path", str(nameless)],
                                "names no `task:`"),
        "task whose data is missing": (["--tasks", "no_data", "--task-path", str(bad_template)],
                                       "lm-eval cannot load task 'no_data'"),
        "threshold for a task not run": (["--tasks", "mmlu", "--thresholds", str(thr)],
                                         "thresholds name cs_mcq, which --tasks does not run"),
    }


@pytest.mark.parametrize("case", ["unknown task", "task path without yaml", "task path missing",
                                  "yaml lm-eval rejects", "yaml without a task",
                                  "task whose data is missing", "threshold for a task not run"])
def test_bad_input_for_lm_eval_options(case, cli, tiny_artifact, tiny_model, home, tmp_path):
    extra, words = _bad(tmp_path)[case]
    out = tmp_path / "o"
    code, _, err = cli("validate", str(tiny_artifact), "--baseline", str(tiny_model),
                       "--out", str(out), *extra)
    assert code == 2, err
    assert words in err and "hint:" in err
    assert len([ln for ln in err.splitlines() if ln.startswith("error:")]) == 1
    assert not out.exists() and not list(tmp_path.glob(".quantkit-tmp-*"))
