"""`quantkit setup llama-server`: build llama.cpp's own server from the same source as the installed
llama-cpp-python (one llama.cpp version for converter, quantizer, validator and server)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from quantkit import console
from quantkit.errors import BadInput, EngineError
from quantkit.fsutil import atomic_dir
from quantkit.gpu import gpu_present
from quantkit.llamacpp_source import (
    download_sdist,
    llama_cpp_home,
    llama_cpp_version,
    vendored_prefix,
)

PROGRAMS = ("llama-server",)


def server_dir() -> Path:
    return llama_cpp_home() / "bin"


def llama_server_path() -> Path | None:
    """The llama-server to use: $QUANTKIT_LLAMA_SERVER (a path, or `off` for the fallback), else
    the cached build, or None before `quantkit setup llama-server`."""
    override = os.environ.get("QUANTKIT_LLAMA_SERVER")
    if override == "off":
        return None
    exe = Path(override) if override else server_dir() / "llama-server"
    return exe if exe.is_file() and os.access(exe, os.X_OK) else None


def _cuda() -> bool:
    """Build for CUDA only where there is both a compiler and a GPU to run on."""
    nvcc = shutil.which("nvcc") or Path("/usr/local/cuda/bin/nvcc").is_file()
    return bool(nvcc) and gpu_present()


def _run(cmd: list[str], cwd: Path, what: str) -> None:
    console.log(f"{what}: {' '.join(cmd)}")
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise EngineError(f"{what} failed (exit {done.returncode}): {' | '.join(tail)[-300:]}",
                          "install cmake and a C++ compiler (apt install cmake g++), then retry")


def setup_llama_server(force: bool = False, jobs: int | None = None) -> dict:
    """Build llama-server (CUDA when nvcc is present) into the quantkit cache; return what was built."""
    if shutil.which("cmake") is None:
        raise BadInput("cmake is not installed", "apt install cmake g++ (or pip install cmake)")
    version = llama_cpp_version()
    dest = server_dir()
    if llama_server_path() and not force:
        return {"path": str(dest / "llama-server"), "built": False, "version": version}
    cuda = _cuda()
    with tempfile.TemporaryDirectory(prefix="quantkit-llama-server-") as t:
        tmp = Path(t)
        sdist = download_sdist(tmp, version)
        prefix = vendored_prefix(sdist)
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            tar.extractall(tmp, members=members, filter="data")
        src = tmp / prefix
        flags = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF",
                 "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                 "-DLLAMA_BUILD_SERVER=ON", f"-DGGML_CUDA={'ON' if cuda else 'OFF'}"]
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        _run(["cmake", "-S", str(src), "-B", str(tmp / "build"), *gen, *flags], tmp, "cmake configure")
        n = str(jobs or os.cpu_count() or 2)
        _run(["cmake", "--build", str(tmp / "build"), "-j", n, "--target", *PROGRAMS], tmp,
             "cmake build (about 10 minutes on 2 cores)")
        with atomic_dir(dest, force=True) as out:
            for name in PROGRAMS:
                shutil.copy2(tmp / "build" / "bin" / name, out / name)
    return {"path": str(dest / "llama-server"), "built": True, "version": version, "cuda": cuda}
