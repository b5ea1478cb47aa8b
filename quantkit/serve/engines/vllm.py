"""The vLLM engine's entry: its server (`vllm serve`, from vLLM's own environment, never imported
here), its install probe, the checks made before it starts (the draft model's vocabulary, the
model's shapes over tp x pp GPUs), the kernel it is steered to and logs, and its
`register_engine` line. Its in-process adapter is `quantkit.engines.vllm`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantkit.engines.choice import EngineSpec, register_engine
from quantkit.engines.vllm import VllmEngine, probe, start_mode
from quantkit.errors import BadInput
from quantkit.gpu import gpu_info
from quantkit.option import opt
from quantkit.serve.launcher import Launch
from quantkit.serve.vllm_checks import check_vllm_compat, first_group, scheme_of
from quantkit.serve.vllm_plugin import ENV as KERNEL_ENV
from quantkit.serve.vllm_plugin import KERNELS as PLUGIN_KERNELS
from quantkit.serve.vllm_plugin import SCHEMES as PLUGIN_SCHEMES

if TYPE_CHECKING:
    from quantkit.config import ServeConfig
    from quantkit.engines.base import EngineAdapter
    from quantkit.serve.front import DoctorHook, ServerInfo
    from quantkit.serve.launcher import ServerLauncher, ServerProbe
    from quantkit.serve.target import Target

FAST_VLLM_KERNELS = ("Marlin", "Machete", "QuantkitDual")
# W4A8's one kernel on Hopper, measured fast there (1.39x bf16 at one user, 1.30x at 64 on an H100,
# docs/BENCHMARKS.md), and quantkit's variant of it (--kernel w4a8-tiles): no Marlin/Machete to
# steer to, so nothing to warn of.
ONLY_VLLM_KERNELS = ("CutlassW4A8", "QuantkitW4A8Tiles")


@dataclass(frozen=True)
class VllmOptions:
    """vLLM's own serve options (flags of `quantkit serve`, keys of the recipe's `serve:`)."""

    enable_chunked_prefill: bool = opt(True, "vLLM chunked prefill.")
    vllm_python: str | None = opt(None, "The python of vLLM's own environment "
                                        "(default: `vllm` on PATH, else this Python if vLLM is in "
                                        "it).")


def vllm_options(opts: ServeConfig) -> VllmOptions:
    """vLLM's own options, read from the serve config they joined."""
    own: VllmOptions = opts.options("vllm")
    return own


def vllm_probe(opts: ServeConfig | None) -> tuple[str, str] | None:
    """vLLM's environment is there (--vllm-python, `vllm` on PATH, or vLLM in this Python)."""
    from quantkit import config

    if vllm_executable(opts or config.ServeConfig(), required=False) is None:
        return ("vLLM is not installed (no `vllm` on PATH, nor in this Python)",
                "install vLLM in its own environment and pass --vllm-python PATH")
    return None


def vllm_server(target: Target, opts: ServeConfig, port: int, ctx: int) -> Launch:
    """`vllm serve` from vLLM's own environment."""
    return vllm_launch(str(vllm_executable(opts)), target, opts, port, ctx)


def vllm_executable(opts: ServeConfig, required: bool = True) -> str | None:
    """The Python of vLLM's environment (--vllm-python), the `vllm` program on PATH, or this
    Python where vLLM is installed in it (the `vllm` extra in a venv run by its path, so not on
    PATH; or vLLM on PYTHONPATH, as on the device)."""
    from quantkit.engines.vllm import vllm_available

    python = vllm_options(opts).vllm_python
    if python:
        if not Path(python).is_file():
            raise BadInput(f"--vllm-python {python} does not exist",
                           "pass the python of the environment where vLLM is installed")
        return python
    found = shutil.which("vllm")
    if found is None and vllm_available() is not None:
        found = sys.executable
    if found is None and required:
        raise BadInput("vLLM is not installed (no `vllm` on PATH, nor in this Python)",
                       "install vLLM in its own environment and pass --vllm-python PATH")
    return found


def _is_python(exe: str) -> bool:
    """`exe` is a Python (--vllm-python, or this one), not the `vllm` program."""
    return exe == sys.executable or Path(exe).name.startswith("python")


def _vllm_base(exe: str) -> list[str]:
    if _is_python(exe):
        return [exe, "-m", "vllm.entrypoints.cli.main"]
    return [exe]


def vllm_versions(exe: str) -> dict[str, str]:
    """vLLM's and its compressed-tensors' versions, asked of vLLM's own environment."""
    py = exe if _is_python(exe) else str(Path(exe).with_name("python"))
    code = ("import json, importlib.metadata as m; print(json.dumps({n: m.version(n) for n in "
            "('vllm', 'compressed-tensors')}))")
    done = subprocess.run([py, "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        raise BadInput(f"could not ask {py} for vLLM's versions: {done.stderr.strip()[-150:]}",
                       "pass --vllm-python with the python of vLLM's environment")
    return json.loads(done.stdout)


def vllm_launch(exe: str, target: Target, opts: ServeConfig, port: int, ctx: int) -> Launch:
    """`vllm serve` with the recipe's settings; never --quantization (it forces slow kernels)."""
    # an unquantized folder (the original model, served as the baseline) has nothing to check
    quant = target.hf_config.get("quantization_config")
    notes = check_vllm_compat(quant, vllm_versions(exe)) if quant else []
    notes += kernel_fit(opts, quant) + load_fit(opts, quant)
    notes += check_draft(target, opts)  # the draft's vocabulary, before vLLM loads it
    cmd = vllm_command(exe, target, opts, port, ctx)
    return Launch("vllm", cmd, port, target.name, "/health", "/metrics", ctx, True,
                  env={**kernel_env(opts), "NCCL_NVLS_ENABLE": "0"}, notes=notes)


def served_kv_cache(target: Target, opts: ServeConfig) -> str:
    """--kv-cache-dtype, or with auto FP8 where the artifact carries calibrated k/v scales (what
    its validation scored)."""
    from quantkit.artifact import kv_scheme
    from quantkit.checkpoints import checkpoint

    if opts.kv_cache_dtype == "auto" and checkpoint(target.format).kv_scales \
            and kv_scheme(target.path):
        return "fp8"
    return opts.kv_cache_dtype


def vllm_command(exe: str, target: Target, opts: ServeConfig, port: int, ctx: int) -> list[str]:
    cmd = _vllm_base(exe) + [
        "serve", str(target.path), "--host", "127.0.0.1", "--port", str(port),
        "--served-model-name", target.name, "--max-model-len", str(ctx),
        "--gpu-memory-utilization", str(opts.gpu_memory_utilization),
        "--block-size", str(opts.block_size), "--max-num-seqs", str(opts.max_num_seqs)]
    cmd.append("--enable-chunked-prefill" if vllm_options(opts).enable_chunked_prefill
               else "--no-enable-chunked-prefill")
    kv = served_kv_cache(target, opts)
    if kv != "auto":
        cmd += ["--kv-cache-dtype", kv]
    if opts.tensor_parallel_size > 1:
        cmd += ["--tensor-parallel-size", str(opts.tensor_parallel_size)]
    if opts.pipeline_parallel_size > 1:
        cmd += ["--pipeline-parallel-size", str(opts.pipeline_parallel_size)]
    if opts.draft_model:
        spec = {"model": opts.draft_model, "num_speculative_tokens": opts.num_speculative_tokens}
        cmd += ["--speculative-config", json.dumps(spec)]
    if opts.api_key:
        cmd += ["--api-key", opts.api_key]
    return cmd + list(opts.extra_args)


def check_draft(target: Target, opts: ServeConfig) -> list[str]:
    """A draft model on disk must share the served model's vocabulary (vLLM drafts token ids):
    BadInput before any start where it does not; a hub id is vLLM's to fetch and check. Returns
    notes for the launch."""
    if not opts.draft_model:
        return []
    draft = Path(opts.draft_model)
    if not draft.exists():
        if "/" in opts.draft_model and not opts.draft_model.startswith((".", "/")):
            return [f"draft model {opts.draft_model}: a hub id, checked by vLLM when it loads"]
        raise BadInput(f"draft model {opts.draft_model} does not exist",
                       "pass a model folder or a hub id as draft_model, or leave it out")
    try:
        config = json.loads((draft / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"draft model {draft} has no readable config.json ({exc})",
                       "pass a Hugging Face model folder as draft_model") from exc
    from quantkit.models import text_config

    theirs = text_config(config).get("vocab_size")
    ours = text_config(target.hf_config).get("vocab_size")
    if theirs != ours:
        raise BadInput(f"draft model {draft} has a vocabulary of {theirs} tokens, the served "
                       f"model {ours}: vLLM can draft only with the same vocabulary",
                       "use a draft model of the same family (the same tokenizer), or leave "
                       "draft_model out")
    return [f"draft model {draft.name}: {opts.num_speculative_tokens} tokens drafted a step"]


# Marlin's and Machete's smallest tile: a shard narrower than this falls to a slower kernel
KERNEL_TILE = 64


def check_split(target: Target, opts: ServeConfig) -> list[str]:
    """`check_parallel` for a served artifact (a GGUF is served on one device: nothing to split)."""
    tp, pp = opts.tensor_parallel_size, opts.pipeline_parallel_size
    from quantkit.checkpoints import checkpoint

    if not checkpoint(target.format).splits or (tp == 1 and pp == 1):
        return []
    try:
        return check_parallel(target.hf_config, tp, pp)
    except KeyError as exc:
        raise BadInput(f"{target.path}/config.json lacks {exc}", "re-run `quantkit quantize`, or "
                       "pass the right folder") from None


def check_parallel(cfg: dict[str, Any], tp: int, pp: int) -> list[str]:
    """What vLLM needs of the model's shapes to split it over tp x pp GPUs: heads and MLP rows
    divide by tp, and for grouped int4 weights the input of each row-parallel linear (o_proj,
    down_proj) is a whole number of groups per GPU. BadInput names the first layer that does not
    fit; notes say where a shard falls under the fast kernels' tile. GPUs visible are counted."""
    if tp == 1 and pp == 1:
        return []
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    kv = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    mlp, layers = int(cfg["intermediate_size"]), int(cfg["num_hidden_layers"])
    group = _group_size(cfg.get("quantization_config"))
    row_parallel = {"self_attn.o_proj": heads * head_dim, "mlp.down_proj": mlp}
    fit = [n for n in range(1, 9) if heads % n == 0 and mlp % n == 0
           and (kv % n == 0 or n % kv == 0)
           and not any(group and (cols // n) % group for cols in row_parallel.values())]
    hint = f"use --tensor-parallel-size {' or '.join(map(str, fit))} for this model"
    if heads % tp:
        raise BadInput(f"--tensor-parallel-size {tp}: model.layers.N.self_attn has {heads} "
                       f"attention heads, not a multiple of {tp}", hint)
    if kv % tp and tp % kv:
        raise BadInput(f"--tensor-parallel-size {tp}: model.layers.N.self_attn has {kv} KV "
                       f"heads, which {tp} GPUs can neither split nor replicate evenly", hint)
    if mlp % tp:
        raise BadInput(f"--tensor-parallel-size {tp}: model.layers.N.mlp has {mlp} rows, not a "
                       f"multiple of {tp}", hint)
    notes = []
    for name, cols in row_parallel.items():
        if group and (cols // tp) % group:
            raise BadInput(f"--tensor-parallel-size {tp}: model.layers.N.{name}'s input "
                           f"({cols} columns) is not a whole number of {group}-column groups "
                           f"per GPU ({cols} / {tp} = {cols / tp:g}; needs group size x "
                           f"{tp} = {group * tp} to divide it)",
                           hint + ", or quantize with a group size that divides "
                           f"{cols // tp}")
        if group and (cols // tp) % KERNEL_TILE:
            notes.append(f"model.layers.N.{name}: {cols // tp} input columns per GPU is not a "
                         f"multiple of {KERNEL_TILE}: vLLM will not use Marlin/Machete there")
    if pp > layers:
        raise BadInput(f"--pipeline-parallel-size {pp} exceeds the model's {layers} layers",
                       f"use at most {layers} stages")
    gpu = gpu_info()
    gpus = gpu["count"] if gpu else None
    if gpus is not None and gpus < tp * pp:
        raise BadInput(f"--tensor-parallel-size {tp} x --pipeline-parallel-size {pp} needs "
                       f"{tp * pp} GPUs; this machine shows {gpus}",
                       "lower them, or span nodes with vLLM's own Ray cluster (docs/multi-gpu.md)")
    return notes


def _weights(quant: dict[str, Any] | None) -> dict[str, Any]:
    """The weight args of a compressed-tensors config's first group ({} where none)."""
    return (first_group(quant) or {}).get("weights") or {}


def _group_size(quant: dict[str, Any] | None) -> int | None:
    """The weight group size of a compressed-tensors config's first group, if grouped."""
    size = _weights(quant).get("group_size")
    return int(size) if size else None


_KERNEL = re.compile(r"Using (\w+?)(?:LinearKernel)? for (\w+)")


def kernel_from_log(line: str) -> str | None:
    """vLLM logs the weight-only kernel it picked: `Using MacheteLinearKernel for CompressedTensorsWNA16`."""
    m = _KERNEL.search(line)
    return m.group(1) if m else None


def kernel_warning(kernel: str, opts: ServeConfig | None = None) -> str | None:
    """Why the kernel vLLM logged is slow for this load, or None."""
    if opts is not None and opts.kernel in PLUGIN_KERNELS:
        if kernel.startswith(PLUGIN_KERNELS[opts.kernel]):
            return None
        return (f"--kernel {opts.kernel} asked for quantkit's kernel, vLLM uses {kernel}: its "
                "plugin did not load (install quantkit in vLLM's environment) or cannot take "
                "these layers")
    if kernel.startswith(ONLY_VLLM_KERNELS):
        return None
    if not any(kernel.startswith(k) for k in FAST_VLLM_KERNELS):
        return (f"vLLM chose the {kernel} kernel, not Marlin/Machete: expect 2-3x slower decode "
                "(check the GPU generation, group size and that --quantization was not forced)")
    if opts is not None:
        better = opts.load_kernel
        if kernel.lower() != better:
            return (f"vLLM uses {kernel} with {opts.load_flag}; {better.title()} is faster at "
                    f"this load on Hopper (--kernel {better})")
    return None


def vllm_doctor(check: str, info: ServerInfo, totals: dict[str, float]
                ) -> tuple[str, str, str] | None:
    """What vLLM alone tells `quantkit doctor` (EngineSpec.doctor): the requests it preempted
    (its KV cache ran out) and the weight-only kernel it logged against the one faster for the
    load."""
    if check == "kv cache capacity":
        return _kv_capacity(info, totals)
    if check == "quantized weights":
        return _kernel_check(info)
    return None


def _kv_capacity(info: ServerInfo, totals: dict[str, float]) -> tuple[str, str, str]:
    preempted = totals.get("vllm:num_preemptions_total")
    if preempted is None:
        return ("pass", "vllm reports no preemptions (its /metrics has no "
                "vllm:num_preemptions_total): nothing to check", "")
    usage = totals.get("vllm:kv_cache_usage_perc")
    reason = (f"vLLM preempted {preempted:.0f} request(s) since it started"
              + (f"; the KV cache is {usage:.0%} full now" if usage is not None else ""))
    if not preempted:
        return ("pass", reason, "")
    fp8 = str(info.get("kv_cache_dtype") or "").startswith("fp8")  # quantkit serve's card says
    fix = ("lower --max-num-seqs or --ctx-size, raise --gpu-memory-utilization, or split the model "
           "over more GPUs (--tensor-parallel-size)" if fp8 else
           "serve the FP8 KV cache, twice the tokens in the same memory: quantkit quantize "
           "--kv-cache fp8 (calibrated scales; validate it with --tasks long_context), or quantkit "
           "serve --kv-cache-dtype fp8; else lower --max-num-seqs or --ctx-size")
    return ("warn", reason + ": its KV cache ran out, and preempted requests are computed again",
            fix)


def _kernel_check(info: ServerInfo) -> tuple[str, str, str]:
    from quantkit import config

    kernels = info.get("kernels") or []
    if not kernels:
        return ("warn", "vllm logged no weight-only kernel",
                "serve a quantkit GPTQ/AWQ artifact through `quantkit serve`")
    seqs = int(info.get("max_num_seqs") or config.ServeConfig().max_num_seqs)
    notes = [n for k in kernels
             if (n := kernel_warning(k, config.ServeConfig(max_num_seqs=seqs)))]
    if notes:
        return ("warn", notes[0], "restart with the --kernel it names (or --kernel auto)")
    return ("pass", f"vllm runs the integer weights on {', '.join(kernels)}, the faster kernel for "
            f"--max-num-seqs {seqs}", "")


def kernel_fit(opts: ServeConfig, quant: dict[str, Any] | None) -> list[str]:
    """A note where --kernel names a plugin kernel the artifact's scheme does not take (vLLM then
    chooses its own, and serves all the same): auto and its candidates of several formats share
    one --kernel, so this warns rather than refuses."""
    want = PLUGIN_SCHEMES.get(opts.kernel)
    have = scheme_of(quant)
    if want is None or have == want:
        return []
    return [f"--kernel {opts.kernel} runs {want} artifacts; this one is {have}: vLLM chooses its "
            "own kernel"]


# W8A16 (int8 weight-only) against bf16 on H100s, the 8B shape (docs/BENCHMARKS.md, "W4A8 and
# W8A16 with the protocol"): Machete 1.23x at 1 user, 1.24x at 8, 1.12x at 32, 0.88x [0.83, 0.94]
# at 64 over three H100s (Marlin, `--kernel auto`'s choice up to 16 users: 1.43x at 1, 0.79x at 64)
W8A16_MAX_LOAD = 32


def load_fit(opts: ServeConfig, quant: dict[str, Any] | None) -> list[str]:
    """A note where the artifact's format was measured slower than bf16 at the load the server
    is set up for (--expected-concurrency, else --max-num-seqs): W8A16 above 32 users."""
    if (scheme_of(quant) != "weight-only int" or _weights(quant).get("num_bits") != 8
            or opts.load <= W8A16_MAX_LOAD):
        return []
    return [f"W8A16 serves more slowly than bf16 at this load ({opts.load_flag}): 0.88x bf16's "
            "tokens/s at 64 users on H100s, 1.12x at 32 (docs/BENCHMARKS.md); FP8 (quantkit "
            "quantize --method fp8) or W4A8 (--activations fp8) stay faster under load"]


def kernel_env(opts: ServeConfig) -> dict[str, str]:
    """vLLM's kernel choice for W4A16 and W8A16 is steered by disabling the other kernel
    (`--kernel vllm`: not steered; `dual` and `w4a8-tiles`: quantkit's vLLM plugin,
    `quantkit.serve.vllm_plugin`)."""
    kernel = opts.vllm_kernel
    if kernel == "vllm":
        return {}
    if kernel in PLUGIN_KERNELS:
        # vLLM keys its compile cache (AOT-compiled graphs included) on its own environment
        # variables, not ours: a name no kernel has keeps the graph of another kernel's run (the
        # same model, unsteered) from being loaded for this one, and disables nothing
        return {KERNEL_ENV: kernel, "VLLM_DISABLED_KERNELS": f"quantkit-{kernel}"}
    return {"VLLM_DISABLED_KERNELS": {"marlin": "MacheteLinearKernel",
                                      "machete": "MarlinLinearKernel"}[kernel]}


register_engine(EngineSpec("vllm", "vllm", ("compressed-tensors",), gpu=True,
                           adapter=VllmEngine, launch=vllm_server, probe=probe,
                           server_probe=vllm_probe,
                           kv_cache_fp8=True, tensor_parallel=True, kernels=True,
                           logprobs="top-k", options=VllmOptions, doctor=vllm_doctor,
                           mode=start_mode))

if TYPE_CHECKING:  # each function held against the Protocol its caller loads it as
    _adapter: EngineAdapter = VllmEngine
    _launch: ServerLauncher = vllm_server
    _server_probe: ServerProbe = vllm_probe
    _doctor: DoctorHook = vllm_doctor
