"""The transformers engine's entry: `transformers serve` (continuous batching, the model
preloaded), its install probe and its `register_engine` line. Its in-process adapter is
`quantkit.engines.hf`."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from quantkit.engines.choice import EngineSpec, register_engine
from quantkit.engines.hf import TransformersEngine, compute_dtype
from quantkit.gpu import gpu_present
from quantkit.serve.launcher import Launch
from quantkit.serve.requires import require, why_missing

if TYPE_CHECKING:
    from quantkit.config import ServeConfig
    from quantkit.engines.base import EngineAdapter
    from quantkit.serve.launcher import ServerLauncher, ServerProbe
    from quantkit.serve.target import Target

# (module the server imports, the distribution that provides it):
# - `transformers serve`: transformers.utils.import_utils.is_serve_available (its `serving` extra)
TRANSFORMERS_SERVE_MODULES = (("transformers", "transformers"), ("pydantic", "pydantic"),
                              ("fastapi", "fastapi"), ("uvicorn", "uvicorn"), ("openai", "openai"))


def transformers_probe(opts: ServeConfig | None) -> tuple[str, str] | None:
    """What `transformers serve` imports is installed here."""
    return why_missing("transformers", TRANSFORMERS_SERVE_MODULES)


def transformers_launch(target: Target, opts: ServeConfig, port: int, ctx: int) -> Launch:
    """`transformers serve` with continuous batching (paged attention), the model preloaded."""
    require("transformers", TRANSFORMERS_SERVE_MODULES)
    device = "cuda" if gpu_present() else "cpu"
    cmd = [sys.executable, "-c", "from transformers.cli.transformers import main; main()",
           "serve", str(target.path), "--continuous-batching", "--device", device,
           "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    cmd += ["--cb-block-size", str(opts.block_size)]
    if device == "cuda":
        cmd += ["--cb-max-memory-percent", str(opts.gpu_memory_utilization)]
    else:  # on CPU its default cache takes 60% of RAM: size it for max_num_seqs full contexts
        blocks = -(-ctx * opts.max_num_seqs // opts.block_size)
        cmd += ["--cb-num-blocks", str(blocks), "--cb-max-batch-tokens", str(min(ctx, 2048))]
    env = {"OMP_NUM_THREADS": str(opts.threads)} if opts.threads else {}
    return Launch("transformers", cmd + list(opts.extra_args), port, str(target.path), "/health",
                  None, ctx, True, env)


register_engine(EngineSpec("transformers", "transformers", ("compressed-tensors",),
                           adapter=TransformersEngine, launch=transformers_launch,
                           server_probe=transformers_probe, decompresses=True,
                           dtype=compute_dtype))

if TYPE_CHECKING:  # each function held against the Protocol its caller loads it as
    _adapter: EngineAdapter = TransformersEngine
    _launch: ServerLauncher = transformers_launch
    _server_probe: ServerProbe = transformers_probe
