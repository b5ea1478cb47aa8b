"""In-process engine adapters (which exist, and what each can do, is the engine registry's,
`choice.py`). Validation talks to a model only through `base.Engine`, so a quantized
model and its baseline are scored by the same code on the same engine. (Server processes are
each engine's entry, `quantkit.serve.engines.<name>`.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantkit.engines.base import (
    Engine,
    EngineAdapter,
    Generation,
    loglikelihood_by_prefix,
    perplexity,
)

__all__ = ["Engine", "EngineAdapter", "Generation", "engine_for", "loglikelihood_by_prefix",
           "perplexity"]


def engine_for(path: Path, manifest: dict[str, Any] | None = None, threads: int = 0,
               engine: str | None = None) -> Engine:
    """The in-process adapter of engine `engine` (the engine registry's), or where None the
    engine `choose_engine` takes for this file's checkpoint here (a .gguf: GGUF)."""
    from quantkit.engines.choice import ENGINES, checkpoint_of, choose_engine
    from quantkit.registry import load

    name = engine or choose_engine(checkpoint_of(Path(path)), "auto", "validate")
    adapter: EngineAdapter = load(ENGINES[name].adapter)
    return adapter(Path(path), threads=threads)
