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
    needs an NVIDIA GPU. `auto` takes the first registered engine that runs the checkpoint here."""

    name: str
    library: str
    checkpoints: tuple[str, ...]
    gpu: bool = False


ENGINES: Registry[EngineSpec] = Registry("engine", "--engine")
ENGINES.register("vllm", EngineSpec("vllm", "vllm", ("compressed-tensors",), gpu=True))
ENGINES.register("transformers", EngineSpec("transformers", "transformers", ("compressed-tensors",)))
ENGINES.register("llama.cpp", EngineSpec("llama.cpp", "llama-cpp-python", ("gguf",)))

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
