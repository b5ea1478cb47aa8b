"""A bench results dict -> one self-contained report.html: the recommendation first, then curves."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from quantkit.gpu import BUSY_WAITS
from quantkit.report.charts import (
    FAIL_COLOUR,
    NEUTRAL_COLOUR,
    PASS_COLOUR,
    THRESHOLD_COLOUR,
    Series,
    e,
    kv,
    line_chart,
    num,
    pct,
    table,
)
from quantkit.report.html import page, section

if TYPE_CHECKING:
    from quantkit.records import BenchLevel, BenchResults

P99_COLOUR = "#6a1b9a"
BENCH_CSS = """
.verdict.bench{background:#1565c0}.verdict .sub{font-size:16px;margin-top:6px;opacity:.95}
tr.knee td{background:#fff6e5;font-weight:600}.chart .mark{fill:#333;font-size:12px}
.unsteady{color:#c62828;font-weight:600}
"""


def render_bench_report(results: BenchResults) -> str:
    """The whole HTML page for one bench results dict (pure)."""
    rows = sorted((r for r in results.get("levels") or [] if isinstance(r, dict)),
                  key=lambda r: r.get("concurrency") or 0)
    body = [_header(results), _curves(results, rows), _levels(results, rows), _errors(rows),
            _settings(results)]
    title = f"bench: {results.get('model')} at {results.get('url')}"
    return page(title, body, BENCH_CSS)


def _header(r: BenchResults) -> str:
    knee = r.get("knee") or {}
    facts = [("server", r.get("url")), ("model", r.get("model")), ("endpoint", r.get("endpoint")),
             ("knee", knee.get("concurrency")), ("why", knee.get("reason")),
             ("created", r.get("created"))]
    if line := r.get("roofline"):
        from quantkit.roofline import Roofline

        facts.append(("roofline", Roofline(**line).sentence()))
    unsteady = [row.get("concurrency") for row in r.get("levels") or []
                if isinstance(row, dict) and row.get("unsteady")]
    if unsteady:
        facts.append(("unsteady", f"concurrency {', '.join(map(str, unsteady))}: the repeats "
                                  "spread more than 10%; measure again on a quieter machine, or "
                                  "with more --repeats and --min-seconds"))
    dl = "".join(f"<dt>{k}</dt><dd>{e(v)}</dd>" for k, v in facts if v is not None)
    return (f'<header class="verdict bench" id="recommendation">'
            f'<div class="word">max concurrency {e(r.get("recommended_concurrency"))}</div>'
            f'<div class="sub">recommended: the knee less '
            f'{num(((r.get("settings") or {}).get("headroom") or 0) * 100, 0)}% headroom</div>'
            f"<dl>{dl}</dl></header>")


def _curve(rows: list[BenchLevel], key: str, stat: str, scale: float = 1.0
           ) -> list[tuple[float, float | None]]:
    points: list[tuple[float, float | None]] = []
    for row in rows:
        value: Any = row.get(key)  # a figure, or a distribution's (by `stat`)
        value = (value or {}).get(stat) if stat else value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            value = None
        points.append((row.get("concurrency") or 0, None if value is None else value * scale))
    return points


def _curves(r: BenchResults, rows: list[BenchLevel]) -> str:
    if not rows:
        return section("curves", "Curves", "<p>No level was measured.</p>")
    knee = (r.get("knee") or {}).get("concurrency")
    rec = r.get("recommended_concurrency")
    word = "highest tested" if (r.get("knee") or {}).get("limited_by") == "max_tested" else "knee"
    marks = [(knee, f"{word} {knee}", THRESHOLD_COLOUR)] if isinstance(knee, int) else []
    if isinstance(rec, int) and rec != knee:
        marks.append((rec, f"recommended {rec}", PASS_COLOUR))
    settings = r.get("settings") or {}

    def target(key: str) -> list[tuple[float, str, str]]:
        value = settings.get(key)
        return ([(value * 1000, f"P99 target {value:g} s", FAIL_COLOUR)]
                if isinstance(value, (int, float)) else [])

    def p50_p99(key: str, name: str) -> list[Series]:
        median = f"{key.removesuffix('_s')}_p50_s"  # the median of the repeats' P50s, if any
        p50 = (_curve(rows, median, "", 1000) if any(median in row for row in rows)
               else _curve(rows, key, "p50", 1000))
        return [Series(f"P50 {name}", p50, NEUTRAL_COLOUR, bars=_bars(rows, median, 1000)),
                Series(f"P99 {name}", _curve(rows, key, "p99", 1000), P99_COLOUR, dashed=True)]

    charts = [
        ("Throughput", line_chart(
            [Series("output tokens/s", _curve(rows, "output_token_throughput", ""),
                    bars=_bars(rows, "output_token_throughput"))],
            "Output token throughput vs concurrency", "concurrency (requests in flight)",
            "output tokens/s", log_x=True, x_marks=marks)),
        ("Time to first token", line_chart(
            p50_p99("ttft_s", "TTFT"), "TTFT vs concurrency", "concurrency (requests in flight)",
            "TTFT (ms)", log_x=True, x_marks=marks, y_marks=target("p99_ttft_target_s"))),
        ("Time per output token", line_chart(
            p50_p99("tpot_s", "TPOT"), "TPOT vs concurrency", "concurrency (requests in flight)",
            "TPOT (ms)", log_x=True, x_marks=marks)),
        ("End-to-end latency", line_chart(
            p50_p99("e2e_s", "latency"), "End-to-end latency vs concurrency",
            "concurrency (requests in flight)", "latency (ms)", log_x=True, x_marks=marks,
            y_marks=target("p99_e2e_target_s"))),
    ]
    note = ('<p class="meta">Dashed orange line: the knee, where more concurrency stops paying in '
            "throughput or breaks a latency target; dashed green line: the recommended maximum. "
            "The concurrency axis is logarithmic. Each point is the median of the level's "
            "repeats; the error bars are the 95% t-interval of their mean "
            "(none with one repeat).</p>")
    return section("curves", "Curves", note + "".join(f"<h3>{t}</h3>{c}" for t, c in charts))


def _bars(rows: list[BenchLevel], key: str, scale: float = 1.0
          ) -> tuple[tuple[float, float, float], ...]:
    """Error bars (concurrency, lo, hi) from each row's `KEY_ci`."""
    out = []
    for row in rows:
        ci = row.get(f"{key}_ci")
        if isinstance(ci, list) and len(ci) == 2 and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in ci):
            out.append((float(row.get("concurrency") or 0), ci[0] * scale, ci[1] * scale))
    return tuple(out)


def _ms(d: Any, stat: str) -> str:
    value = (d or {}).get(stat) if isinstance(d, dict) else None
    return f'<td class="num">{num(value * 1000, 1) if isinstance(value, (int, float)) else "—"}</td>'


def _levels(r: BenchResults, rows: list[BenchLevel]) -> str:
    if not rows:
        return ""
    knee = (r.get("knee") or {}).get("concurrency")
    headers = ["concurrency", "req/s", "output tok/s", "95% interval", "repeats", "TTFT P50",
               "TTFT P99", "TPOT P50", "TPOT P99", "ITL P50", "ITL P99", "E2E P50", "E2E P99",
               "errors"]
    busy = any(row.get("gpu_busy_pct") is not None for row in rows)
    if busy:
        headers.append("GPU busy")
    lines = []
    for row in rows:
        ci = row.get("output_token_throughput_ci")
        shown = (f"{num(ci[0], 1)} – {num(ci[1], 1)}" if isinstance(ci, list) and len(ci) == 2
                 else "—")
        figures = ", ".join(num(r.get("output_token_throughput"), 1)
                            for r in row.get("repeats") or [] if isinstance(r, dict))
        spread = (row.get("output_token_throughput_spread") or 0) * 100
        flag = (f' <span class="unsteady">unsteady: {num(spread, 0)}% spread</span>'
                if row.get("unsteady") else "")
        cells = [f'<td class="num">{num(row.get("concurrency"))}</td>',
                 f'<td class="num">{num(row.get("request_throughput"), 2)}</td>',
                 f'<td class="num">{num(row.get("output_token_throughput"), 1)}</td>',
                 f'<td class="num">{shown}</td>', f"<td>{figures or '—'}{flag}</td>"]
        for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
            cells += [_ms(row.get(key), "p50"), _ms(row.get(key), "p99")]
        cells.append(f'<td class="num">{num(row.get("errors"))} / {num(row.get("requests"))}</td>')
        if busy:
            share = row.get("gpu_busy_pct")
            cells.append(f'<td class="num">{"—" if share is None else pct(share / 100, 0)}</td>')
        cls = ' class="knee"' if row.get("concurrency") == knee else ""
        lines.append(f"<tr{cls}>" + "".join(cells) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in headers)
    html = f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(lines)}</tbody></table>"
    note = ('<p class="meta">Latencies in milliseconds. TTFT: to the first streamed text; TPOT: '
            "(end-to-end − TTFT) / (output tokens − 1); ITL: gaps between streamed chunks. "
            "Throughput: the median of the repeats (each repeat's figure listed), its 95% "
            "t-interval of the mean; a level whose repeats spread more than "
            f"{num(((r.get('settings') or {}).get('unsteady_spread') or 0.1) * 100, 0)}% "
            "((max − min) / median) is unsteady: the server's speed drifted while it was "
            "measured. Latency percentiles are over every counted request of every repeat. "
            "The knee's row is highlighted."
            + (" GPU busy: the share of time a kernel ran on the serving GPU (nvidia-smi, the "
               f"median of the repeats); under {BUSY_WAITS:.0f}% under load, the GPU waits on "
               "the host (the client, the server's Python), and tokens/s falls with it."
               if busy else "")
            + "</p>")
    return section("levels", "Per level", html + note)


def _errors(rows: list[BenchLevel]) -> str:
    failed = [row for row in rows if row.get("errors")]
    held = sum(row.get("no_text") or 0 for row in rows)
    note = (f"<p>{held} request(s) completed with tokens counted by the server but no text: their "
            "bytes never formed a complete UTF-8 character, so the server held the text back "
            "(typical of random-weight models). They count as completed, without TTFT.</p>"
            if held else "")
    if not failed:
        return section("errors", "Errors", "<p>No request failed.</p>" + note)
    items = [[num(row.get("concurrency")), num(row.get("errors")),
              "".join(f"<pre>{e(m)}</pre>" for m in row.get("error_messages") or [])]
             for row in failed]
    return section("errors", "Errors",
                   table(["concurrency", "failed", "first messages"], items) + note)


def _settings(r: BenchResults) -> str:
    s = r.get("settings") or {}
    body = kv([("counted requests per repeat, at least",
                e(s.get("requests") or f"{s.get('waves') or 4} waves (x concurrency)")),
               ("repeats per level", num(s.get("repeats"))),
               ("warm-up requests per repeat", e(s.get("warmup") if s.get("warmup") is not None
                                                 else "one wave (the concurrency)")),
               ("seconds per repeat, at least", num(s.get("min_seconds"), 1)),
               ("interval", e(s.get("interval"))),
               ("concurrency levels", e(", ".join(map(str, s.get("concurrency") or [])))),
               ("temperature", num(s.get("temperature"))), ("seed", num(s.get("seed"))),
               ("knee: least throughput gain", num(s.get("min_gain"), 2)),
               ("P99 TTFT target (s)", num(s.get("p99_ttft_target_s"))),
               ("P99 end-to-end target (s)", num(s.get("p99_e2e_target_s"))),
               ("request timeout (s)", num(s.get("timeout_s"), 0)),
               ("optional fields sent", e(", ".join(sorted(s.get("sent_fields") or {})) or None)),
               ("quantkit", e(r.get("quantkit_version")))]
              + [(e(k), num(v, 1)) for k, v in (r.get("timings") or {}).items()])
    prompts = r.get("prompts") or {}
    if prompts:
        body += "<h3>Prompt mix</h3>" + table(
            ["class", "requests per level", "target prompt tokens", "measured prompt tokens",
             "max new tokens"],
            [[e(k)] + [f'<td class="num">{num(p.get(f), 1)}</td>'
                       for f in ("requests_per_level", "target_prompt_tokens",
                                 "mean_prompt_tokens", "max_tokens")]
             for k, p in prompts.items() if isinstance(p, dict)])
    return section("settings", "Settings and versions", body)
