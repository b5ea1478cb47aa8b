"""An engine started from this Python names the package it lacks, and the pip command, before it
starts (exit 2), instead of a line in the engine's log."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from quantkit.errors import BadInput
from quantkit.serve.engines.transformers import TRANSFORMERS_SERVE_MODULES, transformers_probe
from quantkit.serve.requires import missing, pip_requirement, require

ROOT = Path(__file__).resolve().parents[2]


def test_a_missing_module_names_its_package_and_the_pip_command():
    needs = (("json", "json"), ("quantkit_no_such_module", "no-such-package"))
    assert missing(needs) == ("quantkit_no_such_module", "no-such-package")
    with pytest.raises(BadInput) as exc:
        require("transformers", needs)
    assert exc.value.message == ("transformers cannot start: it needs the Python package "
                                 "no-such-package (module 'quantkit_no_such_module' is not "
                                 "installed)")
    assert exc.value.hint == "pip install 'no-such-package'"
    # a submodule of a package that is not there either (find_spec raises, not None)
    assert missing((("quantkit_no_such_parent.child", "x"),)) == ("quantkit_no_such_parent.child",
                                                                 "x")
    assert transformers_probe(None) is None  # the server probe: all there
    assert pip_requirement("sse-starlette") == "llama-cpp-python[server]"


def test_transformers_serve_needs_only_declared_packages():
    """What `transformers serve` imports is installed here and declared in quantkit's main
    dependencies, so `pip install -e .` is enough to serve a GPTQ/AWQ artifact on CPU."""
    require("transformers", TRANSFORMERS_SERVE_MODULES)
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {d.split(">")[0].split("<")[0].split("=")[0].split("[")[0].strip().lower()
             for d in declared}
    for _, dist in TRANSFORMERS_SERVE_MODULES:
        assert dist.lower() in names, dist
    # transformers' own list (its `serving` extra check), so ours cannot fall behind it
    from transformers.utils import import_utils

    assert import_utils.is_serve_available()
    for module in ("pydantic", "fastapi", "uvicorn", "openai"):
        assert hasattr(import_utils, f"is_{module}_available")
        assert any(m == module for m, _ in TRANSFORMERS_SERVE_MODULES)
