"""validate() on the tiny model: every task, the files it writes, the cache, and bad input."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from quantkit.artifact import Manifest
from quantkit.fsutil import finite
from quantkit.results import Results


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("QUANTKIT_HOME", str(tmp_path / "home"))  # a fresh baseline cache
    return tmp_path / "home"


@pytest.fixture(scope="module")
def domain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("domain") / "domain.jsonl"
    rows = [{"text": "def add(a, b):\n    return a + b\n"},
            {"text": "import os\nprint(os.getcwd())\n"},
            {"text": "The json module parses JSON text into Python objects."},
            {"prompt": "Which keyword defines a function?", "answer": "def"},
            {"prompt": "Say yes", "answer": "^y", "match": "regex"}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def _args(artifact: Path, baseline: Path, out: Path, *extra: str) -> list[str]:
    return ["validate", str(artifact), "--baseline", str(baseline), "--out", str(out), *extra]


@pytest.mark.slow  # all four tasks on both models, MMLU's 57 subjects included
def test_all_tasks_pass_gate_and_files(cli, tiny_artifact, tiny_model, domain, home, tmp_path,
                                       monkeypatch):
    # offline, without --mmlu-data: MMLU comes from the copy shipped in the package
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    thresholds = tmp_path / "t.yaml"
    thresholds.write_text("domain: {ppl_increase: 5.0}\nsampling: {flagged_increase: 1.0}\n")
    out = tmp_path / "report"
    code, stdout, err = cli(*_args(tiny_artifact, tiny_model, out, "--limit", "1",
                                   "--domain-set", str(domain),
                                   "--samples", "4", "--max-tokens", "16",
                                   "--thresholds", str(thresholds)))
    assert code == 0, err
    assert "verdict: PASS" in stdout
    res = json.loads((out / "results.json").read_text())
    assert res["schema_version"] == 2 and res["engine"] == "transformers"
    assert set(res["tasks"]) == {"mmlu", "humaneval", "domain", "sampling"}
    assert res["tasks"]["mmlu"]["quantized"]["n"] == 57  # one question per subject
    assert res["tasks"]["mmlu"]["quantized"]["source"] == "bundled:quantkit/data/mmlu"
    assert res["tasks"]["humaneval"]["quantized"]["n"] == 1
    d = res["tasks"]["domain"]
    assert d["quantized"]["text_lines"] == 3 and d["quantized"]["qa"]["n"] == 2
    assert d["ppl_increase"]["lo"] <= d["ppl_increase"]["value"] <= d["ppl_increase"]["hi"]
    for m in ("kld", "kld_p99", "top1_agreement"):
        assert d[m]["lo"] <= d[m]["value"] <= d[m]["hi"] and d[m]["n"] == 3
    assert 1e-6 < d["kld"]["value"] <= d["kld_p99"]["value"]  # W4 g32 moves even a random model
    assert 0 <= d["top1_agreement"]["value"] <= 1 and d["kld_positions"] > 10
    assert d["tail_mass"]["max"] < 1  # the tiny vocabulary (1k) is mostly inside the top 256
    s = res["tasks"]["sampling"]
    assert s["quantized"]["n"] == 4 and len(s["baseline"]["outputs"]) == 4
    assert [o["prompt"] for o in s["quantized"]["outputs"]] == \
        [o["prompt"] for o in s["baseline"]["outputs"]]  # same prompts (and seeds) on both sides
    assert res["gate"]["verdict"] == "pass" and len(res["gate"]["checks"]) == 2
    assert res["artifact"]["manifest"]["method"] == "gptq" and res["baseline"]["source_match"]
    cases = ET.parse(out / "junit.xml").getroot().findall(".//testcase")
    assert len(cases) == 2
    assert "PASS" in (out / "report.html").read_text()
    # the baseline's results are cached by model sha256, engine and task settings
    cached = sorted(p.name.split("-")[0] for p in (home / "validate-cache").glob("*.json"))
    assert cached == ["domain", "domain", "humaneval", "mmlu", "sampling"]  # + domain-kl
    for t in res["tasks"].values():  # a fresh cache: every baseline was computed, and timed
        sec = t["seconds"]
        assert set(sec) == {"baseline", "quantized", "baseline_cached"}
        assert sec["baseline_cached"] is False and sec["baseline"] >= 0 and sec["quantized"] >= 0
    assert finite(Results.read(out).to_dict()) == res  # the file: strict JSON, NaN as null
    assert Manifest.from_dict(res["artifact"]["manifest"], "manifest") == Manifest.read(
        tiny_artifact)


def test_gate_failure_exit_1_names_metric(cli, tiny_artifact, tiny_model, home, tmp_path):
    thresholds = tmp_path / "t.yaml"
    # no model can have 100 percentage points fewer flagged outputs than its baseline
    thresholds.write_text("sampling: {flagged_increase: -1.0}\n")
    out = tmp_path / "report"
    code, stdout, err = cli(*_args(tiny_artifact, tiny_model, out, "--tasks", "sampling",
                                   "--samples", "2", "--max-tokens", "8",
                                   "--thresholds", str(thresholds)))
    assert code == 1
    assert "sampling.flagged_increase" in err and "verdict: FAIL" in stdout
    html = (out / "report.html").read_text()
    assert "FAIL" in html and "sampling.flagged_increase" in html


def _bad_cases(tiny_artifact: Path, tiny_model: Path, domain: Path, tmp: Path) -> dict:
    bad_domain = tmp / "bad.jsonl"
    bad_domain.write_text('{"text": "ok"}\n{"text": 1}\n')
    not_json = tmp / "nj.jsonl"
    not_json.write_text('{"text": "ok"}\n\n{oops\n')
    thr = tmp / "thr.yaml"
    thr.write_text("mmlu: {retention: 0.9, speed: 2}\n")
    out_of_range = tmp / "oor.yaml"
    out_of_range.write_text("mmlu: {retention: 3}\n")
    return {
        "missing artifact": (_args(tmp / "nope", tiny_model, tmp / "o"), "does not exist"),
        "missing baseline": (_args(tiny_artifact, tmp / "nobase", tmp / "o"), "nobase"),
        "baseline not the source": (_args(tiny_artifact, tiny_artifact, tmp / "o"),
                                    "is not the source of"),
        "unknown task": (_args(tiny_artifact, tiny_model, tmp / "o", "--tasks", "mmlu,gsm8kk"),
                         "unknown task 'gsm8kk' (did you mean 'gsm8k'?)"),
        "domain without set": (_args(tiny_artifact, tiny_model, tmp / "o", "--tasks", "domain"),
                               "needs a domain test set"),
        "domain bad line": (_args(tiny_artifact, tiny_model, tmp / "o", "--domain-set",
                                  str(bad_domain)), "line 2"),
        "domain not json": (_args(tiny_artifact, tiny_model, tmp / "o", "--domain-set",
                                  str(not_json)), "line 3: not valid JSON"),
        "thresholds unknown key": (_args(tiny_artifact, tiny_model, tmp / "o", "--thresholds",
                                         str(thr)), "unknown metric mmlu.speed"),
        "thresholds out of range": (_args(tiny_artifact, tiny_model, tmp / "o", "--thresholds",
                                          str(out_of_range)), "out of range"),
        "samples out of range": (_args(tiny_artifact, tiny_model, tmp / "o", "--samples", "0"),
                                 "--samples 0 is out of range"),
        "top-p out of range": (_args(tiny_artifact, tiny_model, tmp / "o", "--top-p", "1.5"),
                               "--top-p 1.5 is out of range"),
        "mmlu data missing": (_args(tiny_artifact, tiny_model, tmp / "o", "--tasks", "mmlu",
                                    "--mmlu-data", str(tmp / "nommlu")), "MMLU data folder"),
    }


CASES = ["missing artifact", "missing baseline", "baseline not the source", "unknown task",
         "domain without set", "domain bad line", "domain not json", "thresholds unknown key",
         "thresholds out of range", "samples out of range", "top-p out of range",
         "mmlu data missing"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_exit_2(case, cli, tiny_artifact, tiny_model, domain, home, tmp_path):
    args, words = _bad_cases(tiny_artifact, tiny_model, domain, tmp_path)[case]
    code, _, err = cli(*args)
    assert code == 2, err
    assert words in err and "hint:" in err
    assert len([ln for ln in err.splitlines() if ln.startswith("error:")]) == 1
    assert not (tmp_path / "o").exists()
    assert not list(tmp_path.glob(".quantkit-tmp-*"))


def test_threshold_for_a_task_not_run(cli, tiny_artifact, tiny_model, home, tmp_path):
    thr = tmp_path / "t.yaml"
    thr.write_text("mmlu: {retention: 0.9}\n")
    code, _, err = cli(*_args(tiny_artifact, tiny_model, tmp_path / "o", "--tasks", "sampling",
                              "--thresholds", str(thr)))
    assert code == 2 and "which --tasks does not run" in err



def test_kld_against_itself_is_zero_and_gates(cli, tiny_artifact, tiny_model, domain, home,
                                              tmp_path):
    """The original against itself: no divergence and full agreement; the quantized model
    against a KL bound it cannot meet: exit 1 naming domain.kld."""
    from quantkit.engines.hf import TransformersEngine
    from quantkit.validate import kld

    texts = [json.loads(ln)["text"] for ln in domain.read_text().splitlines() if "text" in ln]
    engine = TransformersEngine(tiny_model)
    d = kld.compare(engine, texts, kld.baseline_side(engine, texts)).to_dict()
    assert d["kld"]["value"] < 1e-7 and d["top1_agreement"]["value"] == 1.0, d["kld"]
    thr = tmp_path / "t.yaml"
    thr.write_text("domain: {kld: 0.000001, top1_agreement: 0.5}\n")
    code, stdout, err = cli(*_args(tiny_artifact, tiny_model, tmp_path / "q", "--tasks", "domain",
                                   "--domain-set", str(domain), "--thresholds", str(thr)))
    assert code == 1, err
    gate = json.loads((tmp_path / "q" / "results.json").read_text())["gate"]
    assert "domain.kld" in gate["failing"]


def test_task_seconds_leave_model_loading_out(tiny_artifact, tiny_model, home, tmp_path,
                                              monkeypatch):
    """Per-task seconds are inference only, on both sides: loading is in timings (load_*_s)."""
    import time

    import quantkit.engines
    from quantkit.config import ValidateConfig
    from quantkit.validate import validate

    real, load_s = quantkit.engines.engine_for, 2.0

    def slow_to_load(*args, **kwargs):
        time.sleep(load_s)
        return real(*args, **kwargs)

    monkeypatch.setattr(quantkit.engines, "engine_for", slow_to_load)
    cfg = ValidateConfig(tasks=("sampling",), samples=2, max_tokens=8)
    res = validate(artifact=tiny_artifact, baseline=str(tiny_model), cfg=cfg, out=tmp_path / "r")
    sec = res.tasks["sampling"].to_dict()["seconds"]
    assert sec["baseline_cached"] is False
    assert 0 <= sec["baseline"] < load_s and 0 <= sec["quantized"] < load_s, sec
    assert res.timings["load_baseline_s"] >= load_s and res.timings["load_quantized_s"] >= load_s
    # the second run answers the baseline from the cache
    again = validate(artifact=tiny_artifact, baseline=str(tiny_model), cfg=cfg,
                     out=tmp_path / "r2").tasks["sampling"].to_dict()["seconds"]
    assert again["baseline_cached"] is True and again["baseline"] == 0.0
