"""`python -m quantkit.serve.llama_cpp_python ARGS`: llama_cpp.server (the fallback when
llama-server is not built) with llama.cpp's extra CPU buffer types off, on CPUs where they crash
(quantkit.engines.llamacpp.extra_buffers_unsafe)."""

import runpy

from quantkit.engines.llamacpp import no_extra_buffers

if __name__ == "__main__":
    with no_extra_buffers():
        runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
