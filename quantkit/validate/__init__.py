"""`validate()`: the quantized model against its baseline, on the engine that will serve it.

Each task runs on both models; every metric is quantized vs baseline with an interval; the gate
turns thresholds into a verdict; results.json, junit.xml and report.html land in one folder.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from quantkit import __version__
from quantkit.errors import BadInput

TASKS = ("mmlu", "humaneval", "domain", "sampling")
RESULTS_SCHEMA = 1


def validate(*, artifact: Path, baseline: str, out: Path, tasks: list[str] | None = None,
             domain_set: Path | None = None, limit: int | None = None,
             thresholds: Path | None = None, thresholds_data: dict[str, Any] | None = None,
             mmlu_data: Path | None = None, samples: int = 64, temperature: float = 0.9,
             top_p: float = 0.9, max_tokens: int = 256, seed: int = 0, threads: int = 0,
             humaneval_limit: int | None = None, humaneval_max_tokens: int = 384,
             force: bool = False) -> dict[str, Any]:
    """Run the tasks on artifact and baseline, decide the gate, write `out`; return the results."""
    from quantkit.fsutil import atomic_dir, check_output_dir, dumps
    from quantkit.gate import decide, load_thresholds, write_junit

    started = time.time()
    tasks = _check_tasks(tasks, domain_set)
    limits = load_thresholds(thresholds, thresholds_data) if (thresholds or thresholds_data) else {}
    not_run = sorted(set(limits) - set(tasks))
    if not_run:
        raise BadInput(f"thresholds name {', '.join(not_run)}, which --tasks does not run",
                       "add the task to --tasks or drop its threshold")
    for name, value in (("--limit", limit), ("--humaneval-limit", humaneval_limit)):
        if value is not None and value < 1:
            raise BadInput(f"{name} {value} must be 1 or more", "leave it out to run everything")
    for name, value, lo, hi in (("--samples", samples, 1, 10000),
                                ("--max-tokens", max_tokens, 1, 32768),
                                ("--humaneval-max-tokens", humaneval_max_tokens, 1, 32768),
                                ("--temperature", temperature, 0.0, 2.0),
                                ("--top-p", top_p, 0.01, 1.0)):
        if not lo <= value <= hi:
            raise BadInput(f"{name} {value} is out of range", f"use a value from {lo} to {hi}")
    if mmlu_data is not None and "mmlu" in tasks and not Path(mmlu_data).is_dir():
        raise BadInput(f"MMLU data folder {mmlu_data} does not exist",
                       "pass --mmlu-data DIR holding {test,dev}/SUBJECT.jsonl, "
                       "or leave it out for the MMLU shipped with quantkit")
    check_output_dir(out, force)
    domain_rows = None
    if "domain" in tasks:
        from quantkit.validate.domain import load_domain_set

        domain_rows = load_domain_set(Path(domain_set))  # type: ignore[arg-type]
    pair = _resolve_pair(Path(artifact), baseline, force)
    settings = {"tasks": tasks, "limit": limit, "seed": seed, "mmlu_data": str(mmlu_data),
                "humaneval": {"limit": humaneval_limit or limit, "max_tokens": humaneval_max_tokens},
                "domain_set": str(domain_set) if domain_set else None,
                "sampling": {"n": samples, "temperature": temperature, "top_p": top_p,
                             "max_tokens": max_tokens, "seed": seed}}
    from quantkit.validate.runner import run_tasks

    task_results, timings = run_tasks(pair, tasks, settings, domain_rows, threads)
    gate = decide(task_results, limits)
    results = {
        "schema_version": RESULTS_SCHEMA, "quantkit_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "artifact": {"path": str(artifact), "sha256": pair["artifact_sha256"],
                     "manifest": pair["manifest"]},
        "baseline": {"path": str(pair["baseline_path"]), "sha256": pair["baseline_sha256"],
                     "label": baseline, "source_match": pair["source_match"]},
        "engine": pair["engine"], "settings": settings, "thresholds": limits,
        "calibration": _calibration(pair, domain_set),
        "tasks": task_results, "gate": gate,
        "timings": {**timings, "total_s": round(time.time() - started, 1)},
    }
    with atomic_dir(out, force) as tmp:
        (tmp / "results.json").write_text(dumps(results))
        write_junit(gate, tmp / "junit.xml")
        from quantkit.report import write_report

        write_report(tmp)
    return results


def _check_tasks(tasks: list[str] | None, domain_set: Path | None) -> list[str]:
    if not tasks:
        return [t for t in TASKS if t != "domain" or domain_set is not None]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise BadInput(f"unknown task {unknown[0]!r}", "use any of " + ",".join(TASKS))
    if "domain" in tasks and domain_set is None:
        raise BadInput("the domain task needs a domain test set", "pass --domain-set FILE.jsonl")
    return list(dict.fromkeys(tasks))


def _resolve_pair(artifact: Path, baseline: str, force: bool) -> dict[str, Any]:
    """The quantized model and the baseline as files for one engine, and whether they belong."""
    from quantkit.artifact import read_manifest
    from quantkit.fsutil import sha256_file
    from quantkit.models import resolve_model, weights_sha256

    if not artifact.exists():
        raise BadInput(f"artifact {artifact} does not exist", "make it with `quantkit quantize`")
    manifest = read_manifest(artifact)
    ref = resolve_model(baseline)
    base_sha = weights_sha256(ref.path)
    source_sha = manifest.get("source", {}).get("weights_sha256")
    match = base_sha == source_sha
    if not match and not force:
        raise BadInput(f"baseline {baseline} is not the source of {artifact} (weights sha256 "
                       f"{base_sha[:12]} vs the manifest's {str(source_sha)[:12]})",
                       "pass the model the artifact was made from, or --force to compare anyway")
    if manifest.get("checkpoint") == "gguf":
        from quantkit.quantize.gguf import _f16_gguf

        qfile = artifact / manifest["file"]
        if not qfile.is_file():
            raise BadInput(f"artifact {artifact} lacks its GGUF file {manifest['file']}",
                           "re-run `quantkit quantize --method gguf`")
        # the baseline of a GGUF is the F16 GGUF of the same conversion, on the same engine
        f16 = _f16_gguf(ref.path, {}, {})
        return {"engine": "llama.cpp", "quantized_path": qfile, "baseline_path": f16,
                "artifact_sha256": sha256_file(qfile), "baseline_sha256": base_sha + ":f16",
                "manifest": manifest, "model_dir": ref.path, "source_match": match}
    return {"engine": "transformers", "quantized_path": artifact, "baseline_path": ref.path,
            "artifact_sha256": weights_sha256(artifact), "baseline_sha256": base_sha,
            "manifest": manifest, "model_dir": ref.path, "source_match": match}


def _calibration(pair: dict[str, Any], domain_set: Path | None) -> dict[str, Any] | None:
    """The calibration set's manifest and stats, and its match to the domain set."""
    calib = pair["manifest"].get("calibration", {}).get("path")
    if not calib or not (Path(calib) / "manifest.json").is_file():
        return None
    folder = Path(calib)
    info: dict[str, Any] = {"path": calib,
                            "manifest": json.loads((folder / "manifest.json").read_text())}
    if (folder / "stats.json").is_file():
        info["stats"] = json.loads((folder / "stats.json").read_text())
    info["target_match"] = None
    if domain_set is not None:
        from quantkit.calib import target_match
        from quantkit.models import load_tokenizer

        rows = [json.loads(x) for x in (folder / "samples.jsonl").read_text().splitlines()]
        info["target_match"] = target_match(Path(domain_set), rows,
                                            load_tokenizer(pair["model_dir"]))
    return info


def cache_key(baseline_sha256: str, engine: str, task: str, settings: Any) -> str:
    """Baseline results are reused when model, engine, task settings and quantkit agree."""
    blob = json.dumps([baseline_sha256, engine, task, settings, __version__], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]
