"""docs/BENCHMARKS.md's "Thinking model: calibrating with its own reasoning": the tests' trained
thinking model (tests/_thinking.py, Qwen3's template, <think>...</think>) quantized with GPTQ W4
g32 on a calibration set of its chats without reasoning, and on the same set plus its own answers
with thinking on (`--self-traces`), each validated against the original as served (thinking on,
budget 64, domain + sampling, 3 seeds): KL on its own kind of text, thinking closed within the
budget and thinking length, with their paired intervals. CPU: 8 rows in about 45 s on 2 cores,
plus about a minute to train the model once.

    python bench/thinking_table.py [--out bench/results-thinking] [--samples 8,32] [--traces 32]
        [--work /tmp/quantkit-thinking-bench]

Writes OUT/table.md (the table BENCHMARKS holds) and OUT/rows.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from _thinking import build_thinking_model, corpus, dialogue  # noqa: E402

BUDGET = 64


def _chats(path: Path) -> Path:
    """The model's kind of chats, without their reasoning: a set that never shows it thinking."""
    path.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": q}, {"role": "assistant", "content": a}]}) + "\n"
        for q, _, a in corpus(400, seed=21)))
    return path


def _domain(path: Path, tok_dir: Path) -> Path:
    """Held-out dialogues as served (chat-rendered with their thinking: the KL's text) and QA."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir)
    rng = random.Random(77)
    rows = []
    for _ in range(24):
        q, r, a = dialogue(rng)
        text = tok.apply_chat_template([{"role": "user", "content": q},
                                        {"role": "assistant", "content": a,
                                         "reasoning_content": r}], tokenize=False)
        rows.append({"text": text})
    rows += [{"prompt": q, "answer": a, "match": "exact"}
             for q, _, a in (dialogue(rng) for _ in range(16))]
    path.write_text("".join(json.dumps(x) + "\n" for x in rows))
    return path


def _ci(m: dict | None, pct: bool = False) -> str:
    if not m:
        return "n/a"
    f = (lambda x: f"{x:+.1%}") if pct else (lambda x: f"{x:.4f}")
    return f"{f(m['value'])} [{f(m['lo'])}, {f(m['hi'])}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results-thinking")
    ap.add_argument("--samples", default="8,32", help="source samples per set")
    ap.add_argument("--traces", type=int, default=32, help="--self-traces N")
    ap.add_argument("--groups", default="32,-1", help="W4 group sizes (-1: per channel)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/quantkit-thinking-bench"),
                    help="the model, sets, artifacts and reports")
    args = ap.parse_args()
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("QUANTKIT_HOME", str(work / "home"))
    from quantkit.calib import calibrate
    from quantkit.config import CalibrateConfig, QuantizeConfig, ValidateConfig
    from quantkit.quantize import quantize
    from quantkit.validate import validate

    model = work / "model"
    if not (model / "config.json").is_file():
        print("training the thinking model", build_thinking_model(model), flush=True)
    chats, domain = _chats(work / "chats.jsonl"), _domain(work / "domain.jsonl", model)
    rows = []
    sets = [(int(s), t) for s in args.samples.split(",") for t in (0, args.traces)]
    for group, (samples, traces) in [(int(g), st) for g in args.groups.split(",") for st in sets]:
        name = f"g{group}-s{samples}-t{traces}"
        t0 = time.time()
        calib = work / "sets" / name.split("-", 1)[1]
        info = calibrate(model=str(model), out=calib, force=True, cfg=CalibrateConfig(
            sources=(str(chats),), samples=samples, min_tokens=32, max_tokens=128,
            self_traces=traces, trace_max_tokens=96))
        art = work / "artifacts" / name
        quantize(model=str(model), cfg=QuantizeConfig(method="gptq", group_size=group),
                 calib=calib, out=art, force=True)
        rep = work / "reports" / name
        validate(artifact=art, baseline=str(model), out=rep, force=True, cfg=ValidateConfig(
            tasks=("domain", "sampling"), domain_set=str(domain), samples=32,
            max_tokens=24, thinking_budget=BUDGET))
        res = json.loads((rep / "results.json").read_text())
        d, s = res["tasks"]["domain"], res["tasks"]["sampling"]
        rows.append({
            "set": name, "group_size": group, "source_samples": samples, "self_traces": traces,
            "trace_samples": (info.get("origins") or {}).get("self-traces", {}).get("samples", 0),
            "tokens": info["tokens"], "kld": d["kld"],
            "think_closed": {k: s[k]["thinking"]["closed"] for k in ("baseline", "quantized")},
            "think_tokens": {k: s[k]["thinking"]["tokens"] for k in ("baseline", "quantized")},
            "sampling_think_closed_drop": s["think_closed_drop"],
            "sampling_think_tokens_increase": s["think_tokens_increase"],
            "domain_think_tokens_increase": d.get("think_tokens_increase"),
            "qa": {k: d[k]["qa"]["accuracy"] for k in ("baseline", "quantized")},
            "flagged_increase": s["flagged_increase"], "seconds": round(time.time() - t0, 1)})
        print(json.dumps(rows[-1]), flush=True)
    (out / "rows.json").write_text(json.dumps(rows, indent=1))
    head = ("| W4 | calibration set | samples (traces) | tokens | domain KL [95%] | thinking closed "
            "orig / quant | think_closed_drop [95%] | thinking tokens orig / quant | "
            "think_tokens_increase [95%] | QA orig / quant |\n|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        what = "chats, no reasoning" + (f" + {r['self_traces']} self-traces" if r["self_traces"]
                                        else "")
        tc, tt = r["think_closed"], r["think_tokens"]
        g = "per channel" if r["group_size"] == -1 else f"g{r['group_size']}"
        lines.append(
            f"| {g} | {what} | {r['source_samples'] + r['trace_samples']} ({r['trace_samples']}) | "
            f"{r['tokens']} | {_ci(r['kld'])} | {tc['baseline']:.0%} / {tc['quantized']:.0%} | "
            f"{_ci(r['sampling_think_closed_drop'], True)} | {tt['baseline']:.1f} / "
            f"{tt['quantized']:.1f} | {_ci(r['sampling_think_tokens_increase'], True)} | "
            f"{r['qa']['baseline']:.0%} / {r['qa']['quantized']:.0%} |")
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    lines.append(f"\nGPTQ W4 (g32 and per channel); validate --tasks domain,sampling --thinking auto "
                 f"--thinking-budget {BUDGET} --samples 32 --seeds auto (3) --max-tokens 24; "
                 f"{machine}; {time.strftime('%Y-%m-%d')}; `python bench/thinking_table.py`.")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
