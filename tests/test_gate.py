"""Thresholds, the verdict and junit.xml."""

from __future__ import annotations

from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from quantkit.errors import BadInput
from quantkit.gate import decide, load_thresholds, write_junit


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "t.yaml"
    p.write_text(text)
    return p


def test_thresholds_parse(tmp_path: Path) -> None:
    got = load_thresholds(_write(tmp_path, "mmlu: {retention: 0.97}\ndomain: {ppl_increase: 0.05}\n"))
    assert got == {"mmlu": {"retention": 0.97}, "domain": {"ppl_increase": 0.05}}


@pytest.mark.parametrize("text, words", [
    ("mmlux: {accuracy: 0.9}", "unknown metric mmlux.accuracy"),  # an lm-eval task: retention
    ("mmlu: {accuracy: 0.9}", "unknown metric mmlu.accuracy"),
    ("mmlu: {retention: 7}", "out of range"),
    ("mmlu: {retention: yes}", "out of range"),
    ("mmlu: 0.97", "needs a mapping"),
    ("mmlu: {retention: [0.9", "not valid YAML"),
    ("- mmlu", "expected a mapping"),
])
def test_thresholds_reject(tmp_path: Path, text: str, words: str) -> None:
    with pytest.raises(BadInput, match=words.replace("(", r"\(").replace("[", r"\[")):
        load_thresholds(_write(tmp_path, text))


def test_thresholds_for_a_task_not_run(tmp_path: Path) -> None:
    """A name that is not ours is an lm-eval task gated on retention; naming a task --tasks does
    not run (a typo) is refused by the config before anything runs."""
    from quantkit.config import ValidateConfig

    limits = load_thresholds(_write(tmp_path, "arc_easy: {retention: 0.9}\nmmlux: {retention: 0.9}"))
    assert limits == {"arc_easy": {"retention": 0.9}, "mmlux": {"retention": 0.9}}
    with pytest.raises(BadInput, match="thresholds name mmlux, which --tasks does not run"):
        ValidateConfig(tasks=("mmlu",), thresholds={"mmlux": {"retention": 0.9}}).check()


def test_missing_thresholds_file(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="does not exist"):
        load_thresholds(tmp_path / "nope.yaml")


def _tasks(ret: float, lo: float, hi: float, inc: float) -> dict:
    return {"mmlu": {"retention": {"value": ret, "lo": lo, "hi": hi, "n": 500}},
            "sampling": {"flagged_increase": {"value": inc, "lo": inc - 0.02, "hi": inc + 0.02,
                                              "n": 64}}}


def test_decide_pass_fail_and_not_gated(tmp_path: Path) -> None:
    limits = {"mmlu": {"retention": 0.97}, "sampling": {"flagged_increase": 0.05}}
    ok = decide(_tasks(0.99, 0.98, 1.0, 0.0), limits)
    assert ok.verdict == "pass" and ok.failing == [] and not ok.causes
    bad = decide(_tasks(0.90, 0.85, 0.95, 0.2), limits)
    assert bad.verdict == "fail"
    assert bad.failing == ["mmlu.retention", "sampling.flagged_increase"]
    assert bad.causes and "calibration set" in bad.causes[0]  # usual causes in order: calibration first
    assert decide(_tasks(0.5, 0.4, 0.6, 0.9), {}).verdict == "not gated"
    wide = decide(_tasks(0.98, 0.90, 1.05, 0.0), {"mmlu": {"retention": 0.97}})
    assert wide.checks[0].passed and wide.checks[0].too_small


def test_threshold_for_a_missing_metric_fails() -> None:
    got = decide({"domain": {}}, {"domain": {"ppl_increase": 0.05}})
    assert got.verdict == "fail" and got.checks[0].value is None
    assert got.to_dict()["checks"][0] == {  # as results.json has always held it
        "task": "domain", "metric": "ppl_increase", "op": "<=", "limit": 0.05, "value": None,
        "passed": False, "too_small": False,
        "note": "not measured (the task or its data did not produce it)"}


def test_no_signal_fails_and_says_why(tmp_path: Path) -> None:
    from quantkit.validate.stats import retention_metric

    tasks = {"humaneval": {"retention": retention_metric([0.0] * 10, [0.0] * 10)}}
    got = decide(tasks, {"humaneval": {"retention": 0.9}})
    check = got.checks[0]
    assert got.verdict == "fail" and not check.passed
    assert check.note == "no signal: 0/10 on both"
    write_junit(got, tmp_path / "junit.xml")
    failure = ET.parse(tmp_path / "junit.xml").getroot().find(".//failure")
    assert failure is not None and failure.text == "no signal: 0/10 on both"


def test_junit_parses(tmp_path: Path) -> None:
    gate = decide(_tasks(0.90, 0.85, 0.95, 0.0),
                  {"mmlu": {"retention": 0.97}, "sampling": {"flagged_increase": 0.05}})
    write_junit(gate, tmp_path / "junit.xml")
    root = ET.parse(tmp_path / "junit.xml").getroot()
    cases = root.findall(".//testcase")
    assert [c.get("name") for c in cases] == ["retention", "flagged_increase"]
    assert cases[0].find("failure") is not None and cases[1].find("failure") is None
    assert root.find("testsuite").get("failures") == "1"


def test_a_check_that_measured_nothing_blames_the_measurement_not_the_quantization() -> None:
    """The 8B recipe's HumanEval on random weights: 0/164 on both fails the gate (no evidence of
    retention), and the causes say why (the original scores 0) instead of calibration and bits."""
    none = {"value": float("nan"), "lo": None, "hi": None, "n": 164,
            "note": "no signal: 0/164 on both"}
    limits = {"humaneval": {"retention": 0.95}, "domain": {"qa_retention": 0.9}}
    got = decide({"humaneval": {"retention": none}, "domain": {}}, limits)
    assert got.verdict == "fail" and got.failing == ["humaneval.retention", "domain.qa_retention"]
    assert len(got.causes or []) == 2 and not any("calibration set" in c for c in got.causes or [])
    assert "humaneval.retention has no signal (0/164 on both)" in (got.causes or [""])[0]
    assert "take domain.qa_retention out of the thresholds" in (got.causes or ["", ""])[1]
    # a worse quantized model beside it: the usual causes first, then the measurement's
    mixed = decide({"humaneval": {"retention": none},
                    "mmlu": {"retention": {"value": 0.9, "lo": 0.88, "hi": 0.92, "n": 500}}},
                   {"humaneval": {"retention": 0.95}, "mmlu": {"retention": 0.97}})
    assert [c[:18] for c in mixed.causes or []] == [
        "the calibration se", "the method (try AW", "the bits (4-bit is", "humaneval.retentio"]
