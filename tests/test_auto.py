"""`quantkit auto` on the tiny model: the first candidate that passes becomes OUT; early
rejection on the domain task; exit 1 with every candidate's numbers when none passes; bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantkit.artifact import Manifest


@pytest.fixture(scope="module")
def setup(tiny_model: Path, tiny_calib: Path, corpus: dict[str, Path],
          tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("auto")
    domain = root / "domain.jsonl"
    domain.write_text("".join(json.dumps({"text": f.read_text()[:600]}) + "\n"
                              for f in sorted(corpus["code"].iterdir())[:6]))
    return {"model": tiny_model, "calib": tiny_calib, "domain": domain, "root": root}


def _auto(cli, s, tmp: Path, thresholds: str, *extra: str) -> tuple[int, dict, str]:
    thr = tmp / "t.yaml"
    thr.write_text(thresholds)
    code, out, err = cli("auto", str(s["model"]), "--calib", str(s["calib"]), "--thresholds",
                         str(thr), "--out", str(tmp / "art"), "--report", str(tmp / "rep"),
                         "--domain-set", str(s["domain"]), "--json", *extra)
    return code, (json.loads(out) if out.strip().startswith("{") else {}), err


@pytest.mark.slow  # quantizes and validates three candidates
def test_first_passing_candidate_becomes_the_artifact(cli, setup, tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTKIT_HOME", str(tmp_path / "home"))
    code, res, err = _auto(cli, setup, tmp_path, "domain: {kld: 0.00001}\n",
                           "--candidates", "W4g128,W4g32,W8", "--tasks", "domain,sampling")
    assert code == 0, err
    names = [c["name"] for c in res["candidates"]]
    assert names == ["W4g32", "W8"] and res["skipped"][0].startswith("W4g128")
    w4, w8 = res["candidates"]
    assert w4["verdict"] == "rejected" and not w4["metrics"]["domain.kld"]["passed"]
    assert "sampling.flagged_increase" not in w4["metrics"]    # rejected before the rest ran
    assert w8["verdict"] == "pass" and res["chosen"]["name"] == "W8"
    assert w8["size_bytes"] > w4["size_bytes"] and w8["bits"] == 8 and w8["group_size"] == -1
    m = Manifest.read(tmp_path / "art")
    assert m.parameters["bits"] == 8
    rep = json.loads((tmp_path / "rep" / "results.json").read_text())
    assert rep["artifact"]["path"] == str(tmp_path / "art") and rep["gate"]["verdict"] == "pass"
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "Candidates tried by quantkit auto" in html and "W4g32" in html
    assert not list(tmp_path.glob(".art*"))  # the work folder is gone


def test_none_passes_exit_1_with_every_candidate(cli, setup, tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTKIT_HOME", str(tmp_path / "home"))
    code, res, err = _auto(cli, setup, tmp_path, "domain: {kld: 0.0000000001}\n",
                           "--candidates", "W4g32,W8", "--tasks", "domain")
    assert code == 1, err
    assert [c["verdict"] for c in res["candidates"]] == ["fail", "fail"]  # domain only: no early
    assert res["chosen"] is None and all(c["metrics"]["domain.kld"]["value"] > 0
                                         for c in res["candidates"])
    assert "no candidate passed the gate" in err
    assert not (tmp_path / "art").exists() and not (tmp_path / "rep").exists()
    assert not list(tmp_path.glob(".art*"))


@pytest.mark.parametrize("case", ["no-thresholds", "unknown-candidate", "nothing-fits",
                                  "task-not-run", "unknown-metric"])
def test_bad_input_exit_2_and_nothing_written(cli, setup, tmp_path, case, monkeypatch):
    monkeypatch.setenv("QUANTKIT_HOME", str(tmp_path / "home"))
    base = ["auto", str(setup["model"]), "--calib", str(setup["calib"]), "--out",
            str(tmp_path / "art"), "--domain-set", str(setup["domain"])]
    thr = tmp_path / "t.yaml"
    thr.write_text("domain: {kld: 0.1}\n")
    args = {"no-thresholds": base,
            "unknown-candidate": base + ["--thresholds", str(thr), "--candidates", "W5g7"],
            "nothing-fits": base + ["--thresholds", str(thr), "--candidates", "W4g128,W8g256"],
            "task-not-run": base + ["--thresholds", str(thr), "--tasks", "sampling"],
            "unknown-metric": base + ["--thresholds", str(tmp_path / "u.yaml")]}[case]
    (tmp_path / "u.yaml").write_text("domain: {kl: 0.1}\n")
    code, _, err = cli(*args)
    assert code == 2, err
    assert len([ln for ln in err.splitlines() if ln.startswith("error:")]) == 1
    assert not (tmp_path / "art").exists() and not list(tmp_path.glob(".art*"))
