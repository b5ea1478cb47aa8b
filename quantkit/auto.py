"""`auto()`: the smallest quantization of a model that passes the gate.

Candidates go from smallest to largest (the method's ladder, or the ones named), skipping those
the model's shapes do not allow. Each is quantized into a work folder; when the thresholds gate
the domain task, that task alone runs first and a candidate failing it is rejected without the
others. A survivor is validated in full. The first that passes becomes OUT (and its report
--report); when none passes, nothing is written and every candidate's numbers are returned.
With `--load` (a GPU), every candidate is tried, each that passes is served and load-tested
(`quantkit.speed`), the original too, and `--prefer` picks OUT: the smallest or the fastest.
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
from quantkit.config import AutoConfig, QuantizeConfig, ServeConfig, ValidateConfig, parse_candidate
from quantkit.errors import BadInput
from quantkit.methods import METHODS

EARLY_TASK = "domain"


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
        if spec["method"] == "gptq" and acfg.shared_hessians:
            spec["hessians"] = "original"
        cfg = dataclasses.replace(qcfg, **spec)
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
         scfg: ServeConfig | None = None) -> dict[str, Any]:
    """Try the candidates in order; write the first that passes to `out`, or with --load the
    one `acfg.prefer` picks among all that pass (see module doc)."""
    from quantkit.fsutil import check_output_dir, work_dir
    from quantkit.quantize import quantize
    from quantkit.validate import validate

    acfg.check()
    vcfg.check()
    loads = acfg.loads
    if loads:
        from quantkit.speed import require_gpu

        require_gpu()
    if not vcfg.thresholds:
        raise BadInput("auto needs thresholds to decide what passes",
                       "pass --thresholds FILE, e.g. domain: {kld: 0.05, top1_agreement: 0.9}")
    limits = vcfg.limits  # vcfg.check() refused tasks not run
    check_output_dir(out, force)
    if report is not None:
        check_output_dir(report, force)
    candidates, skipped, larger = plan(model, calib, acfg, qcfg)
    early = (acfg.early_reject and EARLY_TASK in limits and len(vcfg.run_tasks) > 1)
    work = work_dir(out, "auto")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rows: list[dict[str, Any]] = []
    chosen = None
    reference = None
    try:
        for name, qc in candidates:
            t = time.time()
            console.log(f"candidate {name}: quantizing")
            art = work / name
            manifest = quantize(model=model, cfg=qc, calib=calib, out=art, force=True)
            row = _row(name, qc, manifest)
            res = None
            if early:
                console.log(f"candidate {name}: {EARLY_TASK} first")
                res = validate(artifact=art, baseline=model, out=work / f"{name}-{EARLY_TASK}",
                               force=True, cfg=dataclasses.replace(
                                   vcfg, tasks=(EARLY_TASK,),
                                   thresholds={EARLY_TASK: limits[EARLY_TASK]}))
                if res.gate["verdict"] == "fail":
                    row.update(verdict="rejected", metrics=_metrics(res.gate))
            if "verdict" not in row:
                res = validate(artifact=art, baseline=model, cfg=vcfg, out=work / f"{name}-report",
                               force=True)
                row.update(verdict=res.gate["verdict"], metrics=_metrics(res.gate))
            if loads and row["verdict"] == "pass":
                row["speed"] = _speed(art, loads, work / "speed", name, scfg)
            row["seconds"] = round(time.time() - t, 1)
            rows.append(row)
            console.log(f"candidate {name}: {row['verdict']} ({brief(row['metrics'])})"
                        + (f", {row['speed'].get('output_tok_s')} output tok/s at --load"
                           if row.get("speed") else ""))
            if row["verdict"] == "pass" and not loads:
                chosen = row
                _publish(art, out, work / f"{name}-report", report, {"candidates": rows}, force)
                break
            if row["verdict"] != "pass":
                shutil.rmtree(art, ignore_errors=True)  # a large model's candidates add up
        if loads:
            from quantkit.models import resolve_model

            reference = _speed(resolve_model(model).path, loads, work / "speed", "original", scfg)
            chosen = pick(rows, acfg.prefer)
            if chosen is not None:
                name = chosen["name"]
                _publish(work / name, out, work / f"{name}-report", report,
                         {"candidates": rows, "reference": reference, "load": list(loads),
                          "prefer": acfg.prefer, "chosen": name}, force)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"method": acfg.method, "candidates": rows, "chosen": chosen, "skipped": skipped,
            "larger": larger, "out": str(out) if chosen else None,
            "report": str(report) if chosen and report is not None else None,
            **({"load": list(loads), "prefer": acfg.prefer, "reference": reference}
               if loads else {})}


def pick(rows: list[dict[str, Any]], prefer: str) -> dict[str, Any] | None:
    """The passing candidate `prefer` names: the smallest (the first: smallest first), or the
    one with the most output tokens/s at the load (a tie: the smaller)."""
    passed = [r for r in rows if r["verdict"] == "pass"]
    if prefer == "size":
        return passed[0] if passed else None
    fast = [r for r in passed if (r.get("speed") or {}).get("output_tok_s")]
    return max(fast, key=lambda r: (r["speed"]["output_tok_s"], -r["size_bytes"]), default=None)


def _speed(model: Path, loads: tuple[int, ...], work: Path, label: str,
           scfg: ServeConfig | None) -> dict[str, Any]:
    """Served and load-tested, or why it could not be (the search goes on without it)."""
    from quantkit.errors import EngineError
    from quantkit.speed import measure

    try:
        return measure(model, loads, work, label, scfg)
    except (EngineError, BadInput) as exc:  # the engine failed, or `quantkit serve` refused it
        console.warn(f"{label}: not measured: {exc.message}")
        return {"error": exc.message}


def _row(name: str, qc: QuantizeConfig, manifest: Any) -> dict[str, Any]:
    size = int(manifest.size_bytes["after"])
    bpw = manifest.bits_per_weight or round(size * 8 / max(manifest.source.parameters, 1), 3)
    gguf = manifest.checkpoint == "gguf"
    return {"name": name, "method": qc.method,
            "bits": None if gguf else qc.bits,
            "group_size": None if gguf else qc.group_size,
            "quant_type": qc.quant_type if gguf else None,
            "bits_per_weight": bpw, "size_bytes": size}


def _metrics(gate: dict[str, Any]) -> dict[str, Any]:
    return {f"{c['task']}.{c['metric']}": {"value": c.get("value"), "lo": c.get("lo"),
                                           "hi": c.get("hi"), "limit": c["limit"], "op": c["op"],
                                           "passed": c["passed"],
                                           **({"note": c["note"]} if c.get("note") else {})}
            for c in gate["checks"]}


def none_passed(res: dict[str, Any]) -> Exception:
    """The gate failure (exit 1) of a search where no candidate passed, naming each one."""
    from quantkit.errors import GateFailed

    tried = "; ".join(f"{c['name']} {c['verdict']} ({brief(c['metrics'])})"
                      for c in res["candidates"])
    larger = res.get("larger") or []
    hint = (f"loosen the thresholds, or try larger candidates: --candidates {','.join(larger)}"
            if larger else
            "loosen the thresholds: the largest candidates this method offers failed them too")
    return GateFailed(f"no candidate passed the gate: {tried}", hint)


def brief(metrics: dict[str, Any]) -> str:
    def show(v: Any) -> str:
        return "n/a" if v is None else f"{v:.4g}"

    return ", ".join(f"{k} {m.get('note') or show(m['value'])}{'' if m['passed'] else ' FAIL'}"
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
        dataclasses.replace(res, artifact={**res.artifact, "path": str(out)}).write(report)
        write_report(report)
