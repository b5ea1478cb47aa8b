"""The command line: a thin Typer shell over the stage functions. The only place that exits."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from quantkit import console
from quantkit.errors import QuantkitError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="From a Hugging Face model to a validated, served 4-bit model.")
_state = {"debug": False, "json": False}


@app.callback()
def _options(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable results.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress or logs.")] = False,
) -> None:
    _state.update(debug=debug, json=json_out)
    console.set_quiet(quiet)


def _command(fn: Callable[..., None]) -> Callable[..., None]:
    """Register a command whose QuantkitErrors become `error:`/`hint:` lines and an exit code."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except QuantkitError as exc:
            if _state["debug"]:
                raise
            console.err.print(f"error: {exc.message}", markup=False, soft_wrap=True)
            if exc.hint:
                console.err.print(f"hint: {exc.hint}", markup=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None

    return app.command()(run)


def _emit(result: dict[str, Any], human: str) -> None:
    if _state["json"]:
        console.result_json(result)
    else:
        console.result_text(human)


@_command
def calibrate(
    model: Annotated[str, typer.Argument(help="Model folder, hub id, .gguf file or smollm2-135m.")],
    source: Annotated[list[str], typer.Option(
        help="FILE|FOLDER|hf:NAME[:CONFIG][:SPLIT]|builtin:stdlib-docs|builtin:stdlib-code, "
             "optionally @WEIGHT. Repeatable.")],
    out: Annotated[Path, typer.Option(help="Output folder, e.g. calib_sets/NAME.")],
    samples: Annotated[int, typer.Option(help="Number of samples (128-512 advised).")] = 256,
    min_tokens: Annotated[int, typer.Option(help="Shortest sample; short documents are packed.")] = 512,
    max_tokens: Annotated[int, typer.Option(help="Longest sample; longer documents are cut.")] = 2048,
    seed: Annotated[int, typer.Option(help="Seed for a reproducible set.")] = 0,
    exclude: Annotated[Optional[list[Path]], typer.Option(
        help="Evaluation set whose 13-grams must not appear. Repeatable.")] = None,
    target: Annotated[Optional[Path], typer.Option(
        help="Domain test set to measure the match against.")] = None,
    force: Annotated[bool, typer.Option(help="Replace an existing output folder.")] = False,
) -> None:
    """Build a domain-matched calibration set."""
    from quantkit.calib import calibrate as run

    res = run(model=model, sources=source, out=out, samples=samples, min_tokens=min_tokens,
              max_tokens=max_tokens, seed=seed, exclude=exclude or [], target=target, force=force)
    mix = ", ".join(f"{k} {v['actual']}" for k, v in res["mix"].items())
    match = res["target_match"]
    extra = (f"\ntarget match: JS divergence {match['js_divergence']} bits, "
             f"coverage {match['target_token_coverage']:.1%}") if match else ""
    _emit(res, f"wrote {res['out']}: {res['samples']} samples, {res['tokens']} tokens ({mix}){extra}")


@_command
def quantize(
    model: Annotated[str, typer.Argument(help="Model folder, hub id, .gguf file or smollm2-135m.")],
    method: Annotated[str, typer.Option(help="gptq or awq.")],
    calib: Annotated[Path, typer.Option(help="Calibration set folder (quantkit calibrate).")],
    out: Annotated[Path, typer.Option(help="Artifact folder, e.g. artifacts/NAME.")],
    bits: Annotated[int, typer.Option(help="4 or 8.")] = 4,
    group_size: Annotated[int, typer.Option(help="Columns per scale; -1 per channel.")] = 128,
    sym: Annotated[bool, typer.Option("--sym/--asym", help="Symmetric or asymmetric grid.")] = True,
    act_order: Annotated[Optional[bool], typer.Option(
        "--act-order/--no-act-order",
        help="GPTQ: columns by decreasing Hessian diagonal, static groups (default for GPTQ, "
             "as in llm-compressor).")] = None,
    damp: Annotated[float, typer.Option(help="GPTQ dampening, share of the mean Hessian diagonal.")] = 0.01,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    resume: Annotated[bool, typer.Option(help="Continue an interrupted run from its last layer.")] = False,
    quant_type: Annotated[str, typer.Option(help="gguf: Q4_K_M, Q4_K_S, Q5_K_M, Q6_K, Q8_0, IQ4_XS...")] = "Q4_K_M",
    imatrix: Annotated[bool, typer.Option("--imatrix/--no-imatrix",
                                          help="gguf: importance matrix from the calibration set.")] = True,
    threads: Annotated[int, typer.Option(help="gguf: quantizer threads, 0 = all cores.")] = 0,
    heldout: Annotated[Optional[Path], typer.Option(
        help="gguf: held-out text for the perplexity check (default: stdlib email package).")] = None,
    force: Annotated[bool, typer.Option(help="Replace an existing artifact folder.")] = False,
) -> None:
    """Quantize a model: GPTQ or AWQ to compressed-tensors, or GGUF k-quants through llama.cpp."""
    from quantkit.quantize import quantize as run

    res = run(model=model, method=method, calib=calib, out=out, bits=bits, group_size=group_size,
              sym=sym, act_order=act_order,
              damp=damp, device=device, resume=resume, force=force, quant_type=quant_type,
              imatrix=imatrix, threads=threads, heldout=heldout)
    size = res["size_bytes"]
    what = (f"{quant_type.upper()} ({res['bits_per_weight']} bpw, {res['fallback_tensors']} tensors "
            f"fell back), ppl {res['verification']['ppl_f16']} -> "
            f"{res['verification']['ppl_quantized']}" if method == "gguf"
            else f"{method} W{bits} g{group_size}")
    _emit(res, f"wrote {out}: {what}, {size['before'] / 2**20:.0f} MiB -> "
               f"{size['after'] / 2**20:.0f} MiB in {res['wall_time_s']:.0f} s")


@_command
def inspect(target: Annotated[str, typer.Argument(
        help="A model spec, a calibration set folder or an artifact folder.")]) -> None:
    """Describe a model, a calibration set or an artifact."""
    from quantkit.inspect import inspect_path

    res = inspect_path(target)
    _emit(res, _human(res))


@_command
def validate(
    artifact: Annotated[Path, typer.Argument(help="Artifact folder (quantkit quantize).")],
    baseline: Annotated[str, typer.Option(help="The original model: folder, hub id or alias.")],
    out: Annotated[Path, typer.Option(help="Report folder, e.g. reports/NAME.")],
    tasks: Annotated[Optional[str], typer.Option(
        help="Comma-separated: mmlu,humaneval,domain,sampling (default: all that have data).")] = None,
    domain_set: Annotated[Optional[Path], typer.Option(
        help="JSONL: {text} lines (perplexity) or {prompt, answer[, match]} lines.")] = None,
    limit: Annotated[Optional[int], typer.Option(
        help="MMLU questions per subject and HumanEval problems (default: all).")] = None,
    thresholds: Annotated[Optional[Path], typer.Option(
        help="YAML: task -> limits, e.g. mmlu: {retention: 0.97}.")] = None,
    mmlu_data: Annotated[Optional[Path], typer.Option(
        help="Folder with {test,dev}/SUBJECT.jsonl (default: the hub's cais/mmlu).")] = None,
    samples: Annotated[int, typer.Option(help="Sampling check: prompts sampled per model.")] = 64,
    temperature: Annotated[float, typer.Option(help="Sampling check temperature.")] = 0.9,
    top_p: Annotated[float, typer.Option(help="Sampling check top_p.")] = 0.9,
    max_tokens: Annotated[int, typer.Option(help="Sampling check: new tokens per output.")] = 256,
    seed: Annotated[int, typer.Option(help="Seed for sampling and bootstrap intervals.")] = 0,
    threads: Annotated[int, typer.Option(help="Engine threads, 0 = the engine's default.")] = 0,
    humaneval_limit: Annotated[Optional[int], typer.Option(
        help="HumanEval problems (default: --limit).")] = None,
    humaneval_max_tokens: Annotated[int, typer.Option(
        help="HumanEval: new tokens per completion.")] = 384,
    force: Annotated[bool, typer.Option(
        help="Replace the report folder; compare with a baseline that is not the source.")] = False,
) -> None:
    """Compare the artifact with its baseline on the serving engine; gate on thresholds."""
    from quantkit.errors import GateFailed
    from quantkit.validate import validate as run

    res = run(artifact=artifact, baseline=baseline, out=out,
              tasks=[t.strip() for t in tasks.split(",") if t.strip()] if tasks else None,
              domain_set=domain_set, limit=limit, thresholds=thresholds, mmlu_data=mmlu_data,
              samples=samples, temperature=temperature, top_p=top_p, max_tokens=max_tokens,
              seed=seed, threads=threads, humaneval_limit=humaneval_limit,
              humaneval_max_tokens=humaneval_max_tokens, force=force)
    _emit(res["gate"], summary(res) + f"\nreport: {out / 'report.html'}")
    if res["gate"]["verdict"] == "fail":
        raise GateFailed("the gate failed: " + ", ".join(res["gate"]["failing"]),
                         f"read {out / 'report.html'} for the failing metrics and usual causes")


def summary(res: dict[str, Any]) -> str:
    """One line per task and check, the verdict first."""
    lines = [f"verdict: {res['gate']['verdict'].upper()} ({res['engine']})"]
    for task, r in res["tasks"].items():
        for key in ("retention", "ppl_increase", "qa_retention", "flagged_increase"):
            if key in r:
                m = r[key]
                lines.append(f"  {task}.{key}: {m['value']:.4f} [{_num(m['lo'])}, {_num(m['hi'])}]"
                             f" n={m['n']}")
    for c in res["gate"]["checks"]:
        mark = "pass" if c["passed"] else "FAIL"
        note = " (sample too small to support the verdict)" if c.get("too_small") else ""
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
def run(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML, e.g. recipes/demo.yaml.")],
    force: Annotated[bool, typer.Option(help="Run every step again, even if unchanged.")] = False,
) -> None:
    """Calibrate, quantize, validate and report from a recipe; reuse unchanged steps."""
    from quantkit.errors import GateFailed
    from quantkit.run import run as run_recipe

    res = run_recipe(recipe=recipe, force=force)
    steps = ", ".join(f"{k} {'reused' if v['reused'] else str(v['seconds']) + ' s'}"
                      for k, v in res["steps"].items())
    report_dir = Path(res["steps"]["validate"]["output"])
    _emit({k: v for k, v in res.items() if k != "results"},
          f"{res['name']}: {steps}\n{summary(res['results'])}\nreport: {report_dir / 'report.html'}")
    if res["gate"]["verdict"] == "fail":
        raise GateFailed("the gate failed: " + ", ".join(res["gate"]["failing"]),
                         f"read {report_dir / 'report.html'} for the failing metrics and causes")


@_command
def serve(
    artifact: Annotated[Optional[Path], typer.Argument(
        help="Artifact folder (quantkit quantize) or .gguf; default: the recipe's.")] = None,
    recipe: Annotated[Optional[Path], typer.Option(
        help="Take the artifact and the serve: section from this recipe; flags override.")] = None,
    engine: Annotated[Optional[str], typer.Option(help="auto|llama.cpp|vllm|transformers.")] = None,
    host: Annotated[Optional[str], typer.Option(help="Address to listen on [127.0.0.1].")] = None,
    port: Annotated[Optional[int], typer.Option(help="Port to listen on [8000].")] = None,
    api_key: Annotated[Optional[str], typer.Option(
        help="Require 'Authorization: Bearer KEY' (401 otherwise).")] = None,
    max_num_seqs: Annotated[Optional[int], typer.Option(
        help="Sequences decoded together (slots) [8].")] = None,
    ctx_size: Annotated[Optional[int], typer.Option(
        help="Context per sequence (default: the model's, at most 4096).")] = None,
    gpu_memory_utilization: Annotated[Optional[float], typer.Option(
        help="vLLM's memory share [0.9].")] = None,
    block_size: Annotated[Optional[int], typer.Option(
        help="KV-cache block size (vLLM, transformers) [16].")] = None,
    enable_chunked_prefill: Annotated[Optional[bool], typer.Option(
        help="vLLM chunked prefill [on].")] = None,
    draft_model: Annotated[Optional[str], typer.Option(help="Draft model for speculation.")] = None,
    num_speculative_tokens: Annotated[Optional[int], typer.Option(
        help="Tokens drafted per step [4].")] = None,
    vllm_python: Annotated[Optional[str], typer.Option(
        help="The python of vLLM's own environment (default: `vllm` on PATH).")] = None,
    threads: Annotated[Optional[int], typer.Option(
        help="CPU threads, 0 = the engine's default.")] = None,
    reports: Annotated[Optional[Path], typer.Option(
        help="Where validations are looked up [reports].")] = None,
    log_file: Annotated[Optional[Path], typer.Option(help="Append the engine's output here.")] = None,
    allow_unvalidated: Annotated[bool, typer.Option(
        help="Serve without a passing validation.")] = False,
) -> None:
    """Serve the validated artifact behind an OpenAI-compatible API (Ctrl-C stops it)."""
    from quantkit.serve import serve as run_server
    from quantkit.serve import serve_settings

    given = dict(engine=engine, host=host, port=port, api_key=api_key, max_num_seqs=max_num_seqs,
                 ctx_size=ctx_size, gpu_memory_utilization=gpu_memory_utilization,
                 block_size=block_size, enable_chunked_prefill=enable_chunked_prefill,
                 draft_model=draft_model, num_speculative_tokens=num_speculative_tokens,
                 vllm_python=vllm_python, threads=threads)
    target, engine_name, opts, reports_dir = serve_settings(artifact, recipe, given, reports)
    res = run_server(target, engine=engine_name, opts=opts, allow_unvalidated=allow_unvalidated,
                     reports=reports_dir, log_file=log_file)
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
    url: Annotated[str, typer.Option(help="The server, e.g. http://127.0.0.1:8000.")],
    out: Annotated[Path, typer.Option(help="Report folder, e.g. reports/NAME-bench.")],
    requests: Annotated[int, typer.Option(help="Requests per concurrency level.")] = 100,
    concurrency: Annotated[str, typer.Option(help="Levels, e.g. 1,2,4,8,16,32,64.")]
        = "1,2,4,8,16,32,64",
    mix: Annotated[str, typer.Option(help="Prompt lengths and weights.")] = "short:1,medium:1,long:1",
    max_tokens: Annotated[Optional[str], typer.Option(
        help="New tokens: N for all, or short:64,medium:128,long:128.")] = None,
    api_key: Annotated[Optional[str], typer.Option(help="Bearer key of the server.")] = None,
    model: Annotated[Optional[str], typer.Option(help="Model id (default: the server's).")] = None,
    endpoint: Annotated[str, typer.Option(help="chat or completions.")] = "chat",
    p99_ttft_target: Annotated[Optional[float], typer.Option(help="P99 TTFT limit, seconds.")] = None,
    p99_e2e_target: Annotated[Optional[float], typer.Option(help="P99 latency limit, seconds.")] = None,
    timeout: Annotated[float, typer.Option(help="Per-request timeout, seconds.")] = 300.0,
    seed: Annotated[int, typer.Option(help="Prompt seed.")] = 0,
    force: Annotated[bool, typer.Option(help="Replace the report folder.")] = False,
) -> None:
    """Load-test an OpenAI-compatible server: latency percentiles per concurrency, the knee."""
    from quantkit.bench import bench as run_bench

    res = run_bench(url=url, out=out, requests=requests, concurrency=concurrency, mix=mix,
                    max_tokens=max_tokens, api_key=api_key, model=model, endpoint=endpoint,
                    p99_ttft_target=p99_ttft_target, p99_e2e_target=p99_e2e_target,
                    timeout=timeout, seed=seed, force=force)
    lines = [f"{'conc':>5} {'req/s':>7} {'tok/s':>8} {'TTFT p50/p99 s':>16} {'TPOT p50/p99 ms':>17} err"]
    for r in res["levels"]:
        t, p = r["ttft_s"], r["tpot_s"]
        lines.append(f"{r['concurrency']:>5} {r['request_throughput']:>7.2f} "
                     f"{r['output_token_throughput']:>8.1f} {_s(t['p50'])}/{_s(t['p99']):<7} "
                     f"{_ms(p['p50'])}/{_ms(p['p99']):<8} {r['errors']}")
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
    artifact: Annotated[Optional[Path], typer.Argument(help="Artifact to serve and check.")] = None,
    url: Annotated[Optional[str], typer.Option(help="A running server to check.")] = None,
    api_key: Annotated[Optional[str], typer.Option(help="Bearer key of the server.")] = None,
    engine: Annotated[str, typer.Option(help="Engine when serving ARTIFACT.")] = "auto",
) -> None:
    """Five checks when inference is slow: batching, KV cache, quantization, GPU use, memory."""
    from quantkit.doctor import doctor as run_doctor

    res = run_doctor(url=url, artifact=artifact, api_key=api_key, engine=engine)
    lines = [f"{res['model']} on {res['engine']}: {res['status'].upper()}"]
    for c in res["checks"]:
        lines.append(f"  {c['status']:<4} {c['check']}: {c['reason']}"
                     + (f"\n       fix: {c['fix']}" if c["fix"] and c["status"] != "pass" else ""))
    _emit(res, "\n".join(lines))


def _human(res: dict[str, Any]) -> str:
    from quantkit.fsutil import dumps

    lines = [f"{k}: {v}" for k, v in res.items() if not isinstance(v, (dict, list))]
    nested = {k: v for k, v in res.items() if isinstance(v, (dict, list))}
    return "\n".join(lines) + ("\n" + dumps(nested).rstrip() if nested else "")


def main() -> None:
    """Console-script entry point."""
    app()
