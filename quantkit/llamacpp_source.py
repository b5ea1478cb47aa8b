"""llama.cpp's own Python tools (convert_hf_to_gguf.py and its gguf-py), taken from the sdist of
the installed llama-cpp-python so converter, quantizer and runtime share one llama.cpp version."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path
from types import ModuleType

from quantkit import console
from quantkit.errors import BadInput, EngineError
from quantkit.fsutil import atomic_dir, cache_fill

_KEEP = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")


def llama_cpp_version() -> str:
    """The installed llama-cpp-python version, or a BadInput naming the extra to install."""
    try:
        return metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        raise BadInput("llama-cpp-python is not installed (needed for --method gguf)",
                       "pip install -e '.[gguf]' (it compiles llama.cpp once, ~6 min on 2 cores)"
                       ) from None


def llama_cpp_home() -> Path:
    """$QUANTKIT_HOME/llama.cpp/VERSION: the installed llama-cpp-python's converter and builds."""
    from quantkit.models import quantkit_home

    return quantkit_home() / "llama.cpp" / llama_cpp_version()


def source_dir() -> Path:
    """The cached converter tree matching the installed llama-cpp-python; fetched once."""
    dest = llama_cpp_home()
    with cache_fill(dest):
        if not (dest / "convert_hf_to_gguf.py").is_file():
            _fetch_source(dest, llama_cpp_version())
    return dest


def _fetch_source(dest: Path, version: str) -> None:
    console.log(f"fetching llama.cpp's converter from the llama-cpp-python {version} sdist (once)")
    with tempfile.TemporaryDirectory(prefix="quantkit-sdist-") as tmp:
        sdist = download_sdist(Path(tmp), version)
        with tarfile.open(sdist) as tar, atomic_dir(dest, force=True) as out:
            prefix = vendored_prefix(sdist)
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)
                       and m.name[len(prefix):].startswith(_KEEP) and m.isfile()]
            for m in members:
                m.name = m.name[len(prefix):]
            tar.extractall(out, members=members, filter="data")


def download_sdist(folder: Path, version: str) -> Path:
    """The llama-cpp-python sdist of `version`, downloaded into `folder` (once per version).

    Straight from the package index's JSON API (PEP 691: $PIP_INDEX_URL, else PyPI), its
    sha256 checked; where that fails (a mirror without the JSON API, a proxy), `pip download`,
    which follows the user's pip configuration. pip prepares an sdist's metadata before it keeps
    it, installing llama-cpp-python's build backend in an isolated environment: 76 s on a fresh
    2-core machine against 3 s for the index."""
    try:
        return _from_index(folder, "llama-cpp-python", f"llama_cpp_python-{version}.tar.gz")
    except (OSError, ValueError, KeyError) as exc:  # URLError is an OSError; json's is a ValueError
        console.log(f"the package index's JSON API did not give the sdist ({exc}); pip download")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           f"llama-cpp-python=={version}", "-d", str(folder)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    found = list(folder.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        raise EngineError(f"could not download the llama-cpp-python {version} sdist: "
                          f"{done.stderr.strip()[-200:]}", "llama.cpp's source needs PyPI once")
    return found[0]


def _from_index(folder: Path, project: str, filename: str) -> Path:
    """`filename` of `project` from the index's PEP 691 JSON page, its sha256 checked (a
    ValueError if it differs); a failed download leaves nothing in `folder`."""
    import hashlib
    import json
    import os
    import urllib.parse
    import urllib.request

    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    page = f"{index}/{project}/"
    req = urllib.request.Request(page, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=20) as r:
        files = json.load(r)["files"]
    entry = next((f for f in files if f["filename"] == filename), None)
    if entry is None:
        raise ValueError(f"{page} lists no {filename}")
    want = entry["hashes"]["sha256"]
    part, digest = folder / (filename + ".part"), hashlib.sha256()
    try:
        with urllib.request.urlopen(urllib.parse.urljoin(page, entry["url"]), timeout=60) as r, \
                part.open("wb") as f:
            while chunk := r.read(1 << 20):
                digest.update(chunk)
                f.write(chunk)
        if digest.hexdigest() != want:
            raise ValueError(f"{filename}: sha256 {digest.hexdigest()[:12]}... is not the "
                             f"index's {want[:12]}...")
    finally:
        if digest.hexdigest() != want:
            part.unlink(missing_ok=True)
    return part.rename(folder / filename)


def vendored_prefix(sdist: Path) -> str:
    """Where llama.cpp's own tree sits inside the sdist."""
    return f"{sdist.name[:-len('.tar.gz')]}/vendor/llama.cpp/"


def gguf_module() -> ModuleType:
    """The gguf-py package of that same llama.cpp tree (PyPI's gguf can lag the converter)."""
    src = str(source_dir() / "gguf-py")
    if sys.path[0] != src:
        sys.path.insert(0, src)
        for name in [m for m in sys.modules if m == "gguf" or m.startswith("gguf.")]:
            del sys.modules[name]
    import gguf

    return gguf


def convert_to_f16(model_dir: Path, out_file: Path) -> None:
    """HF checkpoint -> F16 GGUF with llama.cpp's official converter."""
    src = source_dir()
    cmd = [sys.executable, str(src / "convert_hf_to_gguf.py"), str(model_dir), "--outtype", "f16",
           "--outfile", str(out_file)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
        reason = lines[-1][:200] if lines else f"exit {done.returncode}"
        if "ModuleNotFoundError" in reason:
            raise EngineError(f"llama.cpp's converter lacks a package: {reason}",
                              "pip install -e '.[gguf]'")
        raise BadInput(f"llama.cpp's converter refused {model_dir}: {reason}",
                       "the architecture must be one convert_hf_to_gguf.py supports")


def f16_gguf(model_dir: Path, model_sha: str | None = None) -> tuple[Path, float | None]:
    """The F16 GGUF of a Hugging Face folder, converted once and cached by the model's identity
    (weights, config and tokenizer all go into the file; GGUF quantization starts from it,
    validation scores it as the baseline). `model_sha` is models.model_sha256(model_dir) when
    the caller has it (hashing the weights again costs seconds per GB). Returns the file and
    the seconds the conversion took (None when it came from the cache)."""
    import time

    from quantkit.models import model_sha256, quantkit_home

    dest = quantkit_home() / "gguf" / (model_sha or model_sha256(model_dir)) / "model-f16.gguf"
    with cache_fill(dest):
        if dest.is_file():
            return dest, None
        t = time.time()
        part = dest.with_suffix(".part")
        convert_to_f16(model_dir, part)
        part.rename(dest)
    return dest, round(time.time() - t, 2)
