"""The HTML report: self-contained, verdict first, untrusted text escaped, fine in a browser."""

from __future__ import annotations

import copy
import json
import re
import shutil
import struct
import subprocess
import zlib
from html import escape
from pathlib import Path
from typing import Any

import pytest

from quantkit.artifact import Manifest
from quantkit.contract import ArtifactRecord, BaselineRecord, GateDecision
from quantkit.errors import BadInput
from quantkit.report import write_report
from quantkit.results import Results

EXAMPLE = Path(__file__).parent / "data" / "results-example.json"
SECTIONS = ["thresholds", "retention", "mmlu", "humaneval", "domain", "sampling", "calibration",
            "quantization", "versions"]
FAIL_RED = (0xC6, 0x28, 0x28)


def example() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    return data


def render(tmp_path: Path, results: dict[str, Any]) -> str:
    (tmp_path / "results.json").write_text(json.dumps(results), encoding="utf-8")
    out = write_report(tmp_path)
    assert out == tmp_path / "report.html"
    return out.read_text(encoding="utf-8")


def section_ids(html: str) -> list[str]:
    return re.findall(r'<section id="([a-z]+)"', html)


def test_example_report_is_self_contained_and_escaped(tmp_path: Path) -> None:
    html = render(tmp_path, example())
    assert "http://" not in html and "https://" not in html
    assert not re.search(r"\b(src|href|srcset|action)\s*=", html, re.IGNORECASE)
    assert "<script" not in html.lower() and "<link" not in html.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert html.count("<svg") >= 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "results.json"]


def test_example_report_verdict_first_then_sections_in_order(tmp_path: Path) -> None:
    html = render(tmp_path, example())
    body = html[html.index("<body>"):]
    assert body.index(">FAIL<") < body.index("<section")
    assert "artifacts/demo-gptq" in body[:body.index("<section")]
    assert section_ids(html) == SECTIONS


def test_failing_gate_names_metrics_and_causes_in_order(tmp_path: Path) -> None:
    html = render(tmp_path, example())
    gate = html[html.index('id="thresholds"'):html.index('id="retention"')]
    for name in ("mmlu.retention", "humaneval.retention", "sampling.flagged_increase"):
        assert f"<code>{name}</code>" in gate
    assert gate.count("sample too small to support the verdict") == 3
    assert "≥ 0.970" in gate and "[0.810, 1.020]" in gate
    causes = [gate.index(c) for c in ("Calibration set off-domain", "Method.", "Bits.")]
    assert causes == sorted(causes)
    assert "JS divergence 0.310 bits" in gate and "92.0%" in gate


def test_task_sections_show_their_numbers(tmp_path: Path) -> None:
    html = render(tmp_path, example())
    assert "HumanEval/3" in html and "HumanEval/15" in html and "HumanEval/4<" not in html
    assert "passed → failed" in html and "failed → passed" in html
    assert "4.2% [2.1%, 6.3%]" in html                          # domain perplexity increase
    assert "Flagged outputs (3)" in html and html.count('class="flagged"') == 4
    assert "4 of 9, seed 0" in html                               # the unflagged sample
    assert "5f1c0a4e9b7d2c8e3a6f0b1d4c7e9a2b5d8f1c3e6a9b2d5f8c1e4a7b0d3f6c9e" in html
    assert "compressed-tensors (quantization)" in html


def test_untrusted_text_in_charts_and_tables_is_escaped(tmp_path: Path) -> None:
    results = example()
    evil = '<img src=x onerror="alert(2)">'
    for side in ("quantized", "baseline"):
        subjects = results["tasks"]["mmlu"][side]["subjects"]
        subjects[evil] = {"accuracy": 0.2 if side == "quantized" else 0.8, "n": 5}
    results["artifact"]["path"] = evil
    results["tasks"]["humaneval"]["changed"][0]["task_id"] = evil
    html = render(tmp_path, results)
    assert "<img" not in html
    assert html.count(escape(evil)) >= 3


def test_report_is_rewritten_byte_for_byte(tmp_path: Path) -> None:
    first = render(tmp_path, example())
    assert write_report(tmp_path).read_text(encoding="utf-8") == first


@pytest.mark.parametrize("task", ["mmlu", "humaneval", "domain", "sampling"])
def test_one_task_renders_and_omits_the_others(tmp_path: Path, task: str) -> None:
    full = example()
    results = {k: v for k, v in full.items() if k not in ("tasks", "gate", "calibration")}
    results["tasks"] = {task: copy.deepcopy(full["tasks"][task])}
    # what decide() gives without thresholds (a schema-2 results.json always has a gate)
    results["thresholds"] = {}
    results["gate"] = {"verdict": "not gated", "checks": [], "failing": [], "causes": []}
    html = render(tmp_path, results)
    assert ">NOT GATED<" in html and "not gated" in html
    assert task in section_ids(html)
    assert not {"mmlu", "humaneval", "domain", "sampling"} - {task} & set(section_ids(html))


def test_bare_results_render(tmp_path: Path) -> None:
    bare = Results(quantkit_version="0.1.0", created="2026-12-01T00:00:00Z",
                   artifact=ArtifactRecord(), baseline=BaselineRecord(), engine="transformers",
                   settings={}, thresholds={}, tasks={}, gate=GateDecision("pass"), timings={})
    html = render(tmp_path, bare.to_dict())
    assert ">PASS<" in html and section_ids(html) == ["thresholds", "versions"]


def test_missing_results_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput) as err:
        write_report(tmp_path)
    assert err.value.message == f"no results.json in {tmp_path}"
    assert "quantkit validate" in err.value.hint and str(tmp_path) in err.value.hint
    assert not (tmp_path / "report.html").exists()


@pytest.mark.parametrize("text", ["{not json", '{"schema_version": 2}', '{"schema_version": 3}',
                                  "[1, 2]"])
def test_unreadable_results_are_bad_input(tmp_path: Path, text: str) -> None:
    (tmp_path / "results.json").write_text(text)
    with pytest.raises(BadInput):
        write_report(tmp_path)
    assert not (tmp_path / "report.html").exists()


@pytest.mark.parametrize("change, words", [
    ({"schema_version": 1}, "schema_version 1"),
    ({"surprise": 1}, "unknown results field 'surprise'"),
    ({"tasks": []}, "tasks has the wrong type"),
])
def test_old_or_foreign_results_are_bad_input(tmp_path: Path, change: dict, words: str) -> None:
    (tmp_path / "results.json").write_text(json.dumps({**example(), **change}))
    with pytest.raises(BadInput, match=words) as err:
        write_report(tmp_path)
    assert "quantkit validate" in err.value.hint
    assert not (tmp_path / "report.html").exists()


def test_example_is_a_current_results_file() -> None:
    """The fixture is what validate writes now: schema 2, a schema-2 manifest, split seconds."""
    res = Results.from_dict(example(), str(EXAMPLE))
    assert res.schema_version == 2 and res.verdict == "fail"
    assert Manifest.from_dict(res.artifact.manifest, "manifest").method == "gptq"
    assert all(set(t.to_dict()["seconds"]) == {"baseline", "quantized", "baseline_cached"}
               for t in res.tasks.values())


# -- a real browser ----------------------------------------------------------------------------

def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


def paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def png_rows(data: bytes, count: int) -> tuple[int, list[bytes], int]:
    """Width, the first `count` unfiltered pixel rows and bytes per pixel of an 8-bit RGB(A) PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    bpp = 3
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, _, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
            assert depth == 8 and colour in (2, 6) and interlace == 0
            bpp = 4 if colour == 6 else 3
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw, stride = zlib.decompress(idat), width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(count):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            a, b = (line[i - bpp] if i >= bpp else 0), prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            line[i] = (line[i] + (0, a, b, (a + b) // 2, paeth(a, b, c))[kind]) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, rows, bpp


@pytest.mark.slow
@pytest.mark.e2e  # a browser
def test_chromium_renders_without_console_errors_and_shows_the_verdict(tmp_path: Path) -> None:
    chromium = find_chromium()
    if chromium is None:
        print("no chromium binary on PATH or at /usr/bin/chromium; apt-get install chromium")
        pytest.skip("no chromium binary (install Debian's `chromium` package)")
    render(tmp_path, example())
    shot = tmp_path / "shot.png"
    base = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu",
            f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,900"]
    url = (tmp_path / "report.html").as_uri()
    run = subprocess.run(base + ["--enable-logging=stderr", "--v=0", f"--screenshot={shot}", url],
                         check=True, capture_output=True, text=True,
                         timeout=180)
    # Console messages, CSP violations (a blocked network load) included, arrive as CONSOLE lines.
    console = [ln for ln in run.stderr.splitlines() if ":CONSOLE" in ln or "Uncaught" in ln]
    assert console == [], console
    assert shot.stat().st_size > 5_000
    width, rows, bpp = png_rows(shot.read_bytes(), 200)
    red = sum(1 for row in rows for x in range(0, width * bpp, bpp)
              if all(abs(row[x + k] - FAIL_RED[k]) <= 6 for k in range(3)))
    assert red > 20_000, f"only {red} verdict-red pixels in the top 200 rows"
    dom = subprocess.run(base + ["--dump-dom", url], check=True, capture_output=True, text=True,
                         timeout=180)
    assert '<div class="word">FAIL</div>' in dom.stdout
    assert "<script" not in dom.stdout and "&lt;script&gt;alert(1)" in dom.stdout


def test_unmeasurable_retention_draws_no_nan(tmp_path: Path) -> None:
    """HumanEval retention is NaN when the baseline solves nothing (the demo model): the chart
    must not emit NaN coordinates (Chromium logs them as console errors)."""
    data = example()
    data["tasks"]["humaneval"]["retention"] = {"value": float("nan"), "lo": None, "hi": None,
                                               "n": 10}
    html = render(tmp_path, data)
    assert not re.search(r'="[^"]*nan[^"]*"', html, re.IGNORECASE)
    assert "not measurable" in html


def test_no_signal_retention_shows_its_note_not_nan(tmp_path: Path) -> None:
    """Both models solve 0 of 10: the report, the gate's row and the CLI summary say so."""
    from quantkit.gate import decide
    from quantkit.validate.stats import retention_metric
    from quantkit.views import summary

    data = example()
    data["tasks"]["humaneval"]["retention"] = retention_metric([0.0] * 10, [0.0] * 10).to_dict()
    data["gate"] = decide(data["tasks"], data["thresholds"]).to_dict()
    html = render(tmp_path, data)
    humaneval = html[html.index('<section id="humaneval"'):]
    assert "no signal: 0/10 on both" in humaneval[:humaneval.index("</section>")]
    thresholds = html[html.index('<section id="thresholds"'):]
    assert "no signal: 0/10 on both" in thresholds[:thresholds.index("</section>")]
    text = summary(Results.from_dict(data, "results.json"))
    assert "  humaneval.retention: no signal: 0/10 on both" in text.splitlines()
    assert "  FAIL humaneval.retention >= 0.9 (no signal: 0/10 on both)" in text.splitlines()
    assert "nan" not in text


def test_line_chart_legend_fits_and_limit_label_covers_no_data() -> None:
    """The demo's auto report: "sampling.flagged_increase" ran off the chart's right edge, and
    the KL limit's label sat on the line where the chosen candidate's dot is."""
    from quantkit.report.charts import CHAR_W, Series, line_chart

    name = "sampling.flagged_increase"
    svg = line_chart([Series(name, [(180.0, 0.34), (191.0, 0.063), (202.0, 0.028)])],
                     "t", "size (MiB)", name, y_marks=[(0.05, "limit 0.05", "#ef6c00")])
    width = float(re.search(r'viewBox="0 0 (\d+)', svg).group(1))
    legend = re.search(rf'<text x="([\d.]+)" y="[\d.]+" text-anchor="start" class="label">'
                       rf"{re.escape(name)}</text>", svg)
    assert legend and float(legend.group(1)) + CHAR_W * len(name) <= width
    label = re.search(r'<text x="([\d.]+)" y="([\d.]+)" text-anchor="(\w+)" class="mark"', svg)
    assert label is not None
    x, y, anchor = float(label.group(1)), float(label.group(2)), label.group(3)
    x0, x1 = (x - CHAR_W * 10, x) if anchor == "end" else (x, x + CHAR_W * 10)
    dots = [(float(a), float(b)) for a, b in re.findall(r'<circle cx="([\d.]+)" cy="([\d.]+)"', svg)]
    assert len(dots) == 3
    assert not any(x0 - 4 <= cx <= x1 + 4 and y - 15 <= cy <= y + 7 for cx, cy in dots)


def test_auto_with_load_shows_speed_against_the_original(tmp_path: Path) -> None:
    def row(name: str, verdict: str, mib: float, kld: float, tok_s: float | None) -> dict:
        return {"name": name, "verdict": verdict, "bits_per_weight": 4.5,
                "size_bytes": int(mib * 2**20), "seconds": 60.0,
                "metrics": {"domain.kld": {"value": kld, "limit": 0.05, "op": "<=",
                                           "passed": kld <= 0.05}},
                **({"speed": {"output_tok_s": tok_s}} if tok_s else {})}

    auto = {"candidates": [row("W4g128", "fail", 4500, 0.08, None),
                           row("W4A8g128", "pass", 4600, 0.04, 1150.0),
                           row("FP8", "pass", 8200, 0.01, 1310.0)],
            "reference": {"output_tok_s": 1000.0}, "load": [1, 64], "prefer": "speed",
            "chosen": "FP8"}
    (tmp_path / "auto.json").write_text(json.dumps(auto), encoding="utf-8")
    html = render(tmp_path, example())
    assert "chosen by speed at concurrency 1,64" in html
    assert "output tok/s at 1,64 (x original)" in html
    assert "1,310 (1.31x)" in html and "1,150 (1.15x)" in html
    chart = html[html.index("domain.kld against speed"):]
    chart = chart[:chart.index("</svg>")]
    assert "original 1000 tok/s" in chart  # the original's speed, dashed
    assert chart.count("<circle") == 2  # one dot per measured candidate, not the failed one
    assert "W4A8g128" in chart and "FP8" in chart


def test_a_gate_failed_by_no_signal_names_the_measurement_not_the_usual_causes(
        tmp_path: Path) -> None:
    results = example()
    results["gate"] = {"verdict": "fail", "failing": ["humaneval.retention"], "checks": [
        {"task": "humaneval", "metric": "retention", "op": ">=", "limit": 0.95, "value": None,
         "n": 164, "passed": False, "too_small": False, "note": "no signal: 0/164 on both"}]}
    html = render(tmp_path, results)
    gate = html[html.index('id="thresholds"'):html.index('id="retention"')]
    assert "Measured nothing about the quantization" in gate
    assert "the original model scores 0 on humaneval" in gate
    assert "Calibration set off-domain" not in gate and "The usual causes" not in gate
