"""Stage configs: one frozen dataclass per stage holds every option with its one default.

The same dataclass is a recipe section (YAML, strict keys, a version), what the CLI builds from its
flags, and what the stage function takes. A flag given explicitly overrides the recipe's value.
Relative paths are taken from the folder quantkit is started in. Pure: no torch; what exists
(tasks, methods, engines) is read from the registries, and a check may ask lm-eval's task index.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, Union, get_args, get_origin, get_type_hints

from quantkit.engines.choice import engine_choices
from quantkit.errors import BadInput
from quantkit.methods import GGUF_TYPES, METHODS
from quantkit.tasks import TASKS, check_lm_eval_tasks, default_tasks, task

if TYPE_CHECKING:
    from quantkit.gate import Thresholds

RECIPE_VERSION = 1
C = TypeVar("C")


def opt(default: Any, help: str) -> Any:
    """A config field: its one default and the help text its CLI flag shows."""
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


def _range(name: str, value: float | None, lo: float, hi: float, hint: str = "") -> None:
    if value is not None and not lo <= value <= hi:
        raise BadInput(f"--{name.replace('_', '-')} {value} is out of range",
                       hint or f"use a value from {lo} to {hi}")


# numpy's and datasketch's seeds are 0 to 2**32 - 1 (a negative one is a ValueError deep in a
# stage), and llama.cpp reads seed -1 as "random": every seed is checked against this range
SEED_MAX = 2**32 - 1


def _seed(value: int) -> None:
    _range("seed", value, 0, SEED_MAX, f"use a seed from 0 to {SEED_MAX}, e.g. --seed 0")


@dataclass(frozen=True)
class CalibrateConfig:
    """`quantkit calibrate` and the recipe's `calibration:` section."""

    sources: tuple[str, ...] = opt((), "FILE|FOLDER|hf:NAME[:CONFIG][:SPLIT]|builtin:stdlib-docs|"
                                       "builtin:stdlib-code, optionally @WEIGHT. Repeatable.")
    samples: int = opt(256, "Number of samples (128-512 advised).")
    min_tokens: int = opt(512, "Shortest sample; short documents are packed.")
    max_tokens: int = opt(2048, "Longest sample; longer documents are cut.")
    seed: int = opt(0, "Seed for a reproducible set.")
    exclude: tuple[str, ...] = opt((), "Evaluation set whose 13-grams must not appear. Repeatable.")
    target: str | None = opt(None, "Domain test set to measure the match against.")

    def check(self) -> None:
        """Option values that are wrong whatever the model (no files read)."""
        if not self.sources:
            raise BadInput("no --source given",
                           "add --source FILE|FOLDER|hf:NAME|builtin:stdlib-docs")
        if self.samples < 1:
            raise BadInput(f"--samples {self.samples} must be at least 1", "use 128-512")
        if self.min_tokens < 1 or self.max_tokens < 1:
            raise BadInput("--min-tokens and --max-tokens must be positive", "use 512 and 2048")
        if self.min_tokens > self.max_tokens:
            raise BadInput(f"--min-tokens {self.min_tokens} is larger than --max-tokens "
                           f"{self.max_tokens}", "make --min-tokens <= --max-tokens")
        _seed(self.seed)




@dataclass(frozen=True)
class QuantizeConfig:
    """`quantkit quantize` and the recipe's `quantize:` section."""

    method: str = opt("gptq", " ".join(f"{m}: {METHODS[m].help}" for m in METHODS))
    bits: int = opt(4, "4 or 8.")
    group_size: int = opt(128, "Columns per scale; -1 per channel.")
    sym: bool = opt(True, "Symmetric or asymmetric grid.")
    act_order: bool | None = opt(None, "GPTQ: columns by decreasing Hessian diagonal, static "
                                       "groups (default on for GPTQ, as in llm-compressor).")
    damp: float = opt(0.01, "GPTQ dampening, share of the mean Hessian diagonal.")
    clip: str = opt("minmax", "GPTQ scales: minmax (compressed-tensors' own), or mse: a grid of "
                              "shrunk ranges per group, the least Hessian-weighted error (AWQ "
                              "searches its own clipping).")
    w8_groups: str = opt("", "GPTQ/AWQ at 4 bits: keep the N (or N%) linear groups whose "
                             "quantization alone adds the most KL to the model's output at 8 "
                             "bits (q/k/v, o, gate/up, down per layer; e.g. 8 or 10%).")
    awq_scales: bool = opt(False, "GPTQ: fold AWQ's activation-aware scales into each layer "
                                  "first, then run GPTQ on the rescaled weights (AWQ-then-GPTQ).")
    hessians: str = opt("sequential", "GPTQ: sequential (each layer's Hessians from the outputs "
                                      "of the layers already quantized) or original (from one "
                                      "pass of the original model, shared by every candidate of "
                                      "quantkit auto in a process; no error propagation).")
    sensitivity_tokens: int = opt(512, "Calibration tokens the per-group KL is measured on "
                                       "(--w8-groups).")
    device: str = opt("auto", "auto, cpu or cuda.")
    batch_tokens: int | None = opt(None, "Tokens per forward batch (default 16384 on CUDA, "
                                         "4096 on CPU).")
    quant_type: str = opt("Q4_K_M", "gguf: Q4_K_M, Q4_K_S, Q5_K_M, Q6_K, Q8_0, IQ4_XS...")
    imatrix: bool = opt(True, "gguf: importance matrix from the calibration set.")
    threads: int = opt(0, "gguf: quantizer threads, 0 = all cores.")
    heldout: str | None = opt(None, "gguf: held-out text for the perplexity check "
                                    "(default: stdlib email package).")

    def check(self) -> None:
        """Option values that are wrong whatever the model."""
        METHODS[self.method]  # an unknown method is BadInput with the closest name
        if self.quant_type.upper() not in GGUF_TYPES:
            raise BadInput(f"unknown --quant-type {self.quant_type}",
                           "use one of " + ", ".join(GGUF_TYPES))
        if self.bits not in (4, 8):
            raise BadInput(f"--bits {self.bits} is not supported", "use --bits 4 or --bits 8")
        if self.group_size != -1 and self.group_size <= 0:
            raise BadInput(f"--group-size {self.group_size} must be positive (or -1 per channel)",
                           "use 128, or 64 for hidden sizes 128 does not divide")
        if self.clip not in ("minmax", "mse"):
            raise BadInput(f"unknown --clip {self.clip!r}", "use --clip minmax or --clip mse")
        if not 0 < self.damp < 1:
            raise BadInput(f"--damp {self.damp} must be between 0 and 1", "0.01 is the usual value")
        if self.act_order and self.method == "awq":
            raise BadInput("--act-order applies to GPTQ only", "use --no-act-order with --method awq")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise BadInput(f"unknown --device {self.device}", "use auto, cpu or cuda")
        if self.batch_tokens is not None and self.batch_tokens < 1:
            raise BadInput(f"--batch-tokens {self.batch_tokens} must be positive", "use e.g. 4096")
        if self.threads < 0:
            raise BadInput(f"--threads {self.threads} must be 0 (all cores) or more",
                           "use --threads 0")
        if self.w8_groups:
            if METHODS[self.method].layer is None or self.bits != 4:
                raise BadInput("--w8-groups applies to GPTQ/AWQ at --bits 4",
                               "use --method gptq|awq --bits 4, or leave --w8-groups out")
            self.upgrade_count(1)
        if self.hessians not in ("sequential", "original"):
            raise BadInput(f"unknown --hessians {self.hessians!r}",
                           "use --hessians sequential or --hessians original")
        if self.hessians == "original" and self.method != "gptq":
            raise BadInput("--hessians applies to GPTQ only", "leave it out with --method "
                           f"{self.method}")
        if self.awq_scales and self.method != "gptq":
            raise BadInput("--awq-scales applies to GPTQ only (AWQ folds its scales anyway)",
                           "use --method gptq --awq-scales, or leave --awq-scales out")
        if self.awq_scales and self.hessians == "original":
            raise BadInput("--awq-scales changes each layer's inputs, so the original model's "
                           "Hessians do not apply", "use --hessians sequential with --awq-scales")
        if self.sensitivity_tokens < 16:
            raise BadInput(f"--sensitivity-tokens {self.sensitivity_tokens} is too few",
                           "use 256-2048")

    def upgrade_count(self, groups: int) -> int:
        """How many of a model's `groups` linear groups --w8-groups keeps at 8 bits."""
        import re

        m = re.fullmatch(r"(\d+)(%?)", self.w8_groups.strip())
        if not m or int(m.group(1)) < 1 or (m.group(2) and int(m.group(1)) > 100):
            raise BadInput(f"--w8-groups {self.w8_groups!r} is not a count or a percentage",
                           "use e.g. --w8-groups 8 or --w8-groups 10%")
        n = int(m.group(1))
        return min(groups, -(-n * groups // 100) if m.group(2) else n)

    @property
    def uses_act_order(self) -> bool:
        """GPTQ's default, as llm-compressor's: static act-order."""
        return self.method == "gptq" if self.act_order is None else self.act_order


VALIDATE_SANDBOXES = ("auto", "bwrap", "basic")


@dataclass(frozen=True)
class ValidateConfig:
    """`quantkit validate` and the recipe's `validate:` section."""

    tasks: tuple[str, ...] = opt((), "Comma-separated: quantkit's " + ",".join(TASKS.names())
                                     + " (default: all that have data), or any lm-eval task "
                                       "(arc_easy, gsm8k, ...; with --task-path, your own).")
    task_path: tuple[str, ...] = opt((), "Folder of lm-eval task YAMLs, searched as lm-eval's "
                                         "--include_path is. Repeatable.")
    engine: str = opt("auto", "|".join(engine_choices()) + ": both models run on it; auto is the "
                              "engine `quantkit serve` picks for the artifact on this machine.")
    domain_set: str | None = opt(None, "JSONL: {text} lines (perplexity) or {prompt, answer"
                                       "[, match]} lines.")
    limit: int | None = opt(None, "MMLU questions per subject and HumanEval problems "
                                  "(default: all).")
    humaneval_limit: int | None = opt(None, "HumanEval problems (default: --limit).")
    humaneval_max_tokens: int = opt(384, "HumanEval: new tokens per completion.")
    sandbox: str = opt("auto", "HumanEval: where the model's programs run: bwrap (namespaces: "
                               "read-only system, no network, no home), basic (process limits "
                               "and a guard; weaker, and said so in the results), or auto: "
                               "bwrap where it works, else basic.")
    mmlu_data: str | None = opt(None, "Folder with {test,dev}/SUBJECT.jsonl, or a hub dataset "
                                      "such as cais/mmlu (default: the copy shipped with quantkit).")
    samples: int = opt(64, "Sampling check: prompts sampled per model.")
    temperature: float = opt(0.9, "Sampling check temperature.")
    top_p: float = opt(0.9, "Sampling check top_p.")
    max_tokens: int = opt(256, "Sampling check: new tokens per output.")
    seed: int = opt(0, "Seed for sampling and bootstrap intervals.")
    threads: int = opt(0, "Engine threads, 0 = the engine's default.")
    thresholds: dict[str, Any] = opt({}, "YAML file: task -> limits, e.g. mmlu: {retention: 0.97} "
                                         "(in a recipe: the mapping itself).")

    def check(self) -> None:
        """Option values that are wrong whatever the models (the thresholds included)."""
        if self.engine not in engine_choices():
            raise BadInput(f"unknown --engine {self.engine!r}", "use " + ", ".join(engine_choices()))
        if self.sandbox not in VALIDATE_SANDBOXES:
            raise BadInput(f"unknown --sandbox {self.sandbox!r}",
                           "use " + ", ".join(VALIDATE_SANDBOXES))
        for name in self.tasks:
            needs = task(name).needs
            if needs and getattr(self, needs) is None:
                raise BadInput(f"the {name} task needs {task(name).needs_what}",
                               f"pass --{needs.replace('_', '-')} FILE")
        external = [t for t in self.tasks if t not in TASKS]
        if external or self.task_path:  # lm-eval's own registry and the folders given
            check_lm_eval_tasks(external, self.task_path)
        for name, value in (("limit", self.limit), ("humaneval_limit", self.humaneval_limit)):
            if value is not None and value < 1:
                raise BadInput(f"--{name.replace('_', '-')} {value} must be 1 or more",
                               "leave it out to run everything")
        _range("samples", self.samples, 1, 10000)
        _range("max_tokens", self.max_tokens, 1, 32768)
        _range("humaneval_max_tokens", self.humaneval_max_tokens, 1, 32768)
        _range("temperature", self.temperature, 0.0, 2.0)
        _range("top_p", self.top_p, 0.01, 1.0)
        if self.threads < 0:
            raise BadInput(f"--threads {self.threads} must be 0 or more", "use --threads 0")
        _seed(self.seed)
        not_run = sorted(set(self.limits) - set(self.run_tasks))
        if not_run:
            raise BadInput(f"thresholds name {', '.join(not_run)}, which --tasks does not run",
                           "add the task to --tasks or drop its threshold")

    @functools.cached_property
    def limits(self) -> Thresholds:
        """The thresholds, parsed and checked once (empty: an ungated run)."""
        from quantkit.gate import Thresholds

        return Thresholds.parse(self.thresholds) if self.thresholds else Thresholds()

    @property
    def run_tasks(self) -> list[str]:
        """The tasks that run: those asked for, else every task that has data."""
        if self.tasks:
            return list(dict.fromkeys(self.tasks))
        return default_tasks({f.name for f in dataclasses.fields(self)
                              if getattr(self, f.name) not in (None, (), {})})


VLLM_KERNELS = ("auto", "marlin", "machete", "vllm")
# W4A16 served by vLLM 0.26 on the H200, our GPTQ artifact of an 8B-shaped Llama, `quantkit bench`
# under load (docs/BENCHMARKS.md): Marlin serves 1.14x Machete's tokens/s at concurrency 1 and 1.07x
# at 8, Machete 1.20x Marlin's at 32 and 1.16x at 64 (prefill batches make Machete win earlier than
# decode alone, where both tie at 32); `auto` takes Marlin while max_num_seqs is at most this.
MARLIN_MAX_SEQS = 16


@dataclass(frozen=True)
class ServeConfig:
    """`quantkit serve` and the recipe's `serve:` section."""

    engine: str = opt("auto", "|".join(engine_choices()) + ".")
    host: str = opt("127.0.0.1", "Address to listen on.")
    port: int = opt(8000, "Port to listen on.")
    api_key: str | None = opt(None, "Require 'Authorization: Bearer KEY' (401 otherwise).")
    max_num_seqs: int = opt(8, "Sequences decoded together (slots).")
    ctx_size: int | None = opt(None, "Context per sequence (default: the model's, at most 4096).")
    gpu_memory_utilization: float = opt(0.9, "vLLM's memory share.")
    block_size: int = opt(16, "KV-cache block size (vLLM, transformers).")
    enable_chunked_prefill: bool = opt(True, "vLLM chunked prefill.")
    draft_model: str | None = opt(None, "Draft model for speculation.")
    num_speculative_tokens: int = opt(4, "Tokens drafted per step.")
    vllm_python: str | None = opt(None, "The python of vLLM's own environment "
                                        "(default: `vllm` on PATH).")
    threads: int = opt(0, "CPU threads, 0 = the engine's default.")
    extra_args: tuple[str, ...] = opt((), "Extra engine arguments, passed through. Repeatable.")
    kernel: str = opt("auto", "vLLM W4A16 kernel: marlin (fast at low concurrency), machete (at "
                              f"high), auto: marlin up to --max-num-seqs {MARLIN_MAX_SEQS}, or vllm: "
                              "vLLM's own choice, unsteered.")
    tensor_parallel_size: int = opt(1, "vLLM: GPUs each layer is split over (its "
                                       "--tensor-parallel-size).")
    pipeline_parallel_size: int = opt(1, "vLLM: GPU stages the layers are split into (its "
                                         "--pipeline-parallel-size; several nodes: vLLM's Ray).")

    @property
    def load_kernel(self) -> str:
        """The W4A16 kernel measured fastest for this load (`--max-num-seqs`) on Hopper."""
        return "marlin" if self.max_num_seqs <= MARLIN_MAX_SEQS else "machete"

    @property
    def vllm_kernel(self) -> str:
        """The W4A16 kernel vLLM is asked to use for this load."""
        return self.load_kernel if self.kernel == "auto" else self.kernel

    def check(self) -> None:
        """Option values that are wrong whatever the artifact."""
        if self.engine not in engine_choices():
            raise BadInput(f"unknown --engine {self.engine!r}", "use " + ", ".join(engine_choices()))
        if not 1 <= self.port <= 65535:
            raise BadInput(f"--port {self.port} is not a TCP port", "use 1-65535")
        if self.max_num_seqs < 1:
            raise BadInput(f"--max-num-seqs {self.max_num_seqs} must be at least 1", "use e.g. 8")
        if self.ctx_size is not None and self.ctx_size < 16:
            raise BadInput(f"--ctx-size {self.ctx_size} is too small", "use e.g. 4096")
        if not 0.05 <= self.gpu_memory_utilization <= 0.99:
            raise BadInput(f"--gpu-memory-utilization {self.gpu_memory_utilization} is outside "
                           "0.05-0.99", "use 0.9")
        if self.block_size < 1:
            raise BadInput(f"--block-size {self.block_size} must be positive", "use 16")
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            if getattr(self, name) < 1:
                flag = "--" + name.replace("_", "-")
                raise BadInput(f"{flag} {getattr(self, name)} must be at least 1", f"use {flag} 2")
        if (self.tensor_parallel_size > 1 or self.pipeline_parallel_size > 1) and self.engine in (
                "llama.cpp", "transformers"):
            raise BadInput(f"--engine {self.engine} serves on one device: --tensor-parallel-size "
                           "and --pipeline-parallel-size need vLLM", "use --engine vllm (or auto)")
        if self.draft_model and not 1 <= self.num_speculative_tokens <= 16:
            raise BadInput("--num-speculative-tokens must be 1-16", "use 4-8")
        if self.threads < 0:
            raise BadInput(f"--threads {self.threads} must be 0 or more", "use --threads 0")
        if self.kernel not in VLLM_KERNELS:
            raise BadInput(f"unknown --kernel {self.kernel!r}", "use " + ", ".join(VLLM_KERNELS))


@dataclass(frozen=True)
class BenchConfig:
    """`quantkit bench` and the recipe's `bench:` section."""

    url: str | None = opt(None, "The server, e.g. http://127.0.0.1:8000 (in a recipe run: the "
                                "serve section's host and port).")
    requests: int = opt(100, "Requests per concurrency level.")
    concurrency: str | tuple[int, ...] = opt("1,2,4,8,16,32,64", "Levels, e.g. 1,2,4,8,16,32,64.")
    mix: str | dict[str, float] = opt("short:1,medium:1,long:1", "Prompt lengths and weights.")
    max_tokens: int | str | dict[str, int] | None = opt(
        None, "New tokens: N for all, or short:64,medium:128,long:128.")
    api_key: str | None = opt(None, "Bearer key of the server.")
    model: str | None = opt(None, "Model id (default: the server's).")
    endpoint: str = opt("chat", "chat or completions.")
    p99_ttft_target: float | None = opt(None, "P99 TTFT limit, seconds.")
    p99_e2e_target: float | None = opt(None, "P99 latency limit, seconds.")
    timeout: float = opt(300.0, "Per-request timeout, seconds.")
    seed: int = opt(0, "Prompt seed.")

    def check(self) -> None:
        """Option values that are wrong whatever the server."""
        if self.requests < 1:
            raise BadInput(f"--requests {self.requests!r} is not a positive integer",
                           "e.g. --requests 100")
        if self.endpoint not in ("chat", "completions"):
            raise BadInput(f"--endpoint {self.endpoint!r} is unknown", "use chat or completions")
        for name, seconds in (("p99_ttft_target", self.p99_ttft_target),
                              ("p99_e2e_target", self.p99_e2e_target), ("timeout", self.timeout)):
            if seconds is not None and not 0 < seconds < float("inf"):
                flag = "--" + name.replace("_", "-")
                raise BadInput(f"{flag} {seconds!r} is not a positive number of seconds",
                               f"e.g. {flag} 2.5")
        _seed(self.seed)


@dataclass(frozen=True)
class AutoConfig:
    """`quantkit auto` and the recipe's `auto:` section."""

    method: str = opt("gptq", ", ".join(METHODS) + ": which family of candidates to try.")
    candidates: tuple[str, ...] = opt((), "Candidates, smallest first (default: the method's "
                                          "ladder, " + "; ".join(
                                              f"{m}: {','.join(METHODS[m].ladder)}"
                                              for m in METHODS) + "; W4g32+10%: the 10% most "
                                          "sensitive linear groups at 8 bits).")
    early_reject: bool = opt(True, "Reject a candidate on the domain task's limits (KL, top-1, "
                                   "perplexity) before running the other tasks.")
    shared_hessians: bool = opt(False, "GPTQ candidates: Hessians from one pass of the original "
                                       "model, shared by all (--hessians original: each "
                                       "candidate costs its sweeps, at some quality: no error "
                                       "propagation); off: each quantized sequentially.")

    @property
    def ladder(self) -> tuple[str, ...]:
        method = METHODS.get(self.method)
        return self.candidates or (method.ladder if method else ())

    def check(self) -> None:
        METHODS[self.method]  # an unknown method is BadInput with the closest name
        for name in self.ladder:
            parse_candidate(self.method, name)


def parse_candidate(method: str, name: str) -> dict[str, Any]:
    """A candidate's quantize settings from its name, in the method's own grammar."""
    return METHODS[method].parse(name)


@dataclass(frozen=True)
class Outputs:
    calib: str
    artifact: str
    report: str


@dataclass(frozen=True)
class Recipe:
    version: int
    name: str
    model: str
    calibration: CalibrateConfig
    quantize: QuantizeConfig
    outputs: Outputs
    validate: ValidateConfig = ValidateConfig()
    serve: ServeConfig = ServeConfig()
    bench: BenchConfig = BenchConfig()
    auto: AutoConfig | None = None
    description: str = ""


SECTIONS: dict[str, type] = {"calibration": CalibrateConfig, "quantize": QuantizeConfig,
                             "validate": ValidateConfig, "serve": ServeConfig,
                             "bench": BenchConfig, "auto": AutoConfig, "outputs": Outputs}


def load_recipe(path: Path) -> Recipe:
    """Parse and check a whole recipe (keys, types, ranges, thresholds) before any step runs."""
    from quantkit.fsutil import read_text

    path = Path(path)
    data = _yaml(path, read_text(path, "recipe", "see recipes/ for examples"), "recipe")
    if not isinstance(data, dict):
        raise BadInput(f"recipe {path} is not a mapping", "see recipes/demo.yaml")
    version = data.get("version")
    if type(version) is not int or version != RECIPE_VERSION:  # True and 1.0 equal 1, too
        raise BadInput(f"recipe {path}: version {data.get('version')!r} is not supported",
                       f"set `version: {RECIPE_VERSION}`")
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key in SECTIONS:
            kwargs[key] = section(SECTIONS[key], value, f"recipe {path}: {key}")
        elif key in ("name", "model", "description"):
            if not isinstance(value, str) or not value:
                raise BadInput(f"recipe {path}: {key} must be a non-empty string",
                               "see recipes/demo.yaml")
            kwargs[key] = value
        elif key != "version":
            raise BadInput(f"recipe {path}: unknown key {key!r}",
                           "known: version, name, model, description, " + ", ".join(SECTIONS))
    for key in ("name", "model", "calibration", "quantize", "outputs"):
        if key not in kwargs:
            raise BadInput(f"recipe {path}: missing {key!r}", "see recipes/demo.yaml")
    recipe = Recipe(version=RECIPE_VERSION, **kwargs)
    for name in ("calibration", "quantize", "validate", "serve", "bench", "auto"):
        if getattr(recipe, name) is None:
            continue
        try:
            getattr(recipe, name).check()
        except BadInput as exc:
            raise BadInput(f"recipe {path}: {name}: {exc.message}", exc.hint) from exc
    return recipe


def _yaml(path: Path, text: str, what: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise BadInput(f"{what} {path} is not valid YAML: {str(exc).splitlines()[0]}",
                       "fix the YAML syntax") from exc


def section(cls: type[C], value: Any, where: str) -> C:
    """A config from a mapping: unknown keys and wrong types are BadInput naming the key."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise BadInput(f"{where} must be a mapping", "see recipes/demo.yaml")
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    clean = {}
    for key, v in value.items():
        if key not in hints:
            raise BadInput(f"{where}: unknown key {key!r}", f"known: {', '.join(names)}")
        clean[key] = coerce(v, hints[key], f"{where}.{key}")
    missing = [f.name for f in dataclasses.fields(cls)  # type: ignore[arg-type]
               if f.name not in clean and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise BadInput(f"{where}: missing {missing[0]!r}", "see recipes/demo.yaml")
    return cls(**clean)


def build(cls: type[C], base: C | None, given: dict[str, Any]) -> C:
    """`base` (a recipe section, or the defaults) with the options given explicitly on top."""
    hints = get_type_hints(cls)
    changes = {k: coerce(v, hints[k], "--" + k.replace("_", "-"))
               for k, v in given.items() if k in hints and v is not None}
    cfg = dataclasses.replace(base if base is not None else cls(), **changes)  # type: ignore[type-var]
    cfg.check()  # type: ignore[attr-defined]
    return cfg


def coerce(value: Any, tp: Any, where: str) -> Any:
    """`value` as type `tp` (ints are floats, lists are tuples), or BadInput naming `where`."""
    ok, out = _coerce(value, tp)
    if not ok:
        raise BadInput(f"{where} = {value!r} is not {_type_name(tp)}", "see recipes/demo.yaml")
    return out


def _coerce(value: Any, tp: Any) -> tuple[bool, Any]:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        for arg in get_args(tp):
            ok, out = _coerce(value, arg)
            if ok:
                return True, out
        return False, None
    if tp is type(None):
        return value is None, None
    if tp is Any:
        return True, value
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok, float(value) if ok else None
    if tp is str:
        return isinstance(value, str), value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            return False, None
        items = [_coerce(v, get_args(tp)[0]) for v in value]
        return all(ok for ok, _ in items), tuple(v for _, v in items)
    if origin is dict:
        key_tp, val_tp = get_args(tp)
        if not isinstance(value, dict):
            return False, None
        pairs = [(_coerce(k, key_tp), _coerce(v, val_tp)) for k, v in value.items()]
        return (all(a[0] and b[0] for a, b in pairs), {a[1]: b[1] for a, b in pairs})
    return False, None


def _type_name(tp: Any) -> str:
    if get_origin(tp) in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if tp is type(None):
        return "empty"
    if get_origin(tp) is tuple:
        return f"a list of {_type_name(get_args(tp)[0])}"
    if get_origin(tp) is dict:
        return "a mapping"
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string"}.get(
        tp, str(tp))


def as_dict(obj: Any) -> Any:
    """A config as plain JSON-able data (for step keys and manifests)."""
    return dataclasses.asdict(obj)


def recipe_section(recipe: Path | None, name: str) -> tuple[Any, Recipe | None]:
    """The recipe's section `name` (None without a recipe) and the recipe itself."""
    if recipe is None:
        return None, None
    r = load_recipe(recipe)
    return getattr(r, name), r
