"""The llama.cpp engine's entry: llama-server (built by `quantkit setup llama-server`), else
llama_cpp.server, its install probe and its `register_engine` line. Its in-process adapter is
`quantkit.engines.llamacpp`."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from quantkit import console
from quantkit.engines.choice import EngineSpec, register_engine
from quantkit.engines.llamacpp import LlamaCppEngine, extra_buffers_unsafe, probe
from quantkit.serve.launcher import Launch
from quantkit.serve.requires import require, why_missing

if TYPE_CHECKING:
    from quantkit.config import ServeConfig
    from quantkit.engines.base import EngineAdapter
    from quantkit.serve.launcher import ServerLauncher, ServerProbe
    from quantkit.serve.target import Target

# (module the server imports, the distribution that provides it):
# - llama_cpp.server: llama-cpp-python's `server` extra (llama_cpp/server/app.py, settings.py)
LLAMA_CPP_SERVER_MODULES = (("llama_cpp", "llama-cpp-python"), ("fastapi", "fastapi"),
                            ("uvicorn", "uvicorn"), ("pydantic_settings", "pydantic-settings"),
                            ("sse_starlette", "sse-starlette"),
                            ("starlette_context", "starlette-context"))


def llama_cpp_probe(opts: ServeConfig | None) -> tuple[str, str] | None:
    """llama-server is built, or llama_cpp.server (its fallback) can be imported."""
    from quantkit.serve.setup import llama_server_path

    why = None if llama_server_path() is not None else why_missing("llama_cpp.server",
                                                                    LLAMA_CPP_SERVER_MODULES)
    return why and (why[0], why[1] + ", or build llama-server: quantkit setup llama-server")


def llama_cpp_server(target: Target, opts: ServeConfig, port: int, ctx: int) -> Launch:
    """llama-server (`llama_server_path`), else llama_cpp.server."""
    from quantkit.serve.setup import llama_server_path

    exe = llama_server_path()
    if exe is not None:
        return llama_server_launch(exe, target, opts, port, ctx)
    console.warn("llama-server is not built: falling back to llama_cpp.server, which serves ONE "
                 "request at a time; run `quantkit setup llama-server` (about 10 minutes)")
    return llama_cpp_python_launch(target, opts, port, ctx)


def llama_server_launch(exe: Path, target: Target, opts: ServeConfig, port: int, ctx: int) -> Launch:
    """llama.cpp's own server: continuous batching, one slot per sequence, all layers on the GPU,
    flash attention; the KV cache is unified so slots share `ctx * slots` cells."""
    from quantkit.serve.setup import llama_server_env

    slots = opts.max_num_seqs
    cmd = [str(exe), "-m", str(target.path), "--host", "127.0.0.1", "--port", str(port),
           "--alias", target.name, "-c", str(ctx * slots), "-np", str(slots), "--kv-unified",
           "-cb", "--metrics", "--no-webui", "-ngl", "999", "-fa", "auto"]
    if extra_buffers_unsafe():
        cmd.append("--no-repack")
    if opts.threads:
        cmd += ["-t", str(opts.threads)]
    if opts.api_key:
        cmd += ["--api-key", opts.api_key]
    if opts.draft_model:
        cmd += ["-md", opts.draft_model, "--spec-draft-n-max", str(opts.num_speculative_tokens)]
    return Launch("llama.cpp", cmd + list(opts.extra_args), port, target.name, "/health",
                  "/metrics", ctx, True, env=llama_server_env(exe))


def llama_cpp_python_launch(target: Target, opts: ServeConfig, port: int, ctx: int) -> Launch:
    require("llama_cpp.server", LLAMA_CPP_SERVER_MODULES)
    server = ("quantkit.serve.llama_cpp_python" if extra_buffers_unsafe() else
              "llama_cpp.server")
    cmd = [sys.executable, "-m", server, "--model", str(target.path),
           "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(ctx),
           "--n_gpu_layers", "-1", "--model_alias", target.name,
           # its default cancels the running request when another arrives; queue them instead
           "--interrupt_requests", "False",
           # its default is half the cores; llama-server's is all of them
           "--n_threads", str(opts.threads or os.cpu_count() or 1)]
    if opts.api_key:
        cmd += ["--api_key", opts.api_key]
    return Launch("llama_cpp.server", cmd, port, target.name, "/v1/models", None, ctx, False,
                  notes=["llama_cpp.server answers one request at a time"])


register_engine(EngineSpec("llama.cpp", "llama-cpp-python", ("gguf",),
                           adapter=LlamaCppEngine, launch=llama_cpp_server, probe=probe,
                           server_probe=llama_cpp_probe))

if TYPE_CHECKING:  # each function held against the Protocol its caller loads it as
    _adapter: EngineAdapter = LlamaCppEngine
    _launch: ServerLauncher = llama_cpp_server
    _server_probe: ServerProbe = llama_cpp_probe
