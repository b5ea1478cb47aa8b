"""Fixtures for the serve tests: llama-server built once, the demo GGUF with its validation."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from _serving import quantkit


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """llama-server built by `quantkit setup llama-server` (about 6-10 minutes the first time)."""
    done = quantkit("--json", "setup", "llama-server", cwd=tmp_path_factory.mktemp("setup"))
    assert done.returncode == 0, done.stderr[-2000:]
    return Path(json.loads(done.stdout)["path"])


@pytest.fixture(scope="session")
def demo_gguf(workdir: Path, demo_gguf_run: subprocess.CompletedProcess) -> Path:
    """The demo GGUF artifact and its passing validation, in `workdir` (tests/conftest.py): serve
    it from there as `artifacts/demo-gguf`, where `reports/` holds its validation."""
    assert demo_gguf_run.returncode == 0, demo_gguf_run.stderr[-3000:]
    return workdir / "artifacts" / "demo-gguf"
