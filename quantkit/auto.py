"""`auto()`: the smallest quantization of a model that passes the gate.

Candidates go from smallest to largest (the method's ladder, or the ones named), skipping those
the model's shapes do not allow. Each is quantized into a work folder; when the thresholds gate
a task marked `early` (the domain task), those run first and a candidate failing them is
rejected without the others. A survivor is validated in full. The first that passes becomes OUT
(and its report --report); when none passes, nothing is written and every candidate's numbers
are returned. With `--load`, every candidate is tried; those that pass are served and load-tested beside the
original (`quantkit.speed`: alternating order, repeats, intervals) on the engine `quantkit serve`
takes here, and `--prefer` picks OUT: the smallest, or the fastest beyond the noise.
The baseline's results come from validate's cache after the first candidate; GPTQ candidates
share one per-group sensitivity measurement and, with `shared_hessians`, one pass of Hessians over
the original model (`--hessians original`); GGUF candidates share one importance matrix.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path
from typing import Any

from quantkit import console
from quantkit.config import (
    AutoConfig,
    BenchConfig,
    QuantizeConfig,
    ServeConfig,
    ValidateConfig,
    parse_candidate,
)
from quantkit.contract import AutoResult, Candidate, CandidateMetric, GateDecision
from quantkit.errors import BadInput
from quantkit.methods import METHODS
from quantkit.records import Speed


def plan(model: str, calib: Path, acfg: AutoConfig, qcfg: QuantizeConfig
         ) -> tuple[list[tuple[str, QuantizeConfig]], list[str], list[str]]:
    """(name, quantize config) per candidate the model allows, why others were skipped, and the
    larger candidates of the method that the model allows and the ladder does not try."""
    from quantkit.quantize.preflight import check_fp8, check_group_size, preflight_calibration
    from quantkit.quantize.structure import read_structure

    ref, info, _ = preflight_calibration(model, calib)
    family = read_structure(ref.path)
    out, skipped = [], []
    for name in acfg.ladder:
        spec = parse_candidate(acfg.method, name)
        if "hessians" in METHODS[spec["method"]].supports and acfg.shared_hessians:
            spec["hessians"] = "original"
        cfg = dataclasses.replace(qcfg, **dict[str, Any](spec))  # options join it at run time
        if METHODS[spec["method"]].layer is not None:  # layerwise: group sizes must divide
            try:
                check_group_size(info.linear_shapes, family.quantized, spec["group_size"])
                if cfg.activation_format == "fp8":  # FP8 kernels' tiles (W4A8: 128)
                    check_fp8(info.linear_shapes, family, cfg)
            except BadInput as exc:
                skipped.append(f"{name}: {exc.message}")
                continue
        cfg.check()
        out.append((name, cfg))
    if not out:
        raise BadInput(f"no candidate of {', '.join(acfg.ladder)} fits this model's shapes "
                       f"({'; '.join(skipped)})", "name candidates with group sizes that divide "
                       "its layers, e.g. --candidates W4g32,W8")
    return out, skipped, larger_candidates(acfg.method, acfg.ladder, info.linear_shapes,
                                           family.quantized)


# what to offer when nothing passed, smallest first: 8-bit rungs (smaller groups carry more
# scales), GGUF types by size
def larger_candidates(method: str, ladder: tuple[str, ...], shapes: dict[str, list[int]],
                      linears: tuple[str, ...]) -> list[str]:
    """Candidates of `method` larger than the ladder's that the model's shapes allow (a GPTQ or
    AWQ run is never offered a GGUF type, nor a group size that does not divide its layers)."""
    from quantkit.quantize.preflight import check_group_size

    tried = {name.upper() for name in ladder}
    larger = METHODS[method].larger
    if METHODS[method].layer is None:  # not layerwise: sizes in order, those above the largest tried
        top = max((larger.index(n) for n in tried if n in larger), default=-1)
        return [n for n in larger[top + 1:] if n not in tried]
    out = []
    for name in larger:
        if name.upper() in tried:
            continue
        try:
            check_group_size(shapes, linears, parse_candidate(method, name)["group_size"])
        except BadInput:
            continue
        out.append(name)
    return out


def auto(*, model: str, calib: Path, acfg: AutoConfig, qcfg: QuantizeConfig, vcfg: ValidateConfig,
         out: Path, report: Path | None = None, force: bool = False,
         scfg: ServeConfig | None = None, bcfg: BenchConfig | None = None) -> AutoResult:
    """Try the candidates in order; write the first that passes to `out`, or with --load the
    one `acfg.prefer` picks among all that pass (see module doc)."""
    from quantkit.fsutil import check_output_dir, work_dir
    from quantkit.quantize import quantize
    from quantkit.validate import validate

    acfg.check()
    vcfg.check()
    loads = acfg.loads
    if loads:
        from quantkit.speed import load_engine

        load_engine(acfg.method, scfg)  # an engine that serves the candidates here, or BadInput
    if not vcfg.thresholds:
        raise BadInput("auto needs thresholds to decide what passes",
                       "pass --thresholds FILE, e.g. domain: {kld: 0.05, top1_agreement: 0.9}")
    limits = vcfg.limits  # vcfg.check() refused tasks not run
    check_output_dir(out, force)
    if report is not None:
        check_output_dir(report, force)
    candidates, skipped, larger = plan(model, calib, acfg, qcfg)
    early = _early_tasks(acfg, vcfg)
    work = work_dir(out, "auto")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rows: list[Candidate] = []
    chosen = None
    reference: Speed | None = None
    try:
        for name, qc in candidates:
            t = time.time()
            console.log(f"candidate {name}: quantizing")
            art = work / name
            manifest = quantize(model=model, cfg=qc, calib=calib, out=art, force=True)
            row = _row(name, qc, manifest)
            res = None
            if early:
                console.log(f"candidate {name}: {', '.join(early)} first")
                res = validate(artifact=art, baseline=model, out=work / f"{name}-early",
                               force=True, cfg=dataclasses.replace(
                                   vcfg, tasks=tuple(early),
                                   thresholds={t: limits[t] for t in early}))
                gate = res.decision
                if gate.verdict == "fail":
                    row.verdict, row.metrics = "rejected", _metrics(gate)
            if row.verdict is None:
                res = validate(artifact=art, baseline=model, cfg=vcfg, out=work / f"{name}-report",
                               force=True)
                gate = res.decision
                row.verdict, row.metrics = gate.verdict, _metrics(gate)
            row.seconds = round(time.time() - t, 1)
            rows.append(row)
            console.log(f"candidate {name}: {row.verdict} ({brief(row.metrics)})")
            if row.verdict == "pass" and not loads:
                chosen = pick(rows, "size")
                _publish(art, out, work / f"{name}-report", report,
                         {"candidates": [r.to_dict() for r in rows]}, force)
                break
            if row.verdict != "pass":
                shutil.rmtree(art, ignore_errors=True)  # a large model's candidates add up
        if loads:
            reference = _speeds(rows, model, acfg, loads, work, scfg, bcfg)
            chosen = pick(rows, acfg.prefer, acfg.speed_margin)
            if chosen is not None:
                name = chosen.name
                _publish(work / name, out, work / f"{name}-report", report,
                         {"candidates": [r.to_dict() for r in rows], "reference": reference,
                          "load": list(loads), "prefer": acfg.prefer, "chosen": name,
                          "reason": chosen.reason}, force)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    found = AutoResult(acfg.method, rows, chosen, skipped, larger,
                       out=str(out) if chosen else None,
                       report=str(report) if chosen and report is not None else None)
    return dataclasses.replace(found, load=list(loads), prefer=acfg.prefer,
                               reference=reference) if loads else found


def _early_tasks(acfg: AutoConfig, vcfg: ValidateConfig) -> list[str]:
    """The gated tasks that run first (`Task.early`: cheap and telling, e.g. the domain task's
    KL), where others would follow; a candidate failing them is rejected without the rest."""
    from quantkit.tasks import task

    limits = vcfg.limits
    early = [t for t in vcfg.run_tasks if task(t).early and t in limits]
    return early if acfg.early_reject and len(vcfg.run_tasks) > len(early) else []


def pick(rows: list[Candidate], prefer: str, margin: float = 0.03) -> Candidate | None:
    """The passing candidate `prefer` names, with the `reason`: the smallest (the first: smallest
    first), or for speed the smallest whose speed the fastest's does not measurably beat (the
    interval of fastest / it clears 1 + `margin`: stats.faster). So a larger candidate wins only
    where it is faster beyond the noise and the margin; else the smaller, "no measurable
    difference"."""
    from quantkit.loadtest.stats import faster

    passed = [r for r in rows if r.verdict == "pass"]
    if prefer == "size":
        return dataclasses.replace(passed[0], reason="the smallest candidate that passed the "
                                   "gate") if passed else None
    fast = [r for r in passed if (r.speed or {}).get("output_tok_s")]
    if not fast:
        return None
    top = max(fast, key=lambda r: (_tok_s(r), -r.size_bytes))
    chosen = next(r for r in fast if r is top or not faster(_repeats(top), _repeats(r), margin))
    return dataclasses.replace(chosen, reason=_reason(chosen, top, fast, margin))


def _reason(chosen: Candidate, top: Candidate, fast: list[Candidate], margin: float) -> str:
    """Why `chosen` won --prefer speed, as a ratio with its interval."""
    from quantkit.loadtest.stats import faster, ratio_interval

    def ratio(a: Candidate, b: Candidate) -> str:
        found = ratio_interval(_repeats(a), _repeats(b))
        if not found:
            return f"{a.name} has no figure to compare with {b.name}"
        ci = found["ci"]
        shown = f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "(one repeat: no interval)"
        return f"{a.name} is {found['ratio']:.2f}x {shown} of {b.name}"

    if chosen is not top:
        return (f"no measurable difference: {ratio(top, chosen)}, within the noise or the "
                f"{margin:.0%} margin; the smaller {chosen.name} wins")
    smaller = [r for r in fast if r.size_bytes < chosen.size_bytes and r is not chosen]
    if not smaller:
        others = [r for r in fast if r is not chosen]
        if not others:
            return "the only candidate measured"
        runner = max(others, key=_tok_s)
        if faster(_repeats(chosen), _repeats(runner), margin):
            return f"the smallest, and measurably the fastest: {ratio(chosen, runner)}"
        return (f"the smallest; no measurable difference: {ratio(chosen, runner)}, within the "
                f"noise or the {margin:.0%} margin")
    runner = max(smaller, key=_tok_s)
    return (f"measurably faster than the smaller {runner.name}: {ratio(chosen, runner)}, "
            f"beyond the noise and the {margin:.0%} margin")


def _tok_s(row: Candidate) -> float:
    return float((row.speed or {})["output_tok_s"] or 0)


def _repeats(row: Candidate) -> list[float]:
    return list((row.speed or {}).get("repeats") or [])


def _speeds(rows: list[Candidate], model: str, acfg: AutoConfig, loads: tuple[int, ...],
            work: Path, scfg: ServeConfig | None, bcfg: BenchConfig | None) -> Speed:
    """Each passing candidate served and load-tested beside the original (for GGUF its F16 GGUF,
    on the same engine), in alternating order: its `speed` (median, `ci`, `repeats`, per level)
    and `vs_original` (the ratio with its interval); the original's speed is returned."""
    from quantkit.loadtest.stats import ratio_interval
    from quantkit.models import resolve_model
    from quantkit.speed import measure_servers

    passed = [r for r in rows if r.verdict == "pass"]
    from quantkit.checkpoints import call, checkpoint

    original = resolve_model(model).path
    fmt = checkpoint(METHODS[acfg.method].checkpoint)
    if fmt.baseline is not None:  # served as the format's engines compare it (a GGUF's F16)
        from quantkit.models import model_sha256

        original = Path(call(fmt, "baseline", original, model_sha256(original))[0])
    speeds = measure_servers({"original": original, **{r.name: work / r.name for r in passed}},
                             loads, work / "speed", scfg, bcfg, acfg.restarts)
    reference = speeds["original"]
    base = {lv["concurrency"]: lv for lv in reference.get("levels") or []}
    for row in passed:
        speed = row.speed = speeds[row.name]
        if "error" in speed or "error" in reference:
            continue
        speed["vs_original"] = ratio_interval(speed["repeats"], reference["repeats"])
        for lv in speed["levels"]:
            if lv["concurrency"] in base:
                lv["vs_original"] = ratio_interval(lv["repeats"],
                                                   base[lv["concurrency"]]["repeats"])
    return reference


def _row(name: str, qc: QuantizeConfig, manifest: Any) -> Candidate:
    size = int(manifest.size_bytes["after"])
    bpw = manifest.bits_per_weight or round(size * 8 / max(manifest.source.parameters, 1), 3)
    p = manifest.parameters  # each format records its own: bits and groups, or a k-quant type
    return Candidate(name, qc.method, p.get("bits"), p.get("group_size"), p.get("quant_type"),
                     bpw, size)


def _metrics(gate: GateDecision) -> dict[str, CandidateMetric]:
    return {c.name: CandidateMetric.of(c) for c in gate.checks}


def none_passed(res: AutoResult) -> Exception:
    """The gate failure (exit 1) of a search where no candidate passed, naming each one."""
    from quantkit.errors import GateFailed

    tried = "; ".join(f"{c.name} {c.verdict} ({brief(c.metrics)})" for c in res.candidates)
    hint = (f"loosen the thresholds, or try larger candidates: --candidates {','.join(res.larger)}"
            if res.larger else
            "loosen the thresholds: the largest candidates this method offers failed them too")
    return GateFailed(f"no candidate passed the gate: {tried}", hint)


def brief(metrics: dict[str, CandidateMetric]) -> str:
    def show(v: Any) -> str:
        return "n/a" if v is None else f"{v:.4g}"

    return ", ".join(f"{k} {m.note or show(m.value)}{'' if m.passed else ' FAIL'}"
                     for k, m in metrics.items())


def _publish(art: Path, out: Path, validated: Path, report: Path | None,
             search: dict[str, Any], force: bool) -> None:
    """The chosen candidate becomes OUT; its report (with the candidates table) --report."""
    from quantkit.fsutil import write_json
    from quantkit.report import write_report
    from quantkit.results import Results

    write_json(validated / "auto.json", search)
    for src, dst in ((art, out), (validated, report)):
        if dst is None:
            continue
        if dst.exists() and force:
            shutil.rmtree(dst)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(src, dst)  # a rename on one filesystem; --report may live on another
    if report is not None:
        # the validation named the work folder's artifact: point it at OUT, then render once
        res = Results.read(report)
        dataclasses.replace(res, artifact=dataclasses.replace(res.artifact, path=str(out))
                            ).write(report)
        write_report(report)
