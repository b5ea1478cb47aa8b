"""The engines, in one registry, and the one decision of which engine runs an artifact: validate
and serve both ask `choose_engine`, so a model is validated on the engine that will serve it.
Pure: imports no torch (nvidia-smi answers whether a GPU is here)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from quantkit.errors import BadInput
from quantkit.registry import Registry


@dataclass(frozen=True)
class EngineSpec:
    """An engine: the library whose version results record, the checkpoints it runs, whether it
    needs an NVIDIA GPU, its in-process adapter for validation ("module:Class", taking the model
    path and `threads`) and its server for `quantkit serve` ("module:function" returning a
    serve.launch.Launch for (target, opts, port, ctx)). `auto` takes the first registered engine
    that runs the checkpoint here."""

    name: str
    library: str
    checkpoints: tuple[str, ...]
    adapter: str
    launch: str
    gpu: bool = False


ENGINES: Registry[EngineSpec] = Registry("engine", "--engine", "quantkit.engines")


def register_engine(spec: EngineSpec) -> EngineSpec:
    """Add an engine; from then on validate, serve, the CLI and recipes know it."""
    return ENGINES.register(spec.name, spec)


register_engine(EngineSpec("vllm", "vllm", ("compressed-tensors",), gpu=True,
                           adapter="quantkit.engines.vllm:VllmEngine",
                           launch="quantkit.serve.launch:vllm_server"))
register_engine(EngineSpec("transformers", "transformers", ("compressed-tensors",),
                           adapter="quantkit.engines.hf:TransformersEngine",
                           launch="quantkit.serve.launch:transformers_launch"))
register_engine(EngineSpec("llama.cpp", "llama-cpp-python", ("gguf",),
                           adapter="quantkit.engines.llamacpp:LlamaCppEngine",
                           launch="quantkit.serve.launch:llama_cpp_server"))

# why an engine cannot run here (message, hint), or None when it can; the caller knows how it
# reaches the engine (in-process for validation, a server program for serving)
Missing = Callable[[str], tuple[str, str] | None]


def engine_choices() -> tuple[str, ...]:
    return ("auto", *ENGINES.names())


def choose_engine(checkpoint: str, requested: str, missing: Missing) -> str:
    """The engine for a `checkpoint` (compressed-tensors or gguf) on this machine: the one asked
    for if it runs that checkpoint here, or for `auto` the first that does."""
    from quantkit.gpu import gpu_present

    def why_not(name: str) -> tuple[str, str] | None:
        reason = missing(name)
        if reason is None and ENGINES[name].gpu and not gpu_present():
            return (f"--engine {name} needs an NVIDIA GPU and none is visible",
                    "use --engine transformers on this machine (or auto)")
        return reason

    if requested == "auto":
        fitting = [n for n in ENGINES if checkpoint in ENGINES[n].checkpoints]
        for name in fitting:
            if why_not(name) is None:
                return name
        raise BadInput(f"no engine here runs a {checkpoint} artifact ({', '.join(fitting)})",
                       "install one of them (pip install -e '.[gguf]' for llama.cpp)")
    spec = ENGINES[requested]
    if checkpoint not in spec.checkpoints:
        if checkpoint == "gguf":
            raise BadInput(f"--engine {requested} cannot run a GGUF artifact",
                           "use --engine llama.cpp (or auto) for GGUF")
        raise BadInput(f"--engine {requested} runs {' and '.join(spec.checkpoints).upper()} "
                       f"artifacts; this one is not a GGUF but {checkpoint}",
                       "quantize with --method gguf, or use --engine transformers or vllm (or auto)")
    reason = why_not(requested)
    if reason is not None:
        raise BadInput(*reason)
    return requested


def engine_version(engine: str) -> str:
    """The installed version of an engine's library (validation records it)."""
    from quantkit.artifact import library_versions

    lib = ENGINES[engine].library
    return library_versions(lib)[lib]
