"""`quantkit serve` and `quantkit bench`: the recipe's `serve:` and `bench:` sections."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from quantkit.config.fields import check_seed, opt
from quantkit.config.options import each, options_class, read, with_options
from quantkit.engines.choice import ENGINES, engine_choices
from quantkit.errors import BadInput

VLLM_KERNELS = ("auto", "marlin", "machete", "dual", "vllm", "w4a8-tiles")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")  # what vLLM's --kv-cache-dtype takes on Hopper
# W4A16 served by vLLM 0.26 on the H200, our GPTQ artifact of an 8B-shaped Llama, `quantkit bench`
# under load (docs/BENCHMARKS.md): Marlin serves 1.14x Machete's tokens/s at concurrency 1 and 1.07x
# at 8, Machete 1.20x Marlin's at 32 and 1.16x at 64 (prefill batches make Machete win earlier than
# decode alone, where both tie at 32); `auto` takes Marlin while max_num_seqs is at most this.
# W8A16 (int8 channelwise) on an H100, the protocol: Marlin 1.16x Machete at one user (1.43x bf16
# against 1.23x), Machete ahead at 64 (0.87x bf16 against 0.79x; Marlin's prefill took twice as
# long), so the same rule serves both.
MARLIN_MAX_SEQS = 16
MAX_REPEATS = 100
# `quantkit bench --min-seconds` when not given: a GPU engine's level settles in seconds but its
# batches vary more; a CPU engine is slower per request, and 20 s hold several waves already
MIN_SECONDS_GPU, MIN_SECONDS_CPU = 30.0, 20.0


@with_options(ENGINES, "serve")
@dataclass(frozen=True)
class ServeConfig:
    """`quantkit serve` and the recipe's `serve:` section: what every engine takes, then the
    options that an engine's capability rules (an FP8 KV cache, a split over GPUs, a kernel
    choice), then each registered engine's own (`EngineSpec.options`: `options(name)` reads
    them)."""

    engine: str = opt("auto", "|".join(engine_choices()) + ".")
    host: str = opt("127.0.0.1", "Address to listen on.")
    port: int = opt(8000, "Port to listen on.")
    api_key: str | None = opt(None, "Require 'Authorization: Bearer KEY' (401 otherwise).")
    max_num_seqs: int = opt(8, "Sequences decoded together (slots).")
    ctx_size: int | None = opt(None, "Context per sequence (default: the model's, at most 4096).")
    gpu_memory_utilization: float = opt(0.9, "vLLM's memory share.")
    block_size: int = opt(16, "KV-cache block size (vLLM, transformers).")
    draft_model: str | None = opt(None, "Draft model for speculation.")
    num_speculative_tokens: int = opt(4, "Tokens drafted per step.")
    threads: int = opt(0, "CPU threads, 0 = the engine's default.")
    extra_args: tuple[str, ...] = opt((), "Extra engine arguments, passed through. Repeatable.",
                                      flag="--extra-arg")
    kernel: str = opt("auto", "vLLM W4A16/W8A16 kernel: marlin (fast at low concurrency), "
                              "machete (at high), dual: both, per step the one timed faster for "
                              "its token count (Hopper; twice the weights' memory; quantkit "
                              "installed beside vLLM), auto: marlin up to "
                              f"{MARLIN_MAX_SEQS} concurrent requests "
                              "(--expected-concurrency, else --max-num-seqs), or vllm: vLLM's "
                              "own choice, unsteered. W4A8 artifacts: w4a8-tiles runs vLLM's "
                              "CUTLASS W4A8 kernel with its tile schedule per layer shape and "
                              "token count timed at load (quantkit installed beside vLLM; no "
                              "faster on vLLM 0.26 and an H100), else vLLM's own.")
    expected_concurrency: int | None = opt(None, "The concurrent requests the server will mostly "
                                                 "see; --kernel auto picks the W4A16/W8A16 "
                                                 "kernel for it (default: --max-num-seqs, its "
                                                 "capacity).")
    kv_cache_dtype: str = opt("auto", "vLLM's KV cache: fp8 (E4M3: half the memory per token; "
                                      "with the k/v scales `quantkit quantize --kv-cache fp8` "
                                      "calibrated, else scales of 1.0), or auto: fp8 where the "
                                      "artifact carries such scales (what its validation "
                                      "scored), else the model's dtype.")
    tensor_parallel_size: int = opt(1, "vLLM: GPUs each layer is split over (its "
                                       "--tensor-parallel-size).")
    pipeline_parallel_size: int = opt(1, "vLLM: GPU stages the layers are split into (its "
                                         "--pipeline-parallel-size; several nodes: vLLM's Ray).")

    @property
    def load(self) -> int:
        """The concurrency the server is tuned for: the one expected, else its capacity."""
        return self.expected_concurrency or self.max_num_seqs

    @property
    def load_flag(self) -> str:
        """The flag `load` comes from, as a message names it: `--max-num-seqs 64`."""
        if self.expected_concurrency:
            return f"--expected-concurrency {self.expected_concurrency}"
        return f"--max-num-seqs {self.max_num_seqs}"

    @property
    def load_kernel(self) -> str:
        """The weight-only (W4A16, W8A16) kernel measured fastest for this load on Hopper."""
        return "marlin" if self.load <= MARLIN_MAX_SEQS else "machete"

    @property
    def vllm_kernel(self) -> str:
        """The weight-only kernel vLLM is asked to use for this load."""
        return self.load_kernel if self.kernel == "auto" else self.kernel

    def options(self, engine: str) -> Any:
        """Engine `engine`'s own options as its dataclass, read from this config (None: it has
        none)."""
        opts = options_class(ENGINES[engine])
        return None if opts is None else read(opts, self)

    def check_engine(self, engine: str) -> None:
        """BadInput where the engine named or chosen (`engine`) lacks what these options ask of
        it (its EngineSpec's capabilities): an FP8 KV cache, a split over GPUs, a kernel choice;
        or where another engine's own option is set."""
        from quantkit.engines.choice import able

        if engine == "auto":
            return
        self._check_own(engine)
        spec = ENGINES[engine]
        if self.kv_cache_dtype != "auto" and not spec.kv_cache_fp8:
            raise BadInput(f"--kv-cache-dtype {self.kv_cache_dtype} needs an engine with an FP8 "
                           f"KV cache ({', '.join(able('kv_cache_fp8'))}); {engine} keeps its KV "
                           "cache in 16 bits", "serve a compressed-tensors artifact with "
                           f"--engine {' or '.join(able('kv_cache_fp8'))} (or auto) on a GPU, "
                           "or leave --kv-cache-dtype out")
        if (self.tensor_parallel_size > 1 or self.pipeline_parallel_size > 1) and (
                not spec.tensor_parallel):
            raise BadInput(f"{engine} serves on one device: --tensor-parallel-size and "
                           "--pipeline-parallel-size need an engine that splits a model over "
                           f"GPUs ({', '.join(able('tensor_parallel'))})",
                           f"use --engine {' or '.join(able('tensor_parallel'))} (or auto) on a "
                           "GPU machine, or leave them at 1")
        if self.kernel != "auto" and not spec.kernels:
            raise BadInput(f"--kernel {self.kernel} chooses a weight-only kernel of "
                           f"{' or '.join(able('kernels'))}; {engine} has no kernel to choose",
                           f"use --engine {' or '.join(able('kernels'))} (or auto) on a GPU "
                           "machine, or leave --kernel out")

    def own_flags(self) -> list[str]:
        """The engines' own options set away from their defaults, as `quantkit serve` flags (a
        command that starts `quantkit serve` hands them on)."""
        out: list[str] = []
        for opts in each(ENGINES):
            for f in dataclasses.fields(opts):
                value = getattr(self, f.name, f.default)
                if value == f.default:
                    continue
                flag = "--" + f.name.replace("_", "-")
                out += ([flag if value else "--no-" + flag[2:]] if isinstance(value, bool)
                        else [flag, str(value)])
        return out

    def _check_own(self, engine: str) -> None:
        """An engine's own option set away from its default while `engine` serves, which does
        not take it."""
        mine = options_class(ENGINES[engine])
        for name in ENGINES.names():
            opts = options_class(ENGINES[name])
            if opts is None or opts is mine:
                continue
            for f in dataclasses.fields(opts):
                if hasattr(self, f.name) and getattr(self, f.name) != f.default:
                    flag = "--" + f.name.replace("_", "-")
                    raise BadInput(f"{flag} is an option of the {name} engine; {engine} does not "
                                   "take it", f"use --engine {name} (or auto), or leave {flag} out")

    def check(self) -> None:
        """Option values that are wrong whatever the artifact."""
        if self.engine not in engine_choices():
            raise BadInput(f"unknown --engine {self.engine!r}", "use " + ", ".join(engine_choices()))
        for opts in each(ENGINES):  # every engine's, used or not: a wrong value is wrong anyway
            own = read(opts, self)
            if hasattr(own, "check"):
                own.check()
        if not 1 <= self.port <= 65535:
            raise BadInput(f"--port {self.port} is not a TCP port", "use 1-65535")
        if self.max_num_seqs < 1:
            raise BadInput(f"--max-num-seqs {self.max_num_seqs} must be at least 1", "use e.g. 8")
        if self.expected_concurrency is not None and not (
                1 <= self.expected_concurrency <= self.max_num_seqs):
            raise BadInput(f"--expected-concurrency {self.expected_concurrency} is outside 1 to "
                           f"--max-num-seqs {self.max_num_seqs}",
                           "give the concurrent requests you expect most of the time, at most "
                           "--max-num-seqs")
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
        if self.draft_model and not 1 <= self.num_speculative_tokens <= 16:
            raise BadInput("--num-speculative-tokens must be 1-16", "use 4-8")
        if self.threads < 0:
            raise BadInput(f"--threads {self.threads} must be 0 or more", "use --threads 0")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise BadInput(f"unknown --kv-cache-dtype {self.kv_cache_dtype!r}",
                           "use " + ", ".join(KV_CACHE_DTYPES))
        self.check_engine(self.engine)
        if self.kernel not in VLLM_KERNELS:
            raise BadInput(f"unknown --kernel {self.kernel!r}", "use " + ", ".join(VLLM_KERNELS))


@dataclass(frozen=True)
class BenchConfig:
    """`quantkit bench` and the recipe's `bench:` section."""

    url: str | None = opt(None, "The server, e.g. http://127.0.0.1:8000 (in a recipe run: the "
                                "serve section's host and port).")
    requests: int | None = opt(None, "Counted requests per repeat of a level, at least "
                                     "(default: 4 waves, 4 x the concurrency).")
    warmup: int | None = opt(None, "Requests sent first at each repeat of a level and not "
                                   "counted (default: one wave, the level's concurrency).")
    min_seconds: float | None = opt(None, "Each repeat of a level runs at least this long and "
                                          "until its --requests completed (default: 30 on a "
                                          "GPU engine, 20 on CPU).")
    repeats: int = opt(3, "Runs of each level, each with fresh prompts (seed, seed+1, ...): "
                          "the figure is their median, with a 95% interval.")
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
        if self.requests is not None and self.requests < 1:
            raise BadInput(f"--requests {self.requests!r} is not a positive integer",
                           "e.g. --requests 100, or leave it out for 4 waves per level")
        if not 1 <= self.repeats <= MAX_REPEATS:
            raise BadInput(f"--repeats {self.repeats!r} is not 1 to {MAX_REPEATS}",
                           "use --repeats 3 (an interval needs at least 2)")
        if self.min_seconds is not None and not 0 <= self.min_seconds < float("inf"):
            raise BadInput(f"--min-seconds {self.min_seconds!r} is not a number of seconds >= 0",
                           "e.g. --min-seconds 20, or 0 to stop at --requests")
        if self.warmup is not None and self.warmup < 0:
            raise BadInput(f"--warmup {self.warmup!r} is negative",
                           "use --warmup 0 (none) or more, or leave it out for one wave")
        if self.warmup is not None and self.requests is not None and self.warmup > self.requests:
            raise BadInput(f"--warmup {self.warmup} is more than the --requests {self.requests} "
                           "it warms up for", f"use --warmup {self.requests} or less")
        if self.endpoint not in ("chat", "completions"):
            raise BadInput(f"--endpoint {self.endpoint!r} is unknown", "use chat or completions")
        for name, seconds in (("p99_ttft_target", self.p99_ttft_target),
                              ("p99_e2e_target", self.p99_e2e_target), ("timeout", self.timeout)):
            if seconds is not None and not 0 < seconds < float("inf"):
                flag = "--" + name.replace("_", "-")
                raise BadInput(f"{flag} {seconds!r} is not a positive number of seconds",
                               f"e.g. {flag} 2.5")
        check_seed(self.seed)
