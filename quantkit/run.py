"""`run()`: a recipe's calibrate -> quantize -> validate -> report, reusing finished steps.

A step is reused when its output exists and was made from the same inputs: the recipe section,
the upstream step's output identity and quantkit's version, recorded in `.quantkit-runs/steps.json`
by step and output folder, so two recipes that calibrate alike into one folder (demo.yaml,
demo-w4.yaml) build it once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NotRequired, TypedDict, final

from quantkit import __version__, console
from quantkit.artifact import MANIFEST
from quantkit.artifact import SCHEMA_VERSION as MANIFEST_SCHEMA
from quantkit.calib import SAMPLES_FILE
from quantkit.config import Recipe, as_dict, load_recipe
from quantkit.errors import BadInput, EngineError, GateFailed, QuantkitError
from quantkit.fsutil import atomic_write_text
from quantkit.meter import meter
from quantkit.records import GateDecisionRecord
from quantkit.results import RESULTS, Results
from quantkit.results import SCHEMA_VERSION as RESULTS_SCHEMA

STATE_DIR = Path(".quantkit-runs")
STATE_FILE = STATE_DIR / "steps.json"
RUN_FILE = "run.json"  # in the report folder: the phase table of the run that wrote it


class StepRecord(TypedDict):
    """One step of a run (run.json's `steps`): reused or run, its output, and what it cost
    (meter's UsageRecord; a reused step's are those of the run that made it, absent where that
    run recorded none)."""

    reused: bool
    output: str
    seconds: NotRequired[float]
    peak_rss_gib: NotRequired[float]
    peak_gpu_gib: NotRequired[float | None]


class Published(TypedDict):
    """Where the recipe's `publish:` put the artifact."""

    repo: str
    url: str
    commit_message: str


@final  # `"stopped_after" in res` tells the two answers apart
class RunStopped(TypedDict):
    """`run(until=STEP)`'s answer: the steps so far and the step it stopped after."""

    recipe: str
    name: str
    steps: dict[str, StepRecord]
    stopped_after: str


@final
class RunFinished(TypedDict):
    """`run()`'s answer: the steps, the gate, the report folder, the results, the publication."""

    recipe: str
    name: str
    steps: dict[str, StepRecord]
    gate: GateDecisionRecord
    report: str
    results: Results
    published: Published | None


def run(*, recipe: Path, force: bool = False, until: str | None = None
        ) -> RunStopped | RunFinished:
    """Run every step of the recipe; return the steps (reused or not, seconds), the gate and the
    results (a `Results`). `until` names the step to stop after (`stopped_after` in the result;
    no report): a later run reuses what it made and goes on."""
    r = load_recipe(recipe)
    names = ("calibrate", "auto") if r.auto is not None else ("calibrate", "quantize", "validate")
    if until is not None and until not in names:
        raise BadInput(f"--until {until}: recipe {recipe} has no step {until!r}",
                       f"use --until {' or '.join(names)}")
    preflight(r, until=until)
    state_file = STATE_FILE
    state = json.loads(state_file.read_text()) if state_file.is_file() else {}
    steps: dict[str, StepRecord] = {}

    def step(name: str, inputs: Any, output: Path, identity: Callable[[], str],
             work: Callable[[], Any]) -> str:
        key = _key([inputs, __version__, MANIFEST_SCHEMA, RESULTS_SCHEMA])
        slot = f"{name}:{output}"
        prev = {} if force else state.get(slot, {})
        if prev.get("key") == key and output.exists() and prev.get("identity") == _safe(identity):
            console.log(f"{name}: reusing {output} (inputs unchanged)")
            steps[name] = {"reused": True, "output": str(output), **prev.get("usage", {})}
            return str(prev["identity"])
        console.log(f"{name}: running -> {output}")
        try:
            with meter() as use:
                work()
        except (BadInput, GateFailed):
            raise
        except Exception as exc:  # noqa: BLE001 - any other failure: the step named, exit 3
            raise step_failed(name, recipe, exc) from exc
        ident = identity()
        state[slot] = {"key": key, "identity": ident, "usage": use.to_dict()}
        STATE_DIR.mkdir(exist_ok=True)
        atomic_write_text(state_file, json.dumps(state, indent=2))
        steps[name] = {"reused": False, "output": str(output), **use.to_dict()}
        return ident

    out = r.outputs
    stopped: RunStopped = {"recipe": str(recipe), "name": r.name, "steps": steps,
                           "stopped_after": until or ""}
    calib_id = step("calibrate", [r.model, as_dict(r.calibration)], Path(out.calib),
                    lambda: _file_sha(Path(out.calib) / SAMPLES_FILE),
                    lambda: _calibrate(r))
    if until == "calibrate":
        return stopped
    if r.auto is not None:  # the search replaces quantize + validate
        step("auto", [calib_id, r.model, as_dict(r.quantize), as_dict(r.auto),
                      as_dict(r.validate)], Path(out.report),
             lambda: _file_sha(Path(out.report) / RESULTS), lambda: _auto(r))
    else:
        art_id = step("quantize", [calib_id, r.model, as_dict(r.quantize)], Path(out.artifact),
                      lambda: _file_sha(Path(out.artifact) / MANIFEST),
                      lambda: _quantize(r, resume=not force))
        if until == "quantize":
            return stopped
        step("validate", [art_id, r.model, as_dict(r.validate)], Path(out.report),
             lambda: _file_sha(Path(out.report) / RESULTS), lambda: _validate(r))
    if until is not None:
        return stopped
    from quantkit.report import write_report

    _write_phases(Path(out.report), steps)
    with meter() as use:
        write_report(Path(out.report))  # the one rendering (a reused step picks up a newer layout)
    # the rendering is in the phase table, not among the steps (it is never reused)
    _write_phases(Path(out.report), {**steps, "report": {"reused": False,
                                                         "output": str(out.report),
                                                         **use.to_dict()}})
    results = Results.read(Path(out.report))
    published = _publish(r, results.verdict) if r.publish is not None else None
    return {"recipe": str(recipe), "name": r.name, "steps": steps, "gate": results.gate.to_dict(),
            "report": str(out.report), "results": results, "published": published}


def step_failed(name: str, recipe: Path, exc: Exception) -> EngineError:
    """A step that broke (an engine error, CUDA out of memory, a crash), as exit 3 naming the
    step and saying that what finished is kept for the rerun."""
    text = exc.message if isinstance(exc, QuantkitError) else \
        f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
    hint = f"what finished is kept: `quantkit run {recipe}` again resumes there"
    if "out of memory" in text.lower():
        hint += ("; for GPU memory, free the GPU of other processes, or lower the step's need "
                 "(fewer or shorter calibration samples, validate.engine: transformers)")
    elif isinstance(exc, QuantkitError) and exc.hint:
        hint = f"{exc.hint}; {hint}"
    return EngineError(f"the {name} step failed: {text}", hint)


def _write_phases(report: Path, steps: dict[str, StepRecord]) -> None:
    """The run's phase table beside results.json (`run.json`): per step its wall time, peak CPU
    and GPU memory, and whether this run reused it (then the figures are those of the run that
    made it). The report shows it."""
    atomic_write_text(report / RUN_FILE, json.dumps({"steps": steps}, indent=2))


def _publish(r: Recipe, verdict: str) -> Published | None:
    """The recipe's `publish:` section: the artifact and its card to the Hub, only when the gate
    passed (a failed or ungated run publishes nothing)."""
    if verdict != "pass":
        console.log(f"publish: skipped ({'the gate failed' if verdict == 'fail' else 'not gated'})")
        return None
    from quantkit.publish import publish

    assert r.publish is not None
    res = publish(artifact=Path(r.outputs.artifact), repo_id=r.publish.repo,
                  results=Path(r.outputs.report), private=r.publish.private)
    return {"repo": res["repo"], "url": res["url"], "commit_message": res["commit_message"]}


def _calibrate(r: Recipe) -> None:
    from quantkit.calib import calibrate

    calibrate(model=r.model, cfg=r.calibration, out=Path(r.outputs.calib), force=True)


def _quantize(r: Recipe, resume: bool) -> None:
    from quantkit.quantize import quantize

    # resume: a run cut off in this step keeps the layers it finished (.ARTIFACT.partial)
    quantize(model=r.model, cfg=r.quantize, calib=Path(r.outputs.calib),
             out=Path(r.outputs.artifact), resume=resume, force=True)
    _release_gpu()


def _release_gpu() -> None:
    """Hand the GPU memory quantization cached back to the driver: validation next starts vLLM
    engines in other processes, which find only the memory no process holds."""
    import gc
    import sys

    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _auto(r: Recipe) -> None:
    from quantkit.auto import auto, none_passed

    assert r.auto is not None
    res = auto(model=r.model, calib=Path(r.outputs.calib), acfg=r.auto, qcfg=r.quantize,
               vcfg=r.validate, out=Path(r.outputs.artifact), report=Path(r.outputs.report),
               force=True, scfg=r.serve, bcfg=r.bench)
    if res.chosen is None:
        raise none_passed(res)


def _validate(r: Recipe) -> None:
    from quantkit.validate import validate

    validate(artifact=Path(r.outputs.artifact), baseline=r.model, cfg=r.validate,
             out=Path(r.outputs.report), force=True)


def preflight(r: Recipe, until: str | None = None) -> None:
    """What each step will read, checked before the first one runs (the configs are checked by
    load_recipe): files exist and parse, the output folders can be written. A run that stops
    before validation (`--until calibrate|quantize`: a quantizing machine without the serving
    engine) is not asked for the engines it will not start."""
    from quantkit.fsutil import check_output_dir
    from quantkit.sources import parse_source

    for spec in (*r.calibration.sources, *r.calibration.exclude,
                 *([r.calibration.target] if r.calibration.target else [])):
        parse_source(spec)
    r.quantize.preflight()  # what the methods' own options name on disk
    from quantkit.validate.runner import prepare_tasks

    prepare_tasks(r.validate, r.validate.run_tasks)  # each task's data (its warnings: validate's)
    for out in (r.outputs.calib, r.outputs.artifact, r.outputs.report):
        check_output_dir(Path(out), force=True)
    if until not in ("calibrate", "quantize"):
        _check_engines(r)
        _check_serve_context(r)
    else:
        _check_cuda(r)
    from quantkit.fit import check_recipe_fits

    for need in check_recipe_fits(r):  # the GPU's memory at each GPU step (nothing on a CPU)
        console.log(f"GPU plan: {need.phase} needs about {need.need_gib:.1f} GiB of the "
                    f"{need.budget_gib:.1f} GiB it may use")
    if r.publish is not None:  # a run that will publish needs the Hub and a token: say so now
        from quantkit.publish import hub_token

        hub_token()


def _check_engines(r: Recipe) -> None:
    """What the recipe asks of this machine: a CUDA device for quantization, the engine it names
    to serve with (a recipe that serves on vLLM validates on it: both are checked before the
    first step, not after an hour of quantization)."""
    from quantkit.engines.choice import choose_engine
    from quantkit.methods import METHODS

    _check_cuda(r)
    checkpoint = METHODS[r.quantize.method].checkpoint
    if r.serve.engine != "auto":
        choose_engine(checkpoint, r.serve.engine, "serve", r.serve)
    if r.validate.engine != "auto":
        choose_engine(checkpoint, r.validate.engine, "validate")


def _check_serve_context(r: Recipe) -> None:
    """serve.ctx_size past the context the model was trained for: refused now, not when the
    server starts after quantization and validation (a model on disk; a hub id's config comes
    with it)."""
    if not r.serve.ctx_size or not (Path(r.model) / "config.json").is_file():
        return
    from quantkit.checkpoints import ct_context_length
    from quantkit.serve.launcher import check_context

    # the artifact's config.json is the source's: what serve will read of it after quantization
    check_context(r.serve.ctx_size, ct_context_length(Path(r.model)), r.model, "serve.ctx_size")


def _check_cuda(r: Recipe) -> None:
    from quantkit.gpu import gpu_present

    if r.quantize.device.startswith("cuda") and not gpu_present():
        raise BadInput("the recipe quantizes with device: cuda, and no NVIDIA GPU is visible",
                       "run it on a GPU machine, or set quantize.device: cpu (hours for a 7B)")


def _key(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _file_sha(path: Path) -> str:
    from quantkit.fsutil import sha256_file

    return sha256_file(path)


def _safe(identity: Callable[[], str]) -> str | None:
    try:
        return identity()
    except OSError:
        return None
