"""In-process engine adapters (transformers, llama.cpp). Validation talks to a model only
through `base.Engine`, so a quantized model and its baseline are scored by the same code on the
same engine. (Server processes are `quantkit.serve.launch`.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantkit.engines.base import Engine, Generation, loglikelihood_by_prefix, perplexity

__all__ = ["Engine", "Generation", "engine_for", "loglikelihood_by_prefix", "perplexity"]


def engine_for(path: Path, manifest: dict[str, Any] | None = None, threads: int = 0,
               engine: str | None = None) -> Engine:
    """The engine `engine` (llama.cpp, transformers, vllm), or by the file: llama.cpp for a
    .gguf file, transformers otherwise."""
    if engine == "vllm":
        from quantkit.engines.vllm import VllmEngine

        return VllmEngine(Path(path))
    if Path(path).suffix == ".gguf":
        from quantkit.engines.llamacpp import LlamaCppEngine

        return LlamaCppEngine(Path(path), threads=threads)
    from quantkit.engines.hf import TransformersEngine

    return TransformersEngine(Path(path), threads=threads)
