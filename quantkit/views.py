"""What each command prints for a person (`--json` prints the data itself): one function per
result, pure text from the data the stage returned."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from quantkit.contract import AutoResult
    from quantkit.loadtest.doctor import Diagnosis
    from quantkit.records import BenchResults, CalibSummary, Speed
    from quantkit.results import Results
    from quantkit.run import RunFinished, RunStopped


def _num(v: Any) -> str:
    return "n/a" if v is None else f"{v:.4f}"


def calibrated(res: CalibSummary) -> str:
    mix = ", ".join(f"{k} {v['actual']}" for k, v in res["mix"].items())
    match = res["target_match"]
    extra = (f"\ntarget match: JS divergence {match['js_divergence']} bits, "
             f"coverage {match['target_token_coverage']:.1%}") if match else ""
    reasoning = res["reasoning"]
    if reasoning["chats_with_reasoning"]:
        extra += (f"\nreasoning: {reasoning['chats_with_reasoning']} chats with reasoning, rendered "
                  f"with thinking on, in {reasoning['samples_with_reasoning']} samples")
    if reasoning["reasoning_dropped"]:
        extra += (f"\nreasoning: {reasoning['reasoning_dropped']} chats carried reasoning; the "
                  "model has no thinking mode, so it was left out")
    origins = res.get("origins")
    if origins:
        t, src = origins["self-traces"], origins["sources"]
        extra += (f"\nself-traces: {t['prompts']} answers of the model (thinking {t['thinking']}) "
                  f"in {t['samples']} samples, {t['tokens']} tokens; sources: {src['samples']} "
                  f"samples, {src['tokens']} tokens")
    return f"wrote {res['out']}: {res['samples']} samples, {res['tokens']} tokens ({mix}){extra}"


def quantized(m: Any, out: Path) -> str:
    """One line for a Manifest just written."""
    from quantkit.artifact import expert_coverage
    from quantkit.checkpoints import call, checkpoint

    size = m.size_bytes
    what = call(checkpoint(m.checkpoint), "summary", m)
    return (f"wrote {out}: {what}, {size['before'] / 2**20:.0f} MiB -> "
            f"{size['after'] / 2**20:.0f} MiB in {m.wall_time_s:.0f} s"
            + (f"\n{expert_coverage(m.experts)}" if m.experts else ""))


def summary(res: Results) -> str:
    """A validation: one line per task and check, the verdict first."""
    from quantkit.results import calibration_match
    from quantkit.tasks import task as task_spec

    gate = res.decision
    lines = [f"verdict: {gate.verdict.upper()} ({res.engine})"]
    results = res.task_results
    for name, r in results.items():
        spec = task_spec(name)
        if spec.external and isinstance(r.quantized, dict):  # an lm-eval task: each side's score
            q, b = r.quantized, r.baseline or {}
            lines.append(f"  {name}.{r.extra.get('metric')}: baseline {b['value']:.4f}, quantized "
                         f"{q['value']:.4f} n={q['n']}")
        for key in spec.summary_keys:
            m = r.metric(key)
            if m is not None:
                lines.append(f"  {name}.{key}: {m.note}" if m.note else
                             f"  {name}.{key}: {m.value:.4f} [{_num(m.lo)}, {_num(m.hi)}] n={m.n}")
    for name, r in results.items():
        lines += [f"  warning: {r.extra[key]}" for key in task_spec(name).warnings
                  if r.extra.get(key)]
    match = calibration_match(res)
    if match and match.get("poor"):  # the report marks it "poor match"
        lines.append(f"  warning: the calibration set matches the domain set poorly (JS divergence "
                     f"{_num(match.get('js_divergence'))} bits, above "
                     f"{_num(match.get('poor_threshold_jsd'))}); see the report's calibration "
                     "section")
    for c in gate.checks:
        mark = "pass" if c.passed else "FAIL"
        note = (f" ({c.note})" if c.note else
                " (sample too small to support the verdict)" if c.too_small else "")
        lines.append(f"  {mark} {c.name} {c.op} {c.limit}{note}")
    return "\n".join(lines)


def auto_summary(res: AutoResult) -> str:
    """`quantkit auto`: each candidate, the choice, the report and the next command."""
    from quantkit.auto import brief

    base = (res.reference or {}).get("output_tok_s")
    lines = [f"{c.name}: {c.verdict}, {c.bits_per_weight or 0:.3g} bits/weight, "
             f"{c.size_bytes / 2**20:.1f} MiB, {c.seconds or 0:.0f} s ({brief(c.metrics)})"
             + _speed_note(c.speed, base) for c in res.candidates]
    lines += [f"skipped {s}" for s in res.skipped]
    if res.load:
        lines.append(f"original: {_speed_note(res.reference, None).lstrip('; ')} at "
                     f"concurrency {','.join(map(str, res.load))}")
    chosen = res.chosen
    lines.append((f"chosen: {chosen.name} -> {res.out}"
                  + (f" (--prefer {res.prefer}: {chosen.reason})" if res.load and chosen.reason
                     else f" (--prefer {res.prefer})" if res.load else ""))
                 if chosen else "chosen: none")
    if res.report:
        lines.append(f"report: {Path(res.report) / 'report.html'}")
    if chosen and res.out:
        lines.append(next_step(res.out, res.report))
    return "\n".join(lines)


def _speed_note(speed: Speed | None, base: float | None) -> str:
    """'; 1234 output tok/s (1.31x original)' for a measured candidate, the error otherwise."""
    if not speed:
        return ""
    if speed.get("error"):
        return f"; speed not measured: {speed['error']}"
    value = speed.get("output_tok_s")
    if value is None:
        return "; speed: failed requests"
    ci = speed.get("ci")
    shown = f" [{ci[0]:.0f}, {ci[1]:.0f}]" if ci else ""
    vs = speed.get("vs_original")
    vs_ci = vs.get("ci") if vs else None
    if vs and vs_ci:
        ratio = f" ({vs['ratio']:.2f}x [{vs_ci[0]:.2f}, {vs_ci[1]:.2f}] of the original)"
    else:
        ratio = f" ({value / base:.2f}x original)" if base else ""
    return f"; {value:.0f} output tok/s{shown}{ratio}"


def next_step(artifact: str | Path, report: str | Path | None) -> str:
    """The closing line after an artifact passed: the serve command that finds its validation
    (`--reports` where the report is not under reports/; none kept: --allow-unvalidated)."""
    cmd = f"quantkit serve {shlex.quote(str(artifact))}"
    if report is None:
        cmd += " --allow-unvalidated"
    elif Path(report).parent != Path("reports"):
        cmd += f" --reports {shlex.quote(str(Path(report).parent))}"
    return f"next: {cmd}"


def ran(res: RunFinished) -> str:
    """`quantkit run`: the steps, the validation's summary, the report, the next command."""
    steps = _steps(res)
    report_dir = Path(res["report"])
    results = res["results"]
    return (f"{res['name']}: {steps}\n{summary(results)}\nreport: "
            f"{report_dir / 'report.html'}"
            + (f"\n{next_step(str(results.artifact.path), report_dir)}"
               if results.decision.passed else ""))


def _steps(res: RunStopped | RunFinished) -> str:
    """A run's steps on one line: "calibrate reused, quantize 184.5 s"."""
    return ", ".join(f"{k} {'reused' if v['reused'] else str(v.get('seconds')) + ' s'}"
                     for k, v in res["steps"].items())


def stopped(res: RunStopped) -> str:
    """`quantkit run --until STEP`: the steps run so far and the command that goes on."""
    return (f"{res['name']}: {_steps(res)}\nstopped after {res['stopped_after']}; "
            f"next: quantkit run {res['recipe']}")


def _s(v: Any) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _ms(v: Any) -> str:
    return "n/a" if v is None else f"{v * 1000:.1f}"


def _pct(v: Any) -> str:
    return "n/a" if v is None else f"{v:.0f}%"


def benched(res: BenchResults, out: Path) -> str:
    """`quantkit bench`: a row per concurrency level, the knee and the recommendation."""
    busy = any(row.get("gpu_busy_pct") is not None for row in res["levels"])
    lines = [f"{'conc':>5} {'req/s':>7} {'tok/s':>8} {'95% interval':>17} "
             f"{'TTFT p50/p99 s':>16} {'TPOT p50/p99 ms':>17} err" + ("  GPU busy" if busy else "")]
    for row in res["levels"]:
        t, p = row["ttft_s"], row["tpot_s"]
        ci = row.get("output_token_throughput_ci")
        shown = f"[{ci[0]:.1f}, {ci[1]:.1f}]" if ci else "(one repeat)"
        flag = (f"  UNSTEADY: repeats spread {row['output_token_throughput_spread']:.0%}"
                if row.get("unsteady") else "")
        lines.append(f"{row['concurrency']:>5} {row['request_throughput']:>7.2f} "
                     f"{row['output_token_throughput']:>8.1f} {shown:>17} "
                     f"{_s(t['p50'])}/{_s(t['p99']):<7} "
                     f"{_ms(p['p50'])}/{_ms(p['p99']):<8} "
                     + (f"{row['errors']:>3}  {_pct(row.get('gpu_busy_pct')):>8}" if busy
                        else f"{row['errors']}") + flag)
    repeats = (res.get("settings") or {}).get("repeats")
    if repeats:
        lines.append(f"tok/s: the median of {repeats} repeat(s) per level; the interval: 95% "
                     "t-interval of their mean")
    if busy:
        from quantkit.gpu import BUSY_WAITS

        lines.append("GPU busy: the share of time a kernel ran on the serving GPU (nvidia-smi), "
                     f"the median of the repeats; under {BUSY_WAITS:.0f}% under load: the GPU "
                     "waits on the host")
    if line := res.get("roofline"):
        from quantkit.roofline import Roofline

        lines.append(Roofline(**line).sentence())
    knee = res["knee"]
    lines.append(f"knee {knee['concurrency']} ({knee['reason']}); recommended max concurrency "
                 f"{res['recommended_concurrency']}\nreport: {Path(out) / 'report.html'}")
    return "\n".join(lines)


def diagnosed(res: Diagnosis) -> str:
    """`quantkit doctor`: each check's status and reason, and the fix where it did not pass."""
    lines = [f"{res['model']} on {res['engine']}: {res['status'].upper()}"]
    for c in res["checks"]:
        lines.append(f"  {c['status']:<4} {c['check']}: {c['reason']}"
                     + (f"\n       fix: {c['fix']}" if c["fix"] and c["status"] != "pass" else ""))
    return "\n".join(lines)
