"""Building blocks of the HTML report: escaped values, tables, inline SVG charts (no libraries)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from html import escape
from typing import Any

from quantkit.contract import MetricValue

PASS_COLOUR = "#2e7d32"
FAIL_COLOUR = "#c62828"
NEUTRAL_COLOUR = "#1565c0"
THRESHOLD_COLOUR = "#ef6c00"
GRID_COLOUR = "#d0d0d0"


# -- values: every string from results.json passes through e() or num() ----------------------

def e(value: Any) -> str:
    """Escaped text; None shows as a dash."""
    return "—" if value is None else escape(str(value))


def num(value: Any, digits: int = 3) -> str:
    """A number formatted for reading (ints grouped, floats rounded); anything else escaped."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return e(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:,.{digits}f}"


def pct(value: Any, digits: int = 1) -> str:
    return f"{value * 100:.{digits}f}%" if isinstance(value, (int, float)) else e(value)


def sig(value: Any) -> str:
    """Four significant digits (a KL in nats, a gate's measured value)."""
    return f"{value:.4g}" if isinstance(value, (int, float)) else num(value)


def interval(d: MetricValue | None, fmt: Any = num) -> str:
    """`value [lo, hi]`, or what there is of it; a metric's note ("no signal: ...") instead."""
    if d is None:
        return "—"
    if d.note:
        return e(d.note)
    ci = f" [{fmt(d.lo)}, {fmt(d.hi)}]" if d.lo is not None and d.hi is not None else ""
    return f"{fmt(d.value)}{ci}"


def table(headers: Iterable[str], rows: Iterable[Iterable[str]], cls: str = "") -> str:
    """An HTML table; headers are literals, cells must already be escaped HTML."""
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _cell(c: str) -> str:
    return c if c.startswith("<td") else f"<td>{c}</td>"


def kv(pairs: Iterable[tuple[str, str]]) -> str:
    """A two-column table of label -> escaped HTML value, skipping missing values."""
    rows = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in pairs if v not in ("", "—"))
    return f'<table class="kv"><tbody>{rows}</tbody></table>'


# -- charts ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Estimate:
    """One row of the retention chart: a point estimate, its interval and the limit it faces."""

    label: str
    value: float
    lo: float | None = None
    hi: float | None = None
    threshold: float | None = None
    passed: bool | None = None


def _ticks(lo: float, hi: float, most: int = 8) -> list[float]:
    """Round tick positions covering [lo, hi], at most `most` of them."""
    span = max(hi - lo, 1e-9)
    step = 10 ** math.floor(math.log10(span / most))
    for mult in (1, 2, 5, 10):
        if span / (step * mult) <= most:
            step *= mult
            break
    first = math.ceil(lo / step - 1e-9)
    return [round(k * step, 10) for k in range(first, math.floor(hi / step + 1e-9) + 1)]


def _svg_open(width: int, height: float, title: str) -> str:
    return (f'<svg class="chart" viewBox="0 0 {width} {height:.0f}" role="img">'
            f"<title>{escape(title)}</title>")


def _text(x: float, y: float, label: str, anchor: str = "start", cls: str = "",
          halo: bool = False) -> str:
    klass = f' class="{cls}"' if cls else ""
    # a white outline under the glyphs keeps a label legible where it crosses a line
    ring = ' stroke="#fff" stroke-width="4" stroke-linejoin="round" paint-order="stroke"' if halo else ""
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{klass}{ring}>'
            f"{escape(label)}</text>")


CHAR_W, TEXT_H = 7.6, 13.0  # a 13px label's mean glyph width and height, for layout


def _label_spots(x0: float, x1: float, ly: float, top: float, bottom: float
                 ) -> list[tuple[float, float, str]]:
    """Where a horizontal mark's label may go: under or over the line, at its right or left end
    (first choice first), inside the plot."""
    spots = [(x1 - 6, ly + 15, "end"), (x1 - 6, ly - 6, "end"), (x0 + 6, ly - 6, "start"),
             (x0 + 6, ly + 15, "start")]
    return [s for s in spots if top + TEXT_H <= s[1] <= bottom - 2] or spots[:1]


def _clearance(spot: tuple[float, float, str], label: str, data: list[tuple[float, float]]) -> float:
    """Distance from a label placed at `spot` to the nearest data pixel (0 if one is under it)."""
    x, y, anchor = spot
    w = CHAR_W * len(label)
    bx0, bx1 = (x - w, x) if anchor == "end" else (x, x + w)
    by0, by1 = y - TEXT_H + 2, y + 3
    return min((math.hypot(max(bx0 - px, 0, px - bx1), max(by0 - py, 0, py - by1))
                for px, py in data), default=math.inf)


def _along(points: list[tuple[float, float]], step: float = 3.0) -> list[tuple[float, float]]:
    """Pixels along a polyline, every `step` or so, its vertices included."""
    out = list(points[:1])
    for (ax, ay), (bx, by) in zip(points, points[1:]):
        n = max(1, int(math.hypot(bx - ax, by - ay) / step))
        out += [(ax + (bx - ax) * k / n, ay + (by - ay) * k / n) for k in range(1, n + 1)]
    return out


def retention_chart(rows: list[Estimate], title: str = "Retention (quantized / baseline)") -> str:
    """Dots with interval whiskers on one axis, a solid line at 1.0, a dashed line per limit."""
    width, left, right, row_h, top = 900, 120, 240, 36, 28
    points = [1.0] + [v for r in rows for v in (r.value, r.lo, r.hi, r.threshold)
                      if v is not None and math.isfinite(v)]
    pad = max(0.02, (max(points) - min(points)) * 0.08)
    lo, hi = min(points) - pad, max(points) + pad
    plot_w = width - left - right
    height = top + row_h * len(rows) + 24

    def x(v: float) -> float:
        return left + (v - lo) / (hi - lo) * plot_w

    parts = [_svg_open(width, height, title)]
    bottom = top + row_h * len(rows)
    for t in _ticks(lo, hi):
        parts.append(f'<line x1="{x(t):.1f}" y1="{top}" x2="{x(t):.1f}" y2="{bottom}" '
                     f'stroke="{GRID_COLOUR}" stroke-width="0.5"/>')
        parts.append(_text(x(t), bottom + 16, f"{t:g}", "middle", "tick"))
    parts.append(f'<line x1="{x(1.0):.1f}" y1="{top - 8}" x2="{x(1.0):.1f}" y2="{bottom}" '
                 f'stroke="#444" stroke-width="1.5"/>')
    parts.append(_text(x(1.0), top - 12, "1.0 = no loss", "middle", "tick"))
    for i, r in enumerate(rows):
        cy = top + row_h * i + row_h / 2
        colour = (NEUTRAL_COLOUR if r.passed is None
                  else PASS_COLOUR if r.passed else FAIL_COLOUR)
        parts.append(_text(left - 10, cy + 4, r.label, "end", "label"))
        if r.threshold is not None:
            parts.append(f'<line x1="{x(r.threshold):.1f}" y1="{cy - row_h / 2 + 3:.1f}" '
                         f'x2="{x(r.threshold):.1f}" y2="{cy + row_h / 2 - 3:.1f}" '
                         f'stroke="{THRESHOLD_COLOUR}" stroke-width="2" stroke-dasharray="4 3"/>')
        if r.lo is not None and r.hi is not None:
            parts.append(f'<line x1="{x(r.lo):.1f}" y1="{cy:.1f}" x2="{x(r.hi):.1f}" y2="{cy:.1f}" '
                         f'stroke="{colour}" stroke-width="2"/>')
            for end in (r.lo, r.hi):
                parts.append(f'<line x1="{x(end):.1f}" y1="{cy - 6:.1f}" x2="{x(end):.1f}" '
                             f'y2="{cy + 6:.1f}" stroke="{colour}" stroke-width="2"/>')
        if r.value is None or not math.isfinite(r.value):
            # e.g. HumanEval retention when the baseline solved nothing: no dot, say why
            parts.append(_text(width - right + 10, cy + 4, "not measurable (baseline is 0)",
                               "start", "value"))
            continue
        parts.append(f'<circle cx="{x(r.value):.1f}" cy="{cy:.1f}" r="5" fill="{colour}"/>')
        interval = f" [{r.lo:.3f}, {r.hi:.3f}]" if r.lo is not None and r.hi is not None else ""
        limit = f"  limit {r.threshold:g}" if r.threshold is not None else ""
        parts.append(_text(width - right + 10, cy + 4, f"{r.value:.3f}{interval}{limit}", "start",
                           "value"))
    parts.append("</svg>")
    return "".join(parts)


def delta_bars(rows: list[tuple[str, float]], title: str = "Accuracy change per subject") -> str:
    """Horizontal bars around zero, one per (label, delta), in the order given."""
    width, left, right, row_h, top = 900, 290, 70, 18, 10
    most = max([abs(d) for _, d in rows] + [0.01])
    plot_w = width - left - right
    height = top + row_h * len(rows) + 26

    def x(v: float) -> float:
        return left + (v + most) / (2 * most) * plot_w

    parts = [_svg_open(width, height, title)]
    bottom = top + row_h * len(rows)
    for t in _ticks(-most, most, 6):
        parts.append(f'<line x1="{x(t):.1f}" y1="{top}" x2="{x(t):.1f}" y2="{bottom}" '
                     f'stroke="{GRID_COLOUR}" stroke-width="0.5"/>')
        parts.append(_text(x(t), bottom + 16, f"{t:+g}" if t else "0", "middle", "tick"))
    for i, (label, delta) in enumerate(rows):
        y0 = top + row_h * i
        colour = FAIL_COLOUR if delta < 0 else PASS_COLOUR
        x0, x1 = sorted((x(0.0), x(delta)))
        parts.append(f'<rect x="{x0:.1f}" y="{y0 + 3:.1f}" width="{max(x1 - x0, 1):.1f}" '
                     f'height="{row_h - 6}" fill="{colour}"/>')
        parts.append(_text(left - 8, y0 + row_h - 5, label, "end", "label"))
        parts.append(_text(width - right + 8, y0 + row_h - 5, f"{delta:+.3f}", "start", "value"))
    parts.append(f'<line x1="{x(0.0):.1f}" y1="{top}" x2="{x(0.0):.1f}" y2="{bottom}" '
                 f'stroke="#444" stroke-width="1.5"/>')
    parts.append("</svg>")
    return "".join(parts)


@dataclass(frozen=True)
class Series:
    """One line of a line chart: (x, y) points; points with a missing or non-finite y are skipped.
    `bars` are error bars: x -> (lo, hi), drawn as a capped vertical line."""

    label: str
    points: list[tuple[float, float | None]]
    colour: str = NEUTRAL_COLOUR
    dashed: bool = False
    bars: tuple[tuple[float, float, float], ...] = ()  # (x, lo, hi)


def line_chart(series: list[Series], title: str, x_label: str, y_label: str, *,
               log_x: bool = False, x_marks: Iterable[tuple[float, str, str]] = (),
               y_marks: Iterable[tuple[float, str, str]] = ()) -> str:
    """Lines with dots over a y axis from 0; x_marks / y_marks are dashed (value, label, colour).
    The legend's margin is as wide as its longest label; a mark's label goes where it covers no
    data."""
    longest = max((len(s.label) for s in series), default=0)
    width, left, right, top, height = 900, 70, max(170, 44 + math.ceil(CHAR_W * longest)), 16, 300
    bottom = height - 44
    pts = [[(float(x), float(y)) for x, y in s.points
            if y is not None and _finite(x) and _finite(y) and (x > 0 or not log_x)]
           for s in series]
    xs = sorted({x for p in pts for x, _ in p})
    x_marks = [m for m in x_marks if _finite(m[0]) and (m[0] > 0 or not log_x)]
    y_marks = [m for m in y_marks if _finite(m[0])]
    if not xs:
        return _svg_open(width, 40, title) + _text(left, 24, "no data", "start", "tick") + "</svg>"
    fx = (lambda v: math.log10(v)) if log_x else (lambda v: v)
    x_lo, x_hi = fx(min(xs + [m[0] for m in x_marks])), fx(max(xs + [m[0] for m in x_marks]))
    x_span = x_hi - x_lo or 1.0
    bars = [[(float(a), float(lo), float(hi)) for a, lo, hi in s.bars
             if _finite(a) and _finite(lo) and _finite(hi) and (a > 0 or not log_x)]
            for s in series]
    y_hi = max([y for p in pts for _, y in p] + [hi for b in bars for _, _, hi in b]
               + [m[0] for m in y_marks] + [1e-9]) * 1.1

    def x(v: float) -> float:
        return left + 10 + (fx(v) - x_lo) / x_span * (width - left - right - 20)

    def y(v: float) -> float:
        return bottom - v / y_hi * (bottom - top)

    drawn = [_along(sorted((x(a), y(b)) for a, b in p)) for p in pts]
    data = [px for line in drawn for px in line]
    parts = [_svg_open(width, height, title)]
    for t in _ticks(0.0, y_hi, 6):
        parts.append(f'<line x1="{left}" y1="{y(t):.1f}" x2="{width - right}" y2="{y(t):.1f}" '
                     f'stroke="{GRID_COLOUR}" stroke-width="0.5"/>')
        parts.append(_text(left - 6, y(t) + 4, f"{t:g}", "end", "tick"))
    for t in xs if log_x else _ticks(xs[0], xs[-1], 8):
        parts.append(_text(x(t), bottom + 16, f"{t:g}", "middle", "tick"))
    parts.append(f'<line x1="{left}" y1="{bottom}" x2="{width - right}" y2="{bottom}" '
                 f'stroke="#444" stroke-width="1"/>')
    parts.append(_text((left + width - right) / 2, height - 8, x_label, "middle", "label"))
    parts.append(f'<text x="14" y="{(top + bottom) / 2:.1f}" text-anchor="middle" class="label" '
                 f'transform="rotate(-90 14 {(top + bottom) / 2:.1f})">{escape(y_label)}</text>')
    middle = (left + width - right) / 2
    for i, (value, label, colour) in enumerate(x_marks):
        parts.append(f'<line x1="{x(value):.1f}" y1="{top}" x2="{x(value):.1f}" y2="{bottom}" '
                     f'stroke="{colour}" stroke-width="2" stroke-dasharray="5 4"/>')
        right_side = x(value) < middle  # labels run away from the nearer edge
        parts.append(_text(x(value) + (4 if right_side else -4), top + 12 + 15 * i, label,
                           "start" if right_side else "end", "mark", halo=True))
    for value, label, colour in y_marks:
        parts.append(f'<line x1="{left}" y1="{y(value):.1f}" x2="{width - right}" '
                     f'y2="{y(value):.1f}" stroke="{colour}" stroke-width="2" '
                     f'stroke-dasharray="5 4"/>')
        # under or over the line, at its right or left end: wherever it covers no data
        spots = _label_spots(left, width - right, y(value), top, bottom)
        clear = [sp for sp in spots if _clearance(sp, label, data) > 4]
        lx, ly, anchor = clear[0] if clear else max(
            spots, key=lambda sp: _clearance(sp, label, data))
        parts.append(_text(lx, ly, label, anchor, "mark", halo=True))
    for i, (s, p) in enumerate(zip(series, pts)):
        dash = ' stroke-dasharray="7 4"' if s.dashed else ""
        if len(p) > 1:
            path = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in sorted(p))
            parts.append(f'<polyline points="{path}" fill="none" stroke="{s.colour}" '
                         f'stroke-width="2"{dash}/>')
        parts += [f'<circle cx="{x(a):.1f}" cy="{y(b):.1f}" r="3.5" fill="{s.colour}"/>'
                  for a, b in p]
        for a, lo, hi in bars[i]:
            cx, y0, y1 = x(a), y(max(lo, 0.0)), y(hi)
            parts.append(f'<path class="bar" d="M{cx:.1f},{y0:.1f}V{y1:.1f}M{cx - 4:.1f},'
                         f'{y0:.1f}h8M{cx - 4:.1f},{y1:.1f}h8" stroke="{s.colour}" '
                         f'stroke-width="1.5" fill="none"/>')
        ly = top + 8 + 18 * i
        parts.append(f'<line x1="{width - right + 8}" y1="{ly:.1f}" x2="{width - right + 30}" '
                     f'y2="{ly:.1f}" stroke="{s.colour}" stroke-width="2"{dash}/>')
        parts.append(_text(width - right + 36, ly + 4, s.label, "start", "label"))
    parts.append("</svg>")
    return "".join(parts)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
