"""The README's tables of methods, tasks and engines, written from the registries (one owner per
fact: a new entry changes its table; tests/test_catalog.py fails when README.md has drifted).

`python -m quantkit.catalog README.md` rewrites each table in place, between its markers
`<!-- catalog:NAME -->` and `<!-- /catalog:NAME -->`. Pure: imports no torch."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path


def _row(*cells: object) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def methods_table() -> str:
    from quantkit.methods import METHODS

    rows = [_row("method", "what it is", "writes", "`quantkit auto`'s ladder"), _row(*"----")]
    for name in METHODS:
        m = METHODS[name]
        rows.append(_row(f"`{name}`", m.help, m.checkpoint, ", ".join(m.ladder) or "-"))
    return "\n".join(rows)


def tasks_table() -> str:
    from quantkit.tasks import TASKS

    rows = [_row("task", "title", "gated metrics (threshold key: meaning)", "run by default"),
            _row(*"----")]
    for name in TASKS:
        t = TASKS[name]
        gated = "; ".join(f"`{k}` {m.op}: {m.meaning}" for k, m in t.metrics.items())
        default = "no (name it)" if not t.default else (
            f"with {t.needs_what}" if t.needs else "yes")
        rows.append(_row(f"`{name}`", t.title, gated, default))
    rows.append(_row("any lm-eval task", "its own", "`retention`: quantized / baseline score",
                     "no (name it)"))
    return "\n".join(rows)


def engines_table() -> str:
    from quantkit.engines.choice import ENGINES

    rows = [_row("engine", "library", "runs", "needs", "its server", "log-probs"), _row(*"------")]
    for name in ENGINES:
        e = ENGINES[name]
        server = [what for what, has in (("FP8 KV cache", e.kv_cache_fp8),
                                         ("tensor/pipeline parallel", e.tensor_parallel),
                                         ("--kernel", e.kernels),
                                         ("16/32-bit weights in memory", e.decompresses)) if has]
        rows.append(_row(f"`{name}`", e.library, ", ".join(e.checkpoints),
                         "an NVIDIA GPU" if e.gpu else "-", ", ".join(server) or "-", e.logprobs))
    return "\n".join(rows)


TABLES: dict[str, Callable[[], str]] = {
    "methods": methods_table, "tasks": tasks_table, "engines": engines_table}


def _between(table: str) -> Callable[[re.Match[str]], str]:
    return lambda m: f"{m.group(1)}\n{table}\n{m.group(2)}"


def render(text: str) -> str:
    """`text` with every catalog table between its markers written anew."""
    for name, table in TABLES.items():
        pattern = re.compile(rf"(<!-- catalog:{name} -->).*?(<!-- /catalog:{name} -->)", re.S)
        text = pattern.sub(_between(table()), text)
    return text


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else "README.md")
    text = path.read_text()
    new = render(text)
    if new != text:
        path.write_text(new)
    print(f"{path}: {'rewritten' if new != text else 'up to date'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
