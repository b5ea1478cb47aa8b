"""Which llama-server `quantkit serve` starts, and what it needs to run."""

from __future__ import annotations

import subprocess

import pytest

from quantkit.serve.setup import (
    installed_llama_server,
    llama_server_env,
    llama_server_path,
    server_dir,
)


def _program(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho fake\n")
    path.chmod(0o755)
    return path


@pytest.mark.gguf  # the last place looked is llama-cpp-python's own build
def test_override_then_own_build_then_the_installed_one(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTKIT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("QUANTKIT_LLAMA_SERVER", raising=False)
    assert llama_server_path() == installed_llama_server()  # nothing built in this home
    built = _program(server_dir() / "llama-server")
    assert llama_server_path() == built
    other = _program(tmp_path / "elsewhere" / "llama-server")
    monkeypatch.setenv("QUANTKIT_LLAMA_SERVER", str(other))
    assert llama_server_path() == other
    monkeypatch.setenv("QUANTKIT_LLAMA_SERVER", str(tmp_path / "missing"))
    assert llama_server_path() is None
    monkeypatch.setenv("QUANTKIT_LLAMA_SERVER", "off")
    assert llama_server_path() is None


def test_a_server_beside_shared_libraries_gets_their_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/x")
    exe = _program(tmp_path / "bin" / "llama-server")
    assert llama_server_env(exe) == {}  # a static build needs nothing
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libllama.so").write_bytes(b"")
    assert llama_server_env(exe) == {"LD_LIBRARY_PATH": f"{tmp_path / 'lib'}:/opt/x"}


@pytest.mark.gguf
def test_the_installed_llama_server_runs():
    exe = installed_llama_server()
    if exe is None:
        pytest.skip("llama-cpp-python was built without llama-server (the README's test command "
                    "builds it: CMAKE_ARGS=\"... -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON\")")
    import os

    done = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **llama_server_env(exe)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "version" in (done.stdout + done.stderr)
