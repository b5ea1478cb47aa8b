"""Fixtures for the serve tests: llama-server built once, the demo GGUF with its validation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _serving import ROOT, quantkit


@pytest.fixture(scope="session")
def llama_server() -> Path:
    """llama-server built by `quantkit setup llama-server` (about 6-10 minutes the first time)."""
    done = quantkit("--json", "setup", "llama-server")
    assert done.returncode == 0, done.stderr[-2000:]
    return Path(json.loads(done.stdout)["path"])


@pytest.fixture(scope="session")
def demo_gguf() -> Path:
    """The demo GGUF artifact and its passing validation (`quantkit run recipes/demo-gguf.yaml`;
    reused when the demo loop made it already)."""
    done = quantkit("run", "recipes/demo-gguf.yaml")
    assert done.returncode == 0, done.stderr[-3000:]
    return ROOT / "artifacts" / "demo-gguf"
