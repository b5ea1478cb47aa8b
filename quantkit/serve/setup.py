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


def _runnable(exe: Path) -> bool:
    return exe.is_file() and os.access(exe, os.X_OK)


def installed_llama_server() -> Path | None:
    """The llama-server that llama-cpp-python's own build compiled beside its libraries, when
    it was installed with `CMAKE_ARGS="-DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON
    -DLLAMA_TOOLS_INSTALL=ON ..."` (the README's test command): the same llama.cpp by
    construction, and no second compile."""
    from importlib import metadata

    try:
        exe = Path(str(metadata.distribution("llama-cpp-python").locate_file("bin/llama-server")))
    except metadata.PackageNotFoundError:
        return None
    return exe if _runnable(exe) else None


def llama_server_path() -> Path | None:
    """The llama-server to use: $QUANTKIT_LLAMA_SERVER (a path, or `off` for the fallback), else
    the one `quantkit setup llama-server` built, else the one llama-cpp-python's build installed,
    else None."""
    override = os.environ.get("QUANTKIT_LLAMA_SERVER")
    if override == "off":
        return None
    if override:
        return Path(override) if _runnable(Path(override)) else None
    built = server_dir() / "llama-server"
    return built if _runnable(built) else installed_llama_server()


def llama_server_env(exe: Path) -> dict[str, str]:
    """What `exe` needs in its environment: llama-cpp-python installs llama-server in
    site-packages/bin without a run path to its shared libraries in site-packages/lib."""
    lib = exe.parent.parent / "lib"
    if not (lib / "libllama.so").exists():
        return {}  # our own build links llama.cpp statically
    paths = [str(lib), *filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep))]
    return {"LD_LIBRARY_PATH": os.pathsep.join(paths)}


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
    found = llama_server_path()
    if found is not None and not force:
        return {"path": str(found), "built": False, "version": version}
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
