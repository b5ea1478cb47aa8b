"""The command line: a thin Typer shell over the stage functions. The only place that exits.

Each stage's options are its config dataclass in `quantkit/config/` (one default per option, there).
`config_flags` gives a command one flag per field, read from the dataclass (name, type, help,
default shown); they default to None, so a flag given explicitly overrides the `--recipe` section.
What a command prints for a person is in `quantkit.views`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from quantkit import console, views
from quantkit.config import (
    AutoConfig,
    BenchConfig,
    CalibrateConfig,
    QuantizeConfig,
    ServeConfig,
    ValidateConfig,
)
from quantkit.contract import GateDecision
from quantkit.errors import EXIT_ENGINE, BadInput, GateFailed, QuantkitError
from quantkit.flags import config_flags, config_from
from quantkit.records import AutoRecord, BenchResults, CalibSummary, GateDecisionRecord

if TYPE_CHECKING:
    from quantkit.inspect import Inspection
    from quantkit.loadtest.doctor import Diagnosis
    from quantkit.run import RunStopped

EXIT_INTERRUPTED = 130


def _flags_take_no_type() -> None:
    """typer 0.29's help prints a `<bool>` type beside every flag, which takes no value: a flag's
    type column stays empty (every other option keeps its type)."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None:  # an older typer prints no type column
        return

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag else shown(self, ctx)

    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_take_no_type()
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


def _need(value: Any, what: str, hint: str) -> Any:
    if value is None:
        raise BadInput(f"no {what} given", hint)
    return value


def _emit(result: dict[str, Any] | BenchResults | Diagnosis | GateDecisionRecord | AutoRecord
          | CalibSummary | Inspection | RunStopped, human: str) -> None:
    if _state["json"]:
        console.result_json(result)
    else:
        console.result_text(human)


RecipeOpt = Annotated[Path | None, typer.Option(
    help="Take this command's settings from the recipe's section; flags override.")]
ForceOpt = Annotated[bool, typer.Option(help="Replace an existing output folder.")]
ModelArg = Annotated[str | None, typer.Argument(
    help="Model folder, hub id, .gguf file or smollm2-135m (default: the recipe's).")]
CalibOpt = Annotated[Path | None, typer.Option(
    help="Calibration set folder (quantkit calibrate; default: the recipe's).")]


@_command
@config_flags(CalibrateConfig)
def calibrate(
    model: ModelArg = None,
    out: Annotated[Path | None, typer.Option(
        help="Output folder, e.g. calib_sets/NAME (default: the recipe's outputs.calib).")] = None,
    recipe: RecipeOpt = None,
    force: ForceOpt = False,
    **flags: Any,
) -> None:
    """Build a domain-matched calibration set."""
    cfg, r = config_from(CalibrateConfig, recipe, "calibration", flags)
    model = _need(model or (r and r.model), "model", "pass MODEL or --recipe")
    out = _need(out or (r and Path(r.outputs.calib)), "--out", "pass --out calib_sets/NAME")
    from quantkit.calib import calibrate as run

    res = run(model=model, cfg=cfg, out=out, force=force)
    _emit(res, views.calibrated(res))


def _methods_in_help(fn: Callable[..., None]) -> Callable[..., None]:
    """quantize's help names every registered method (the first words of its own help)."""
    from quantkit.methods import METHODS

    named = ", ".join(f"{n} ({METHODS[n].help.split(':')[0].rstrip('.')})" for n in METHODS)
    fn.__doc__ = (f"Quantize a model, --method {named}; "
                  "GPTQ/AWQ W4 g128 with --activations fp8 is W4A8.")
    return fn


@_command
@_methods_in_help
@config_flags(QuantizeConfig)
def quantize(
    model: ModelArg = None,
    calib: CalibOpt = None,
    out: Annotated[Path | None, typer.Option(
        help="Artifact folder, e.g. artifacts/NAME (default: the recipe's).")] = None,
    recipe: RecipeOpt = None,
    resume: Annotated[bool, typer.Option(
        help="Continue an interrupted run from its last layer.")] = False,
    force: ForceOpt = False,
    **flags: Any,
) -> None:
    """Quantize a model (this help is written by _methods_in_help from the registry)."""
    cfg, r = config_from(QuantizeConfig, recipe, "quantize", flags)
    model = _need(model or (r and r.model), "model", "pass MODEL or --recipe")
    calib = _need(calib or (r and Path(r.outputs.calib)), "--calib", "pass --calib calib_sets/NAME")
    out = _need(out or (r and Path(r.outputs.artifact)), "--out", "pass --out artifacts/NAME")
    if recipe is None and flags.get("method") is None:
        from quantkit.methods import METHODS

        raise BadInput("no --method given", "pass --method " + ", ".join(METHODS))
    from quantkit.quantize import quantize as run

    m = run(model=model, cfg=cfg, calib=calib, out=out, resume=resume, force=force)
    _emit(m.to_dict(), views.quantized(m, out))


@_command
def inspect(target: Annotated[str, typer.Argument(
        help="A model spec, a calibration set folder or an artifact folder.")]) -> None:
    """Describe a model, a calibration set or an artifact."""
    from quantkit.inspect import human_summary, inspect_path

    res = inspect_path(target)
    _emit(res, human_summary(res, target))


@_command
@config_flags(ValidateConfig)
def validate(
    artifact: Annotated[Path | None, typer.Argument(
        help="Artifact folder (quantkit quantize; default: the recipe's).")] = None,
    baseline: Annotated[str | None, typer.Option(
        help="The original model: folder, hub id or alias (default: the recipe's model).")] = None,
    out: Annotated[Path | None, typer.Option(
        help="Report folder, e.g. reports/NAME (default: the recipe's).")] = None,
    recipe: RecipeOpt = None,
    force: Annotated[bool, typer.Option(
        help="Replace the report folder; compare with a baseline that is not the source.")] = False,
    **flags: Any,
) -> None:
    """Compare the artifact with its baseline on the serving engine; gate on thresholds."""
    cfg, r = config_from(ValidateConfig, recipe, "validate", flags)
    artifact = _need(artifact or (r and Path(r.outputs.artifact)), "ARTIFACT",
                     "pass ARTIFACT or --recipe")
    baseline = _need(baseline or (r and r.model), "--baseline", "pass --baseline MODEL")
    out = _need(out or (r and Path(r.outputs.report)), "--out", "pass --out reports/NAME")
    from quantkit.report import write_report
    from quantkit.validate import validate as run

    res = run(artifact=artifact, baseline=baseline, cfg=cfg, out=out, force=force)
    report_file = write_report(out)
    _emit(res.gate.to_dict(), views.summary(res) + f"\nreport: {report_file}")
    _gate(res.decision, out)


def _gate(gate: GateDecision, report_dir: Path) -> None:
    if gate.verdict == "fail":
        raise GateFailed("the gate failed: " + ", ".join(gate.failing),
                         f"read {report_dir / 'report.html'} for the failing metrics and causes")


@_command
def report(folder: Annotated[Path, typer.Argument(help="Report folder (quantkit validate --out).")]
           ) -> None:
    """(Re)write the self-contained report.html of a validation."""
    from quantkit.report import write_report

    path = write_report(folder)
    _emit({"report": str(path)}, f"wrote {path}")


# how `auto --load` load-tests each server (the recipe's `bench:` section, these flags on top)
AUTO_BENCH = ("repeats", "min_seconds", "warmup", "requests", "mix", "max_tokens")


@_command
@config_flags(ValidateConfig, "thresholds", "tasks", "domain_set", "limit", "task_path")
@config_flags(BenchConfig, *AUTO_BENCH)
@config_flags(AutoConfig)
def auto(
    model: ModelArg = None,
    calib: CalibOpt = None,
    out: Annotated[Path | None, typer.Option(
        help="Where the chosen artifact goes, e.g. artifacts/NAME (default: the recipe's).")] = None,
    report: Annotated[Path | None, typer.Option(
        help="Report folder of the chosen candidate, with every candidate's numbers.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable results.")] = False,
    recipe: RecipeOpt = None,
    force: ForceOpt = False,
    **flags: Any,
) -> None:
    """The smallest quantization that passes the gate: candidates smallest first."""
    auto_fields = {f.name for f in dataclasses.fields(AutoConfig)}
    acfg, r = config_from(AutoConfig, recipe, "auto", {k: v for k, v in flags.items()
                                                   if k in auto_fields})
    vcfg, _ = config_from(ValidateConfig, recipe, "validate", {
        k: v for k, v in flags.items() if k not in auto_fields and k not in AUTO_BENCH})
    bcfg, _ = config_from(BenchConfig, recipe, "bench", {k: v for k, v in flags.items()
                                                         if k in AUTO_BENCH})
    qcfg, _ = config_from(QuantizeConfig, recipe, "quantize", {})
    scfg, _ = config_from(ServeConfig, recipe, "serve", {})  # how --load serves each candidate
    model = _need(model or (r and r.model), "MODEL", "pass MODEL or --recipe")
    calib = _need(calib or (r and Path(r.outputs.calib)), "--calib", "pass --calib DIR")
    out = _need(out or (r and Path(r.outputs.artifact)), "--out", "pass --out artifacts/NAME")
    if report is None and r is not None:
        report = Path(r.outputs.report)
    if json_out:
        _state["json"] = True
    from quantkit.auto import auto as search
    from quantkit.auto import none_passed

    res = search(model=model, calib=calib, acfg=acfg, qcfg=qcfg, vcfg=vcfg, out=out,
                 report=report, force=force, scfg=scfg, bcfg=bcfg)
    _emit(res.to_dict(), views.auto_summary(res))
    if res.chosen is None:
        raise none_passed(res)


@_command
def run(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML, e.g. recipes/demo.yaml.")],
    force: Annotated[bool, typer.Option(help="Run every step again, even if unchanged.")] = False,
    until: Annotated[str | None, typer.Option(
        help="Stop after this step: calibrate, quantize or validate (auto in a search recipe); "
             "the next run reuses it and goes on.")] = None,
) -> None:
    """Calibrate, quantize, validate and report from a recipe; reuse unchanged steps."""
    from quantkit.run import run as run_recipe

    res = run_recipe(recipe=recipe, force=force, until=until)
    if "stopped_after" in res:
        _emit(res, views.stopped(res))
        return
    published = res["published"]
    _emit({k: v for k, v in res.items() if k != "results"},
          views.ran(res) + (f"\npublished: {published['url']}" if published else ""))
    _gate(res["results"].decision, Path(res["report"]))


ResultsOpt = Annotated[Path | None, typer.Option(help="The validation folder (its results.json "
                                                  "must name the artifact); default: the newest "
                                                  "under --reports that does.")]
BaseModelOpt = Annotated[str | None, typer.Option(
    help="The original model's Hub id (default: the manifest's, where it names one).")]


@_command
def card(
    artifact: Annotated[Path, typer.Argument(help="Artifact folder (quantkit quantize).")],
    results: ResultsOpt = None,
    reports: Annotated[Path, typer.Option(help="Where validations are looked up.")] = Path("reports"),
    out: Annotated[Path | None, typer.Option(
        help="Card file (default: model-card.md beside results.json, linked by the report).")
    ] = None,
    repo: Annotated[str | None, typer.Option(
        help="The Hub repo it will live in, OWNER/NAME (named in its serve commands).")] = None,
    base_model: BaseModelOpt = None,
) -> None:
    """Write the artifact's Hugging Face model card (README.md) from its manifest and validation."""
    from quantkit.card import make_card

    res = make_card(artifact=artifact, results=results, reports=reports, out=out, repo_id=repo,
                    base=base_model)
    _emit(res, f"wrote {res['card']} (gate {res['verdict'].upper()}, from {res['results']})")


@_command
def publish(
    artifact: Annotated[Path, typer.Argument(help="Artifact folder (quantkit quantize).")],
    repo_id: Annotated[str, typer.Argument(help="The Hub repo, OWNER/NAME (created if missing).")],
    private: Annotated[bool, typer.Option("--private", help="Create the repo private.")] = False,
    revision: Annotated[str | None, typer.Option(
        help="Branch to commit to, created if missing (default: main).")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Say what would be uploaded (files, sizes, the card); no network.")
    ] = False,
    allow_failed: Annotated[bool, typer.Option(
        "--allow-failed", help="Publish an artifact whose gate failed or was not gated.")] = False,
    results: ResultsOpt = None,
    reports: Annotated[Path, typer.Option(help="Where validations are looked up.")] = Path("reports"),
    base_model: BaseModelOpt = None,
) -> None:
    """Upload a validated artifact with its model card to the Hugging Face Hub, in one commit."""
    from quantkit.publish import describe
    from quantkit.publish import publish as upload

    res = upload(artifact=artifact, repo_id=repo_id, results=results, reports=reports,
                 private=private, revision=revision, dry_run=dry_run, allow_failed=allow_failed,
                 base_model=base_model)
    _emit(res, describe(res))


@_command
@config_flags(ServeConfig)
def serve(
    artifact: Annotated[Path | None, typer.Argument(
        help="Artifact folder (quantkit quantize) or .gguf; default: the recipe's.")] = None,
    recipe: RecipeOpt = None,
    reports: Annotated[Path | None, typer.Option(
        help="Where validations are looked up [reports, or the recipe's report's folder].")] = None,
    log_file: Annotated[Path | None, typer.Option(help="Append the engine's output here.")] = None,
    allow_unvalidated: Annotated[bool, typer.Option(
        help="Serve without a passing validation.")] = False,
    **flags: Any,
) -> None:
    """Serve the validated artifact behind an OpenAI-compatible API (Ctrl-C stops it)."""
    cfg, r = config_from(ServeConfig, recipe, "serve", flags)
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
    if program != "llama-server":
        raise BadInput(f"unknown program {program!r}", "quantkit setup llama-server")
    from quantkit.serve.setup import setup_llama_server

    res = setup_llama_server(force=force)
    _emit(res, f"{'built' if res['built'] else 'already built'}: {res['path']}")


@_command
@config_flags(BenchConfig)
def bench(
    out: Annotated[Path | None, typer.Option(
        help="Report folder, e.g. reports/NAME-bench (default: the recipe's report + -bench).")
    ] = None,
    recipe: RecipeOpt = None,
    force: ForceOpt = False,
    **flags: Any,
) -> None:
    """Load-test an OpenAI-compatible server: latency percentiles per concurrency, the knee."""
    cfg, r = config_from(BenchConfig, recipe, "bench", flags)
    if cfg.url is None and r is not None:  # the server the recipe's serve section starts
        cfg = dataclasses.replace(cfg, url=f"http://{r.serve.host}:{r.serve.port}")
    out = _need(out or (r and Path(r.outputs.report + "-bench")), "--out",
                "pass --out reports/NAME-bench")
    from quantkit.loadtest import bench as run_bench

    res = run_bench(cfg=cfg, out=out, force=force)
    _emit(res, views.benched(res, out))


@_command
def doctor(
    artifact: Annotated[Path | None, typer.Argument(help="Artifact to serve and check.")] = None,
    url: Annotated[str | None, typer.Option(help="A running server to check.")] = None,
    api_key: Annotated[str | None, typer.Option(help="Bearer key of the server.")] = None,
    engine: Annotated[str, typer.Option(help="Engine when serving ARTIFACT.")] = "auto",
) -> None:
    """Eight checks when serving is slow: batching, KV cache, capacity, weights, CPU, GPU, layout, busy."""
    from quantkit.loadtest.doctor import doctor as run_doctor

    res = run_doctor(url=url, artifact=artifact, api_key=api_key, engine=engine)
    _emit(res, views.diagnosed(res))


def main() -> None:
    """Console-script entry point."""
    app()
