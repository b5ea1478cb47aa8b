"""The engines, in one registry, and the one decision of which engine runs an artifact: validate
and serve both ask `choose_engine`, so a model is validated on the engine that will serve it.
What an engine can do is declared on its `EngineSpec`; code elsewhere asks the spec, never the
engine's name. Pure: imports no torch (nvidia-smi answers whether a GPU is here); what an engine's
functions run (its library, the model) is imported only when asked."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from quantkit.errors import BadInput
from quantkit.registry import Registry, load

# why an engine cannot run here, (message, hint), or None when it can
Why = tuple[str, str] | None
Check = tuple[str, str, str]  # a doctor check's status (pass/warn/fail), reason and fix
# how the engine is reached: in this process (validation) or as a server program (quantkit serve)
Mode = Literal["validate", "serve"]
LOGPROBS = ("full", "top-k")


class InstallProbe(Protocol):
    """The in-process install probe (`EngineSpec.probe`): why the adapter cannot run here."""

    def __call__(self) -> Why: ...


class ComputeDtype(Protocol):
    """`EngineSpec.dtype`: the dtype the adapter computes the model in a folder in here."""

    def __call__(self, model: Path, /) -> str: ...


@dataclass(frozen=True)
class EngineSpec:
    """An engine: the library whose version results record, the checkpoints it runs, whether it
    needs an NVIDIA GPU, its in-process adapter for validation (an `EngineAdapter`: the class,
    taking the model path and `threads`) and its server for `quantkit serve` (a `ServerLauncher`
    returning a serve.launcher.Launch for (target, opts, port, ctx)). `auto` takes the first
    registered engine that runs the checkpoint here. Each function an engine names is either the
    object itself or "module:attribute", imported when used (a plugin's may be either).

    The Protocols of the functions that take types standing above this registry (the adapter's
    Engine, the serve options, the server's target and Launch, the server card's info) are their
    callers', beside those types: `EngineAdapter` in quantkit.engines.base, `ServerLauncher` and
    `ServerProbe` in quantkit.serve.launcher, `DoctorHook` in quantkit.serve.front. Each built-in
    engine's entry module holds its functions against them (`_launch: ServerLauncher =
    vllm_server` under TYPE_CHECKING), so mypy checks each; `probe` (an `InstallProbe`) and
    `dtype` (a `ComputeDtype`) are checked where they are passed.

    Install probes, asked before anything loads: `probe()` (an `InstallProbe`) for the adapter
    in this process, `server_probe(serve_config)` (a `ServerProbe`) for the server; each returns None
    when the engine can run here, else (message, hint). Without a probe, `library` must be
    installed here; without a server probe, the in-process probe answers for the server too.

    Capabilities, all of the server except `logprobs`: `kv_cache_fp8`, it keeps the KV cache in
    FP8 (--kv-cache-dtype); `tensor_parallel`, it splits a model over GPUs
    (--tensor-parallel-size, --pipeline-parallel-size); `kernels`, it takes --kernel for W4A16
    weights and logs the kernel it picked; `decompresses`, it holds compressed-tensors weights in
    16/32 bits in memory (the saving is on disk only); `logprobs`, what the adapter scores: "full"
    (every token at each position) or "top-k" (each position's top k: KL divergence estimated).

    `dtype` (a `ComputeDtype`, taking a model folder): the dtype the adapter
    computes that model in on this machine; validation records it and keys its baseline cache
    by it. None: the engine does not say (a GGUF computes in its own types).

    `mode` (a function of nothing): how the adapter runs here where its results can depend on
    it beyond the dtype (vLLM: how its engines start, compiled or not); validation records it
    and keys its baseline cache by it, as the dtype.

    `options` ("module:attribute" or the class): a frozen dataclass of the server's own options
    (vLLM's --vllm-python), whose fields join `ServeConfig` as a method's join `QuantizeConfig`:
    one flag and one recipe key each; set while another engine serves, one is refused by name.

    `doctor` (a `DoctorHook`): what the engine alone can tell `quantkit doctor`, asked per check
    (`check`, the server's card `info`, its /metrics summed by name `totals`):
    (status, reason, fix), or None where it has nothing to say (vLLM: the KV cache's preemptions,
    the W4A16 kernel it logged against the one measured faster for the load)."""

    name: str
    library: str
    checkpoints: tuple[str, ...]
    adapter: str | Callable[..., Any]
    launch: str | Callable[..., Any]
    gpu: bool = False
    probe: str | InstallProbe | None = None
    server_probe: str | Callable[..., Any] | None = None
    kv_cache_fp8: bool = False
    tensor_parallel: bool = False
    kernels: bool = False
    decompresses: bool = False
    logprobs: str = "full"
    dtype: str | ComputeDtype | None = None
    mode: str | Callable[[], str] | None = None
    options: str | type | None = None
    doctor: str | Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        if self.logprobs not in LOGPROBS:
            raise ValueError(f"engine {self.name}: logprobs {self.logprobs!r} is not one of "
                             f"{LOGPROBS}")

    def missing(self, mode: Mode, opts: object = None) -> Why:
        """Why this engine cannot run here in `mode` (its probe's answer), or None. `opts`: the
        serve options (a ServeConfig, or None: the defaults), handed on to the server probe (a
        `quantkit.serve.launcher.ServerProbe`)."""
        if mode == "serve" and self.server_probe is not None:
            server_probe: Callable[[object], Why] = load(self.server_probe)
            return server_probe(opts)
        if self.probe is not None:
            probe: InstallProbe = load(self.probe)
            return probe()
        from importlib import metadata

        try:
            metadata.version(self.library)
        except metadata.PackageNotFoundError:
            return (f"--engine {self.name} needs {self.library}, which is not installed here",
                    f"pip install {self.library}, or use another --engine (or auto)")
        return None

    def run_mode(self) -> str | None:
        """How the adapter runs here beyond its dtype (`mode`'s answer), or None."""
        if self.mode is None:
            return None
        mode: Callable[[], str] = load(self.mode)
        return str(mode())

    def compute_dtype(self, model: Path) -> str | None:
        """The dtype the adapter computes `model` in here (`dtype`'s answer), or None."""
        if self.dtype is None:
            return None
        dtype: ComputeDtype = load(self.dtype)
        return str(dtype(model))


ENGINES: Registry[EngineSpec] = Registry("engine", "--engine", "quantkit.engines")


def register_engine(spec: EngineSpec) -> EngineSpec:
    """Add an engine; from then on validate, serve, the CLI and recipes know it."""
    return ENGINES.register(spec.name, spec)


def engine_choices() -> tuple[str, ...]:
    return ("auto", *ENGINES.names())


def able(capability: str) -> tuple[str, ...]:
    """The engines that have `capability` (an EngineSpec field), for messages and hints."""
    return tuple(n for n, spec in ENGINES.entries.items() if getattr(spec, capability))


def checkpoint_of(path: Path) -> str:
    """The checkpoint format of a model file or folder (quantkit.checkpoints decides)."""
    from quantkit.checkpoints import format_of

    return format_of(Path(path))


def _kind(checkpoint: str) -> str:
    from quantkit.checkpoints import label

    return label(checkpoint)


def choose_engine(checkpoint: str, requested: str, mode: Mode, opts: object = None) -> str:
    """The engine for a `checkpoint` (compressed-tensors or gguf) on this machine: the one asked
    for if it runs that checkpoint here, or for `auto` the first registered that does. `mode`:
    "validate" (the adapter, in this process) or "serve" (the server program; `opts` its
    ServeConfig). BadInput (exit 2) with the engine's hint where it cannot."""
    from quantkit.gpu import gpu_present

    if mode not in ("validate", "serve"):
        raise ValueError(f"choose_engine: mode {mode!r} is not 'validate' or 'serve'")
    fitting = [n for n in ENGINES if checkpoint in ENGINES[n].checkpoints]

    def why_not(name: str) -> Why:
        spec = ENGINES[name]
        reason = spec.missing(mode, opts)
        if reason is None and spec.gpu and not gpu_present():
            cpu = [n for n in fitting if not ENGINES[n].gpu]
            return (f"--engine {name} needs an NVIDIA GPU and none is visible",
                    f"use --engine {' or '.join(cpu)} on this machine (or auto)" if cpu else
                    "run it on a machine with an NVIDIA GPU")
        return reason

    if requested == "auto":
        reasons = []
        for name in fitting:
            reason = why_not(name)
            if reason is None:
                return name
            reasons.append(reason)
        if not reasons:
            raise BadInput(f"no registered engine runs a {_kind(checkpoint)} artifact",
                           "install a quantkit plugin that adds one")
        raise BadInput(f"no engine here runs a {_kind(checkpoint)} artifact: "
                       + "; ".join(message for message, _ in reasons), reasons[0][1])
    spec = ENGINES[requested]
    if checkpoint not in spec.checkpoints:
        runs = " and ".join(_kind(c) for c in spec.checkpoints)
        raise BadInput(f"--engine {requested} cannot run a {_kind(checkpoint)} artifact (it runs "
                       f"{runs})", f"use --engine {' or '.join(fitting)} (or auto) for "
                       f"{_kind(checkpoint)}" if fitting else "use another artifact")
    reason = why_not(requested)
    if reason is not None:
        raise BadInput(*reason)
    return requested


def engine_version(engine: str) -> str:
    """The installed version of an engine's library (validation records it)."""
    from quantkit.artifact import library_versions

    lib = ENGINES[engine].library
    return library_versions(lib)[lib]


# The built-in engines, one entry module each (its server launcher, probes and launch-time checks),
# which registers itself with one `register_engine` line passing its functions and adapter class:
# named here, and imported now, in this order (`auto`'s, the CLI's, the catalog's), so that the
# registry is complete whenever it is asked. An entry (and its adapter's module) imports what its
# functions run inside the function that runs it.
BUILT_IN = ("quantkit.serve.engines.vllm", "quantkit.serve.engines.transformers",
            "quantkit.serve.engines.llama_cpp")
for _module in BUILT_IN:
    importlib.import_module(_module)
