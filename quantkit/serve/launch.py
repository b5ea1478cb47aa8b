"""The names the server launchers were once imported by, handed on: the machinery every server
shares is `quantkit.serve.launcher`, each engine's launcher, probes and launch-time checks its
entry module, `quantkit.serve.engines.<name>`."""

from __future__ import annotations

from quantkit.serve.engines.llama_cpp import (
    LLAMA_CPP_SERVER_MODULES,
    llama_cpp_probe,
    llama_cpp_python_launch,
    llama_cpp_server,
    llama_server_launch,
)
from quantkit.serve.engines.transformers import (
    TRANSFORMERS_SERVE_MODULES,
    transformers_launch,
    transformers_probe,
)
from quantkit.serve.engines.vllm import (
    FAST_VLLM_KERNELS,
    KERNEL_TILE,
    check_draft,
    check_parallel,
    check_split,
    kernel_env,
    kernel_from_log,
    kernel_warning,
    served_kv_cache,
    vllm_command,
    vllm_executable,
    vllm_launch,
    vllm_probe,
    vllm_server,
    vllm_versions,
)
from quantkit.serve.launcher import Launch, build_launch, engine_env, model_context

__all__ = ["FAST_VLLM_KERNELS", "KERNEL_TILE", "LLAMA_CPP_SERVER_MODULES",
           "TRANSFORMERS_SERVE_MODULES", "Launch", "build_launch", "check_draft",
           "check_parallel", "check_split", "engine_env", "kernel_env", "kernel_from_log",
           "kernel_warning", "llama_cpp_probe", "llama_cpp_python_launch", "llama_cpp_server",
           "llama_server_launch", "model_context", "served_kv_cache", "transformers_launch",
           "transformers_probe", "vllm_command", "vllm_executable", "vllm_launch", "vllm_probe",
           "vllm_server", "vllm_versions"]
