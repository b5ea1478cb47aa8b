"""results.json -> one self-contained report.html: inline CSS and SVG, nothing fetched."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantkit.artifact import scheme_name
from quantkit.contract import AutoResult, Candidate, GateDecision
from quantkit.fsutil import atomic_write_text
from quantkit.methods import instead
from quantkit.records import Speed
from quantkit.report.charts import Estimate, e, kv, num, pct, retention_chart, sig, table
from quantkit.report.html import page, section
from quantkit.report.tasks import task_section
from quantkit.results import CARD, Results, calibration_match
from quantkit.task_registry import task as task_spec

REPORT = "report.html"
OPS = {">=": "≥", "<=": "≤", ">": "&gt;", "<": "&lt;"}
VERDICTS = {"pass": ("PASS", "pass"), "fail": ("FAIL", "fail"), "not gated": ("NOT GATED", "none")}


@dataclass(frozen=True)
class Page:
    """What one report shows: the validation, and beside it in its folder `quantkit auto`'s
    candidates (auto.json), `quantkit run`'s phase table (run.json: step -> its figures) and the
    model card's file name where `quantkit card` wrote one."""

    results: Results
    auto: AutoResult | None = None
    steps: dict[str, dict[str, Any]] | None = None
    card: str | None = None


def write_report(report_dir: Path) -> Path:
    """Render `report_dir/results.json` (and `auto.json`, the candidates `quantkit auto` tried,
    where present) into `report_dir/report.html` (replaced atomically)."""
    import json

    auto = report_dir / "auto.json"
    phases = report_dir / "run.json"  # `quantkit run`'s phase table
    html = render_report(Page(
        Results.read(report_dir),
        AutoResult.from_dict(json.loads(auto.read_text(encoding="utf-8")))
        if auto.is_file() else None,
        json.loads(phases.read_text(encoding="utf-8")).get("steps") if phases.is_file() else None,
        CARD if (report_dir / CARD).is_file() else None))  # `quantkit card` wrote one beside it
    out = report_dir / REPORT
    atomic_write_text(out, html)
    return out


def render_report(p: Page) -> str:
    """The whole HTML page of one validation (pure; write_report puts it on disk)."""
    r = p.results
    word = VERDICTS.get(r.verdict, VERDICTS["not gated"])[0]
    body = [_header(p), _gate(r), _candidates(p.auto), _retention(r),
            *(task_section(name, t, r) for name, t in r.tasks.items()),
            _calibration(r), _quantization(r), _versions(p)]
    title = f"{word}: {_name(r.artifact.to_dict())} vs {_name(r.baseline.to_dict())}"
    return page(title, body)


def _candidates(auto: AutoResult | None) -> str:
    """`quantkit auto`'s candidates: a table, and each gated metric against size; with --load,
    each passing candidate's output tokens/s at the load beside the original's, and each metric
    against that speed."""
    rows = auto.candidates if auto is not None else []
    if not rows:
        return ""
    keys = list(dict.fromkeys(k for r in rows for k in r.metrics))
    load = (auto.load if auto is not None else None) or []
    base = ((auto.reference if auto is not None else None) or {}).get("output_tok_s")
    cells = []
    for r in rows:
        ms = r.metrics
        cells.append([e(r.name), num(r.bits_per_weight), num(round(r.size_bytes / 2**20, 1))]
                     + [(sig(ms[k].value) + ("" if ms[k].passed else " ✗")) if k in ms
                        else "—" for k in keys]
                     + ([_tok_s(r.speed, base)] if load else [])
                     + [e(r.verdict), num(r.seconds)])
    speed_head = [f"output tok/s at {','.join(map(str, load))} (x original)"] if load else []
    body = table(["candidate", "bits/weight", "MiB"] + keys + speed_head + ["verdict", "seconds"],
                 cells)
    from quantkit.report.charts import Series, line_chart

    for k in keys:
        pts = [(r.size_bytes / 2**20, r.metrics[k].value if k in r.metrics else None)
               for r in rows]
        limit = next((r.metrics[k].limit for r in rows if k in r.metrics), None)
        marks = [(limit, f"limit {limit:g}", "#ef6c00")] if limit is not None else []
        body += line_chart([Series(k, pts)], f"{k} by size", "size (MiB)", k, y_marks=marks)
        if load:
            body += _by_speed(rows, k, marks, base, load)
    title = "Candidates tried by quantkit auto (smallest first)"
    if load and auto is not None:
        title += f"; chosen by {auto.prefer} at concurrency " + ",".join(map(str, load))
    return section("candidates", title, body)


SPEED_COLOURS = ("#1565c0", "#2e7d32", "#6a1b9a", "#00838f", "#ad1457", "#5d4037", "#455a64")


def _by_speed(rows: list[Candidate], key: str, y_marks: list[tuple[float, str, str]],
              base: float | None, load: list[int]) -> str:
    """One dot per measured candidate: the metric against output tokens/s; the original's speed
    a dashed line."""
    from quantkit.report.charts import Series, line_chart

    measured = [r for r in rows if (r.speed or {}).get("output_tok_s") and key in r.metrics]
    if not measured:
        return ""
    series = [Series(r.name, [(float((r.speed or {})["output_tok_s"] or 0), r.metrics[key].value)],
                     SPEED_COLOURS[i % len(SPEED_COLOURS)]) for i, r in enumerate(measured)]
    x_marks = [(base, f"original {base:.0f} tok/s", "#757575")] if base else []
    return line_chart(series, f"{key} against speed at concurrency {','.join(map(str, load))}",
                      "output tokens/s (geometric mean over the load)", key, x_marks=x_marks,
                      y_marks=y_marks)


def _tok_s(speed: Speed | None, base: float | None) -> str:
    if not speed:
        return "—"
    if speed.get("error"):
        return "not measured: " + e(speed["error"])[:120]
    value = speed.get("output_tok_s")
    if value is None:
        return "failed requests"
    return num(round(value)) + (f" ({value / base:.2f}x)" if base else "")


def _name(ref: dict[str, Any]) -> str:
    return str(ref.get("label") or ref.get("path") or "?")


def _passfail(passed: Any) -> str:
    return {True: '<span class="ok">pass</span>', False: '<span class="bad">FAIL</span>'}.get(
        passed, "—")


def _manifest(r: Results) -> dict[str, Any]:
    return r.artifact.manifest or {}


# -- sections, in reading order ------------------------------------------------------------------

def _header(p: Page) -> str:
    r = p.results
    word, cls = VERDICTS.get(r.verdict, VERDICTS["not gated"])
    art, base = r.artifact, r.baseline
    facts = [("artifact", art.path), ("baseline", base.label or base.path),
             ("engine", " ".join(str(x) for x in (r.engine, r.engine_version) if x)
              or None), ("method", _manifest(r).get("method")), ("created", r.created)]
    dl = "".join(f"<dt>{k}</dt><dd>{e(v)}</dd>" for k, v in facts if v is not None)
    if p.card:  # a relative link to the file beside the report: nothing is fetched
        dl += f'<dt>model card</dt><dd><a href="{e(p.card)}">{e(p.card)}</a></dd>'
    return (f'<header class="verdict {cls}" id="verdict"><div class="word">{word}</div>'
            f"<dl>{dl}</dl></header>")


def _gate(r: Results) -> str:
    gate = r.gate
    if not gate.checks:
        return section("thresholds", "Thresholds",
                       "<p>No thresholds were given, so this run is not gated.</p>")
    rows = [[f"<code>{e(c.task)}.{e(c.metric)}</code>",
             f'<td class="num">{"—" if c.note else num(c.value)}</td>',
             f"[{num(c.lo)}, {num(c.hi)}]" if c.lo is not None else "—",
             f"{OPS.get(c.op, e(c.op))} {num(c.limit)}", _passfail(c.passed),
             '<span class="note">sample too small to support the verdict</span>'
             if c.too_small and not c.note else e(c.note or "")]
            for c in gate.checks]
    body = table(["check", "value", "interval", "limit", "result", "note"], rows)
    if gate.verdict == "fail":
        body += _causes(r, gate)
    return section("thresholds", "Thresholds", body)


def _causes(r: Results, gate: GateDecision) -> str:
    from quantkit.gate import unmeasured_cause

    failing = [c for c in gate.checks if not c.passed]
    names = ", ".join(f"<code>{e(c.name)}</code>" for c in failing)
    unmeasured = "".join(f"<li>{e(unmeasured_cause(c))}</li>" for c in failing if c.unmeasured)
    body = f'<div class="causes"><p><b>Failing:</b> {names}</p>'
    if any(not c.unmeasured for c in failing):
        body += "<p>The usual causes, most likely first:</p><ol>" + _usual_causes(r) + "</ol>"
    if unmeasured:
        body += ("<p>Measured nothing about the quantization (the fix is in the task, not the "
                 f"model):</p><ul>{unmeasured}</ul>")
    return body + "</div>"


def _usual_causes(r: Results) -> str:
    """The usual causes of a quantized model that measured worse, with this artifact's facts."""
    match = calibration_match(r)  # the summary's warning reads the same
    if match:
        poor = " — poor: the set does not look like the domain" if match.get("poor") else ""
        seen = (f"JS divergence {num(match.get('js_divergence'))} bits to the domain set, "
                f"{pct(match.get('target_token_coverage'))} of domain tokens covered{poor}.")
    else:
        seen = ("Its match to the domain set was not measured; rebuild it with "
                "<code>quantkit calibrate ... --target DOMAIN_FILE</code> to see.")
    m = _manifest(r)
    params = m.get("parameters") or {}
    alt = instead(str(m.get("method")), params)
    return (f"<li><b>Calibration set off-domain.</b> {seen}</li>"
            f"<li><b>Method.</b> This artifact used <code>{e(m.get('method'))}</code>; {alt} "
            "often recovers accuracy at the same size.</li>"
            f"<li><b>Bits.</b> {e(scheme_name(m.get('method'), params))}; more bits or smaller "
            "groups trade size for accuracy.</li>" + _fp8_causes(params))


def _fp8_causes(params: dict[str, Any]) -> str:
    """What FP8 activations and an FP8 KV cache can cost, where the artifact has them."""
    out = ""
    if params.get("act_fp8") == "static":
        out += ("<li><b>Static FP8 activations.</b> One scale per linear input, from the "
                "calibration set's largest value; per-token scales (<code>--method fp8</code> "
                "without <code>--static</code>) keep more, at some speed under load.</li>")
    elif params.get("act_fp8"):
        out += ("<li><b>FP8 activations.</b> Inputs rounded to E4M3 per token; 16-bit "
                "activations (W8A16, W4A16) keep more.</li>")
    if params.get("kv_fp8"):
        out += ("<li><b>FP8 KV cache.</b> Keys and values stored in E4M3 with one calibrated "
                "scale per layer; long documents lose most (the <code>long_context</code> task). "
                "Re-quantize without <code>--kv-cache fp8</code> to compare.</li>")
    return out


def _retention(r: Results) -> str:
    checks = {(c.task, c.metric): c for c in r.gate.checks}
    rows = []
    for task, result in r.tasks.items():
        spec = task_spec(task)
        metric, label = spec.headline, spec.title
        est = result.metric(metric) if metric is not None else None
        if metric is None or est is None or not isinstance(est.value, (int, float)):
            continue
        check = checks.get((task, metric))
        rows.append(Estimate(label, est.value, est.lo, est.hi, check.limit if check else None,
                             check.passed if check else None))
    if not rows:
        return ""
    note = ('<p class="meta">Dots: quantized score / baseline score; whiskers: interval; solid '
            "line: no loss; dashed orange line: the limit.</p>")
    return section("retention", "Retention per task", retention_chart(rows) + note)


def _calibration(r: Results) -> str:
    calib = r.calibration or {}
    cm, stats = calib.get("manifest") or {}, calib.get("stats") or {}
    am = _manifest(r).get("calibration") or {}
    if not (calib or am):
        return ""
    counts, lengths = cm.get("counts") or {}, stats.get("token_length") or {}
    body = kv([("path", f"<code>{e(am.get('path'))}</code>" if am.get("path") else ""),
               ("samples", num(counts.get("samples") or cm.get("samples") or am.get("samples"))),
               ("tokens", num(counts.get("tokens") or stats.get("tokens") or am.get("tokens"))),
               ("mean tokens per sample", num(stats.get("mean_tokens") or lengths.get("mean"), 1)),
               ("sample length range", f"{num(lengths['min'])} – {num(lengths['max'])}"
                if "min" in lengths and "max" in lengths else ""),
               ("samples sha256", f"<code>{e(am.get('samples_sha256') or cm.get('samples_sha256'))}"
                "</code>" if am.get("samples_sha256") or cm.get("samples_sha256") else "")])
    mix = stats.get("mix") or {}
    sources = cm.get("sources") or []
    if sources:
        body += "<h3>Sources and mix</h3>" + table(
            ["source", "requested share", "actual share", "samples", "rendering"],
            [[f"<code>{e(src.get('spec') or src.get('location'))}</code>",
              pct(src.get("weight")), pct((mix.get(src.get("location")) or {}).get("actual_share")),
              num((mix.get(src.get("location")) or {}).get("actual")), e(src.get("rendering"))]
             for src in sources])
    match = calibration_match(r)
    if match:
        missing = ", ".join(f"<code>{e(t)}</code>" for t in match.get("missing_top_tokens") or [])
        body += "<h3>Match to the domain set</h3>" + kv([
            ("JS divergence (bits)", num(match.get("js_divergence"))),
            ("domain tokens covered", pct(match.get("target_token_coverage"))),
            ("verdict", '<span class="bad">poor match</span>' if match.get("poor") else
             ('<span class="ok">acceptable</span>' if "poor" in match else "")),
            ("frequent domain tokens missing", missing)])
    return section("calibration", "Calibration set", body)


def _quantization(r: Results) -> str:
    art, base, m = r.artifact, r.baseline, _manifest(r)
    if not (art.to_dict() or m):
        return ""
    src, params, size = m.get("source") or {}, m.get("parameters") or {}, m.get("size_bytes") or {}
    ratio = (f" ({size['after'] / size['before']:.1%} of the original)"
             if isinstance(size.get("before"), (int, float)) and size.get("before")
             and isinstance(size.get("after"), (int, float)) else "")

    def sha(value: Any) -> str:
        return f"<code>{e(value)}</code>" if value else ""

    body = kv([("method", e(m.get("method")))]
              + [(f"{e(k)}", num(v)) for k, v in params.items()]
              + [("artifact", sha(art.path)), ("artifact sha256", sha(art.sha256)),
                 ("source model", e(src.get("spec"))), ("architecture", e(src.get("architecture"))),
                 ("parameters", num(src.get("parameters"))),
                 ("source weights sha256", sha(src.get("weights_sha256"))),
                 ("source model sha256", sha(src.get("model_sha256"))),
                 ("baseline", sha(base.path)), ("baseline sha256", sha(base.sha256)),
                 ("size before (bytes)", num(size.get("before"))),
                 ("size after (bytes)", num(size.get("after")) + ratio)]
              + _bits(m) + _experts(m)
              + [("quantization wall time (s)", num(m.get("wall_time_s"), 1))])
    return section("quantization", "Quantization parameters and provenance", body)


def _bits(m: dict[str, Any]) -> list[tuple[str, str]]:
    """Bits per weight, saying what they count."""
    rows = []
    if m.get("bits_per_weight") is not None:
        rows.append(("bits per weight, whole model",
                     f"{num(m['bits_per_weight'])} (every tensor's bytes &times; 8 / the "
                     "original's parameters: embeddings, norms and scales count, the unquantized "
                     "tensors in the source's dtype)"))
    if m.get("linear_bits_per_weight") is not None:
        rows.append(("bits per weight, quantized linears",
                     f"{num(m['linear_bits_per_weight'])} (packed values, scales and zero points "
                     "over the linears' weights)"))
    return rows


def _experts(m: dict[str, Any]) -> list[tuple[str, str]]:
    """Expert coverage of a mixture-of-experts artifact: tokens per expert, those under the floor."""
    if not m.get("experts"):
        return []
    from quantkit.artifact import expert_coverage

    return [("expert coverage", e(expert_coverage(m["experts"]).removeprefix("experts: ")))]


def _versions(p: Page) -> str:
    r = p.results
    settings, timings = r.settings or {}, r.timings or {}
    made_with = (_manifest(r).get("versions") or {}).items()
    versions = {"quantkit (validation)": r.quantkit_version,
                **{f"{k} (quantization)": v for k, v in made_with}}
    body = kv([(e(k), e(v)) for k, v in versions.items()]
              + [("created", e(r.created)), ("engine", e(r.engine)),
                 ("tasks", e(", ".join(map(str, settings.get("tasks") or [])))),
                 ("limit", num(settings.get("limit"))), ("seed", num(settings.get("seed")))])
    def peaks(use: Any) -> list[str]:
        use = use if isinstance(use, dict) else {}
        return [f'<td class="num">{num(use.get(k), 1)}</td>' if use.get(k) is not None
                else "<td>—</td>" for k in ("peak_rss_gib", "peak_gpu_gib")]

    steps = p.steps or {}
    if steps:
        rows = [[e(name), f'<td class="num">{num(s.get("seconds"), 1)}</td>', *peaks(s),
                 e("reused" if s.get("reused") else "ran")] for name, s in steps.items()]
        body += ("<h3>Run phases (quantkit run)</h3>"
                 + table(["step", "seconds", "peak CPU GiB", "peak GPU GiB", ""], rows))
    rows = [[e(task)] + [f'<td class="num">{num(getattr(t.seconds, side), 1)}</td>'
                         for side in ("baseline", "quantized")] + peaks(t.resources)
            for task, t in r.tasks.items() if t.seconds is not None]
    if rows:
        body += "<h3>Task timings (seconds; peak memory over both models)</h3>" + table(
            ["task", "baseline", "quantized", "peak CPU GiB", "peak GPU GiB"], rows)
    if timings:
        body += "<h3>Run timings (seconds)</h3>" + kv([(e(k), num(v, 1))
                                                       for k, v in timings.items()])
    return section("versions", "Versions and timings", body)
