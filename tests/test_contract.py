"""The validation contract (quantkit.contract): an older results.json, the gate's decision and
`quantkit auto`'s result read into dataclasses and written back are the same dicts, so the files'
schema does not move; what the gate, the summary and the report read are attributes."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from quantkit.contract import (
    AutoResult,
    Candidate,
    CandidateMetric,
    GateDecision,
    MetricValue,
    TaskResult,
)
from quantkit.results import Results

# a results.json of an earlier quantkit (metrics without `n`, a gate without `causes`)
OLD = Path(__file__).parent / "data" / "results-example.json"


def test_an_old_results_json_reads_through_the_contract_and_writes_back_the_same():
    data = json.loads(OLD.read_text(encoding="utf-8"))
    res = Results.from_dict(copy.deepcopy(data), str(OLD))
    written = res.to_dict()  # (with the fields Results added since: engine_version, extra)
    assert {k: written[k] for k in data} == data
    gate = res.decision
    assert gate.verdict == "fail" and not gate.passed and gate.causes is None
    assert [c.name for c in gate.checks if not c.passed] == gate.failing
    assert gate.checks[0].n is None and gate.checks[0].too_small
    assert gate.to_dict() == data["gate"]
    tasks = res.task_results
    assert set(tasks) == set(data["tasks"])
    for name, t in tasks.items():
        assert t.to_dict() == data["tasks"][name], name
    mmlu = tasks["mmlu"]
    assert mmlu.metric("retention") == MetricValue(0.937, 0.81, 1.02)
    assert mmlu.seconds is not None and mmlu.seconds.baseline_cached is False
    assert set(tasks["domain"].metrics) == {"ppl_increase", "qa_retention"}
    assert tasks["domain"].extra["file"] and "changed" in tasks["humaneval"].extra


def test_the_gate_of_today_round_trips_and_keeps_its_keys():
    from quantkit.gate import decide
    from quantkit.validate.stats import metric, retention_metric

    tasks = {"mmlu": {"quantized": {"accuracy": 0.5}, "baseline": {"accuracy": 0.5},
                      "retention": metric(0.99, 0.95, 1.02, 400).to_dict(),
                      "seconds": {"baseline": 0.0, "quantized": 1.5, "baseline_cached": True}},
             "humaneval": {"retention": retention_metric([0.0] * 4, [0.0] * 4).to_dict()}}
    gate = decide(tasks, {"mmlu": {"retention": 0.97}, "humaneval": {"retention": 0.9},
                          "domain": {"kld": 0.1}})
    written = gate.to_dict()
    assert list(written) == ["verdict", "checks", "failing", "causes"]
    assert list(written["checks"][0]) == ["task", "metric", "op", "limit", "value", "lo", "hi",
                                          "n", "passed", "too_small"]
    assert written["checks"][1]["note"] == "no signal: 0/4 on both"
    assert "lo" not in written["checks"][2] and written["checks"][2]["value"] is None
    # (the no-signal value is nan, unequal to itself: compared as the JSON written)
    again = GateDecision.from_dict(json.loads(json.dumps(written))).to_dict()
    assert json.dumps(again) == json.dumps(written)
    for t in tasks.values():
        assert json.dumps(TaskResult.from_dict(t).to_dict(), sort_keys=True) == json.dumps(
            t, sort_keys=True)
    assert TaskResult.from_dict(tasks["mmlu"]).metric("retention").n == 400


def test_auto_results_round_trip():
    check = CandidateMetric(0.02, 0.01, 0.03, 0.05, "<=", True)
    row = Candidate("W4g32", "gptq", 4, 32, None, 4.5, 1000, "pass", {"domain.kld": check}, 3.0)
    fast = Candidate("W8", "gptq", 8, -1, None, 8.5, 2000, "pass", {}, 4.0,
                     speed={"output_tok_s": 10.0, "repeats": [10.0]})
    plain = AutoResult("gptq", [row], row, ["W4g128: no"], ["W8"], "art", "rep")
    data = plain.to_dict()
    assert "load" not in data and data["candidates"][0]["metrics"]["domain.kld"] == {
        "value": 0.02, "lo": 0.01, "hi": 0.03, "limit": 0.05, "op": "<=", "passed": True}
    assert "speed" not in data["candidates"][0] and "reason" not in data["chosen"]
    assert AutoResult.from_dict(json.loads(json.dumps(data))) == plain
    loaded = AutoResult("gptq", [row, fast], fast, [], [], "art", None, [1, 4], "speed",
                        {"output_tok_s": 5.0})
    data = loaded.to_dict()
    assert data["load"] == [1, 4] and data["candidates"][1]["speed"]["output_tok_s"] == 10.0
    assert AutoResult.from_dict(json.loads(json.dumps(data))).to_dict() == data


def test_a_results_json_with_no_signal_is_strict_json_and_reads_back(tmp_path: Path) -> None:
    """A retention without signal is NaN in memory; results.json holds null there (JavaScript's
    JSON.parse, GitHub Actions' fromJSON, Go and serde refuse NaN) and reads back as NaN."""
    import math

    from quantkit.gate import decide
    from quantkit.validate.stats import retention_metric

    data = json.loads(OLD.read_text(encoding="utf-8"))
    data["tasks"]["humaneval"]["retention"] = retention_metric([0.0] * 4, [0.0] * 4).to_dict()
    gate = decide(data["tasks"], {"humaneval": {"retention": 0.9}})
    data["gate"], data["thresholds"] = gate.to_dict(), {"humaneval": {"retention": 0.9}}
    assert math.isnan(data["gate"]["checks"][0]["value"])
    Results.from_dict(copy.deepcopy(data), "test").write(tmp_path)

    def refuse(word: str) -> None:
        raise AssertionError(f"{word} in results.json")

    text = (tmp_path / "results.json").read_text(encoding="utf-8")
    strict = json.loads(text, parse_constant=refuse)
    assert strict["gate"]["checks"][0]["value"] is None
    assert strict["tasks"]["humaneval"]["retention"]["value"] is None
    back = Results.read(tmp_path)
    retention = back.task_results["humaneval"].metric("retention")
    assert retention is not None and math.isnan(retention.value)
    assert retention.note == "no signal: 0/4 on both"
    again = decide({k: t for k, t in back.task_results.items()}, back.thresholds)
    assert again.failing == ["humaneval.retention"] and again.checks[0].unmeasured
