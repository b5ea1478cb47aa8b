"""Plugins from outside the package: tests/data/toy_plugin, installed with a real `pip install`
into a folder of its own, adds a method, a task and an engine through the entry-point groups
`quantkit.methods`, `quantkit.tasks` and `quantkit.engines`; the CLI lists and runs all three, and
a plugin that fails to load is named in a warning and left out."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _serving import quantkit as run_quantkit

PLUGIN = Path(__file__).parent / "data" / "toy_plugin"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plugin installed by pip into its own folder (built from a copy: a build writes beside
    its source)."""
    tmp = tmp_path_factory.mktemp("plugin")
    src = shutil.copytree(PLUGIN, tmp / "src")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                           "--no-build-isolation", "--no-cache-dir", "--target", str(tmp / "site"),
                           str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert list((tmp / "site").glob("quantkit_toy_plugin-*.dist-info"))
    return tmp / "site"


def with_plugin(site: Path) -> dict[str, str]:
    """The environment that puts the installed plugin on the path."""
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", ""))
                                          if p), "COLUMNS": "200"}


def quantkit(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_quantkit(*args, cwd=cwd, env=with_plugin(site), timeout=600)


def test_help_lists_what_the_plugin_adds_without_torch(site, tmp_path):
    done = quantkit(site, "quantize", "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "rtn (round-to-nearest)" in " ".join(done.stdout.split())
    assert "--rtn-clip" in done.stdout  # the method's own option, a flag like GPTQ's --damp
    assert "warning: plugin broken = 'quantkit_toy_plugin.missing:NOTHING'" in done.stderr
    assert "ModuleNotFoundError" in done.stderr
    validate = quantkit(site, "validate", "--help", cwd=tmp_path).stdout
    assert "transformers-toy" in validate and "agree" in validate
    assert "--agree-prompts" in validate  # the task's own option, a flag like the built-ins'
    code = ("import sys, quantkit.cli; from quantkit.methods import METHODS; "
            "from quantkit.tasks import TASKS; from quantkit.engines.choice import ENGINES; "
            "print(list(METHODS), list(TASKS)[-1], list(ENGINES)[-1], 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, **with_plugin(site)}, timeout=120).stdout
    assert out.split("\n")[0] == "['gptq', 'awq', 'fp8', 'gguf', 'rtn'] agree transformers-toy False"


def test_the_plugin_method_task_and_engine_run(site, tiny_model, tiny_calib, tmp_path):
    art, report = tmp_path / "art", tmp_path / "report"
    bad = quantkit(site, "quantize", str(tiny_model), "--method", "rtn", "--rtn-clip", "2",
                   "--calib", str(tiny_calib), "--out", str(art), cwd=tmp_path)
    assert bad.returncode == 2 and "--rtn-clip 2.0 is out of range" in bad.stderr, bad.stderr
    done = quantkit(site, "quantize", str(tiny_model), "--method", "rtn", "--group-size", "32",
                    "--rtn-clip", "0.9", "--calib", str(tiny_calib), "--out", str(art),
                    cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = json.loads((art / "quantkit.json").read_text())
    # its option reached its layer quantizer (spec.options) and the manifest
    assert manifest["method"] == "rtn" and manifest["parameters"]["rtn_clip"] == 0.9
    thresholds = tmp_path / "t.yaml"
    thresholds.write_text("agree: {agreement: 0.0}\n")
    done = quantkit(site, "validate", str(art), "--baseline", str(tiny_model), "--tasks", "agree",
                    "--engine", "transformers-toy", "--thresholds", str(thresholds),
                    "--agree-prompts", "2", "--out", str(report), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    res = json.loads((report / "results.json").read_text())
    assert res["engine"] == "transformers-toy" and list(res["tasks"]) == ["agree"]
    # its option reached its run and its settings reached results.json
    assert len(res["tasks"]["agree"]["quantized"]["tokens"]) == 2
    assert res["settings"]["agree"] == {"prompts": 2}
    assert res["gate"]["verdict"] == "pass" and "agree.agreement" in done.stdout
    assert "Toy agreement" in (report / "report.html").read_text()
