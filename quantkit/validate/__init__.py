"""`validate()`: the quantized model against its baseline, on the engine that will serve it.

Each task runs on both models; every metric is quantized vs baseline with an interval; the gate
turns thresholds into a verdict; results.json and junit.xml land in one folder, where the command
that asked (validate, run, auto) renders report.html from them once.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from quantkit import __version__, console
from quantkit.config import ValidateConfig
from quantkit.contract import ArtifactRecord, BaselineRecord, ModelPair
from quantkit.errors import BadInput
from quantkit.results import Results

__all__ = ["validate"]


def validate(*, artifact: Path, baseline: str, cfg: ValidateConfig, out: Path,
             force: bool = False) -> Results:
    """Run the tasks on artifact and baseline, decide the gate, write `out`; return the results."""
    from quantkit.engines.choice import engine_version
    from quantkit.fsutil import atomic_dir, check_output_dir
    from quantkit.gate import decide, write_junit

    started = time.time()
    cfg.check()
    tasks = cfg.run_tasks
    limits = cfg.limits
    check_output_dir(out, force)
    from quantkit.validate.runner import prepare_tasks

    prepared = prepare_tasks(cfg, tasks)  # each task's data, read and checked before any model
    for done in prepared.values():
        if done.warning:
            console.warn(done.warning)
    pair = _resolve_pair(Path(artifact), baseline, force, cfg.engine)
    from quantkit.checkpoints import call, checkpoint
    from quantkit.validate.runner import TaskContext, run_tasks, settings_record
    from quantkit.validate.served import served_thinking

    context = int(call(checkpoint(pair.manifest.checkpoint), "context_length", pair.quantized_path))
    served = served_thinking(cfg, pair.model_dir, context)  # a mode or budget it can't take: exit 2
    settings = settings_record(cfg, tasks, prepared, pair.dtype, served, pair.mode)
    contexts = [TaskContext(t, cfg, cfg.options(t), prepared[t].data, prepared[t].warning,
                            served) for t in tasks]
    from quantkit.fsutil import work_dir

    finished = work_dir(out, "partial")  # each task's result as it completes, for a rerun
    task_results, timings = run_tasks(pair, contexts, cfg.threads, finished)
    gate = decide(task_results, limits)
    results = Results(
        quantkit_version=__version__,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        artifact=ArtifactRecord(str(artifact), pair.artifact_sha256, pair.manifest.to_dict()),
        baseline=BaselineRecord(str(pair.baseline_path), pair.baseline_sha256, baseline,
                                pair.source_match),
        engine=pair.engine, engine_version=engine_version(pair.engine),
        settings=settings, thresholds=dict(limits.limits),
        calibration=_calibration(pair, _target(cfg)),
        tasks=task_results, gate=gate,
        timings={**timings, "total_s": round(time.time() - started, 1)})
    with atomic_dir(out, force) as tmp:
        results.write(tmp)
        write_junit(gate, tmp / "junit.xml")
    import shutil

    shutil.rmtree(finished, ignore_errors=True)
    return results


def _resolve_pair(artifact: Path, baseline: str, force: bool, engine: str = "auto"
                  ) -> ModelPair:
    """The quantized model and the baseline as files for one engine, and whether they belong."""
    from quantkit.artifact import Manifest, identity_sha256
    from quantkit.checkpoints import call, checkpoint, model_file
    from quantkit.engines.choice import ENGINES, choose_engine
    from quantkit.models import model_identity, resolve_model

    if not artifact.exists():
        raise BadInput(f"artifact {artifact} does not exist", "make it with `quantkit quantize`")
    manifest = Manifest.read(artifact)
    engine = choose_engine(manifest.checkpoint, engine, "validate")
    ref = resolve_model(baseline)
    base = model_identity(ref.path)
    mismatch = manifest.source.mismatch(base)
    if mismatch is not None and not force:
        raise BadInput(f"baseline {baseline} is not the source of {artifact} ({mismatch})",
                       "pass the model the artifact was made from, or --force to compare anyway")
    qpath = model_file(artifact, manifest)
    pair = ModelPair(engine, qpath, ref.path, identity_sha256(qpath), base.sha256, manifest,
                     ref.path, mismatch is None)
    fmt = checkpoint(manifest.checkpoint)
    if fmt.baseline is not None:  # the original as this format's engines compare it (a GGUF's:
        path, sha = call(fmt, "baseline", ref.path, base.sha256)  # the F16 GGUF, same engine)
        pair = dataclasses.replace(pair, baseline_path=Path(path), baseline_sha256=sha)
    return dataclasses.replace(pair, dtype=ENGINES[engine].compute_dtype(pair.baseline_path),
                               mode=ENGINES[engine].run_mode())


def _target(cfg: ValidateConfig) -> str | None:
    """The domain text the calibration set is matched to: the first task option that names one
    (`Task.target`) and is set."""
    from quantkit.task_registry import TASKS

    named = (TASKS[n].target for n in TASKS)
    values = (getattr(cfg, option, None) for option in named if option)
    return next((str(v) for v in values if v is not None), None)


def _calibration(pair: ModelPair, domain_set: str | None) -> dict[str, Any] | None:
    """The calibration set's manifest and stats, and its match to the domain set."""
    from quantkit.calib import describe_calibration

    calib = pair.manifest.calibration.get("path")
    if not calib:
        return None
    info = describe_calibration(Path(calib), domain_set, pair.model_dir)
    if info is not None:
        info["path"] = calib
    return info
