"""The whole loop on the real demo model: `quantkit run` for GPTQ and GGUF, a damaged artifact
that the gate must refuse, and the report in a real browser. Slow: CI runs it.

The recipes run once per session in `workdir`, a temporary copy of recipes/ (the fixtures
`demo_run`, `demo_w4_run` and `demo_gguf_run` in tests/conftest.py), so nothing is written
into the repository and the serve tests reuse the same GGUF."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from _serving import quantkit

pytestmark = pytest.mark.slow


def test_demo_recipe_runs_the_whole_loop(demo_run, workdir):
    """auto: W4 g32 and W4 g32 with a quarter of its linear groups at 8 bits are rejected on the
    domain task alone; with half of them at 8 bits it passes the whole gate."""
    assert demo_run.returncode == 0, demo_run.stderr[-3000:]
    assert "verdict: PASS" in demo_run.stdout
    res = json.loads((workdir / "reports/demo/results.json").read_text())
    assert set(res["tasks"]) == {"mmlu", "humaneval", "domain", "sampling"}
    assert res["engine"] == "transformers" and res["artifact"]["manifest"]["method"] == "gptq"
    assert res["artifact"]["path"] == "artifacts/demo"
    tried = json.loads((workdir / "reports/demo/auto.json").read_text())["candidates"]
    assert [(c["name"], c["verdict"]) for c in tried] == [
        ("W4g32", "rejected"), ("W4g32+25%", "rejected"), ("W4g32+50%", "pass")]
    kl = [c["metrics"]["domain.kld"]["value"] for c in tried]
    assert kl[0] > kl[1] > 0.05 >= kl[2]  # each upgrade of sensitive groups cuts the KL
    assert [c["bits_per_weight"] for c in tried] == sorted(c["bits_per_weight"] for c in tried)
    manifest = res["artifact"]["manifest"]
    assert manifest["parameters"]["bits"] == 4 and manifest["parameters"]["hessians"] == "original"
    assert len(manifest["sensitivity"]["upgraded"]) == 60  # half of 30 layers x 4 groups
    assert "Candidates tried by quantkit auto" in (workdir / "reports/demo/report.html").read_text()
    assert res["tasks"]["mmlu"]["quantized"]["n"] == 57
    assert res["tasks"]["humaneval"]["quantized"]["n"] == 10
    assert res["tasks"]["sampling"]["quantized"]["n"] == 16
    for task in ("mmlu", "humaneval"):
        r = res["tasks"][task]["retention"]
        assert r["n"] > 0 and (r["lo"] is None or r["lo"] <= r["value"] <= r["hi"])
    assert res["gate"]["verdict"] == "pass"
    assert (workdir / "reports/demo/report.html").is_file()
    from xml.etree import ElementTree as ET

    assert len(ET.parse(workdir / "reports/demo/junit.xml").getroot().findall(".//testcase")) == 4


def test_w4_recipe_fails_the_gate_for_a_real_reason(demo_w4_run, workdir):
    """GPTQ W4 g64 held to the demo's gate: exit 1, the domain metrics named, the artifact and
    report kept for reading."""
    res = demo_w4_run
    assert res.returncode == 1, res.stderr[-3000:]
    results = json.loads((workdir / "reports/demo-w4/results.json").read_text())
    assert results["gate"]["verdict"] == "fail"
    assert {"domain.kld", "domain.ppl_increase"} <= set(results["gate"]["failing"])
    assert results["tasks"]["domain"]["kld"]["value"] > 0.05
    assert "domain.kld" in res.stderr


def test_second_run_reuses_every_step(demo_run, workdir):
    again = quantkit("--json", "run", "recipes/demo.yaml", cwd=workdir)
    assert again.returncode == 0, again.stderr[-2000:]
    steps = json.loads(again.stdout)["steps"]
    assert all(s["reused"] for s in steps.values()), steps


def test_damaged_artifact_fails_the_gate(demo_w4_run, workdir, tmp_path):
    """Scales scrambled per output row: the model still loads and answers, but worse; the
    gate must say which metrics failed (exit 1). The artifact is demo-w4's (its run exits 1 for
    its gate and keeps the artifact), copied."""
    from _damage import scramble_scales

    bad = tmp_path / "damaged"
    assert (workdir / "artifacts/demo-w4/quantkit.json").is_file(), demo_w4_run.stderr[-3000:]
    scramble_scales(workdir / "artifacts/demo-w4", bad)
    thresholds = tmp_path / "t.yaml"
    thresholds.write_text("domain: {ppl_increase: 0.40}\n")
    out = tmp_path / "report"
    res = quantkit("validate", str(bad), "--baseline", "smollm2-135m", "--tasks", "domain",
                   "--domain-set", "recipes/data/demo-domain.jsonl", "--thresholds",
                   str(thresholds), "--out", str(out), cwd=workdir)
    assert res.returncode == 1, res.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert "domain.ppl_increase" in results["gate"]["failing"]
    assert results["tasks"]["domain"]["ppl_increase"]["value"] > 0.40
    assert "domain.ppl_increase" in res.stderr
    html = (out / "report.html").read_text()
    assert "domain.ppl_increase" in html and "calibration" in html.lower()


def test_demo_gguf_recipe_validates_on_llama_cpp(demo_gguf_run, workdir):
    res = demo_gguf_run
    assert res.returncode == 0, res.stderr[-3000:]
    results = json.loads((workdir / "reports/demo-gguf/results.json").read_text())
    assert results["engine"] == "llama.cpp"
    assert results["baseline"]["path"].endswith("model-f16.gguf")
    assert set(results["tasks"]) == {"humaneval", "domain", "sampling"}
    assert results["gate"]["verdict"] == "pass" and results["tasks"]["domain"]["kld"]["value"] <= 0.05
    # the artifact: Q4_K_M with the importance matrix over every decoder weight, the embedding's
    # 576 columns (not a multiple of 256) on a fallback type, verified in llama.cpp; the
    # manifest reads back whole and names its source by the model's identity (imatrix against
    # none, on held-out perplexity: bench/demo_quality.py imatrix)
    from quantkit.artifact import Manifest
    from quantkit.models import model_sha256, resolve_model, weights_sha256

    art = workdir / "artifacts/demo-gguf"
    manifest = json.loads((art / "quantkit.json").read_text())
    assert (art / "model-Q4_K_M.gguf").is_file() and (art / "imatrix.gguf").is_file()
    assert manifest["imatrix"]["entries"] == 30 * 7 and manifest["fallback_tensors"] > 0
    assert 4.5 < manifest["bits_per_weight"] < 6.5 and "Paris" in manifest["verification"]["answer"]
    assert manifest["verification"]["ppl_quantized"] > manifest["verification"]["ppl_f16"] > 1
    demo = resolve_model("smollm2-135m").path
    assert manifest["source"]["weights_sha256"] == weights_sha256(demo)
    assert manifest["source"]["model_sha256"] == model_sha256(demo)
    assert Manifest.read(art).to_dict() == manifest
    # llama.cpp's own log (the quantizer's per-tensor lines, the loader's metadata dump) and
    # warnings about what a library left open stay off the terminal
    for noise in ("llama_model_loader", "converting to", "llama_model_quantize", "ResourceWarning"):
        assert noise not in res.stderr and noise not in res.stdout, noise


def test_report_in_headless_chromium(demo_run, workdir, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no chromium: apt-get install chromium (Debian) to run the browser check")
    shot = tmp_path / "shot.png"
    page = (workdir / "reports/demo/report.html").resolve().as_uri()
    run = subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu",
                          f"--screenshot={shot}", "--window-size=1200,900",
                          "--enable-logging=stderr", "--v=0", page],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HOME": str(tmp_path)})
    assert shot.is_file() and shot.stat().st_size > 5000, run.stderr[-2000:]
    assert ":CONSOLE" not in run.stderr and "Uncaught" not in run.stderr
    dom = subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu",
                          "--dump-dom", page], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HOME": str(tmp_path)})
    assert "PASS" in dom.stdout.split("<section", 1)[0]  # the verdict comes first


def test_recipes_that_calibrate_alike_build_the_set_once(demo_run, demo_w4_run, demo_gguf_run):
    """demo, demo-w4 and demo-gguf calibrate the same way into calib_sets/demo: one builds it,
    the other two reuse it (step reuse is keyed by step and output, not by recipe)."""
    built = [r.args for r in (demo_run, demo_w4_run, demo_gguf_run)
             if "calibrate reused" not in r.stdout]
    assert len(built) == 1, built
