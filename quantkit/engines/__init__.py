"""In-process engine adapters (transformers, llama.cpp, vLLM; which exist is the engine
registry's, `choice.py`). Validation talks to a model only through `base.Engine`, so a quantized
model and its baseline are scored by the same code on the same engine. (Server processes are
`quantkit.serve.launch`.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantkit.engines.base import Engine, Generation, loglikelihood_by_prefix, perplexity

__all__ = ["Engine", "Generation", "engine_for", "loglikelihood_by_prefix", "perplexity"]


def engine_for(path: Path, manifest: dict[str, Any] | None = None, threads: int = 0,
               engine: str | None = None) -> Engine:
    """The in-process adapter of engine `engine` (the engine registry's), or by the file:
    llama.cpp for a .gguf file, transformers otherwise."""
    from quantkit.engines.choice import ENGINES
    from quantkit.registry import load

    name = engine or ("llama.cpp" if Path(path).suffix == ".gguf" else "transformers")
    adapter: Engine = load(ENGINES[name].adapter)(Path(path), threads=threads)
    return adapter
