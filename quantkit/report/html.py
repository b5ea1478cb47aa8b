"""The page shell every quantkit report shares: a CSP that forbids any fetch, inline CSS."""

from __future__ import annotations

from quantkit.report.charts import e

# Untrusted model output is escaped; the policy is a second fence: no script, no network at all.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
CSS = """
body{font:15px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1100px;padding:0 20px 40px}
h2{border-bottom:2px solid #ddd;padding-bottom:4px;margin-top:34px}
.verdict{padding:18px 24px;border-radius:8px;margin-top:18px;color:#fff;background:#616161}
.verdict.pass{background:#2e7d32}.verdict.fail{background:#c62828}
.verdict .word{font-size:56px;font-weight:800;letter-spacing:2px;line-height:1}
.verdict dl{display:grid;grid-template-columns:max-content auto;gap:2px 14px;margin:12px 0 0}
.verdict dt{opacity:.85}.verdict dd{margin:0;font-weight:600;word-break:break-all}
.verdict a{color:#fff}
table{border-collapse:collapse;margin:8px 0;font-size:14px}th{background:#f4f4f4}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
td.num{text-align:right;font-variant-numeric:tabular-nums}.meta{color:#555;font-size:13px}
.ok{color:#2e7d32;font-weight:700}.bad{color:#c62828;font-weight:700}.note{color:#8d6e00}
.causes{background:#fff4f4;border-left:5px solid #c62828;padding:8px 16px;margin:12px 0}
.chart{width:100%;max-width:900px;height:auto;font-size:13px}.chart .tick{fill:#666}
pre{white-space:pre-wrap;word-break:break-word;max-height:18em;overflow:auto;margin:4px 0;
 font:12.5px/1.35 ui-monospace,monospace;background:#fafafa;padding:6px}
td.flagged{background:#fff0f0;outline:2px solid #c62828}code{font-family:ui-monospace,monospace}
.flag{background:#c62828;color:#fff;border-radius:3px;padding:0 5px;margin-right:4px;font-size:12px}
"""


def page(title: str, sections: list[str], css: str = "") -> str:
    """A self-contained HTML page: the CSP that forbids any fetch, inline CSS, the sections."""
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f"<title>{e(title)}</title><style>{CSS}{css}</style></head><body>\n"
            + "\n".join(b for b in sections if b) + "\n</body></html>\n")


def section(anchor: str, title: str, body: str) -> str:
    """One titled section with an anchor."""
    return f'<section id="{anchor}"><h2>{title}</h2>\n{body}\n</section>'
