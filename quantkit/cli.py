"""The command line: a thin Typer shell over the stage functions. The only place that exits.

Each stage's options are its config dataclass in `quantkit/config/` (one default per option, there);
a command's flags default to None, so a flag given explicitly overrides the `--recipe` section.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from quantkit import console
from quantkit.config import (
    AutoConfig,
    BenchConfig,
    CalibrateConfig,
    QuantizeConfig,
    Recipe,
    ServeConfig,
    ValidateConfig,
    build,
    recipe_section,
)
from quantkit.errors import EXIT_ENGINE, GateFailed, QuantkitError

C = TypeVar("C")
EXIT_INTERRUPTED = 130
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="From a Hugging Face model to a validated, served 4-bit model.")
_state = {"debug": False, "json": False}


@app.callback()
def _options(
    ctx: typer.Context,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable results.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress or logs.")] = False,
    verbose: Annotated[bool, typer.Option(
        "--verbose", help="Let the libraries' own logs and progress bars through to stderr.")
    ] = False,
) -> None:
    _state.update(debug=debug, json=json_out)
    console.set_quiet(quiet)
    if not (debug or verbose):  # third-party bars and logs go to $QUANTKIT_HOME/logs/COMMAND.log
        from quantkit.models import quantkit_home

        name = ctx.invoked_subcommand or "quantkit"
        console.silence_third_party(quantkit_home() / "logs" / f"{name}.log")


def _fail(message: str, hint: str, code: int) -> None:
    console.err.print(f"error: {message}", markup=False, soft_wrap=True)
    if hint:
        console.err.print(f"hint: {hint}", markup=False, soft_wrap=True)
    raise typer.Exit(code)


def _command(fn: Callable[..., None]) -> Callable[..., None]:
    """Register a command. A QuantkitError becomes `error:`/`hint:` lines and its exit code; any
    other exception is exit 3 with its type (never 1, which means the gate failed)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except KeyboardInterrupt:
            console.err.print("interrupted", markup=False)
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except QuantkitError as exc:
            if _state["debug"]:
                raise
            _fail(exc.message, exc.hint, exc.exit_code)
        except Exception as exc:  # noqa: BLE001 - the edge: one line, exit 3, never a traceback
            if _state["debug"]:
                raise
            text = " ".join(str(exc).split()) or "(no message)"
            _fail(f"unexpected {type(exc).__name__}: {text[:500]}",
                  "this is a quantkit or engine failure; rerun with --debug for the traceback",
                  EXIT_ENGINE)

    return app.command()(run)


def _flag(cls: type, name: str, *decls: str) -> Any:
    """A Typer option for config field `name`: its help text and its one default, shown."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    make: Any = f.default_factory
    default = f.default if f.default is not dataclasses.MISSING else make()
    shown = "" if default in (None, (), {}) else f" [default: {_show(default)}]"
    return typer.Option(*decls, help=f.metadata["help"] + shown, show_default=False)


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def _config(cls: type[C], recipe: Path | None, section: str, given: dict[str, Any]
            ) -> tuple[C, Recipe | None]:
    """The recipe's section (or the defaults) with the flags given explicitly on top."""
    base, r = recipe_section(recipe, section)
    return build(cls, base, given), r


def _csv(value: str | None) -> tuple[str, ...] | None:
    """A comma-separated flag (`--tasks a,b`) as a tuple; None when not given."""
    return tuple(v.strip() for v in value.split(",") if v.strip()) if value else None


def _need(value: Any, what: str, hint: str) -> Any:
    if value is None:
        from quantkit.errors import BadInput

        raise BadInput(f"no {what} given", hint)
    return value


def _emit(result: dict[str, Any], human: str) -> None:
    if _state["json"]:
        console.result_json(result)
    else:
        console.result_text(human)


RecipeOpt = Annotated[Path | None, typer.Option(
    help="Take this command's settings from the recipe's section; flags override.")]
ForceOpt = Annotated[bool, typer.Option(help="Replace an existing output folder.")]


@_command
def calibrate(
    model: Annotated[str | None, typer.Argument(
        help="Model folder, hub id, .gguf file or smollm2-135m (default: the recipe's).")] = None,
    sources: Annotated[list[str] | None, _flag(CalibrateConfig, "sources", "--source")] = None,
    out: Annotated[Path | None, typer.Option(
        help="Output folder, e.g. calib_sets/NAME (default: the recipe's outputs.calib).")] = None,
    samples: Annotated[int | None, _flag(CalibrateConfig, "samples")] = None,
    min_tokens: Annotated[int | None, _flag(CalibrateConfig, "min_tokens")] = None,
    max_tokens: Annotated[int | None, _flag(CalibrateConfig, "max_tokens")] = None,
    seed: Annotated[int | None, _flag(CalibrateConfig, "seed")] = None,
    exclude: Annotated[list[str] | None, _flag(CalibrateConfig, "exclude")] = None,
    target: Annotated[str | None, _flag(CalibrateConfig, "target")] = None,
    recipe: RecipeOpt = None,
    force: ForceOpt = False,
) -> None:
    """Build a domain-matched calibration set."""
    cfg, r = _config(CalibrateConfig, recipe, "calibration", locals())
    model = _need(model or (r and r.model), "model", "pass MODEL or --recipe")
    out = _need(out or (r and Path(r.outputs.calib)), "--out", "pass --out calib_sets/NAME")
    from quantkit.calib import calibrate as run

    res = run(model=model, cfg=cfg, out=out, force=force)
    mix = ", ".join(f"{k} {v['actual']}" for k, v in res["mix"].items())
    match = res["target_match"]
    extra = (f"\ntarget match: JS divergence {match['js_divergence']} bits, "
             f"coverage {match['target_token_coverage']:.1%}") if match else ""
    _emit(res, f"wrote {res['out']}: {res['samples']} samples, {res['tokens']} tokens ({mix}){extra}")


@_command
def quantize(
    model: Annotated[str | None, typer.Argument(
        help="Model folder, hub id, .gguf file or smollm2-135m (default: the recipe's).")] = None,
    method: Annotated[str | None, _flag(QuantizeConfig, "method")] = None,
    calib: Annotated[Path | None, typer.Option(
        help="Calibration set folder (quantkit calibrate; default: the recipe's).")] = None,
    out: Annotated[Path | None, typer.Option(
        help="Artifact folder, e.g. artifacts/NAME (default: the recipe's).")] = None,
    bits: Annotated[int | None, _flag(QuantizeConfig, "bits")] = None,
    group_size: Annotated[int | None, _flag(QuantizeConfig, "group_size")] = None,
    sym: Annotated[bool | None, _flag(QuantizeConfig, "sym", "--sym/--asym")] = None,
    act_order: Annotated[bool | None, _flag(QuantizeConfig, "act_order",
                                               "--act-order/--no-act-order")] = None,
    damp: Annotated[float | None, _flag(QuantizeConfig, "damp")] = None,
    clip: Annotated[str | None, _flag(QuantizeConfig, "clip")] = None,
    w8_groups: Annotated[str | None, _flag(QuantizeConfig, "w8_groups")] = None,
    sensitivity_tokens: Annotated[int | None, _flag(QuantizeConfig, "sensitivity_tokens")] = None,
    hessians: Annotated[str | None, _flag(QuantizeConfig, "hessians")] = None,
    awq_scales: Annotated[bool | None, _flag(QuantizeConfig, "awq_scales",
                                                "--awq-scales/--no-awq-scales")] = None,
    device: Annotated[str | None, _flag(QuantizeConfig, "device")] = None,
    batch_tokens: Annotated[int | None, _flag(QuantizeConfig, "batch_tokens")] = None,
    quant_type: Annotated[str | None, _flag(QuantizeConfig, "quant_type")] = None,
    imatrix: Annotated[bool | None, _flag(QuantizeConfig, "imatrix",
                                             "--imatrix/--no-imatrix")] = None,
    threads: Annotated[int | None, _flag(QuantizeConfig, "threads")] = None,
    heldout: Annotated[str | None, _flag(QuantizeConfig, "heldout")] = None,
    recipe: RecipeOpt = None,
    resume: Annotated[bool, typer.Option(
        help="Continue an interrupted run from its last layer.")] = False,
    force: ForceOpt = False,
) -> None:
    """Quantize a model: GPTQ or AWQ to compressed-tensors, or GGUF k-quants through llama.cpp."""
    cfg, r = _config(QuantizeConfig, recipe, "quantize", locals())
    model = _need(model or (r and r.model), "model", "pass MODEL or --recipe")
    calib = _need(calib or (r and Path(r.outputs.calib)), "--calib", "pass --calib calib_sets/NAME")
    out = _need(out or (r and Path(r.outputs.artifact)), "--out", "pass --out artifacts/NAME")
    if recipe is None and method is None:
        from quantkit.errors import BadInput
        from quantkit.methods import METHODS

        raise BadInput("no --method given", "pass --method " + ", ".join(METHODS))
    from quantkit.quantize import quantize as run

    m = run(model=model, cfg=cfg, calib=calib, out=out, resume=resume, force=force)
    size = m.size_bytes
    what = (f"{str(m.parameters['quant_type'])} ({m.bits_per_weight} bpw, {m.fallback_tensors} "
            f"tensors fell back), ppl {(m.verification or {}).get('ppl_f16')} -> "
            f"{(m.verification or {}).get('ppl_quantized')}" if m.checkpoint == "gguf"
            else f"{m.method} W{cfg.bits} g{cfg.group_size}" + (
                f" with {len(m.sensitivity['upgraded'])} linear groups at W8"
                if m.sensitivity else ""))
    _emit(m.to_dict(), f"wrote {out}: {what}, {size['before'] / 2**20:.0f} MiB -> "
                       f"{size['after'] / 2**20:.0f} MiB in {m.wall_time_s:.0f} s")


@_command
def inspect(target: Annotated[str, typer.Argument(
        help="A model spec, a calibration set folder or an artifact folder.")]) -> None:
    """Describe a model, a calibration set or an artifact."""
    from quantkit.inspect import human_summary, inspect_path

    res = inspect_path(target)
    _emit(res, human_summary(res, target))


@_command
def validate(
    artifact: Annotated[Path | None, typer.Argument(
        help="Artifact folder (quantkit quantize; default: the recipe's).")] = None,
    baseline: Annotated[str | None, typer.Option(
        help="The original model: folder, hub id or alias (default: the recipe's model).")] = None,
    out: Annotated[Path | None, typer.Option(
        help="Report folder, e.g. reports/NAME (default: the recipe's).")] = None,
    tasks: Annotated[str | None, _flag(ValidateConfig, "tasks")] = None,
    task_path: Annotated[list[str] | None, _flag(ValidateConfig, "task_path")] = None,
    engine: Annotated[str | None, _flag(ValidateConfig, "engine")] = None,
    domain_set: Annotated[str | None, _flag(ValidateConfig, "domain_set")] = None,
    limit: Annotated[int | None, _flag(ValidateConfig, "limit")] = None,
    humaneval_limit: Annotated[int | None, _flag(ValidateConfig, "humaneval_limit")] = None,
    humaneval_max_tokens: Annotated[int | None, _flag(ValidateConfig,
                                                         "humaneval_max_tokens")] = None,
    sandbox: Annotated[str | None, _flag(ValidateConfig, "sandbox")] = None,
    mmlu_data: Annotated[str | None, _flag(ValidateConfig, "mmlu_data")] = None,
    samples: Annotated[int | None, _flag(ValidateConfig, "samples")] = None,
    temperature: Annotated[float | None, _flag(ValidateConfig, "temperature")] = None,
    top_p: Annotated[float | None, _flag(ValidateConfig, "top_p")] = None,
    max_tokens: Annotated[int | None, _flag(ValidateConfig, "max_tokens")] = None,
    seed: Annotated[int | None, _flag(ValidateConfig, "seed")] = None,
    threads: Annotated[int | None, _flag(ValidateConfig, "threads")] = None,
    thresholds: Annotated[Path | None, _flag(ValidateConfig, "thresholds")] = None,
    recipe: RecipeOpt = None,
    force: Annotated[bool, typer.Option(
        help="Replace the report folder; compare with a baseline that is not the source.")] = False,
) -> None:
    """Compare the artifact with its baseline on the serving engine; gate on thresholds."""
    given = dict(locals())
    given["tasks"] = _csv(tasks)
    if thresholds is not None:
        from quantkit.gate import read_thresholds

        given["thresholds"] = read_thresholds(thresholds)
    cfg, r = _config(ValidateConfig, recipe, "validate", given)
    artifact = _need(artifact or (r and Path(r.outputs.artifact)), "ARTIFACT",
                     "pass ARTIFACT or --recipe")
    baseline = _need(baseline or (r and r.model), "--baseline", "pass --baseline MODEL")
    out = _need(out or (r and Path(r.outputs.report)), "--out", "pass --out reports/NAME")
    from quantkit.report import write_report
    from quantkit.validate import validate as run

    res = run(artifact=artifact, baseline=baseline, cfg=cfg, out=out, force=force).to_dict()
    report_file = write_report(out)
    _emit(res["gate"], summary(res) + f"\nreport: {report_file}")
    _gate(res["gate"], out)


def _gate(gate: dict[str, Any], report_dir: Path) -> None:
    if gate["verdict"] == "fail":
        raise GateFailed("the gate failed: " + ", ".join(gate["failing"]),
                         f"read {report_dir / 'report.html'} for the failing metrics and causes")


def summary(res: dict[str, Any]) -> str:
    """One line per task and check, the verdict first."""
    from quantkit.tasks import task as task_spec

    lines = [f"verdict: {res['gate']['verdict'].upper()} ({res['engine']})"]
    for name, r in res["tasks"].items():
        spec = task_spec(name)
        if spec.external and "quantized" in r:  # an lm-eval task: each side's main metric first
            q, b = r["quantized"], r["baseline"]
            lines.append(f"  {name}.{r.get('metric')}: baseline {b['value']:.4f}, quantized "
                         f"{q['value']:.4f} n={q['n']}")
        for key in spec.summary_keys:
            if key in r:
                m = r[key]
                lines.append(f"  {name}.{key}: {m['note']}" if m.get("note") else
                             f"  {name}.{key}: {m['value']:.4f} [{_num(m['lo'])}, {_num(m['hi'])}]"
                             f" n={m.get('n')}")
    warning = (res["tasks"].get("humaneval") or {}).get("sandbox_warning")
    if warning:
        lines.append(f"  warning: {warning}")
    from quantkit.results import calibration_match

    match = calibration_match(res)
    if match and match.get("poor"):  # the report marks it "poor match"
        lines.append(f"  warning: the calibration set matches the domain set poorly (JS divergence "
                     f"{_num(match.get('js_divergence'))} bits, above "
                     f"{_num(match.get('poor_threshold_jsd'))}); see the report's calibration "
                     "section")
    for c in res["gate"]["checks"]:
        mark = "pass" if c["passed"] else "FAIL"
        note = (f" ({c['note']})" if c.get("note") else
                " (sample too small to support the verdict)" if c.get("too_small") else "")
        lines.append(f"  {mark} {c['task']}.{c['metric']} {c['op']} {c['limit']}{note}")
    return "\n".join(lines)


def _num(v: Any) -> str:
    return "n/a" if v is None else f"{v:.4f}"


@_command
def report(folder: Annotated[Path, typer.Argument(help="Report folder (quantkit validate --out).")]
           ) -> None:
    """(Re)write the self-contained report.html of a validation."""
    from quantkit.report import write_report

    path = write_report(folder)
    _emit({"report": str(path)}, f"wrote {path}")


@_command
def auto(
    model: Annotated[str | None, typer.Argument(
        help="Model folder, hub id, .gguf file or smollm2-135m (default: the recipe's).")] = None,
    calib: Annotated[Path | None, typer.Option(
        help="Calibration set folder (quantkit calibrate; default: the recipe's).")] = None,
    thresholds: Annotated[Path | None, _flag(ValidateConfig, "thresholds")] = None,
    out: Annotated[Path | None, typer.Option(
        help="Where the chosen artifact goes, e.g. artifacts/NAME (default: the recipe's).")] = None,
    method: Annotated[str | None, _flag(AutoConfig, "method")] = None,
    candidates: Annotated[str | None, _flag(AutoConfig, "candidates")] = None,
    early_reject: Annotated[bool | None, _flag(AutoConfig, "early_reject")] = None,
    shared_hessians: Annotated[bool | None, _flag(AutoConfig, "shared_hessians",
                                                     "--shared-hessians/--no-shared-hessians")] = None,
    tasks: Annotated[str | None, _flag(ValidateConfig, "tasks")] = None,
    domain_set: Annotated[str | None, _flag(ValidateConfig, "domain_set")] = None,
    limit: Annotated[int | None, _flag(ValidateConfig, "limit")] = None,
    report: Annotated[Path | None, typer.Option(
        help="Report folder of the chosen candidate, with every candidate's numbers.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable results.")] = False,
    recipe: RecipeOpt = None,
    force: ForceOpt = False,
) -> None:
    """The smallest quantization that passes the gate: candidates smallest first."""
    given = dict(locals())
    given["candidates"] = _csv(candidates)
    acfg, r = _config(AutoConfig, recipe, "auto", given)
    vgiven: dict[str, Any] = {
        "tasks": _csv(tasks),
        "domain_set": domain_set, "limit": limit}
    if thresholds is not None:
        from quantkit.gate import read_thresholds

        vgiven["thresholds"] = read_thresholds(thresholds)
    vcfg, _ = _config(ValidateConfig, recipe, "validate", vgiven)
    qcfg, _ = _config(QuantizeConfig, recipe, "quantize", {})
    model = _need(model or (r and r.model), "MODEL", "pass MODEL or --recipe")
    calib = _need(calib or (r and Path(r.outputs.calib)), "--calib", "pass --calib DIR")
    out = _need(out or (r and Path(r.outputs.artifact)), "--out", "pass --out artifacts/NAME")
    if report is None and r is not None:
        report = Path(r.outputs.report)
    if json_out:
        _state["json"] = True
    from quantkit.auto import auto as search

    res = search(model=model, calib=calib, acfg=acfg, qcfg=qcfg, vcfg=vcfg, out=out,
                 report=report, force=force)
    _emit(res, auto_summary(res))
    if res["chosen"] is None:
        from quantkit.auto import none_passed

        raise none_passed(res)


def auto_summary(res: dict[str, Any]) -> str:
    from quantkit.auto import brief

    lines = [f"{c['name']}: {c['verdict']}, {c['bits_per_weight']:.3g} bits/weight, "
             f"{c['size_bytes'] / 2**20:.1f} MiB, {c['seconds']:.0f} s ({brief(c['metrics'])})"
             for c in res["candidates"]]
    lines += [f"skipped {s}" for s in res["skipped"]]
    chosen = res["chosen"]
    lines.append(f"chosen: {chosen['name']} -> {res['out']}" if chosen else "chosen: none")
    if res.get("report"):
        lines.append(f"report: {Path(res['report']) / 'report.html'}")
    if chosen:
        lines.append(next_step(res["out"], res.get("report")))
    return "\n".join(lines)


def next_step(artifact: str | Path, report: str | Path | None) -> str:
    """The closing line after an artifact passed: the serve command that finds its validation
    (`--reports` where the report is not under reports/; none kept: --allow-unvalidated)."""
    import shlex

    cmd = f"quantkit serve {shlex.quote(str(artifact))}"
    if report is None:
        cmd += " --allow-unvalidated"
    elif Path(report).parent != Path("reports"):
        cmd += f" --reports {shlex.quote(str(Path(report).parent))}"
    return f"next: {cmd}"


@_command
def run(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML, e.g. recipes/demo.yaml.")],
    force: Annotated[bool, typer.Option(help="Run every step again, even if unchanged.")] = False,
) -> None:
    """Calibrate, quantize, validate and report from a recipe; reuse unchanged steps."""
    from quantkit.run import run as run_recipe

    res = run_recipe(recipe=recipe, force=force)
    steps = ", ".join(f"{k} {'reused' if v['reused'] else str(v['seconds']) + ' s'}"
                      for k, v in res["steps"].items())
    report_dir = Path(res["report"])
    passed = res["gate"]["verdict"] == "pass"
    _emit({k: v for k, v in res.items() if k != "results"},
          f"{res['name']}: {steps}\n{summary(res['results'])}\nreport: {report_dir / 'report.html'}"
          + (f"\n{next_step(res['results']['artifact']['path'], report_dir)}" if passed else ""))
    _gate(res["gate"], report_dir)


@_command
def serve(
    artifact: Annotated[Path | None, typer.Argument(
        help="Artifact folder (quantkit quantize) or .gguf; default: the recipe's.")] = None,
    engine: Annotated[str | None, _flag(ServeConfig, "engine")] = None,
    host: Annotated[str | None, _flag(ServeConfig, "host")] = None,
    port: Annotated[int | None, _flag(ServeConfig, "port")] = None,
    api_key: Annotated[str | None, _flag(ServeConfig, "api_key")] = None,
    max_num_seqs: Annotated[int | None, _flag(ServeConfig, "max_num_seqs")] = None,
    ctx_size: Annotated[int | None, _flag(ServeConfig, "ctx_size")] = None,
    gpu_memory_utilization: Annotated[float | None, _flag(ServeConfig,
                                                             "gpu_memory_utilization")] = None,
    block_size: Annotated[int | None, _flag(ServeConfig, "block_size")] = None,
    enable_chunked_prefill: Annotated[bool | None, _flag(
        ServeConfig, "enable_chunked_prefill",
        "--enable-chunked-prefill/--no-enable-chunked-prefill")] = None,
    draft_model: Annotated[str | None, _flag(ServeConfig, "draft_model")] = None,
    num_speculative_tokens: Annotated[int | None, _flag(ServeConfig,
                                                           "num_speculative_tokens")] = None,
    vllm_python: Annotated[str | None, _flag(ServeConfig, "vllm_python")] = None,
    threads: Annotated[int | None, _flag(ServeConfig, "threads")] = None,
    extra_args: Annotated[list[str] | None, _flag(ServeConfig, "extra_args",
                                                     "--extra-arg")] = None,
    kernel: Annotated[str | None, _flag(ServeConfig, "kernel")] = None,
    tensor_parallel_size: Annotated[int | None, _flag(ServeConfig, "tensor_parallel_size")] = None,
    pipeline_parallel_size: Annotated[int | None, _flag(ServeConfig,
                                                         "pipeline_parallel_size")] = None,
    recipe: RecipeOpt = None,
    reports: Annotated[Path | None, typer.Option(
        help="Where validations are looked up [reports, or the recipe's report's folder].")] = None,
    log_file: Annotated[Path | None, typer.Option(help="Append the engine's output here.")] = None,
    allow_unvalidated: Annotated[bool, typer.Option(
        help="Serve without a passing validation.")] = False,
) -> None:
    """Serve the validated artifact behind an OpenAI-compatible API (Ctrl-C stops it)."""
    cfg, r = _config(ServeConfig, recipe, "serve", locals())
    artifact = _need(artifact or (r and Path(r.outputs.artifact)), "artifact to serve",
                     "pass ARTIFACT or --recipe recipes/NAME.yaml")
    reports = reports or (Path(r.outputs.report).parent if r else Path("reports"))
    from quantkit.serve import serve as run_server

    res = run_server(artifact, cfg=cfg, allow_unvalidated=allow_unvalidated, reports=reports,
                     log_file=log_file)
    _emit(dict(res), f"stopped {res['engine']}")


@_command
def setup(program: Annotated[str, typer.Argument(help="What to build: llama-server.")],
          force: Annotated[bool, typer.Option(help="Build again.")] = False) -> None:
    """Build llama-server from the installed llama-cpp-python's llama.cpp source (once)."""
    from quantkit.errors import BadInput

    if program != "llama-server":
        raise BadInput(f"unknown program {program!r}", "quantkit setup llama-server")
    from quantkit.serve.setup import setup_llama_server

    res = setup_llama_server(force=force)
    _emit(res, f"{'built' if res['built'] else 'already built'}: {res['path']}")


@_command
def bench(
    url: Annotated[str | None, _flag(BenchConfig, "url")] = None,
    out: Annotated[Path | None, typer.Option(
        help="Report folder, e.g. reports/NAME-bench (default: the recipe's report + -bench).")
    ] = None,
    requests: Annotated[int | None, _flag(BenchConfig, "requests")] = None,
    concurrency: Annotated[str | None, _flag(BenchConfig, "concurrency")] = None,
    mix: Annotated[str | None, _flag(BenchConfig, "mix")] = None,
    max_tokens: Annotated[str | None, _flag(BenchConfig, "max_tokens")] = None,
    api_key: Annotated[str | None, _flag(BenchConfig, "api_key")] = None,
    model: Annotated[str | None, _flag(BenchConfig, "model")] = None,
    endpoint: Annotated[str | None, _flag(BenchConfig, "endpoint")] = None,
    p99_ttft_target: Annotated[float | None, _flag(BenchConfig, "p99_ttft_target")] = None,
    p99_e2e_target: Annotated[float | None, _flag(BenchConfig, "p99_e2e_target")] = None,
    timeout: Annotated[float | None, _flag(BenchConfig, "timeout")] = None,
    seed: Annotated[int | None, _flag(BenchConfig, "seed")] = None,
    recipe: RecipeOpt = None,
    force: ForceOpt = False,
) -> None:
    """Load-test an OpenAI-compatible server: latency percentiles per concurrency, the knee."""
    cfg, r = _config(BenchConfig, recipe, "bench", locals())
    if cfg.url is None and r is not None:  # the server the recipe's serve section starts
        cfg = dataclasses.replace(cfg, url=f"http://{r.serve.host}:{r.serve.port}")
    out = _need(out or (r and Path(r.outputs.report + "-bench")), "--out",
                "pass --out reports/NAME-bench")
    from quantkit.bench import bench as run_bench

    res = run_bench(cfg=cfg, out=out, force=force)
    lines = [f"{'conc':>5} {'req/s':>7} {'tok/s':>8} {'TTFT p50/p99 s':>16} {'TPOT p50/p99 ms':>17} err"]
    for row in res["levels"]:
        t, p = row["ttft_s"], row["tpot_s"]
        lines.append(f"{row['concurrency']:>5} {row['request_throughput']:>7.2f} "
                     f"{row['output_token_throughput']:>8.1f} {_s(t['p50'])}/{_s(t['p99']):<7} "
                     f"{_ms(p['p50'])}/{_ms(p['p99']):<8} {row['errors']}")
    knee = res["knee"]
    lines.append(f"knee {knee['concurrency']} ({knee['reason']}); recommended max concurrency "
                 f"{res['recommended_concurrency']}\nreport: {Path(out) / 'report.html'}")
    _emit(res, "\n".join(lines))


def _s(v: Any) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _ms(v: Any) -> str:
    return "n/a" if v is None else f"{v * 1000:.1f}"


@_command
def doctor(
    artifact: Annotated[Path | None, typer.Argument(help="Artifact to serve and check.")] = None,
    url: Annotated[str | None, typer.Option(help="A running server to check.")] = None,
    api_key: Annotated[str | None, typer.Option(help="Bearer key of the server.")] = None,
    engine: Annotated[str, typer.Option(help="Engine when serving ARTIFACT.")] = "auto",
) -> None:
    """Five checks when inference is slow: batching, KV cache, quantization, GPU use, memory."""
    from quantkit.bench.doctor import doctor as run_doctor

    res = run_doctor(url=url, artifact=artifact, api_key=api_key, engine=engine)
    lines = [f"{res['model']} on {res['engine']}: {res['status'].upper()}"]
    for c in res["checks"]:
        lines.append(f"  {c['status']:<4} {c['check']}: {c['reason']}"
                     + (f"\n       fix: {c['fix']}" if c["fix"] and c["status"] != "pass" else ""))
    _emit(res, "\n".join(lines))


def main() -> None:
    """Console-script entry point."""
    app()
